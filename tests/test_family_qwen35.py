"""Qwen3.5 / Qwen3.6 (qwen35, qwen35moe) and Qwen3-Next (qwen3next) MTP heads: convert, llama.cpp, upstream parity.

Two groups:

* convert of tiny checkpoints (:mod:`qwen_checkpoints`, a small vocabulary): names, ggml shapes and types, the
  RMSNorm ``+1`` values, the packed ``gate_up_proj`` split, per-expert stacking, the ``model.language_model.*``
  layout, ``attention.recurrent_layers``, and one-line refusals;
* upstream parity (``upstream``): llama.cpp's own converter makes full / ``--no-mtp`` / ``--mtp`` of each
  family's checkpoint (real GPT-2 tokenizer). The checks every family shares (the draft is ``--mtp``'s NextN block
  byte for byte, the ``--standalone`` sidecar ``--mtp``'s file, ``strip(full)`` ``--no-mtp``, ``compose(--no-mtp,
  draft)`` full; llama.cpp runs the composite with upstream's trunk and MTP logits, and the sidecar) are
  tests/test_upstream_parity.py's ``qwen35moe`` / ``qwen35`` / ``qwen3next`` entries, with no difference allowed;
  here, on the same shared sets, ``attention.recurrent_layers`` after strip and compose.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from support.convert_support import raw_tensor, rewrite_checkpoint_tensor
from support.helpers import reader_kvs, reader_tensors
from support.qwen_checkpoints import DIMS, N_TRUNK, QwenDims, write_qwen_checkpoint
from support.upstream import ParitySet

from gguf_mtp.errors import CheckpointError, GGUFMTPError
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.strip import strip

Q = GGMLQuantizationType
BLOCK = N_TRUNK
ARCH = {"qwen35moe": "qwen35moe", "qwen35": "qwen35", "qwen3next": "qwen3next"}
#: A small vocabulary for the tests that never meet llama.cpp (the upstream ones need GPT-2's 50,264).
SMALL = QwenDims(n_vocab=256)

H, E, F, S = DIMS.n_embd, DIMS.n_expert, DIMS.n_ff_exp, DIMS.n_ff_shexp
ATTENTION = {  # ggml shape, type
    "nextn.eh_proj.weight": ((2 * H, H), Q.BF16),
    "nextn.enorm.weight": ((H,), Q.F32),
    "nextn.hnorm.weight": ((H,), Q.F32),
    "attn_norm.weight": ((H,), Q.F32),
    "attn_q.weight": ((H, 2 * DIMS.n_head * DIMS.head_dim), Q.BF16),
    "attn_k.weight": ((H, DIMS.n_head_kv * DIMS.head_dim), Q.BF16),
    "attn_v.weight": ((H, DIMS.n_head_kv * DIMS.head_dim), Q.BF16),
    "attn_output.weight": ((DIMS.n_head * DIMS.head_dim, H), Q.BF16),
    "attn_q_norm.weight": ((DIMS.head_dim,), Q.F32),
    "attn_k_norm.weight": ((DIMS.head_dim,), Q.F32),
    "post_attention_norm.weight": ((H,), Q.F32),
    "nextn.shared_head_norm.weight": ((H,), Q.F32),
}
MOE = {
    "ffn_gate_inp.weight": ((H, E), Q.F32),
    "ffn_gate_exps.weight": ((H, F, E), Q.BF16),
    "ffn_up_exps.weight": ((H, F, E), Q.BF16),
    "ffn_down_exps.weight": ((F, H, E), Q.BF16),
    "ffn_gate_inp_shexp.weight": ((H, 1), Q.F32),
    "ffn_gate_shexp.weight": ((H, S), Q.BF16),
    "ffn_up_shexp.weight": ((H, S), Q.BF16),
    "ffn_down_shexp.weight": ((S, H), Q.BF16),
}
DENSE = {
    "ffn_gate.weight": ((H, DIMS.n_ff), Q.BF16),
    "ffn_up.weight": ((H, DIMS.n_ff), Q.BF16),
    "ffn_down.weight": ((DIMS.n_ff, H), Q.BF16),
}
#: checkpoint norm -> NextN tensor (each gets +1).
NORMS = {
    "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
    "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight",
    "mtp.norm.weight": "nextn.shared_head_norm.weight",
    "mtp.layers.0.input_layernorm.weight": "attn_norm.weight",
    "mtp.layers.0.post_attention_layernorm.weight": "post_attention_norm.weight",
    "mtp.layers.0.self_attn.q_norm.weight": "attn_q_norm.weight",
    "mtp.layers.0.self_attn.k_norm.weight": "attn_k_norm.weight",
}
COPIED = {
    "mtp.fc.weight": "nextn.eh_proj.weight",
    "mtp.layers.0.self_attn.q_proj.weight": "attn_q.weight",
    "mtp.layers.0.self_attn.k_proj.weight": "attn_k.weight",
    "mtp.layers.0.self_attn.v_proj.weight": "attn_v.weight",
    "mtp.layers.0.self_attn.o_proj.weight": "attn_output.weight",
}


def expected(variant: str) -> dict[str, tuple[tuple[int, ...], int]]:
    return {f"blk.{BLOCK}.{n}": v for n, v in {**ATTENTION, **(DENSE if variant == "qwen35" else MOE)}.items()}


def _bf16_to_f32(raw: bytes) -> np.ndarray:
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------------- convert (no llama.cpp)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Full small-vocabulary checkpoints: the three families, plus qwen35moe as CausalLM with per-expert tensors,
    and a head-only qwen35moe."""
    work = tmp_path_factory.mktemp("qwen-small")
    return {
        "qwen35moe": write_qwen_checkpoint(work / "qwen35moe", "qwen35moe", d=SMALL),
        "qwen35": write_qwen_checkpoint(work / "qwen35", "qwen35", d=SMALL),
        "qwen3next": write_qwen_checkpoint(work / "qwen3next", "qwen3next", d=SMALL),
        "qwen35moe-experts": write_qwen_checkpoint(work / "moe-experts", "qwen35moe", conditional=False,
                                                   packed=False, d=SMALL),
        "head": write_qwen_checkpoint(work / "head", "qwen35moe", head_only=True, d=SMALL),
    }


@pytest.fixture(scope="module")
def drafts(small: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("qwen-drafts")
    return {k: convert(p, work / f"{k}.gguf", block=BLOCK, progress=False).output for k, p in small.items()}


@pytest.mark.parametrize("variant", ["qwen35moe", "qwen35", "qwen3next", "qwen35moe-experts", "head"])
def test_names_shapes_and_types(variant: str, drafts: dict[str, Path]) -> None:
    family = variant.split("-")[0] if variant != "head" else "qwen35moe"
    tensors = reader_tensors(drafts[variant])
    assert {n: (shape, qtype) for n, (qtype, shape, _) in tensors.items()} == expected(family)
    kvs = reader_kvs(drafts[variant])
    assert kvs["general.architecture"][1] == ARCH[family]
    assert kvs[f"{family}.block_count"][1] == BLOCK + 1
    assert kvs[f"{family}.nextn_predict_layers"][1] == 1


@pytest.mark.parametrize("variant", ["qwen35moe", "qwen35", "qwen3next"])
def test_norms_get_plus_one_in_f32_and_matrices_are_the_checkpoint_bytes(variant: str, small: dict[str, Path],
                                                                          drafts: dict[str, Path]) -> None:
    tensors = reader_tensors(drafts[variant])
    for hf, gguf_name in NORMS.items():
        dtype, _, raw = raw_tensor(small[variant], hf)
        assert dtype == "BF16"
        qtype, _, ours = tensors[f"blk.{BLOCK}.{gguf_name}"]
        assert qtype == Q.F32
        want = _bf16_to_f32(raw) + np.float32(1)
        assert np.frombuffer(ours, np.float32).tobytes() == want.tobytes(), hf
        assert abs(float(np.mean(np.frombuffer(ours, np.float32))) - 1.0) < 0.1  # stored zero-centred
    for hf, gguf_name in COPIED.items():
        assert tensors[f"blk.{BLOCK}.{gguf_name}"][2] == raw_tensor(small[variant], hf)[2], hf


def test_packed_gate_up_is_split_per_expert(small: dict[str, Path], drafts: dict[str, Path]) -> None:
    _, shape, raw = raw_tensor(small["qwen35moe"], "mtp.layers.0.mlp.experts.gate_up_proj")
    assert shape == (E, 2 * F, H)
    rows = np.frombuffer(raw, np.uint16).reshape(E, 2 * F, H)
    tensors = reader_tensors(drafts["qwen35moe"])
    assert tensors[f"blk.{BLOCK}.ffn_gate_exps.weight"][2] == rows[:, :F, :].tobytes()
    assert tensors[f"blk.{BLOCK}.ffn_up_exps.weight"][2] == rows[:, F:, :].tobytes()
    down = raw_tensor(small["qwen35moe"], "mtp.layers.0.mlp.experts.down_proj")[2]
    assert tensors[f"blk.{BLOCK}.ffn_down_exps.weight"][2] == down
    # the router and the shared expert's gate are F32 (llama.cpp's rule), values unchanged
    for hf, name in (("mlp.gate.weight", "ffn_gate_inp"), ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp")):
        ours = tensors[f"blk.{BLOCK}.{name}.weight"]
        assert ours[0] == Q.F32
        assert ours[2] == _bf16_to_f32(raw_tensor(small["qwen35moe"], "mtp.layers.0." + hf)[2]).tobytes()


@pytest.mark.parametrize("variant", ["qwen35moe-experts", "qwen3next"])
def test_per_expert_tensors_are_stacked_in_expert_order(variant: str, small: dict[str, Path],
                                                        drafts: dict[str, Path]) -> None:
    tensors = reader_tensors(drafts[variant])
    for proj in ("gate", "up", "down"):
        want = b"".join(raw_tensor(small[variant], f"mtp.layers.0.mlp.experts.{e}.{proj}_proj.weight")[2]
                        for e in range(E))
        assert tensors[f"blk.{BLOCK}.ffn_{proj}_exps.weight"][2] == want


def test_conditional_generation_layout_reads_text_config_and_only_the_head_shard(small: dict[str, Path],
                                                                                 tmp_path: Path) -> None:
    folder = small["qwen35moe"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"] and "hidden_size" not in config
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.language_model.layers.3.self_attn.q_proj.weight"] == "model-00001-of-00002.safetensors"
    report = convert(folder, tmp_path / "d.gguf", block=BLOCK, dry_run=True, progress=False)
    assert [p.name for p in report.plan.checkpoint.files] == ["model-00002-of-00002.safetensors"]
    assert report.plan.hf_architecture == "Qwen3_5MoeForConditionalGeneration"
    hows = {t.name: t.how for t in report.plan.tensors}
    assert hows[f"blk.{BLOCK}.ffn_gate_exps.weight"] == f"stack {E} experts, copy"
    assert hows[f"blk.{BLOCK}.nextn.enorm.weight"] == "convert BF16+1->F32"
    # the same head from a head-only folder gives the same bytes
    assert reader_tensors(convert(small["head"], tmp_path / "h.gguf", block=BLOCK, progress=False).output) == \
        reader_tensors(convert(folder, tmp_path / "f.gguf", block=BLOCK, progress=False).output)


@pytest.mark.parametrize(("variant", "recurrent"), [("qwen35moe", [True, True, True, False, False]),
                                                    ("qwen35", [True, True, True, False, False]),
                                                    ("qwen3next", [True, True, True, False, False])])
def test_recurrent_layers_gets_false_for_the_nextn_block(variant: str, recurrent: list[bool],
                                                         small: dict[str, Path], drafts: dict[str, Path]) -> None:
    kvs = reader_kvs(drafts[variant])
    key = f"{variant}.attention.recurrent_layers"
    # Qwen3-Next's config has no layer_types: the pattern comes from full_attention_interval, as transformers
    # derives it for upstream's converter
    config = json.loads((small[variant] / "config.json").read_text())
    assert ("layer_types" in config.get("text_config", config)) == (variant != "qwen3next")
    types, values = kvs[key]
    assert types == [GGUFValueType.ARRAY, GGUFValueType.BOOL] and list(values) == recurrent
    assert kvs[f"{variant}.full_attention_interval"][1] == 4


def test_block_index_defaults_to_num_hidden_layers(small: dict[str, Path], drafts: dict[str, Path],
                                                  tmp_path: Path) -> None:
    # neither target nor block: the head follows the trunk (Qwen3.6-35B-A3B: blk.40), as upstream numbers it
    report = convert(small["qwen35moe"], tmp_path / "d.gguf", progress=False)
    assert report.plan.block == BLOCK
    assert reader_tensors(report.output) == reader_tensors(drafts["qwen35moe"])


def test_q8_0_keeps_norms_f32_plus_one(small: dict[str, Path], tmp_path: Path) -> None:
    out = convert(small["qwen35moe"], tmp_path / "q8.gguf", block=BLOCK, outtype="q8_0", progress=False).output
    tensors = reader_tensors(out)
    assert tensors[f"blk.{BLOCK}.attn_q.weight"][0] == Q.Q8_0
    assert tensors[f"blk.{BLOCK}.ffn_gate_exps.weight"][0] == Q.Q8_0
    raw = raw_tensor(small["qwen35moe"], "mtp.norm.weight")[2]
    assert tensors[f"blk.{BLOCK}.nextn.shared_head_norm.weight"][2] == (_bf16_to_f32(raw) + 1).tobytes()


@pytest.fixture
def damaged(small: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(small["qwen35moe"], tmp_path / "ckpt"))


def _error(folder: Path, tmp_path: Path) -> GGUFMTPError:
    with pytest.raises(GGUFMTPError) as info:
        convert(folder, tmp_path / "draft.gguf", block=BLOCK, progress=False)
    assert not (tmp_path / "draft.gguf").exists()
    assert "\n" not in str(info.value)
    return info.value


def test_missing_tensor_is_named(damaged: Path, tmp_path: Path) -> None:
    rewrite_checkpoint_tensor(damaged, "mtp.layers.0.self_attn.k_norm.weight", drop=True)
    error = _error(damaged, tmp_path)
    assert isinstance(error, CheckpointError)
    assert "lacks 1 tensor(s) llama.cpp needs, e.g. blk.N.attn_k_norm.weight" in str(error)


def test_fp8_head_is_refused(damaged: Path, tmp_path: Path) -> None:
    name = "mtp.layers.0.self_attn.q_proj.weight"
    _, shape, data = raw_tensor(damaged, name)
    scale = (name + "_scale_inv", ("F32", [shape[0] // 128 or 1, 1], b"\0\0\x80\x3f" * (shape[0] // 128 or 1)))
    rewrite_checkpoint_tensor(damaged, name, dtype="F8_E4M3", data=data[: len(data) // 2], add=dict([scale]))
    error = _error(damaged, tmp_path)
    assert isinstance(error, CheckpointError)
    assert "F8_E4M3: a quantized tensor, and config.json has no quantization_config" in str(error)


def test_misshapen_packed_experts_are_refused(damaged: Path, tmp_path: Path) -> None:
    name = "mtp.layers.0.mlp.experts.gate_up_proj"
    _, _, data = raw_tensor(damaged, name)
    rewrite_checkpoint_tensor(damaged, name, shape=[E, F, 2 * H])
    error = _error(damaged, tmp_path)
    assert f"{name} has shape [{E}, {F}, {2 * H}], config.json implies [{E}, {2 * F}, {H}]" in str(error)
    assert len(data) == E * 2 * F * H * 2


def test_missing_expert_is_named(small: dict[str, Path], tmp_path: Path) -> None:
    folder = Path(shutil.copytree(small["qwen35moe-experts"], tmp_path / "ckpt"))
    rewrite_checkpoint_tensor(folder, "mtp.layers.0.mlp.experts.2.up_proj.weight", drop=True)
    error = _error(folder, tmp_path)
    assert f"{E - 1} of {E} experts' up_proj" in str(error) and "missing experts 2" in str(error)


def test_two_mtp_layers_are_refused(damaged: Path, tmp_path: Path) -> None:
    config = json.loads((damaged / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 2
    (damaged / "config.json").write_text(json.dumps(config))
    assert "runs one NextN block" in str(_error(damaged, tmp_path))


def test_cli_refusal_is_one_line_with_exit_2(damaged: Path, tmp_path: Path) -> None:
    rewrite_checkpoint_tensor(damaged, "mtp.fc.weight", drop=True)
    proc = subprocess.run([sys.executable, "-m", "gguf_mtp", "convert", str(damaged), "-o", str(tmp_path / "d.gguf"),
                           "--block", str(BLOCK)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "blk.N.nextn.eh_proj.weight" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------- upstream parity
# (draft, sidecar, strip, composite and llama.cpp's runs against upstream's files: tests/test_upstream_parity.py's
# qwen35moe / qwen35 / qwen3next entries, where no difference is allowed; here the hybrid layers' pattern)

VARIANTS = [pytest.param(v, marks=pytest.mark.parity(v)) for v in ("qwen35moe", "qwen35", "qwen3next")]


def _recurrent_layers(path: Path, variant: str) -> list[bool]:
    kv = read_header(path).kvs[f"{variant}.attention.recurrent_layers"]
    assert kv.element_type == GGUFValueType.BOOL
    return list(kv.value)


@pytest.mark.upstream
@pytest.mark.parametrize("variant", VARIANTS)
def test_strip_and_compose_give_upstreams_recurrent_layers(variant: str, parity: ParitySet, tmp_path: Path) -> None:
    """``strip`` shortens upstream's full-file pattern to its ``--no-mtp`` one; ``compose`` lengthens the trunk's
    with ``false`` for the NextN block, as upstream writes it."""
    stripped = strip(parity.full, tmp_path / "stripped", progress=False).output_paths[0]
    assert _recurrent_layers(stripped, variant) == _recurrent_layers(parity.trunk, variant) == [True] * 3 + [False]
    assert _recurrent_layers(parity.composite, variant) == _recurrent_layers(parity.full, variant) == \
        [True] * 3 + [False] * 2
