"""What ``verify`` reports: one :class:`Check` per step, gathered in a :class:`VerifyReport`, and the one way a
list of problems becomes a check's line (:func:`check_from`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..llama_check import LlamaCheck

__all__ = ["SHOWN", "Check", "VerifyReport", "check_from"]

#: At most this many problems are spelled out in one check's detail (the rest are counted).
SHOWN = 5


@dataclass(frozen=True)
class Check:
    """One verification step: passed (``ok=True``), failed (``False``) or skipped (``None``)."""

    name: str
    ok: bool | None
    detail: str

    @property
    def status(self) -> str:
        return "skip" if self.ok is None else ("pass" if self.ok else "fail")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "ok": self.ok, "detail": self.detail}


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`: every check with its status and what it found."""

    composite: str
    kind: str = "model"  # or "mtp-draft": an MTP-only file, checked as a draft
    sidecar: bool = False  # an MTP-only draft llama.cpp loads beside its target (it carries token_embd/output_norm)
    target: str | None = None
    draft: str | None = None
    checks: list[Check] = field(default_factory=list)
    bytes_compared: int = 0
    bytes_shared: int = 0  # of bytes_compared: proven identical by shared extents (reflink), not read
    seconds: float = 0.0
    llama: LlamaCheck | None = None
    hints: list[str] = field(default_factory=list)  # what to do about a failure, one line each

    @property
    def ok(self) -> bool:
        """No check failed (skipped checks are listed as skipped, not counted as passed)."""
        return bool(self.checks) and all(c.ok is not False for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def check(self, name: str) -> Check:
        """The check called ``name``.

        Raises:
            KeyError: no such check was run.
        """
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        result: dict[str, Any] = {
            "command": "verify",
            "composite": self.composite,
            "kind": self.kind,
            "sidecar": self.sidecar,
            "target": self.target,
            "draft": self.draft,
            "ok": self.ok,
            "checks": [c.to_dict() for c in self.checks],
            "passed": sum(c.ok is True for c in self.checks),
            "failed": len(self.failures),
            "skipped": sum(c.ok is None for c in self.checks),
            "bytes_compared": self.bytes_compared,
            "bytes_shared": self.bytes_shared,
            "seconds": round(self.seconds, 3),
            "hints": list(self.hints),
            "llama_cpp_build": self.llama.llama_cpp_build if self.llama is not None else None,
            "llama_cpp_library": self.llama.llama_cpp_library if self.llama is not None else None,
        }
        if self.llama is not None:
            result["llama"] = {k: v for k, v in asdict(self.llama).items() if k != "log_tail"} | {"ok": self.llama.ok}
        return result

    def describe(self) -> list[str]:
        """One line per check (``PASS``/``FAIL``/``SKIP``), then the verdict."""
        lines = [f"verify {self.composite}" + (" (an MTP-only draft)" if self.kind == "mtp-draft" else "")]
        width = max((len(c.name) for c in self.checks), default=0)
        lines += [f"  {c.status.upper():4}  {c.name:<{width}}  {c.detail}" for c in self.checks]
        passed = sum(c.ok is True for c in self.checks)
        skipped = sum(c.ok is None for c in self.checks)
        tail = f", {skipped} skipped" if skipped else ""
        if self.ok:
            lines.append(f"verified: {passed} checks passed{tail}")
        else:
            lines.append(f"NOT verified: {len(self.failures)} of {len(self.checks)} checks failed{tail}")
            lines += [f"hint: {hint}" for hint in self.hints]
        return lines


def _summary(problems: list[str]) -> str:
    shown = "; ".join(problems[:SHOWN])
    more = len(problems) - SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def check_from(name: str, problems: list[str], passed: str) -> Check:
    """The check ``name``: failed with its first problems spelled out, or passed saying ``passed``."""
    return Check(name, not problems, _summary(problems) if problems else passed)
