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

import itertools
import os
import stat
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from .constants import KEY_ALIGNMENT, MAX_HEADER_BYTES
from .errors import BadGGUFError

__all__ = [
    "GGUFArray",
    "GGUFHeader",
    "KeyValue",
    "TensorInfo",
    "align_up",
    "encode_kv",
    "encode_tensor_info",
    "encode_value",
    "parse_header",
    "read_header",
    "serialize_header",
    "tensor_nbytes",
]

GGML_MAX_DIMS = 4
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


def tensor_nbytes(shape: Sequence[int], ggml_type: int) -> int:
    """Byte size of a tensor of ``shape`` (ggml order, ne0 first) stored as ``ggml_type``.

    Raises:
        ValueError: unknown type, or ne0 not a multiple of the type's block size.
    """
    qtype = GGMLQuantizationType(ggml_type)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if shape and shape[0] % block_size:
        raise ValueError(f"ne0={shape[0]} is not a multiple of {qtype.name}'s block size {block_size}")
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


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. ``offset`` is relative to the data section, like in the file."""

    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (innermost) first
    ggml_type: int
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

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
    kvs: dict[str, KeyValue]
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
        """Bytes from the start of the data section to the end of the file."""
        return self.file_size - self.data_offset

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
        if end <= len(self.data):
            return
        if end > self.file_size:
            raise BadGGUFError(
                f"truncated in {self.section} (needs byte {end:,}, file has {self.file_size:,})", self.path
            )
        if end > self.limit:
            raise BadGGUFError(
                f"header larger than the {self.limit:,}-byte limit while reading {self.section}", self.path
            )
        want = min(max(end - len(self.data), len(self.data), self.min_read), self.file_size - len(self.data))
        chunk = self.read_at(len(self.data), want)
        if len(chunk) < end - len(self.data):
            raise BadGGUFError(f"truncated in {self.section} (short read at byte {len(self.data):,})", self.path)
        self.data += chunk

    def unpack(self, fmt: struct.Struct, pos: int) -> Any:
        self.need(pos + fmt.size)
        return fmt.unpack_from(self.data, pos)[0]

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
    limit: int = MAX_HEADER_BYTES,
    min_read: int = 1 << 20,
) -> GGUFHeader:
    """Parse a GGUF header from a random-access byte source.

    Args:
        read_at: ``read_at(offset, size)`` returns up to ``size`` bytes at ``offset``.
        file_size: total size of the file (bounds every count and offset).
        path: the file's name, used in error messages.
        limit: the most header bytes to read before giving up.
        min_read: the fewest bytes asked of ``read_at`` at a time (reads grow by doubling from there; a
            remote source asks for little, a local file for 1 MiB).

    Returns:
        The parsed :class:`GGUFHeader`; tensor sizes, alignment, overlaps and file bounds are checked.

    Raises:
        BadGGUFError: the bytes are not a well-formed GGUF header, or a tensor lies outside the file.
    """
    buf = _Buffer(read_at, file_size, path, limit, min_read)
    buf.need(24)
    if bytes(buf.data[:4]) != struct.pack("<I", GGUF_MAGIC):
        raise BadGGUFError(f"not a GGUF file (magic {bytes(buf.data[:4])!r}, expected b'GGUF')", path)
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

    pos = 24
    kvs: dict[str, KeyValue] = {}
    buf.section = "the KV table"
    for index in range(kv_count):
        start = pos
        key, pos = buf.string(pos, f"KV #{index}")
        what = f"KV {key!r}"
        vtype = _value_type(buf.unpack(_U32, pos), buf, what)
        value_pos = pos + 4
        pos = _skip_value(buf, value_pos, vtype, what)
        if key in kvs:
            raise BadGGUFError(f"duplicate key {key!r}", path)
        kvs[key] = KeyValue(key, vtype, bytes(buf.data[start:pos]), value_pos - start)

    alignment = GGUF_DEFAULT_ALIGNMENT
    if KEY_ALIGNMENT in kvs:
        kv = kvs[KEY_ALIGNMENT]
        if kv.vtype != GGUFValueType.UINT32:
            raise BadGGUFError(f"{KEY_ALIGNMENT} must be u32, not {kv.type_name}", path)
        alignment = kv.value
        if alignment == 0 or alignment & (alignment - 1):
            raise BadGGUFError(f"{KEY_ALIGNMENT} = {alignment} is not a power of two", path)

    buf.section = "the tensor table"
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    for index in range(tensor_count):
        name, pos = buf.string(pos, f"tensor #{index}")
        n_dims = buf.unpack(_U32, pos)
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise BadGGUFError(f"tensor {name!r}: n_dims {n_dims} (must be 1..{GGML_MAX_DIMS})", path)
        buf.need(pos + 4 + 8 * n_dims + 12)
        shape = struct.unpack_from(f"<{n_dims}Q", buf.data, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", buf.data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, shape, ggml_type, offset))
    header_size = pos
    data_offset = align_up(header_size, alignment)
    if data_offset > file_size:
        raise BadGGUFError(f"truncated before the data section (needs {data_offset:,} bytes)", path)

    tensors = _check_tensors(infos, alignment, file_size - data_offset, path)
    return GGUFHeader(path, version, kvs, tensors, alignment, header_size, data_offset, file_size)


def _check_tensors(
    infos: Iterable[tuple[str, tuple[int, ...], int, int]], alignment: int, data_size: int, path: str
) -> tuple[TensorInfo, ...]:
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for name, shape, ggml_type, offset in infos:
        if name in seen:
            raise BadGGUFError(f"duplicate tensor name {name!r}", path)
        seen.add(name)
        if (
            ggml_type not in GGMLQuantizationType._value2member_map_
            or GGMLQuantizationType(ggml_type) not in GGML_QUANT_SIZES
        ):
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
                f"tensor {name!r} ({GGMLQuantizationType(ggml_type).name}, {nbytes:,} bytes at data offset {offset:,}) "
                f"runs past the end of the file (data section holds {data_size:,} bytes)",
                path,
            )
        tensors.append(TensorInfo(name, tuple(shape), ggml_type, offset, nbytes))
    by_offset = sorted(tensors, key=lambda t: t.offset)
    for before, after in itertools.pairwise(by_offset):
        if before.offset + before.nbytes > after.offset:
            raise BadGGUFError(
                f"tensors {before.name!r} and {after.name!r} overlap ({before.nbytes:,} bytes at {before.offset:,}, "
                f"next at {after.offset:,})",
                path,
            )
    return tuple(tensors)


def read_header(path: str | os.PathLike[str], *, limit: int = MAX_HEADER_BYTES) -> GGUFHeader:
    """Parse the header of a local GGUF file (reads the header bytes only).

    Raises:
        BadGGUFError: the file is missing, unreadable or malformed.
    """
    name = os.fspath(path)
    try:
        # O_NONBLOCK: opening a named pipe must not wait for a writer (it is refused just below).
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise BadGGUFError("no such file", name) from None
    except IsADirectoryError:
        raise BadGGUFError("is a directory, not a GGUF file", name) from None
    except OSError as e:
        raise BadGGUFError(f"cannot open: {e.strerror}", name) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise BadGGUFError("is a directory, not a GGUF file", name)
        if not stat.S_ISREG(info.st_mode):
            raise BadGGUFError("is not a regular file (a pipe, socket or device); give a GGUF file", name)
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
    parts = [_U32.pack(element_type), _U64.pack(len(items))]
    efmt = _SCALAR_FORMAT.get(element_type)
    if efmt is not None:
        parts.append(struct.pack(f"<{len(items)}{efmt.format[1:]}", *items))
    elif element_type == GGUFValueType.STRING:
        parts.extend(_encode_string(s) for s in items)
    else:
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
