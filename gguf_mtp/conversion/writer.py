"""gguf-py's :class:`~gguf.GGUFWriter` API recording KVs for this project's header codec (:class:`HeadGGUFWriter`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUFValueType, GGUFWriter

from gguf_mtp.format.header import GGUFArray, KeyValue, encode_kv
from gguf_mtp.format.kv_edit import misfit

from .hparams import KVValueError

__all__ = ["HeadGGUFWriter"]



class HeadGGUFWriter(GGUFWriter):
    """Records the metadata a converter sets through gguf-py's :class:`~gguf.GGUFWriter` API as
    :class:`~gguf_mtp.format.header.KeyValue` entries, encoded by this project's codec.

    Converters keep llama.cpp's shape: :meth:`HeadModel.set_gguf_parameters` calls the writer's public
    ``add_*`` methods (``add_block_count``, ``add_expert_count``...), which gguf-py turns into key names
    and value types and hands to :meth:`add_key_value`, the one method overridden here. Nothing else of
    gguf-py's writer is used: it never opens a file, and the header is rendered by
    :func:`gguf_mtp.format.header.serialize_header` from :attr:`kvs` and tensor infos the plan lays out
    (the codec is the only serializer). KVs copied byte-exactly from another GGUF keep their encoding
    (:meth:`add_copied_kv`), whatever their type.
    """

    def __init__(self, arch: str, *, alignment: int | None = None) -> None:
        self._kvs: dict[str, KeyValue] = {}  # before super().__init__, which adds general.architecture
        super().__init__(None, arch)
        if alignment is not None and alignment != GGUF_DEFAULT_ALIGNMENT:
            self.add_custom_alignment(alignment)

    def add_key_value(self, key: str, val: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> None:
        """Encode and record one KV (a key set twice keeps its place and takes the new value, as in gguf-py).

        Every value (every item of an array) is checked against the type it is written as, here and only here
        (:func:`~gguf_mtp.format.kv_edit.misfit`): a hyperparameter that does not fit its GGUF field never reaches
        the encoder.

        Raises:
            KVValueError: a value that does not fit its type (a float32 beyond 3.4e38, an entry of an i32 array
                beyond 2^31, a count beyond u32); :meth:`HeadModel.writing_config_values` names its config key.
            ValueError: a value gguf-py could not write either (an empty array without ``sub_type``, an array
                of mixed types, an unknown type).
        """
        vtype = GGUFValueType(vtype)
        if vtype == GGUFValueType.ARRAY:
            array = _typed_array(val, sub_type, key)
            _check_fits(key, array)
            self._kvs[key] = encode_kv(key, vtype, array)
        else:
            value = _scalar(val, vtype)
            _check_fits(key, value, vtype)
            self._kvs[key] = encode_kv(key, vtype, value)

    def remove_key(self, key: str) -> None:
        """Drop ``key`` if it was set."""
        self._kvs.pop(key, None)

    def add_copied_kv(self, kv: KeyValue) -> None:
        """Add (or replace) a KV with its exact encoding, e.g. taken from the target model."""
        self._kvs[kv.key] = kv

    def clear_kvs(self) -> None:
        """Drop every KV, ``general.architecture`` included (to re-add them in another file's order)."""
        self._kvs.clear()

    @property
    def kvs(self) -> list[KeyValue]:
        """The recorded KVs, in the order they were first set."""
        return list(self._kvs.values())

    @property
    def alignment(self) -> int:
        """The data alignment (``general.alignment`` when set, else GGUF's default of 32)."""
        return self.data_alignment


def _check_fits(key: str, value: Any, vtype: GGUFValueType | None = None) -> None:
    """Raise :class:`KVValueError` unless ``value`` (a scalar of ``vtype``, or a :class:`GGUFArray`) fits."""
    if isinstance(value, GGUFArray):
        for item in value.items:
            _check_fits(key, item, value.element_type)
        return
    assert vtype is not None
    reason = misfit(value, vtype)
    if reason is not None:
        raise KVValueError(key, value, reason)


def _scalar(val: Any, vtype: GGUFValueType) -> Any:
    """A scalar as the codec takes it: strings as ``str`` (bytes are kept exactly through surrogateescape)."""
    if vtype == GGUFValueType.STRING and isinstance(val, (bytes, bytearray)):
        return bytes(val).decode("utf-8", "surrogateescape")
    return val


def _typed_array(val: Any, sub_type: GGUFValueType | None, key: str) -> GGUFArray:
    """A gguf-py array value (a list, or ``bytes`` for u8) as a :class:`GGUFArray`, its element type
    ``sub_type`` or, like gguf-py, the type of its items (``int`` -> i32, ``float`` -> f32, ``str``)."""
    if isinstance(val, (bytes, bytearray)):
        return GGUFArray(sub_type or GGUFValueType.UINT8, tuple(val))
    if not isinstance(val, Sequence) or isinstance(val, str):
        raise ValueError(f"{key}: a GGUF array needs a sequence, not {type(val).__name__}")
    if sub_type is None:
        if not val:
            raise ValueError(f"{key}: an empty GGUF array needs its element type")
        sub_type = GGUFValueType.get_type(val[0])
        if any(GGUFValueType.get_type(item) is not sub_type for item in val[1:]):
            raise ValueError(f"{key}: all items of a GGUF array must have the same type")
    etype = GGUFValueType(sub_type)
    if etype == GGUFValueType.ARRAY:
        return GGUFArray(etype, tuple(item if isinstance(item, GGUFArray) else _typed_array(item, None, key)
                                      for item in val))
    return GGUFArray(etype, tuple(_scalar(item, etype) for item in val))


