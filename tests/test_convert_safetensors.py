"""The torch-free safetensors reader and the synthetic MTPv2 checkpoint writer, cross-checked against the
``safetensors`` package (the format's reference implementation) and a naive reader."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from support.convert_support import raw_tensor, write_raw_safetensors

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import MAX_HEADER_BYTES, SafetensorsFile, open_checkpoint
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import with_hparams


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    return {dtype: write_mtpv2_checkpoint(root / dtype, files=2, dtype=dtype) for dtype in ("bfloat16", "float32")}


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def test_f32_checkpoint_reads_the_same_as_with_the_safetensors_package(heads: dict[str, Path]) -> None:
    checkpoint = open_checkpoint(heads["float32"])
    seen = 0
    for path in _files(heads["float32"]):
        with safe_open(str(path), framework="numpy") as reference:
            for name in reference.keys():  # noqa: SIM118 (safe_open is not a mapping)
                assert np.array_equal(checkpoint.tensors[name].numpy(), reference.get_tensor(name)), name
                seen += 1
    assert seen == len(checkpoint.tensors) > 0


def test_bf16_checkpoint_headers_agree_with_the_safetensors_package(heads: dict[str, Path]) -> None:
    checkpoint = open_checkpoint(heads["bfloat16"])
    for path in _files(heads["bfloat16"]):
        with safe_open(str(path), framework="numpy") as reference:
            for name in reference.keys():  # noqa: SIM118
                entry = reference.get_slice(name)
                assert (entry.get_dtype(), tuple(entry.get_shape())) == (
                    checkpoint.tensors[name].dtype, checkpoint.tensors[name].shape), name


def test_bf16_tensors_read_as_their_raw_uint16_bits(heads: dict[str, Path]) -> None:
    checkpoint = open_checkpoint(heads["bfloat16"])
    tensor = checkpoint.tensors["mtp.layers.0.eh_proj.weight"]
    _, shape, raw = raw_tensor(heads["bfloat16"], tensor.name)
    view = tensor.numpy()
    assert view.dtype == np.uint16 and view.shape == shape
    assert view.tobytes() == raw


def test_routing_bias_is_f32_in_a_bf16_checkpoint_as_in_nvidias(heads: dict[str, Path]) -> None:
    checkpoint = open_checkpoint(heads["bfloat16"])
    dtypes = {t.name: t.dtype for t in checkpoint}
    assert dtypes.pop("mtp.layers.1.mixer.gate.e_score_correction_bias") == "F32"
    assert set(dtypes.values()) == {"BF16"}


def test_read_rows_reads_a_run_of_rows_into_a_reused_buffer(heads: dict[str, Path]) -> None:
    tensor = open_checkpoint(heads["bfloat16"]).tensors["mtp.layers.0.mixer.q_proj.weight"]
    whole = tensor.numpy()
    fd = os.open(tensor.path, os.O_RDONLY)
    try:
        first = tensor.read_rows(fd, 0, 16)
        again = tensor.read_rows(fd, 100, 8, out=first.reshape(-1))
    finally:
        os.close(fd)
    assert np.array_equal(again, whole[100:108])
    assert np.shares_memory(again, first)


def test_index_maps_every_tensor_to_the_file_that_holds_it(heads: dict[str, Path]) -> None:
    folder = heads["bfloat16"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    held = {name: path.name for path in _files(folder) for name in SafetensorsFile(path).tensors}
    assert index["weight_map"] == held
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in open_checkpoint(folder).tensors.values())


def test_tensors_iterate_in_natural_order(tmp_path: Path) -> None:
    folder = write_mtpv2_checkpoint(tmp_path / "h", hparams=with_hparams(n_expert=12), files=1)
    experts = [t.name for t in open_checkpoint(folder) if t.name.endswith("up_proj.weight") and ".experts." in t.name]
    assert experts == [f"mtp.layers.1.mixer.experts.{e}.up_proj.weight" for e in range(12)]


def test_every_tensor_has_its_own_values(heads: dict[str, Path]) -> None:
    # A tensor written under another's name must be caught by value comparisons.
    checkpoint = open_checkpoint(heads["bfloat16"])
    payloads = [t.numpy().tobytes() for t in checkpoint]
    assert len(set(payloads)) == len(payloads)


def test_values_do_not_depend_on_how_the_checkpoint_is_split(heads: dict[str, Path], tmp_path: Path) -> None:
    one = open_checkpoint(write_mtpv2_checkpoint(tmp_path / "one", files=1))
    two = open_checkpoint(heads["bfloat16"])
    assert {n: t.numpy().tobytes() for n, t in one.tensors.items()} == {
        n: t.numpy().tobytes() for n, t in two.tensors.items()}


def test_bytes_that_do_not_fit_the_shape_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    write_raw_safetensors(path, {"x": ("F32", [3], b"\0" * 8)})
    with pytest.raises(CheckpointError, match="8 bytes do not hold a F32 tensor of shape \\[3\\]"):
        SafetensorsFile(path)


def test_overlapping_tensors_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    header = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    write_raw_safetensors(path, {"a": ("F32", [3], b"\0" * 12)}, header_override=header)
    with pytest.raises(CheckpointError, match="'a' and 'b' overlap"):
        SafetensorsFile(path)


def test_unknown_dtype_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    write_raw_safetensors(path, {"x": ("C64", [1], b"\0" * 8)})
    with pytest.raises(CheckpointError, match="unknown dtype 'C64'"):
        SafetensorsFile(path)


def test_file_too_short_for_a_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x10\0\0")
    with pytest.raises(CheckpointError, match="too short for a header"):
        SafetensorsFile(path)


def test_header_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    write_raw_safetensors(path, {}, header_override=b"{not json}")
    with pytest.raises(CheckpointError, match="corrupt safetensors header: not valid JSON"):
        SafetensorsFile(path)


def _bytes_reader(data: bytes) -> Callable[[int, int], bytes]:
    return lambda offset, n: data[offset : offset + n]


_MALFORMED_HEADS = {
    "too short": b"\x10\0\0",
    "length past the file": (1000).to_bytes(8, "little") + b"{}",
    "length past the bound": (MAX_HEADER_BYTES + 1).to_bytes(8, "little") + b"{}",
    "not JSON": (10).to_bytes(8, "little") + b"{not json}",
}


@pytest.mark.parametrize("data", _MALFORMED_HEADS.values(), ids=_MALFORMED_HEADS.keys())
def test_a_header_read_elsewhere_gets_the_local_files_checks_and_messages(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as local:
        SafetensorsFile(path)
    with pytest.raises(CheckpointError) as remote:
        SafetensorsFile.from_reader(str(path), len(data), _bytes_reader(data))
    assert remote.value.message == local.value.message and remote.value.path == local.value.path


def test_a_header_whose_reader_stops_early_names_where_the_file_ended() -> None:
    data = (16).to_bytes(8, "little") + b'{"a": 1}' + b" " * 8
    stopping = _bytes_reader(data[:12])  # an answer cut short after 4 of the header's 16 bytes
    with pytest.raises(CheckpointError, match=r"corrupt safetensors header: the file ended after 12 bytes"):
        SafetensorsFile.from_reader("hf://o/r/model.safetensors", len(data), stopping)
