"""The typed config.json accessors every converter reads its hyperparameters through (issue 11, item 9), and the
one check of every value a converter writes against its GGUF type (issue 21, items 9 and 10)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from support.qwen_checkpoints import N_TRUNK, QwenDims, write_qwen_checkpoint

from gguf_mtp.cli import main
from gguf_mtp.conversion.hparams import (
    LLAMA_MAX_EXPERTS,
    MAX_WIDTH,
    KVValueError,
    config_bool,
    config_float,
    config_int,
)
from gguf_mtp.conversion.writer import HeadGGUFWriter
from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.header import GGUFArray, TensorInfo, encode_kv, read_header, serialize_header
from gguf_mtp.jobs.convert import convert

WHERE = Path("/ckpt/config.json")


@pytest.mark.parametrize(("value", "message"), [
    (256.0, "hidden_size = 256.0 is not an integer (expected 1..1,048,576)"),
    ("4k", 'hidden_size = "4k" is not an integer'),
    ("256", 'hidden_size = "256" is not an integer'),
    (True, "hidden_size = true is not an integer"),
    (1e30, "hidden_size = 1e+30 is not an integer"),
    ([256], "hidden_size = [256] is not an integer"),
    (-1, "hidden_size = -1 is out of range (expected 1..1,048,576)"),
    (0, "hidden_size = 0 is out of range"),
    (MAX_WIDTH + 1, "hidden_size = 1,048,577 is out of range"),
])
def test_config_int_refuses_wrong_types_and_ranges_naming_key_and_value(value: object, message: str) -> None:
    with pytest.raises(CheckpointError) as info:
        config_int({"hidden_size": value}, "hidden_size", where=WHERE)
    assert str(info.value).startswith(f"{WHERE}: {message}")


def test_config_int_takes_the_first_spelling_set_and_treats_null_as_absent() -> None:
    config = {"hidden_size": None, "d_model": 512}
    assert config_int(config, ["hidden_size", "d_model"], where=WHERE) == 512
    assert config_int({}, "moe_latent_size", where=WHERE, optional=True) is None
    with pytest.raises(CheckpointError, match="config.json has none of hidden_size, d_model"):
        config_int({"hidden_size": None}, ["hidden_size", "d_model"], where=WHERE)
    with pytest.raises(CheckpointError, match="config.json has no head_dim"):
        config_int({}, "head_dim", where=WHERE)


def test_config_int_says_why_a_maximum_is_what_it_is() -> None:
    limit = "llama.cpp loads at most 1024 experts (LLAMA_MAX_EXPERTS)"
    assert config_int({"e": LLAMA_MAX_EXPERTS}, "e", where=WHERE, maximum=LLAMA_MAX_EXPERTS, limit=limit) == 1024
    with pytest.raises(CheckpointError, match=r"e = 1,025 is out of range \(expected 1..1,024\): llama.cpp loads"):
        config_int({"e": 1025}, "e", where=WHERE, maximum=LLAMA_MAX_EXPERTS, limit=limit)


@pytest.mark.parametrize(("value", "message"), [
    ("1e-5", 'eps = "1e-5" is not a number'),
    (False, "eps = false is not a number"),
    (0, "eps = 0 is out of range (expected more than 0, at most 1)"),
    (-1e-5, "eps = -1e-05 is out of range (expected more than 0, at most 1)"),
    (2.0, "eps = 2.0 is out of range (expected more than 0, at most 1)"),
])
def test_config_float_refuses_strings_bools_and_out_of_range(value: object, message: str) -> None:
    with pytest.raises(CheckpointError) as info:
        config_float({"eps": value}, "eps", where=WHERE, maximum=1.0)
    assert str(info.value) == f"{WHERE}: {message}"


def test_config_float_accepts_integers_as_numbers() -> None:
    assert config_float({"scale": 5}, "scale", where=WHERE) == 5.0
    assert config_float({"scale": 2.5}, "scale", where=WHERE) == 2.5
    assert config_float({}, "scale", where=WHERE, optional=True) is None


@pytest.mark.parametrize("value", [1, 0, "true", "yes", [True]])
def test_config_bool_accepts_only_true_or_false(value: object) -> None:
    assert config_bool({"norm_topk_prob": True}, "norm_topk_prob", where=WHERE) is True
    assert config_bool({}, "norm_topk_prob", where=WHERE) is None
    with pytest.raises(CheckpointError, match="norm_topk_prob = .* is not true or false"):
        config_bool({"norm_topk_prob": value}, "norm_topk_prob", where=WHERE)


# ------------------------------------------------------- values written as metadata (issue 21, items 9 and 10)


@pytest.mark.parametrize(("call", "reason"), [
    (lambda w: w.add_rope_freq_base(1e39), "qwen35moe.rope.freq_base = 1e+39: f32 holds at most 3.403e+38"),
    (lambda w: w.add_rope_dimension_sections([2**40, 1, 1, 0]),
     "qwen35moe.rope.dimension_sections = 1099511627776: i32 holds -2,147,483,648..2,147,483,647"),
    (lambda w: w.add_ssm_inner_size(2**32), "qwen35moe.ssm.inner_size = 4294967296: u32 holds 0..4,294,967,295"),
    (lambda w: w.add_block_count(-1), "qwen35moe.block_count = -1: u32 holds 0..4,294,967,295"),
    (lambda w: w.add_context_length(4096.0), "qwen35moe.context_length = 4096.0: u32 holds integers"),
    (lambda w: w.add_expert_weights_norm(1), "qwen35moe.expert_weights_norm = 1: bool holds true or false"),
])
def test_the_writer_checks_every_value_against_its_gguf_type(call: Callable[[HeadGGUFWriter], None],
                                                             reason: str) -> None:
    writer = HeadGGUFWriter("qwen35moe")
    with pytest.raises(KVValueError) as info:
        call(writer)
    assert str(info.value) == reason
    assert [kv.key for kv in writer.kvs] == ["general.architecture"]  # nothing half-written


def test_the_writer_takes_the_edges_of_each_type() -> None:
    writer = HeadGGUFWriter("qwen35moe")
    writer.add_rope_freq_base(3.4e38)
    writer.add_rope_freq_base(float("inf"))  # an explicit infinity is a float32
    writer.add_ssm_inner_size(2**32 - 1)
    writer.add_rope_dimension_sections([2**31 - 1, -(2**31), 0, 0])
    assert len(writer.kvs) == 4


@pytest.fixture(scope="module")
def qwen_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A head-only Qwen3.5 MoE checkpoint (``Qwen3_5MoeForConditionalGeneration``, text_config nested)."""
    return write_qwen_checkpoint(tmp_path_factory.mktemp("qwen") / "head", "qwen35moe", head_only=True,
                                 d=QwenDims(n_vocab=256))


def _with_text_config(head: Path, folder: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    copy = Path(shutil.copytree(head, folder / "ckpt"))
    config = json.loads((copy / "config.json").read_text())
    edit(config["text_config"])
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def _refusal(folder: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["convert", str(folder), "-o", str(out), "--block", str(N_TRUNK), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gguf-mtp: error: ") and "Traceback" not in err
    assert not out.exists()
    return err


def _set_rope(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda text: text["rope_parameters"].__setitem__(key, value)


def _set(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda text: text.__setitem__(key, value)


@pytest.mark.parametrize(("edit", "message"), [
    (_set_rope("rope_theta", 1e39), "config.json: rope_parameters.rope_theta = 1e+39 cannot be written as "
     "qwen35moe.rope.freq_base (f32 holds at most 3.403e+38)"),
    (_set_rope("mrope_section", [2**40, 1, 1]), "config.json: rope_parameters.mrope_section = [1099511627776, 1, 1, "
     "0] cannot be written as qwen35moe.rope.dimension_sections (entry 1099511627776: i32 holds "
     "-2,147,483,648..2,147,483,647)"),
    (lambda text: text.update(linear_num_value_heads=2**16, linear_value_head_dim=2**16),
     "config.json: linear_num_value_heads x linear_value_head_dim = 4294967296 cannot be written as "
     "qwen35moe.ssm.inner_size (u32 holds 0..4,294,967,295)"),
    (_set_rope("mrope_section", [2, "1", 1]), 'config.json: rope_parameters.mrope_section = [2, \'1\', 1] is not a '
     "list of integers"),
    (_set("mtp_num_hidden_layers", 0), "config.json: mtp_num_hidden_layers = 0: the checkpoint states it has no MTP "
     "layer"),
    (_set("layer_types", ["linear_attention", "linear_attention", "sliding_attention", "full_attention"]),
     "config.json: layer_types holds 'sliding_attention': expected linear_attention or full_attention"),
    (_set("layer_types", "full_attention"), "config.json: layer_types is not a list of at most 512 layer kinds"),
])
def test_config_values_that_do_not_fit_are_one_line_naming_config_json_and_the_key(
    qwen_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    folder = _with_text_config(qwen_head, tmp_path, edit)
    assert _refusal(folder, tmp_path / "d.gguf", capsys).endswith(f"{folder}/{message}\n")


def _qwen_target(path: Path, recurrent: GGUFArray) -> Path:
    """A qwen35moe trunk of 4 blocks as far as convert --target reads it: metadata and one global tensor."""
    arch = "qwen35moe"
    kvs = [encode_kv("general.architecture", GGUFValueType.STRING, arch),
           encode_kv(f"{arch}.block_count", GGUFValueType.UINT32, N_TRUNK),
           encode_kv(f"{arch}.attention.recurrent_layers", GGUFValueType.ARRAY, recurrent)]
    data = np.zeros((4, 32), np.float32).tobytes()
    tensors = [TensorInfo("token_embd.weight", (32, 4), GGMLQuantizationType.F32, 0, len(data))]
    header = serialize_header(3, kvs, tensors, 32)
    path.write_bytes(header + data)
    return path


def test_convert_target_with_a_per_layer_array_of_strings_is_one_line(
    qwen_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    strings = _qwen_target(tmp_path / "strings.gguf", GGUFArray(GGUFValueType.STRING, ("a", "b", "c", "d")))
    err = _refusal(qwen_head, tmp_path / "d.gguf", capsys, "--target", str(strings))
    assert err.endswith(f"{strings}: per-layer array qwen35moe.attention.recurrent_layers has STRING items, not "
                        "integers, floats or booleans\n")
    nested = _qwen_target(tmp_path / "nested.gguf", GGUFArray(GGUFValueType.ARRAY, tuple(
        GGUFArray(GGUFValueType.BOOL, (True,)) for _ in range(N_TRUNK))))
    err = _refusal(qwen_head, tmp_path / "d.gguf", capsys, "--target", str(nested))
    assert "recurrent_layers has ARRAY items" in err
    # the same target with booleans converts, and its entries are extended with false for the NextN block
    good = _qwen_target(tmp_path / "good.gguf", GGUFArray(GGUFValueType.BOOL, (True, True, True, False)))
    draft = convert(qwen_head, tmp_path / "ok.gguf", target=good, progress=False).output
    assert read_header(draft).get("qwen35moe.attention.recurrent_layers") == [True, True, True, False, False]
