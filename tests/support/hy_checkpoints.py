"""Tiny random Tencent Hy3 (``HYV3ForCausalLM``, ``hy_v3``) checkpoints with the real config keys and tensor names.

The Hub layout of ``tencent/Hy3``: ``model.embed_tokens``, ``num_hidden_layers`` trunk layers (the first
``first_k_dense_replace`` dense, the rest MoE: ``mlp.router.gate`` (F32), ``mlp.expert_bias`` (F32), per-expert
``mlp.experts.{e}.{gate,up,down}_proj`` and the shared ``mlp.shared_mlp.*``; QK norm), ``model.norm``, ``lm_head``,
then the MTP layer(s) ``model.layers.{N+i}`` (a MoE layer plus ``eh_proj``/``enorm``/``hnorm`` and the trailing
``final_layernorm``), alone in the last of 2 shards + index. Hy3 ships one MTP layer; ``n_nextn`` > 1 writes more
for the multi-block path (llama.cpp's hy_v3 graph runs a chain, src/models/hy-v3.cpp:246-250).
"""

from __future__ import annotations

from pathlib import Path

from gguf_mtp.testing.tiny_checkpoints import (
    CheckpointTensor,
    first_of_layer,
    mlp_tensors,
    moe_tensors,
    write_checkpoint,
)
from gguf_mtp.testing.tiny_models import TinyHparams

#: GPT-2's 50,257 tokens, padded to a multiple of 8 (llama.cpp's converter pads with [PAD] tokens).
HY_VOCAB = 50264
HY_HPARAMS = TinyHparams(n_embd=128, n_vocab=HY_VOCAB, n_head=4, n_head_kv=2, head_dim=32, n_expert=4,
                         n_expert_used=2, n_ff_exp=64, n_ff_dense=128)


def hy_config(hp: TinyHparams = HY_HPARAMS, *, n_layers: int = 2, n_nextn: int = 1) -> dict[str, object]:
    """A ``config.json`` with tencent/Hy3's keys."""
    return {
        "architectures": ["HYV3ForCausalLM"],
        "model_type": "hy_v3",
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "hidden_size": hp.n_embd,
        "intermediate_size": hp.n_ff_dense,
        "moe_intermediate_size": hp.n_ff_exp,
        "num_attention_heads": hp.n_head,
        "num_key_value_heads": hp.n_head_kv,
        "head_dim": hp.head_dim,
        "num_hidden_layers": n_layers,
        "first_k_dense_replace": 1,
        "num_experts": hp.n_expert,
        "num_experts_per_tok": hp.n_expert_used,
        "num_shared_experts": 1,
        "router_scaling_factor": 2.826,
        "route_norm": True,
        "qk_norm": True,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 11158840.0,
        "num_nextn_predict_layers": n_nextn,
        "tie_word_embeddings": False,
        "vocab_size": hp.n_vocab,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    }


def _layer(hp: TinyHparams, layer: int, *, moe: bool) -> list[CheckpointTensor]:
    h, q, kv, d = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.head_dim
    p = f"model.layers.{layer}."
    tensors = [
        CheckpointTensor(p + "input_layernorm.weight", (h,), "BF16", "norm"),
        CheckpointTensor(p + "self_attn.q_proj.weight", (q, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.k_proj.weight", (kv, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.v_proj.weight", (kv, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.o_proj.weight", (h, q), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.q_norm.weight", (d,), "BF16", "norm"),
        CheckpointTensor(p + "self_attn.k_norm.weight", (d,), "BF16", "norm"),
        CheckpointTensor(p + "post_attention_layernorm.weight", (h,), "BF16", "norm"),
    ]
    if not moe:
        return [*tensors, *mlp_tensors(p + "mlp.", h, hp.n_ff_dense)]
    return [*tensors, *moe_tensors(p + "mlp.", h, hp.n_ff_exp, hp.n_expert, router="router.gate.weight",
                                   router_dtype="F32", bias="expert_bias", shared="shared_mlp")]


def hy_tensors(hp: TinyHparams = HY_HPARAMS, *, n_layers: int = 2, n_nextn: int = 1) -> list[CheckpointTensor]:
    """Every tensor of the full checkpoint: trunk first, then the MTP layers ``model.layers.{n_layers + i}``."""
    h, v = hp.n_embd, hp.n_vocab
    tensors = [CheckpointTensor("model.embed_tokens.weight", (v, h), "BF16", "weight")]
    for layer in range(n_layers):
        tensors += _layer(hp, layer, moe=layer >= 1)
    tensors += [CheckpointTensor("model.norm.weight", (h,), "BF16", "norm"),
                CheckpointTensor("lm_head.weight", (v, h), "BF16", "weight")]
    for layer in range(n_layers, n_layers + n_nextn):
        p = f"model.layers.{layer}."
        tensors += [CheckpointTensor(p + "eh_proj.weight", (h, 2 * h), "BF16", "weight"),
                    CheckpointTensor(p + "enorm.weight", (h,), "BF16", "norm"),
                    CheckpointTensor(p + "hnorm.weight", (h,), "BF16", "norm"),
                    *_layer(hp, layer, moe=True),
                    CheckpointTensor(p + "final_layernorm.weight", (h,), "BF16", "norm")]
    return tensors


def write_hy_checkpoint(out_dir: Path, hp: TinyHparams = HY_HPARAMS, *, n_layers: int = 2, n_nextn: int = 1,
                        seed: int = 0) -> Path:
    """Write a full tiny Hy3 checkpoint folder (see the module docstring); returns the folder. No tokenizer:
    llama.cpp's converter needs one (``upstream.write_gpt2_tokenizer``), gguf-mtp does not."""
    tensors = hy_tensors(hp, n_layers=n_layers, n_nextn=n_nextn)
    cut = first_of_layer(tensors, n_layers)
    return write_checkpoint(out_dir, hy_config(hp, n_layers=n_layers, n_nextn=n_nextn), [tensors[:cut], tensors[cut:]],
                            seed=seed)
