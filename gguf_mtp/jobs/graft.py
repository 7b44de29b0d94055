"""``graft``: move the NextN (MTP) block(s) of one model into another -- extract, compose and verify in one pass.

The typical use: a Q8_0 (or BF16) quant carries the NextN block, a smaller community quant of the same
model dropped it; graft the first's block into the second without re-quantizing anything.

Compatibility is checked before a byte is copied: same architecture, same trunk block count, same
embedding width, same vocabulary (``{arch}.vocab_size`` and the tokenizer's token list, compared by
hash; the message says which differs). A NextN block quantized differently from the target's trunk is
fine. No temporary draft is written: the draft ``extract`` would write is planned in memory, ``compose``
plans the composite against it, and every range of that virtual draft is then re-bound to the source
shard its bytes really come from -- so NextN bytes travel once, source -> composite, by the kernel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf.constants import GGMLQuantizationType, GGUFValueType

from gguf_mtp.constants import (
    KEY_BLOCK_COUNT,
    KEY_EMBEDDING_LENGTH,
    KEY_NEXTN_PREDICT_LAYERS,
    KEY_TOKENS,
    KEY_VOCAB_SIZE,
)
from gguf_mtp.errors import BadGGUFError, IncompatibleDraftError
from gguf_mtp.files.plan import OutputFile, rebind
from gguf_mtp.format.header import KeyValue
from gguf_mtp.format.imatrix import ImportanceMatrix
from gguf_mtp.jobs.runner import WriteReport, run_write
from gguf_mtp.model.shards import ShardSet, open_model, vocab_size
from gguf_mtp.text import change_line, human_bytes, short

from .compose_plan import CompositionPlan, PlannedFile, plan_composition
from .extract import ExtractionPlan, find_nextn_blocks, plan_extraction
from .head_type import low_bit_warning, parse_outtype
from .replace_head import plan_head_removal, replace_lines

if TYPE_CHECKING:  # verify loads numpy: only a run that verifies imports it (the copy path starts fast, issue 41)
    from gguf_mtp.check.verify import VerifyReport

__all__ = ["GraftPlan", "GraftReport", "check_graft_compatible", "graft", "plan_graft"]


def _incompatible(
    source: ShardSet, target: ShardSet, what: str, parameter: str | None = None
) -> IncompatibleDraftError:
    return IncompatibleDraftError(
        f"cannot graft the NextN block of {source.name} into {target.name}: {what}", parameter=parameter
    )


def _differ(source: ShardSet, target: ShardSet, what: str, ours: object, theirs: object) -> IncompatibleDraftError:
    return _incompatible(source, target, f"{what} differ: {ours} in the source, {theirs} in the target")


def _tokens_digest(tokens: KeyValue) -> str:
    """SHA-256 of an encoded token list (element type, count and every token)."""
    return hashlib.sha256(tokens.raw[tokens.value_offset :]).hexdigest()


def _first_token_difference(source: ShardSet, target: ShardSet) -> str:
    ours, theirs = source.get(KEY_TOKENS), target.get(KEY_TOKENS)
    for index, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"token {index} is {short(a, 30)} in the source, {short(b, 30)} in the target"
    return "same tokens, differently typed"


def _check_token_list(model: ShardSet) -> None:
    """Refuse a ``tokenizer.ggml.tokens`` that is not an array of strings (llama.cpp reads nothing else).

    Raises:
        BadGGUFError: the key holds a scalar or an array of another element type (named, one line).
    """
    tokens = model.kv(KEY_TOKENS)
    if tokens is None:
        return
    if not tokens.is_array or tokens.element_type != GGUFValueType.STRING:
        raise BadGGUFError(f"{KEY_TOKENS} is {tokens.type_name}, not an array of strings (arr[str])", model.name)


def _check_vocabulary(source: ShardSet, target: ShardSet) -> None:
    _check_token_list(source)
    _check_token_list(target)
    key = source.arch_key(KEY_VOCAB_SIZE)
    stated, target_stated = source.get(key), target.get(key)
    if stated is not None and target_stated is not None and stated != target_stated:
        raise _differ(source, target, f"vocabularies ({key})", stated, target_stated)
    tokens, target_tokens = source.kv(KEY_TOKENS), target.kv(KEY_TOKENS)
    if tokens is not None and target_tokens is not None:
        _check_same_tokens(source, target, tokens, target_tokens)
        return
    size, target_size = vocab_size(source), vocab_size(target)
    if size is not None and target_size is not None and size != target_size:
        raise _differ(source, target, "vocabularies", f"{size} tokens", target_size)


def _check_same_tokens(source: ShardSet, target: ShardSet, tokens: KeyValue, target_tokens: KeyValue) -> None:
    """Both token lists are one list: as long, and with the same digest."""
    if tokens.array_length != target_tokens.array_length:
        what, count = f"vocabularies ({KEY_TOKENS})", tokens.array_length
        raise _differ(source, target, what, f"{count} tokens", target_tokens.array_length)
    digest, target_digest = _tokens_digest(tokens), _tokens_digest(target_tokens)
    if digest != target_digest:
        raise _incompatible(
            source, target,
            f"vocabularies differ: same number of tokens, but the {KEY_TOKENS} hashes differ "
            f"(sha256 {digest[:12]} in the source, {target_digest[:12]} in the target; "
            f"{_first_token_difference(source, target)})",
        )


#: Keys that differ between a model with a NextN block and one without, by design.
_EXPECTED_DIFFERENCES = (KEY_BLOCK_COUNT, KEY_NEXTN_PREDICT_LAYERS)


def _hparam_differences(source: ShardSet, target: ShardSet) -> Iterator[str]:
    """``{arch}.*`` scalars both models state with different values (notes, not errors: llama.cpp judges)."""
    prefix = f"{source.arch}."
    skip = {source.arch_key(k) for k in _EXPECTED_DIFFERENCES}
    for key, kv in source.first.kvs.items():
        other = target.kv(key)
        if key.startswith(prefix) and key not in skip and not kv.is_array and other is not None and other.raw != kv.raw:
            yield f"{key} is {short(kv.value)} in the source, {short(other.value)} in the target"


def check_graft_compatible(source: ShardSet, target: ShardSet) -> list[str]:
    """Check that ``source``'s NextN block(s) can be grafted onto ``target``; reads headers only.

    Args:
        source: the model that has the NextN block(s).
        target: the trunk-only model to receive them.

    Returns:
        Notes on differences that are allowed (other hyperparameter values both state).

    Raises:
        NoNextNBlockError: the source has no NextN block.
        IncompatibleDraftError: the target already has one, or the two differ in architecture, trunk
            block count, embedding width or vocabulary (the message says which, with both values).
    """
    nextn = find_nextn_blocks(source)
    if target.nextn_predict_layers:
        raise _incompatible(
            source, target,
            f"the target already has {target.nextn_predict_layers} NextN block(s) "
            f"({target.arch_key(KEY_NEXTN_PREDICT_LAYERS)}); strip them first (gguf-mtp strip), or replace them in "
            "one pass with replace_head",
            parameter="replace_head",
        )
    if source.arch != target.arch:
        raise _differ(source, target, "architectures", repr(source.arch), repr(target.arch))
    if nextn.first != target.block_count:
        raise _differ(
            source, target, "trunk block counts",
            f"{nextn.first} ({source.arch_key(KEY_BLOCK_COUNT)} {source.block_count} minus {nextn.count} NextN)",
            target.block_count,
        )
    key = source.arch_key(KEY_EMBEDDING_LENGTH)
    if source.get(key) != target.get(key):
        raise _differ(source, target, f"embedding widths ({key})", source.get(key), target.get(key))
    _check_vocabulary(source, target)
    return [f"hyperparameters differ: {d}" for d in _hparam_differences(source, target)]


def _rebind(file: PlannedFile, *virtual: OutputFile) -> PlannedFile:
    """``file`` with every range of the ``virtual`` files replaced by the input ranges they were planned from."""
    return dataclasses.replace(file, output=rebind(file.output, {v.path: v for v in virtual}))


@dataclass(frozen=True)
class GraftPlan:
    """Everything a graft run will write: the composition, with the NextN bytes read from the source."""

    source: ShardSet
    target: ShardSet
    extraction: ExtractionPlan  # the draft as extract would write it (never written: virtual)
    composition: CompositionPlan  # its files' segments point into the source and target files
    notes: tuple[str, ...] = ()

    @property
    def outputs(self) -> list[OutputFile]:
        return self.composition.outputs

    @property
    def output_paths(self) -> list[Path]:
        return [f.path for f in self.composition.files]

    @property
    def bytes_to_write(self) -> int:
        return self.composition.bytes_to_write


def plan_graft(
    source: ShardSet,
    target: ShardSet,
    output_dir: str | os.PathLike[str],
    *,
    basename: str | None = None,
    outtype: str | GGMLQuantizationType | None = None,
    replace_head: bool = False,
    imatrix: str | os.PathLike[str] | ImportanceMatrix | None = None,
) -> GraftPlan:
    """Plan the graft of ``source``'s NextN block(s) onto ``target`` (pure: reads headers only).

    Args:
        source: a model with NextN blocks.
        target: a trunk-only model of the same architecture, trunk, width and vocabulary.
        output_dir: folder for the composite; files keep the target's names.
        basename: name the outputs ``NAME-0000k-of-0000n.gguf`` (``NAME.gguf`` for one file) instead.
        outtype: the NextN tensors' type, as ``llama-quantize --pure --allow-requantize`` writes it from the
            source's (a quantized source is dequantized first); ``None`` copies them.
        replace_head: the target has NextN block(s): they are dropped and the source's take their place, in
            one pass (:mod:`gguf_mtp.jobs.replace_head`).
        imatrix: an importance matrix file (llama-imatrix's GGUF) the NextN tensors are quantized with, as
            ``llama-quantize --imatrix`` does; it lets ``outtype`` be a type that needs one (``iq2_xxs``...).

    Raises:
        NoNextNBlockError, IncompatibleDraftError: see :func:`check_graft_compatible`.
        BadGGUFError, KVEditError: the metadata of either model is unusable, or ``basename`` is invalid.
    """
    removal = plan_head_removal(target, "graft") if replace_head else None
    trunk = removal.trunk if removal is not None else target
    notes = check_graft_compatible(source, trunk)
    # The draft is never written: its name only appears in messages, and no output may refer to it.
    extraction = plan_extraction(source, f"{source.name} (NextN block)", outtype=outtype, imatrix=imatrix)
    draft = ShardSet((extraction.header,), None)
    composition = plan_composition(trunk, draft, Path(output_dir), basename=basename)
    if removal is not None:
        composition = removal.apply(composition)
    files = tuple(_rebind(f, extraction.output) for f in composition.files)
    return GraftPlan(source, target, extraction, dataclasses.replace(composition, files=files), tuple(notes))


@dataclass(kw_only=True)
class GraftReport(WriteReport):
    """What a graft run did (or, with ``dry_run``, would do)."""

    plan: GraftPlan
    verification: VerifyReport | None = None  # None when not verified

    @property
    def output_paths(self) -> list[Path]:
        return self.plan.output_paths

    @property
    def ok(self) -> bool:
        """Written (or planned) and, when verified, verified."""
        return self.verification is None or bool(self.verification.ok)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        plan, composition = self.plan, self.plan.composition
        result: dict[str, Any] = {
            "command": "graft",
            "dry_run": self.dry_run,
            "source": [str(p) for p in plan.source.paths],
            "target": [str(p) for p in plan.target.paths],
            "architecture": plan.target.arch,
            "block": composition.block,
            "nextn_blocks": composition.nextn_blocks,
            "files": [f.to_dict() for f in composition.files],
            "tensors": {
                "target": plan.target.tensor_count,
                "added": len(composition.renamed),
                "removed": composition.replaced.tensors if composition.replaced is not None else 0,
                "total": sum(len(f.tensors) for f in composition.files),
            },
            "nextn_tensors": [
                {"name": t.name, "type": t.type_name, "bytes": t.nbytes} for t in plan.extraction.header.tensors
            ],
            "head": composition.head.to_dict(),
            "replaced_head": composition.replaced.to_dict() if composition.replaced is not None else None,
            "kv_changes": [c.to_dict() for c in composition.kv_changes],
            "bytes_to_write": plan.bytes_to_write,
            **self.write_fields(),
            "ok": self.ok,
        }
        if self.verification is not None:
            result["verification"] = self.verification.to_dict()
        return result

    def plan_lines(self) -> list[str]:
        """The plan: source block(s), target, each output with its metadata changes (shown before writing)."""
        plan, composition = self.plan, self.plan.composition
        nextn = plan.extraction.nextn
        types = sorted({t.type_name for _, t in nextn.tensors})
        lines = [
            f"source: {plan.source.name}: NextN block(s) {nextn.describe()}, {len(nextn.tensors)} tensors "
            f"({', '.join(types)}, {human_bytes(nextn.nbytes)})",
            f"target: {plan.target.name}: {plan.target.arch}, {len(plan.target.headers)} file(s), "
            f"{plan.target.tensor_count} tensors, blocks 0..{composition.block - 1}",
            f"head:   {composition.head.describe()}",
            *replace_lines(composition),
        ]
        for f in composition.files:
            added = (f", -{len(f.removed_tensors)} NextN" if f.removed_tensors else "") + (
                f", +{len(f.added_tensors)} NextN" if f.added_tensors else "")
            size = human_bytes(f.output.size)
            lines.append(f"{self.action(f.path)} {f.path} ({size}, {len(f.tensors)} tensors{added})")
            lines.extend(f"    {change_line(c)}" for c in f.kv_changes)
        lines.extend(f"note: {n}" for n in self.notes)
        return lines

    def outcome_lines(self) -> list[str]:
        """What was written (or, in a dry run, would be), and the verification."""
        lines = super().outcome_lines()
        if self.verification is not None:
            lines.extend(self.verification.describe())
        return lines


def graft(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    basename: str | None = None,
    outtype: str | None = None,
    replace_head: bool = False,
    imatrix: str | os.PathLike[str] | None = None,
    force: bool = False,
    verify: bool = False,
    llama: bool | None = None,
    dry_run: bool = False,
    progress: bool = True,
    on_plan: Callable[[WriteReport], None] | None = None,
) -> GraftReport:
    """Graft the NextN (MTP) block(s) of ``source`` onto ``target``, writing the composite to ``output_dir``.

    Every target tensor and every NextN tensor of the source is copied verbatim by the kernel; no draft
    file is written in between. The composite's metadata is patched as :func:`gguf_mtp.jobs.compose` does.

    Args:
        source: a GGUF with NextN blocks (one file or any shard of a split set), e.g. a Q8_0 quant.
        target: the trunk-only GGUF to receive them (one file or any shard of a split set).
        output_dir: folder for the composite (created if missing); files keep the target's names.
        basename: name outputs ``NAME-0000k-of-0000n.gguf`` (``NAME.gguf`` for one file).
        outtype: write the NextN tensors in this type (``q8_0``, ``q4_k``...) exactly as
            ``llama-quantize --pure --allow-requantize`` would; ``None`` copies them byte for byte.
        replace_head: the target has NextN block(s): drop them and graft the source's in their place, in one
            pass, byte for byte what :func:`gguf_mtp.jobs.strip.strip` then graft write.
        imatrix: an importance matrix file (llama-imatrix's GGUF) the NextN tensors are quantized with, as
            ``llama-quantize --imatrix`` does; it lets ``outtype`` be a type that needs one (``iq2_xxs``...).
        force: replace existing outputs (never inputs).
        verify: verify the written composite (:func:`gguf_mtp.check.verify.verify`, which loads it with
            llama.cpp and runs an MTP decode step), as :func:`gguf_mtp.jobs.compose.compose` does when asked
            (the ``graft`` and ``compose`` commands ask by default).
        llama: with ``verify``, whether to load it with llama.cpp (default: when installed).
        dry_run: plan and check only (compatibility, and every refusal a real run would make); write nothing.
        progress: show a progress bar on stderr when it is a terminal.
        on_plan: called with the report once the outputs passed their checks, before the first byte is
            written (the CLI prints the plan there).

    Returns:
        A :class:`GraftReport`; ``report.ok`` is false when verification failed (the files stay, so
        they can be inspected).

    Raises:
        NoNextNBlockError: the source has no NextN block.
        IncompatibleDraftError: the models do not fit together (the message says which property differs).
        BadGGUFError, ShardSetError: an input is malformed or incomplete.
        UnsafeOutputError: an output is an input, exists (without ``force``) or cannot be written.
        OutputWriteError: writing failed; nothing was left behind.

    Example:
        >>> graft("Q8_0/M-Q8_0-00001-of-00003.gguf", "UD-Q4_K_XL/M-00001-of-00003.gguf", "out/")  # doctest: +SKIP
    """

    def prepare() -> tuple[GraftReport, list[OutputFile], list[Path]]:
        donor, receiver = open_model(source), open_model(target)
        plan = plan_graft(donor, receiver, output_dir, basename=basename, outtype=outtype, replace_head=replace_head,
                          imatrix=imatrix)
        warning = low_bit_warning(parse_outtype(outtype, imatrix=imatrix is not None))
        report = GraftReport(plan=plan, dry_run=dry_run, notes=[*([warning] if warning else []), *plan.notes])
        return report, plan.outputs, [*donor.paths, *receiver.paths]

    def verify_written(report: GraftReport) -> None:
        from gguf_mtp.check.verify import verify as verify_composite

        # The source model is the draft: verify compares its NextN blocks' bytes with the composite's.
        plan = report.plan
        report.verification = verify_composite(
            plan.output_paths[0],
            # a replaced head is no longer the target's: its trunk is what strip + graft guarantee, by the plan
            target=plan.target.paths[0] if plan.composition.replaced is None else None,
            draft=plan.source.paths[0] if outtype is None else None,
            llama=llama, progress=progress,
        )

    return run_write(
        prepare, desc="graft", force=force, progress=progress, on_plan=on_plan, output_dir=output_dir,
        after_write=verify_written if verify else None,
    )
