"""What a pipeline run did, stage by stage: the report :func:`~gguf_mtp.release.pipeline.run_pipeline` returns and
its ``--dry-run`` plan fills."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_mtp.files.digests import FileDigest

__all__ = ["PipelineReport", "StageResult"]


@dataclass
class StageResult:
    """One stage of a run: ``ran`` (first time), ``reused`` (checked and kept), ``redone`` (a recorded
    output no longer matched) or ``skipped`` (not asked for)."""

    name: str
    status: str
    summary: str
    seconds: float = 0.0
    outputs: list[FileDigest] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "seconds": round(self.seconds, 3),
            "outputs": [d.to_dict() for d in self.outputs],
        }


@dataclass
class PipelineReport:
    """What a pipeline run did, stage by stage."""

    work_dir: Path
    stages: list[StageResult] = field(default_factory=list)
    target: list[Path] = field(default_factory=list)
    draft: Path | None = None
    composite: list[Path] = field(default_factory=list)
    verification: Any = None  # a VerifyReport, when verify ran in this run
    published: Any = None  # a PublishReport, when publish ran in this run
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    dry_run: bool = False
    disk_needed: int | None = None  # with dry_run: the bytes a real run would add to the disks, at least
    planned: dict[str, Any] | None = None  # with dry_run: the files it would download, write and upload
    sources: dict[str, Any] | None = None  # with if_changed: the sources now, as published, and what moved
    nothing_moved: str | None = None  # with if_changed: the one line saying nothing moved (and nothing was done)

    def stage(self, name: str) -> StageResult:
        return next(s for s in self.stages if s.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": "pipeline",
            "work_dir": str(self.work_dir),
            "stages": [s.to_dict() for s in self.stages],
            "target": [str(p) for p in self.target],
            "draft": str(self.draft) if self.draft else None,
            "composite": [str(p) for p in self.composite],
            "verification": self.verification.to_dict() if self.verification is not None else None,
            "published": self.published.to_dict() if self.published is not None else None,
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
            "dry_run": self.dry_run,
            "disk_needed": self.disk_needed,
            "planned": self.planned,
            "if_changed": self.sources,
        }

    def describe(self) -> list[str]:
        if self.nothing_moved is not None:
            return [self.nothing_moved]
        lines = [f"{s.name:8s} {s.status:8s} {s.summary}" for s in self.stages]
        if self.composite:
            lines.append(
                f"composite: {self.composite[0]}"
                + (f" (+{len(self.composite) - 1} shards)" if len(self.composite) > 1 else "")
            )
        lines += [f"note: {n}" for n in self.notes]
        if self.dry_run:
            lines.append("dry run: nothing was downloaded, written or uploaded")
        else:
            lines.append(f"done in {self.seconds:.1f} s")
        return lines
