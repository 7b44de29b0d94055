"""The set id: which run wrote a shard, so that a set mixed from two runs is noticed.

Every shard ``compose`` writes carries the KV :data:`SET_ID_KEY` (``gguf_mtp.set_id``), a string of 32
hex digits: the first 128 bits of the sha256 of the planned set's headers, concatenated in shard order,
each written with a placeholder of 32 zeros in place of the id. It is a pure function of the plan, so
the same inputs give the same bytes on every run, while two runs that differ in anything a header says
(another draft, another ``--set-kv``, another target) give different ids; ``verify`` fails a set whose
shards do not all carry the same id ("shards come from different runs").

The KV is added before :func:`gguf_mtp.format.layout.congruent_header` pads the header, and the real id has
the placeholder's length, so putting it in changes no offset. ``strip`` and ``extract`` drop it (a
stripped composite is its target again, byte for byte).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from gguf.constants import GGUFValueType

from gguf_mtp.format.header import GGUFHeader, KeyValue, encode_kv

__all__ = [
    "SET_ID_KEY",
    "placeholder_kv",
    "set_id_of",
    "set_id_problems",
    "stamp_set_id",
    "without_set_id",
]

SET_ID_KEY = "gguf_mtp.set_id"
_ID_CHARS = 32
_PLACEHOLDER = "0" * _ID_CHARS


def placeholder_kv() -> KeyValue:
    """The set-id KV with its placeholder value, to plan a header with before the id is known."""
    return encode_kv(SET_ID_KEY, GGUFValueType.STRING, _PLACEHOLDER)


def without_set_id(kvs: Iterable[KeyValue]) -> list[KeyValue]:
    """``kvs`` without a set-id KV (an input made by gguf-mtp's compose carries one).

    Other ``gguf_mtp.*`` keys stay (``--set-kv`` refuses the namespace, but a file from elsewhere may carry
    them), and the padding KV is handled by :mod:`gguf_mtp.format.layout`.
    """
    return [kv for kv in kvs if kv.key != SET_ID_KEY]


def stamp_set_id(headers: Sequence[bytes]) -> list[bytes]:
    """Put the set id in place of the placeholder KV in each planned header.

    The placeholder is the last KV but the padding (whose bytes cannot hold it), and the tensor table's
    names are too short to, so its last occurrence in a header is the KV itself.

    Returns:
        The headers, in the same order, of the same lengths.
    """
    placeholder = placeholder_kv().raw
    digest = hashlib.sha256()
    for header in headers:
        digest.update(header)
    stamped = encode_kv(SET_ID_KEY, GGUFValueType.STRING, digest.hexdigest()[:_ID_CHARS]).raw
    result = []
    for header in headers:
        at = header.rfind(placeholder)
        if at < 0:
            raise AssertionError("a planned header must hold the set-id placeholder")
        result.append(header[:at] + stamped + header[at + len(stamped) :])
    return result


def set_id_of(header: GGUFHeader) -> str | None:
    """The set id a shard's header carries, or ``None``."""
    kv = header.kvs.get(SET_ID_KEY)
    if kv is None:
        return None
    return kv.value if isinstance(kv.value, str) else repr(kv.value)


def set_id_problems(headers: Sequence[tuple[str, GGUFHeader | None]]) -> list[str]:
    """One problem when the shards ``(label, header)`` of a set that carry a set id do not all carry the
    same one.

    Shards without a set id are not counted: a set gguf-mtp's compose did not write has none, and
    llama.cpp's ``gguf-split`` keeps the metadata (the id included) in the first shard only.
    """
    ids = [(label, value) for label, header in headers if header is not None
           for value in [set_id_of(header)] if value is not None]
    if len({value for _, value in ids}) <= 1:
        return []
    first_label, first = ids[0]
    other_label, other = next((label, value) for label, value in ids if value != first)
    return [f"shards come from different runs: {first_label} has set id {first}, {other_label} has {other}"]
