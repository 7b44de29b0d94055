"""Block-scaled FP8 sources (issue 22, item 1): dequantized as llama.cpp's converter does, one tensor or expert at
a time; the default output type is what llama.cpp's ``--outtype auto`` writes; ``q8_0`` in one pass; other
quantization methods refused in one line.

The fixtures are the tiny Qwen3.5 MoE checkpoint (per-expert tensors, two shards, the head in the second) with
its linear weights FP8-quantized in 128x128 blocks: the head's rows of 64 and 256 and columns of 64 leave partial
blocks. The upstream group runs llama.cpp's own converter on the same FP8 shards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from support.convert_support import raw_tensor, rewrite_checkpoint_tensor, tensor_array
from support.fp8_checkpoints import dequantize_reference, is_linear, quantize_checkpoint
from support.helpers import reader_tensors
from support.qwen_checkpoints import N_TRUNK, QwenDims, write_qwen_checkpoint

from gguf_mtp.cli import main
from gguf_mtp.conversion.fp8 import BlockScaledTensor, fp8_lut
from gguf_mtp.format.header import read_header
from gguf_mtp.format.safetensors_io import open_checkpoint
from gguf_mtp.jobs.convert import convert

Q = GGMLQuantizationType
BLOCK = N_TRUNK
SMALL = QwenDims(n_vocab=256)
#: checkpoint name -> NextN tensor, for the head's FP8 linear weights (per-expert tensors are stacked: checked apart)
LINEAR = {
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.layers.0.self_attn.q_proj.weight": "attn_q.weight",
    "mtp.layers.0.self_attn.k_proj.weight": "attn_k.weight",
    "mtp.layers.0.self_attn.o_proj.weight": "attn_output.weight",
    "mtp.layers.0.mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
}


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen_checkpoint(tmp_path_factory.mktemp("fp8") / "bf16", "qwen35moe", conditional=False,
                                 packed=False, d=SMALL)


@pytest.fixture(scope="module")
def fp8(bf16: Path) -> Path:
    return quantize_checkpoint(bf16, bf16.parent / "fp8")


def _scale(folder: Path, name: str) -> np.ndarray:
    dtype, shape, raw = raw_tensor(folder, name + "_scale_inv")
    if dtype == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, np.float32).reshape(shape)


def _reference(folder: Path, name: str, block: tuple[int, int] = (128, 128), fmt: str = "F8_E4M3") -> np.ndarray:
    dtype, shape, codes = raw_tensor(folder, name)
    assert dtype == fmt
    return dequantize_reference(codes, shape, _scale(folder, name), block, fmt)


def test_the_fixture_has_partial_blocks_and_leaves_routers_and_norms_bf16(fp8: Path) -> None:
    index = json.loads((fp8 / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["mtp.layers.0.self_attn.k_proj.weight_scale_inv"] == "model-00002-of-00002.safetensors"
    assert raw_tensor(fp8, "mtp.layers.0.self_attn.k_proj.weight")[:2] == ("F8_E4M3", (64, 128))  # half a block
    assert raw_tensor(fp8, "mtp.layers.0.self_attn.k_proj.weight_scale_inv")[:2] == ("F32", (1, 1))
    assert raw_tensor(fp8, "mtp.layers.0.mlp.experts.0.down_proj.weight_scale_inv")[1] == (1, 1)  # 128 x 64
    assert raw_tensor(fp8, "mtp.layers.0.self_attn.q_proj.weight_scale_inv")[1] == (2, 1)  # 256 x 128
    for name in ("mtp.layers.0.mlp.gate.weight", "mtp.norm.weight", "mtp.layers.0.mlp.shared_expert_gate.weight"):
        assert raw_tensor(fp8, name)[0] == "BF16"


def test_fp8_widening_table_is_exact_for_every_code() -> None:
    import ml_dtypes

    for dtype, ml in (("F8_E4M3", ml_dtypes.float8_e4m3fn), ("F8_E5M2", ml_dtypes.float8_e5m2)):
        lut = fp8_lut(dtype)
        codes = np.arange(256, dtype=np.uint8)
        expected = codes.view(ml).astype(np.float32)
        finite = ~np.isnan(expected)
        assert np.array_equal(lut[finite].view(np.uint32), expected[finite].view(np.uint32))
        # NaN codes as torch widens them (checked bit for bit against torch 2.13): quiet bit set, mantissa kept
        assert [hex(b) for b in lut[~finite].view(np.uint32)] == (
            ["0x7ff00000", "0xfff00000"] if dtype == "F8_E4M3"
            else ["0x7fe00000", "0x7fc00000", "0x7fe00000", "0xffe00000", "0xffc00000", "0xffe00000"])


def test_dequantized_values_equal_weight_times_block_scale_in_f32(fp8: Path, tmp_path: Path) -> None:
    out = convert(fp8, tmp_path / "f32.gguf", block=BLOCK, outtype="f32", progress=False).output
    tensors = reader_tensors(out)
    for name, gguf_name in LINEAR.items():
        ggml_type, _, data = tensors[f"blk.{BLOCK}.{gguf_name}"]
        assert ggml_type == Q.F32
        assert data == _reference(fp8, name).tobytes(), name
    experts = np.stack([_reference(fp8, f"mtp.layers.0.mlp.experts.{e}.up_proj.weight") for e in range(4)])
    assert tensors[f"blk.{BLOCK}.ffn_up_exps.weight"][2] == experts.tobytes()


def test_default_outtype_is_bf16_like_llama_cpps_auto_and_bf16_tensors_are_copied(fp8: Path, bf16: Path,
                                                                                  tmp_path: Path) -> None:
    report = convert(fp8, tmp_path / "auto.gguf", block=BLOCK, progress=False)
    tensors = reader_tensors(report.output)
    q = tensors[f"blk.{BLOCK}.attn_q.weight"]
    assert q[0] == Q.BF16
    assert q[2] == gguf_quants.quantize(_reference(fp8, "mtp.layers.0.self_attn.q_proj.weight"), Q.BF16).tobytes()
    # the router is F32 (llama.cpp's rule), the shared expert's BF16 gate too; nothing else of the BF16 head changed
    router = tensors[f"blk.{BLOCK}.ffn_gate_inp.weight"]
    assert router[0] == Q.F32
    assert read_header(report.output).get("general.file_type") == 32  # MOSTLY_BF16
    plain = reader_tensors(convert(bf16, tmp_path / "bf16.gguf", block=BLOCK, progress=False).output)
    assert router == plain[f"blk.{BLOCK}.ffn_gate_inp.weight"]
    assert tensors[f"blk.{BLOCK}.nextn.enorm.weight"] == plain[f"blk.{BLOCK}.nextn.enorm.weight"]
    assert any("dequantize F8_E4M3->BF16" in t.how for t in report.plan.tensors)


def test_q8_0_from_fp8_in_one_pass(fp8: Path, tmp_path: Path) -> None:
    out = convert(fp8, tmp_path / "q8.gguf", block=BLOCK, outtype="q8_0", progress=False).output
    tensors = reader_tensors(out)
    for name, gguf_name in LINEAR.items():
        ggml_type, _, data = tensors[f"blk.{BLOCK}.{gguf_name}"]
        assert ggml_type == Q.Q8_0
        assert data == gguf_quants.quantize(_reference(fp8, name), Q.Q8_0).tobytes(), name


def test_a_llama_quantize_type_quantizes_the_values_of_the_converters_bf16(fp8: Path, tmp_path: Path) -> None:
    """q4_0 is not a converter type: its bytes are llama-quantize's of the converter's default (BF16) output, so the
    dequantized float32 is rounded to BF16 first (the real llama-quantize checks it in test_quant_oracle)."""
    report = convert(fp8, tmp_path / "q4.gguf", block=BLOCK, outtype="q4_0", progress=False)
    tensors = reader_tensors(report.output)
    for name, gguf_name in LINEAR.items():
        reference = _reference(fp8, name)
        bf16_bits = np.frombuffer(gguf_quants.quantize(reference, Q.BF16).tobytes(), np.uint16)
        rounded = (bf16_bits.astype(np.uint32) << 16).view(np.float32).reshape(reference.shape)
        ggml_type, _, data = tensors[f"blk.{BLOCK}.{gguf_name}"]
        assert (ggml_type, data) == (Q.Q4_0, gguf_quants.quantize(rounded, Q.Q4_0).tobytes()), name
    assert any(t.how == "dequantize F8_E4M3->Q4_0 via BF16" for t in report.plan.tensors)


def test_reading_any_run_of_rows_gives_the_same_values(fp8: Path) -> None:
    checkpoint = open_checkpoint(fp8, prefix="mtp.")
    q = checkpoint.tensors["mtp.layers.0.self_attn.q_proj.weight"]
    scaled = BlockScaledTensor(q.name, q.dtype, q.shape, q.path, q.offset, q.nbytes,
                               scale=checkpoint.tensors[q.name + "_scale_inv"], block=(128, 128))
    whole = _reference(fp8, q.name)
    import os

    fd = os.open(q.path, os.O_RDONLY)
    try:
        for start, count in ((0, 1), (127, 2), (100, 156), (255, 1)):  # across the block boundary at row 128
            assert np.array_equal(scaled.read_rows(fd, start, count), whole[start : start + count])
    finally:
        os.close(fd)


@pytest.mark.parametrize(("fmt", "scale_dtype", "block"), [("F8_E5M2", "BF16", (32, 48)), ("F8_E4M3", "F32", (48, 80))])
def test_e5m2_bf16_scales_and_odd_block_sizes(bf16: Path, tmp_path: Path, fmt: str, scale_dtype: str,
                                              block: tuple[int, int]) -> None:
    folder = quantize_checkpoint(bf16, tmp_path / "ckpt", block=block, fp8=fmt, scale_dtype=scale_dtype)
    tensors = reader_tensors(convert(folder, tmp_path / "d.gguf", block=BLOCK, outtype="f32", progress=False).output)
    for name, gguf_name in LINEAR.items():
        assert tensors[f"blk.{BLOCK}.{gguf_name}"][2] == _reference(folder, name, block, fmt).tobytes(), name


def _refusal(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = tmp_path / "d.gguf"
    assert main(["convert", str(folder), "-o", str(out), "--block", str(BLOCK)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()
    return err


@pytest.mark.parametrize(("quant", "named"), [
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "quant_method = 'modelopt' ('NVFP4')"),
    ({"quant_method": "mxfp4"}, "quant_method = 'mxfp4'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "quant_method = 'compressed-tensors'"),
    ({"quant_method": "gptq", "bits": 4}, "quant_method = 'gptq'"),
])
def test_other_quantization_methods_are_refused_naming_the_method(fp8: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  quant: dict[str, object], named: str) -> None:
    folder = Path(shutil.copytree(fp8, tmp_path / "ckpt"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quant
    (folder / "config.json").write_text(json.dumps(config))
    err = _refusal(folder, tmp_path, capsys)
    assert f"config.json: quantization_config.{named}: only block-scaled FP8 (\"fp8\")" in err


def test_fp8_weight_without_its_scale_is_refused(fp8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = Path(shutil.copytree(fp8, tmp_path / "ckpt"))
    rewrite_checkpoint_tensor(folder, "mtp.layers.0.self_attn.k_proj.weight_scale_inv", drop=True)
    assert "FP8 tensor 'mtp.layers.0.self_attn.k_proj.weight' has no mtp.layers.0.self_attn.k_proj.weight_scale_inv" \
        in _refusal(folder, tmp_path, capsys)


def test_scale_of_the_wrong_shape_is_refused(fp8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = Path(shutil.copytree(fp8, tmp_path / "ckpt"))
    name = "mtp.layers.0.self_attn.q_proj.weight_scale_inv"
    rewrite_checkpoint_tensor(folder, name, shape=[1, 2])
    err = _refusal(folder, tmp_path, capsys)
    assert f"{name} is F32 [1, 2]; mtp.layers.0.self_attn.q_proj.weight [256, 128] in blocks of [128, 128] needs " \
           "F32 or BF16 [2, 1]" in err


def test_fp8_tensors_without_quantization_config_are_refused(fp8: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = Path(shutil.copytree(fp8, tmp_path / "ckpt"))
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    err = _refusal(folder, tmp_path, capsys)
    assert "is F8_E4M3: a quantized tensor, and config.json has no quantization_config" in err


def test_malformed_block_size_is_refused(fp8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = Path(shutil.copytree(fp8, tmp_path / "ckpt"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [128, 0]
    (folder / "config.json").write_text(json.dumps(config))
    assert "quantization_config.weight_block_size = [128, 0] is not two block sides" in _refusal(folder, tmp_path,
                                                                                               capsys)


def test_activation_scales_are_dropped(fp8: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(fp8, tmp_path / "ckpt"))
    name = "mtp.layers.0.self_attn.k_proj.weight"
    rewrite_checkpoint_tensor(folder, name, add={"mtp.layers.0.self_attn.k_proj.input_scale":
                                                 ("F32", [1], np.float32(1).tobytes())})
    ours = reader_tensors(convert(folder, tmp_path / "d.gguf", block=BLOCK, progress=False).output)
    assert not any("input_scale" in n for n in ours)


SCALED = "mtp.layers.0.self_attn.q_proj.weight"  # 256 rows: two block rows, each its own scale


def _scaled_bf16(fp8: Path, bf16: Path, folder: Path) -> tuple[Path, np.ndarray]:
    """The FP8 checkpoint with :data:`SCALED` stored BF16 (its original values) and a ``weight_scale_inv`` still next
    to it (as mixed checkpoints lay some layers out); returns the folder and the scale."""
    folder = Path(shutil.copytree(fp8, folder))
    _, _, raw = raw_tensor(bf16, SCALED)
    scale = np.array([[1.7], [0.3711]], np.float32)
    rewrite_checkpoint_tensor(folder, SCALED, dtype="BF16", data=raw)
    rewrite_checkpoint_tensor(folder, SCALED + "_scale_inv", data=scale.tobytes())
    return folder, scale


def test_a_scale_next_to_a_bf16_weight_is_applied_as_upstream_applies_it(fp8: Path, bf16: Path, tmp_path: Path) -> None:
    """llama.cpp's dequant_model multiplies every X.weight that has an X.weight_scale_inv, whatever its dtype."""
    folder, scale = _scaled_bf16(fp8, bf16, tmp_path / "ckpt")
    dtype, shape, raw = raw_tensor(folder, SCALED)
    assert (dtype, raw_tensor(folder, SCALED + "_scale_inv")[:2]) == ("BF16", ("F32", (2, 1)))
    weight = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(shape)
    # float64 holds the product of a BF16 and an F32 exactly: one rounding to float32, as torch's float32 product
    reference = (weight * np.repeat(scale.astype(np.float64), 128, axis=0)[: shape[0]]).astype(np.float32)
    name = f"blk.{BLOCK}.attn_q.weight"
    f32 = reader_tensors(convert(folder, tmp_path / "f32.gguf", block=BLOCK, outtype="f32", progress=False).output)
    assert (f32[name][0], f32[name][2]) == (Q.F32, reference.tobytes())
    report = convert(folder, tmp_path / "auto.gguf", block=BLOCK, progress=False)
    default = reader_tensors(report.output)[name]
    assert (default[0], default[2]) == (Q.BF16, gguf_quants.quantize(reference, Q.BF16).tobytes())
    assert default[2] != raw  # not the unscaled weight
    assert not any("scale_inv" in n for n in reader_tensors(report.output))


@pytest.mark.upstream
def test_a_scaled_bf16_weight_converts_as_upstreams_converter_converts_it(
    fp8: Path, bf16: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from support.upstream import upstream_convert, write_gpt2_tokenizer

    work = tmp_path_factory.mktemp("up-scaled")
    folder, _ = _scaled_bf16(fp8, bf16, work / "hf")
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = write_gpt2_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(config))
    theirs = reader_tensors(upstream_convert(folder, work / "mtp.gguf", "--mtp", outtype="auto"))
    ours = reader_tensors(convert(folder, work / "d.gguf", block=BLOCK, progress=False).output)
    prefix = f"blk.{BLOCK}."
    mtp = {n: t for n, t in theirs.items() if n.startswith(prefix)}
    assert sorted(n for n in ours if n.startswith(prefix)) == sorted(mtp)
    for name, tensor in mtp.items():
        assert ours[name] == tensor, f"{name} differs from llama.cpp's converter"


def test_is_linear_matches_what_the_releases_quantize() -> None:
    assert is_linear("mtp.fc.weight", [128, 256]) and not is_linear("mtp.norm.weight", [128])
    assert not is_linear("mtp.layers.0.mlp.gate.weight", [4, 128])
    assert tensor_array is not None  # (shared helpers imported for the parity group below)


# ------------------------------------------------------------------------- llama.cpp's converter on the same shards


@pytest.fixture(scope="module")
def upstream_fp8(fp8: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from support.upstream import upstream_convert, write_gpt2_tokenizer

    work = tmp_path_factory.mktemp("up-fp8")
    folder = Path(shutil.copytree(fp8, work / "hf"))
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = write_gpt2_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(config))
    return {"checkpoint": folder,
            "auto": upstream_convert(folder, work / "mtp-auto.gguf", "--mtp", outtype="auto"),
            "q8_0": upstream_convert(folder, work / "mtp-q8.gguf", "--mtp", outtype="q8_0"),
            "trunk": upstream_convert(folder, work / "trunk.gguf", "--no-mtp", outtype="auto")}


@pytest.mark.upstream
@pytest.mark.parametrize("outtype", ["auto", "q8_0"])
def test_convert_of_fp8_equals_upstreams_mtp_block(upstream_fp8: dict[str, Path], tmp_path: Path,
                                                   outtype: str) -> None:
    ours = convert(upstream_fp8["checkpoint"], tmp_path / "d.gguf", target=upstream_fp8["trunk"],
                   outtype=None if outtype == "auto" else outtype, progress=False).output
    prefix = f"blk.{BLOCK}."
    theirs = {n: t for n, t in reader_tensors(upstream_fp8[outtype]).items() if n.startswith(prefix)}
    mine = reader_tensors(ours)
    assert sorted(mine) == sorted(theirs) and len(theirs) == 20
    for name, tensor in theirs.items():
        assert mine[name] == tensor, f"{name} differs from llama.cpp's converter"
    assert theirs[f"{prefix}attn_q.weight"][0] == (Q.BF16 if outtype == "auto" else Q.Q8_0)
