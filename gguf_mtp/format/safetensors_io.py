"""Lazy, torch-free reading of Hugging Face checkpoints (``config.json`` + safetensors files).

A safetensors file is an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` (offsets relative to the end of the
header) and the raw row-major tensor bytes. This module parses the header itself, checks every entry
against the file (no tensor past the end, sizes agreeing with shapes, no overlaps), and never loads
tensor data until asked: :meth:`SafetensorsTensor.numpy` memory-maps one tensor, and
:meth:`SafetensorsTensor.read_rows` reads a bounded run of rows into a reusable buffer, which is what
the converter streams with (so the page cache, not the process, holds a multi-GB checkpoint).

BF16 comes back as ``uint16`` (the raw bits, which is also what GGUF stores for BF16; the
``safetensors`` package's numpy backend refuses BF16). FP8 and packed 4-bit (NVFP4) tensors are
recognised by size; block-scaled FP8 is dequantized by :mod:`.fp8`, anything else is refused.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from gguf_mtp.errors import CheckpointError, CheckpointNotFoundError
from gguf_mtp.files.json_io import load_json_file, parse_json
from gguf_mtp.files.regular_file import NotARegularFileError, open_regular

__all__ = [
    "CONFIG_NAME",
    "INDEX_NAME",
    "MAX_HEADER_BYTES",
    "SAFETENSORS_DTYPES",
    "Checkpoint",
    "SafetensorsFile",
    "SafetensorsTensor",
    "natural_key",
    "open_checkpoint",
    "read_config",
    "read_header_bytes",
    "read_index",
]

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"

#: safetensors dtype -> numpy dtype of its raw elements (BF16 as its uint16 bit pattern).
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

#: Quantized dtypes of FP8 / FP4 checkpoints (ModelOpt, compressed-tensors): known, not convertible yet.
QUANTIZED_DTYPES: dict[str, float] = {
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
    "F4": 0.5,
}

#: The most header bytes accepted (real checkpoints use a few hundred KiB).
MAX_HEADER_BYTES = 100 * 1024 * 1024

#: The most bytes of ``config.json`` read (real ones are a few KiB, with a quantization ignore list
#: a few hundred).
MAX_CONFIG_BYTES = 16 * 1024 * 1024

#: The most bytes of an index read (the largest MoE checkpoints' indexes are about 10 MB).
MAX_INDEX_BYTES = 64 * 1024 * 1024

#: Largest dimension and rank a safetensors shape may state (a tensor of 2^48 elements is 512 TB).
MAX_DIMENSION = 2**48
MAX_RANK = 8


def _is_count(value: Any, maximum: int) -> bool:
    """A JSON integer (not a bool, not a float like 256.0) in ``0..maximum``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum


def short_json(value: Any, limit: int = 40) -> str:
    """A JSON value as a short one-line text for messages (long ones cut with an ellipsis)."""
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key putting ``experts.2`` before ``experts.10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class SafetensorsTensor:
    """One tensor of a safetensors file: where its bytes are, nothing loaded.

    ``shape`` is the row-major (torch) shape; ``offset`` is absolute within ``path``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    offset: int
    nbytes: int

    #: Whether :meth:`read_rows` yields values other than the stored bytes (a transformed view: a transpose, a
    #: dequantization); such a tensor is always converted, never copied as it is stored.
    transformed: ClassVar[bool] = False

    def rows(self, start: int, count: int, name: str) -> SafetensorsTensor:
        """Rows ``start .. start+count`` of a matrix as a tensor of their own, named ``name``: a byte range of the
        same file."""
        row_bytes = self.nbytes // max(1, self.n_rows)
        return replace(self, name=name, shape=(count, *self.shape[1:]),
                                   offset=self.offset + start * row_bytes, nbytes=count * row_bytes)

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of the raw elements (``uint16`` for BF16).

        Raises:
            CheckpointError: the dtype is a quantized one (FP8, FP4) that cannot be read as numbers here.
        """
        dtype = SAFETENSORS_DTYPES.get(self.dtype)
        if dtype is None:
            raise CheckpointError(
                f"tensor {self.name!r} is {self.dtype}: not a float dtype (only block-scaled FP8 is dequantized); "
                "use the BF16 checkpoint",
                self.path,
            )
        return dtype

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def row_size(self) -> int:
        """Elements per row (the innermost dimension; 1 for a scalar)."""
        return self.shape[-1] if self.shape else 1

    @property
    def n_rows(self) -> int:
        return self.n_elements // self.row_size if self.row_size else 0

    def numpy(self) -> np.ndarray:
        """A read-only memory-mapped view of the tensor (nothing is read until it is used)."""
        dtype = self.numpy_dtype
        if self.n_elements == 0:
            return np.empty(self.shape, dtype)
        return np.memmap(self.path, dtype=dtype, mode="r", offset=self.offset, shape=self.shape)

    def read_rows(self, fd: int, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start .. start+count`` of the tensor viewed as 2-D ``[n_rows, row_size]``, read with
        ``preadv`` from ``fd`` (an open descriptor of :attr:`path`) into ``out`` when it is large enough.

        Raises:
            CheckpointError: the file ended early.
        """
        dtype = self.numpy_dtype
        n = count * self.row_size
        if out is None or out.size < n or out.dtype != dtype:
            out = np.empty(n, dtype)
        view = out[:n]
        want = n * dtype.itemsize
        got = os.preadv(fd, [memoryview(view.data).cast("B")], self.offset + start * self.row_size * dtype.itemsize)
        if got != want:
            raise CheckpointError(f"tensor {self.name!r}: file ended early ({got} of {want} bytes read)", self.path)
        return view.reshape(count, self.row_size)


def read_header_bytes(read_at: Callable[[int, int], bytes], size: int, name: str | os.PathLike[str]) -> bytes:
    """The JSON header's bytes of a safetensors file of ``size`` bytes, read through ``read_at(offset, n)``
    (which returns fewer bytes only at the end of the file): the one reader of the 8-byte length, bounded
    by the file and by :data:`MAX_HEADER_BYTES` before anything is read, for local and remote files alike.

    Raises:
        CheckpointError: too short for a header, a length past the file or the bound, a file that ends early.
    """
    head = read_at(0, 8)
    if len(head) < 8:
        raise CheckpointError(f"not a safetensors file ({size} bytes, too short for a header)", name)
    length = int.from_bytes(head, "little")
    if length > min(size - 8, MAX_HEADER_BYTES):
        raise CheckpointError(f"corrupt safetensors header: it claims {length:,} bytes, the file has {size:,}", name)
    raw = read_at(8, length)
    if len(raw) != length:
        raise CheckpointError(f"corrupt safetensors header: the file ended after {8 + len(raw):,} bytes", name)
    return raw


class SafetensorsFile:
    """The parsed header of one ``.safetensors`` file.

    Raises:
        CheckpointError: the file is missing, truncated, or its header is not valid safetensors.
    """

    def __init__(self, path: str | os.PathLike[str], *, header: tuple[int, bytes] | None = None) -> None:
        """Read and check the header of the file ``path``; or, with ``header`` (the file's size and its JSON
        header's bytes, read elsewhere: a file on the Hub), check that one, ``path`` naming the file."""
        self.path = Path(path)
        size, raw = header if header is not None else self._read_header_bytes()
        header = parse_json(raw, self.path, error=CheckpointError, what="corrupt safetensors header")
        if not isinstance(header, dict):
            raise CheckpointError("corrupt safetensors header (not a JSON object)", self.path)
        self.data_start = 8 + len(raw)
        self.file_size = size
        self.metadata: dict[str, str] = _metadata(header.pop("__metadata__", None) or {}, self.path)
        self.tensors: dict[str, SafetensorsTensor] = {}
        for name, entry in header.items():
            self.tensors[name] = self._entry(name, entry)
        _refuse_overlaps(self.tensors.values(), self.path)

    @classmethod
    def from_reader(cls, name: str, size: int, read_at: Callable[[int, int], bytes]) -> SafetensorsFile:
        """The checked header of a file read elsewhere (a file on the Hub, by byte ranges): ``size`` bytes, read
        through ``read_at(offset, n)``, ``name`` naming it in messages; the same checks as a local file's.

        Raises:
            CheckpointError: see :func:`read_header_bytes` and the class.
        """
        return cls(name, header=(size, read_header_bytes(read_at, size, name)))

    def _read_header_bytes(self) -> tuple[int, bytes]:
        """(file size, the JSON header's bytes), read from a regular file only (a FIFO would hang)."""
        try:
            fd, info = open_regular(self.path)
        except FileNotFoundError:
            raise CheckpointNotFoundError("no such file", self.path) from None
        except IsADirectoryError:
            raise CheckpointError("is a directory, not a safetensors file", self.path) from None
        except NotARegularFileError:
            raise CheckpointError(
                "is not a regular file (a pipe, socket or device); give a safetensors file", self.path
            ) from None
        except OSError as e:
            raise CheckpointError(f"cannot open: {e.strerror}", self.path) from None
        try:
            size = info.st_size
            raw = read_header_bytes(lambda offset, n: os.pread(fd, n, offset), size, self.path)
        except OSError as e:
            raise CheckpointError(f"cannot read: {e.strerror}", self.path) from None
        finally:
            os.close(fd)
        return size, raw

    def _entry(self, name: str, entry: Any) -> SafetensorsTensor:
        dtype, shape, (begin, end) = _entry_fields(name, entry, self.path)
        if not 0 <= begin <= end or self.data_start + end > self.file_size:
            raise CheckpointError(
                f"tensor {name!r} (bytes {begin:,}..{end:,} of the data) runs past the end of the file "
                f"({self.file_size - self.data_start:,} data bytes)",
                self.path,
            )
        itemsize = SAFETENSORS_DTYPES[dtype].itemsize if dtype in SAFETENSORS_DTYPES else QUANTIZED_DTYPES.get(dtype)
        if itemsize is None:
            raise CheckpointError(f"tensor {name!r} has unknown dtype {dtype!r}", self.path)
        if math.prod(shape) * itemsize != end - begin:
            raise CheckpointError(
                f"tensor {name!r}: {end - begin:,} bytes do not hold a {dtype} tensor of shape {list(shape)}", self.path
            )
        return SafetensorsTensor(name, dtype, shape, self.path, self.data_start + begin, end - begin)


def _metadata(metadata: Any, path: Path) -> dict[str, str]:
    """The header's ``__metadata__``: a {string: string} object."""
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError("corrupt safetensors header: __metadata__ is not a {string: string} object", path)
    return metadata


def _refuse_overlaps(tensors: Iterable[SafetensorsTensor], path: Path) -> None:
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors if t.nbytes)
    for (_, end, before), (start, _, after) in itertools.pairwise(spans):
        if start < end:
            raise CheckpointError(f"corrupt safetensors header: {before!r} and {after!r} overlap", path)


def _entry_fields(name: str, entry: Any, path: Path) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """(dtype, shape, (begin, end)) of a header entry, each of the JSON type and range the format allows.

    Raises:
        CheckpointError: one line naming the tensor and the field.
    """

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"corrupt safetensors header: {name!r} {what}", path)

    if not isinstance(entry, dict):
        raise bad("is not an object {dtype, shape, data_offsets}")
    dtype, dims, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"has dtype {short_json(dtype)}, not a string")
    return dtype, _entry_shape(dims, bad), _entry_offsets(offsets, bad)


def _entry_shape(dims: Any, bad: Callable[[str], CheckpointError]) -> tuple[int, ...]:
    if not isinstance(dims, list) or len(dims) > MAX_RANK:
        raise bad(f"has shape {short_json(dims)}, not a list of at most {MAX_RANK} dimensions")
    for i, d in enumerate(dims):
        if not _is_count(d, MAX_DIMENSION):
            raise bad(f"shape[{i}] = {short_json(d)} is not a dimension (an integer 0..2^48)")
    return tuple(dims)


def _entry_offsets(offsets: Any, bad: Callable[[str], CheckpointError]) -> tuple[int, int]:
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise bad(f"has data_offsets {short_json(offsets)}, not [begin, end]")
    for i, x in enumerate(offsets):
        if not _is_count(x, 2**64 - 1):
            raise bad(f"data_offsets[{i}] = {short_json(x)} is not an offset (a non-negative integer)")
    return offsets[0], offsets[1]


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``config.json`` of a checkpoint folder.

    Raises:
        CheckpointError: missing, not JSON, or not a JSON object.
    """
    path = Path(folder) / CONFIG_NAME
    if not os.path.lexists(path):
        raise CheckpointError("no config.json: a checkpoint folder needs one", path.parent)
    config = load_json_file(path, max_bytes=MAX_CONFIG_BYTES, error=CheckpointError)
    if not isinstance(config, dict):
        raise CheckpointError("not a JSON object", path)
    return config


def read_index(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> file name) of a ``model.safetensors.index.json``.

    Raises:
        CheckpointError: not JSON, or no usable ``weight_map``.
    """
    path = Path(path)
    index = load_json_file(path, max_bytes=MAX_INDEX_BYTES, error=CheckpointError, what="not a valid index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError("no weight_map {tensor name: file name} in the index", path)
    for file_name in set(weight_map.values()):
        if Path(file_name).name != file_name or not file_name.endswith(".safetensors"):
            raise CheckpointError(f"index names {file_name!r}: expected a .safetensors file in the same folder", path)
    return dict(weight_map)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder: its config and the tensors of the safetensors files it needs.

    Built by :func:`open_checkpoint`; only the files that hold wanted tensors are opened, so a folder
    holding just the MTP shards of a large model (what a selective Hub download leaves) is complete.
    """

    folder: Path
    config: dict[str, Any]
    tensors: Mapping[str, SafetensorsTensor]
    files: tuple[Path, ...]  # the safetensors files opened
    index: Path | None = None

    @cached_property
    def names(self) -> list[str]:
        """Tensor names in natural order (``experts.2`` before ``experts.10``)."""
        return sorted(self.tensors, key=natural_key)

    def __iter__(self) -> Iterator[SafetensorsTensor]:
        return (self.tensors[n] for n in self.names)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _files_of(folder: Path) -> tuple[dict[str, str] | None, list[str], Path | None]:
    """(weight map or None, safetensors file names, index path) of a folder."""
    index_path = folder / INDEX_NAME
    # lexists, not is_file: an index that is a directory or a pipe is refused by read_index, not skipped.
    if os.path.lexists(index_path):
        weight_map = read_index(index_path)
        return weight_map, sorted(set(weight_map.values()), key=natural_key), index_path
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) == 1:
        weight_map = read_index(indexes[0])
        return weight_map, sorted(set(weight_map.values()), key=natural_key), indexes[0]
    names = sorted((p.name for p in folder.glob("*.safetensors")), key=natural_key)
    return None, names, None


#: The start of a head's tensor names: one prefix (``"mtp."``), or several (one per NextN layer,
#: ``model.layers.{N+i}.``).
NamePrefix = str | tuple[str, ...]


def open_checkpoint(folder: str | os.PathLike[str], *, prefix: NamePrefix | None = None) -> Checkpoint:
    """Read the config and safetensors headers of a checkpoint folder.

    Args:
        folder: holds ``config.json`` and ``*.safetensors`` (with ``model.safetensors.index.json`` when
            there are several).
        prefix: only keep tensors whose name starts with this (``"mtp."``, or one of several); with an index, only the
            files holding such tensors are opened.

    Raises:
        CheckpointError: no config.json or not JSON, no safetensors files, a file the index lists for a
            needed tensor is missing, the index and a file disagree, a corrupt safetensors header.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError("not a folder", folder)
    config = read_config(folder)
    weight_map, names, index_path = _files_of(folder)
    if not names:
        raise CheckpointError("no .safetensors files", folder)
    if weight_map is not None:
        needed = _needed_files(folder, weight_map, index_path, prefix)
        names = [n for n in names if n in needed]
    tensors, opened = _read_tensors(folder, names, weight_map, prefix)
    if weight_map is not None:
        _check_index_is_held(folder, weight_map, tensors, prefix)
    return Checkpoint(folder, config, tensors, tuple(opened), index_path)


def _wanted(name: str, prefix: NamePrefix | None) -> bool:
    """Whether tensor ``name`` is kept: every tensor without a ``prefix``, else those starting with it."""
    return prefix is None or name.startswith(prefix)


def _needed_files(
    folder: Path, weight_map: dict[str, str], index_path: Path | None, prefix: NamePrefix | None
) -> set[str]:
    """The files the index places wanted tensors in; each must be in ``folder``.

    Raises:
        CheckpointError: a needed file is missing (named, with one tensor it holds).
    """
    needed = {f for t, f in weight_map.items() if _wanted(t, prefix)}
    # exists, not is_file: a listed file that is a pipe or a directory is refused as such, not "missing".
    missing = sorted((f for f in needed if not (folder / f).exists()), key=natural_key)
    if missing:
        held = sorted((t for t, f in weight_map.items() if f == missing[0] and _wanted(t, prefix)), key=natural_key)
        raise CheckpointError(
            f"{index_path.name if index_path else INDEX_NAME} lists {', '.join(missing)}, which is missing "
            f"(it holds {len(held)} needed tensor(s), e.g. {held[0]})",
            folder,
        )
    return needed


def _read_tensors(
    folder: Path, names: list[str], weight_map: dict[str, str] | None, prefix: NamePrefix | None
) -> tuple[dict[str, SafetensorsTensor], list[Path]]:
    """The wanted tensors of the files ``names`` (read in that order), and the paths of the files opened.

    Raises:
        CheckpointError: a file holds a tensor the index places elsewhere, or one another file holds too.
    """
    tensors: dict[str, SafetensorsTensor] = {}
    opened: list[Path] = []
    for file_name in names:
        st = SafetensorsFile(folder / file_name)
        opened.append(st.path)
        for name, tensor in st.tensors.items():
            if not _wanted(name, prefix):
                continue
            _check_placement(st.path, name, weight_map, tensors)
            tensors[name] = tensor
    return tensors, opened


def _check_placement(
    path: Path, name: str, weight_map: dict[str, str] | None, tensors: Mapping[str, SafetensorsTensor]
) -> None:
    """Refuse tensor ``name`` of file ``path`` where the index places it elsewhere, or an earlier file held it."""
    if weight_map is not None and weight_map.get(name) != path.name:
        raise CheckpointError(f"holds {name!r}, but the index places it in {weight_map.get(name, 'no file')}", path)
    if name in tensors:
        raise CheckpointError(f"tensor {name!r} is also in {tensors[name].path.name}", path)


def _check_index_is_held(
    folder: Path, weight_map: dict[str, str], tensors: Mapping[str, SafetensorsTensor], prefix: NamePrefix | None
) -> None:
    """Refuse an index that places a wanted tensor in a file that does not hold it."""
    absent = sorted((t for t, f in weight_map.items() if _wanted(t, prefix) and t not in tensors), key=natural_key)
    if absent:
        raise CheckpointError(
            f"the index places {absent[0]!r} in {weight_map[absent[0]]}, but that file does not hold it", folder
        )
