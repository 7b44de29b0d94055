"""convert refuses bad checkpoints with one clear line naming the file and the problem (exit status 2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.convert_support import raw_tensor, rewrite_checkpoint_tensor, write_raw_safetensors

from gguf_mtp.cli import main
from gguf_mtp.errors import CheckpointError, GGUFMTPError
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

BLOCK = 3
EH_PROJ = "mtp.layers.0.eh_proj.weight"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mtpv2_checkpoint(tmp_path_factory.mktemp("head") / "head", files=2)


@pytest.fixture
def head(pristine: Path, tmp_path: Path) -> Path:
    """A private copy of the two-file BF16 head, free to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "head"))


def _file_of(head: Path, name: str) -> Path:
    return head / json.loads((head / "model.safetensors.index.json").read_text())["weight_map"][name]


def _convert_error(head: Path, tmp_path: Path, **kwargs: object) -> GGUFMTPError:
    with pytest.raises(GGUFMTPError) as info:
        convert(head, tmp_path / "draft.gguf", block=BLOCK, **kwargs)
    assert not (tmp_path / "draft.gguf").exists()
    assert "\n" not in str(info.value)
    return info.value


def test_checkpoint_without_mtp_tensors_is_refused(tmp_path: Path) -> None:
    trunk_only = tmp_path / "trunk"
    trunk_only.mkdir()
    shutil.copy(write_mtpv2_checkpoint(tmp_path / "h", files=1) / "config.json", trunk_only)
    write_raw_safetensors(trunk_only / "model.safetensors", {"backbone.norm_f.weight": ("BF16", [4], b"\0" * 8)})
    error = _convert_error(trunk_only, tmp_path)
    assert isinstance(error, CheckpointError) and "no MTP head" in str(error)


def test_missing_shard_listed_in_the_index_is_named(head: Path, tmp_path: Path) -> None:
    shard = _file_of(head, EH_PROJ)
    shard.unlink()
    error = _convert_error(head, tmp_path)
    assert f"lists {shard.name}, which is missing" in str(error)


def test_missing_shard_without_head_tensors_is_not_needed(tmp_path: Path) -> None:
    full = write_mtpv2_checkpoint(tmp_path / "full", files=3, with_trunk=True)
    (full / "model-00001-of-00003.safetensors").unlink()  # the trunk's shard: what a selective download leaves out
    report = convert(full, tmp_path / "d.gguf", block=BLOCK, progress=False)
    assert [p.name for p in report.plan.checkpoint.files] == ["model-00002-of-00003.safetensors",
                                                              "model-00003-of-00003.safetensors"]


def test_tensor_shape_disagreeing_with_config_is_refused(head: Path, tmp_path: Path) -> None:
    config = json.loads((head / "config.json").read_text())
    config["num_key_value_heads"] = 4
    (head / "config.json").write_text(json.dumps(config))
    error = _convert_error(head, tmp_path)
    assert "mtp.layers.0.mixer.k_proj.weight has shape [128, 512], config.json implies [256, 512]" in str(error)


def test_expert_of_the_wrong_shape_is_refused(head: Path, tmp_path: Path) -> None:
    name = "mtp.layers.1.mixer.experts.3.up_proj.weight"
    _, shape, data = raw_tensor(head, name)
    rewrite_checkpoint_tensor(head, name, shape=[shape[1], shape[0] // 2], data=data[: len(data) // 2])
    assert "cannot stack" in str(_convert_error(head, tmp_path))


def test_unknown_architecture_lists_the_supported_ones(head: Path, tmp_path: Path) -> None:
    config = json.loads((head / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (head / "config.json").write_text(json.dumps(config))
    error = _convert_error(head, tmp_path)
    supported = ("BailingMoeV3ForCausalLM, DeepseekV32ForCausalLM, DeepseekV3ForCausalLM, Glm4MoeForCausalLM, "
                 "Glm4MoeLiteForCausalLM, GlmMoeDsaForCausalLM")
    assert f"'LlamaForCausalLM' is not supported; supported: {supported}, " in str(error)


def test_config_that_is_not_json_is_refused(head: Path, tmp_path: Path) -> None:
    (head / "config.json").write_text('{"architectures": ["NemotronHForCausalLM"],')
    error = _convert_error(head, tmp_path)
    assert str(error).startswith(str(head / "config.json")) and "not valid JSON" in str(error)


def test_fp8_tensor_without_quantization_config_is_refused(head: Path, tmp_path: Path) -> None:
    _, _, data = raw_tensor(head, EH_PROJ)
    rewrite_checkpoint_tensor(head, EH_PROJ, dtype="F8_E4M3", data=data[: len(data) // 2])
    error = _convert_error(head, tmp_path)
    assert "F8_E4M3: a quantized tensor, and config.json has no quantization_config" in str(error)


def test_nvfp4_checkpoint_is_refused(head: Path, tmp_path: Path) -> None:
    name = "mtp.layers.0.mixer.q_proj.weight"
    _, shape, data = raw_tensor(head, name)
    # NVFP4 (ModelOpt): two 4-bit values per uint8, with an FP8 scale per 16 values next to it.
    scale = (name + "_scale", ("F8_E4M3", [shape[0], shape[1] // 16], b"\x38" * (shape[0] * shape[1] // 16)))
    rewrite_checkpoint_tensor(head, name, dtype="U8", shape=[shape[0], shape[1] // 2], data=data[: len(data) // 4],
                              add=dict([scale]))
    error = _convert_error(head, tmp_path)
    assert "is U8: a quantized tensor, and config.json has no quantization_config" in str(error)


def test_missing_expert_is_named(head: Path, tmp_path: Path) -> None:
    rewrite_checkpoint_tensor(head, "mtp.layers.1.mixer.experts.5.up_proj.weight", drop=True)
    error = _convert_error(head, tmp_path)
    assert "7 of 8 experts' up_proj" in str(error) and "missing experts 5" in str(error)


def test_missing_nextn_tensor_is_named(head: Path, tmp_path: Path) -> None:
    rewrite_checkpoint_tensor(head, EH_PROJ, drop=True)
    assert "lacks 1 tensor(s) llama.cpp needs, e.g. blk.N.nextn.eh_proj.weight" in str(_convert_error(head, tmp_path))


def test_unknown_mtp_tensor_is_refused(head: Path, tmp_path: Path) -> None:
    rewrite_checkpoint_tensor(head, EH_PROJ, new_name="mtp.layers.0.embed_tokens.weight")
    assert "cannot map tensor 'mtp.layers.0.embed_tokens.weight'" in str(_convert_error(head, tmp_path))


def test_both_bias_spellings_at_once_are_refused(head: Path, tmp_path: Path) -> None:
    name = "mtp.layers.1.mixer.gate.e_score_correction_bias"
    dtype, shape, data = raw_tensor(head, name)
    other_spelling = "mtp.layers.1.mixer.gate.e_score_correction.bias"
    rewrite_checkpoint_tensor(head, name, add={other_spelling: (dtype, list(shape), data)})
    assert "both map to blk.N.exp_probs_b.bias" in str(_convert_error(head, tmp_path))


def test_corrupt_safetensors_header_is_refused(head: Path, tmp_path: Path) -> None:
    shard = _file_of(head, EH_PROJ)
    data = bytearray(shard.read_bytes())
    data[0:8] = (len(data) * 2).to_bytes(8, "little")
    shard.write_bytes(bytes(data))
    error = _convert_error(head, tmp_path)
    assert str(error).startswith(str(shard)) and "corrupt safetensors header" in str(error)


def test_tensor_running_past_the_end_of_its_file_is_refused(head: Path, tmp_path: Path) -> None:
    shard = _file_of(head, EH_PROJ)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1)
    assert "runs past the end of the file" in str(_convert_error(head, tmp_path))


def test_index_placing_a_tensor_in_the_wrong_file_is_refused(head: Path, tmp_path: Path) -> None:
    index = json.loads((head / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    here = index["weight_map"][EH_PROJ]
    index["weight_map"][EH_PROJ] = next(f for f in files if f != here)
    (head / "model.safetensors.index.json").write_text(json.dumps(index))
    assert f"holds '{EH_PROJ}', but the index places it in" in str(_convert_error(head, tmp_path))


def test_more_than_one_nextn_layer_is_refused(head: Path, tmp_path: Path) -> None:
    config = json.loads((head / "config.json").read_text())
    config["num_nextn_predict_layers"] = 2
    (head / "config.json").write_text(json.dumps(config))
    assert "only one NextN block is supported" in str(_convert_error(head, tmp_path))


def test_nemotron_h_without_experts_is_refused(head: Path, tmp_path: Path) -> None:
    config = json.loads((head / "config.json").read_text())
    for key in ("num_experts_per_tok", "n_routed_experts"):
        del config[key]
    (head / "config.json").write_text(json.dumps(config))
    assert "only the MoE variant (nemotron_h_moe)" in str(_convert_error(head, tmp_path))


def test_other_mtp_layer_pattern_is_refused(head: Path, tmp_path: Path) -> None:
    config = json.loads((head / "config.json").read_text())
    config["mtp_hybrid_override_pattern"] = "E*"
    (head / "config.json").write_text(json.dumps(config))
    assert "MTP layer pattern 'E*'" in str(_convert_error(head, tmp_path))


def test_standalone_without_target_is_refused(pristine: Path, tmp_path: Path) -> None:
    with pytest.raises(GGUFMTPError, match="standalone needs target"):
        convert(pristine, tmp_path / "d.gguf", standalone=True)


def test_source_that_is_neither_folder_nor_repo_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such folder, and not a Hub repo id"):
        convert(tmp_path / "nothing" / "here", tmp_path / "d.gguf", block=BLOCK)


def test_revision_of_a_local_folder_is_refused(pristine: Path, tmp_path: Path) -> None:
    with pytest.raises(GGUFMTPError, match="applies to Hub sources only"):
        convert(pristine, tmp_path / "d.gguf", block=BLOCK, revision="main")


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_bad_input_exits_2_with_one_line_on_stderr(head: Path, tmp_path: Path) -> None:
    (head / "config.json").write_text("not json")
    done = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "convert", str(head), "-o", str(tmp_path / "d.gguf"), "--block", "3"],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("gguf-mtp: error: ")
    assert "config.json: not valid JSON" in done.stderr


def test_cli_missing_block_and_target_exits_2(pristine: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(pristine), "-o", str(tmp_path / "d.gguf")]) == 2
    assert "--target TARGET.gguf" in capsys.readouterr().err
