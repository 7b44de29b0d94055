"""Plan a composition: which files, which KVs, which tensors from where. Pure: reads only headers.

The plan is the whole truth of a compose run: ``--dry-run`` prints it, tests assert on it, and
:mod:`gguf_mtp.write` writes exactly what it says. What counts as a block or a NextN block comes
from ``{arch}.block_count`` and ``{arch}.nextn_predict_layers``; which per-layer arrays get which
entries for the NextN blocks, from the per-architecture table :mod:`gguf_mtp.model.arch_rules`.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf.constants import GGMLQuantizationType, GGUFValueType

from gguf_mtp.constants import (
    BLOCK_TENSOR,
    DRAFT_GLOBAL_TENSORS,
    KEY_ALIGNMENT,
    KEY_ARCHITECTURE,
    KEY_BLOCK_COUNT,
    KEY_EMBEDDING_LENGTH,
    KEY_NEXTN_PREDICT_LAYERS,
    KEY_SPLIT_TENSORS_COUNT,
    SPLIT_NAME,
    split_file_name,
)
from gguf_mtp.errors import BadGGUFError, IncompatibleDraftError, KVEditError, ParameterError
from gguf_mtp.files.plan import Bytes, CopyRange, OutputFile, Segment, Zeros
from gguf_mtp.format.header import GGUFArray, GGUFHeader, KeyValue, TensorInfo, encode_kv
from gguf_mtp.format.imatrix import ImportanceMatrix
from gguf_mtp.format.kv_edit import (
    INT_RANGES,
    KVChange,
    KVOverride,
    apply_kv_edits,
    check_int,
    resolve_override,
    with_int_value,
)
from gguf_mtp.format.layout import congruent_header, pack_tensors
from gguf_mtp.jobs.head_type import HeadSummary, parse_imatrix, parse_outtype, retype_head_tensor, summarize_head
from gguf_mtp.model.arch_rules import LayerKeyRule, NextNValue, extended_arrays, is_known_arch, splice_refusal
from gguf_mtp.model.blocks import (
    block_layout_problem,
    block_tensor_problems,
    is_mtp_only,
    layer_array,
    read_block_layout,
)
from gguf_mtp.model.set_id import placeholder_kv, stamp_set_id, without_set_id
from gguf_mtp.model.shards import ShardSet, vocab_size

__all__ = [
    "MANAGED_KEYS",
    "CompositionPlan",
    "FilesPlan",
    "KVChange",
    "PlannedFile",
    "ReplacedHead",
    "composite_file_names",
    "managed_key",
    "plan_composition",
]


@dataclass(frozen=True)
class PlannedFile:
    """One output file of a plan (compose, strip), derived from one source file."""

    output: OutputFile
    source: Path  # the file it is derived from
    tensors: tuple[TensorInfo, ...]
    kv_changes: tuple[KVChange, ...]
    added_tensors: tuple[str, ...] = ()
    removed_tensors: tuple[str, ...] = ()
    moved_tensors: tuple[str, ...] = ()  # tensors whose data offset changed (they followed removed data)

    @property
    def path(self) -> Path:
        return self.output.path

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "source": str(self.source),
            "tensors": len(self.tensors),
            "added_tensors": list(self.added_tensors),
            "removed_tensors": list(self.removed_tensors),
            "moved_tensors": list(self.moved_tensors),
            "kv_changes": [c.to_dict() for c in self.kv_changes],
            "bytes": self.output.size,
        }


class FilesPlan:
    """What every plan made of :class:`PlannedFile` s offers (compose, strip)."""

    files: tuple[PlannedFile, ...]

    @property
    def outputs(self) -> list[OutputFile]:
        return [f.output for f in self.files]

    @property
    def kv_changes(self) -> list[KVChange]:
        return [c for f in self.files for c in f.kv_changes]

    @property
    def bytes_to_write(self) -> int:
        return sum(f.output.size for f in self.files)


@dataclass(frozen=True)
class ReplacedHead:
    """The NextN block(s) a ``replace_head`` plan drops from its target (:mod:`gguf_mtp.jobs.replace_head`)."""

    blocks: str  # ``blk.88`` or ``blk.88..blk.90``
    count: int  # how many blocks
    head: HeadSummary  # their types and size
    tensors: int  # how many tensors

    def to_dict(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "nextn_blocks": self.count, "tensors": self.tensors, **self.head.to_dict()}


@dataclass(frozen=True)
class CompositionPlan(FilesPlan):
    """Everything a compose run will write."""

    target: ShardSet
    draft: ShardSet
    block: int  # index of the first NextN block in the composite (= the target's trunk block count)
    nextn_blocks: int
    files: tuple[PlannedFile, ...]
    renamed: tuple[tuple[str, str], ...]  # (draft name, composite name)
    dropped: tuple[str, ...] = field(default=())  # draft globals left out (the trunk's are used)
    replaced: ReplacedHead | None = None  # the target's own NextN block(s), dropped (``replace_head``)

    @property
    def head(self) -> HeadSummary:
        """The NextN block's types and size as written into the composite."""
        last = self.files[-1]
        added = set(last.added_tensors)
        return summarize_head(t for t in last.tensors if t.name in added)


def _check_compatible(target: ShardSet, draft: ShardSet) -> None:
    arch = target.arch
    draft_arch = draft.get(KEY_ARCHITECTURE)
    if draft_arch != arch:
        raise IncompatibleDraftError(f"draft is for architecture {draft_arch!r}, the target is {arch!r}", draft.name)
    key = KEY_EMBEDDING_LENGTH.format(arch=arch)
    width, draft_width = target.get(key), draft.get(key)
    if draft_width is None:
        raise IncompatibleDraftError(f"draft does not state {key}", draft.name)
    if width != draft_width:
        raise IncompatibleDraftError(f"draft {key} = {draft_width!r}, the target's is {width!r}", draft.name)
    target_vocab, draft_vocab = vocab_size(target), vocab_size(draft)
    if target_vocab is not None and draft_vocab is not None and target_vocab != draft_vocab:
        raise IncompatibleDraftError(
            f"draft vocabulary has {draft_vocab} tokens, the target's {target_vocab}", draft.name
        )


def _check_roles(target: ShardSet, draft: ShardSet) -> None:
    """Both inputs are what their place says (a model, a draft), and their blocks agree with their tensors.

    Raises:
        IncompatibleDraftError: the arguments look swapped, the target is itself a draft, or the draft is
            a trunk-only model (``compose TARGET TARGET``).
    """
    target_layout = read_block_layout(target.first)
    draft_layout, problem = block_layout_problem(draft.first)
    if draft_layout is None and problem and KEY_NEXTN_PREDICT_LAYERS.format(arch=draft.arch) in problem:
        return  # a draft's count of its own blocks: _draft_blocks compares it with the blocks it carries
    if draft_layout is None and draft.first.get(draft.arch_key(KEY_BLOCK_COUNT)) is not None:
        raise BadGGUFError(problem or "no block layout", draft.name)
    # a bare draft need not state a block count: the target's decides, judged by its tensors below
    target_is_draft = is_mtp_only(target_layout, target.block_indices())
    draft_nextn = draft_layout.nextn if draft_layout is not None else 0
    draft_is_trunk = draft_nextn == 0 and not any(".nextn." in t.name for _, t in draft.iter_tensors())
    _refuse_swapped_roles(target, draft, target_is_draft=target_is_draft, draft_is_trunk=draft_is_trunk)


def _refuse_swapped_roles(target: ShardSet, draft: ShardSet, *, target_is_draft: bool, draft_is_trunk: bool) -> None:
    """Raises :class:`IncompatibleDraftError` when the target is a draft, or the draft a model without MTP."""
    if target_is_draft and draft_is_trunk:
        raise IncompatibleDraftError(
            f"the arguments look swapped: {target.name} is an MTP draft (no trunk block tensors) and {draft.name} "
            "a model without MTP; use: gguf-mtp compose TARGET DRAFT -o OUTDIR"
        )
    if target_is_draft:
        raise IncompatibleDraftError("the target is an MTP draft (no trunk block tensors), not a model", target.name)
    if draft_is_trunk and draft.block_indices() and not draft.is_split:  # a split draft gets its own message next
        raise IncompatibleDraftError(
            f"the draft has no NextN block: it looks like a trunk model ({draft.arch_key(KEY_NEXTN_PREDICT_LAYERS)} "
            "is 0 or absent and no blk.*.nextn.* tensors)",
            draft.name,
        )


def _check_block_tensors(*models: ShardSet) -> None:
    """Refuse a model whose ``block_count`` disagrees with its tensors (trunk blocks without tensors).

    Raises:
        BadGGUFError: the first such disagreement, naming the file.
    """
    for model in models:
        layout, _ = block_layout_problem(model.first)
        if layout is None:
            continue  # already refused or judged by _draft_blocks
        problems = block_tensor_problems(layout, model.block_indices())
        problems = [p for p in problems if not p.startswith("tensors of blk.")]  # those have their own message
        if problems:
            raise BadGGUFError(problems[0], model.name)


def _draft_blocks(draft: ShardSet, block: int) -> tuple[int, int, list[TensorInfo], list[str]]:
    """(first draft block, number of blocks, block tensors, dropped globals) of a draft."""
    by_block, dropped = _draft_tensors(draft)
    indices = sorted(by_block)
    first, count = indices[0], len(indices)
    if indices != list(range(first, first + count)) or first not in (0, block):
        shown = ", ".join(f"blk.{i}" for i in indices)
        raise IncompatibleDraftError(
            f"draft blocks {shown}: expected blk.0 (renamed to blk.{block}) or blk.{block} (the target's trunk "
            "block count), contiguous",
            draft.name,
        )
    declared = draft.get(KEY_NEXTN_PREDICT_LAYERS.format(arch=draft.arch))
    if declared is not None and declared != count:
        raise IncompatibleDraftError(
            f"draft declares nextn_predict_layers = {declared!r} but carries {count} block(s)", draft.name
        )
    tensors = [t for i in indices for t in by_block[i]]
    return first, count, tensors, dropped


def _draft_tensors(draft: ShardSet) -> tuple[dict[int, list[TensorInfo]], list[str]]:
    """(the draft's block tensors by block, the global tensors compose leaves out).

    Raises:
        IncompatibleDraftError: a tensor neither in a block nor a global one, or no block tensor at all.
    """
    by_block: dict[int, list[TensorInfo]] = {}
    dropped: list[str] = []
    for _, tensor in draft.iter_tensors():
        match = BLOCK_TENSOR.match(tensor.name)
        if match:
            by_block.setdefault(int(match["block"]), []).append(tensor)
        elif tensor.name in DRAFT_GLOBAL_TENSORS:
            dropped.append(tensor.name)
        else:
            raise IncompatibleDraftError(
                f"tensor {tensor.name!r} is outside any block; a draft may only carry blk.* tensors "
                f"and {', '.join(DRAFT_GLOBAL_TENSORS)}",
                draft.name,
            )
    if not by_block:
        raise IncompatibleDraftError("draft has no blk.* tensors", draft.name)
    return by_block, dropped


def _nextn_value(draft: ShardSet, key: str, draft_block: int, element_type: GGUFValueType) -> Any:
    """The draft's value of per-layer ``key`` for its block ``draft_block``."""
    value = _draft_entry(draft, key, draft_block)
    what = f"{draft.name}: {key}[{draft_block}]"
    if element_type in INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise IncompatibleDraftError(f"{key} = {value!r} is not an integer", draft.name)
        try:
            return check_int(value, element_type, what)
        except KVEditError as e:
            raise IncompatibleDraftError(str(e)) from None
    if element_type in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise IncompatibleDraftError(f"{key} = {value!r} is not a number", draft.name)
        return float(value)
    if element_type == GGUFValueType.BOOL and isinstance(value, bool):
        return value
    raise IncompatibleDraftError(f"{key}: cannot extend an array of {element_type.name} with {value!r}", draft.name)


def _draft_entry(draft: ShardSet, key: str, draft_block: int) -> Any:
    """The draft's entry of ``key`` for its block ``draft_block`` (a scalar holds for every block).

    Raises:
        IncompatibleDraftError: the draft has no ``key``, or no entry for the block.
    """
    kv = draft.kv(key)
    if kv is None:
        raise IncompatibleDraftError(
            f"the target's per-layer array {key} needs a value for the NextN block, and the draft has no {key}",
            draft.name,
        )
    if not kv.is_array:
        return kv.value
    values = kv.value
    if draft_block >= len(values):
        raise IncompatibleDraftError(
            f"{key} has {len(values)} entries, none for the draft's block {draft_block}", draft.name
        )
    return values[draft_block]


def _constant_value(target: ShardSet, kv: KeyValue, rule: LayerKeyRule, element_type: GGUFValueType) -> Any:
    """The fixed NextN entry of ``rule`` as an item of ``kv`` (whose items are ``element_type``)."""
    value = rule.value
    if element_type == GGUFValueType.BOOL and isinstance(value, bool):
        return value
    if element_type in INT_RANGES and isinstance(value, int) and not isinstance(value, bool):
        return value
    if element_type in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) and isinstance(value, (int, float)):
        return float(value)
    raise BadGGUFError(
        f"per-layer array {kv.key} has {element_type.name} items, but its NextN entry is {rule.describe()}", target.name
    )


def _per_layer_edits(target: ShardSet, draft: ShardSet, draft_first: int, n_blocks: int) -> dict[str, KeyValue]:
    """The target's per-layer arrays with entries for the ``n_blocks`` NextN blocks, per
    :mod:`gguf_mtp.model.arch_rules`: the draft's entries (its blocks ``draft_first ..``), a constant, or
    none (trunk-length arrays are not among them).

    Raises:
        IncompatibleDraftError: an array the table does not know that the draft carries no values for
            (every such key named), or a draft value that does not fit.
        BadGGUFError: an array of items that cannot be extended.
    """
    arch = target.arch
    refusal = splice_refusal(arch)
    if refusal:
        raise IncompatibleDraftError(f"cannot compose {arch}: {refusal}", draft.name)
    arrays = extended_arrays(target.first, arch, target.trunk_block_count)
    for kv, _ in arrays:  # first: an array no rule or draft could extend is the target's own fault
        layer_array(kv, target.name)
    _refuse_unknown_arrays(arch, [kv.key for kv, rule in arrays if rule is None and draft.kv(kv.key) is None], draft)
    return {kv.key: _extended_array(target, draft, kv, rule, draft_first, n_blocks) for kv, rule in arrays}


def _refuse_unknown_arrays(arch: str, unknown: list[str], draft: ShardSet) -> None:
    """Raises :class:`IncompatibleDraftError` naming the per-layer arrays ``unknown`` no rule or draft extends."""
    if not unknown:
        return
    known = is_known_arch(arch)
    rules = f"gguf-mtp's {arch} rules do not give" if known else f"gguf-mtp has no rules for {arch!r} to give"
    raise IncompatibleDraftError(
        f"the target has per-layer array(s) {', '.join(unknown)} whose NextN value {rules} "
        "(gguf_mtp/model/arch_rules.py), and the draft carries no values for them",
        draft.name,
    )


def _extended_array(target: ShardSet, draft: ShardSet, kv: KeyValue, rule: LayerKeyRule | None, draft_first: int,
                    n_blocks: int) -> KeyValue:
    """The per-layer array ``kv`` with its ``n_blocks`` NextN entries: the rule's constant, or the draft's values."""
    etype = kv.element_type
    assert etype is not None
    if rule is not None and rule.kind is NextNValue.CONSTANT:
        extra = (_constant_value(target, kv, rule, etype),) * n_blocks
    else:
        extra = tuple(_nextn_value(draft, kv.key, draft_first + j, etype) for j in range(n_blocks))
    return encode_kv(kv.key, GGUFValueType.ARRAY, GGUFArray(etype, kv.typed_value.items + extra))


#: The keys compose computes, as ``fnmatch`` patterns (``{arch}``: the target's architecture), with what
#: they hold: the one table ``set_kv`` is checked against. An override of one of them would be reported as
#: set and then overwritten (or would break the set), so it is refused, naming the key.
#: ``{arch}.nextn_predict_layers`` is computed too, but may be given with the value compose writes (a no-op);
#: the per-layer arrays compose extends are arrays, which ``set_kv`` cannot set at all.
MANAGED_KEYS: tuple[tuple[str, str], ...] = (
    ("split.*", "the shard layout"),
    ("GGUF.*", "the file format's own"),
    ("gguf_mtp.*", "gguf-mtp's own bookkeeping: the set id, the header padding"),
    (KEY_ALIGNMENT, "the alignment the target's tensor data is placed at"),
    (KEY_ARCHITECTURE, "the name every model key is prefixed with"),
    (KEY_BLOCK_COUNT, "the trunk's blocks plus the NextN block(s)"),
)


def managed_key(key: str, arch: str) -> str | None:
    """What compose computes in ``key`` (per :data:`MANAGED_KEYS`), or ``None`` when ``set_kv`` may set it."""
    for pattern, holds in MANAGED_KEYS:
        if fnmatch.fnmatchcase(key, pattern.format(arch=glob.escape(arch))):
            return holds
    return None

#: llama.cpp's ``GGML_MAX_NAME``: its GGUF reader refuses a tensor name of this many bytes or more, and
#: renaming ``blk.0.x`` to ``blk.88.x`` makes a name longer.
GGML_MAX_NAME = 64


def _model_kv_edits(
    target: ShardSet, draft: ShardSet, draft_first: int, n_blocks: int, overrides: Sequence[KVOverride]
) -> dict[str, KeyValue | None]:
    """The new shard-1 KVs, by key (replacing or adding), of a composition."""
    arch = target.arch
    block = target.trunk_block_count
    edits: dict[str, KeyValue | None] = {}

    count_key = KEY_BLOCK_COUNT.format(arch=arch)
    edits[count_key] = with_int_value(target.first, count_key, block + n_blocks)

    nextn_key = KEY_NEXTN_PREDICT_LAYERS.format(arch=arch)
    nextn_kv = target.kv(nextn_key)
    nextn_type = nextn_kv.vtype if nextn_kv is not None and nextn_kv.vtype in INT_RANGES else GGUFValueType.UINT32
    edits[nextn_key] = encode_kv(nextn_key, nextn_type, n_blocks)

    edits.update(_per_layer_edits(target, draft, draft_first, n_blocks))

    for override in overrides:
        key = override.key
        holds = managed_key(key, arch)
        if holds is not None:
            raise KVEditError(f"set_kv {override}: {key} is managed by compose ({holds}) and cannot be set")
        existing = target.kv(key)
        if existing is None and key == nextn_key and override.type_name is None:
            existing = edits[nextn_key]  # the key compose adds: an untyped override takes its type
        resolved = resolve_override(override, existing)
        if key == nextn_key and resolved.value != n_blocks:
            raise KVEditError(
                f"set_kv {override}: the composite carries {n_blocks} NextN block(s), so {key} must be {n_blocks}"
            )
        edits[key] = resolved
    return edits


def _output_prefix(basename: str, count: int) -> str:
    """The prefix ``basename`` names: a whole file name (``X.gguf``, ``X-00001-of-00003.gguf``) is taken as
    its prefix ``X`` (so the suffix is never doubled), unless its shard count is not the target's."""
    if "/" in basename or basename in ("", ".", ".."):
        raise ParameterError(f"basename {basename!r} must be a plain file name prefix", parameter="basename")
    match = SPLIT_NAME.match(basename)
    if match:
        if int(match["count"]) != count:
            raise ParameterError(
                f"basename {basename!r} names a set of {int(match['count'])} file(s), but the output has {count}: "
                f"give the prefix only ({match['prefix']!r})",
                parameter="basename",
            )
        return match["prefix"]
    prefix = basename.removesuffix(".gguf")
    if prefix in ("", ".", ".."):
        raise ParameterError(f"basename {basename!r} must be a plain file name prefix", parameter="basename")
    return prefix


def composite_file_names(basename: str, count: int, *, split: bool) -> list[str]:
    """The file names of a composite written under ``basename`` for a target of ``count`` files: ``PREFIX.gguf``
    for a single-file target, else ``PREFIX-NNNNN-of-NNNNN.gguf`` (``split``: the target is a split set, even of
    one file).

    Raises:
        ParameterError: ``basename`` is not a plain file name prefix, or names a set of another count.
    """
    prefix = _output_prefix(basename, count)
    if not split:
        return [f"{prefix}.gguf"]
    return [split_file_name(prefix, i, count) for i in range(1, count + 1)]


def _output_names(target: ShardSet, output_dir: Path, basename: str | None) -> list[Path]:
    if basename is None:
        return [output_dir / Path(h.path).name for h in target.headers]
    return [output_dir / n for n in composite_file_names(basename, len(target.headers), split=target.is_split)]


def _data_section(header: GGUFHeader) -> list[Segment]:
    """The target file's tensor data, copied verbatim, padded to the packed layout llama.cpp requires.

    Raises:
        BadGGUFError: the tensors are not back to back in table order (llama.cpp could not load it).
    """
    misplaced = header.first_misplaced_tensor()
    if misplaced is not None:
        tensor, expected = misplaced
        raise BadGGUFError(
            f"tensor {tensor.name!r} is at data offset {tensor.offset:,}, but llama.cpp requires {expected:,} "
            "(tensors back to back in table order, each padded to the alignment)",
            header.path,
        )
    size = header.packed_data_size
    copied = min(size, header.data_size)
    segments: list[Segment] = []
    if copied:
        segments.append(CopyRange(Path(header.path), header.data_offset, copied))
    if size > copied:  # the file ends without the last tensor's padding
        segments.append(Zeros(size - copied))
    return segments


def _appended_layout(
    start: int,
    alignment: int,
    tensors: Iterable[tuple[TensorInfo, str]],
    draft: GGUFHeader,
    outtype: GGMLQuantizationType | None = None,
    imatrix: ImportanceMatrix | None = None,
) -> tuple[list[TensorInfo], list[Segment], int]:
    """Place draft tensors after ``start`` (data-relative) at ``alignment``: (infos, segments, end). With
    ``outtype`` they are re-typed as llama-quantize --pure would (:mod:`gguf_mtp.jobs.head_type`), with
    ``imatrix`` under their new names."""
    arch = draft.get(KEY_ARCHITECTURE)
    path = Path(draft.path)

    def placed(tensor: TensorInfo, new_name: str) -> tuple[TensorInfo, tuple[Segment, ...]]:
        info, data = retype_head_tensor(tensor, path, draft.data_offset + tensor.offset, outtype, arch, imatrix,
                                        new_name)
        return replace(info, name=new_name), data

    return pack_tensors((placed(*item) for item in tensors), alignment, start=start, pad_end=False)


def plan_composition(
    target: ShardSet,
    draft: ShardSet,
    output_dir: Path,
    *,
    block: int | None = None,
    set_kv: Sequence[KVOverride] = (),
    basename: str | None = None,
    outtype: str | GGMLQuantizationType | None = None,
    imatrix: str | os.PathLike[str] | ImportanceMatrix | None = None,
) -> CompositionPlan:
    """Plan the splice of ``draft``'s NextN block(s) into ``target`` as its final block(s).

    Args:
        target: the model to extend (one file or a split set), trunk only.
        draft: a single-file GGUF whose block tensors are ``blk.0.*`` or ``blk.N.*``.
        output_dir: where the composite's files go.
        block: the NextN block index; only the target's trunk block count is accepted.
        set_kv: extra metadata overrides for the model KVs.
        basename: name the outputs ``NAME-0000k-of-0000n.gguf`` instead of the target's names.
        outtype: the NextN tensors' type, as llama-quantize --pure writes it (``None``: the draft's bytes).
        imatrix: an importance matrix (llama-imatrix's GGUF) the NextN tensors are quantized with, as
            llama-quantize --imatrix does; it lets ``outtype`` be a type that needs one.

    Raises:
        IncompatibleDraftError: the draft does not fit the target.
        KVEditError: an override is invalid.
        BadGGUFError: the target's metadata is unusable.
        ParameterError: ``outtype`` is not a head type.
    """
    head_type = parse_outtype(outtype, imatrix=imatrix is not None)
    _check_roles(target, draft)  # first: a swapped pair is named as such, whatever else is wrong
    matrix = parse_imatrix(imatrix, head_type)
    if draft.is_split:
        raise IncompatibleDraftError("a draft must be a single GGUF file, not a split set", draft.name)
    _check_compatible(target, draft)
    trunk = _check_free_slot(target, block)
    draft_first, n_blocks, draft_tensors, dropped = _draft_blocks(draft, trunk)
    renamed = _renamed_draft_tensors(target, draft, draft_tensors, draft_first - trunk)
    edits = _model_kv_edits(target, draft, draft_first, n_blocks, set_kv)
    _check_block_tensors(target, draft)  # after the type checks of the edits: those name the smaller fault
    files = _planned_files(target, draft, renamed, edits, _output_names(target, output_dir, basename), head_type,
                           matrix)
    return CompositionPlan(
        target=target,
        draft=draft,
        block=trunk,
        nextn_blocks=n_blocks,
        files=tuple(files),
        renamed=tuple((t.name, new) for t, new in renamed),
        dropped=tuple(dropped),
    )


def _check_free_slot(target: ShardSet, block: int | None) -> int:
    """The index the NextN block gets (the trunk block count), once the target is known to have room for it."""
    if target.nextn_predict_layers:
        raise IncompatibleDraftError(
            f"target already has {target.nextn_predict_layers} NextN block(s) "
            f"({target.arch_key(KEY_NEXTN_PREDICT_LAYERS)}); strip them first, or replace them in one pass with "
            "replace_head",
            target.name,
            parameter="replace_head",
        )
    trunk = target.block_count
    if trunk < 1:
        raise BadGGUFError(f"{target.arch_key(KEY_BLOCK_COUNT)} = {trunk}: no trunk blocks", target.name)
    if block is not None and block != trunk:
        raise IncompatibleDraftError(
            f"block {block}: the NextN block must follow the trunk, so it can only be {trunk} "
            f"(the target's {target.arch_key(KEY_BLOCK_COUNT)})",
            target.name,
            parameter="block",
        )
    existing = sorted(i for i in target.block_indices() if i >= trunk)
    if existing:
        raise IncompatibleDraftError(
            f"target already has tensors of blk.{existing[0]} (its block_count is {trunk})", target.name
        )
    return trunk


def _renamed_draft_tensors(
    target: ShardSet, draft: ShardSet, draft_tensors: Sequence[TensorInfo], shift: int
) -> list[tuple[TensorInfo, str]]:
    """Each draft block tensor with the name it gets in the composite (its block index moved by ``-shift``)."""
    renamed: list[tuple[TensorInfo, str]] = []
    renamed_from: dict[str, str] = {}
    for tensor in draft_tensors:
        match = BLOCK_TENSOR.match(tensor.name)
        assert match
        new_name = f"blk.{int(match['block']) - shift}.{match['rest']}"
        if new_name in target.tensor_locations:
            raise IncompatibleDraftError(f"draft tensor {new_name!r} already exists in the target", draft.name)
        if new_name in renamed_from:  # blk.0.x and blk.00.x are both block 0
            raise IncompatibleDraftError(
                f"draft tensors {renamed_from[new_name]!r} and {tensor.name!r} would both become {new_name!r}",
                draft.name,
            )
        if len(new_name.encode("utf-8", "surrogateescape")) >= GGML_MAX_NAME:
            raise IncompatibleDraftError(
                f"draft tensor {tensor.name!r} would be named {new_name!r}, longer than the "
                f"{GGML_MAX_NAME - 1} bytes llama.cpp allows",
                draft.name,
            )
        renamed_from[new_name] = tensor.name
        renamed.append((tensor, new_name))
    return renamed


def _planned_files(
    target: ShardSet,
    draft: ShardSet,
    renamed: Sequence[tuple[TensorInfo, str]],
    edits: dict[str, KeyValue | None],
    finals: Sequence[Path],
    outtype: GGMLQuantizationType | None = None,
    imatrix: ImportanceMatrix | None = None,
) -> list[PlannedFile]:
    """One output per target file: its header edited, its data copied, the draft's tensors after the last one's."""
    draft_header = draft.first
    last = len(target.headers) - 1
    files: list[PlannedFile] = []
    for index, (header, final) in enumerate(zip(target.headers, finals)):
        file_edits = dict(edits) if index == 0 else {}
        if KEY_SPLIT_TENSORS_COUNT in header.kvs:
            total = header.kvs[KEY_SPLIT_TENSORS_COUNT].value + len(renamed)
            file_edits[KEY_SPLIT_TENSORS_COUNT] = with_int_value(header, KEY_SPLIT_TENSORS_COUNT, total)
        kvs, changes = apply_kv_edits(header, file_edits, final.name)

        tensors = list(header.tensors)
        data = _data_section(header)
        added: list[str] = []
        if index == last:
            # Offsets and padding of appended tensors use the alignment of the file they are written to.
            infos, segments, _ = _appended_layout(
                header.packed_data_size, header.alignment, renamed, draft_header, outtype, imatrix
            )
            tensors += infos
            data += segments
            added = [t.name for t in infos]
        # The set id (a placeholder until every header is known), then padding last (after every KV is
        # known) so the target's data keeps its offset mod 4 KiB (reflink).
        kvs = [*without_set_id(kvs), placeholder_kv()]
        head = congruent_header(header.version, kvs, tensors, header.alignment, data, Path(header.path))
        output = OutputFile(final, (Bytes(head), *data))
        files.append(PlannedFile(output, Path(header.path), tuple(tensors), tuple(changes), added_tensors=tuple(added)))
    heads = [f.output.segments[0] for f in files]
    stamped = stamp_set_id([h.data for h in heads if isinstance(h, Bytes)])
    return [
        replace(f, output=OutputFile(f.output.path, (Bytes(head), *f.output.segments[1:])))
        for f, head in zip(files, stamped)
    ]
