"""``verify``: prove a composite is right, check by check, in groups (:data:`CHECK_GROUPS`, run in that order).

- structure (:mod:`.structure`): what the headers alone prove: every shard present and readable, ``split.*``
  right in every shard, tensors sized and placed as llama.cpp requires, per-layer arrays as long as
  ``block_count`` and trunk-length ones as long as the trunk, every declared NextN block complete;
- bytes (:mod:`.tensor_bytes`): with the target, every target tensor's bytes compared with the composite's;
  with the draft, every draft block tensor in the composite, bytes identical;
- KVs (:mod:`.kvs`): with the target, every target KV unchanged except those compose changes;
- llama.cpp (:mod:`.llama`): llama.cpp itself loads the composite and runs an MTP decode step through each
  NextN block: a load alone would miss a NextN block llama.cpp quietly ignored;
- acceptance (:mod:`.acceptance`): with ``acceptance``, the head's predicted acceptance against a floor.

An MTP-only file (a draft: a ``--standalone`` sidecar, or a bare draft for ``compose``) is proved as a
draft: the same structural checks, its NextN blocks complete, its global tensors
(:mod:`gguf_mtp.check.draft_checks`), with a target its fit to that target (instead of byte comparisons:
it is not made of the target), and llama.cpp loads a sidecar as the drafter it is and runs the MTP decode
steps only (an MTP-only file has no trunk graph; llama.cpp crashes trying one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from gguf_mtp.errors import BadGGUFError, ParameterError
from gguf_mtp.files.journal import pending_journal, uncommitted_line
from gguf_mtp.hub.remote import is_hub_path
from gguf_mtp.model.blocks import BlockLayout
from gguf_mtp.model.shard_scan import ScannedModel, scan_model
from gguf_mtp.model.shards import open_model

from ..acceptance_floor import DEFAULT_FLOOR, refuse_unmeasurable
from .acceptance import acceptance_group
from .kvs import metadata_group
from .llama import llama_group
from .report import Check, VerifyReport
from .structure import structure_group
from .subject import CheckGroup, Subject, VerifyOptions, is_mtp_draft, read_layout
from .tensor_bytes import bytes_group, draft_renames
from .tensor_bytes import same_ggml_shape as same_ggml_shape

__all__ = ["Check", "VerifyReport", "verify"]

#: The check groups every verify runs, in the report's order; each decides which of its checks apply to the file.
CHECK_GROUPS: tuple[CheckGroup, ...] = (structure_group, bytes_group, metadata_group, llama_group, acceptance_group)


def verify(
    composite: str | os.PathLike[str],
    *,
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | None = None,
    llama: bool | None = None,
    progress: bool = True,
    allow_kv: Iterable[str] = (),
    acceptance: bool = False,
    floor: float = DEFAULT_FLOOR,
) -> VerifyReport:
    """Check a composite GGUF (one file or any shard of a split set), or an MTP-only draft, and report each check.

    Args:
        composite: the composite (a local path; a ``hf://`` file gets the header checks only); or an
            MTP-only file (a ``--standalone`` sidecar, a bare draft), which is checked as a draft:
            structure, NextN blocks, global tensors, and llama.cpp loads a sidecar and runs its MTP steps.
        target: the model the composite was made from: every one of its tensors must be in the
            composite with identical bytes, and its KVs unchanged except ``{arch}.block_count``,
            ``{arch}.nextn_predict_layers``, the per-layer arrays (extended; the trunk's entries
            equal) and ``split.tensors.count``. For a draft: the model it runs beside, which it must fit
            (architecture, width, ``token_embd``/``output`` shapes, vocabulary).
        draft: the MTP draft: every one of its block tensors must be in the composite (``blk.0``
            renamed to ``blk.N``), bytes identical; or a whole model with NextN blocks (a graft
            source): then its NextN blocks' tensors. Not for a draft.
        llama: load the file with llama.cpp and run the MTP decode steps: ``True`` (fail when
            llama-cpp-python is missing), ``False`` (skip), ``None`` (when installed).
        progress: a progress bar over the bytes compared (stderr, only on a terminal).
        allow_kv: further keys the composite may change or add (e.g. ``--set-kv`` keys of compose).
        acceptance: also predict the head's acceptance (``accept``, n-max 1, built-in prompts) and fail below
            ``floor`` (:mod:`gguf_mtp.check.acceptance_floor`). A sidecar needs ``target`` for it.
        floor: the lowest acceptance that passes, from 0 to 1.

    Returns:
        A :class:`VerifyReport`; ``.ok`` is true when no check failed; ``.kind`` says whether the file was
        checked as a model or as an MTP-only draft.

    Raises:
        BadGGUFError: ``composite`` does not exist or a file of it is not a readable GGUF (no check runs, nor
            llama.cpp), or ``target``/``draft`` is unreadable.
        ParameterError: ``draft`` is given for an MTP-only file; ``acceptance`` for a model without a tokenizer.
        ShardSetError: ``target``/``draft`` is an inconsistent split set.
        HubError: a remote composite could not be reached.
    """
    started = time.perf_counter()
    _refuse_parameters(composite, target, draft, floor)
    model = scan_model(composite)
    model.require_readable_headers()  # a file that is not a GGUF: one line, as inspect and compose say it
    report = VerifyReport(composite=str(composite), target=_path(target), draft=_path(draft))
    layout, layout_error = read_layout(model)
    is_draft = is_mtp_draft(model, layout)
    if acceptance and not model.remote:
        _refuse_unmeasurable(target if is_draft else composite)  # a draft's head runs beside its target
    report.checks += _journal_checks(model)
    options = VerifyOptions(llama, progress, tuple(allow_kv), acceptance, floor)
    subject = _subject(model, layout, layout_error, is_draft, options, target, draft)
    report.kind = "mtp-draft" if is_draft else "model"
    for group in CHECK_GROUPS:
        group(subject, report)
    report.seconds = time.perf_counter() - started
    return report


def _refuse_parameters(
    composite: str | os.PathLike[str],
    target: str | os.PathLike[str] | None,
    draft: str | os.PathLike[str] | None,
    floor: float,
) -> None:
    if not 0.0 <= floor <= 1.0:
        raise ParameterError(f"floor {floor:g}: give an acceptance from 0 to 1", parameter="floor")
    if is_hub_path(composite) and (target is not None or draft is not None):
        raise BadGGUFError("comparing bytes with --target/--draft needs the composite on disk", str(composite))


def _path(path: str | os.PathLike[str] | None) -> str | None:
    return os.fspath(path) if path is not None else None


def _refuse_unmeasurable(measured: str | os.PathLike[str] | None) -> None:
    """Refuse ``--acceptance`` up front for a model whose acceptance cannot be measured (no tokenizer)."""
    if measured is not None:
        refuse_unmeasurable(measured)


def _journal_checks(model: ScannedModel) -> list[Check]:
    """A set on disk is committed unless a journal says not: the ``committed`` check is listed only when it fails."""
    journal = pending_journal(shard.name for shard in model.shards) if not model.remote else None
    return [Check("committed", False, uncommitted_line(str(journal)))] if journal is not None else []


def _subject(
    model: ScannedModel,
    layout: BlockLayout | None,
    layout_error: str | None,
    is_draft: bool,
    options: VerifyOptions,
    target: str | os.PathLike[str] | None,
    draft: str | os.PathLike[str] | None,
) -> Subject:
    """The file with the models it is compared with, opened, and the draft's tensors' names in the composite."""
    if is_draft and draft is not None:
        raise ParameterError(
            "draft compares a composite with the draft it was made from, but this file is itself an MTP draft "
            "(to check it beside its model, give that as target)",
            model.shards[0].name,
            parameter=("draft", "target"),
        )
    target_set = open_model(target) if target is not None else None
    draft_set = open_model(draft) if draft is not None else None
    block = target_set.block_count if target_set is not None else (layout.trunk if layout else 0)
    renames, dropped = draft_renames(draft_set, block) if draft_set is not None else ({}, ())
    return Subject(model, layout, layout_error, is_draft, options, target_set, draft_set, renames, dropped)
