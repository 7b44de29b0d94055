"""Block-scaled FP8 sources (``quantization_config.quant_method == "fp8"``: DeepSeek V3/R1/V3.1/V3.2, GLM-5.x,
MiMo-V2), dequantized as llama.cpp's converter does, without torch.

A quantized linear ``X.weight`` is stored ``F8_E4M3`` (or ``F8_E5M2``) next to ``X.weight_scale_inv``, one scale
per ``weight_block_size`` block (``[128, 128]``), F32 or BF16; the last block of a dimension that is not a multiple
of the block size is partial. llama.cpp's ``dequant_simple`` (``conversion/base.py``, ``dequant_model``) repeats each
scale over its block, trims the repeat to the weight's shape, and returns ``weight.float() * scale.float()``: here
the same float32 product is computed a bounded run of rows at a time (:class:`BlockScaledTensor`), so a tensor (an
expert of a stack) is never materialised whole. FP8 values are widened through a 256-entry table made with
``ml_dtypes`` (the numpy float8 types JAX uses); every finite value, infinity and zero is exact, and NaN codes keep
their mantissa bits in the float32 payload as torch's widening does (the table equals torch's for all 256 codes).
The dequantized float32 rows then take the same path
as any float source (gguf-py's ``quants.quantize`` to BF16, F16 or Q8_0), which is what llama.cpp's converter writes
them with.

As upstream, a scale applies whatever its weight's dtype: a ``X.weight_scale_inv`` next to a weight stored BF16
(F16, F32) scales it too (llama.cpp's ``dequant_model`` multiplies every ``X.weight`` that has one). Tensors
without a scale (``ignored_layers``, ``modules_to_not_convert``, norms, the router, embeddings) are ordinary BF16
tensors and pass as they are; activation scales are not weights and are dropped.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import SafetensorsTensor

__all__ = [
    "FP8_DTYPES",
    "BlockFP8",
    "BlockScaledTensor",
    "dequantized_head",
    "fp8_lut",
    "quantization_of",
]

#: safetensors FP8 dtypes this module widens, and their ``ml_dtypes`` names.
FP8_DTYPES = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
#: Scale dtypes of ``weight_scale_inv``.
_SCALE_DTYPES = ("F32", "BF16")
#: Float dtypes a scale also applies to (as llama.cpp's converter applies it: ``weight.float() * scale``).
_SCALED_FLOAT_DTYPES = ("BF16", "F16", "F32")
#: Suffixes of tensors that are not weights (static activation scales): dropped, as llama.cpp's converter drops them.
_ACTIVATION_SCALES = (".activation_scale", "_activation_scale", ".input_scale")
_SCALE_SUFFIX = "_scale_inv"
#: The largest block side accepted from config.json (real checkpoints use 128).
_MAX_BLOCK = 1 << 16


@dataclass(frozen=True)
class BlockFP8:
    """A checkpoint's FP8 quantization: ``block`` is ``weight_block_size`` (rows, columns), or ``None`` for scales
    that are per tensor or per row (broadcast as llama.cpp broadcasts them)."""

    block: tuple[int, int] | None


def quantization_of(config: dict[str, Any], where: str | os.PathLike[str]) -> BlockFP8 | None:
    """The quantization a ``config.json`` declares: ``None`` for none, :class:`BlockFP8` for ``fp8``.

    Raises:
        CheckpointError: another method (NVFP4, MXFP4, compressed-tensors, GPTQ, ...) named in one line, or a
            malformed ``weight_block_size``.
    """
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise CheckpointError("quantization_config is not a JSON object", where)
    method = quant.get("quant_method")
    if method != "fp8":
        algo = quant.get("quant_algo")
        named = f"{method!r:.40}" + (f" ({algo!r:.20})" if algo is not None else "")
        raise CheckpointError(f"quantization_config.quant_method = {named}: only block-scaled FP8 (\"fp8\") "
                              "checkpoints are dequantized; use the BF16 checkpoint", where)
    block = quant.get("weight_block_size")
    if block is None:
        return BlockFP8(None)
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= _MAX_BLOCK for b in block)):
        raise CheckpointError(f"quantization_config.weight_block_size = {block!r:.40} is not two block sides "
                              f"(1..{_MAX_BLOCK})", where)
    return BlockFP8((block[0], block[1]))


@functools.cache
def fp8_lut(dtype: str) -> np.ndarray:
    """float32 value of each of the 256 codes of an FP8 ``dtype`` (``"F8_E4M3"``): ml_dtypes' widening, with NaN
    codes given the payload torch's widening gives them (quiet bit set, the FP8 mantissa in the float32 mantissa's
    top bits), so that the table equals torch's bit for bit for all 256 codes."""
    try:
        import ml_dtypes  # only FP8 sources need it
    except ImportError:
        raise CheckpointError(f"dequantizing {dtype} needs the ml_dtypes package (a dependency of gguf-mtp: "
                              "pip install 'ml_dtypes>=0.5')") from None

    codes = np.arange(256, dtype=np.uint8)
    values: np.ndarray = codes.view(getattr(ml_dtypes, FP8_DTYPES[dtype])).astype(np.float32)
    mantissa_bits = 3 if dtype == "F8_E4M3" else 2
    nan = np.isnan(values)
    mantissa = (codes.astype(np.uint32) & ((1 << mantissa_bits) - 1)) << (23 - mantissa_bits)
    sign = (codes.astype(np.uint32) >> 7) << 31
    bits = values.view(np.uint32).copy()
    bits[nan] = sign[nan] | np.uint32(0x7FC00000) | mantissa[nan]
    table: np.ndarray = bits.view(np.float32)
    return table


def _as_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements of ``dtype`` (FP8 codes, BF16 bits, F16, F32) as float32, exactly (torch's ``.float()``)."""
    if dtype in FP8_DTYPES:
        values: np.ndarray = fp8_lut(dtype)[raw]
        return values
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(raw, dtype=np.float32)


def _scale_f32(scale: SafetensorsTensor) -> np.ndarray:
    return _as_f32(scale.numpy(), scale.dtype)


@dataclass(frozen=True)
class BlockScaledTensor(SafetensorsTensor):
    """A scaled weight read as ``float32(weight) * scale`` of its block (llama.cpp's ``dequant_simple``): FP8, or a
    float weight that has a scale too. ``dtype`` stays the stored one (``F8_E4M3``, ``BF16``); it is never copied as
    it is stored; rows come back as float32."""

    scale: SafetensorsTensor | None = None
    block: tuple[int, int] | None = None
    #: The row of the quantized weight this tensor starts at (a slice of it: the scale rows are the weight's).
    first_row: int = 0
    transformed: ClassVar[bool] = True

    def rows(self, start: int, count: int, name: str) -> BlockScaledTensor:
        part = super().rows(start, count, name)
        assert isinstance(part, BlockScaledTensor)
        return replace(part, first_row=self.first_row + start)

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.dtype in FP8_DTYPES else super().numpy_dtype

    def numpy(self) -> np.ndarray:
        """The dequantized values, float32 (whole: for small tensors and tests)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return self.read_rows(fd, 0, self.n_rows).reshape(self.shape)
        finally:
            os.close(fd)

    def read_rows(self, fd: int, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        raw = super().read_rows(fd, start, count, None).reshape(count, self.row_size)
        values = _as_f32(raw, self.dtype)
        assert self.scale is not None
        scale = _scale_f32(self.scale)
        if self.block is None:
            while scale.ndim < 2:  # [rows] -> [rows, 1], [] -> [1, 1]: broadcast as torch does
                scale = scale[..., None]
            first = self.first_row + start
            rows = scale if scale.shape[0] == 1 else scale[first : first + count]
            scaled: np.ndarray = values * rows
            return scaled
        b0, b1 = self.block
        per_row = scale[np.arange(self.first_row + start, self.first_row + start + count) // b0]
        scaled = values * np.repeat(per_row, b1, axis=1)[:, : self.row_size]
        return scaled


def _expected_scale_shape(weight: SafetensorsTensor, block: tuple[int, int] | None) -> Sequence[tuple[int, ...]]:
    if block is None:
        return [(), (1,), (weight.shape[0],), (weight.shape[0], 1), (1, 1)]
    return [tuple(math.ceil(n / b) for n, b in zip(weight.shape, block))]


def dequantized_head(tensors: list[SafetensorsTensor], quant: BlockFP8,
                     all_tensors: Mapping[str, SafetensorsTensor]) -> list[SafetensorsTensor]:
    """``tensors`` (a head's, in order) with every FP8 weight, and every float weight that has a scale too, paired
    with its ``weight_scale_inv`` (looked up in ``all_tensors``: it may sit in another shard) as a
    :class:`BlockScaledTensor`, and scales and activation scales left out. Other tensors are returned as they are.

    Raises:
        CheckpointError: an FP8 weight without its scale, a scale without its weight or of the wrong shape or dtype,
            a scaled tensor that is not a matrix.
    """
    names = {t.name for t in tensors}
    result: list[SafetensorsTensor] = []
    for tensor in tensors:
        if tensor.name.endswith(_ACTIVATION_SCALES):
            continue
        if tensor.name.endswith(_SCALE_SUFFIX):
            if tensor.name.removesuffix(_SCALE_SUFFIX) not in names:
                raise CheckpointError(f"{tensor.name} scales no tensor of the checkpoint", tensor.path)
            continue
        scale = all_tensors.get(tensor.name + _SCALE_SUFFIX)
        fp8 = tensor.dtype in FP8_DTYPES
        if not fp8 and (scale is None or tensor.dtype not in _SCALED_FLOAT_DTYPES):
            result.append(tensor)
            continue
        kind = "FP8" if fp8 else f"scaled {tensor.dtype}"
        if fp8:
            fp8_lut(tensor.dtype)  # at planning time: a missing ml_dtypes is said before anything is written
        if scale is None:
            raise CheckpointError(f"FP8 tensor {tensor.name!r} has no {tensor.name}{_SCALE_SUFFIX}", tensor.path)
        if len(tensor.shape) != 2:
            raise CheckpointError(f"{kind} tensor {tensor.name!r} has shape {list(tensor.shape)}: only matrices are "
                                  "dequantized", tensor.path)
        if scale.dtype not in _SCALE_DTYPES or scale.shape not in _expected_scale_shape(tensor, quant.block):
            wanted = " or ".join(str(list(s)) for s in _expected_scale_shape(tensor, quant.block)[:2])
            raise CheckpointError(f"{scale.name} is {scale.dtype} {list(scale.shape)}; {tensor.name} "
                                  f"{list(tensor.shape)} in blocks of {list(quant.block or ())} needs F32 or BF16 "
                                  f"{wanted}", scale.path)
        result.append(BlockScaledTensor(tensor.name, tensor.dtype, tensor.shape, tensor.path, tensor.offset,
                                        tensor.nbytes, scale=scale, block=quant.block))
    return result
