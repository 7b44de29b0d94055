"""One pipeline stage as a record, and the one runner of the reuse-or-run skeleton every stage shares.

A :class:`Stage` is its name, its key (:func:`.state.stage_key`: its parameters and its inputs' sha256), its
work, and what it says when its record is reused. :meth:`StageRunner.run` reuses a stage when the state file
records the same key and the record still holds (every recorded output still has its size and sha256, or the
stage's own check); else it runs the work, records what it made and reports it. The ``[n/5]`` of every message
is the stage's place in :data:`.state.STAGES`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gguf_mtp.files.digests import FileDigest, digest_files, sha256_file
from gguf_mtp.files.progress import progress_bar

from .report import PipelineReport, StageResult
from .state import STAGES, StateFile

__all__ = ["ReuseNote", "Stage", "StageDone", "StageRunner", "stage_line"]


def stage_line(name: str, text: str, *, ahead: bool = False) -> str:
    """``[n/5] name: text``: ``n`` is the stage's place in :data:`.state.STAGES`, 0 for a check made ``ahead`` of
    the stages (one that would otherwise fail it hours later)."""
    number = 0 if ahead else STAGES.index(name) + 1
    return f"[{number}/{len(STAGES)}] {name}: {text}"


class ReuseNote(NamedTuple):
    """What a reused stage says: its message (after ``[n/5] name:``) and its report's summary."""

    line: str
    summary: str


@dataclass(frozen=True)
class StageDone:
    """What a stage's work made: the outputs and detail fields its record keeps, and its report's summary."""

    outputs: list[FileDigest]
    detail: dict[str, Any]
    summary: str


#: A check of a record whose key matches: why it no longer holds, or ``None`` when it does.
RecordCheck = Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class Stage:
    """One stage of a run, as :meth:`StageRunner.run` reuses or runs it.

    Attributes:
        name: one of :data:`.state.STAGES`.
        key: its identity (:func:`.state.stage_key`); a record with another key is redone.
        work: does the stage, given why an earlier record does not hold (``None``: none was made), and says so.
        reused: what a reused record says, from its outputs and detail fields.
        still_holds: the check of a record with the same key (default: its outputs' sizes and sha256).
        changed: why a record with another key is redone.
    """

    name: str
    key: str
    work: Callable[[str | None], StageDone]
    reused: Callable[[list[FileDigest], dict[str, Any]], ReuseNote]
    still_holds: RecordCheck | None = None
    changed: str = "its inputs or parameters changed"


def _status(why: str | None) -> str:
    return "redone" if why else "ran"


class StageRunner:
    """Runs stages against one state file, reporting each: the reuse-or-run skeleton, written once."""

    def __init__(self, state: StateFile, report: PipelineReport, say: Callable[[str], None], progress: bool) -> None:
        self.state = state
        self.report = report
        self.say = say
        self.progress = progress

    def say_stage(self, name: str, text: str) -> None:
        """Say one line of stage ``name`` (``[n/5] name: text``)."""
        self.say(stage_line(name, text))

    def digest(self, paths: Sequence[Path], stage: str) -> list[FileDigest]:
        """The size and sha256 of a stage's outputs, as its record keeps them."""
        return digest_files(paths, progress=self.progress, desc=f"sha256 {stage}")

    def run(self, stage: Stage) -> tuple[list[FileDigest], dict[str, Any]]:
        """Reuse ``stage``'s record if it still holds, else do its work and record it; its outputs and detail."""
        started = time.perf_counter()
        record, why = self._reusable(stage)
        if record is not None:
            outputs, detail = self.state.outputs(record), record["detail"]
            note = stage.reused(outputs, detail)
            self.say_stage(stage.name, note.line)
            self.report.stages.append(
                StageResult(stage.name, "reused", note.summary, time.perf_counter() - started, outputs)
            )
            return outputs, detail
        done = stage.work(why)
        self.state.record(stage.name, stage.key, done.outputs, done.detail)
        self.report.stages.append(
            StageResult(stage.name, _status(why), done.summary, time.perf_counter() - started, done.outputs)
        )
        return done.outputs, done.detail

    def _reusable(self, stage: Stage) -> tuple[dict[str, Any] | None, str | None]:
        """The stage's record if it can be reused; else (None, why it cannot, or None if never run)."""
        record = self.state.stages.get(stage.name)
        if record is None:
            return None, None
        if record.get("key") != stage.key:
            return None, stage.changed
        check = stage.still_holds or (lambda r: self._outputs_hold(stage.name, r))
        why = check(record)
        return (None, why) if why else (record, None)

    def _outputs_hold(self, name: str, record: dict[str, Any]) -> str | None:
        """Why a record's outputs no longer hold (gone, resized, another sha256), or ``None`` when they all do."""
        outputs = self.state.outputs(record)
        total = sum(d.size for d in outputs)
        with progress_bar(total, f"checking {name}", enabled=self.progress) as bar:
            for d in outputs:
                if not d.path.is_file():
                    return f"{d.path.name} is gone"
                if d.path.stat().st_size != d.size:
                    return f"{d.path.name} changed size"
                if sha256_file(d.path, bar=bar) != d.sha256:
                    return f"{d.path.name} changed (sha256 differs from the record)"
        return None
