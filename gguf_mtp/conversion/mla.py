"""Multi-head latent attention's ``kv_b_proj`` split, as llama.cpp's converter does it (conversion/deepseek.py,
conversion/bailingmoe3.py:174-186): the ``[n_head * (qk_nope + v_head), kv_lora_rank]`` projection becomes

* ``attn_k_b``: each head's ``qk_nope`` rows, **transposed**, stacked: ``[n_head, kv_lora_rank, qk_nope]``;
* ``attn_v_b``: each head's ``v_head`` rows as they are, stacked: ``[n_head, v_head, kv_lora_rank]``.

Nothing is materialised: ``attn_v_b`` is a stack of row ranges of the file (copied by the kernel when no type
changes), ``attn_k_b`` a stack of one head's transposed block at a time (``qk_nope x kv_lora_rank`` values).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from gguf_mtp.errors import CheckpointError

from .base import TensorSource
from .safetensors_io import SAFETENSORS_DTYPES, SafetensorsTensor

__all__ = ["HeadRows", "split_kv_b"]


@dataclass(frozen=True)
class HeadRows(SafetensorsTensor):
    """Rows ``first_row ..`` of ``base`` (one head's part of ``kv_b_proj``), transposed when ``transposed``: read
    through ``base`` (so a block-scaled FP8 ``base`` is dequantized first), never copied as stored."""

    base: SafetensorsTensor | None = None
    first_row: int = 0
    transposed: bool = False

    @property
    def stored_as_is(self) -> bool:
        return False

    def _source_rows(self) -> int:
        return self.shape[-1] if self.transposed else self.shape[0]

    def read_rows(self, fd: int, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        assert self.base is not None
        block = self.base.read_rows(fd, self.first_row, self._source_rows(), None)
        if self.transposed:
            block = block.T
        return np.ascontiguousarray(block[start : start + count])

    def numpy(self) -> np.ndarray:
        """The values (whole: one head's block is small)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return self.read_rows(fd, 0, self.n_rows).reshape(self.shape)
        finally:
            os.close(fd)


def _rows(kv_b: SafetensorsTensor, first: int, count: int, *, transposed: bool) -> SafetensorsTensor:
    width = kv_b.shape[1]
    name = f"{kv_b.name}[{first}:{first + count}]" + (".T" if transposed else "")
    if not transposed and kv_b.stored_as_is and kv_b.dtype in SAFETENSORS_DTYPES and type(kv_b) is SafetensorsTensor:
        itemsize = SAFETENSORS_DTYPES[kv_b.dtype].itemsize
        return replace(kv_b, name=name, shape=(count, width), offset=kv_b.offset + first * width * itemsize,
                       nbytes=count * width * itemsize)
    shape = (width, count) if transposed else (count, width)
    return HeadRows(name=name, dtype=kv_b.dtype, shape=shape, path=kv_b.path, offset=kv_b.offset,
                    nbytes=kv_b.nbytes * count // max(kv_b.shape[0], 1), base=kv_b, first_row=first,
                    transposed=transposed)


def split_kv_b(kv_b: SafetensorsTensor, n_head: int, qk_nope: int, v_head: int) -> tuple[TensorSource, TensorSource]:
    """(``attn_k_b``, ``attn_v_b``) of an MLA ``kv_b_proj`` (see the module docstring).

    Raises:
        CheckpointError: its shape is not ``[n_head * (qk_nope + v_head), kv_lora_rank]``.
    """
    per_head = qk_nope + v_head
    if len(kv_b.shape) != 2 or kv_b.shape[0] != n_head * per_head:
        raise CheckpointError(f"{kv_b.name} has shape {list(kv_b.shape)}, config.json implies "
                              f"[{n_head} x ({qk_nope} + {v_head}), kv_lora_rank]", kv_b.path)
    k_b = [_rows(kv_b, h * per_head, qk_nope, transposed=True) for h in range(n_head)]
    v_b = [_rows(kv_b, h * per_head + qk_nope, v_head, transposed=False) for h in range(n_head)]
    return TensorSource.stack(k_b), TensorSource.stack(v_b)
