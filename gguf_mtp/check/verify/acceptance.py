"""The acceptance group (``verify --acceptance``): the head's predicted n-max 1 acceptance against the floor
(:mod:`gguf_mtp.check.acceptance_floor`), measured only once llama.cpp's check passed; a sidecar is measured
beside its target."""

from __future__ import annotations

from ..acceptance_floor import acceptance_verdict
from .llama import LLAMA_CHECK
from .report import Check, VerifyReport
from .subject import Subject

__all__ = ["acceptance_group"]


def acceptance_group(subject: Subject, report: VerifyReport) -> None:
    """The ``acceptance`` check, when asked for."""
    if subject.options.acceptance:
        report.checks.append(_acceptance_check(report, report.check(LLAMA_CHECK), subject.options.floor))


def _acceptance_check(report: VerifyReport, llama_check: Check, floor: float) -> Check:
    """The ``acceptance`` check: the predicted n-max 1 acceptance against ``floor`` (a composite; a sidecar beside
    its ``target``), after the llama.cpp check passed."""
    name = "acceptance"
    if llama_check.ok is not True:
        return Check(name, False, "not run: the llama.cpp check did not pass")
    if report.kind == "mtp-draft":
        if not report.sidecar or report.target is None:
            return Check(name, False, "a draft's acceptance is measured beside its model: give it as --target")
        ok, detail = acceptance_verdict(report.target, draft=report.composite, floor=floor)
    else:
        ok, detail = acceptance_verdict(report.composite, floor=floor)
    return Check(name, ok, detail)
