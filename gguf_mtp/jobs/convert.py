"""``convert``: an MTP head checkpoint (safetensors) -> a GGUF draft that compose and llama.cpp accept.

The data path: resolve SOURCE (a local folder, or a Hub repo of which only the MTP shards are
downloaded) -> read ``config.json`` and the safetensors headers -> pick the family converter from
:mod:`conversion` -> **plan** (pure: the tensors with their GGUF names, shapes, types and sources,
the metadata, the exact header bytes, the output as segments; ``--dry-run`` prints it) -> **write**
through :func:`gguf_mtp.write.write_outputs` (atomic; unchanged bytes copied by the kernel,
converted ones streamed a bounded chunk at a time, experts one after the other).

Two outputs are possible:

* a *draft* (default): the head as its block ``blk.N`` (a head of ``k`` NextN blocks: ``blk.N .. N+k-1``) plus
  the hyperparameters it implies and per-layer arrays of ``N + k`` entries, for
  :func:`gguf_mtp.jobs.compose.compose`;
* a *standalone* MTP-only model (``standalone=True``, for ``llama-server --spec-draft-model``): the
  same block(s) plus ``token_embd``, ``output_norm`` and ``output`` copied byte for byte from the target,
  and the target's metadata (tokenizer included) with ``block_count``, ``nextn_predict_layers`` and
  the per-layer arrays extended. llama.cpp sees no ``blk.0.attn_norm`` and loads it as MTP-only. With
  ``embd_type``, ``token_embd`` and ``output`` are re-typed as ``llama-quantize --token-embedding-type
  --output-tensor-type`` would (the low-bit sidecar llama.cpp's maintainers recommend).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gguf import GGUF_VERSION, GGMLQuantizationType, GGUFValueType

from gguf_mtp.constants import KEY_BLOCK_COUNT, KEY_NEXTN_PREDICT_LAYERS
from gguf_mtp.conversion import HeadGGUFWriter, HeadModel, MappedTensor, model_class_for_config, tensor_segments
from gguf_mtp.conversion.base import CONVERTER_TYPES, FILE_TYPES, arch_name
from gguf_mtp.conversion.fp8 import FP8_DTYPES, BlockScaledTensor
from gguf_mtp.conversion.hparams import LLAMA_MAX_LAYERS
from gguf_mtp.conversion.tensors import FLOAT_DTYPES
from gguf_mtp.errors import (
    BadGGUFError,
    CheckpointError,
    CheckpointNotFoundError,
    IncompatibleDraftError,
    ParameterError,
)
from gguf_mtp.files.kernel_copy import SHARE_BLOCK
from gguf_mtp.files.plan import Bytes, CopyRange, OutputFile, Segment
from gguf_mtp.files.scratch import existing_ancestor, scratch_folder
from gguf_mtp.format.header import (
    KeyValue,
    TensorInfo,
    encode_kv,
    parse_header,
)
from gguf_mtp.format.imatrix import ImportanceMatrix
from gguf_mtp.format.kv_edit import INT_RANGES, check_int
from gguf_mtp.format.layout import appended_data_residue, header_at_residue, pack_tensors
from gguf_mtp.format.safetensors_io import Checkpoint, NamePrefix, open_checkpoint, read_config
from gguf_mtp.hub.checkpoint import HubCheckpoint, download_head, is_repo_id
from gguf_mtp.jobs.head_type import (
    head_importance,
    head_notes,
    parse_imatrix,
    parse_outtype,
    retype_embedding_tensor,
    summarize_head,
)
from gguf_mtp.jobs.runner import WriteReport, run_write
from gguf_mtp.model.arch_rules import is_trunk_only_key, nextn_graph_note, sidecar_globals, sidecar_needs
from gguf_mtp.model.shards import ShardSet, open_model
from gguf_mtp.text import human_bytes, short

__all__ = [
    "ConversionPlan", "ConversionRequest", "ConvertReport", "PlannedTensor", "convert", "draft_size_bound",
    "plan_conversion", "resolve_source",
]

logger = logging.getLogger(__name__)

#: Key prefixes a standalone draft does not take over from the target (it is one file, not a split).
_NOT_COPIED = ("split.",)

#: The largest NextN block index: the draft has index + 1 layers, and llama.cpp loads at most
#: LLAMA_MAX_LAYERS. It also bounds the per-layer arrays the draft carries.
MAX_BLOCK_INDEX = LLAMA_MAX_LAYERS - 1


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the output: where it comes from and how its bytes are made."""

    name: str
    shape: tuple[int, ...]  # ggml order
    type_name: str
    nbytes: int
    offset: int  # data-relative
    sources: tuple[str, ...]  # checkpoint tensor names, or the target tensor's name
    source_dtype: str  # safetensors dtype, or the target tensor's ggml type
    how: str  # "copy", "convert BF16->F32", "quantize BF16->Q8_0", "copy from target", with "stack N experts"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "shape": list(self.shape), "type": self.type_name, "bytes": self.nbytes,
            "offset": self.offset, "sources": list(self.sources), "source_dtype": self.source_dtype, "how": self.how,
        }


@dataclass(frozen=True)
class ConversionPlan:
    """Everything a convert run will write (pure data; nothing is read beyond headers)."""

    source: str
    checkpoint: Checkpoint
    hf_architecture: str
    arch: str
    block: int  # the first NextN block's index
    standalone: bool
    outtype: str  # "bf16", "q8_0", ... or "source"
    output: OutputFile
    tensors: tuple[PlannedTensor, ...]
    kvs: tuple[KeyValue, ...]
    target: ShardSet | None = None
    notes: tuple[str, ...] = ()
    nextn_blocks: int = 1  # how many NextN blocks, blk.{block} .. blk.{block + nextn_blocks - 1}

    @property
    def path(self) -> Path:
        return self.output.path

    @property
    def blocks_text(self) -> str:
        """``NextN block blk.45`` or ``3 NextN blocks blk.45-47``."""
        if self.nextn_blocks == 1:
            return f"NextN block blk.{self.block}"
        return f"{self.nextn_blocks} NextN blocks blk.{self.block}-{self.block + self.nextn_blocks - 1}"

    @property
    def bytes_to_write(self) -> int:
        return self.output.size

    @property
    def inputs(self) -> list[Path]:
        """Every input file (never to be written over)."""
        paths = [*self.checkpoint.files, self.checkpoint.folder / "config.json"]
        if self.checkpoint.index is not None:
            paths.append(self.checkpoint.index)
        if self.target is not None:
            paths += self.target.paths
        return paths


def _how(tensor: MappedTensor) -> str:
    source = tensor.source
    same = FLOAT_DTYPES.get(source.dtype) == tensor.ggml_type and not any(p.transformed for p in source.parts)
    if same:
        how = "copy"
    elif source.dtype in FP8_DTYPES or isinstance(source.parts[0], BlockScaledTensor):
        how = f"dequantize {source.dtype}->{tensor.ggml_type.name}"
    elif tensor.ggml_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        how = f"convert {source.dtype}->{tensor.ggml_type.name}"
    else:
        how = f"quantize {source.dtype}->{tensor.ggml_type.name}"
    if tensor.rounded_to is not None:  # the converter's default type first, as llama-quantize would read it
        how = f"{how} via {tensor.rounded_to.name}"
    if len(source.parts) > 1:
        how = f"stack {len(source.parts)} experts, {how}"
    return how


def _block_index(target: ShardSet | None, block: int | None, standalone: bool, default: int | None = None) -> int:
    if standalone and target is None:
        raise ParameterError(
            "standalone needs target: an MTP-only model takes token_embd, output_norm, output and the "
            "tokenizer from the target"
        )
    if target is None:
        return _given_block_index(default if block is None else block)
    return _target_block_index(target, block, standalone)


def _given_block_index(block: int | None) -> int:
    """The NextN block index given without a target (or the family's default), within llama.cpp's layers."""
    if block is None:
        raise ParameterError(
            "the NextN block index is unknown: give target (the model the head belongs to; its trunk block "
            "count is the index) or block"
        )
    if block < 0:
        raise ParameterError(f"block {block}: a block index cannot be negative")
    if block > MAX_BLOCK_INDEX:
        raise ParameterError(
            f"block {block:,}: at most {MAX_BLOCK_INDEX} (the draft would have {block + 1:,} layers; llama.cpp "
            f"loads at most {LLAMA_MAX_LAYERS}, LLAMA_MAX_LAYERS)"
        )
    return block


def _target_block_index(target: ShardSet, block: int | None, standalone: bool) -> int:
    """The NextN block index a target implies: its trunk block count (which ``block``, if given, must equal)."""
    if target.nextn_predict_layers:
        raise IncompatibleDraftError(
            f"target already has {target.nextn_predict_layers} NextN block(s) "
            f"({target.arch_key(KEY_NEXTN_PREDICT_LAYERS)}); {_replacing_a_head(target.trunk_block_count, standalone)}",
            target.name,
        )
    trunk = target.trunk_block_count
    if not 0 <= trunk <= MAX_BLOCK_INDEX:
        # The per-layer arrays of the draft get trunk + 1 entries: bounded before they are built.
        raise IncompatibleDraftError(
            f"{target.arch_key(KEY_BLOCK_COUNT)} = {trunk:,}: a head can follow at most {MAX_BLOCK_INDEX} trunk blocks "
            f"(llama.cpp loads at most {LLAMA_MAX_LAYERS} layers)",
            target.name,
        )
    if block is not None and block != trunk:
        raise IncompatibleDraftError(
            f"block {block}: the NextN block follows the trunk, so for this target it is {trunk} "
            f"({target.arch_key(KEY_BLOCK_COUNT)})",
            target.name,
        )
    return trunk


def _replacing_a_head(trunk: int, standalone: bool) -> str:
    """How to convert a head for a model that carries one already (a weak one, often: docs/commands.md,
    --replace-head)."""
    if standalone:
        # A standalone file takes its embeddings and tokenizer from target, so target stays: without its head.
        return "to convert another head as a standalone file, give a copy without it as target (gguf-mtp strip)"
    return (f"to replace it, convert with block {trunk} instead of target and splice the draft in with "
            "replace_head (gguf-mtp compose --replace-head)")


def _outtype(outtype: str | GGMLQuantizationType | None, imatrix: bool = False) -> GGMLQuantizationType | None:
    if outtype is None or isinstance(outtype, GGMLQuantizationType):
        return outtype
    if outtype.lower() in ("source", "auto"):
        return None
    return parse_outtype(outtype, imatrix=imatrix)


def _default_outtype(model: HeadModel, head: list[MappedTensor]) -> str:
    """How matrices are written when no outtype is asked for: the source dtype, FP8 as llama.cpp's auto type."""
    if any(t.source.dtype in FP8_DTYPES for t in head):
        return f"source, FP8 as {model.auto_outtype.name.lower()}"
    return "source"


def _draft_kvs(model: HeadModel, writer: HeadGGUFWriter, block: int, target: ShardSet | None,
               matrix_types: set[GGMLQuantizationType], name: str,
               wanted: GGMLQuantizationType | None = None) -> None:
    """The metadata of a draft: what the head implies, its per-layer arrays, the file type."""
    writer.add_name(name)
    with model.writing_config_values():
        model.set_gguf_parameters(writer, block + model.n_nextn)
        for suffix, (etype, values) in model.layer_arrays(block, target).items():
            writer.add_key_value(f"{model.arch}.{suffix}", values, GGUFValueType.ARRAY, etype)
    if wanted is not None and wanted not in CONVERTER_TYPES:  # llama-quantize's ftype (Q4_K -> Q4_K_M)
        writer.add_file_type(FILE_TYPES[wanted])
    elif len(matrix_types) == 1:
        writer.add_file_type(FILE_TYPES[next(iter(matrix_types))])


def _standalone_kvs(model: HeadModel, writer: HeadGGUFWriter, block: int, target: ShardSet) -> None:
    """The target's metadata in its own order and encodings, grown by the head's NextN blocks."""
    arch = model.arch
    count_key, nextn_key = KEY_BLOCK_COUNT.format(arch=arch), KEY_NEXTN_PREDICT_LAYERS.format(arch=arch)
    arrays = model.layer_arrays(block, target)
    writer.clear_kvs()
    for key, kv in target.first.kvs.items():
        if key.startswith(_NOT_COPIED) or is_trunk_only_key(arch, key):
            continue
        suffix = key[len(arch) + 1 :] if key.startswith(f"{arch}.") else None
        if key == count_key:
            writer.add_copied_kv(_grown_block_count(kv, block + model.n_nextn, target.name))
        elif suffix in arrays and kv.is_array:
            etype, values = arrays[suffix]
            with model.writing_config_values():
                writer.add_key_value(key, values, GGUFValueType.ARRAY, etype)
        else:
            writer.add_copied_kv(kv)
    writer.add_copied_kv(_nextn_count(target.first.kvs.get(nextn_key), nextn_key, model.n_nextn))


def _grown_block_count(kv: KeyValue, count: int, name: str) -> KeyValue:
    """The target's ``block_count`` KV with the head's blocks added, in the target's own integer type."""
    if kv.vtype not in INT_RANGES:
        raise BadGGUFError(f"{kv.key} has type {kv.type_name}, not an integer type", name)
    return encode_kv(kv.key, kv.vtype, check_int(count, kv.vtype, f"{name}: {kv.key}"))


def _nextn_count(kv: KeyValue | None, key: str, count: int) -> KeyValue:
    """``nextn_predict_layers`` = ``count``: in the target's integer type where it has the key, else UINT32."""
    vtype = kv.vtype if kv is not None and kv.vtype in INT_RANGES else GGUFValueType.UINT32
    return encode_kv(key, vtype, count)


@dataclass(frozen=True)
class _OutputTensor:
    """One tensor to lay out: what the header says about it, and how its bytes are made."""

    name: str
    shape: tuple[int, ...]  # ggml order
    ggml_type: int
    nbytes: int
    segments: tuple[Segment, ...]
    sources: tuple[str, ...]
    source_dtype: str
    how: str


def _head_item(tensor: MappedTensor, imatrix: ImportanceMatrix | None = None) -> _OutputTensor:
    # Only llama-quantize's half takes an imatrix, and only for a tensor it re-types (it copies the others).
    requantized = tensor.via is not None and tensor.ggml_type != tensor.via
    importance = head_importance(imatrix, tensor.name, tensor.source.ggml_shape, tensor.ggml_type) if requantized \
        else None
    return _OutputTensor(tensor.name, tensor.source.ggml_shape, tensor.ggml_type, tensor.nbytes,
                         tuple(tensor_segments(tensor, importance=importance)), tensor.source.names,
                         tensor.source.dtype, _how(tensor))


def _target_globals(target: ShardSet, embd_type: GGMLQuantizationType | None = None) -> list[_OutputTensor]:
    """``token_embd``, ``output_norm`` (where the architecture has one) and ``output`` of the target, as byte-for-byte
    copies (with ``embd_type``, ``token_embd`` and ``output`` as llama-quantize --token-embedding-type
    --output-tensor-type writes them)."""
    items = []
    needed = sidecar_needs(target.arch)
    for name in sidecar_globals(target.arch):
        if name not in target.tensor_locations:
            if name in needed:
                raise IncompatibleDraftError(f"the target has no {name}; a standalone draft needs it", target.name)
            continue  # a tied output: llama.cpp falls back to token_embd
        shard, info = target.tensor_locations[name]
        header = target.headers[shard]
        offset = header.data_offset + info.offset
        retyped = retype_embedding_tensor(info, header.path, offset, embd_type)
        if retyped is not None and retyped[0].ggml_type != info.ggml_type:
            new, data = retyped
            items.append(_OutputTensor(name, new.shape, new.ggml_type, new.nbytes, data, (name,), info.type_name,
                                       f"quantize {info.type_name}->{new.type_name} from target"))
            continue
        copy = CopyRange(Path(header.path), offset, info.nbytes)
        items.append(_OutputTensor(name, info.shape, info.ggml_type, info.nbytes, (copy,), (name,), info.type_name,
                                   "copy from target"))
    return items


def _layout(writer: HeadGGUFWriter, items: list[_OutputTensor], path: Path, residue: int | None = None
            ) -> tuple[bytes, list[Segment], list[PlannedTensor], list[KeyValue]]:
    """Lay ``items`` out as llama.cpp's converter does (each tensor at the previous end, padded to the
    alignment), serialize the header with the codec, and plan the data after it: (header, data
    segments, tensors, KVs). ``residue``: where the data section must start modulo 4 KiB
    (:func:`~gguf_mtp.format.layout.header_at_residue`; ``None``: no padding)."""
    alignment = writer.alignment
    tables = ((TensorInfo(item.name, item.shape, item.ggml_type, 0, item.nbytes), item.segments) for item in items)
    infos, segments, position = pack_tensors(tables, alignment)
    kvs = writer.kvs
    header = header_at_residue(GGUF_VERSION, kvs, infos, alignment, residue)
    # Read the header back with the strict parser: what llama.cpp would refuse (a name too long, a
    # duplicate) is refused here, before anything is written.
    parsed = parse_header(lambda offset, n: header[offset : offset + n], len(header) + position, os.fspath(path))
    if parsed.data_offset != len(header) or parsed.tensors != tuple(infos):
        raise AssertionError("the serialized header does not read back as planned")
    planned = [PlannedTensor(item.name, info.shape, info.type_name, info.nbytes, info.offset, item.sources,
                             item.source_dtype, item.how) for item, info in zip(items, parsed.tensors, strict=True)]
    return header, segments, planned, kvs


@dataclass(frozen=True)
class ConversionRequest:
    """What a conversion is asked to make of a checkpoint's head: the choices that shape its plan, each documented
    here once (:func:`convert` takes them as keyword arguments of the same names, ``target`` as a path).

    Attributes:
        output: the GGUF file to write.
        source: how the user named the checkpoint (for reports; default: the checkpoint folder's name).
        target: the model the head belongs to: its trunk block count is the NextN block index, it is checked
            against the head (architecture and hyperparameters), and it provides the globals and metadata of a
            standalone draft.
        block: the NextN block index, when there is no ``target`` (with one, it must equal the target's trunk
            block count).
        outtype: the matrices' type: ``"bf16"``, ``"f16"``, ``"f32"`` or ``"q8_0"`` as llama.cpp's converter writes
            them (norms, biases and the router stay F32), or another of llama-quantize's uniform types (``"q6_k"``,
            ``"q4_k"``, ``"iq4_xs"``...) as ``llama-quantize --pure`` writes the converted head; ``None`` keeps the
            source dtype (BF16 for NVIDIA's head), bytes copied unchanged.
        standalone: an MTP-only model llama.cpp loads by itself (``--spec-draft-model``), with
            ``token_embd``/``output_norm``/``output`` and metadata copied from ``target`` (required).
        embd_type: with ``standalone``, the type of ``token_embd`` and ``output`` (``q4_0``, as llama.cpp's
            maintainers recommend for sidecars), exactly as ``llama-quantize --token-embedding-type
            --output-tensor-type`` writes the target's; ``None`` copies them.
        drop_nextn_copies: leave out the head's own copies of the embedding and LM head (GLM-4.5 ships them in its
            NextN layer, about 1.5 GB each; llama.cpp falls back to the trunk's).
        nextn_blocks: only the first this many NextN blocks of a head that has several (default: every block;
            llama.cpp's single-block MTP graphs, glm4moe's and deepseek2's among them, run a file of one).
        imatrix: an importance matrix (llama-imatrix's GGUF file) the matrices written by llama-quantize's rules are
            quantized with, as ``llama-quantize --imatrix`` does; it lets ``outtype`` be a type that needs one.
    """

    output: str | os.PathLike[str]
    source: str | None = None
    target: ShardSet | None = None
    block: int | None = None
    outtype: str | GGMLQuantizationType | None = None
    standalone: bool = False
    embd_type: str | GGMLQuantizationType | None = None
    drop_nextn_copies: bool = False
    nextn_blocks: int | None = None
    imatrix: str | os.PathLike[str] | ImportanceMatrix | None = None


def plan_conversion(checkpoint: Checkpoint, request: ConversionRequest) -> ConversionPlan:
    """Plan the conversion of ``checkpoint``'s MTP head as ``request`` asks (headers only; nothing is written).

    Args:
        checkpoint: the opened checkpoint (see :func:`gguf_mtp.format.safetensors_io.open_checkpoint`).
        request: the output and the choices that shape it.

    Raises:
        CheckpointError: unsupported architecture or dtype, no MTP tensors, missing or misshapen tensors.
        IncompatibleDraftError: the head does not fit the target.
        ParameterError: neither ``target`` nor ``block``, ``standalone`` without ``target``, a bad ``outtype``,
            ``block`` or ``nextn_blocks``.
    """
    model = _head_model(checkpoint, request)
    index = _block_index(request.target, request.block, request.standalone, model.default_block())
    if index + model.n_nextn > LLAMA_MAX_LAYERS:
        raise ParameterError(f"blk.{index} + {model.n_nextn} NextN blocks: llama.cpp loads at most "
                             f"{LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)")
    wanted_type = _outtype(request.outtype, request.imatrix is not None)
    embedding_type = _embedding_type(request)
    if request.target is not None:
        model.check_target(request.target)
    head = model.mapped_tensors(index, wanted_type)
    matrix = parse_imatrix(request.imatrix, wanted_type)
    label = request.source or checkpoint.folder.name
    writer, residue = _head_writer(model, request)
    items = [_head_item(t, matrix) for t in head]
    if request.target is not None and request.standalone:
        items = _standalone_items(model, writer, index, request.target, embedding_type, items)
    else:
        _draft_kvs(model, writer, index, request.target, _matrix_types(head), f"{Path(label).name} MTP head",
                   wanted_type)
    path = Path(request.output)
    header, segments, planned, kvs = _layout(writer, items, path, residue)
    block_tensors = [t for t in planned if t.name.startswith("blk.")]
    plan = ConversionPlan(
        source=label,
        checkpoint=checkpoint,
        hf_architecture=_hf_architecture(checkpoint, model),
        arch=model.arch,
        block=index,
        standalone=request.standalone,
        outtype=_outtype_name(wanted_type, model, head),
        output=OutputFile(path, (Bytes(header), *segments)),
        tensors=tuple(planned),
        kvs=tuple(kvs),
        target=request.target,
        notes=(*model.notes, *head_notes(block_tensors, wanted_type, request.target, model.arch), *_graph_notes(model)),
        nextn_blocks=model.n_nextn,
    )
    _log_plan(plan, len(header))
    return plan


def _head_model(checkpoint: Checkpoint, request: ConversionRequest) -> HeadModel:
    """The family converter of ``checkpoint``'s head, with the NextN blocks and copies ``request`` keeps.

    Raises:
        ParameterError: ``drop_nextn_copies`` for a family whose head has no copies.
    """
    model_class = model_class_for_config(checkpoint.config, os.fspath(checkpoint.folder / "config.json"))
    if request.drop_nextn_copies:
        if model_class.keep_nextn_copies is None:
            raise ParameterError(f"drop_nextn_copies: a {arch_name(model_class.model_arch)} head has no "
                                 "embedding/LM head copies to drop")
        model = model_class(checkpoint, keep_nextn_copies=False)  # type: ignore[call-arg]
    else:
        model = model_class(checkpoint)
    if request.nextn_blocks is not None:
        model.keep_first_blocks(request.nextn_blocks)
    return model


def _embedding_type(request: ConversionRequest) -> GGMLQuantizationType | None:
    """The type ``token_embd`` and ``output`` are re-typed to (only a standalone draft carries them)."""
    embedding_type = parse_outtype(request.embd_type, "embd_type")
    if embedding_type is not None and not request.standalone:
        raise ParameterError("embd_type needs standalone: a draft carries no token_embd or output",
                             parameter=("embd_type", "standalone"))
    return embedding_type


def _matrix_types(head: list[MappedTensor]) -> set[GGMLQuantizationType]:
    """The types the head's matrices are written in (its ``general.file_type`` when there is one)."""
    return {t.ggml_type for t in head if len(t.source.shape) > 1 and t.ggml_type != GGMLQuantizationType.F32}


def _head_writer(model: HeadModel, request: ConversionRequest) -> tuple[HeadGGUFWriter, int | None]:
    """The writer of the output's metadata, with the alignment the output takes, and where its data must start
    modulo 4 KiB (``None``: anywhere)."""
    target = request.target
    if target is None:
        return HeadGGUFWriter(model.arch, alignment=None), None
    if request.standalone:
        return HeadGGUFWriter(model.arch, alignment=target.first.alignment), None
    # Compose appends the draft's tensors to the target's last shard with that shard's alignment: a draft
    # laid out in step with where they land shares its extents with the composite on a reflink filesystem.
    last = target.headers[-1]
    return HeadGGUFWriter(model.arch, alignment=last.alignment), appended_data_residue(last)


def _standalone_items(model: HeadModel, writer: HeadGGUFWriter, index: int, target: ShardSet,
                      embedding_type: GGMLQuantizationType | None, head: list[_OutputTensor]) -> list[_OutputTensor]:
    """A standalone draft's metadata (into ``writer``) and its tensors: the head between the target's globals."""
    _standalone_kvs(model, writer, index, target)
    token_embd, *head_of_model = _target_globals(target, embedding_type)
    # The order llama.cpp's converter writes an --mtp export in: token_embd, the block, the head.
    return [token_embd, *head, *head_of_model]


def _hf_architecture(checkpoint: Checkpoint, model: HeadModel) -> str:
    """The first of ``config.json``'s architectures that the head's converter handles."""
    architectures: list[str] = checkpoint.config["architectures"]  # checked when the converter was picked
    return next(a for a in architectures if a in type(model).hf_architectures)


def _outtype_name(wanted: GGMLQuantizationType | None, model: HeadModel, head: list[MappedTensor]) -> str:
    """How the report names the matrices' type: the one asked for, or the source's."""
    return wanted.name.lower() if wanted is not None else _default_outtype(model, head)


def _log_plan(plan: ConversionPlan, header_size: int) -> None:
    """The plan at INFO (one summary line, the tensors), the KVs at DEBUG."""
    kind = "standalone MTP-only model" if plan.standalone else "draft"
    logger.info("convert plan: %s -> %s, %s %s %s, %d tensors, %d KVs, header %s bytes, "
                "%s bytes in all, matrices: %s", plan.source, plan.path, kind, plan.arch, plan.blocks_text,
                len(plan.tensors), len(plan.kvs), f"{header_size:,}", f"{plan.bytes_to_write:,}", plan.outtype)
    for t in plan.tensors:
        logger.info("convert plan: %s %s %s at data offset %s (%s bytes): %s", t.name, t.type_name, list(t.shape),
                    f"{t.offset:,}", f"{t.nbytes:,}", t.how)
    if logger.isEnabledFor(logging.DEBUG):  # decoding a tokenizer array only for a DEBUG reader
        for kv in plan.kvs:
            logger.debug("convert plan: KV %s (%s) = %s", kv.key, kv.type_name, short(kv.value))
    for note in plan.notes:
        logger.info("convert plan: note: %s", note)


def _graph_notes(model: HeadModel) -> list[str]:
    """The note for a head of more NextN blocks than llama.cpp's MTP graph of the architecture runs, with the way
    out."""
    note = nextn_graph_note(model.arch, model.n_nextn)
    if note is None:
        return []
    return [f"{note}; converting only the first block (nextn_blocks=1, --nextn-blocks 1) gives a file it runs"]


def resolve_source(
    source: str | os.PathLike[str],
    revision: str | None = None,
    *,
    ranges_into: Path | None = None,
    tensor_data: bool = True,
) -> tuple[Path, HubCheckpoint | None]:
    """A local checkpoint folder for ``source``: the folder itself; for a repo id, ``ranges_into`` holding the
    head fetched by byte ranges (``tensor_data=False``: headers only), or without it the Hub snapshot holding
    the whole shards of the head (downloaded if not cached).

    Raises:
        CheckpointError: ``source`` is a file, not a folder.
        CheckpointNotFoundError: ``source`` is neither an existing folder nor a repo id.
        ParameterError: a ``revision`` for a local folder.
        HubError: see :func:`gguf_mtp.hub.checkpoint.download_head`.
    """
    path = Path(source)
    if path.exists():
        if not path.is_dir():
            raise CheckpointError("SOURCE must be a checkpoint folder (config.json + *.safetensors) or a Hub repo id",
                                  path)
        if revision is not None:
            raise ParameterError(f"revision {revision!r}: a revision applies to Hub sources only, {path} is a folder")
        return path, None
    text = os.fspath(source)
    if is_repo_id(text) and not text.startswith((".", "/", "~")):
        download = download_head(text, revision=revision, head_prefix=_head_prefix, ranges_into=ranges_into,
                                 tensor_data=tensor_data)
        return download.folder, download
    raise CheckpointNotFoundError("no such folder, and not a Hub repo id (owner/name)", text)


def _head_prefix(config: dict[str, Any]) -> NamePrefix:
    """The tensor-name prefix of the head a ``config.json`` describes (``mtp.``, ``model.layers.92.``)."""
    return model_class_for_config(config).head_prefix(config)


@dataclass(kw_only=True)
class ConvertReport(WriteReport):
    """What a convert run did (or, with ``dry_run``, would do)."""

    plan: ConversionPlan
    download: HubCheckpoint | None = None

    @property
    def output(self) -> Path:
        return self.plan.path

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        plan = self.plan
        return {
            "command": "convert",
            "dry_run": self.dry_run,
            "source": plan.source,
            "checkpoint": _checkpoint_dict(plan.checkpoint),
            "download": None if self.download is None else _download_dict(self.download),
            "hf_architecture": plan.hf_architecture,
            "architecture": plan.arch,
            "block": plan.block,
            "nextn_blocks": plan.nextn_blocks,
            "standalone": plan.standalone,
            "outtype": plan.outtype,
            "head": summarize_head(t for t in plan.tensors if t.name.startswith("blk.")).to_dict(),
            "target": [str(p) for p in plan.target.paths] if plan.target is not None else None,
            "output": str(plan.path),
            "tensors": [t.to_dict() for t in plan.tensors],
            "kvs": [_kv_dict(kv) for kv in plan.kvs],
            "bytes_to_write": plan.bytes_to_write,
            **self.write_fields(),
            "notes": [*plan.notes, *self.notes],
        }

    def plan_lines(self) -> list[str]:
        """The plan (in full with ``dry_run``), shown before writing starts."""
        plan = self.plan
        lines = [*self._source_lines(), _kind_line(plan)]
        lines.append(f"head: {summarize_head(t for t in plan.tensors if t.name.startswith('blk.')).describe()}")
        if self.dry_run:
            lines += _tensor_lines(plan.tensors)
            lines += _kv_lines(plan.kvs)
        lines.extend(f"note: {n}" for n in (*plan.notes, *self.notes))
        if not self.dry_run and not self.written:  # the plan shown before the first byte names the output
            lines.append(f"{self.action(plan.path)} {plan.path} ({human_bytes(plan.bytes_to_write)})")
        return lines

    def _source_lines(self) -> list[str]:
        """The checkpoint, and what of it was fetched from the Hub."""
        plan, ckpt = self.plan, self.plan.checkpoint
        lines = [
            f"source: {plan.source} ({plan.hf_architecture}; {len(ckpt.tensors)} head tensors, "
            f"{human_bytes(ckpt.total_bytes)}, in {', '.join(p.name for p in ckpt.files)})",
        ]
        if self.download is not None and self.download.ranges is not None:
            lines.append(self.download.ranges.describe())
        elif self.download is not None:
            lines.append(f"downloaded only: {', '.join(self.download.allow_patterns)} -> {self.download.folder}")
        return lines


def _checkpoint_dict(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "folder": str(checkpoint.folder),
        "files": [str(p) for p in checkpoint.files],
        "head_tensors": len(checkpoint.tensors),
        "head_bytes": checkpoint.total_bytes,
    }


def _download_dict(download: HubCheckpoint) -> dict[str, Any]:
    return {
        "repo_id": download.repo_id,
        "revision": download.revision,
        "allow_patterns": list(download.allow_patterns),
        "folder": str(download.folder),
        "method": "download" if download.ranges is None else "ranges",
        "ranges": None if download.ranges is None else download.ranges.to_dict(),
    }


def _kind_line(plan: ConversionPlan) -> str:
    """What is written: a draft or a standalone model, its blocks, its tensors, the matrices' type."""
    kind = "standalone MTP-only model" if plan.standalone else "draft"
    from_target = sum(1 for t in plan.tensors if t.how == "copy from target")
    return (
        f"{kind}: {plan.arch} {plan.blocks_text}, {len(plan.tensors) - from_target} head tensors"
        + (f" + {from_target} copied from the target" if from_target else "")
        + f", matrices: {plan.outtype}"
    )


def _tensor_lines(tensors: tuple[PlannedTensor, ...]) -> list[str]:
    """One line per tensor: name, type, shape, size and how its bytes are made."""
    lines = []
    for t in tensors:
        shape = "{" + ", ".join(str(d) for d in t.shape) + "}"
        lines.append(f"    {t.name:<40} {t.type_name:<5} {shape:<18} {human_bytes(t.nbytes):>10}  {t.how}")
    return lines


def _kv_lines(kvs: tuple[KeyValue, ...]) -> list[str]:
    """The metadata, one line per key (the tokenizer's keys counted, not shown)."""
    shown = [kv for kv in kvs if not kv.key.startswith("tokenizer.")]
    hidden = f" ({len(kvs) - len(shown)} tokenizer keys not shown)" if len(shown) < len(kvs) else ""
    return [f"metadata: {len(kvs)} keys{hidden}",
            *(f"    {kv.key} ({kv.type_name}) = {short(kv.value)}" for kv in shown)]


def draft_size_bound(folder: Path, *, outtype: str | None = None, nextn_blocks: int | None = None) -> int:
    """Bytes that :func:`convert` writes at most for the head checkpoint in ``folder``, whatever the target.

    The draft is planned at the last block index llama.cpp loads (its per-layer arrays and tensor names then
    are their longest), plus the padding KV that lays a draft out in step with its target's last shard
    (:func:`~gguf_mtp.format.layout.header_at_residue`: less than one share block and the KV's own bytes).
    The target's ``general.alignment`` is taken to be the default one (it is in every quant seen).

    Raises:
        CheckpointError: the checkpoint cannot be read or planned (as :func:`convert` would refuse it).
    """
    config = read_config(folder)
    model_class = model_class_for_config(config, os.fspath(folder / "config.json"))
    checkpoint = open_checkpoint(folder, prefix=model_class.head_prefix(config))
    request = ConversionRequest(folder / "draft.gguf", block=0, outtype=outtype, nextn_blocks=nextn_blocks)
    probe = plan_conversion(checkpoint, request)
    longest = plan_conversion(checkpoint, replace(request, block=LLAMA_MAX_LAYERS - probe.nextn_blocks))
    return longest.bytes_to_write + SHARE_BLOCK + _PADDING_KV_BYTES


#: The padding KV's bytes besides its items (:data:`~gguf_mtp.format.layout.PAD_KEY`): an upper bound.
_PADDING_KV_BYTES = 256


def _kv_dict(kv: KeyValue) -> dict[str, Any]:
    length = kv.array_length
    value: Any = f"<{length} items>" if length is not None and length > 64 else kv.value
    return {"key": kv.key, "type": kv.type_name, "value": value}


def convert(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    target: str | os.PathLike[str] | None = None,
    block: int | None = None,
    outtype: str | None = None,
    standalone: bool = False,
    embd_type: str | None = None,
    drop_nextn_copies: bool = False,
    nextn_blocks: int | None = None,
    imatrix: str | os.PathLike[str] | None = None,
    revision: str | None = None,
    download: bool = False,
    dry_run: bool = False,
    force: bool = False,
    progress: bool = True,
    on_plan: Callable[[WriteReport], None] | None = None,
) -> ConvertReport:
    """Convert the MTP head of a Hugging Face checkpoint into a GGUF draft (or an MTP-only model).

    Args:
        source: a checkpoint folder (``config.json`` + ``*.safetensors``, with an index when sharded) or a
            Hub repo id (``nvidia/...``), of which only ``config.json``, the index, and the headers and head
            tensors' byte ranges of the shards holding the head are fetched (see ``download``).
        output: the GGUF file to write.
        target: the (quantized, possibly sharded) model the head belongs to, a GGUF file or any shard of a set:
            :attr:`ConversionRequest.target`.
        block, outtype, standalone, embd_type, drop_nextn_copies, nextn_blocks, imatrix: what to make of the
            head, each as the :class:`ConversionRequest` field of its name.
        revision: Hub revision (branch, tag or commit) of a repo-id ``source``.
        download: for a repo-id ``source``, download the whole shards that hold the head into the Hub cache
            (reused by later runs) instead of their headers and the head's byte ranges (which go to a
            scratch folder beside ``output``, removed afterwards). Offline, the Hub cache is used either way.
        dry_run: plan and check only (every refusal a real run would make is made): read headers, write nothing.
        force: replace an existing output (never an input).
        progress: progress bars on stderr (when it is a terminal).
        on_plan: called with the report once the output passed its checks, before the first byte is
            written (the CLI prints the plan there).

    Returns:
        A :class:`ConvertReport` (``.output``, ``.to_dict()``, ``.describe()``).

    Raises:
        GGUFMTPError: bad input, one line naming the file and the problem: ``CheckpointError`` (config,
            safetensors, unsupported architecture or dtype, no MTP head), ``HubError`` (offline, token),
            ``IncompatibleDraftError`` (head and target disagree), ``ParameterError`` (arguments that cannot
            go together), ``UnsafeOutputError``, ``OutputWriteError`` (nothing with the final name is left
            behind). Each is also a ``ValueError`` (bad input) or an ``OSError`` (files, the Hub); a missing
            local ``source`` is a ``FileNotFoundError`` (:class:`~gguf_mtp.errors.CheckpointNotFoundError`).

    Example:
        >>> convert("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "mtp-draft.gguf",
        ...         target="NVIDIA-Nemotron-3-Super-120B-A12B-UD-Q4_K_XL-00001-of-00003.gguf")  # doctest: +SKIP
    """

    def prepare(scratch: Path | None) -> tuple[ConvertReport, list[OutputFile], list[Path]]:
        folder, fetched = resolve_source(source, revision, ranges_into=scratch, tensor_data=not dry_run)
        config = read_config(folder)
        model_class = model_class_for_config(config, os.fspath(folder / "config.json"))
        checkpoint = open_checkpoint(folder, prefix=model_class.head_prefix(config))
        target_set = open_model(target) if target is not None else None
        plan = plan_conversion(checkpoint, ConversionRequest(
            output, source=os.fspath(source), target=target_set, block=block, outtype=outtype,
            standalone=standalone, embd_type=embd_type, drop_nextn_copies=drop_nextn_copies,
            nextn_blocks=nextn_blocks, imatrix=imatrix,
        ))
        report = ConvertReport(plan=plan, dry_run=dry_run, download=fetched)
        return report, [plan.output], list(plan.inputs)

    with _scratch_folder(source, output, wanted=not download) as scratch:
        return run_write(lambda: prepare(scratch), desc="convert", force=force, progress=progress, on_plan=on_plan)


@contextmanager
def _scratch_folder(
    source: str | os.PathLike[str], output: str | os.PathLike[str], *, wanted: bool
) -> Iterator[Path | None]:
    """For a repo-id ``source`` fetched by ranges: a new scratch folder beside ``output``, removed afterwards (a
    killed run's, by the next run: :mod:`gguf_mtp.files.scratch`); else ``None``.

    Beside means on the output's filesystem, so the head's bytes can be shared with the output and count
    against its free space: in the output's folder, or in its nearest existing parent when the folder is
    still to be made (made here, it would outlive a failed run that the writer cleans up after).
    """
    text = os.fspath(source)
    if not wanted or Path(source).exists() or not is_repo_id(text) or text.startswith((".", "/", "~")):
        yield None
        return
    with scratch_folder(existing_ancestor(Path(output).parent)) as folder:
        yield folder
