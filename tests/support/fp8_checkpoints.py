"""Block-scaled FP8 copies of the tiny BF16 checkpoints, laid out as DeepSeek / Qwen FP8 releases are.

:func:`quantize_checkpoint` rewrites every shard of a checkpoint folder: each linear weight (a 2-D ``*.weight`` that is
not a norm, an embedding, an LM head or a router) becomes ``F8_E4M3`` (or ``F8_E5M2``) with a
``*.weight_scale_inv`` of ``ceil(rows/b0) x ceil(cols/b1)`` block scales next to it (F32, or BF16), the index
lists the scales, and ``config.json`` gets ``quantization_config: {"quant_method": "fp8", "weight_block_size": ...}``.
The quantizer is the usual one (a block's scale is its largest magnitude over the format's largest value); only
the result's layout matters to the tests, which dequantize it independently.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from support.convert_support import read_raw_safetensors, write_raw_safetensors

__all__ = ["FP8_MAX", "dequantize_reference", "is_linear", "quantize_checkpoint"]

FP8_MAX = {"F8_E4M3": 448.0, "F8_E5M2": 57344.0}
_ML = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
_NOT_QUANTIZED = ("norm", "embed_tokens", "lm_head", "shared_head.head", "mlp.gate.weight", "shared_expert_gate",
                  "e_score_correction")


def is_linear(name: str, shape: list[int]) -> bool:
    """Whether a tensor is quantized in the FP8 releases (linear weights; not norms, embeddings, heads, routers)."""
    return len(shape) == 2 and name.endswith(".weight") and not any(part in name for part in _NOT_QUANTIZED)


def _bf16_to_f32(raw: bytes, shape: list[int]) -> np.ndarray:
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def _quantize(values: np.ndarray, block: tuple[int, int], fp8: str) -> tuple[bytes, np.ndarray]:
    rows, cols = values.shape
    b0, b1 = block
    scales = np.ones((math.ceil(rows / b0), math.ceil(cols / b1)), np.float32)
    codes = np.empty(values.shape, _ML[fp8])
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = values[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1]
            amax = float(np.abs(tile).max())
            scale = np.float32(amax / FP8_MAX[fp8]) if amax else np.float32(1)
            scales[i, j] = scale
            codes[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = (tile / scale).astype(_ML[fp8])
    return codes.view(np.uint8).tobytes(), scales


def dequantize_reference(codes: bytes, shape: tuple[int, ...], scales: np.ndarray, block: tuple[int, int],
                         fp8: str = "F8_E4M3") -> np.ndarray:
    """``weight.float() * scale`` with the scale repeated per block and trimmed (llama.cpp's ``dequant_simple``),
    written out plainly for the tests."""
    values = np.frombuffer(codes, np.uint8).view(_ML[fp8]).astype(np.float32).reshape(shape)
    full = np.repeat(np.repeat(scales.astype(np.float32), block[0], axis=0), block[1], axis=1)
    return values * full[: shape[0], : shape[1]]


def quantize_checkpoint(src: Path, dst: Path, *, block: tuple[int, int] = (128, 128), fp8: str = "F8_E4M3",
                        scale_dtype: str = "F32", quantized: Callable[[str, list[int]], bool] = is_linear) -> Path:
    """Copy checkpoint folder ``src`` to ``dst`` with its linear weights FP8 block-quantized; returns ``dst``."""
    shutil.copytree(src, dst)
    index_path = dst / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    for path in sorted(dst.glob("*.safetensors")):
        entries: dict[str, tuple[str, list[int], bytes]] = {}
        for name, (dtype, shape, raw) in read_raw_safetensors(path).items():
            if dtype != "BF16" or not quantized(name, shape):
                entries[name] = (dtype, shape, raw)
                continue
            codes, scales = _quantize(_bf16_to_f32(raw, shape), block, fp8)
            entries[name] = (fp8, shape, codes)
            scale_raw = (scales.tobytes() if scale_dtype == "F32"
                         else (scales.view(np.uint32) >> 16).astype(np.uint16).tobytes())
            entries[name + "_scale_inv"] = (scale_dtype, list(scales.shape), scale_raw)
            if index is not None:
                index["weight_map"][name + "_scale_inv"] = path.name
        write_raw_safetensors(path, entries)
    if index is not None:
        index_path.write_text(json.dumps(index, indent=2))
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3" if fp8 == "F8_E4M3" else "e5m2",
                                     "activation_scheme": "dynamic", "weight_block_size": list(block)}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst
