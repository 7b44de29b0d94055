"""The converters' writer (:class:`HeadGGUFWriter`) records gguf-py's ``add_*`` calls as the codec's KeyValues:
the header the codec serializes from them is byte-identical to the one gguf-py's own GGUFWriter writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGUFValueType, GGUFWriter

from gguf_mtp.conversion.writer import HeadGGUFWriter
from gguf_mtp.format.header import encode_kv, serialize_header

ARCH = "nemotron_h_moe"


def _calls(writer: GGUFWriter) -> None:
    """Every kind of value a converter (or gguf-py's ``add_*`` helpers) writes."""
    writer.add_name("tiny MTP head")
    writer.add_block_count(4)
    writer.add_context_length(262_144)
    writer.add_embedding_length(512)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_weights_norm(True)
    writer.add_expert_weights_scale(2.5)
    writer.add_uint8("t.u8", 255)
    writer.add_int8("t.i8", -128)
    writer.add_uint16("t.u16", 65_535)
    writer.add_int16("t.i16", -32_768)
    writer.add_int32("t.i32", -(2**31))
    writer.add_uint64("t.u64", 2**64 - 1)
    writer.add_int64("t.i64", -(2**63))
    writer.add_float64("t.f64", 0.1)
    writer.add_string("t.str", "naïve ✓")
    writer.add_key_value("t.bytes_str", "raw \xff".encode("utf-8", "surrogateescape"), GGUFValueType.STRING)
    writer.add_rope_dimension_sections([11, 11, 10, 0])  # a list of ints: i32, like gguf-py infers it
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.strings", ["a", "", "ü"])
    writer.add_array("t.bools", [True, False])
    writer.add_array("t.nested", [[1, 2], [3]])
    writer.add_array("t.bytes", b"\x00\x01\xff")
    writer.add_key_value("t.u32s", [1, 2, 3], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
    writer.add_block_count(5)  # set twice: the new value, in the first place (gguf-py warns and overwrites)
    writer.add_nextn_predict_layers(1)


def _gguf_py_header(path: Path, alignment: int | None, calls: Callable[[GGUFWriter], None]) -> bytes:
    writer = GGUFWriter(path, ARCH)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    calls(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("alignment", [None, 64])
def test_recorded_header_is_byte_identical_to_gguf_pys(tmp_path: Path, alignment: int | None) -> None:
    expected = _gguf_py_header(tmp_path / "gguf-py.gguf", alignment, _calls)
    recorder = HeadGGUFWriter(ARCH, alignment=alignment)
    _calls(recorder)
    assert serialize_header(3, recorder.kvs, [], 1) == expected
    assert recorder.alignment == (alignment or 32)
    keys = [kv.key for kv in recorder.kvs]
    first = ["general.architecture", *(["general.alignment"] if alignment else []), "general.name"]
    assert keys[: len(first)] == first
    assert keys.count(f"{ARCH}.block_count") == 1 and recorder.kvs[keys.index(f"{ARCH}.block_count")].value == 5


def test_copied_kvs_keep_their_bytes_and_replace_in_place() -> None:
    recorder = HeadGGUFWriter(ARCH)
    recorder.add_block_count(4)
    odd = encode_kv(f"{ARCH}.block_count", GGUFValueType.UINT64, 9)  # a type gguf-py's helper would not pick
    recorder.add_copied_kv(odd)
    assert [kv.key for kv in recorder.kvs] == ["general.architecture", f"{ARCH}.block_count"]
    assert recorder.kvs[1] is odd
    recorder.remove_key("general.architecture")
    assert recorder.kvs == [odd]
    recorder.clear_kvs()
    assert recorder.kvs == []


@pytest.mark.parametrize(
    ("value", "sub_type", "message"),
    [
        ([], None, "an empty GGUF array needs its element type"),
        ([1, "a"], None, "all items of a GGUF array must have the same type"),
        (7, None, "a GGUF array needs a sequence, not int"),
    ],
)
def test_arrays_gguf_py_cannot_write_are_refused(value: object, sub_type: GGUFValueType | None, message: str) -> None:
    recorder = HeadGGUFWriter(ARCH)
    with pytest.raises(ValueError, match=f"^t.a: {message}$"):
        recorder.add_key_value("t.a", value, GGUFValueType.ARRAY, sub_type)


def test_an_empty_array_with_its_element_type_is_written() -> None:
    recorder = HeadGGUFWriter(ARCH)
    recorder.add_key_value("t.empty", [], GGUFValueType.ARRAY, GGUFValueType.INT32)
    kv = recorder.kvs[-1]
    assert (kv.element_type, kv.value, kv.raw[-12:]) == (GGUFValueType.INT32, [], b"\x05\0\0\0" + b"\0" * 8)
