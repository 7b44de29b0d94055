"""A mapped tensor's output bytes as write segments: kernel copies where the bytes pass unchanged, generated chunks
(converted or quantized a bounded run of rows at a time) where they do not."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from gguf_mtp.errors import CheckpointError
from gguf_mtp.files.plan import CopyRange, Generated, Segment
from gguf_mtp.format.header import tensor_nbytes
from gguf_mtp.format.quantize import InvalidRowsError, converter_rows, from_f32, row_runs, to_f32
from gguf_mtp.format.safetensors_io import SafetensorsTensor

from .tensors import FLOAT_DTYPES, MappedTensor

__all__ = ["CHUNK_BYTES", "tensor_segments"]

#: Bytes of float32 working memory per converted chunk (memory stays flat whatever the tensor size).
CHUNK_BYTES = 16 * 1024 * 1024

def _to_f32(rows: np.ndarray, dtype: str) -> np.ndarray:
    if rows.dtype == np.float32:
        return rows  # a transformed view's values (dequantized, transposed): float32 already
    if dtype == "BF16":
        # BF16 is the upper half of an IEEE float32: widening is a 16-bit shift, exact.
        return (rows.astype(np.uint32) << 16).view(np.float32)
    return rows.astype(np.float32, copy=False)


@dataclass(frozen=True)
class _PartImportance:
    """Where a part's rows lie in its tensor (from row ``first_row``) and the tensor's imatrix rows, one per expert
    of ``rows_per_expert`` rows."""

    importance: np.ndarray
    first_row: int
    rows_per_expert: int


def _converted_chunks(part: SafetensorsTensor, qtype: GGMLQuantizationType, chunk_bytes: int, checked: bool = False,
                      rounded_to: GGMLQuantizationType | None = None,
                      weights: _PartImportance | None = None) -> Iterator[np.ndarray]:
    """``part`` converted to ``qtype``, a bounded run of rows at a time (rows are whole quant blocks): as llama.cpp's
    converter writes it, or (``checked``) as llama-quantize writes the converter's output of it, the values rounded
    to ``rounded_to`` first (see :attr:`MappedTensor.rounded_to`) and refused where llama-quantize refuses them, with
    ``weights`` as llama-quantize --imatrix quantizes them. A chunk may share memory with the next one: consume it
    before asking for the next.

    Raises:
        CheckpointError: (``checked``) a row holds a NaN or an infinity, or overflows ``qtype``; one line naming
            the tensor.
    """
    rows_per_chunk = max(1, chunk_bytes // max(1, part.row_size * 4))
    row_size = part.row_size or 1
    buffer: np.ndarray | None = None
    first_row = weights.first_row if weights is not None else 0
    per_expert = weights.rows_per_expert if weights is not None else max(1, part.n_rows)
    fd = os.open(part.path, os.O_RDONLY)
    try:
        for expert, row, count in row_runs(first_row, part.n_rows, rows_per_chunk, per_expert):
            start = row - first_row
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
                yield from_f32(values, qtype, checked=True,
                               importance=None if weights is None else weights.importance[expert])
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


def tensor_segments(
    tensor: MappedTensor, *, chunk_bytes: int = CHUNK_BYTES, importance: np.ndarray | None = None
) -> list[Segment]:
    """The output bytes of ``tensor`` as segments: kernel copies where the bytes pass unchanged (same
    type in and out), generated chunks where they are converted or quantized; part after part. ``importance``: the
    tensor's imatrix rows, one per expert (``(ne2, ne0)``), for a tensor written by llama-quantize's rules."""
    segments: list[Segment] = []
    shape = tensor.source.ggml_shape
    rows_per_expert = max(1, shape[1] if len(shape) > 2 else sum(part.n_rows for part in tensor.source.parts))
    first_row = 0
    for part in tensor.source.parts:
        if not part.transformed and FLOAT_DTYPES.get(part.dtype) == tensor.ggml_type:
            segments.append(CopyRange(part.path, part.offset, part.nbytes))
        else:
            nbytes = tensor_nbytes(tuple(reversed(part.shape)) or (1,), tensor.ggml_type)
            weights = None if importance is None else _PartImportance(importance, first_row, rows_per_expert)
            chunks = functools.partial(_converted_chunks, part, tensor.ggml_type, chunk_bytes, tensor.via is not None,
                                       tensor.rounded_to, weights)
            segments.append(Generated(nbytes, chunks))
        first_row += part.n_rows
    return _merge_copies(segments)

