"""Tensor bytes in another ggml type, through llama.cpp's own quantizer, a bounded run of rows at a time.

The arithmetic is ggml's, never ours: the ``ggml-base`` library llama-cpp-python ships (the ``llama`` extra), or
the chosen llama.cpp build's (:mod:`gguf_mtp.llama_build`: ``--llama-cpp``), quantizes with ``ggml_quantize_chunk``
and dequantizes with the type's ``to_float``, as llama-quantize does (``llama_tensor_dequantize_impl`` /
``llama_tensor_quantize_impl``), rows split over a pool of threads sized once to the CPUs that are free
(:func:`~gguf_mtp.constants.free_cores`: the CPUs this process may use less the load average, so a busy machine is
not oversubscribed; ctypes releases the GIL, and ``ggml_quantize_chunk`` runs on the calling thread only). BF16 and
F16 widen to F32 exactly (``ggml_bf16_to_fp32`` is a shift). Without the extra, gguf-py's numpy quantizers (written
to match ggml's reference code) serve F32, F16, BF16, Q8_0, Q5_1, Q5_0, Q4_1 and Q4_0; any other type says what to
install.

What llama-quantize refuses is refused here too (``from_f32(..., checked=True)``, :class:`InvalidRowsError`):
it loads every tensor with ``check_tensors`` (a NaN or an infinity: "tensor ... has invalid data") and
validates every chunk it writes with ``ggml_validate_row_data`` (a block scale that overflows: "quantized
data validation failed"). llama.cpp's converter refuses neither: :func:`converter_rows` writes what it writes.

With an importance matrix (``importance``: one row of column weights per expert, what llama-quantize
``--imatrix`` reads, :mod:`gguf_mtp.format.imatrix`) each expert's rows go to ``ggml_quantize_chunk`` with its
own row, in runs that never cross an expert, as ``llama_tensor_quantize_impl`` does; the types that need one
(``ggml_quantize_requires_imatrix``) are written only then.

Memory stays flat: a tensor (or an expert stack, whose slices are rows like any other) is read, converted
and handed on :data:`CHUNK_BYTES` of float32 at a time. :func:`retyped_tensor` gives the plan's view of
one tensor: a kernel copy where the type does not change, a generated segment where it does.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_mtp.constants import free_cores, install_hint
from gguf_mtp.errors import BadGGUFError
from gguf_mtp.files.plan import CopyRange, Generated, Segment
from gguf_mtp.files.regular_file import open_regular
from gguf_mtp.llama_build import chosen

from .header import TensorInfo, tensor_nbytes

if TYPE_CHECKING:  # numpy (and gguf-py's quantizers) only where values are converted: a copy needs neither
    import numpy as np

__all__ = [
    "CHUNK_BYTES",
    "INSTALL_HINT",
    "NUMPY_TYPES",
    "InvalidRowsError",
    "QuantizerUnavailableError",
    "converter_rows",
    "from_f32",
    "ggml_available",
    "retyped_tensor",
    "row_runs",
    "to_f32",
]

Q = GGMLQuantizationType

#: Float32 working memory per step (rows are never split, so a single huge row may exceed it).
CHUNK_BYTES = 32 * 1024 * 1024

#: Source types llama-quantize dequantizes (``llama_tensor_dequantize_impl``): every block type and these.
FLOAT_SOURCES = frozenset({Q.F32, Q.F16, Q.BF16})

#: The types gguf-py's numpy code quantizes (byte-identical to ggml's reference quantizers).
NUMPY_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_1, Q.Q5_0, Q.Q4_1, Q.Q4_0})

INSTALL_HINT = install_hint("llama", "llama.cpp's own quantizer, from llama-cpp-python")


#: Finite values of at most this magnitude fit every type: no block scale can overflow its F16 (a scale is at
#: most about twice its block's largest magnitude, F16 holds 65504), and F16 itself holds them. Only rows
#: beyond it are checked after quantizing, by reading the written blocks back.
SAFE_MAGNITUDE = 2.0**15


class QuantizerUnavailableError(RuntimeError):
    """A type only llama.cpp's quantizer writes, and llama-cpp-python is not installed."""


class InvalidRowsError(ValueError):
    """Rows llama-quantize refuses to quantize (``ggml_validate_row_data``).

    Attributes:
        row: the first such row, counted from the first row given.
        problem: what is wrong with it (``"a NaN"``, ``"an infinity"``, a magnitude the type cannot hold).
        refusal: llama-quantize's words for it.
    """

    def __init__(self, row: int, problem: str, refusal: str = "has invalid data") -> None:
        super().__init__(f"{problem} in row {row}")
        self.row = row
        self.problem = problem
        self.refusal = refusal

    def describe(self, tensor: str, first_row: int = 0) -> str:
        """One line naming ``tensor``, whose rows given started at its row ``first_row``."""
        return (f"tensor {tensor!r} holds {self.problem} (row {first_row + self.row}): llama-quantize refuses to "
                f"quantize it (\"{self.refusal}\"), so no file was written")


# ------------------------------------------------------------------------------------------- ggml


class _TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _Ggml:
    """The few ggml-base functions llama-quantize's data path uses."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.quantize_chunk = lib.ggml_quantize_chunk
        self.quantize_chunk.restype = ctypes.c_size_t
        self.quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self.requires_imatrix = lib.ggml_quantize_requires_imatrix
        self.requires_imatrix.restype = ctypes.c_bool
        self.requires_imatrix.argtypes = [ctypes.c_int]
        get_traits = lib.ggml_get_type_traits
        get_traits.restype = ctypes.POINTER(_TypeTraits)
        get_traits.argtypes = [ctypes.c_int]
        self._get_traits = get_traits
        self.threads = free_cores()
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="ggml-quant")

    def to_float(self, qtype: int) -> Callable[[int, int, int], None] | None:
        pointer = self._get_traits(qtype).contents.to_float
        return _TO_FLOAT(pointer) if pointer else None


def _ggml() -> _Ggml | None:
    """ggml-base of the chosen llama.cpp build (:mod:`gguf_mtp.llama_build`), else llama-cpp-python's own."""
    build = chosen()
    if build is not None:
        return _ggml_in(build.lib_dir)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return _ggml_in(Path(next(iter(spec.submodule_search_locations))) / "lib")


@functools.cache
def _ggml_in(folder: Path) -> _Ggml | None:
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (folder / name).is_file():
            try:
                return _Ggml(ctypes.CDLL(str(folder / name)))
            except (OSError, AttributeError):  # not loadable here, or a ggml without these functions
                return None
    return None


def ggml_available() -> bool:
    """Whether llama.cpp's own quantizer (llama-cpp-python's ggml-base library) can be loaded."""
    return _ggml() is not None


def _need_ggml(qtype: GGMLQuantizationType, what: str) -> _Ggml:
    ggml = _ggml()
    if ggml is None:
        raise QuantizerUnavailableError(f"{what} {qtype.name} needs llama.cpp's quantizer: {INSTALL_HINT}")
    return ggml


def _spans(count: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """``count`` items as up to ``parts`` contiguous (start, n) spans, each a multiple of ``unit``."""
    units = count // unit
    per, extra = divmod(units, max(1, min(parts, units)))
    spans, start = [], 0
    for i in range(max(1, min(parts, units))):
        n = (per + (1 if i < extra else 0)) * unit
        spans.append((start, n))
        start += n
    return spans


# ------------------------------------------------------------------------------------------- rows


def to_f32(raw: np.ndarray, qtype: int, n_elements: int) -> np.ndarray:
    """``n_elements`` values of ``qtype`` bytes ``raw`` as float32, as llama-quantize dequantizes them."""
    import numpy as np

    qtype = GGMLQuantizationType(qtype)
    data = np.ascontiguousarray(raw).view(np.uint8)
    if qtype == Q.F32:
        return data.view(np.float32)
    if qtype == Q.BF16:  # ggml_bf16_to_fp32: the 16 bits become the high half
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if qtype == Q.F16:
        return data.view(np.float16).astype(np.float32)
    ggml = _ggml()
    if ggml is None:
        from gguf import quants as gguf_quants

        return np.asarray(gguf_quants.dequantize(data, qtype), dtype=np.float32).reshape(-1)
    to_float = ggml.to_float(qtype)
    if to_float is None:
        raise ValueError(f"ggml cannot dequantize {qtype.name}")
    block, size = GGML_QUANT_SIZES[qtype]
    out = np.empty(n_elements, dtype=np.float32)
    src, dst = data.ctypes.data, out.ctypes.data
    jobs = [ggml.pool.submit(to_float, src + start // block * size, dst + start * 4, n)
            for start, n in _spans(n_elements, ggml.threads, block)]
    for job in jobs:
        job.result()
    return out


def _first_non_finite(values: np.ndarray) -> InvalidRowsError | None:
    """The first row of ``values`` holding a NaN or an infinity (what ``check_tensors`` refuses), or ``None``."""
    import numpy as np

    if values.size == 0 or (math.isfinite(float(values.max())) and math.isfinite(float(values.min()))):
        return None
    bad = ~np.isfinite(values).all(axis=1)
    row = int(np.argmax(bad))
    return InvalidRowsError(row, "a NaN" if np.isnan(values[row]).any() else "an infinity")


def _first_overflow(values: np.ndarray, written: np.ndarray, qtype: GGMLQuantizationType) -> InvalidRowsError | None:
    """The first row whose finite ``values`` did not fit ``qtype``: its ``written`` blocks read back as NaN or
    infinity (an F16 overflow, a block scale beyond F16: "quantized data validation failed"), or ``None``."""
    import numpy as np

    if values.size == 0 or max(float(values.max()), -float(values.min())) <= SAFE_MAGNITUDE:
        return None
    back = to_f32(written, qtype, values.size).reshape(values.shape)
    bad = ~np.isfinite(back).all(axis=1)
    if not bad.any():
        return None
    row = int(np.argmax(bad))
    return InvalidRowsError(row, f"values up to {float(np.abs(values[row]).max()):.6g}, more than {qtype.name} holds",
                            "quantized data validation failed")


def from_f32(
    values: np.ndarray, qtype: int, *, checked: bool = False, importance: np.ndarray | None = None
) -> np.ndarray:
    """Rows of float32 (shape ``(rows, n_per_row)``) as ``qtype`` bytes, as llama-quantize writes them.

    Args:
        checked: refuse what llama-quantize refuses: a NaN or an infinity among ``values`` (before anything is
            quantized), and a row whose blocks come out non-finite (finite values beyond what ``qtype`` holds).
        importance: the columns' importance (``n_per_row`` float32, one expert's row of an imatrix), handed to
            ``ggml_quantize_chunk`` for every row as llama-quantize ``--imatrix`` hands it; needs llama.cpp's
            quantizer. Without it the types that need one (``ggml_quantize_requires_imatrix``) are refused.

    Raises:
        QuantizerUnavailableError: ``qtype`` needs llama.cpp's quantizer and llama-cpp-python is missing.
        InvalidRowsError: ``checked``, and a row llama-quantize refuses.
    """
    import numpy as np

    qtype = GGMLQuantizationType(qtype)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if checked and (invalid := _first_non_finite(values)) is not None:
        raise invalid
    written = _quantized(values, qtype, importance)
    if checked and (invalid := _first_overflow(values, written, qtype)) is not None:
        raise invalid
    return written


def converter_rows(values: np.ndarray, qtype: int) -> np.ndarray:
    """Rows of float32 as ``qtype`` bytes as llama.cpp's converter writes them (gguf-py's ``quants.quantize``, for
    F32, F16, BF16 and Q8_0), non-finite values included: the converter refuses none. Rows of finite values go
    through ggml's quantizer, which writes the same bytes faster; a chunk holding a NaN or an infinity through
    gguf-py's own code, since the two may encode those differently."""
    import numpy as np

    qtype = GGMLQuantizationType(qtype)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if _first_non_finite(values) is None:
        return _quantized(values, qtype)
    from gguf import quants as gguf_quants

    with np.errstate(all="ignore"):  # NaN cast to an integer code: numpy's warning, not an error
        return np.ascontiguousarray(gguf_quants.quantize(values, qtype)).view(np.uint8).reshape(-1)


def _quantized(values: np.ndarray, qtype: GGMLQuantizationType, importance: np.ndarray | None = None) -> np.ndarray:
    """``values`` (rows of floats) in ``qtype``: by ggml's quantizer where it is loaded (the only one that takes an
    ``importance``), else by gguf-py's."""
    ggml = _ggml()
    if importance is not None:  # gguf-py's quantizers take no imatrix
        ggml = _need_ggml(qtype, "quantizing with an importance matrix to")
        importance = _row_importance(importance, values.shape[1])
    if ggml is None:
        return _numpy_quantized(values, qtype)
    return _ggml_quantized(ggml, values, qtype, importance)


def _row_importance(importance: np.ndarray, n_per_row: int) -> np.ndarray:
    """``importance`` as contiguous float32, one weight per column of the rows."""
    import numpy as np

    importance = np.ascontiguousarray(importance, dtype=np.float32)
    if importance.shape != (n_per_row,):
        raise ValueError(f"an importance of {importance.size} columns for rows of {n_per_row}")
    return importance


def _numpy_quantized(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """``values`` in ``qtype`` by gguf-py's quantizers (the types :data:`NUMPY_TYPES` lists)."""
    import numpy as np

    if qtype not in NUMPY_TYPES:
        _need_ggml(qtype, "quantizing to")
    if qtype == Q.F32:
        return values.view(np.uint8).reshape(-1)
    from gguf import quants as gguf_quants

    return np.ascontiguousarray(gguf_quants.quantize(values, qtype)).view(np.uint8).reshape(-1)


def _ggml_quantized(ggml: _Ggml, values: np.ndarray, qtype: GGMLQuantizationType, importance: np.ndarray | None
                    ) -> np.ndarray:
    """``values`` in ``qtype`` by ggml's ``ggml_quantize_chunk``, the rows split among its threads."""
    import numpy as np

    rows, n_per_row = values.shape
    if importance is None and ggml.requires_imatrix(qtype):
        raise ValueError(f"{qtype.name} needs an importance matrix")
    weights = None if importance is None else importance.ctypes.data
    row_size = tensor_nbytes((n_per_row,), qtype)
    out = np.empty(rows * row_size, dtype=np.uint8)
    src, dst = values.ctypes.data, out.ctypes.data
    jobs = [ggml.pool.submit(ggml.quantize_chunk, qtype, src + start * n_per_row * 4, dst + start * row_size,
                             0, n, n_per_row, weights)
            for start, n in _spans(rows, ggml.threads)]
    written = sum(job.result() for job in jobs)
    if written != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written:,} bytes, expected {out.nbytes:,}")
    return out


def row_runs(first: int, rows: int, step: int, rows_per_expert: int) -> Iterator[tuple[int, int, int]]:
    """``(expert, row, count)``: a tensor's rows ``first .. first + rows`` in runs of at most ``step``, none crossing
    an expert's boundary (every ``rows_per_expert`` rows: each expert's rows take its own importance, as
    llama-quantize's chunks do)."""
    row, end = first, first + rows
    while row < end:
        expert = row // rows_per_expert
        count = min(step, end - row, (expert + 1) * rows_per_expert - row)
        yield expert, row, count
        row += count


def _retyped_chunks(
    name: str, path: Path, offset: int, shape: tuple[int, ...], source: int, wanted: int, chunk_bytes: int,
    importance: np.ndarray | None = None,
) -> Iterator[np.ndarray]:
    import numpy as np

    n_per_row = shape[0]
    rows = tensor_nbytes(shape, Q.F32) // 4 // n_per_row if n_per_row else 0
    row_bytes = tensor_nbytes((n_per_row,), source)
    step = max(1, chunk_bytes // max(1, n_per_row * 4))
    n_experts = 1 if importance is None else importance.shape[0]
    fd, _ = open_regular(path)
    try:
        for expert, first, count in row_runs(0, rows, step, max(1, rows // n_experts)):
            raw = os.pread(fd, count * row_bytes, offset + first * row_bytes)
            if len(raw) != count * row_bytes:
                raise OSError(f"{path}: ends inside a tensor (wanted {count * row_bytes:,} bytes at "
                              f"{offset + first * row_bytes:,})")
            values = to_f32(np.frombuffer(raw, dtype=np.uint8), source, count * n_per_row)
            try:
                yield from_f32(values.reshape(count, n_per_row), wanted, checked=True,
                               importance=None if importance is None else importance[expert])
            except InvalidRowsError as e:
                raise BadGGUFError(e.describe(name, first), path) from None
    finally:
        os.close(fd)


def retyped_tensor(
    tensor: TensorInfo, path: str | os.PathLike[str], offset: int, wanted: int, *, chunk_bytes: int = CHUNK_BYTES,
    importance: np.ndarray | None = None,
) -> tuple[TensorInfo, tuple[Segment, ...]]:
    """``tensor`` (its bytes at absolute ``offset`` of ``path``) as ``wanted``: its new table entry (offset
    unchanged) and the segments that make its bytes: one kernel copy when the type stays (llama-quantize
    copies such a tensor too), else one generated segment, dequantized and quantized by ggml and checked as
    llama-quantize checks it (``from_f32(..., checked=True)``). ``importance``: the tensor's imatrix rows, one
    per expert (``(ne2, ne0)``, :meth:`gguf_mtp.format.imatrix.ImportanceMatrix.importance`), each expert's
    rows quantized with its own as llama-quantize does.

    Raises:
        QuantizerUnavailableError: at planning time, when the conversion needs llama.cpp's quantizer and it
            is missing.
        ValueError: the source is an integer or F64 tensor (llama-quantize refuses those too).
        BadGGUFError: while the segment is written: a row llama-quantize refuses (a NaN, an infinity, a block
            that overflows ``wanted``), in one line naming the tensor.
    """
    if tensor.ggml_type == wanted:
        return tensor, (CopyRange(Path(path), offset, tensor.nbytes),)
    source = GGMLQuantizationType(tensor.ggml_type)
    if source not in FLOAT_SOURCES and GGML_QUANT_SIZES[source][0] == 1:  # I8..I64, F64: as llama-quantize
        raise ValueError(f"{tensor.name}: cannot convert a {source.name} tensor (llama-quantize cannot either)")
    wanted_type = GGMLQuantizationType(wanted)
    if wanted_type not in NUMPY_TYPES or importance is not None:
        _need_ggml(wanted_type, "quantizing to")
    nbytes = tensor_nbytes(tensor.shape, wanted_type)
    chunks = functools.partial(_retyped_chunks, tensor.name, Path(path), offset, tensor.shape, tensor.ggml_type,
                               wanted_type, chunk_bytes, importance)
    return replace(tensor, ggml_type=int(wanted_type), nbytes=nbytes), (Generated(nbytes, chunks),)
