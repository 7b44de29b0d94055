"""Tiny random Step-3.5-Flash (``Step3p5ForCausalLM``) checkpoints with the real config keys and tensor names.

A full checkpoint: ``model.embed_tokens``, ``num_hidden_layers`` (3) trunk layers (layer 0 dense with full
attention, layers 1-2 MoE with sliding attention: ``moe.gate``, ``moe.router_bias``, packed 3-D
``moe.{gate,up,down}_proj``, ``share_expert.*``), the three MTP layers ``model.layers.{3,4,5}`` (a dense decoder
layer each, plus ``eh_proj``/``enorm``/``hnorm`` and the nested ``transformer.shared_head.{norm,output}``),
``model.norm`` and ``lm_head``; 2 shards + index, the MTP layers alone in the last. Sliding-attention layers have
more query heads (``attention_other_setting``), so ``head_count`` differs per layer; the MTP layers are
[sliding, full, sliding] so the NextN blocks differ too. Norms are stored zero-centred (small values), as Step's
``1 + weight`` RMSNorm keeps them.

``step37=True`` writes the same model as Step-3.7-Flash lays it out (``Step3p7ForConditionalGeneration``): the text
keys in ``text_config``, the text tensors under ``model.language_model.``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gguf_mtp.testing.tiny_checkpoints import CheckpointTensor, mlp_tensors, write_checkpoint

N_LAYER, N_NEXTN = 3, 3
H, HEAD_DIM, N_HEAD, N_HEAD_SWA, N_KV = 128, 32, 4, 8, 2
N_FF, N_FF_EXP, N_EXPERT, VOCAB = 128, 64, 4, 50257
LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention",
               "sliding_attention", "full_attention", "sliding_attention"]


def step_config() -> dict[str, object]:
    """A ``config.json`` with Step-3.5-Flash's keys."""
    return {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "torch_dtype": "bfloat16",
        "hidden_size": H,
        "intermediate_size": N_FF,
        "num_attention_heads": N_HEAD,
        "num_attention_groups": N_KV,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": N_LAYER,
        "num_nextn_predict_layers": N_NEXTN,
        "max_position_embeddings": 4096,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "rope_theta": [5000000.0] + [10000.0] * (N_LAYER + N_NEXTN - 1),
        "layer_types": LAYER_TYPES,
        "partial_rotary_factors": [0.5 if t == "full_attention" else 1.0 for t in LAYER_TYPES],
        "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": N_HEAD_SWA,
                                    "num_attention_groups": N_KV, "head_dim": HEAD_DIM, "true_head_dim": HEAD_DIM},
        "use_head_wise_attn_gate": True,
        "sliding_window": 16,
        "moe_num_experts": N_EXPERT,
        "moe_top_k": 2,
        "moe_intermediate_size": N_FF_EXP,
        "share_expert_dim": N_FF_EXP,
        "moe_layers_enum": "1,2",
        "moe_every_n_layer": 1,
        "moe_router_activation": "sigmoid",
        "moe_router_scaling_factor": 3.0,
        "norm_expert_weight": True,
        "need_fp32_gate": True,
        "swiglu_limits": [None, 0.0, 7.0, 7.0, None, 0.0],
        "swiglu_limits_shared": [None, 0.0, 16.0],  # trunk only: the MTP entries are padded with 0.0
        "tie_word_embeddings": False,
    }


def _heads(layer: int) -> int:
    return N_HEAD_SWA if LAYER_TYPES[layer] == "sliding_attention" else N_HEAD


def _layer(layer: int, *, moe: bool) -> list[CheckpointTensor]:
    h, d, n_head = H, HEAD_DIM, _heads(layer)
    p = f"model.layers.{layer}."
    tensors = [
        CheckpointTensor(p + "input_layernorm.weight", (h,), "BF16", "bias"),
        CheckpointTensor(p + "self_attn.q_proj.weight", (n_head * d, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.k_proj.weight", (N_KV * d, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.v_proj.weight", (N_KV * d, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.o_proj.weight", (h, n_head * d), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.q_norm.weight", (d,), "BF16", "bias"),
        CheckpointTensor(p + "self_attn.k_norm.weight", (d,), "BF16", "bias"),
        CheckpointTensor(p + "self_attn.g_proj.weight", (n_head, h), "BF16", "weight"),
        CheckpointTensor(p + "post_attention_layernorm.weight", (h,), "BF16", "bias"),
    ]
    if not moe:
        return [*tensors, *mlp_tensors(p + "mlp.", h, N_FF)]
    e, f = N_EXPERT, N_FF_EXP
    return [*tensors,
            CheckpointTensor(p + "moe.gate.weight", (e, h), "BF16", "weight"),
            CheckpointTensor(p + "moe.router_bias", (e,), "F32", "bias"),
            CheckpointTensor(p + "moe.gate_proj.weight", (e, f, h), "BF16", "weight"),
            CheckpointTensor(p + "moe.up_proj.weight", (e, f, h), "BF16", "weight"),
            CheckpointTensor(p + "moe.down_proj.weight", (e, h, f), "BF16", "weight"),
            CheckpointTensor(p + "share_expert.gate_proj.weight", (f, h), "BF16", "weight"),
            CheckpointTensor(p + "share_expert.up_proj.weight", (f, h), "BF16", "weight"),
            CheckpointTensor(p + "share_expert.down_proj.weight", (h, f), "BF16", "weight")]


def step_tensors() -> tuple[list[CheckpointTensor], list[CheckpointTensor]]:
    """(trunk tensors, MTP-layer tensors) of the full checkpoint."""
    trunk = [CheckpointTensor("model.embed_tokens.weight", (VOCAB, H), "BF16", "weight")]
    for layer in range(N_LAYER):
        trunk += _layer(layer, moe=layer >= 1)
    trunk += [CheckpointTensor("model.norm.weight", (H,), "BF16", "bias"),
              CheckpointTensor("lm_head.weight", (VOCAB, H), "BF16", "weight")]
    mtp: list[CheckpointTensor] = []
    for layer in range(N_LAYER, N_LAYER + N_NEXTN):
        p = f"model.layers.{layer}."
        mtp += [
            CheckpointTensor(p + "eh_proj.weight", (H, 2 * H), "BF16", "weight"),
            CheckpointTensor(p + "enorm.weight", (H,), "BF16", "bias"),
            CheckpointTensor(p + "hnorm.weight", (H,), "BF16", "bias"),
            *_layer(layer, moe=False),
            CheckpointTensor(p + "transformer.shared_head.norm.weight", (H,), "BF16", "bias"),
            CheckpointTensor(p + "transformer.shared_head.output.weight", (VOCAB, H), "BF16", "weight"),
        ]
    return trunk, mtp


def step37_config() -> dict[str, object]:
    """:func:`step_config` as Step-3.7-Flash's ``config.json`` nests it (``text_config``)."""
    text = step_config()
    del text["architectures"]
    return {"architectures": ["Step3p7ForConditionalGeneration"], "model_type": "step3p7",
            "torch_dtype": "bfloat16", "text_config": text | {"model_type": "step3p5"}}


def _as_step37(tensor: CheckpointTensor) -> CheckpointTensor:
    """A text tensor under Step-3.7's ``model.language_model.`` (``lm_head`` stays at the top)."""
    if not tensor.name.startswith("model."):
        return tensor
    return dataclasses.replace(tensor, name="model.language_model." + tensor.name[len("model."):])


def write_step_checkpoint(out_dir: Path, seed: int = 0, *, step37: bool = False) -> Path:
    """Write the full tiny Step-3.5 (``step37``: Step-3.7) checkpoint folder (see the module docstring); returns the
    folder. No tokenizer: llama.cpp's converter needs one (``upstream.write_gpt2_tokenizer``), gguf-mtp does not."""
    trunk, mtp = step_tensors()
    if step37:
        trunk, mtp = [_as_step37(t) for t in trunk], [_as_step37(t) for t in mtp]
    return write_checkpoint(out_dir, step37_config() if step37 else step_config(), [trunk, mtp], seed=seed)
