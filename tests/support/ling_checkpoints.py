"""Tiny random inclusionAI Ling-3.0 (``BailingMoeV3ForCausalLM``, ``bailingmoe3``) checkpoints with the real config
keys and tensor names.

``model.word_embeddings``, ``num_hidden_layers`` trunk layers (the first ``first_k_dense_replace`` dense, the rest
MoE), ``model.norm``, ``lm_head``, then the MTP layer ``model.layers.{N}``: an MLA attention (``attention.q_proj`` or,
Ling-3.0-tiny style, ``q_a_proj``/``q_a_layernorm``/``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
``kv_b_proj``, the head-wise gate ``g_proj`` and ``dense``) + MoE layer (``mlp.gate`` with ``expert_bias``, per-expert
and shared experts) plus ``eh_proj``/``enorm``/``hnorm`` and ``final_layernorm`` (llama.cpp's
``layer_output_norm``), alone in the last of 2 shards + index.

The trunk interleaves as Ling-3.0 does (``layer_group_size`` 2): layer 0 is a Kimi-delta-attention layer
(``attention.{q,k,v}_proj``, ``{q,k,v}_conv1d``, ``f_proj``, ``b_proj``, ``g_proj``, ``A_log``, ``dt_bias``,
``o_norm``, ``o_proj``) with the dense MLP, layer 1 an MLA + MoE layer like the head's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf_mtp.testing.tiny_checkpoints import (
    CheckpointTensor,
    first_of_layer,
    mlp_tensors,
    moe_tensors,
    write_checkpoint,
)


@dataclass(frozen=True)
class LingHparams:
    """The tiny dimensions (every MLA one distinct, so a transposed or swapped split cannot pass)."""

    n_embd: int = 128
    n_vocab: int = 50264  # GPT-2's 50,257 tokens padded to a multiple of 8
    n_head: int = 4
    q_lora_rank: int | None = None
    kv_lora_rank: int = 64
    qk_nope: int = 32
    qk_rope: int = 16
    v_head: int = 48
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 64
    n_ff_shexp: int = 64
    n_ff_dense: int = 128


LING_HPARAMS = LingHparams()


def ling_config(hp: LingHparams = LING_HPARAMS, *, n_layers: int = 2) -> dict[str, object]:
    """A ``config.json`` with Ling-3.0's keys."""
    return {
        "architectures": ["BailingMoeV3ForCausalLM"],
        "model_type": "bailing_moe_v3",
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "hidden_size": hp.n_embd,
        "intermediate_size": hp.n_ff_dense,
        "moe_intermediate_size": hp.n_ff_exp,
        "moe_shared_expert_intermediate_size": hp.n_ff_shexp,
        "num_attention_heads": hp.n_head,
        "num_key_value_heads": hp.n_head,
        "head_dim": hp.qk_nope + hp.qk_rope,
        "q_lora_rank": hp.q_lora_rank,
        "kv_lora_rank": hp.kv_lora_rank,
        "qk_nope_head_dim": hp.qk_nope,
        "qk_rope_head_dim": hp.qk_rope,
        "v_head_dim": hp.v_head,
        "num_hidden_layers": n_layers,
        "layer_group_size": 2,
        "first_k_dense_replace": 1,
        "num_experts": hp.n_expert,
        "num_experts_per_tok": hp.n_expert_used,
        "num_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "score_function": "sigmoid",
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "expert_swiglu_limit_list": [None] + [7.0] * (n_layers - 1),
        "share_expert_swiglu_limit_list": [None] + [10.0] * (n_layers - 1),
        "no_kda_lora": True,
        "kda_safe_gate": True,
        "kda_lower_bound": -5.0,
        "short_conv_kernel_size": 4,
        "gated_attention_proj_granularity_type": "head_wise",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 600000.0,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "vocab_size": hp.n_vocab,
    }


def _kda(hp: LingHparams, attn: str) -> list[CheckpointTensor]:
    h, n, d = hp.n_embd, hp.n_head, hp.qk_nope + hp.qk_rope
    inner = n * d
    return [
        *(CheckpointTensor(attn + f"{x}_proj.weight", (inner, h), "BF16", "weight") for x in "qkv"),
        *(CheckpointTensor(attn + f"{x}_conv1d.weight", (inner, 1, 4), "BF16", "weight") for x in "qkv"),
        CheckpointTensor(attn + "f_proj.weight", (inner, h), "BF16", "weight"),
        CheckpointTensor(attn + "b_proj.weight", (n, h), "BF16", "weight"),
        CheckpointTensor(attn + "g_proj.weight", (inner, h), "BF16", "weight"),
        CheckpointTensor(attn + "A_log", (n,), "F32", "bias"),
        CheckpointTensor(attn + "dt_bias", (inner,), "F32", "bias"),
        CheckpointTensor(attn + "o_norm.weight", (d,), "BF16", "norm"),
        CheckpointTensor(attn + "o_proj.weight", (h, inner), "BF16", "weight"),
    ]


def _layer(hp: LingHparams, layer: int, *, moe: bool, kda: bool = False) -> list[CheckpointTensor]:
    h, n = hp.n_embd, hp.n_head
    p = f"model.layers.{layer}."
    attn = p + "attention."
    tensors = [CheckpointTensor(p + "input_layernorm.weight", (h,), "BF16", "norm")]
    if kda:
        tensors += _kda(hp, attn)
    elif hp.q_lora_rank is None:
        tensors.append(CheckpointTensor(attn + "q_proj.weight", (n * (hp.qk_nope + hp.qk_rope), h), "BF16", "weight"))
    else:
        tensors += [
            CheckpointTensor(attn + "q_a_proj.weight", (hp.q_lora_rank, h), "BF16", "weight"),
            CheckpointTensor(attn + "q_a_layernorm.weight", (hp.q_lora_rank,), "BF16", "norm"),
            CheckpointTensor(attn + "q_b_proj.weight", (n * (hp.qk_nope + hp.qk_rope), hp.q_lora_rank), "BF16",
                             "weight"),
        ]
    if not kda:
        tensors += [
            CheckpointTensor(attn + "kv_a_proj_with_mqa.weight", (hp.kv_lora_rank + hp.qk_rope, h), "BF16", "weight"),
            CheckpointTensor(attn + "kv_a_layernorm.weight", (hp.kv_lora_rank,), "BF16", "norm"),
            CheckpointTensor(attn + "kv_b_proj.weight", (n * (hp.qk_nope + hp.v_head), hp.kv_lora_rank), "BF16",
                             "weight"),
            CheckpointTensor(attn + "g_proj.weight", (n, h), "BF16", "weight"),
            CheckpointTensor(attn + "dense.weight", (h, n * hp.v_head), "BF16", "weight"),
        ]
    tensors.append(CheckpointTensor(p + "post_attention_layernorm.weight", (h,), "BF16", "norm"))
    if not moe:
        return [*tensors, *mlp_tensors(p + "mlp.", h, hp.n_ff_dense)]
    return [*tensors, *moe_tensors(p + "mlp.", h, hp.n_ff_exp, hp.n_expert, bias="gate.expert_bias",
                                   shared="shared_experts", n_ff_shexp=hp.n_ff_shexp)]


def ling_tensors(hp: LingHparams = LING_HPARAMS, *, n_layers: int = 2) -> list[CheckpointTensor]:
    """Every tensor of the full checkpoint: trunk first, then the MTP layer ``model.layers.{n_layers}``."""
    h, v = hp.n_embd, hp.n_vocab
    tensors = [CheckpointTensor("model.word_embeddings.weight", (v, h), "BF16", "weight")]
    for layer in range(n_layers):
        tensors += _layer(hp, layer, moe=layer >= 1, kda=layer == 0)
    tensors += [CheckpointTensor("model.norm.weight", (h,), "BF16", "norm"),
                CheckpointTensor("lm_head.weight", (v, h), "BF16", "weight")]
    p = f"model.layers.{n_layers}."
    return [*tensors,
            CheckpointTensor(p + "eh_proj.weight", (h, 2 * h), "BF16", "weight"),
            CheckpointTensor(p + "enorm.weight", (h,), "BF16", "norm"),
            CheckpointTensor(p + "hnorm.weight", (h,), "BF16", "norm"),
            *_layer(hp, n_layers, moe=True),
            CheckpointTensor(p + "final_layernorm.weight", (h,), "BF16", "norm")]


def write_ling_checkpoint(out_dir: Path, hp: LingHparams = LING_HPARAMS, *, n_layers: int = 2,
                          seed: int = 0) -> Path:
    """Write a full tiny Ling-3.0 checkpoint folder (see the module docstring); returns the folder."""
    tensors = ling_tensors(hp, n_layers=n_layers)
    cut = first_of_layer(tensors, n_layers)
    return write_checkpoint(out_dir, ling_config(hp, n_layers=n_layers), [tensors[:cut], tensors[cut:]], seed=seed)
