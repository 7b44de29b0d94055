"""Tiny random MiMo-V2 (``MiMoV2FlashForCausalLM``) checkpoints with the real config keys and tensor names, BF16 and
block-scaled FP8.

A full checkpoint: ``model.embed_tokens``, 2 trunk layers (layer 0 full attention with a dense MLP, layer 1 sliding
window with attention sinks and a MoE: ``mlp.gate``, ``e_score_correction_bias``, per-expert projections), the three
MTP layers ``model.mtp.layers.{0,1,2}`` (sliding-window layers: fused ``qkv_proj``, sinks, a dense MLP,
``final_layernorm``, plus ``enorm``/``hnorm``/``eh_proj``), ``model.norm`` and ``lm_head``; 2 shards + index, the MTP
layers alone in the last. Every attention has a fused ``qkv_proj`` ``[Q | K | V]`` with K and V heads of different
sizes (``head_dim`` 32, ``v_head_dim`` 24).

FP8 variants (:func:`write_mimo_checkpoint` ``fp8=``): every linear weight ``F8_E4M3`` with 128x128 block scales
(hidden 160 and the MLP's 192: partial blocks), ``ignored_layers`` left BF16, and each ``qkv_proj`` either
``"unsharded"`` (``ceil(rows/128)`` scale rows) or ``"tp4"``: saved as 4 tensor-parallel ranks, each rank's rows
``[Q_r | K_r | V_r]`` quantized with its own block rows (``4 * ceil(rows_per_rank/128)`` scale rows), the layout of
MiMo-V2.5. The dims are chosen so the scale rows tell the layouts apart (352 rows: 3 unsharded, 4 with 4 ranks, 8
with 8 ranks), as they do for the real models.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np

from gguf_mtp.format.safetensors_io import CONFIG_NAME
from gguf_mtp.testing.tiny_checkpoints import CheckpointTensor, mlp_tensors, moe_tensors, write_checkpoint
from support.convert_support import read_raw_safetensors, write_raw_safetensors
from support.fp8_checkpoints import _bf16_to_f32, _quantize, is_linear, quantize_checkpoint

N_LAYER, N_NEXTN = 2, 3
H, N_HEAD, HEAD_DIM, V_HEAD_DIM, N_KV_FULL, N_KV_SWA = 160, 4, 32, 24, 2, 4
N_FF, N_FF_EXP, N_EXPERT, VOCAB = 192, 64, 4, 50257
HYBRID = [0, 1]
#: Left BF16 in the FP8 variants (MiMo's config lists some o_proj this way).
IGNORED = ["model.layers.0.self_attn.o_proj", "model.mtp.layers.1.self_attn.o_proj"]
FP8_LAYOUTS = ("unsharded", "tp4")


def qkv_rows(n_kv: int) -> tuple[int, int, int]:
    return N_HEAD * HEAD_DIM, n_kv * HEAD_DIM, n_kv * V_HEAD_DIM


def mimo_config() -> dict[str, object]:
    """A ``config.json`` with MiMo-V2-Flash's keys."""
    return {
        "architectures": ["MiMoV2FlashForCausalLM"],
        "model_type": "mimo_v2_flash",
        "torch_dtype": "bfloat16",
        "hidden_size": H,
        "intermediate_size": N_FF,
        "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD,
        "num_key_value_heads": N_KV_FULL,
        "head_dim": HEAD_DIM,
        "v_head_dim": V_HEAD_DIM,
        "swa_num_attention_heads": N_HEAD,
        "swa_num_key_value_heads": N_KV_SWA,
        "swa_head_dim": HEAD_DIM,
        "swa_v_head_dim": V_HEAD_DIM,
        "hybrid_layer_pattern": HYBRID,
        "sliding_window": 16,
        "add_full_attention_sink_bias": False,
        "add_swa_attention_sink_bias": True,
        "attention_value_scale": 0.707,
        "partial_rotary_factor": 0.5,
        "rope_theta": 5000000.0,
        "swa_rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "layernorm_epsilon": 1e-5,
        "n_routed_experts": N_EXPERT,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": N_FF_EXP,
        "moe_layer_freq": [0, 1],
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": None,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
    }


def _attention(p: str, *, swa: bool) -> list[CheckpointTensor]:
    q, k, v = qkv_rows(N_KV_SWA if swa else N_KV_FULL)
    tensors = [
        CheckpointTensor(p + "input_layernorm.weight", (H,), "BF16", "norm"),
        CheckpointTensor(p + "self_attn.qkv_proj.weight", (q + k + v, H), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.o_proj.weight", (H, N_HEAD * V_HEAD_DIM), "BF16", "weight"),
    ]
    if swa:
        tensors.append(CheckpointTensor(p + "self_attn.attention_sink_bias", (N_HEAD,), "BF16", "bias"))
    return [*tensors, CheckpointTensor(p + "post_attention_layernorm.weight", (H,), "BF16", "norm")]


def mimo_tensors() -> tuple[list[CheckpointTensor], list[CheckpointTensor]]:
    """(trunk tensors, MTP-layer tensors) of the full checkpoint."""
    trunk = [CheckpointTensor("model.embed_tokens.weight", (VOCAB, H), "BF16", "weight")]
    for layer, swa in enumerate(HYBRID):
        p = f"model.layers.{layer}."
        trunk += _attention(p, swa=bool(swa))
        if layer == 0:
            trunk += mlp_tensors(p + "mlp.", H, N_FF)
            continue
        trunk += moe_tensors(p + "mlp.", H, N_FF_EXP, N_EXPERT)
    trunk += [CheckpointTensor("model.norm.weight", (H,), "BF16", "norm"),
              CheckpointTensor("lm_head.weight", (VOCAB, H), "BF16", "weight")]
    mtp: list[CheckpointTensor] = []
    for i in range(N_NEXTN):
        p = f"model.mtp.layers.{i}."
        mtp += [CheckpointTensor(p + "enorm.weight", (H,), "BF16", "norm"),
                CheckpointTensor(p + "hnorm.weight", (H,), "BF16", "norm"),
                CheckpointTensor(p + "eh_proj.weight", (H, 2 * H), "BF16", "weight"),
                *_attention(p, swa=True), *mlp_tensors(p + "mlp.", H, N_FF),
                CheckpointTensor(p + "final_layernorm.weight", (H,), "BF16", "norm")]
    return trunk, mtp


def write_mimo_checkpoint(out_dir: Path, *, fp8: str | None = None, seed: int = 0) -> Path:
    """Write the full tiny MiMo-V2 checkpoint folder (see the module docstring), BF16 or ``fp8`` (one of
    :data:`FP8_LAYOUTS`); returns the folder. No tokenizer (``upstream.write_gpt2_tokenizer`` adds one)."""
    out = Path(out_dir)
    bf16 = out if fp8 is None else out.with_name(out.name + "-bf16")
    write_checkpoint(bf16, mimo_config(), list(mimo_tensors()), seed=seed)
    if fp8 is None:
        return out
    if fp8 not in FP8_LAYOUTS:
        raise ValueError(f"fp8 must be one of {FP8_LAYOUTS}")

    def quantized(name: str, shape: list[int]) -> bool:
        return is_linear(name, shape) and name.removesuffix(".weight") not in IGNORED

    quantize_checkpoint(bf16, out, quantized=quantized)
    shutil.rmtree(bf16)
    config = json.loads((out / CONFIG_NAME).read_text())
    config["quantization_config"]["ignored_layers"] = IGNORED
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    if fp8 == "tp4":
        _shard_qkv(out, tp=4)
    return out


def _shard_qkv(folder: Path, tp: int, block: int = 128) -> None:
    """Rewrite every FP8 ``qkv_proj`` as saved by ``tp`` tensor-parallel ranks (rows ``[Q_r | K_r | V_r]`` per rank,
    each rank quantized with its own block rows), from the dequantized unsharded tensor."""
    from support.fp8_checkpoints import dequantize_reference

    for path in sorted(folder.glob("*.safetensors")):
        entries = read_raw_safetensors(path)
        for name in [n for n in entries if n.endswith("self_attn.qkv_proj.weight")]:
            dtype, shape, codes = entries[name]
            scale_dtype, scale_shape, scale_raw = entries[name + "_scale_inv"]
            scales = np.frombuffer(scale_raw, np.float32).reshape(scale_shape)
            values = dequantize_reference(codes, tuple(shape), scales, (block, block))
            swa = ".mtp." in name or HYBRID[int(name.split(".")[2])] == 1
            q, k, _ = qkv_rows(N_KV_SWA if swa else N_KV_FULL)
            parts = [values[:q], values[q : q + k], values[q + k :]]
            ranks = [np.concatenate([part[r * len(part) // tp : (r + 1) * len(part) // tp] for part in parts])
                     for r in range(tp)]
            rank_codes, rank_scales = zip(*(_quantize(rank, (block, block), dtype) for rank in ranks), strict=True)
            stacked = np.concatenate(rank_scales)
            assert stacked.shape[0] == tp * math.ceil(shape[0] // tp / block)
            entries[name] = (dtype, shape, b"".join(rank_codes))
            entries[name + "_scale_inv"] = (scale_dtype, list(stacked.shape), stacked.tobytes())
        write_raw_safetensors(path, entries)


def bf16_values(raw: bytes, shape: list[int]) -> np.ndarray:
    """BF16 bytes as float32 (for tests)."""
    return _bf16_to_f32(raw, shape)
