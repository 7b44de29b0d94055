"""Multi-head latent attention's ``kv_b_proj`` split, as llama.cpp's converter does it (conversion/deepseek.py,
conversion/bailingmoe3.py): the ``[n_head * (qk_nope + v_head), kv_lora_rank]`` projection becomes

* ``attn_k_b``: each head's ``qk_nope`` rows, **transposed**, stacked: ``[n_head, kv_lora_rank, qk_nope]``;
* ``attn_v_b``: each head's ``v_head`` rows as they are, stacked: ``[n_head, v_head, kv_lora_rank]``.

Nothing is materialised: ``attn_v_b`` is a stack of row ranges of the file (copied by the kernel when no type
changes; a block-scaled FP8 slice keeps its scale rows), ``attn_k_b`` a stack of one head's transposed block at a
time (``qk_nope x kv_lora_rank`` values). Used by every MLA family (deepseek2, bailingmoe3).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import SafetensorsTensor

from .tensors import TensorSource

__all__ = ["TransposedTensor", "split_kv_b"]


@dataclass(frozen=True)
class TransposedTensor(SafetensorsTensor):
    """A matrix read transposed (``source`` ``[r, c]`` -> ``[c, r]``), as float32: one head of ``attn_k_b``. The
    source is small (``nope x kv_lora``) and is read whole for each run of rows."""

    source: SafetensorsTensor | None = None
    transformed: ClassVar[bool] = True

    @classmethod
    def of(cls, source: SafetensorsTensor, name: str) -> TransposedTensor:
        rows, cols = source.shape
        return cls(name, source.dtype, (cols, rows), source.path, source.offset, source.nbytes, source=source)

    @property
    def numpy_dtype(self) -> np.dtype:
        assert self.source is not None
        return self.source.numpy_dtype

    def numpy(self) -> np.ndarray:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return self.read_rows(fd, 0, self.n_rows).reshape(self.shape)
        finally:
            os.close(fd)

    def read_rows(self, fd: int, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        assert self.source is not None
        raw = self.source.read_rows(fd, 0, self.source.n_rows).reshape(self.source.shape)
        if raw.dtype == np.uint16 and self.source.dtype == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        values = raw.astype(np.float32, copy=False)
        return np.ascontiguousarray(values.T[start : start + count])


def split_kv_b(kv_b: SafetensorsTensor, n_head: int, qk_nope: int, v_head: int,
               what: str = "[n_head x (qk_nope + v_head), kv_lora_rank]") -> tuple[TensorSource, TensorSource]:
    """(``attn_k_b``, ``attn_v_b``) of an MLA ``kv_b_proj`` (see the module docstring).

    Raises:
        CheckpointError: its shape is not ``[n_head * (qk_nope + v_head), kv_lora_rank]`` (``what`` names the
            config keys that say so).
    """
    per_head = qk_nope + v_head
    if len(kv_b.shape) != 2 or kv_b.shape[0] != n_head * per_head:
        raise CheckpointError(f"{kv_b.name} has shape {list(kv_b.shape)}, config.json implies "
                              f"[{n_head * per_head}, kv_lora_rank] {what}", kv_b.path)
    k_b = [TransposedTensor.of(kv_b.rows(h * per_head, qk_nope, f"{kv_b.name}[{h}].k"), f"{kv_b.name}[{h}].k^T")
           for h in range(n_head)]
    v_b = [kv_b.rows(h * per_head + qk_nope, v_head, f"{kv_b.name}[{h}].v") for h in range(n_head)]
    return TensorSource.stack(k_b), TensorSource.stack(v_b)
