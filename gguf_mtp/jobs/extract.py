"""``extract``: the NextN (MTP) block(s) of a model -> a draft GGUF that ``compose`` accepts.

Which blocks are NextN blocks comes from the metadata alone, for every architecture: the last
``{arch}.nextn_predict_layers`` of the ``{arch}.block_count`` blocks. Their tensors keep their
``blk.N`` names and their bytes (copied by the kernel, never re-quantized).

Two kinds of output:

* a *draft* (default): the NextN block tensors plus the model KVs compose needs to extend a target
  (architecture, widths, vocabulary size, ``nextn_predict_layers``, every per-layer array with the
  NextN entries); the tokenizer is left out, so the file stays as small as the block.
* a *standalone* MTP-only model (``standalone=True``): additionally the source's ``token_embd``,
  ``output_norm`` and ``output`` and every model KV including the tokenizer -- the layout llama.cpp's
  converter writes with ``--mtp``. llama.cpp loads it as MTP-only because ``blk.0.attn_norm.weight`` is
  absent, so it serves as ``llama-server --spec-draft-model``. With ``embd_type`` its ``token_embd`` and
  ``output`` are written in that type (llama.cpp's maintainers recommend low-bit ones, e.g. Q4_0) as
  ``llama-quantize --token-embedding-type --output-tensor-type`` writes them.

A standalone file can also be completed from a *trunk* (``target``): a "shared" sidecar (unsloth's form: it
states ``{arch}.nextn_shared_target_tensors = true`` and leaves out the global tensors it borrows from its
target, which only unsloth's llama.cpp fork can lend) gets the trunk's ``token_embd``/``output_norm``/``output``
in their place, and the trunk's tokenizer; the key is left out, as upstream llama.cpp does not know it. The trunk
must be of the sidecar's model (architecture, width, vocabulary and token list, and as many trunk blocks as the
sidecar's first NextN block index), else it is refused in one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGMLQuantizationType, GGUFValueType

from gguf_mtp.check.draft_checks import target_fit_check
from gguf_mtp.constants import (
    BLOCK_TENSOR,
    DRAFT_GLOBAL_TENSORS,
    KEY_BLOCK_COUNT,
    KEY_NEXTN_PREDICT_LAYERS,
    KEY_NEXTN_SHARED_TARGET_TENSORS,
    KEY_TOKENS,
    KEY_VOCAB_SIZE,
)
from gguf_mtp.errors import BadGGUFError, IncompatibleDraftError, NoNextNBlockError, ParameterError
from gguf_mtp.files.plan import Bytes, CopyRange, OutputFile, Segment
from gguf_mtp.format.header import GGUFHeader, KeyValue, TensorInfo, encode_kv, parse_header
from gguf_mtp.format.imatrix import ImportanceMatrix
from gguf_mtp.format.layout import congruent_header, pack_tensors
from gguf_mtp.jobs.head_type import (
    HeadSummary,
    low_bit_warning,
    parse_imatrix,
    parse_outtype,
    retype_embedding_tensor,
    retype_head_tensor,
    summarize_head,
)
from gguf_mtp.jobs.runner import WriteReport, run_write
from gguf_mtp.model.arch_rules import is_trunk_only_key, sidecar_needs
from gguf_mtp.model.blocks import missing_nextn_tensors
from gguf_mtp.model.set_id import SET_ID_KEY
from gguf_mtp.model.shards import ShardSet, open_model
from gguf_mtp.text import human_bytes

__all__ = [
    "ExtractReport",
    "ExtractionPlan",
    "NextNBlocks",
    "extract",
    "find_nextn_blocks",
    "is_shared_sidecar",
    "plan_extraction",
]

#: Model KVs a (non-standalone) draft leaves out: the tokenizer (the composite keeps the target's) and
#: the split keys (a draft is one file).
_DRAFT_SKIPPED_PREFIXES = ("tokenizer.", "split.")
_STANDALONE_SKIPPED_PREFIXES = ("split.",)
#: Model KVs a completed sidecar takes from its trunk rather than from the shared sidecar.
_TRUNK_PREFIXES = ("tokenizer.",)
_TOKEN_EMBD = DRAFT_GLOBAL_TENSORS[0]


@dataclass(frozen=True)
class NextNBlocks:
    """Where a model's NextN blocks are: their indices and their tensors, shard by shard."""

    model: ShardSet
    first: int  # index of the first NextN block (= the trunk block count)
    count: int  # number of NextN blocks ({arch}.nextn_predict_layers)
    tensors: tuple[tuple[int, TensorInfo], ...]  # (shard index, tensor), in file order

    @property
    def indices(self) -> range:
        return range(self.first, self.first + self.count)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for _, t in self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for _, t in self.tensors)

    def describe(self) -> str:
        """``blk.88`` or ``blk.88..blk.89``."""
        return _blocks_text(self.first, self.count)


def _blocks_text(first: int, count: int) -> str:
    """``blk.88`` or ``blk.88..blk.89``."""
    return f"blk.{first}" if count == 1 else f"blk.{first}..blk.{first + count - 1}"


def _refuse_trunk_blocks_declared_nextn(
    model: ShardSet, first: int, count: int, tensors: Sequence[tuple[int, TensorInfo]]
) -> None:
    """A declared NextN block that holds tensors but not one ``nextn.*`` tensor is a trunk block: the
    ``nextn_predict_layers`` count over-claims, and treating the block as NextN would drop (strip) or take
    (extract) a trunk block. A declared block without any tensor is not this case (strip repairs it).

    Raises:
        BadGGUFError: one line naming the block and the key.
    """
    by_block: dict[int, list[str]] = {}
    for _, tensor in tensors:
        match = BLOCK_TENSOR.match(tensor.name)
        assert match
        by_block.setdefault(int(match["block"]), []).append(match["rest"])
    for block in sorted(by_block):
        rests = by_block[block]
        if not any(rest.startswith("nextn.") for rest in rests):
            key = model.arch_key(KEY_NEXTN_PREDICT_LAYERS)
            raise BadGGUFError(
                f"{key} = {count} declares NextN block(s) {_blocks_text(first, count)}, but blk.{block} "
                f"holds {len(rests)} tensor(s) and no nextn.* tensor: it is a trunk block ({key} over-claims)",
                model.name,
            )


def find_nextn_blocks(model: ShardSet, *, require_tensors: bool = True) -> NextNBlocks:
    """Locate the NextN blocks of ``model`` from ``{arch}.block_count`` and ``{arch}.nextn_predict_layers``.

    Args:
        model: the model's headers.
        require_tensors: refuse a NextN block the metadata declares but no tensor belongs to (a converter
            that dropped the tensors but kept the count; strip repairs such a model, extract cannot).

    Returns:
        The NextN blocks and their tensors.

    Raises:
        NoNextNBlockError: ``nextn_predict_layers`` is 0 or absent.
        BadGGUFError: a tensor belongs to a block at or beyond ``block_count``, a declared NextN block
            holds tensors but no ``nextn.*`` one (a trunk block: the count over-claims), or (with
            ``require_tensors``) a declared NextN block has no tensors or lacks one llama.cpp requires.
    """
    block_count, count = model.block_count, model.nextn_predict_layers
    first = block_count - count
    if count == 0:
        raise NoNextNBlockError(
            f"no NextN (MTP) block: {model.arch_key(KEY_NEXTN_PREDICT_LAYERS)} is "
            f"{'0' if model.kv(model.arch_key(KEY_NEXTN_PREDICT_LAYERS)) else 'absent'}",
            model.name,
        )
    tensors = _tensors_from_block(model, first)
    _refuse_trunk_blocks_declared_nextn(model, first, count, tensors)
    if require_tensors:
        _refuse_incomplete_blocks(model, first, count, tensors)
    return NextNBlocks(model, first, count, tuple(tensors))


def _tensors_from_block(model: ShardSet, first: int) -> list[tuple[int, TensorInfo]]:
    """The (shard, tensor) of every block tensor from ``blk.{first}`` on.

    Raises:
        BadGGUFError: a tensor of a block at or beyond ``block_count``.
    """
    block_count = model.block_count
    tensors: list[tuple[int, TensorInfo]] = []
    for shard, tensor in model.iter_tensors():
        match = BLOCK_TENSOR.match(tensor.name)
        block = int(match["block"]) if match else -1
        if block >= block_count:
            raise BadGGUFError(
                f"tensor {tensor.name!r} lies beyond {model.arch_key(KEY_BLOCK_COUNT)} = {block_count}",
                model.paths[shard],
            )
        if match and block >= first:
            tensors.append((shard, tensor))
    return tensors


def _refuse_incomplete_blocks(model: ShardSet, first: int, count: int, tensors: list[tuple[int, TensorInfo]]) -> None:
    """Every declared NextN block holds tensors, and every tensor llama.cpp requires of one.

    Raises:
        BadGGUFError: the first block without tensors, or the first that lacks one.
    """
    names = [t.name for _, t in tensors]
    seen = {int(match["block"]) for name in names if (match := BLOCK_TENSOR.match(name))}
    missing = [i for i in range(first, first + count) if i not in seen]
    if missing:
        raise BadGGUFError(
            f"{model.arch_key(KEY_NEXTN_PREDICT_LAYERS)} = {count} declares NextN block(s) "
            f"blk.{first}..blk.{first + count - 1}, but blk.{missing[0]} has no tensors",
            model.name,
        )
    for block in range(first, first + count):
        lacking = missing_nextn_tensors(names, model.arch, block)
        if lacking:
            # llama.cpp would load such a block and silently never use it.
            raise BadGGUFError(f"NextN block blk.{block} is incomplete: no {', '.join(lacking)}", model.name)


@dataclass(frozen=True)
class ExtractionPlan:
    """Everything an extract run will write: one file, its header, and where each tensor's bytes come from.

    ``header`` is the header of the draft exactly as it will be written (its ``path`` is the output
    path); ``output`` lays the file out as segments (the header bytes, then every tensor as a kernel
    copy of its source range, padded to the alignment).
    """

    source: ShardSet
    nextn: NextNBlocks
    standalone: bool
    header: GGUFHeader
    output: OutputFile
    left_out_kvs: tuple[str, ...]  # source KVs not carried
    added_kvs: tuple[str, ...]  # KVs the draft states that the source did not
    trunk: ShardSet | None = None  # the model a shared sidecar is completed from
    borrowed: tuple[str, ...] = ()  # global tensors taken from the trunk

    @property
    def path(self) -> Path:
        return self.output.path

    @property
    def global_tensors(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.header.tensors if t.name not in self.nextn.names)

    @property
    def head(self) -> HeadSummary:
        """The NextN block's types and size as written."""
        return summarize_head(t for t in self.header.tensors if t.name in self.nextn.names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": str(self.path),
            "standalone": self.standalone,
            "nextn_blocks": list(self.nextn.indices),
            "tensors": [
                {"name": t.name, "type": t.type_name, "shape": list(t.shape), "bytes": t.nbytes}
                for t in self.header.tensors
            ],
            "kvs": len(self.header.kvs),
            "left_out_kvs": list(self.left_out_kvs),
            "added_kvs": list(self.added_kvs),
            "trunk": [str(p) for p in self.trunk.paths] if self.trunk is not None else None,
            "from_trunk": list(self.borrowed),
            "bytes": self.output.size,
            "head": self.head.to_dict(),
        }


def _draft_kvs(
    source: ShardSet, standalone: bool, trunk: ShardSet | None = None
) -> tuple[list[KeyValue], list[str], list[str]]:
    """(KVs of the output, source keys left out, keys added). With a ``trunk``, the tokenizer is the trunk's."""
    skipped: tuple[str, ...] = _STANDALONE_SKIPPED_PREFIXES if standalone else _DRAFT_SKIPPED_PREFIXES
    if trunk is not None:
        skipped += _TRUNK_PREFIXES
    kvs, left_out = _carried_kvs(source, skipped, standalone)
    added = [] if trunk is None else [kv for kv in trunk.first.kvs.values() if kv.key.startswith(_TRUNK_PREFIXES)]
    vocab_size = None if standalone else _stated_vocab_size(source)
    if vocab_size is not None:
        added.append(vocab_size)
    return [*kvs, *added], left_out, [kv.key for kv in added]


def _carried_kvs(source: ShardSet, skipped: tuple[str, ...], standalone: bool) -> tuple[list[KeyValue], list[str]]:
    """(the source's KVs the output carries, the keys it leaves out)."""
    unknown_upstream = source.arch_key(KEY_NEXTN_SHARED_TARGET_TENSORS)  # the output borrows nothing
    kvs, left_out = [], []
    for key, kv in source.first.kvs.items():
        if key == SET_ID_KEY:  # the composite's set id (gguf_mtp.set_id): the draft is no shard of it
            continue
        if key.startswith(skipped) or key == unknown_upstream or (standalone and is_trunk_only_key(source.arch, key)):
            left_out.append(key)
        else:
            kvs.append(kv)
    return kvs, left_out


def _stated_vocab_size(source: ShardSet) -> KeyValue | None:
    """``{arch}.vocab_size`` from the token list, where the source states only the list: the tokenizer stays
    behind, so the draft states the vocabulary size compose compares with the target's."""
    vocab_key = source.arch_key(KEY_VOCAB_SIZE)
    tokens = source.kv(KEY_TOKENS)
    if source.kv(vocab_key) is not None or tokens is None:
        return None
    return encode_kv(vocab_key, GGUFValueType.UINT32, tokens.array_length)


def _layout(
    tensors: list[tuple[Path, int, TensorInfo]],
    alignment: int,
    retyped: frozenset[str] = frozenset(),
    outtype: GGMLQuantizationType | None = None,
    arch: str | None = None,
    embd_type: GGMLQuantizationType | None = None,
    imatrix: ImportanceMatrix | None = None,
) -> tuple[list[TensorInfo], list[Segment]]:
    """Place tensors densely in order, each at ``alignment`` (as llama.cpp reads them): (infos, data segments).
    Tensors named in ``retyped`` take ``outtype`` as llama-quantize --pure gives it, ``token_embd``/``output``
    take ``embd_type``; the rest are copied. ``imatrix``: the statistics ``outtype`` quantizes with."""

    def placed(path: Path, offset: int, tensor: TensorInfo) -> tuple[TensorInfo, tuple[Segment, ...]]:
        if tensor.name in retyped and outtype is not None:
            return retype_head_tensor(tensor, path, offset + tensor.offset, outtype, arch, imatrix)
        embedding = retype_embedding_tensor(tensor, path, offset + tensor.offset, embd_type)
        if embedding is not None:
            return embedding
        return tensor, (CopyRange(path, offset + tensor.offset, tensor.nbytes),)

    infos, segments, _ = pack_tensors((placed(*item) for item in tensors), alignment)
    return infos, segments


def is_shared_sidecar(model: ShardSet) -> bool:
    """Whether ``model`` says it borrows its target's global tensors (``{arch}.nextn_shared_target_tensors``)."""
    return model.get(model.arch_key(KEY_NEXTN_SHARED_TARGET_TENSORS)) is True


def _refuse_another_models_trunk(source: ShardSet, nextn: NextNBlocks, trunk: ShardSet) -> None:
    """A trunk must be of the source's model: the same architecture, width, vocabulary and token list
    (:func:`target_fit_check`), and as many trunk blocks as the index of the first NextN block.

    Raises:
        IncompatibleDraftError: one line naming the trunk and every difference.
    """
    problems, _ = target_fit_check(trunk, source.first, source.headers)
    trunk_blocks = trunk.block_count - trunk.nextn_predict_layers
    if not problems and trunk_blocks != nextn.first:
        problems.append(f"the trunk has {trunk_blocks} blocks, the head is {nextn.describe()} "
                        f"(the head of a {nextn.first}-block trunk)")
    if problems:
        raise IncompatibleDraftError(f"not a trunk of {source.name}'s model: {'; '.join(problems)}", trunk.name)


def _standalone_globals(source: ShardSet, trunk: ShardSet | None) -> tuple[list[str], list[str]]:
    """(the source's own global tensors, those the ``trunk`` supplies): a global tensor the source lacks is the
    trunk's, where it has one.

    Raises:
        BadGGUFError: neither has ``token_embd`` / ``output_norm`` (llama.cpp cannot load a sidecar without them;
            :func:`~gguf_mtp.model.arch_rules.sidecar_needs`).
    """
    own = _globals_in(source)
    lent = [] if trunk is None else [name for name in _globals_in(trunk) if name not in own]
    missing = [needed for needed in sidecar_needs(source.arch) if needed not in own and needed not in lent]
    if missing:
        raise _missing_global(source, missing[0], lent_by_trunk=trunk is not None)
    return own, lent


def _globals_in(model: ShardSet) -> list[str]:
    """The draft's global tensors ``model`` has, in their order."""
    return [name for name in DRAFT_GLOBAL_TENSORS if name in model.tensor_locations]


def _missing_global(source: ShardSet, needed: str, *, lent_by_trunk: bool) -> BadGGUFError:
    """The error for a standalone file without a global tensor llama.cpp needs: a shared sidecar is told where to
    get it."""
    if not lent_by_trunk and is_shared_sidecar(source):
        return BadGGUFError(
            f"no {needed}: a shared sidecar ({source.arch_key(KEY_NEXTN_SHARED_TARGET_TENSORS)} = true) "
            "borrows it from the model it serves: give that model as target to copy it in",
            source.name,
            parameter="target",
        )
    return BadGGUFError(f"no {needed}: cannot write a standalone MTP model without it", source.name)


def plan_extraction(
    source: ShardSet,
    output: str | os.PathLike[str],
    *,
    standalone: bool = False,
    outtype: str | GGMLQuantizationType | None = None,
    embd_type: str | GGMLQuantizationType | None = None,
    trunk: ShardSet | None = None,
    imatrix: str | os.PathLike[str] | ImportanceMatrix | None = None,
) -> ExtractionPlan:
    """Plan the extraction of ``source``'s NextN block(s) into ``output`` (pure: reads no tensor data).

    Args:
        source: a model with NextN blocks (one file or a split set).
        output: path of the draft file to write.
        standalone: also carry ``token_embd`` / ``output_norm`` / ``output`` and every model KV
            (tokenizer included): an MTP-only model llama.cpp loads on its own.
        outtype: the NextN tensors' type (see :mod:`gguf_mtp.jobs.head_type`); ``None`` copies them as they are.
        embd_type: with ``standalone``, the type of ``token_embd`` and ``output``, as ``llama-quantize
            --token-embedding-type --output-tensor-type`` writes them; ``None`` copies them.
        trunk: with ``standalone``, the model the sidecar serves: it must be of the source's model, and it lends
            the global tensors the source lacks (a shared sidecar's) and its tokenizer.
        imatrix: an importance matrix file (llama-imatrix's GGUF) the NextN tensors are quantized with, as
            ``llama-quantize --imatrix`` does; it lets ``outtype`` be a type that needs one (``iq2_xxs``...).

    Returns:
        The :class:`ExtractionPlan`.

    Raises:
        NoNextNBlockError: the source has no NextN block.
        BadGGUFError: its metadata and tensors disagree (see :func:`find_nextn_blocks`), or a
            standalone file is asked for and the source has no ``token_embd`` / ``output_norm``.
        ParameterError: ``outtype`` or ``embd_type`` is not a head type, or ``embd_type`` or ``trunk`` without
            ``standalone``.
        IncompatibleDraftError: ``trunk`` is of another model.
    """
    head_type = parse_outtype(outtype, imatrix=imatrix is not None)
    embedding_type = _standalone_choices(embd_type, trunk, standalone)
    nextn = find_nextn_blocks(source)
    matrix = parse_imatrix(imatrix, head_type)
    if trunk is not None:
        _refuse_another_models_trunk(source, nextn, trunk)
    own, lent = _standalone_globals(source, trunk) if standalone else ([], [])
    picked = _picked_tensors(source, {*nextn.names, *own}, trunk, lent)
    alignment = source.first.alignment
    infos, segments = _layout(picked, alignment, nextn.names, head_type, source.arch, embedding_type, matrix)
    kvs, left_out, added = _draft_kvs(source, standalone, trunk)
    # The NextN data keeps its offset mod 4 KiB, so a reflink filesystem can share it (gguf_mtp.format.layout).
    head = congruent_header(source.first.version, kvs, infos, alignment, segments)
    path = Path(output)
    # Read back what will be written with the strict parser: the plan's header is the file's own.
    header = parse_header(
        lambda offset, size: head[offset : offset + size], len(head) + sum(s.nbytes for s in segments), str(path)
    )
    return ExtractionPlan(
        source=source,
        nextn=nextn,
        standalone=standalone,
        header=header,
        output=OutputFile(path, (Bytes(head), *segments)),
        left_out_kvs=tuple(left_out),
        added_kvs=tuple(added),
        trunk=trunk,
        borrowed=tuple(lent),
    )


def _standalone_choices(
    embd_type: str | GGMLQuantizationType | None, trunk: ShardSet | None, standalone: bool
) -> GGMLQuantizationType | None:
    """The embedding type asked for; it and a trunk are choices of a standalone file only.

    Raises:
        ParameterError: ``embd_type`` or ``trunk`` without ``standalone``, or ``embd_type`` not a head type.
    """
    embedding_type = parse_outtype(embd_type, "embd_type")
    if embedding_type is not None and not standalone:
        raise ParameterError("embd_type needs standalone: a draft carries no token_embd or output",
                             parameter=("embd_type", "standalone"))
    if trunk is not None and not standalone:
        raise ParameterError("target needs standalone: a draft takes its target's tensors inside the composite",
                             parameter=("target", "standalone"))
    return embedding_type


def _picked_tensors(
    source: ShardSet, wanted: set[str], trunk: ShardSet | None, lent: list[str]
) -> list[tuple[Path, int, TensorInfo]]:
    """(file, data offset, tensor) of every tensor written: the ``wanted`` ones of ``source`` in its order, and those
    the ``trunk`` lends: ``token_embd`` first and the output tensors last, in the order llama.cpp's ``--mtp`` export
    writes them."""
    picked = [
        (source.paths[shard], source.headers[shard].data_offset, tensor)
        for shard, tensor in source.iter_tensors()
        if tensor.name in wanted
    ]
    if trunk is None:
        return picked
    from_trunk = [(trunk.paths[shard], trunk.headers[shard].data_offset, tensor)
                  for shard, tensor in (trunk.tensor_locations[name] for name in lent)]
    return ([t for t in from_trunk if t[2].name == _TOKEN_EMBD] + picked
            + [t for t in from_trunk if t[2].name != _TOKEN_EMBD])


@dataclass(kw_only=True)
class ExtractReport(WriteReport):
    """What an extract run did (or, with ``dry_run``, would do)."""

    plan: ExtractionPlan

    @property
    def output(self) -> Path:
        return self.plan.path

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        plan = self.plan
        return {
            "command": "extract",
            "dry_run": self.dry_run,
            "source": [str(p) for p in plan.source.paths],
            "architecture": plan.source.arch,
            **plan.to_dict(),
            "bytes_to_write": plan.output.size,
            **self.write_fields(),
        }

    def plan_lines(self) -> list[str]:
        """The plan: the NextN block(s) found and the file to write (shown before writing starts)."""
        plan = self.plan
        kind = "standalone MTP-only model" if plan.standalone else "draft"
        lines = [
            f"source: {plan.source.arch}, {len(plan.source.headers)} file(s), NextN block(s) {plan.nextn.describe()} "
            f"({len(plan.nextn.tensors)} tensors)",
            f"{self.action(plan.path)} {kind} {plan.path} ({human_bytes(plan.output.size)}, "
            f"{len(plan.header.tensors)} tensors, {len(plan.header.kvs)} KVs)",
        ]
        lines.append(f"    NextN block: {plan.head.describe()}")
        lines.extend(f"    with {line}" for line in _global_tensor_lines(plan))
        lines.extend(f"    note: {n}" for n in self.notes)
        return lines


def _global_tensor_lines(plan: ExtractionPlan) -> list[str]:
    """A standalone file's tensors outside the NextN block(s), the source's own then the trunk's: copied, then those
    ``embd_type`` re-typed on the way (new bytes, not the original's: each says the type it was re-typed from)."""
    lines: list[str] = []
    for whose, model in (("source", plan.source), ("trunk", plan.trunk)):
        names = [name for name in plan.global_tensors if (name in plan.borrowed) == (whose == "trunk")]
        if model is not None and names:
            lines += _globals_of(whose, model, names, plan.header.tensor_by_name)
    return lines


def _globals_of(whose: str, model: ShardSet, names: list[str], written: Mapping[str, TensorInfo]) -> list[str]:
    """The lines of the global tensors ``names`` taken from ``model`` (``whose``: "source" or "trunk"): those copied,
    then those re-typed."""
    original = {name: model.tensor_locations[name][1].type_name for name in names}

    def shown(name: str, note: str = "") -> str:
        return f"{name} ({written[name].type_name}, {human_bytes(written[name].nbytes)}{note})"

    copied = [name for name in names if written[name].type_name == original[name]]
    retyped = [name for name in names if name not in copied]
    lines = [f"the {whose}'s {', '.join(shown(name) for name in copied)}"] if copied else []
    if retyped:
        lines.append(", ".join(shown(name, f", re-typed from the {whose}'s {original[name]}") for name in retyped))
    return lines


def _notes(plan: ExtractionPlan) -> Iterator[str]:
    """What the plan left out, took from the trunk, or added: the tokenizer's and the shared sidecar's keys."""
    yield from _left_out_notes(plan)
    if plan.trunk is not None:
        taken = [key for key in plan.added_kvs if key.startswith(_TRUNK_PREFIXES)]
        yield f"the tokenizer is the trunk's ({len(taken)} KV{'s' * (len(taken) != 1)}, from {plan.trunk.name})"
    for key in plan.added_kvs:
        if not key.startswith(_TRUNK_PREFIXES):
            yield f"added {key} = {plan.header.get(key)} (the size of the source's token list)"


def _left_out_notes(plan: ExtractionPlan) -> Iterator[str]:
    skipped_tokenizer = [k for k in plan.left_out_kvs if k.startswith("tokenizer.")]
    if skipped_tokenizer and not plan.standalone:
        yield (
            f"left out the tokenizer ({len(skipped_tokenizer)} KV{'s' * (len(skipped_tokenizer) != 1)}): "
            "a composite keeps its target's; "
            "use --standalone for a file llama.cpp loads on its own"
        )
    shared_key = plan.source.arch_key(KEY_NEXTN_SHARED_TARGET_TENSORS)
    if shared_key in plan.left_out_kvs:
        yield f"left out {shared_key}: upstream llama.cpp does not know it, and the file now carries what it borrowed"


def extract(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    standalone: bool = False,
    outtype: str | None = None,
    embd_type: str | None = None,
    target: str | os.PathLike[str] | None = None,
    imatrix: str | os.PathLike[str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: bool = True,
    on_plan: Callable[[WriteReport], None] | None = None,
) -> ExtractReport:
    """Write the NextN (MTP) block(s) of ``source`` to ``output``, byte for byte.

    Args:
        source: a GGUF with NextN blocks: one file or any shard of a ``<prefix>-NNNNN-of-NNNNN.gguf`` set.
        output: the draft file to write (``compose`` accepts it as its DRAFT).
        standalone: write an MTP-only model llama.cpp loads by itself (``llama-server --spec-draft-model``):
            the block plus ``token_embd`` / ``output_norm`` / ``output`` and every model KV.
        outtype: write the NextN tensors in this type (``q8_0``, ``q4_k``...), exactly as ``llama-quantize --pure``
            would; ``None`` copies them byte for byte. Other tensors are always copied.
        embd_type: with ``standalone``, write ``token_embd`` and ``output`` in this type (``q4_0``: what
            llama.cpp's maintainers recommend for a sidecar) exactly as ``llama-quantize --token-embedding-type
            --output-tensor-type`` would; ``None`` copies them.
        target: with ``standalone``, the trunk the sidecar serves (one file or any shard of a set): it must be of
            the source's model; a shared sidecar (``{arch}.nextn_shared_target_tensors``) gets its
            ``token_embd`` / ``output_norm`` / ``output`` and tokenizer, so upstream llama.cpp loads the result.
        imatrix: an importance matrix file (llama-imatrix's GGUF) the NextN tensors are quantized with, as
            ``llama-quantize --imatrix`` does; it lets ``outtype`` be a type that needs one (``iq2_xxs``...).
        force: replace an existing output (never an input).
        dry_run: plan and check only (every refusal a real run would make is made); write nothing.
        progress: show a progress bar on stderr when it is a terminal.
        on_plan: called with the report once the output passed its checks, before the first byte is
            written (the CLI prints the plan there).

    Returns:
        An :class:`ExtractReport`.

    Raises:
        NoNextNBlockError: the source has no NextN block.
        IncompatibleDraftError: ``target`` is a trunk of another model.
        BadGGUFError, ShardSetError: the source or the target is malformed or incomplete.
        UnsafeOutputError: the output is an input, exists (without ``force``) or cannot be written.
        OutputWriteError: writing failed; nothing was left behind.

    Example:
        >>> extract("Model-Q8_0-00001-of-00003.gguf", "mtp-Model-Q8_0.gguf")  # doctest: +SKIP
    """

    def prepare() -> tuple[ExtractReport, list[OutputFile], list[Path]]:
        model = open_model(source)
        trunk = open_model(target) if target is not None else None
        plan = plan_extraction(model, output, standalone=standalone, outtype=outtype, embd_type=embd_type,
                               trunk=trunk, imatrix=imatrix)
        warning = low_bit_warning(parse_outtype(outtype, imatrix=imatrix is not None))
        report = ExtractReport(plan=plan, dry_run=dry_run, notes=[*([warning] if warning else []), *_notes(plan)])
        return report, [plan.output], [*model.paths, *(trunk.paths if trunk is not None else ())]

    return run_write(prepare, desc="extract", force=force, progress=progress, on_plan=on_plan)
