"""The common work of every MTP head converter, in the shape of llama.cpp's ``conversion/base.py``.

A family module subclasses :class:`HeadModel` and registers it under the Hugging Face architecture
names it handles (``@HeadModel.register("NemotronHForCausalLM")``). It says three things: how
checkpoint names map to GGUF names (:meth:`HeadModel.modify_tensors`, a generator yielding
``(gguf_name, TensorSource)``, which is where experts get stacked), which hyperparameters to write
(:meth:`HeadModel.set_gguf_parameters`, through gguf-py's :class:`~gguf.GGUFWriter`), and what the
shapes and per-layer values of its NextN block are. The base class does the rest: reads the
checkpoint lazily (headers only), checks shapes against ``config.json``, picks output types with
llama.cpp's rule, and turns each tensor into output segments that :mod:`gguf_mtp.write` streams,
one tensor (one expert) at a time.

Unlike llama.cpp's converter, nothing here needs torch, and bytes that need no conversion (BF16 in,
BF16 out) are copied by the kernel instead of passing through numpy.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    MODEL_TENSOR,
    TENSOR_NAMES,
    GGMLQuantizationType,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
)

from gguf_mtp.errors import CheckpointError, IncompatibleDraftError, ParameterError
from gguf_mtp.files.plan import CopyRange, Generated, Segment
from gguf_mtp.format.header import GGUFArray, KeyValue, encode_kv, tensor_nbytes
from gguf_mtp.format.kv_edit import misfit
from gguf_mtp.format.quant_rules import HEAD_TYPE_FILE_TYPES, head_tensor_type
from gguf_mtp.format.quantize import InvalidRowsError, converter_rows, from_f32, to_f32
from gguf_mtp.format.safetensors_io import QUANTIZED_DTYPES, Checkpoint, NamePrefix, SafetensorsTensor
from gguf_mtp.model.blocks import layer_array, per_layer_keys
from gguf_mtp.model.shards import ShardSet, vocab_size

from .fp8 import FP8_DTYPES, BlockFP8, BlockScaledTensor, dequantized_head, quantization_of

__all__ = [
    "EXPERT_LIMIT",
    "FILE_TYPES",
    "FLOAT_DTYPES",
    "INT32_MAX",
    "LLAMA_MAX_EXPERTS",
    "LLAMA_MAX_LAYERS",
    "MAX_WIDTH",
    "U32_MAX",
    "BlockIndex",
    "ExpertStack",
    "HeadGGUFWriter",
    "HeadModel",
    "KVValueError",
    "MappedTensor",
    "TargetCheck",
    "TensorSource",
    "arch_name",
    "at_block",
    "config_bool",
    "config_float",
    "config_int",
    "first_block_template",
    "shown_name",
    "tensor_segments",
]

Q = GGMLQuantizationType
_V = TypeVar("_V")

#: The ``--outtype`` names llama.cpp's converter offers, applied its way (:meth:`HeadModel.output_type`); the
#: others are llama-quantize's and follow its rules (:mod:`gguf_mtp.format.quant_rules`) on top of the former.
CONVERTER_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0})

#: ``general.file_type`` of a file whose matrices are all of one type.
FILE_TYPES: dict[GGMLQuantizationType, LlamaFileType] = HEAD_TYPE_FILE_TYPES

#: Floating-point safetensors dtypes the converter reads, and the ggml type that holds them unchanged.
FLOAT_DTYPES: dict[str, GGMLQuantizationType | None] = {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16, "F64": None}

#: Names that only FP8 / NVFP4 checkpoints carry (scales next to packed weights).
_QUANT_SIDECARS = ("weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale", "weight_packed",
                   "weight_global_scale", "input_global_scale")

#: Bytes of float32 working memory per converted chunk (memory stays flat whatever the tensor size).
CHUNK_BYTES = 16 * 1024 * 1024

#: llama.cpp's own limits (``src/llama-hparams.h``): a model it loads has at most this many layers
#: (trunk and NextN blocks together) and routed experts. A head beyond them could never run.
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024

#: The largest values of GGUF's 32-bit fields: u32 (context length, SSM sizes) and i32 (token ids).
U32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
EXPERT_LIMIT = f"llama.cpp loads at most {LLAMA_MAX_EXPERTS} experts (LLAMA_MAX_EXPERTS)"

#: The largest width, length or head count read from config.json: 16x today's largest models, and
#: small enough that no product of two of them overflows GGUF's 64-bit dimensions.
MAX_WIDTH = 1 << 20


# ------------------------------------------------------------------------------------ config.json


def _found(
    config: dict[str, Any], keys: str | Sequence[str], where: str | os.PathLike[str] | None, *, optional: bool
) -> tuple[str, Any] | None:
    """(the first of ``keys`` that config.json sets to a non-null value, its value); ``None`` when none is
    set and ``optional``.

    Raises:
        CheckpointError: none is set and the value is required.
    """
    names = (keys,) if isinstance(keys, str) else tuple(keys)
    for key in names:
        if config.get(key) is not None:
            return key, config[key]
    if optional:
        return None
    wanted = names[0] if len(names) == 1 else f"none of {', '.join(names)}"
    raise CheckpointError(f"config.json has {'no ' if len(names) == 1 else ''}{wanted}", where)


def _shown(value: Any) -> str:
    """A config value as JSON (``256.0``, ``"4k"``, ``true``), cut short for a one-line message."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def config_int(
    config: dict[str, Any], keys: str | Sequence[str], *, where: str | os.PathLike[str] | None,
    minimum: int = 1, maximum: int = MAX_WIDTH, optional: bool = False, limit: str | None = None,
) -> int | None:
    """The integer hyperparameter ``keys`` (the first one set) of a config, checked for type and range.

    A JSON integer only: ``256.0``, ``"256"``, ``true`` and ``1e30`` are refused, as is anything outside
    ``minimum..maximum``. ``null`` counts as absent.

    Args:
        config: the parsed ``config.json``.
        keys: the key, or its spellings in order of preference (``["hidden_size", "d_model"]``).
        where: the config file, for messages.
        optional: return ``None`` when absent instead of refusing.
        limit: why ``maximum`` is what it is, added to the message when it is exceeded.

    Raises:
        CheckpointError: one line naming the key and its value.
    """
    found = _found(config, keys, where, optional=optional)
    if found is None:
        return None
    key, value = found
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{key} = {_shown(value)} is not an integer (expected {minimum:,}..{maximum:,})", where)
    if not minimum <= value <= maximum:
        reason = f": {limit}" if limit and value > maximum else ""
        raise CheckpointError(f"{key} = {value:,} is out of range (expected {minimum:,}..{maximum:,}){reason}", where)
    return value


def config_float(
    config: dict[str, Any], keys: str | Sequence[str], *, where: str | os.PathLike[str] | None,
    above: float = 0.0, maximum: float = 1e6, optional: bool = False,
) -> float | None:
    """The number hyperparameter ``keys`` of a config: finite, ``> above`` and ``<= maximum`` (an integer
    such as ``5`` is accepted as ``5.0``; a string or a bool is not). ``null`` counts as absent.

    Raises:
        CheckpointError: one line naming the key and its value.
    """
    found = _found(config, keys, where, optional=optional)
    if found is None:
        return None
    key, value = found
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{key} = {_shown(value)} is not a number", where)
    number = float(value)
    if not math.isfinite(number) or not above < number <= maximum:
        raise CheckpointError(f"{key} = {_shown(value)} is out of range (expected more than {above:g}, at most "
                              f"{maximum:g})", where)
    return number


def config_bool(config: dict[str, Any], key: str, *, where: str | os.PathLike[str] | None) -> bool | None:
    """The ``true``/``false`` hyperparameter ``key`` of a config, ``None`` when absent or null.

    Raises:
        CheckpointError: it is something else (``1``, ``"yes"``), named with its value.
    """
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise CheckpointError(f"{key} = {_shown(value)} is not true or false", where)
    return value


# ------------------------------------------------------------------------------------------ tensors


class BlockIndex(int):
    """The first NextN block's index, as GGUF name templates are formatted with it: ``{bid}`` is the block
    itself, ``{bid[k]}`` the k-th block after it (a head of several NextN blocks, renumbered together)."""

    def __getitem__(self, offset: int) -> int:
        return int(self) + offset


class _ShownBlock:
    """``{bid}`` shown as ``N`` and ``{bid[k]}`` as ``N+k`` in messages about a name template."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def __format__(self, spec: str) -> str:
        return f"N+{self.offset}" if self.offset else "N"

    def __getitem__(self, offset: int) -> _ShownBlock:
        return _ShownBlock(offset)


#: ``{bid[k]}`` in a name template (the k-th NextN block after the first).
_LATER_BLOCK = re.compile(r"\{bid\[[0-9]+\]\}")


def at_block(template: str, offset: int) -> str:
    """A name template of the first NextN block (``blk.{bid}...``) moved to the ``offset``-th block after it
    (``blk.{bid[offset]}...``); a template already naming a later block is left as it is."""
    return template.replace("{bid}", f"{{bid[{offset}]}}") if offset else template


def first_block_template(template: str) -> str:
    """A name template of any NextN block as the first block's: ``blk.{bid[2]}.x`` -> ``blk.{bid}.x`` (the rules
    that hold for every block compare against this)."""
    return _LATER_BLOCK.sub("{bid}", template)


def shown_name(template: str) -> str:
    """A GGUF name template for messages: ``blk.{bid[1]}.attn_q.weight`` -> ``blk.N+1.attn_q.weight``."""
    return template.format(bid=_ShownBlock())


@dataclass(frozen=True)
class TensorSource:
    """What one output tensor is made of: checkpoint tensors concatenated in order.

    One part for an ordinary tensor; for stacked experts one part per expert, stacked on a new
    outermost axis (so the result's bytes are the experts' bytes one after the other, which is why
    they can be written expert after expert without ever materialising the stack).
    """

    parts: tuple[SafetensorsTensor, ...]
    shape: tuple[int, ...]  # row-major (torch) shape of the result

    @classmethod
    def single(cls, tensor: SafetensorsTensor) -> TensorSource:
        return cls((tensor,), tensor.shape)

    @classmethod
    def stack(cls, parts: Sequence[SafetensorsTensor]) -> TensorSource:
        """Stack same-shaped, same-dtype tensors on a new outer axis (``torch.stack(parts, dim=0)``).

        Raises:
            CheckpointError: the parts disagree in shape or dtype.
        """
        first = parts[0]
        for part in parts[1:]:
            if part.shape != first.shape or part.dtype != first.dtype:
                raise CheckpointError(
                    f"cannot stack {part.name} ({part.dtype} {list(part.shape)}) with {first.name} "
                    f"({first.dtype} {list(first.shape)})",
                    part.path,
                )
        return cls(tuple(parts), (len(parts), *first.shape))

    @property
    def dtype(self) -> str:
        return self.parts[0].dtype

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    @property
    def ggml_shape(self) -> tuple[int, ...]:
        """The shape in ggml order (ne0, the innermost dimension, first)."""
        return tuple(reversed(self.shape))


@dataclass(frozen=True)
class MappedTensor:
    """A checkpoint tensor (or stack) under its GGUF name, with the type it will be written in.

    ``via`` is set when ``ggml_type`` follows llama-quantize's rules (an ``outtype`` llama.cpp's converter does not
    write): the type the converter writes the tensor in by default, which llama-quantize would start from. The
    values are rounded to it first (FP8 dequantized to BF16, as the converter's file holds them), then quantized
    and checked as llama-quantize does (a NaN or an infinity is refused)."""

    name: str
    source: TensorSource
    ggml_type: GGMLQuantizationType
    via: GGMLQuantizationType | None = None

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.source.ggml_shape, self.ggml_type)

    @property
    def rounded_to(self) -> GGMLQuantizationType | None:
        """``via`` where rounding to it changes the values before they are quantized: ``None`` without ``via``, when
        ``via`` is the output type itself, or when the source is stored in ``via`` already (a BF16 matrix)."""
        part = self.source.parts[0]
        if self.via is None or self.via == self.ggml_type:
            return None
        if not part.transformed and FLOAT_DTYPES.get(part.dtype) == self.via:
            return None
        return self.via


def _to_f32(rows: np.ndarray, dtype: str) -> np.ndarray:
    if rows.dtype == np.float32:
        return rows  # a transformed view's values (dequantized, transposed): float32 already
    if dtype == "BF16":
        # BF16 is the upper half of an IEEE float32: widening is a 16-bit shift, exact.
        return (rows.astype(np.uint32) << 16).view(np.float32)
    return rows.astype(np.float32, copy=False)


def _converted_chunks(part: SafetensorsTensor, qtype: GGMLQuantizationType, chunk_bytes: int, checked: bool = False,
                      rounded_to: GGMLQuantizationType | None = None) -> Iterator[np.ndarray]:
    """``part`` converted to ``qtype``, a bounded run of rows at a time (rows are whole quant blocks): as llama.cpp's
    converter writes it, or (``checked``) as llama-quantize writes the converter's output of it, the values rounded
    to ``rounded_to`` first (see :attr:`MappedTensor.rounded_to`) and refused where llama-quantize refuses them. A
    chunk may share memory with the next one: consume it before asking for the next.

    Raises:
        CheckpointError: (``checked``) a row holds a NaN or an infinity, or overflows ``qtype``; one line naming
            the tensor.
    """
    rows_per_chunk = max(1, chunk_bytes // max(1, part.row_size * 4))
    row_size = part.row_size or 1
    buffer: np.ndarray | None = None
    fd = os.open(part.path, os.O_RDONLY)
    try:
        for start in range(0, part.n_rows, rows_per_chunk):
            count = min(rows_per_chunk, part.n_rows - start)
            buffer_rows = part.read_rows(fd, start, count, buffer)
            if buffer is None:
                buffer = buffer_rows.reshape(-1)
            values = _to_f32(buffer_rows, part.dtype).reshape(count, row_size)
            if not checked:
                yield converter_rows(values, qtype)
                continue
            if rounded_to is not None:
                values = to_f32(converter_rows(values, rounded_to), rounded_to, values.size).reshape(count, row_size)
            try:
                yield from_f32(values, qtype, checked=True)
            except InvalidRowsError as e:
                raise CheckpointError(e.describe(part.name, start), part.path) from None
    finally:
        os.close(fd)


def _merge_copies(segments: Iterable[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for segment in segments:
        last = merged[-1] if merged else None
        if (
            isinstance(segment, CopyRange)
            and isinstance(last, CopyRange)
            and last.source == segment.source
            and last.offset + last.nbytes == segment.offset
        ):
            merged[-1] = CopyRange(last.source, last.offset, last.nbytes + segment.nbytes)
        else:
            merged.append(segment)
    return merged


def tensor_segments(tensor: MappedTensor, *, chunk_bytes: int = CHUNK_BYTES) -> list[Segment]:
    """The output bytes of ``tensor`` as segments: kernel copies where the bytes pass unchanged (same
    type in and out), generated chunks where they are converted or quantized; part after part."""
    segments: list[Segment] = []
    for part in tensor.source.parts:
        if not part.transformed and FLOAT_DTYPES.get(part.dtype) == tensor.ggml_type:
            segments.append(CopyRange(part.path, part.offset, part.nbytes))
        else:
            nbytes = tensor_nbytes(tuple(reversed(part.shape)) or (1,), tensor.ggml_type)
            chunks = functools.partial(_converted_chunks, part, tensor.ggml_type, chunk_bytes, tensor.via is not None,
                                       tensor.rounded_to)
            segments.append(Generated(nbytes, chunks))
    return _merge_copies(segments)


def arch_name(model_arch: MODEL_ARCH | str) -> str:
    """The GGUF architecture name of gguf-py's ``MODEL_ARCH`` member, or the name itself."""
    return model_arch if isinstance(model_arch, str) else MODEL_ARCH_NAMES[model_arch]


# ------------------------------------------------------------------------------------------- writer


class HeadGGUFWriter(GGUFWriter):
    """Records the metadata a converter sets through gguf-py's :class:`~gguf.GGUFWriter` API as
    :class:`~gguf_mtp.format.header.KeyValue` entries, encoded by this project's codec.

    Converters keep llama.cpp's shape: :meth:`HeadModel.set_gguf_parameters` calls the writer's public
    ``add_*`` methods (``add_block_count``, ``add_expert_count``...), which gguf-py turns into key names
    and value types and hands to :meth:`add_key_value`, the one method overridden here. Nothing else of
    gguf-py's writer is used: it never opens a file, and the header is rendered by
    :func:`gguf_mtp.format.header.serialize_header` from :attr:`kvs` and tensor infos the plan lays out
    (the codec is the only serializer). KVs copied byte-exactly from another GGUF keep their encoding
    (:meth:`add_copied_kv`), whatever their type.
    """

    def __init__(self, arch: str, *, alignment: int | None = None) -> None:
        self._kvs: dict[str, KeyValue] = {}  # before super().__init__, which adds general.architecture
        super().__init__(None, arch)
        if alignment is not None and alignment != GGUF_DEFAULT_ALIGNMENT:
            self.add_custom_alignment(alignment)

    def add_key_value(self, key: str, val: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> None:
        """Encode and record one KV (a key set twice keeps its place and takes the new value, as in gguf-py).

        Every value (every item of an array) is checked against the type it is written as, here and only here
        (:func:`~gguf_mtp.format.kv_edit.misfit`): a hyperparameter that does not fit its GGUF field never reaches
        the encoder.

        Raises:
            KVValueError: a value that does not fit its type (a float32 beyond 3.4e38, an entry of an i32 array
                beyond 2^31, a count beyond u32); :meth:`HeadModel.writing_config_values` names its config key.
            ValueError: a value gguf-py could not write either (an empty array without ``sub_type``, an array
                of mixed types, an unknown type).
        """
        vtype = GGUFValueType(vtype)
        if vtype == GGUFValueType.ARRAY:
            array = _typed_array(val, sub_type, key)
            _check_fits(key, array)
            self._kvs[key] = encode_kv(key, vtype, array)
        else:
            value = _scalar(val, vtype)
            _check_fits(key, value, vtype)
            self._kvs[key] = encode_kv(key, vtype, value)

    def remove_key(self, key: str) -> None:
        """Drop ``key`` if it was set."""
        self._kvs.pop(key, None)

    def add_copied_kv(self, kv: KeyValue) -> None:
        """Add (or replace) a KV with its exact encoding, e.g. taken from the target model."""
        self._kvs[kv.key] = kv

    def clear_kvs(self) -> None:
        """Drop every KV, ``general.architecture`` included (to re-add them in another file's order)."""
        self._kvs.clear()

    @property
    def kvs(self) -> list[KeyValue]:
        """The recorded KVs, in the order they were first set."""
        return list(self._kvs.values())

    @property
    def alignment(self) -> int:
        """The data alignment (``general.alignment`` when set, else GGUF's default of 32)."""
        return self.data_alignment


class KVValueError(ValueError):
    """A metadata value that does not fit the GGUF type it is written as.

    Attributes:
        key: the GGUF key; value: the offending value (the item, for an array); reason: what the type holds.
    """

    def __init__(self, key: str, value: Any, reason: str) -> None:
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"{key} = {_shown(value)}: {reason}")


def _check_fits(key: str, value: Any, vtype: GGUFValueType | None = None) -> None:
    """Raise :class:`KVValueError` unless ``value`` (a scalar of ``vtype``, or a :class:`GGUFArray`) fits."""
    if isinstance(value, GGUFArray):
        for item in value.items:
            _check_fits(key, item, value.element_type)
        return
    assert vtype is not None
    reason = misfit(value, vtype)
    if reason is not None:
        raise KVValueError(key, value, reason)


def _scalar(val: Any, vtype: GGUFValueType) -> Any:
    """A scalar as the codec takes it: strings as ``str`` (bytes are kept exactly through surrogateescape)."""
    if vtype == GGUFValueType.STRING and isinstance(val, (bytes, bytearray)):
        return bytes(val).decode("utf-8", "surrogateescape")
    return val


def _typed_array(val: Any, sub_type: GGUFValueType | None, key: str) -> GGUFArray:
    """A gguf-py array value (a list, or ``bytes`` for u8) as a :class:`GGUFArray`, its element type
    ``sub_type`` or, like gguf-py, the type of its items (``int`` -> i32, ``float`` -> f32, ``str``)."""
    if isinstance(val, (bytes, bytearray)):
        return GGUFArray(sub_type or GGUFValueType.UINT8, tuple(val))
    if not isinstance(val, Sequence) or isinstance(val, str):
        raise ValueError(f"{key}: a GGUF array needs a sequence, not {type(val).__name__}")
    if sub_type is None:
        if not val:
            raise ValueError(f"{key}: an empty GGUF array needs its element type")
        sub_type = GGUFValueType.get_type(val[0])
        if any(GGUFValueType.get_type(item) is not sub_type for item in val[1:]):
            raise ValueError(f"{key}: all items of a GGUF array must have the same type")
    etype = GGUFValueType(sub_type)
    if etype == GGUFValueType.ARRAY:
        return GGUFArray(etype, tuple(item if isinstance(item, GGUFArray) else _typed_array(item, None, key)
                                      for item in val))
    return GGUFArray(etype, tuple(_scalar(item, etype) for item in val))


# -------------------------------------------------------------------------------------------- model


def _either(prefix: NamePrefix) -> str:
    """``'mtp.'`` or ``'model.layers.45.' or 'model.layers.46.'`` for messages."""
    return " or ".join(repr(p) for p in ((prefix,) if isinstance(prefix, str) else prefix))


def _gave(read: Any, written: Any) -> bool:
    """Whether a value read from config.json is (or, for a list, holds) a value being written."""
    if isinstance(read, (list, tuple)):
        return any(_gave(item, written) for item in read)
    return isinstance(read, bool) == isinstance(written, bool) and read == written


@dataclass(frozen=True)
class TargetCheck:
    """One hyperparameter the head and the target must agree on."""

    key: str  # ``{arch}.`` suffix, e.g. ``expert_count``
    value: int
    config_key: str  # where the head's value comes from, for messages


class HeadModel:
    """Base class of one model family's MTP head converter (see the module docstring)."""

    #: The GGUF architecture the head belongs to: gguf-py's member, or its name where the installed gguf-py is older
    #: than the llama.cpp that runs it (PyPI gguf 0.19.0 has no ``hy_v3``, ``bailingmoe3``...).
    model_arch: ClassVar[MODEL_ARCH | str]
    #: Checkpoint tensors of the MTP head start with this.
    tensor_prefix: ClassVar[NamePrefix] = "mtp."
    #: Whether the head's own copies of the embedding and LM head are converted (``None``: the family's head
    #: has no such copies; a family that has them takes ``keep_nextn_copies=`` in its constructor).
    keep_nextn_copies: ClassVar[bool | None] = None
    #: Whether the head is a mixture of experts: the expert counts are read, checked and written.
    has_experts: ClassVar[bool] = True
    #: A routed expert's checkpoint tensors (groups ``expert``, ``proj``): what the expert-count check counts
    #: and :meth:`stack_expert` stacks.
    expert_pattern: ClassVar[re.Pattern[str] | None] = None
    #: ``proj`` of :attr:`expert_pattern` -> the stacked GGUF tensor it becomes.
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {}
    #: Whether the family has RoPE (``rope_theta`` read and written as ``rope.freq_base``).
    has_rope: ClassVar[bool] = True
    #: config.json spellings of the norm epsilon, and the value written when none is set.
    norm_eps_keys: ClassVar[tuple[str, ...]] = ("rms_norm_eps",)
    #: config.json spellings of the KV head count and of the expert counts (routed, used per token).
    n_head_kv_keys: ClassVar[tuple[str, ...]] = ("num_key_value_heads", "n_head_kv")
    expert_count_keys: ClassVar[tuple[str, ...]] = ("n_routed_experts", "num_experts")
    expert_used_keys: ClassVar[tuple[str, ...]] = ("num_experts_per_tok",)
    default_norm_eps: ClassVar[float] = 1e-5
    #: HF architecture name -> converter class (filled by :meth:`register`).
    _classes: ClassVar[dict[str, type[HeadModel]]] = {}
    #: GGUF architecture name -> converter class.
    _classes_by_arch: ClassVar[dict[str, type[HeadModel]]] = {}
    hf_architectures: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def register(cls, *names: str) -> Callable[[type[HeadModel]], type[HeadModel]]:
        """Class decorator: handle the HF architectures ``names`` (``config.json`` ``architectures``)."""

        def decorate(model_class: type[HeadModel]) -> type[HeadModel]:
            # its own names only: a subclass (DeepSeek V3.2's of V3's) does not inherit its parent's
            model_class.hf_architectures = (*model_class.__dict__.get("hf_architectures", ()), *names)
            for name in names:
                cls._classes[name] = model_class
            cls._classes_by_arch[arch_name(model_class.model_arch)] = model_class
            return model_class

        return decorate

    @classmethod
    def head_prefix(cls, config: dict[str, Any]) -> NamePrefix:
        """The name prefix of the head's tensors for a ``config.json`` (what is downloaded and opened)."""
        return cls.tensor_prefix

    def default_block(self) -> int | None:
        """The NextN block index when neither a target nor ``block`` gives it (``None``: one of them must)."""
        return None

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.hparams: dict[str, Any] = checkpoint.config
        self.notes: list[str] = []
        #: How many NextN blocks the head is: a family with several sets it (they are written ``blk.N .. N+k-1``).
        self.n_nextn = 1
        #: (config key or derivation, value) for every hyperparameter read, in reading order (for messages).
        self._origins: list[tuple[str, Any]] = []
        self._experts: dict[tuple[int, str], ExpertStack] = {}

    # ---------------------------------------------------------------- family hooks (override these)

    def modify_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        """Map one checkpoint tensor to zero or more ``(gguf_name, source)``; ``{bid}`` in a name stands for
        the NextN block index. May hold tensors back and yield them later (stacked experts)."""
        raise NotImplementedError

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF name (with ``{bid}``) -> row-major shape config.json implies, in output order."""
        raise NotImplementedError

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        """Write the hyperparameters the head implies (scalars; per-layer arrays come from
        :meth:`nextn_layer_values` / :meth:`trunk_layer_values`). The base writes the common ones, as
        llama.cpp's ``TextModel.set_gguf_parameters`` does; a family calls it first, then adds its own."""
        writer.add_block_count(n_layers)
        writer.add_nextn_predict_layers(self.n_nextn)
        if self.context_length is not None:
            writer.add_context_length(self.context_length)
        writer.add_embedding_length(self.n_embd)
        if self.vocab_size is not None:
            writer.add_vocab_size(self.vocab_size)
        writer.add_head_count(self.n_head)
        if "attention.head_count_kv" not in self.own_layer_arrays():
            writer.add_head_count_kv(self.n_head_kv)
        writer.add_key_length(self.head_dim)
        writer.add_value_length(self.head_dim)
        if self.rope_theta is not None:
            writer.add_rope_freq_base(self.rope_theta)
        writer.add_layer_norm_rms_eps(self.norm_eps if self.norm_eps is not None else self.default_norm_eps)
        if self.has_experts:
            writer.add_expert_count(self.n_expert)
            writer.add_expert_used_count(self.n_expert_used)

    def nextn_layer_values(self) -> dict[str, int]:
        """Per-layer array (``{arch}.`` suffix) -> the NextN block's entry."""
        raise NotImplementedError

    def moe_block_values(self, n_ff_exp: int, n_ff: int | None) -> dict[str, int]:
        """The per-layer entries of a MoE NextN block, for a target that states these per layer: heads, KV heads,
        experts used, the expert width ``n_ff_exp`` and the dense width ``n_ff`` when config.json has one."""
        return {
            "attention.head_count": self.n_head,
            "attention.head_count_kv": self.n_head_kv,
            "expert_used_count": self.n_expert_used,
            "expert_feed_forward_length": n_ff_exp,
            **({"feed_forward_length": n_ff} if n_ff is not None else {}),
        }

    def nextn_block_values(self, offset: int) -> dict[str, Any]:
        """Per-layer array -> the entry of the ``offset``-th NextN block (a family whose blocks differ overrides
        it; by default every block takes :meth:`nextn_layer_values`)."""
        return dict(self.nextn_layer_values())

    def own_layer_arrays(self) -> tuple[str, ...]:
        """The per-layer arrays this family writes, like llama.cpp's converter does for the model."""
        raise NotImplementedError

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[int]] | None:
        """Per-layer entries of the trunk blocks, when config.json describes a trunk of ``n_trunk`` blocks."""
        return None

    def target_checks(self) -> list[TargetCheck]:
        """The hyperparameters a target model must share with the head: the common ones here; a family adds its
        own to this list."""
        checks = [
            TargetCheck("embedding_length", self.n_embd, self._origin_of("hidden_size")),
            TargetCheck("attention.head_count", self.n_head, self._origin_of("num_attention_heads")),
            TargetCheck("attention.head_count_kv", self.n_head_kv, self._origin_of(*self.n_head_kv_keys)),
            TargetCheck("attention.key_length", self.head_dim, "head_dim"),
        ]
        if self.has_experts:
            checks += [TargetCheck("expert_count", self.n_expert, self.expert_count_key),
                       TargetCheck("expert_used_count", self.n_expert_used, self._origin_of(*self.expert_used_keys))]
        if self.vocab_size is not None:
            checks.append(TargetCheck("vocab_size", self.vocab_size, "vocab_size"))
        return checks

    def begin_tensors(self) -> None:
        """Called before the first tensor: reset whatever :meth:`modify_tensors` holds back (the base: one
        :class:`ExpertStack` per projection of :attr:`stacked_experts`)."""
        self._experts = {(block, proj): ExpertStack(self.n_expert) for block in range(self.n_nextn)
                         for proj in self.stacked_experts} if self.has_experts else {}

    def finish_tensors(self) -> None:
        """Called after the last tensor: complain about anything held back and never yielded (the base: experts
        of a projection that never completed; none at all means packed experts, or none: map_tensors says)."""
        if all(not stack.parts for stack in self._experts.values()):
            return
        for (block, proj), stack in self._experts.items():
            missing = stack.missing(limit=6)
            if missing:
                shown = ", ".join(str(i) for i in missing[:5]) + (", ..." if stack.n_missing > 5 else "")
                raise CheckpointError(
                    f"the MTP head{f' (NextN block {block})' if self.n_nextn > 1 else ''} has {len(stack.parts)} of "
                    f"{stack.count} experts' {proj}_proj (config.json "
                    f"{self.expert_count_key}); missing experts {shown}", self.checkpoint.folder)

    def stack_expert(self, tensor: SafetensorsTensor) -> list[tuple[str, TensorSource]] | None:
        """A routed expert's tensor (:attr:`expert_pattern`) added to its stack: the stacked tensor once its
        last expert has arrived, else nothing; ``None`` when ``tensor`` is not an expert's."""
        match = self.expert_pattern.match(tensor.name) if self.expert_pattern is not None else None
        if match is None or not self.has_experts:
            return None
        block = self.nextn_block(tensor)
        stacked = self._experts[(block, match["proj"])].add(int(match["expert"]), tensor)
        if stacked is None:
            return []
        return [(self.format_tensor_name(self.stacked_experts[match["proj"]], block=block), stacked)]

    def nextn_block(self, tensor: SafetensorsTensor) -> int:
        """Which NextN block (0 .. :attr:`n_nextn` - 1) a head tensor belongs to (a family with several says)."""
        return 0

    def keep_first_blocks(self, count: int) -> None:
        """Convert only the first ``count`` NextN blocks; a family whose llama.cpp graph runs its blocks as a chain
        keeps them all (:class:`~.nextn_layer.NextNLayerModel`, whose graphs run one, can narrow).

        Raises:
            ParameterError: ``count`` is not what this head can keep.
        """
        if count != self.n_nextn:
            raise ParameterError(f"nextn_blocks {count}: the {self.arch} head's {self.n_nextn} NextN block(s) are "
                                 f"converted together")

    # ------------------------------------------------------------------------------ common work

    @property
    def arch(self) -> str:
        """The GGUF architecture name (``nemotron_h_moe``)."""
        return arch_name(self.model_arch)

    @property
    def config_path(self) -> Path:
        """The checkpoint's ``config.json`` (named by every message about a hyperparameter)."""
        return self.checkpoint.folder / "config.json"

    def read_common_hparams(self) -> None:
        """The hyperparameters every family has, read once with their bounds (the ones llama.cpp's
        ``TextModel.set_gguf_parameters`` reads): width, heads, KV heads, head size, vocabulary, context length,
        norm epsilon, RoPE base, and for a MoE the expert counts, checked against the experts the head holds.
        A family calls it first thing in its hyperparameter reading.

        Raises:
            CheckpointError: a value of the wrong type or out of range, or an expert count the head's tensors
                do not bear out; one line naming the key.
        """
        need, may = self.hparam_int, self.optional_hparam_int
        self.n_embd = need(["hidden_size", "d_model"])
        self.n_head = need(["num_attention_heads", "n_head"])
        self.n_head_kv = need(list(self.n_head_kv_keys), maximum=self.n_head)
        head_dim = may(["head_dim", "attention_head_dim"])
        if head_dim is None:
            if self.n_embd % self.n_head:
                raise CheckpointError(f"config.json has no head_dim, and hidden_size = {self.n_embd} does not split "
                                      f"into num_attention_heads = {self.n_head} heads", self.config_path)
            head_dim = self.n_embd // self.n_head
        self.head_dim = head_dim
        self.vocab_size = may("vocab_size", maximum=INT32_MAX, limit="llama.cpp's token ids are int32")
        self.context_length = may("max_position_embeddings", maximum=U32_MAX)
        self.norm_eps = self.optional_hparam_float(list(self.norm_eps_keys), maximum=1.0)
        self.rope_theta = self._read_rope_theta() if self.has_rope else None
        if self.has_experts:
            self.n_expert = need(list(self.expert_count_keys), maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT)
            self.expert_count_key = self._origin_of(*self.expert_count_keys)
            self.n_expert_used = need(list(self.expert_used_keys), maximum=self.n_expert)
            self._check_expert_count()

    def _read_rope_theta(self) -> float | None:
        """``rope_parameters.rope_theta`` (transformers 5) or ``rope_theta``: a positive finite number (whether it
        fits the f32 it is written as is the writer's check)."""
        rope = self.hparams.get("rope_parameters")
        if isinstance(rope, dict) and rope.get("rope_theta") is not None:
            theta = config_float(rope, "rope_theta", where=self.config_path, maximum=sys.float_info.max,
                                 optional=True)
            return self.hparam_origin("rope_parameters.rope_theta", theta)
        return self._read("rope_theta", config_float(self.hparams, "rope_theta", where=self.config_path,
                                                     maximum=sys.float_info.max, optional=True))

    def _origin_of(self, *keys: str) -> str:
        """Which spelling of a hyperparameter config.json used (the first of ``keys`` it sets, else the first)."""
        return next((k for k in keys if self.hparams.get(k) is not None), keys[0])

    def _check_expert_count(self) -> None:
        """Refuse an expert count the head's own per-expert tensors do not bear out, before anything is sized by
        it (a config claiming 10^9 experts must not allocate 10^9 of anything). A head without per-expert
        tensors (packed experts, or none: :meth:`map_tensors` says) is not counted."""
        if self.expert_pattern is None:
            return
        present = {int(m["expert"]) for t in self.checkpoint.tensors
                   if t.startswith(self.tensor_prefix) and (m := self.expert_pattern.match(t)) is not None}
        if not present:
            return
        key, n = self.expert_count_key, self.n_expert
        beyond = max(present)
        if beyond >= n:
            raise CheckpointError(f"the MTP head holds expert {beyond}, but config.json {key} = {n} "
                                  f"(experts 0..{n - 1})", self.config_path)
        if len(present) != n:
            absent = [i for i in range(n) if i not in present]  # n <= LLAMA_MAX_EXPERTS
            shown = ", ".join(str(i) for i in absent[:5]) + (", ..." if len(absent) > 5 else "")
            raise CheckpointError(f"{key} = {n:,}, but the MTP head has tensors for {len(present)} experts "
                                  f"(none for experts {shown})", self.config_path)

    def find_hparam(self, keys: Sequence[str], optional: bool = False) -> Any:
        """The first of ``keys`` config.json has, unchecked (prefer :meth:`hparam_int` and friends).

        Raises:
            CheckpointError: none of them, unless ``optional``.
        """
        for key in keys:
            if key in self.hparams:
                return self.hparams[key]
        if optional:
            return None
        raise CheckpointError(f"config.json has none of {', '.join(keys)}", self.config_path)

    def hparam_int(self, keys: str | Sequence[str], *, minimum: int = 1, maximum: int = MAX_WIDTH,
                   limit: str | None = None) -> int:
        """A required integer hyperparameter, type- and range-checked (see :func:`config_int`)."""
        value = config_int(self.hparams, keys, where=self.config_path, minimum=minimum, maximum=maximum, limit=limit)
        assert value is not None
        return self._read(keys, value)

    def optional_hparam_int(self, keys: str | Sequence[str], *, minimum: int = 1, maximum: int = MAX_WIDTH,
                            limit: str | None = None) -> int | None:
        """An optional integer hyperparameter (``None`` when absent), checked like :meth:`hparam_int`."""
        return self._read(keys, config_int(self.hparams, keys, where=self.config_path, minimum=minimum,
                                           maximum=maximum, optional=True, limit=limit))

    def optional_hparam_float(self, keys: str | Sequence[str], *, above: float = 0.0,
                              maximum: float = 1e6) -> float | None:
        """An optional finite number hyperparameter (see :func:`config_float`)."""
        return self._read(keys, config_float(self.hparams, keys, where=self.config_path, above=above,
                                             maximum=maximum, optional=True))

    def optional_hparam_bool(self, key: str) -> bool | None:
        """An optional ``true``/``false`` hyperparameter (see :func:`config_bool`)."""
        return self._read(key, config_bool(self.hparams, key, where=self.config_path))

    def _read(self, keys: str | Sequence[str], value: _V) -> _V:
        """Remember that ``value`` came from the first of ``keys`` config.json sets (see :meth:`hparam_origin`)."""
        if value is not None:
            names = (keys,) if isinstance(keys, str) else tuple(keys)
            self.hparam_origin(next((k for k in names if self.hparams.get(k) is not None), names[0]), value)
        return value

    def hparam_origin(self, origin: str, value: _V) -> _V:
        """Record that ``value`` (a value, a list, or a product of several) is what config.json's ``origin``
        (``"rope_parameters.rope_theta"``, ``"linear_num_value_heads x linear_value_head_dim"``) gave; returns it.
        The typed readers record what they read; a family records what it reads or derives itself."""
        self._origins.append((origin, value))
        return value

    @contextlib.contextmanager
    def writing_config_values(self) -> Iterator[None]:
        """Metadata written inside this block that does not fit its GGUF type (:class:`KVValueError`, raised by the
        writer's one check) is refused with one line naming ``config.json`` and the key that gave the value.

        Raises:
            CheckpointError: ``<folder>/config.json: rope_parameters.rope_theta = 1e+39 cannot be written as
                qwen35.rope.freq_base (f32 holds at most 3.403e+38)``.
        """
        try:
            yield
        except KVValueError as e:
            origin = next((o for o, v in reversed(self._origins) if _gave(v, e.value)), None)
            if origin is None:
                message = f"{e.key} = {_shown(e.value)} (from config.json) does not fit: {e.reason}"
            else:
                value = next(v for o, v in reversed(self._origins) if o == origin)
                entry = f"entry {_shown(e.value)}: " if isinstance(value, (list, tuple)) else ""
                message = f"{origin} = {_shown(value)} cannot be written as {e.key} ({entry}{e.reason})"
            raise CheckpointError(message, self.config_path) from None

    def format_tensor_name(self, key: MODEL_TENSOR, suffix: str = ".weight", block: int = 0) -> str:
        """gguf-py's name for ``key`` with the block index left in: ``blk.{bid}.nextn.eh_proj.weight`` for the
        first NextN block, ``blk.{bid[k]}...`` for the ``block`` = k-th after it (see :class:`BlockIndex`)."""
        return at_block(TENSOR_NAMES[key] + suffix, block)

    def head_tensors(self) -> list[SafetensorsTensor]:
        """The checkpoint tensors of the MTP head, in natural order; in a block-scaled FP8 checkpoint its FP8 weights
        come paired with their scales (:mod:`.fp8`: read as dequantized float32), the scales themselves left out.

        Raises:
            CheckpointError: there are none; the checkpoint is quantized some other way (NVFP4, MXFP4, ...), or
                holds quantized tensors its ``quantization_config`` does not describe.
        """
        head = [t for t in self.checkpoint if t.name.startswith(self.tensor_prefix)]
        if not head:
            raise CheckpointError(
                f"no MTP head: no tensor name starts with {_either(self.tensor_prefix)} (no MTP layers in it?)",
                self.checkpoint.folder,
            )
        quant = quantization_of(self.hparams, self.config_path)
        if quant is not None:
            head = self.dequantize(head, quant)
        for tensor in head:
            if isinstance(tensor, BlockScaledTensor):
                continue
            sidecar = tensor.name.rsplit(".", 1)[-1] in _QUANT_SIDECARS
            if sidecar or tensor.dtype in QUANTIZED_DTYPES or tensor.dtype not in FLOAT_DTYPES:
                why = ("config.json's quantization_config (fp8) does not describe it" if quant is not None else
                       "a quantized tensor, and config.json has no quantization_config (only block-scaled FP8 "
                       "checkpoints are dequantized)")
                raise CheckpointError(f"tensor {tensor.name!r} is {tensor.dtype}: {why}; use the BF16 checkpoint",
                                      tensor.path)
        return head

    def dequantize(self, head: list[SafetensorsTensor], quant: BlockFP8) -> list[SafetensorsTensor]:
        """The head's tensors of a block-scaled FP8 checkpoint, FP8 weights paired with their scales
        (:func:`.fp8.dequantized_head`); a family whose checkpoints lay some scales out otherwise overrides it."""
        return dequantized_head(head, quant, self.checkpoint.tensors)

    @functools.cached_property
    def auto_outtype(self) -> GGMLQuantizationType:
        """The matrix type of dequantized (FP8) tensors when none is asked for: llama.cpp's ``--outtype auto`` rule,
        the dtype of the checkpoint's first tensor of two or more dimensions that is BF16 or F16, else F16 (the real
        FP8 releases keep embeddings and routers in BF16: BF16)."""
        for tensor in self.checkpoint:
            if len(tensor.shape) >= 2 and tensor.dtype in ("BF16", "F16"):
                return Q.BF16 if tensor.dtype == "BF16" else Q.F16
        return Q.F16

    def map_tensors(self) -> list[tuple[str, TensorSource]]:
        """Every head tensor under its GGUF name (``{bid}`` unformatted), in the family's output order,
        checked against config.json: nothing missing, nothing unknown or duplicated, shapes as implied.

        Raises:
            CheckpointError: one line naming the tensor and the problem.
        """
        expected = self.expected_shapes()
        mapped: dict[str, TensorSource] = {}
        self.begin_tensors()
        for tensor in self.head_tensors():
            for name, source in self.modify_tensors(tensor):
                if name in mapped:
                    raise CheckpointError(
                        f"{', '.join(source.names[:1])} and {mapped[name].names[0]} both map to {shown_name(name)}",
                        tensor.path,
                    )
                mapped[name] = source
        self.finish_tensors()
        unknown = [n for n in mapped if n not in expected]
        if unknown:
            raise CheckpointError(f"{self.arch}: no NextN tensor {shown_name(unknown[0])} is expected",
                                  mapped[unknown[0]].parts[0].path)
        missing = [n for n in expected if n not in mapped]
        if missing:
            raise CheckpointError(
                f"the MTP head lacks {len(missing)} tensor(s) llama.cpp needs, e.g. {shown_name(missing[0])}",
                self.checkpoint.folder,
            )
        for name, shape in expected.items():
            source = mapped[name]
            if source.shape != shape:
                what = source.names[0]
                if len(source.parts) > 1:
                    what = f"{len(source.parts)} stacked tensors like {what}"
                raise CheckpointError(
                    f"{what} has shape {list(source.shape)}, config.json implies {list(shape)} "
                    f"(for {shown_name(name)})",
                    source.parts[0].path,
                )
        return [(name, mapped[name]) for name in expected]

    def output_type(
        self, name: str, source: TensorSource, outtype: GGMLQuantizationType | None
    ) -> GGMLQuantizationType:
        """llama.cpp's type rule: 1-D tensors, norms, the router (``ffn_gate_inp``) and anything not named
        ``*.weight`` in F32; other matrices in ``outtype``, by default the source dtype (F64 becomes F32; FP8, and a
        float weight an FP8 checkpoint scales, become :attr:`auto_outtype`).

        A type llama.cpp's converter does not offer (``q4_k``, ``iq4_xs``...) is what ``llama-quantize --pure``
        gives the tensor of that default conversion (:func:`~gguf_mtp.format.quant_rules.head_tensor_type`)."""
        if outtype is not None and outtype not in CONVERTER_TYPES:
            default = self.output_type(name, source, None)
            ggml_shape = tuple(reversed(source.shape)) or (1,)
            return head_tensor_type(name.format(bid=0), ggml_shape, default, outtype, self.arch)
        router = self.format_tensor_name(MODEL_TENSOR.FFN_GATE_INP)
        is_router = first_block_template(name) == router
        if len(source.shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") or is_router:
            return Q.F32
        if outtype is None:
            dequantized = source.dtype in FP8_DTYPES or isinstance(source.parts[0], BlockScaledTensor)
            outtype = self.auto_outtype if dequantized else FLOAT_DTYPES.get(source.dtype) or Q.F32
        block_size, _ = GGML_QUANT_SIZES[outtype]
        if source.shape[-1] % block_size:
            # What llama.cpp's converter does when a row does not split into quant blocks.
            note = (f"{shown_name(name)}: rows of {source.shape[-1]} do not split into {outtype.name} blocks of "
                    f"{block_size}; written as F16")
            if note not in self.notes:
                self.notes.append(note)
            return Q.F16
        return outtype

    def check_target(self, target: ShardSet) -> None:
        """Refuse a target the head does not belong to: another architecture, or a hyperparameter of
        :meth:`target_checks` that differs (per-layer arrays are compared on their non-zero entries).

        Raises:
            IncompatibleDraftError: one line naming the key and both values.
        """
        if target.arch != self.arch:
            raise IncompatibleDraftError(
                f"target architecture is {target.arch!r}; this {', '.join(self.hf_architectures)} head converts to "
                f"{self.arch!r}",
                target.name,
            )
        for check in self.target_checks():
            key = f"{self.arch}.{check.key}"
            if check.key == "vocab_size":
                vocab = vocab_size(target)
                stated = [vocab] if vocab is not None else []
            else:
                kv = target.kv(key)
                if kv is None:
                    continue
                stated = [v for v in layer_array(kv, target.name)[1] if v] if kv.is_array else [kv.value]
            wrong = sorted({v for v in stated if v != check.value})
            if wrong:
                raise IncompatibleDraftError(
                    f"the head has {check.key} = {check.value} (config.json {check.config_key}), the target "
                    f"{wrong[0] if len(wrong) == 1 else wrong}: they are not the same model",
                    target.name,
                )

    def layer_arrays(self, block: int, target: ShardSet | None) -> dict[str, tuple[GGUFValueType, list[Any]]]:
        """The per-layer arrays of a draft whose first NextN block is ``block``: ``{arch}.`` suffix ->
        (element type, ``block + n_nextn`` entries), the NextN blocks' entries last.

        Trunk entries come from the target's own arrays when given (element types kept), else from
        config.json's layer pattern when it describes ``block`` blocks, else zeros (compose only reads
        the NextN entry). Every per-layer array of the target is covered.

        Raises:
            IncompatibleDraftError: the target has a per-layer array whose NextN value is unknown here.
        """
        per_block = [self.nextn_block_values(offset) for offset in range(self.n_nextn)]
        nextn = per_block[0]
        arrays: dict[str, tuple[GGUFValueType, list[Any]]] = {}
        trunk = self.trunk_layer_values(block) or {}
        for suffix in self.own_layer_arrays():
            entries = [values[suffix] for values in per_block]
            etype = GGUFValueType.get_type(entries[0])
            zero = type(entries[0])()  # 0, 0.0 or False where config.json gives no trunk entries
            arrays[suffix] = (etype, [*trunk.get(suffix, [zero] * block), *entries])
        if target is not None:
            for kv in per_layer_keys(target.first, self.arch, target.block_count):
                suffix = kv.key[len(self.arch) + 1 :]
                if suffix not in nextn:
                    raise IncompatibleDraftError(
                        f"the target has a per-layer array {kv.key}, and the {self.arch} converter does not know its "
                        "value for the NextN block",
                        target.name,
                    )
                etype, entries = layer_array(kv, target.name)
                arrays[suffix] = (etype, [*entries, *(values[suffix] for values in per_block)])
        return arrays

    def mapped_tensors(self, block: int, outtype: GGMLQuantizationType | None) -> list[MappedTensor]:
        """:meth:`map_tensors` with the block indices filled in (``block`` the first NextN block's) and the output
        types chosen."""
        first = BlockIndex(block)
        quantized = outtype is not None and outtype not in CONVERTER_TYPES  # llama-quantize's type, on the default
        return [
            MappedTensor(name.format(bid=first), source, self.output_type(name, source, outtype),
                         self.output_type(name, source, None) if quantized else None)
            for name, source in self.map_tensors()
        ]


@dataclass
class ExpertStack:
    """The experts of one projection, collected until all are present (they may arrive in any order);
    only their descriptions are held, never their data."""

    count: int
    parts: dict[int, SafetensorsTensor] = field(default_factory=dict)

    def add(self, index: int, tensor: SafetensorsTensor) -> TensorSource | None:
        if not 0 <= index < self.count:
            raise CheckpointError(f"{tensor.name}: expert {index} is outside 0..{self.count - 1} (config.json)",
                                  tensor.path)
        self.parts[index] = tensor
        if len(self.parts) < self.count:
            return None
        return TensorSource.stack([self.parts[i] for i in sorted(self.parts)])

    def missing(self, limit: int = 6) -> list[int]:
        """Up to ``limit`` expert indices not seen (the count is bounded by config validation anyway)."""
        return list(itertools.islice((i for i in range(self.count) if i not in self.parts), limit))

    @property
    def n_missing(self) -> int:
        return self.count - len(self.parts)

