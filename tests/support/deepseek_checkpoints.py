"""Tiny random ``deepseek2``-family checkpoints with the real config keys and tensor names: GLM-4.7-Flash
(``Glm4MoeLiteForCausalLM``, BF16) and DeepSeek V3 (``DeepseekV3ForCausalLM``, whose release is FP8: see
:func:`fp8_checkpoints.quantize_checkpoint`); and the DSA ones, DeepSeek V3.2 (``DeepseekV32ForCausalLM``,
``deepseek32``, FP8) and GLM-5.x (``GlmMoeDsaForCausalLM``, ``glm-dsa``, BF16 and FP8), whose every layer, the NextN
one included, also has the DSA indexer (``self_attn.indexer.{wq_b, wk, k_norm.{weight,bias}, weights_proj}``).

A full checkpoint: ``model.embed_tokens``, ``n_layers`` trunk layers (the first ``first_k_dense_replace`` dense, the
rest MoE), the NextN layer ``model.layers.{n_layers}`` (an MLA + MoE decoder layer plus ``eh_proj``, ``enorm``,
``hnorm``, ``shared_head.norm``, and for DeepSeek V3 the layer's own ``embed_tokens`` / ``shared_head.head``),
``model.norm`` and ``lm_head``; two shards and an index, the NextN layer alone in the second (as DeepSeek R1's
last shards hold layer 61). The dimensions are not multiples of 128 (q_lora 96, kv_lora 64 + rope 16, 4 heads of
nope 32 / v 48, experts of 80), so 128x128 FP8 blocks are partial in both directions.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gguf_mtp.format.safetensors_io import CONFIG_NAME
from gguf_mtp.testing.tiny_checkpoints import (
    CheckpointTensor,
    first_of_layer,
    mlp_tensors,
    moe_tensors,
    write_checkpoint,
)
from support.fp8_checkpoints import is_linear

#: GPT-2's 50,257 tokens + the 6 GLM specials, padded to a multiple of 8 (llama.cpp's GLM vocab code needs them).
VOCAB = 50264
N_LAYERS = 2


@dataclass(frozen=True)
class MlaDims:
    n_embd: int = 128
    n_vocab: int = VOCAB
    n_head: int = 4
    q_lora: int = 96
    kv_lora: int = 64
    nope: int = 32
    rope: int = 16
    v_dim: int = 48
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 80
    n_ff_dense: int = 160
    # DSA indexer (V3.2: 64 heads of 128; GLM-5: 32 of 128). The head size is a multiple of 64, as llama.cpp's
    # Hadamard rotation of the indexer keys needs (llama-kv-cache.cpp, build_input_k_rot); 192 rows: partial blocks.
    index_n_heads: int = 3
    index_head_dim: int = 64


DIMS = MlaDims()
ARCHITECTURES = {"glm47flash": "Glm4MoeLiteForCausalLM", "deepseekv3": "DeepseekV3ForCausalLM",
                 "deepseekv32": "DeepseekV32ForCausalLM", "glm5": "GlmMoeDsaForCausalLM"}
MODEL_TYPES = {"glm47flash": "glm4_moe_lite", "deepseekv3": "deepseek_v3", "deepseekv32": "deepseek_v32",
               "glm5": "glm_moe_dsa"}
#: The variants whose layers have the DSA indexer.
DSA = ("deepseekv32", "glm5")
#: GLM-5.2's per-layer indexer kinds (config.json ``indexer_types``), one per trunk layer.
GLM52_INDEXER_TYPES = ["full", "shared"]


def mla_config(variant: str, d: MlaDims = DIMS, *, n_layers: int = N_LAYERS, n_nextn: int = 1) -> dict[str, object]:
    """``config.json`` with the keys of GLM-4.7-Flash's / DeepSeek V3's (values scaled down)."""
    config: dict[str, object] = {
        "architectures": [ARCHITECTURES[variant]],
        "model_type": MODEL_TYPES[variant],
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "hidden_act": "silu",
        "hidden_size": d.n_embd,
        "intermediate_size": d.n_ff_dense,
        "moe_intermediate_size": d.n_ff_exp,
        "num_attention_heads": d.n_head,
        "num_key_value_heads": d.n_head,
        "num_hidden_layers": n_layers,
        "num_nextn_predict_layers": n_nextn,
        "first_k_dense_replace": 1,
        "n_routed_experts": d.n_expert,
        "n_shared_experts": 1,
        "num_experts_per_tok": d.n_expert_used,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.8 if variant == "glm47flash" else 2.5,
        "q_lora_rank": d.q_lora,
        "kv_lora_rank": d.kv_lora,
        "qk_nope_head_dim": d.nope,
        "qk_rope_head_dim": d.rope,
        "v_head_dim": d.v_dim,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5 if variant in ("glm47flash", "glm5") else 1e-6,
        "rope_theta": 1000000 if variant in ("glm47flash", "glm5") else 10000,
        "tie_word_embeddings": False,
        "vocab_size": d.n_vocab,
    }
    if variant in DSA:
        config.update(index_n_heads=d.index_n_heads, index_head_dim=d.index_head_dim, index_topk=8)
    if variant == "glm5":  # GLM-5.2: transformers-5 rope_parameters, and which layers run a full indexer
        del config["rope_theta"]
        config["rope_parameters"] = {"rope_theta": 1000000, "rope_type": "default"}
        config["indexer_types"] = GLM52_INDEXER_TYPES[:n_layers]
    if variant in ("deepseekv3", "deepseekv32"):
        config["rope_scaling"] = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 1024,
                                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    return config


def _layer(d: MlaDims, layer: int, *, moe: bool, dsa: bool = False) -> list[CheckpointTensor]:
    h, p = d.n_embd, f"model.layers.{layer}."
    tensors = [
        CheckpointTensor(p + "input_layernorm.weight", (h,), "BF16", "norm"),
        CheckpointTensor(p + "self_attn.q_a_proj.weight", (d.q_lora, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.q_a_layernorm.weight", (d.q_lora,), "BF16", "norm"),
        CheckpointTensor(p + "self_attn.q_b_proj.weight", (d.n_head * (d.nope + d.rope), d.q_lora), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.kv_a_proj_with_mqa.weight", (d.kv_lora + d.rope, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.kv_a_layernorm.weight", (d.kv_lora,), "BF16", "norm"),
        CheckpointTensor(p + "self_attn.kv_b_proj.weight", (d.n_head * (d.nope + d.v_dim), d.kv_lora), "BF16",
                         "weight"),
        CheckpointTensor(p + "self_attn.o_proj.weight", (h, d.n_head * d.v_dim), "BF16", "weight"),
        CheckpointTensor(p + "post_attention_layernorm.weight", (h,), "BF16", "norm"),
    ]
    if dsa:
        i = p + "self_attn.indexer."
        tensors += [CheckpointTensor(i + "wq_b.weight", (d.index_n_heads * d.index_head_dim, d.q_lora), "BF16",
                                     "weight"),
                    CheckpointTensor(i + "wk.weight", (d.index_head_dim, h), "BF16", "weight"),
                    CheckpointTensor(i + "k_norm.weight", (d.index_head_dim,), "F32", "norm"),
                    CheckpointTensor(i + "k_norm.bias", (d.index_head_dim,), "F32", "bias"),
                    CheckpointTensor(i + "weights_proj.weight", (d.index_n_heads, h), "BF16", "weight")]
    if not moe:
        return [*tensors, *mlp_tensors(p + "mlp.", h, d.n_ff_dense)]
    return [*tensors, *moe_tensors(p + "mlp.", h, d.n_ff_exp, d.n_expert, shared="shared_experts")]


def mla_tensors(variant: str, d: MlaDims = DIMS, *, n_layers: int = N_LAYERS,
                n_nextn: int = 1) -> list[CheckpointTensor]:
    """Every tensor: the trunk, then the NextN layer(s) (with their embedding / LM head copies for DeepSeek V3)."""
    h, v = d.n_embd, d.n_vocab
    trunk = [CheckpointTensor("model.embed_tokens.weight", (v, h), "BF16", "weight")]
    dsa = variant in DSA
    for layer in range(n_layers):
        trunk += _layer(d, layer, moe=layer >= 1, dsa=dsa)
    trunk += [CheckpointTensor("model.norm.weight", (h,), "BF16", "norm"),
              CheckpointTensor("lm_head.weight", (v, h), "BF16", "weight")]
    layers: list[CheckpointTensor] = []
    for layer in range(n_layers, n_layers + n_nextn):
        p = f"model.layers.{layer}."
        nextn = [CheckpointTensor(p + "eh_proj.weight", (h, 2 * h), "BF16", "weight"),
                 CheckpointTensor(p + "enorm.weight", (h,), "BF16", "norm"),
                 CheckpointTensor(p + "hnorm.weight", (h,), "BF16", "norm"),
                 CheckpointTensor(p + "shared_head.norm.weight", (h,), "BF16", "norm")]
        if variant in ("deepseekv3", "deepseekv32"):
            nextn = [CheckpointTensor(p + "embed_tokens.weight", (v, h), "BF16", "weight"), *nextn,
                     CheckpointTensor(p + "shared_head.head.weight", (v, h), "BF16", "weight")]
        layers += nextn + _layer(d, layer, moe=True, dsa=dsa)
    return trunk + layers


def write_mla_checkpoint(out_dir: Path, variant: str, d: MlaDims = DIMS, *, n_layers: int = N_LAYERS,
                         n_nextn: int = 1) -> Path:
    """Write the checkpoint folder (two shards + index, the NextN layer(s) in the second); returns it."""
    config = mla_config(variant, d, n_layers=n_layers, n_nextn=n_nextn)
    tensors = mla_tensors(variant, d, n_layers=n_layers, n_nextn=n_nextn)
    cut = first_of_layer(tensors, n_layers)
    return write_checkpoint(out_dir, config, [tensors[:cut], tensors[cut:]])


def as_glm47flash(checkpoint: Path, into: Path) -> Path:
    """A copy of DeepSeek V3 ``checkpoint`` at ``into`` whose config names GLM-4.7-Flash's class: llama.cpp's
    converter drops DeepSeek's MTP layers, and its Glm4MoeLite class (the same deepseek2 tensor handling and FP8
    dequantization) on the very same shards is the reference."""
    shutil.copytree(checkpoint, into)
    config = json.loads((into / CONFIG_NAME).read_text())
    config.update(architectures=[ARCHITECTURES["glm47flash"]], model_type=MODEL_TYPES["glm47flash"])
    (into / CONFIG_NAME).write_text(json.dumps(config))
    return into


def dsa_fp8_release(keep_bf16: tuple[str, ...] = ()) -> Callable[[str, list[int]], bool]:
    """What a DSA model's FP8 release quantizes (:func:`fp8_checkpoints.quantize_checkpoint`'s ``quantized``): the
    linear weights except the indexer's ``weights_proj`` (BF16 in V3.2) and ``keep_bf16`` (GLM-5 keeps
    ``eh_proj``)."""
    return lambda name, shape: is_linear(name, shape) and not any(k in name for k in ("weights_proj", *keep_bf16))
