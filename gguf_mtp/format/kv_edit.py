"""Typed metadata values: ``set_kv`` overrides (``--set-kv``) and range-checked integer encodings.

An override of an existing key keeps that key's type, and its value must parse as that type; a new
key must say its type (``KEY:TYPE=VALUE``). Nothing is ever silently coerced into another type.
"""

from __future__ import annotations

import math
import numbers
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gguf.constants import GGUFValueType

from gguf_mtp.errors import BadGGUFError, KVEditError

from .header import TYPE_BY_NAME, GGUFHeader, KeyValue, describe_type, encode_kv

__all__ = [
    "INT_RANGES",
    "KVChange",
    "KVOverride",
    "apply_kv_edits",
    "check_int",
    "misfit",
    "parse_set_kv",
    "resolve_override",
    "with_int_value",
]

INT_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    GGUFValueType.UINT8: (0, 2**8 - 1),
    GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1),
    GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1),
    GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1),
    GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}
_FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)
#: The largest finite float32.
_F32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class KVOverride:
    """One ``set_kv`` request, not yet checked against a file."""

    key: str
    type_name: str | None
    text: str

    def __str__(self) -> str:
        return f"{self.key}{':' + self.type_name if self.type_name else ''}={self.text}"


def parse_set_kv(spec: str) -> KVOverride:
    """Parse ``KEY=VALUE`` or ``KEY:TYPE=VALUE`` (TYPE in u8,i8,u16,i16,u32,i32,u64,i64,f32,f64,bool,str).

    Raises:
        KVEditError: the text is not of that form or TYPE is unknown.
    """
    left, sep, text = spec.partition("=")
    if not sep or not left:
        raise KVEditError(f"set_kv {spec!r}: expected KEY=VALUE or KEY:TYPE=VALUE")
    key, colon, type_name = left.partition(":")
    if not key:
        raise KVEditError(f"set_kv {spec!r}: empty key")
    if colon and type_name not in TYPE_BY_NAME:
        raise KVEditError(f"set_kv {spec!r}: unknown type {type_name!r} (use one of {', '.join(TYPE_BY_NAME)})")
    return KVOverride(key, type_name if colon else None, text)


def misfit(value: Any, vtype: GGUFValueType) -> str | None:
    """Why ``value`` cannot be encoded as a GGUF scalar of type ``vtype`` (``"u32 holds 0..4,294,967,295"``),
    or ``None`` when it can: the one range and type check every value written as metadata passes."""
    name = describe_type(vtype)
    if vtype in INT_RANGES:
        return _int_misfit(value, vtype, name)
    if vtype in _FLOATS:
        return _float_misfit(value, vtype, name)
    if vtype == GGUFValueType.BOOL:
        return None if isinstance(value, bool) else f"{name} holds true or false"
    if vtype == GGUFValueType.STRING:
        return None if isinstance(value, (str, bytes, bytearray)) else f"{name} holds text"
    return None


def _int_misfit(value: Any, vtype: GGUFValueType, name: str) -> str | None:
    lo, hi = INT_RANGES[vtype]
    if not isinstance(value, numbers.Integral):
        return f"{name} holds integers"
    return None if lo <= int(value) <= hi else f"{name} holds {lo:,}..{hi:,}"


def _float_misfit(value: Any, vtype: GGUFValueType, name: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{name} holds numbers"
    if isinstance(value, float) and not math.isfinite(value):
        return None  # inf and nan are float32 and float64 values
    largest = _F32_MAX if vtype == GGUFValueType.FLOAT32 else sys.float_info.max
    magnitude = abs(int(value)) if isinstance(value, numbers.Integral) else abs(float(value))
    return None if magnitude <= largest else f"{name} holds at most {largest:.4g}"


def check_int(value: int, vtype: GGUFValueType, what: str) -> int:
    """``value`` if it fits integer type ``vtype``, else a :class:`KVEditError`."""
    lo, hi = INT_RANGES[vtype]
    if not lo <= value <= hi:
        raise KVEditError(f"{what}: {value} does not fit {describe_type(vtype)} ({lo}..{hi})")
    return value


def _parse_value(text: str, vtype: GGUFValueType, what: str) -> Any:
    if vtype in INT_RANGES:
        try:
            value = int(text, 0)
        except ValueError:
            raise KVEditError(f"{what}: {text!r} is not an integer ({describe_type(vtype)})") from None
        return check_int(value, vtype, what)
    if vtype in _FLOATS:
        try:
            number = float(text)
        except ValueError:
            raise KVEditError(f"{what}: {text!r} is not a number ({describe_type(vtype)})") from None
        reason = misfit(number, vtype)
        if reason is not None:  # only f32 can overflow: a larger float64 text parses as inf
            raise KVEditError(f"{what}: {text!r} does not fit {describe_type(vtype)} ({reason})")
        return number
    if vtype == GGUFValueType.BOOL:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise KVEditError(f"{what}: {text!r} is not a boolean (true/false)")
    if vtype == GGUFValueType.STRING:
        return text
    raise KVEditError(f"{what}: cannot set a value of type {describe_type(vtype)}")


def resolve_override(override: KVOverride, existing: KeyValue | None) -> KeyValue:
    """The encoded KV an override asks for, checked against the existing KV of the same key.

    Raises:
        KVEditError: a type change on an existing key, a missing type on a new key, an array key, or a
            value that does not parse as the type.
    """
    what = f"set_kv {override}"
    if existing is not None:
        if existing.is_array:
            raise KVEditError(f"{what}: {override.key} is an array ({existing.type_name}); arrays cannot be set")
        vtype = existing.vtype
        if override.type_name and TYPE_BY_NAME[override.type_name] != vtype:
            raise KVEditError(
                f"{what}: {override.key} is {existing.type_name} in the target; its type cannot change "
                f"(use {override.key}={override.text})"
            )
    else:
        if override.type_name is None:
            raise KVEditError(
                f"{what}: {override.key} is a new key, so give its type: {override.key}:TYPE={override.text}"
            )
        vtype = TYPE_BY_NAME[override.type_name]
    return encode_kv(override.key, vtype, _parse_value(override.text, vtype, what))


@dataclass(frozen=True)
class KVChange:
    """One metadata change in one output file (``old`` is ``None`` for an added key, ``new`` for a removed one)."""

    file: str
    key: str
    type_name: str
    old: Any
    new: Any

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "key": self.key, "type": self.type_name, "old": self.old, "new": self.new}


def with_int_value(header: GGUFHeader, key: str, value: int) -> KeyValue:
    """``key`` of ``header`` set to ``value``, in the key's own integer type (pitfall: never retype a count).

    Raises:
        BadGGUFError: the key is not of an integer type.
        KVEditError: ``value`` does not fit that type.
    """
    kv = header.kvs[key]
    if kv.vtype not in INT_RANGES:
        raise BadGGUFError(f"{key} has type {kv.type_name}, not an integer type", header.path)
    return encode_kv(key, kv.vtype, check_int(value, kv.vtype, f"{header.path}: {key}"))


def apply_kv_edits(
    header: GGUFHeader, edits: Mapping[str, KeyValue | None], file_name: str
) -> tuple[list[KeyValue], list[KVChange]]:
    """The header's KVs with ``edits`` applied: replaced in place, removed (``None``) or appended (new
    keys, in the order of ``edits``); every other KV is kept byte for byte. Also returns the changes."""
    kvs: list[KeyValue] = []
    changes: list[KVChange] = []
    for key, kv in header.kvs.items():
        if key not in edits:
            kvs.append(kv)
            continue
        new = edits[key]
        if new is None:
            changes.append(KVChange(file_name, key, kv.type_name, kv.value, None))
            continue
        kvs.append(new)
        if new.raw != kv.raw:
            changes.append(KVChange(file_name, key, new.type_name, kv.value, new.value))
    for key, new in edits.items():
        if key not in header.kvs and new is not None:
            kvs.append(new)
            changes.append(KVChange(file_name, key, new.type_name, None, new.value))
    return kvs, changes
