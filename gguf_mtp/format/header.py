"""An exact, bounded codec for GGUF headers (the KV table and the tensor table).

Why not only :class:`gguf.GGUFReader`? gguf-mtp must (a) re-emit every KV it does not change
byte-for-byte, whatever its type (nested and empty arrays included), (b) read just the header of a
remote file through range requests, and (c) survive hostile files: GGUFReader memory-maps the whole
file, trusts counts (an array claiming 2**60 elements spins forever) and infers inner types of nested
arrays when writing. This module parses from any ``read_at(offset, size)`` source, checks every count
against the bytes that remain before it loops or allocates, and keeps each KV's raw bytes. It builds on
gguf-py's tables (:class:`gguf.GGUFValueType`, :class:`gguf.GGMLQuantizationType`,
:data:`gguf.GGML_QUANT_SIZES`); tests cross-check it against GGUFReader on every fixture.
"""

from __future__ import annotations

import array
import itertools
import os
import struct
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from gguf_mtp.constants import KEY_ALIGNMENT, MAX_ALIGNMENT, MAX_TENSORS, max_header_bytes
from gguf_mtp.errors import BadGGUFError, GGUFNotFoundError
from gguf_mtp.files.regular_file import NotARegularFileError, open_regular

__all__ = [
    "SUPPLEMENT_QUANT_SIZES",
    "GGUFArray",
    "GGUFHeader",
    "KVTable",
    "KeyValue",
    "TensorInfo",
    "align_up",
    "encode_kv",
    "encode_tensor_info",
    "encode_value",
    "ggml_type_name",
    "ggml_type_sizes",
    "parse_header",
    "read_header",
    "serialize_header",
    "tensor_nbytes",
]

GGML_MAX_DIMS = 4
#: ggml's tensor name buffer (``GGML_MAX_NAME``): llama.cpp refuses names of 64 bytes or more.
GGML_MAX_NAME = 64
SUPPORTED_VERSIONS = (2, 3)

_SCALAR_FORMAT: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

#: Smallest encoding of one value of each type: bounds counts before anything loops over them.
_MIN_VALUE_SIZE = {t: s.size for t, s in _SCALAR_FORMAT.items()} | {
    GGUFValueType.STRING: 8,
    GGUFValueType.ARRAY: 12,
}
_MIN_KV_SIZE = 8 + 4 + 1
_MIN_TENSOR_INFO_SIZE = 8 + 4 + 8 + 4 + 8


def align_up(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment


#: ggml types that llama.cpp knows and the newest gguf-py on PyPI (0.19.0) does not: type id ->
#: (name, block size, bytes per block). Checked against llama.cpp's ``ggml/include/ggml.h`` (the enum),
#: ``ggml/src/ggml.c`` (``type_traits``: ``blck_size``, ``type_size``) and ``ggml/src/ggml-common.h``
#: (the block structs), as vendored by llama-cpp-python 0.3.36. gguf-py's own table wins for any type
#: it knows, so an entry here only matters until gguf-py catches up.
SUPPLEMENT_QUANT_SIZES: dict[int, tuple[str, int, int]] = {
    # block_q2_0 = { ggml_half d; uint8_t qs[QK2_0 / 4]; } with QK2_0 = 64: 2 + 16 bytes per 64 weights
    42: ("Q2_0", 64, 18),
}


def ggml_type_sizes(ggml_type: int) -> tuple[int, int] | None:
    """(block size, bytes per block) of a ggml type: gguf-py's table, then the supplement; else None."""
    qtype = GGMLQuantizationType._value2member_map_.get(ggml_type)
    if isinstance(qtype, GGMLQuantizationType):
        return GGML_QUANT_SIZES.get(qtype)
    extra = SUPPLEMENT_QUANT_SIZES.get(ggml_type)
    return None if extra is None else extra[1:]


def ggml_type_name(ggml_type: int) -> str:
    """``Q4_K``, ``BF16``, ``Q2_0``...; ``type 99`` for a type neither table knows."""
    qtype = GGMLQuantizationType._value2member_map_.get(ggml_type)
    if qtype is not None:
        return qtype.name
    extra = SUPPLEMENT_QUANT_SIZES.get(ggml_type)
    return extra[0] if extra is not None else f"type {ggml_type}"


def tensor_nbytes(shape: Sequence[int], ggml_type: int) -> int:
    """Byte size of a tensor of ``shape`` (ggml order, ne0 first) stored as ``ggml_type``.

    Raises:
        ValueError: unknown type, or ne0 not a multiple of the type's block size.
    """
    sizes = ggml_type_sizes(ggml_type)
    if sizes is None:
        raise ValueError(f"unknown ggml type {ggml_type}")
    block_size, type_size = sizes
    if shape and shape[0] % block_size:
        raise ValueError(f"ne0={shape[0]} is not a multiple of {ggml_type_name(ggml_type)}'s block size {block_size}")
    n_elements = 1
    for dim in shape:
        n_elements *= dim
    return n_elements // block_size * type_size


@dataclass(frozen=True)
class GGUFArray:
    """A typed GGUF array: its element type and its items (items of nested arrays are GGUFArrays)."""

    element_type: GGUFValueType
    items: tuple[Any, ...]

    def to_python(self) -> list[Any]:
        """The items as plain Python lists (nested arrays become nested lists)."""
        return [i.to_python() if isinstance(i, GGUFArray) else i for i in self.items]


@dataclass(frozen=True)
class KeyValue:
    """One metadata entry, with the exact bytes it occupies in its file (key, type and value)."""

    key: str
    vtype: GGUFValueType
    raw: bytes = field(repr=False)
    value_offset: int = field(repr=False)  # where the value starts within ``raw``

    @cached_property
    def typed_value(self) -> Any:
        """The value; arrays as :class:`GGUFArray` so their element types survive."""
        value, _ = _decode_value(self.raw, self.value_offset, self.vtype)
        return value

    @property
    def value(self) -> Any:
        """The value as plain Python (arrays as lists, strings as ``str``)."""
        v = self.typed_value
        return v.to_python() if isinstance(v, GGUFArray) else v

    @property
    def element_type(self) -> GGUFValueType | None:
        """The element type of an array value, else ``None``."""
        return GGUFValueType(_U32.unpack_from(self.raw, self.value_offset)[0]) if self.is_array else None

    @property
    def is_array(self) -> bool:
        return self.vtype == GGUFValueType.ARRAY

    @property
    def array_length(self) -> int | None:
        """Number of items of an array value (read without decoding them), else ``None``."""
        return _U64.unpack_from(self.raw, self.value_offset + 4)[0] if self.is_array else None

    @property
    def type_name(self) -> str:
        """``u32``, ``str``, ``arr[i16]``, ... as shown in reports."""
        return describe_type(self.vtype, self.element_type)


class KVTable(Mapping[str, KeyValue]):
    """A header's KV table, kept compact: a read-only ``key -> KeyValue`` mapping in file order.

    One Python object per entry costs ~14x the bytes of a tiny KV, so a hostile table of a million
    small KVs would need gigabytes. Here the entries stay in the header's own bytes; per entry there
    are only four 8-byte integers (where it starts, its key's hash, and two slots of an open-addressing
    index over the hashes, at most half full). :class:`KeyValue` objects are made on access; the last few
    looked up are kept, so a big array that is asked for again (the tokenizer) is decoded once.
    """

    _CACHED = 64

    def __init__(self, data: bytes | bytearray, starts: array.array[int], hashes: array.array[int]) -> None:
        """``starts`` holds n + 1 offsets into ``data`` (entry i is ``data[starts[i]:starts[i + 1]]``);
        ``hashes[i]`` is ``hash()`` of key i as ``str``."""
        self._data = data
        self._starts = starts
        self._hashes = hashes
        self._slots = array.array("q", [-1]) * (2 * len(hashes) + 1)  # entry index per slot, -1: free
        self._duplicate: int | None = None  # the first entry whose key an earlier entry has
        self._cache: dict[int, KeyValue] = {}
        for index, key_hash in enumerate(hashes):
            found, slot = self._probe(key_hash, index)
            if found < 0:
                self._slots[slot] = index
            elif self._duplicate is None:  # left out of the index: a lookup finds the first
                self._duplicate = index

    @classmethod
    def of(cls, kvs: Iterable[KeyValue]) -> KVTable:
        """A table of already encoded KVs (later duplicates are kept; see :meth:`first_duplicate`)."""
        data = bytearray()
        starts, hashes = array.array("q"), array.array("q")
        for kv in kvs:
            starts.append(len(data))
            hashes.append(hash(kv.key))
            data += kv.raw
        starts.append(len(data))
        return cls(data, starts, hashes)

    def __len__(self) -> int:
        return len(self._starts) - 1

    def release_tail(self, end: int) -> None:
        """Drop the bytes after ``end`` (the tensor table the parser read along with the KVs)."""
        if isinstance(self._data, bytearray) and len(self._data) > end >= self._starts[-1]:
            del self._data[end:]

    def _bytes(self, start: int, end: int) -> bytes:
        with memoryview(self._data) as view:  # one copy, and the bytearray stays resizable
            return bytes(view[start:end])

    def _key(self, index: int) -> str:
        start = self._starts[index]
        (n,) = _U64.unpack_from(self._data, start)
        return self._bytes(start + 8, start + 8 + n).decode("utf-8", "surrogateescape")

    def _make(self, index: int) -> KeyValue:
        start, end = self._starts[index], self._starts[index + 1]
        (n,) = _U64.unpack_from(self._data, start)
        key = self._bytes(start + 8, start + 8 + n).decode("utf-8", "surrogateescape")
        (vtype,) = _U32.unpack_from(self._data, start + 8 + n)
        return KeyValue(key, GGUFValueType(vtype), self._bytes(start, end), 12 + n)

    def _probe(self, key_hash: int, key: str | int) -> tuple[int, int]:
        """Linear probing from ``key_hash``'s slot: (the entry holding ``key``, else -1; the slot it stopped at).
        ``key`` is a string, or the index of an entry whose key it is (read only if a hash matches)."""
        slots, hashes, size = self._slots, self._hashes, len(self._slots)
        slot = key_hash % size
        while (index := slots[slot]) >= 0:
            if hashes[index] == key_hash:
                if isinstance(key, int):
                    key = self._key(key)
                if self._key(index) == key:
                    return index, slot
            slot = slot + 1 if slot + 1 < size else 0
        return -1, slot

    def _find(self, key: str) -> int | None:
        index, _ = self._probe(hash(key), key)
        return index if index >= 0 else None

    def __getitem__(self, key: str) -> KeyValue:
        index = self._find(key) if isinstance(key, str) else None
        if index is None:
            raise KeyError(key)
        kv = self._cache.get(index)
        if kv is None:
            if len(self._cache) >= self._CACHED:
                del self._cache[next(iter(self._cache))]
            kv = self._cache[index] = self._make(index)
        return kv

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key) is not None

    def __iter__(self) -> Iterator[str]:
        return (self._key(i) for i in range(len(self)))

    def items(self) -> ItemsView[str, KeyValue]:
        return _KVItems(self)

    def values(self) -> ValuesView[KeyValue]:
        return _KVValues(self)

    def iter_entries(self) -> Iterator[KeyValue]:
        """Every entry in file order, made one at a time (nothing is kept)."""
        return (self._make(i) for i in range(len(self)))

    def first_duplicate(self) -> str | None:
        """The key of the first entry (in file order) whose key an earlier entry has, else ``None``."""
        return None if self._duplicate is None else self._key(self._duplicate)

    def __repr__(self) -> str:
        return f"KVTable({len(self)} KVs)"


class _KVItems(ItemsView[str, KeyValue]):
    _mapping: KVTable

    def __iter__(self) -> Iterator[tuple[str, KeyValue]]:
        return ((kv.key, kv) for kv in self._mapping.iter_entries())


class _KVValues(ValuesView[KeyValue]):
    _mapping: KVTable

    def __iter__(self) -> Iterator[KeyValue]:
        return self._mapping.iter_entries()


_TYPE_NAMES = {
    GGUFValueType.UINT8: "u8",
    GGUFValueType.INT8: "i8",
    GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16",
    GGUFValueType.UINT32: "u32",
    GGUFValueType.INT32: "i32",
    GGUFValueType.UINT64: "u64",
    GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT32: "f32",
    GGUFValueType.FLOAT64: "f64",
    GGUFValueType.BOOL: "bool",
    GGUFValueType.STRING: "str",
    GGUFValueType.ARRAY: "arr",
}
TYPE_BY_NAME = {name: vtype for vtype, name in _TYPE_NAMES.items() if vtype != GGUFValueType.ARRAY}


def describe_type(vtype: GGUFValueType, element_type: GGUFValueType | None = None) -> str:
    """Short name of a value type (``u32``, ``arr[str]``)."""
    if vtype == GGUFValueType.ARRAY:
        return f"arr[{_TYPE_NAMES.get(element_type, '?') if element_type is not None else '?'}]"
    return _TYPE_NAMES[vtype]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One entry of the tensor table. ``offset`` is relative to the data section, like in the file.

    Slotted: a header may list tens of thousands of these, and a ``__dict__`` each would double them."""

    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (innermost) first
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    """Everything before a GGUF file's data section, plus where that data section lies."""

    path: str
    version: int
    kvs: KVTable  # a read-only mapping key -> KeyValue, in file order
    tensors: tuple[TensorInfo, ...]
    alignment: int
    header_size: int  # end of the tensor table
    data_offset: int  # header_size rounded up to the alignment
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        """Plain value of ``key``, or ``default`` when the file does not have it."""
        kv = self.kvs.get(key)
        return default if kv is None else kv.value

    @cached_property
    def tensor_by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    @property
    def data_size(self) -> int:
        """Bytes from the start of the data section to the end of the file (0 for a file without
        tensors that ends right after its tensor table, like gguf-py's vocab-only files)."""
        return max(0, self.file_size - self.data_offset)

    @property
    def tensor_data_end(self) -> int:
        """Data-relative end of the last tensor's bytes (0 when the file has no tensors)."""
        return max((t.offset + t.nbytes for t in self.tensors), default=0)

    @property
    def packed_data_size(self) -> int:
        """Size of the data section when tensors sit back to back in table order, each padded to the
        alignment: the only layout llama.cpp's loader accepts (``gguf_init``: "tensor has offset X,
        expected Y")."""
        return sum(align_up(t.nbytes, self.alignment) for t in self.tensors)

    def first_misplaced_tensor(self) -> tuple[TensorInfo, int] | None:
        """The first tensor not where the packed layout puts it, with its expected offset; else None."""
        expected = 0
        for tensor in self.tensors:
            if tensor.offset != expected:
                return tensor, expected
            expected += align_up(tensor.nbytes, self.alignment)
        return None


# --------------------------------------------------------------------------------------------- decode


def _decode_value(buf: bytes | memoryview, pos: int, vtype: GGUFValueType) -> tuple[Any, int]:
    """Decode one already-bounds-checked value at ``pos``; returns (value, next position)."""
    fmt = _SCALAR_FORMAT.get(vtype)
    if fmt is not None:
        return fmt.unpack_from(buf, pos)[0], pos + fmt.size
    if vtype == GGUFValueType.STRING:
        (n,) = _U64.unpack_from(buf, pos)
        return bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", "surrogateescape"), pos + 8 + n
    (etype_raw,) = _U32.unpack_from(buf, pos)
    (count,) = _U64.unpack_from(buf, pos + 4)
    etype = GGUFValueType(etype_raw)
    pos += 12
    efmt = _SCALAR_FORMAT.get(etype)
    if efmt is not None:
        items = tuple(v[0] for v in struct.iter_unpack(efmt.format, buf[pos : pos + count * efmt.size]))
        return GGUFArray(etype, items), pos + count * efmt.size
    items_list = []
    for _ in range(count):
        item, pos = _decode_value(buf, pos, etype)
        items_list.append(item)
    return GGUFArray(etype, tuple(items_list)), pos


_MAX_STEP = 16 << 20


class _Buffer:
    """The header bytes read so far, grown on demand from ``read_at`` (never past the file end)."""

    def __init__(
        self, read_at: Callable[[int, int], bytes], file_size: int, path: str, limit: int, min_read: int = 1 << 20
    ) -> None:
        self.read_at = read_at
        self.file_size = file_size
        self.path = path
        self.limit = limit
        self.min_read = min_read
        self.data = bytearray()
        self.section = "the file header"

    def need(self, end: int) -> None:
        """Make sure bytes up to ``end`` are buffered, or fail as a truncated/oversized header."""
        if end <= len(self.data) and end <= self.limit:
            return
        if end > self.file_size:
            raise BadGGUFError(
                f"truncated in {self.section} (needs byte {end:,}, file has {self.file_size:,})", self.path
            )
        if end > self.limit:
            raise BadGGUFError(
                f"header larger than the {self.limit:,}-byte limit while reading {self.section}", self.path
            )
        # Grow by doubling (few reads of a remote file), but by at most _MAX_STEP at a time so that the
        # chunk in flight never doubles the memory of a big header.
        step = max(end - len(self.data), min(len(self.data), _MAX_STEP), self.min_read)
        want = min(step, self.file_size - len(self.data))
        chunk = self.read_at(len(self.data), want)
        if len(chunk) < end - len(self.data):
            raise BadGGUFError(f"truncated in {self.section} (short read at byte {len(self.data):,})", self.path)
        self.data += chunk

    def unpack(self, fmt: struct.Struct, pos: int) -> int:
        """The unsigned integer of format ``fmt`` at ``pos``."""
        self.need(pos + fmt.size)
        value: int = fmt.unpack_from(self.data, pos)[0]
        return value

    def string(self, pos: int, what: str) -> tuple[str, int]:
        n = self.unpack(_U64, pos)
        if n > self.file_size - pos - 8:
            raise BadGGUFError(f"{what}: string length {n:,} runs past the end of the file", self.path)
        self.need(pos + 8 + n)
        return bytes(self.data[pos + 8 : pos + 8 + n]).decode("utf-8", "surrogateescape"), pos + 8 + n


def _value_type(raw: int, buf: _Buffer, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise BadGGUFError(f"{what}: unknown value type {raw}", buf.path) from None


def _skip_value(buf: _Buffer, pos: int, vtype: GGUFValueType, what: str, depth: int = 0) -> int:
    """Bounds-check one value and return where it ends, without decoding it."""
    fmt = _SCALAR_FORMAT.get(vtype)
    if fmt is not None:
        buf.need(pos + fmt.size)
        return pos + fmt.size
    if vtype == GGUFValueType.STRING:
        return buf.string(pos, what)[1]
    if depth > 8:
        raise BadGGUFError(f"{what}: arrays nested more than 8 deep", buf.path)
    etype = _value_type(buf.unpack(_U32, pos), buf, what)
    count = buf.unpack(_U64, pos + 4)
    pos += 12
    min_size = _MIN_VALUE_SIZE[etype]
    if count > (buf.file_size - pos) // min_size:
        raise BadGGUFError(f"{what}: array of {count:,} items cannot fit in the file", buf.path)
    efmt = _SCALAR_FORMAT.get(etype)
    if efmt is not None:
        buf.need(pos + count * efmt.size)
        return pos + count * efmt.size
    for _ in range(count):
        pos = _skip_value(buf, pos, etype, what, depth + 1)
    return pos


def parse_header(
    read_at: Callable[[int, int], bytes],
    file_size: int,
    path: str,
    *,
    limit: int | None = None,
    min_read: int = 1 << 20,
) -> GGUFHeader:
    """Parse a GGUF header from a random-access byte source.

    Args:
        read_at: ``read_at(offset, size)`` returns up to ``size`` bytes at ``offset``.
        file_size: total size of the file (bounds every count and offset).
        path: the file's name, used in error messages.
        limit: the most header bytes to read before giving up (default: :func:`max_header_bytes`).
        min_read: the fewest bytes asked of ``read_at`` at a time (reads grow by doubling from there; a
            remote source asks for little, a local file for 1 MiB).

    Returns:
        The parsed :class:`GGUFHeader`; tensor sizes, alignment, overlaps and file bounds are checked.
        A file without tensors needs no data section (gguf-py writes vocab-only files that end right
        after the tensor table, and llama.cpp reads them).

    Raises:
        BadGGUFError: the bytes are not a well-formed GGUF header, or a tensor lies outside the file.
        GGUFMTPError: ``GGUF_MTP_MAX_HEADER_BYTES`` is malformed.
    """
    buf = _Buffer(read_at, file_size, path, max_header_bytes() if limit is None else limit, min_read)
    version, tensor_count, kv_count = _read_preamble(buf)

    buf.section = "the KV table"
    starts, hashes = _read_kv_table(buf, kv_count)
    pos = starts[-1]
    kvs = KVTable(buf.data, starts, hashes)
    duplicate = kvs.first_duplicate()
    if duplicate is not None:
        raise BadGGUFError(f"duplicate key {duplicate!r}", path)
    alignment = _alignment(kvs, path)

    # The KV table is read: only now is it known how many bytes the tensor table can have.
    if tensor_count > (file_size - pos) // _MIN_TENSOR_INFO_SIZE:
        raise BadGGUFError(
            f"truncated in the tensor table: tensor_count {tensor_count:,} needs at least "
            f"{tensor_count * _MIN_TENSOR_INFO_SIZE:,} bytes, {file_size - pos:,} follow the KV table",
            path,
        )
    buf.section = "the tensor table"
    infos, header_size = _read_tensor_table(buf, pos, tensor_count)
    data_offset = align_up(header_size, alignment)
    # llama.cpp (gguf_init) seeks to the data section only when there are tensors.
    if tensor_count and data_offset > file_size:
        raise BadGGUFError(f"truncated before the data section (needs {data_offset:,} bytes)", path)

    tensors = _check_tensors(infos, alignment, max(0, file_size - data_offset), path)
    del infos
    kvs.release_tail(pos)  # keep the KV bytes only, not the tensor table's
    return GGUFHeader(path, version, kvs, tensors, alignment, header_size, data_offset, file_size)


def _read_preamble(buf: _Buffer) -> tuple[int, int, int]:
    """(version, tensor_count, kv_count) of the fixed 24 bytes, each count bounded by the file's size.

    Raises:
        BadGGUFError: not a GGUF file, a big-endian or unsupported version, a count that cannot fit.
    """
    file_size, path = buf.file_size, buf.path
    # The magic first, from whatever bytes there are: a short file of other bytes (a 6-byte text file) is
    # not a GGUF file, and only one that starts like one (or is empty) is a truncated GGUF.
    magic = struct.pack("<I", GGUF_MAGIC)
    buf.need(min(24, file_size))
    if bytes(buf.data[:4]) != magic[: min(4, file_size)]:
        raise BadGGUFError(f"not a GGUF file (magic {bytes(buf.data[:4])!r}, expected b'GGUF')", path)
    buf.need(24)
    version = _U32.unpack_from(buf.data, 4)[0]
    if version & 0xFFFF == 0 and version:
        raise BadGGUFError("big-endian GGUF files are not supported", path)
    if version not in SUPPORTED_VERSIONS:
        raise BadGGUFError(f"GGUF version {version} is not supported (only 2 and 3)", path)
    tensor_count, kv_count = struct.unpack_from("<QQ", buf.data, 8)
    if kv_count > (file_size - 24) // _MIN_KV_SIZE:
        raise BadGGUFError(f"kv_count {kv_count:,} cannot fit in a {file_size:,}-byte file", path)
    if tensor_count > (file_size - 24) // _MIN_TENSOR_INFO_SIZE:
        raise BadGGUFError(f"tensor_count {tensor_count:,} cannot fit in a {file_size:,}-byte file", path)
    if tensor_count > MAX_TENSORS:
        raise BadGGUFError(
            f"tensor_count {tensor_count:,} is more than the {MAX_TENSORS:,} tensors gguf-mtp reads "
            "(real models list a few thousand)",
            path,
        )
    return version, tensor_count, kv_count


def _read_kv_table(buf: _Buffer, kv_count: int) -> tuple[array.array[int], array.array[int]]:
    """Bounds-check every KV: (n + 1 start offsets, the n keys' hashes), no object per entry."""
    starts, hashes = array.array("q"), array.array("q")
    pos = 24
    for index in range(kv_count):
        starts.append(pos)
        key, pos = buf.string(pos, f"KV #{index}")
        what = f"KV {key!r}"
        vtype = _value_type(buf.unpack(_U32, pos), buf, what)
        pos = _skip_value(buf, pos + 4, vtype, what)
        hashes.append(hash(key))
    starts.append(pos)
    return starts, hashes


def _alignment(kvs: KVTable, path: str) -> int:
    """``general.alignment``: a u32 power of two, at most :data:`MAX_ALIGNMENT`; the default without it."""
    kv = kvs.get(KEY_ALIGNMENT)
    if kv is None:
        return GGUF_DEFAULT_ALIGNMENT
    if kv.vtype != GGUFValueType.UINT32:
        raise BadGGUFError(f"{KEY_ALIGNMENT} must be u32, not {kv.type_name}", path)
    alignment = int(kv.value)
    if alignment == 0 or alignment & (alignment - 1):
        raise BadGGUFError(f"{KEY_ALIGNMENT} = {alignment} is not a power of two", path)
    if alignment > MAX_ALIGNMENT:
        raise BadGGUFError(
            f"{KEY_ALIGNMENT} = {alignment:,} is larger than the {MAX_ALIGNMENT:,} bytes gguf-mtp accepts "
            "(real files use 32 up to a few KiB)",
            path,
        )
    return alignment


def _read_tensor_table(
    buf: _Buffer, pos: int, tensor_count: int
) -> tuple[list[tuple[str, tuple[int, ...], int, int]], int]:
    """The raw tensor-table entries (name, shape, type, offset) and where the table ends."""
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for index in range(tensor_count):
        name_length = buf.unpack(_U64, pos)
        if name_length >= GGML_MAX_NAME:
            # show a name that is merely too long; never read (or print) a huge one
            shown = f"{buf.string(pos, f'tensor #{index}')[0]!r} " if name_length <= 1024 else ""
            raise BadGGUFError(
                f"tensor #{index} {shown}has a name of {name_length:,} bytes, longer than the "
                f"{GGML_MAX_NAME - 1} bytes llama.cpp allows",
                buf.path,
            )
        name, pos = buf.string(pos, f"tensor #{index}")
        n_dims = buf.unpack(_U32, pos)
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise BadGGUFError(f"tensor {name!r}: n_dims {n_dims} (must be 1..{GGML_MAX_DIMS})", buf.path)
        buf.need(pos + 4 + 8 * n_dims + 12)
        shape = struct.unpack_from(f"<{n_dims}Q", buf.data, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", buf.data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, shape, ggml_type, offset))
    return infos, pos


def _check_tensors(
    infos: Iterable[tuple[str, tuple[int, ...], int, int]], alignment: int, data_size: int, path: str
) -> tuple[TensorInfo, ...]:
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for name, shape, ggml_type, offset in infos:
        if name in seen:
            raise BadGGUFError(f"duplicate tensor name {name!r}", path)
        seen.add(name)
        tensors.append(_checked_tensor(name, shape, ggml_type, offset, alignment, data_size, path))
    _refuse_overlaps(tensors, path)
    return tuple(tensors)


def _checked_tensor(
    name: str, shape: tuple[int, ...], ggml_type: int, offset: int, alignment: int, data_size: int, path: str
) -> TensorInfo:
    """One tensor-table entry, checked: a known type, a sane shape, an aligned offset, inside the data section."""
    if ggml_type_sizes(ggml_type) is None:
        raise BadGGUFError(f"tensor {name!r}: unknown ggml type {ggml_type}", path)
    if any(d >= 1 << 62 for d in shape):
        raise BadGGUFError(f"tensor {name!r}: absurd shape {list(shape)}", path)
    try:
        nbytes = tensor_nbytes(shape, ggml_type)
    except ValueError as e:
        raise BadGGUFError(f"tensor {name!r}: {e}", path) from None
    if offset % alignment:
        raise BadGGUFError(
            f"tensor {name!r}: offset {offset:,} is not a multiple of the alignment {alignment}", path
        )
    if offset + nbytes > data_size:
        raise BadGGUFError(
            f"tensor {name!r} ({ggml_type_name(ggml_type)}, {nbytes:,} bytes at data offset {offset:,}) "
            f"runs past the end of the file (data section holds {data_size:,} bytes)",
            path,
        )
    return TensorInfo(name, tuple(shape), ggml_type, offset, nbytes)


def _refuse_overlaps(tensors: list[TensorInfo], path: str) -> None:
    by_offset = sorted(tensors, key=lambda t: t.offset)
    for before, after in itertools.pairwise(by_offset):
        if before.offset + before.nbytes > after.offset:
            raise BadGGUFError(
                f"tensors {before.name!r} and {after.name!r} overlap ({before.nbytes:,} bytes at {before.offset:,}, "
                f"next at {after.offset:,})",
                path,
            )


def read_header(path: str | os.PathLike[str], *, limit: int | None = None) -> GGUFHeader:
    """Parse the header of a local GGUF file (reads the header bytes only).

    Raises:
        BadGGUFError: the file is missing, unreadable or malformed.
    """
    name = os.fspath(path)
    try:
        fd, info = open_regular(name)  # a named pipe is refused without waiting for a writer
    except FileNotFoundError:
        raise GGUFNotFoundError("no such file", name) from None
    except IsADirectoryError:
        raise BadGGUFError("is a directory, not a GGUF file", name) from None
    except NotARegularFileError:
        raise BadGGUFError("is not a regular file (a pipe, socket or device); give a GGUF file", name) from None
    except OSError as e:
        raise BadGGUFError(f"cannot open: {e.strerror}", name) from None
    try:
        size = info.st_size
        try:
            return parse_header(lambda offset, n: os.pread(fd, n, offset), size, name, limit=limit)
        except IsADirectoryError:
            raise BadGGUFError("is a directory, not a GGUF file", name) from None
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------- encode


def _encode_string(s: str) -> bytes:
    data = s.encode("utf-8", "surrogateescape")
    return _U64.pack(len(data)) + data


def encode_value(vtype: GGUFValueType, value: Any, element_type: GGUFValueType | None = None) -> bytes:
    """Encode a value (without its key and type tag).

    Arrays are given as a :class:`GGUFArray`, or as a list with ``element_type``; items of nested
    arrays must be GGUFArrays.
    """
    fmt = _SCALAR_FORMAT.get(vtype)
    if fmt is not None:
        return fmt.pack(value)
    if vtype == GGUFValueType.STRING:
        return _encode_string(value)
    if vtype != GGUFValueType.ARRAY:
        raise ValueError(f"unknown value type {vtype}")
    if isinstance(value, GGUFArray):
        element_type, items = value.element_type, value.items
    else:
        items = tuple(value)
    if element_type is None:
        raise ValueError("an array needs its element type")
    return _U32.pack(element_type) + _U64.pack(len(items)) + _encode_items(element_type, items)


def _encode_items(element_type: GGUFValueType, items: tuple[Any, ...]) -> bytes:
    """The items of an array of ``element_type``, one after the other (nested arrays as GGUFArrays)."""
    efmt = _SCALAR_FORMAT.get(element_type)
    if efmt is not None:
        return struct.pack(f"<{len(items)}{efmt.format[1:]}", *items)
    if element_type == GGUFValueType.STRING:
        return b"".join(_encode_string(s) for s in items)
    parts = []
    for item in items:
        if not isinstance(item, GGUFArray):
            raise ValueError("items of a nested array must be GGUFArray")
        parts.append(encode_value(GGUFValueType.ARRAY, item))
    return b"".join(parts)


def encode_kv(key: str, vtype: GGUFValueType, value: Any, element_type: GGUFValueType | None = None) -> KeyValue:
    """A new :class:`KeyValue` with its exact file encoding."""
    head = _encode_string(key) + _U32.pack(vtype)
    return KeyValue(key, GGUFValueType(vtype), head + encode_value(vtype, value, element_type), len(head))


def encode_tensor_info(info: TensorInfo) -> bytes:
    """The tensor-table entry of ``info``."""
    return (
        _encode_string(info.name)
        + _U32.pack(len(info.shape))
        + struct.pack(f"<{len(info.shape)}Q", *info.shape)
        + struct.pack("<IQ", info.ggml_type, info.offset)
    )


def serialize_header(version: int, kvs: Iterable[KeyValue], tensors: Sequence[TensorInfo], alignment: int) -> bytes:
    """A complete header (magic .. tensor table), zero-padded to ``alignment`` so data may follow."""
    kv_list = list(kvs)
    parts = [struct.pack("<IIQQ", GGUF_MAGIC, version, len(tensors), len(kv_list))]
    parts.extend(kv.raw for kv in kv_list)
    parts.extend(encode_tensor_info(t) for t in tensors)
    header = b"".join(parts)
    return header + b"\0" * (align_up(len(header), alignment) - len(header))
