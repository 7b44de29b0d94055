"""inclusionAI Ling-3.0 (bailingmoe3): ``convert`` of the MTP layer (MLA + MoE), checked by value.

Against llama.cpp's own convert_hf_to_gguf.py, tensor for tensor and key for key, and through llama.cpp:
tests/test_upstream_parity.py's ``bailingmoe3`` entry (one tiny full checkpoint: Ling-3.0's keys and names, a KDA +
MLA trunk, 2 shards + index with the MTP layer alone in the last, GPT-2's real tokenizer).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from support.fp8_checkpoints import quantize_checkpoint
from support.helpers import reader_kvs, reader_tensors
from support.ling_checkpoints import LING_HPARAMS, ling_config, write_ling_checkpoint

from gguf_mtp.conversion import model_class_for_arch
from gguf_mtp.conversion.bailingmoe3 import BailingMoeV3MTPModel
from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import CONFIG_NAME, SafetensorsFile
from gguf_mtp.jobs.convert import convert

Q = GGMLQuantizationType
N = 2  # num_hidden_layers of the tiny checkpoints: the MTP layer is model.layers.2 -> blk.2
HEAD = f"model.layers.{N}."


def _array(folder: Path, name: str) -> np.ndarray:
    """A checkpoint tensor as float32, straight from the safetensors file."""
    for path in sorted(folder.glob("*.safetensors")):
        tensors = SafetensorsFile(path).tensors
        if name in tensors:
            t = tensors[name]
            with open(path, "rb") as f:
                f.seek(t.offset)
                raw = f.read(t.nbytes)
            if t.dtype == "BF16":
                return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
            return np.frombuffer(raw, np.float32).reshape(t.shape)
    raise KeyError(name)


def _values(entry: tuple[int, tuple[int, ...], bytes]) -> np.ndarray:
    qtype, shape, raw = entry
    assert qtype in (Q.BF16, Q.F32)
    if qtype == Q.BF16:
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape[::-1])
    return np.frombuffer(raw, np.float32).reshape(shape[::-1])


def _draft(folder: Path, out: Path) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    return reader_tensors(convert(folder, out, block=N, progress=False).output)


@pytest.fixture(scope="module")
def ling(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ling_checkpoint(tmp_path_factory.mktemp("ling") / "Ling-tiny")


def test_names_shapes_types(ling: Path, tmp_path: Path) -> None:
    hp = LING_HPARAMS
    ours = _draft(ling, tmp_path / "d.gguf")
    h, n, rank, e, f = hp.n_embd, hp.n_head, hp.kv_lora_rank, hp.n_expert, hp.n_ff_exp
    expected = {
        "nextn.eh_proj.weight": (Q.BF16, (2 * h, h)), "nextn.enorm.weight": (Q.F32, (h,)),
        "nextn.hnorm.weight": (Q.F32, (h,)), "layer_output_norm.weight": (Q.F32, (h,)),
        "attn_norm.weight": (Q.F32, (h,)), "attn_q.weight": (Q.BF16, (h, n * (hp.qk_nope + hp.qk_rope))),
        "attn_kv_a_mqa.weight": (Q.BF16, (h, rank + hp.qk_rope)), "attn_kv_a_norm.weight": (Q.F32, (rank,)),
        "attn_k_b.weight": (Q.BF16, (hp.qk_nope, rank, n)), "attn_v_b.weight": (Q.BF16, (rank, hp.v_head, n)),
        "attn_gate.weight": (Q.BF16, (h, n)), "attn_output.weight": (Q.BF16, (n * hp.v_head, h)),
        "ffn_norm.weight": (Q.F32, (h,)), "ffn_gate_inp.weight": (Q.F32, (h, e)), "exp_probs_b.bias": (Q.F32, (e,)),
        "ffn_gate_exps.weight": (Q.BF16, (h, f, e)), "ffn_up_exps.weight": (Q.BF16, (h, f, e)),
        "ffn_down_exps.weight": (Q.BF16, (f, h, e)), "ffn_gate_shexp.weight": (Q.BF16, (h, hp.n_ff_shexp)),
        "ffn_up_shexp.weight": (Q.BF16, (h, hp.n_ff_shexp)), "ffn_down_shexp.weight": (Q.BF16, (hp.n_ff_shexp, h)),
    }
    assert {k: (t, s) for k, (t, s, _) in ours.items()} == {f"blk.{N}.{k}": v for k, v in expected.items()}


def test_kv_b_split_is_llama_cpps(ling: Path, tmp_path: Path) -> None:
    # conversion/bailingmoe3.py: view(n_head, nope + v, rank), k_b = [:, :nope].transpose(1, 2), v_b = [:, nope:]
    hp = LING_HPARAMS
    ours = _draft(ling, tmp_path / "d.gguf")
    kv_b = _array(ling, HEAD + "attention.kv_b_proj.weight").reshape(hp.n_head, hp.qk_nope + hp.v_head, -1)
    k_b, v_b = _values(ours[f"blk.{N}.attn_k_b.weight"]), _values(ours[f"blk.{N}.attn_v_b.weight"])
    assert k_b.shape == (hp.n_head, hp.kv_lora_rank, hp.qk_nope)
    assert np.array_equal(k_b, kv_b[:, : hp.qk_nope, :].transpose(0, 2, 1))
    assert np.array_equal(v_b, kv_b[:, hp.qk_nope :, :])
    # the layer output norm is the MTP layer's final_layernorm, the gate its head-wise g_proj
    assert np.array_equal(_values(ours[f"blk.{N}.layer_output_norm.weight"]),
                          _array(ling, HEAD + "final_layernorm.weight"))
    assert np.array_equal(_values(ours[f"blk.{N}.attn_gate.weight"]), _array(ling, HEAD + "attention.g_proj.weight"))


def test_kv_b_split_to_q8_0(ling: Path, tmp_path: Path) -> None:
    ours = reader_tensors(convert(ling, tmp_path / "q8.gguf", block=N, outtype="q8_0", progress=False).output)
    assert ours[f"blk.{N}.attn_k_b.weight"][0] == Q.Q8_0 and ours[f"blk.{N}.attn_v_b.weight"][0] == Q.Q8_0


def test_q_lora_layout_of_ling_tiny(tmp_path: Path) -> None:
    hp = replace(LING_HPARAMS, q_lora_rank=96)
    ours = _draft(write_ling_checkpoint(tmp_path / "tiny", hp), tmp_path / "d.gguf")
    assert ours[f"blk.{N}.attn_q_a.weight"][:2] == (Q.BF16, (hp.n_embd, 96))
    assert ours[f"blk.{N}.attn_q_a_norm.weight"][:2] == (Q.F32, (96,))
    assert ours[f"blk.{N}.attn_q_b.weight"][:2] == (Q.BF16, (96, hp.n_head * (hp.qk_nope + hp.qk_rope)))
    assert f"blk.{N}.attn_q.weight" not in ours


def test_draft_metadata(ling: Path, tmp_path: Path) -> None:
    assert model_class_for_arch("bailingmoe3") is BailingMoeV3MTPModel
    kvs = {k[len("bailingmoe3."):]: v for k, (_, v) in reader_kvs(
        convert(ling, tmp_path / "d.gguf", block=N, progress=False).output).items() if k.startswith("bailingmoe3.")}
    assert kvs["attention.head_count_kv"] == [0, 1, 1]  # layer 0 KDA, layer 1 MLA, the MTP block MLA
    assert kvs["swiglu_clamp_exp"] == [0.0, 7.0, 0.0] and kvs["swiglu_clamp_shexp"] == [0.0, 10.0, 0.0]
    assert (kvs["attention.key_length"], kvs["attention.key_length_mla"], kvs["attention.value_length_mla"]) == (
        80, 48, 48)
    assert kvs["nextn_predict_layers"] == 1 and kvs["block_count"] == N + 1


def test_bad_config_is_one_line(ling: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    for path in ling.iterdir():
        (folder / path.name).symlink_to(path)
    (folder / CONFIG_NAME).unlink()
    for change, words in (({"num_nextn_predict_layers": 2}, "graph runs one"),
                          ({"expert_swiglu_limit_list": "7"}, "expert_swiglu_limit_list is not a list"),
                          ({"v_head_dim": 40}, r"kv_b_proj.weight has shape \[320, 64\]")):
        (folder / CONFIG_NAME).write_text(json.dumps(ling_config() | change))
        with pytest.raises(CheckpointError, match=words):
            convert(folder, tmp_path / "d.gguf", block=N, progress=False)
        (folder / CONFIG_NAME).unlink()
    assert not (tmp_path / "d.gguf").exists()


def test_fp8_kv_b_is_dequantized_then_split(ling: Path, tmp_path: Path) -> None:
    # block-scaled FP8 with blocks that split neither a head nor the rank evenly: each head's rows are read through
    # the dequantization (partial blocks trimmed), then transposed; BF16 out (the checkpoint's BF16 embedding)
    import ml_dtypes
    from support.fp8_checkpoints import dequantize_reference
    from support.helpers import reader_tensors as tensors_of

    block = (40, 24)
    fp8 = quantize_checkpoint(ling, tmp_path / "fp8", block=block)
    hp = LING_HPARAMS
    ours = tensors_of(convert(fp8, tmp_path / "d.gguf", block=N, progress=False).output)
    name = HEAD + "attention.kv_b_proj.weight"
    shard = next(p for p in sorted(fp8.glob("*.safetensors")) if name in SafetensorsFile(p).tensors)
    tensors = SafetensorsFile(shard).tensors
    codes, scales = tensors[name], tensors[name + "_scale_inv"]
    with open(shard, "rb") as f:
        f.seek(codes.offset)
        raw = f.read(codes.nbytes)
        f.seek(scales.offset)
        scale = np.frombuffer(f.read(scales.nbytes), np.float32).reshape(scales.shape)
    kv_b = dequantize_reference(raw, codes.shape, scale, block).astype(ml_dtypes.bfloat16).astype(np.float32)
    kv_b = kv_b.reshape(hp.n_head, hp.qk_nope + hp.v_head, -1)
    assert ours[f"blk.{N}.attn_k_b.weight"][0] == Q.BF16
    assert np.array_equal(_values(ours[f"blk.{N}.attn_k_b.weight"]), kv_b[:, : hp.qk_nope, :].transpose(0, 2, 1))
    assert np.array_equal(_values(ours[f"blk.{N}.attn_v_b.weight"]), kv_b[:, hp.qk_nope :, :])
