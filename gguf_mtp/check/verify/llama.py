"""The llama.cpp group: llama.cpp itself loads the file and runs its decode steps, the MTP step through each NextN
block (a load alone would miss a NextN block llama.cpp quietly ignored). A model runs its trunk step too; an
MTP-only draft runs only its MTP steps (it has no trunk graph; llama.cpp crashes trying one), and only a sidecar (a
bare draft cannot load), on the hidden rows of its target's trunk decode where one is given."""

from __future__ import annotations

from gguf_mtp.model.shards import ShardSet

from ..llama_check import INSTALL_HINT, LlamaCheck, check_with_llama, llama_cpp_available
from .report import Check, VerifyReport
from .subject import Subject

__all__ = ["LLAMA_CHECK", "llama_group"]

#: The check's name in the report (the acceptance group runs only after it passed).
LLAMA_CHECK = "llama.cpp"


def llama_group(subject: Subject, report: VerifyReport) -> None:
    """The ``llama.cpp`` check, and what llama.cpp said in ``report.llama``."""
    check, report.llama = _llama_check(subject, sidecar=report.sidecar)
    report.checks.append(check)


def _llama_check(subject: Subject, *, sidecar: bool) -> tuple[Check, LlamaCheck | None]:
    """Load the file with llama.cpp and run its decode steps. A composite llama.cpp refuses is compared with its
    target (see :func:`_target_refusal`)."""
    not_run = _why_not_run(subject, sidecar=sidecar)
    if not_run is not None:
        return not_run, None
    result = _load_and_decode(subject)
    shortfall = _nextn_shortfall(result, subject.layout.nextn if subject.layout else 0)
    ok = result.ok if shortfall is None else False
    return Check(LLAMA_CHECK, ok, _detail(subject, result, ok, shortfall)), result


def _load_and_decode(subject: Subject) -> LlamaCheck:
    layout, target = subject.layout, subject.target
    # An MTP-only file has no trunk graph to run (llama.cpp crashes trying), nor has a model without trunk blocks.
    beside = target.name if subject.is_draft and target is not None else None
    return check_with_llama(subject.model.shards[0].name,
                            trunk=not subject.is_draft and (layout is None or layout.trunk > 0), beside=beside)


def _detail(subject: Subject, result: LlamaCheck, ok: bool, shortfall: str | None) -> str:
    """What llama.cpp did, what it fell short of, why it failed and, for a refused composite, whether its target
    is refused too; last, the build that ran it."""
    detail = result.summary() + (shortfall or "")
    if not ok and result.error and result.error not in detail:
        detail += f" ({result.error})"
    target = subject.target
    if target is not None and not subject.is_draft and not result.loaded and result.crashed is None:
        detail += _target_refusal(target)
    if result.llama_cpp_build:
        detail += f"; checked with {result.llama_cpp_build}"
    return detail


def _why_not_run(subject: Subject, *, sidecar: bool) -> Check | None:
    """The check when llama.cpp cannot or need not load the file; None when it can."""
    llama = subject.options.llama
    if llama is False:
        return Check(LLAMA_CHECK, None, "skipped (--no-llama)")
    what = "the draft" if subject.is_draft else "the composite"
    if subject.model.remote:
        return _not_run(llama, f"{what} is remote: download it to load it with llama.cpp")
    if subject.is_draft and not sidecar:
        return _not_run(
            llama,
            "a draft without token_embd/output_norm runs only inside its composite: verify that "
            "(gguf-mtp compose TARGET DRAFT -o OUTDIR --verify)",
        )
    if not llama_cpp_available():
        return _not_run(llama, f"llama-cpp-python is not installed; to load {what} with llama.cpp: {INSTALL_HINT}")
    return None


def _not_run(llama: bool | None, detail: str) -> Check:
    """The llama.cpp check when it cannot run: skipped, or failed when it was required (``llama=True``)."""
    return Check(LLAMA_CHECK, None if llama is None else False, ("skipped: " if llama is None else "") + detail)


def _nextn_shortfall(result: LlamaCheck, declared: int) -> str | None:
    """What llama.cpp did short of the ``declared`` NextN blocks it loaded (``; ...``), or None."""
    if not (result.loaded and declared):
        return None
    if result.n_layer_nextn != declared:
        return f"; the file declares {declared} NextN block(s), llama.cpp loaded {result.n_layer_nextn}"
    if result.mtp_decode_ok is not True:
        return "; the MTP decode step did not run"
    if result.mtp_blocks_decoded != declared:
        return f"; the MTP decode step ran through {result.mtp_blocks_decoded} of {declared} NextN blocks"
    return None


def _target_refusal(target: ShardSet) -> str:
    """What a composite llama.cpp refused owes to its ``target``: a composite is as loadable as its target, so when
    this llama.cpp refuses the target too (a key type it cannot read, an architecture it does not know), the fault
    is not the composition's. Empty when the target loads."""
    refused = check_with_llama(target.name, mtp=False, trunk=False)
    if refused.loaded or refused.crashed is not None:
        return ""
    return f"; the target {target.name} is refused by this llama.cpp too: {refused.error or 'load failed'}"
