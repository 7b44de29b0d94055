"""An importance matrix (``llama-imatrix``'s GGUF output) read as ``llama-quantize --imatrix`` reads it.

llama-imatrix (``tools/imatrix/imatrix.cpp``, ``save_imatrix``) writes, per matrix it saw multiplied, two F32
tensors: ``<tensor>.in_sum2`` (``ne0`` x ``n_mat``: the sum of each input column's squared activations, one row
per expert) and ``<tensor>.counts`` (1 x ``n_mat``: the tokens each expert saw), plus the KVs
``imatrix.datasets``, ``imatrix.chunk_count``, ``imatrix.chunk_size`` and, when it was run with ``--nextn`` or
``--model-draft``, ``imatrix.n_layer_nextn`` (how many of the top blocks are NextN blocks). llama-quantize
(``tools/quantize/quantize.cpp`` ``load_imatrix``, through ``common/imatrix-loader.cpp``) divides each expert's
sums by its count (a count of 0 gives 1 for every column), and ``src/llama-quant.cpp`` looks the result up by
the tensor's own name and refuses one whose size is not ``ne0 * ne2``.

Only the entries a head needs are read, each checked against the tensor's shape before anything is allocated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gguf.constants import GGMLQuantizationType, Keys

from gguf_mtp.errors import BadGGUFError
from gguf_mtp.files.regular_file import open_regular

from .header import GGUFHeader, TensorInfo, read_header

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "COUNTS_SUFFIX",
    "IMATRIX_KEYS",
    "KEY_N_LAYER_NEXTN",
    "NEXTN_HINT",
    "SUMS_SUFFIX",
    "ImportanceEntry",
    "ImportanceMatrix",
    "read_imatrix",
]

#: The tensor name suffixes llama-imatrix writes (``save_imatrix``) and llama-quantize's loader matches.
SUMS_SUFFIX = ".in_sum2"
COUNTS_SUFFIX = ".counts"

#: The KVs llama-quantize requires of a GGUF imatrix (``load_imatrix``: "missing imatrix metadata").
IMATRIX_KEYS: tuple[str, ...] = (Keys.IMatrix.DATASETS, Keys.IMatrix.CHUNK_COUNT, Keys.IMatrix.CHUNK_SIZE)

#: How many of the top blocks are NextN blocks (``LLM_KV_IMATRIX_N_LAYER_NEXTN``, b11434's imatrix-loader.h);
#: gguf-py does not name it yet.
KEY_N_LAYER_NEXTN = "imatrix.n_layer_nextn"

#: How to make an imatrix with a head's statistics.
NEXTN_HINT = ("llama-imatrix --nextn (a model with its NextN block) or --model-draft DRAFT.gguf makes one "
              "(llama.cpp b11434 or later)")

_GGUF_MAGIC = b"GGUF"
F32 = GGMLQuantizationType.F32


@dataclass(frozen=True)
class ImportanceEntry:
    """One matrix's statistics: its ``.in_sum2`` (sums of squared activations) and ``.counts`` (tokens seen)."""

    sums: TensorInfo
    counts: TensorInfo


@dataclass(frozen=True)
class ImportanceMatrix:
    """A GGUF imatrix's header and its entries (tensor name -> its ``.in_sum2`` and ``.counts``)."""

    header: GGUFHeader
    entries: Mapping[str, ImportanceEntry]

    @property
    def path(self) -> str:
        return self.header.path

    @property
    def n_layer_nextn(self) -> int:
        """``imatrix.n_layer_nextn``: 0 when llama-imatrix saw no NextN block."""
        value = self.header.get(KEY_N_LAYER_NEXTN, 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def importance(self, name: str, shape: Sequence[int]) -> np.ndarray | None:
        """Tensor ``name``'s per-column importance, one row per expert (``(ne2, ne0)`` float32), as llama-quantize
        hands it to ``ggml_quantize_chunk``; ``None`` where the matrix has no entry for it.

        Raises:
            BadGGUFError: the entry does not fit ``shape`` (llama-quantize: "imatrix size ... is different"), or
                holds a negative or non-finite value.
        """
        entry = self.entries.get(name)
        if entry is None:
            return None
        ne0 = shape[0]
        n_expert = shape[2] if len(shape) > 2 else 1
        n_counts = _n_elements(entry.counts)
        if _n_elements(entry.sums) != ne0 * n_expert or n_counts < 1 or (ne0 * n_expert) % n_counts:
            raise BadGGUFError(
                f"imatrix entry {name!r} ({entry.sums.shape} sums, {n_counts} counts) does not fit the tensor's "
                f"{ne0} columns x {n_expert} expert(s): an imatrix of another model", self.path)
        sums = self._values(entry.sums, name)
        counts = self._values(entry.counts, name)
        return _normalized(sums, counts).reshape(n_expert, ne0)

    def _values(self, tensor: TensorInfo, name: str) -> np.ndarray:
        import numpy as np

        start = self.header.data_offset + tensor.offset
        try:
            fd, _ = open_regular(self.path)
            try:
                raw = os.pread(fd, tensor.nbytes, start)
            finally:
                os.close(fd)
        except OSError as e:
            raise BadGGUFError(f"cannot read imatrix tensor {tensor.name!r}: {e.strerror or e}", self.path) from None
        if len(raw) != tensor.nbytes:
            raise BadGGUFError(f"imatrix tensor {tensor.name!r} ends past the end of the file", self.path)
        values = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        if not np.isfinite(values).all() or (values < 0).any():
            raise BadGGUFError(f"imatrix entry {name!r} holds a negative or non-finite value (sums of squares "
                               "and token counts are neither: not what llama-imatrix writes)", self.path)
        return values


def _n_elements(tensor: TensorInfo) -> int:
    n = 1
    for extent in tensor.shape:
        n *= extent
    return n


def _normalized(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each expert's sums over its token count (``load_imatrix``: float division, the count rounded as
    ``std::lround`` rounds it; an expert that saw no token weighs every column 1)."""
    import numpy as np

    per_count = sums.reshape(counts.size, -1)
    rounded = np.floor(counts.astype(np.float64) + 0.5).astype(np.float32)  # lround: halves away from zero
    out = np.ones_like(per_count)
    seen = rounded > 0
    out[seen] = per_count[seen] / rounded[seen, None]
    return out.reshape(-1)


def _is_legacy(path: str) -> bool:
    """Whether ``path`` starts with four bytes that are not GGUF's magic: a legacy ``.dat`` imatrix, refused by
    name (it has no NextN statistics, and llama-quantize weighs it another way). Anything unreadable is left
    to :func:`read_header`, which names it."""
    try:
        fd, _ = open_regular(path)
    except OSError:
        return False
    try:
        magic = os.pread(fd, len(_GGUF_MAGIC), 0)
    finally:
        os.close(fd)
    return len(magic) == len(_GGUF_MAGIC) and magic != _GGUF_MAGIC


def _entries(header: GGUFHeader) -> dict[str, ImportanceEntry]:
    sums = {t.name[: -len(SUMS_SUFFIX)]: t for t in header.tensors if t.name.endswith(SUMS_SUFFIX)}
    counts = {t.name[: -len(COUNTS_SUFFIX)]: t for t in header.tensors if t.name.endswith(COUNTS_SUFFIX)}
    if sums.keys() != counts.keys():
        odd = sorted(sums.keys() ^ counts.keys())[0]
        raise BadGGUFError(f"imatrix entry {odd!r} has sums without counts or counts without sums", header.path)
    for name, tensor in (*sums.items(), *counts.items()):
        if tensor.ggml_type != F32:
            raise BadGGUFError(f"imatrix entry {name!r} is {tensor.type_name}, not F32 (as llama-imatrix writes it)",
                               header.path)
    return {name: ImportanceEntry(sums[name], counts[name]) for name in sums}


def read_imatrix(path: str | os.PathLike[str]) -> ImportanceMatrix:
    """The header of the GGUF imatrix at ``path`` (its values are read per tensor, when asked).

    Raises:
        BadGGUFError: one line naming the file: not a GGUF imatrix (a model, a legacy ``.dat``, no
            ``imatrix.*`` metadata), or entries that are not F32 pairs of sums and counts.
    """
    name = os.fspath(path)
    if _is_legacy(name):
        raise BadGGUFError("is not a GGUF imatrix (a legacy .dat one? llama-imatrix --in-file FILE.dat "
                           "-o FILE.gguf converts it)", name)
    header = read_header(name)
    missing = [key for key in IMATRIX_KEYS if key not in header.kvs]
    if missing:
        raise BadGGUFError(f"is not an imatrix (no {', '.join(missing)}; llama-imatrix writes them)", name)
    return ImportanceMatrix(header, _entries(header))
