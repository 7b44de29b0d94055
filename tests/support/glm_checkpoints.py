"""Tiny random GLM-4.5-family (``Glm4MoeForCausalLM``) checkpoints with the real config keys and tensor names.

A full checkpoint: ``model.embed_tokens``, ``num_hidden_layers`` trunk layers (the first
``first_k_dense_replace`` dense, the rest MoE), the NextN layer ``model.layers.{N}`` (a MoE layer plus
``eh_proj``/``enorm``/``hnorm``/``shared_head.norm``, and with ``nextn_copies`` GLM-4.5's own
``embed_tokens``/``shared_head.head``), ``model.norm`` and ``lm_head``. Layouts:

* ``"shards"``: ``model-00001-of-00002`` (everything but the NextN layer) + ``model-00002-of-00002`` (the
  NextN layer alone) + index, the way GLM-4.5 / 4.5-Air put their last layer in the last shard;
* ``"mtp-file"``: GLM-4.6 / 4.7: the NextN layer in its own ``mtp.safetensors``, listed by the index;
* ``"mtp-file-no-index"``: the same two files without an index.

A tensor's values depend only on its position in :func:`glm_tensors` (not on its file), so every layout
of the same hparams holds the same bytes. Dimensions come from :class:`TinyHparams` (``n_ff_dense`` is the
dense layers' width), so the head fits :data:`~gguf_mtp.testing.tiny_models.GLM4MOE` tiny targets.
"""

from __future__ import annotations

from pathlib import Path

from gguf_mtp.testing.tiny_checkpoints import (
    BIAS_SPELLINGS,
    CheckpointTensor,
    first_of_layer,
    mlp_tensors,
    moe_tensors,
    write_checkpoint,
)
from gguf_mtp.testing.tiny_models import TinyHparams

LAYOUTS = ("shards", "mtp-file", "mtp-file-no-index")
#: The special tokens llama.cpp's GLM vocab code needs: 0c1e570's ``conversion/base.py`` (``_set_vocab_glm``) looks up
#: ``[gMASK]``, ``<|user|>`` and ``<|observation|>``; its ``conversion/chatglm.py`` lists the four roles, and
#: ``src/llama-chat.cpp`` writes ``[gMASK]<sop>``.
GLM_SPECIAL_TOKENS = ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
#: GPT-2's 50,257 tokens + the 6 GLM specials, padded to a multiple of 8.
GLM_VOCAB = 50264
GLM_HPARAMS = TinyHparams(n_embd=128, n_vocab=GLM_VOCAB, n_head=4, n_head_kv=2, head_dim=32, n_expert=4,
                          n_expert_used=2, n_ff_exp=64, n_ff_dense=128)


def glm_config(hp: TinyHparams, *, n_layers: int = 3, dense: int = 1, qk_norm: bool = False,
               n_nextn: int = 1) -> dict[str, object]:
    """A ``config.json`` with GLM-4.5-Air's keys (``use_qk_norm`` true is GLM-4.5 355B's)."""
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "torch_dtype": "bfloat16",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "head_dim": hp.head_dim,
        "hidden_act": "silu",
        "hidden_size": hp.n_embd,
        "partial_rotary_factor": 0.5,
        "initializer_range": 0.02,
        "intermediate_size": hp.n_ff_dense,
        "max_position_embeddings": 4096,
        "moe_intermediate_size": hp.n_ff_exp,
        "norm_topk_prob": True,
        "num_attention_heads": hp.n_head,
        "n_group": 1,
        "topk_group": 1,
        "n_routed_experts": hp.n_expert,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.0,
        "num_experts_per_tok": hp.n_expert_used,
        "first_k_dense_replace": dense,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": hp.n_head_kv,
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "num_nextn_predict_layers": n_nextn,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_qk_norm": qk_norm,
        "vocab_size": hp.n_vocab,
    }


def _layer(hp: TinyHparams, layer: int, *, moe: bool, qk_norm: bool, bias_spelling: str) -> list[CheckpointTensor]:
    h, q, kv, d = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.head_dim
    p = f"model.layers.{layer}."
    tensors = [
        CheckpointTensor(p + "input_layernorm.weight", (h,), "BF16", "norm"),
        CheckpointTensor(p + "self_attn.q_proj.weight", (q, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.q_proj.bias", (q,), "BF16", "bias"),
        CheckpointTensor(p + "self_attn.k_proj.weight", (kv, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.k_proj.bias", (kv,), "BF16", "bias"),
        CheckpointTensor(p + "self_attn.v_proj.weight", (kv, h), "BF16", "weight"),
        CheckpointTensor(p + "self_attn.v_proj.bias", (kv,), "BF16", "bias"),
        CheckpointTensor(p + "self_attn.o_proj.weight", (h, q), "BF16", "weight"),
    ]
    if qk_norm:
        tensors += [CheckpointTensor(p + "self_attn.q_norm.weight", (d,), "BF16", "norm"),
                    CheckpointTensor(p + "self_attn.k_norm.weight", (d,), "BF16", "norm")]
    tensors.append(CheckpointTensor(p + "post_attention_layernorm.weight", (h,), "BF16", "norm"))
    if not moe:
        return [*tensors, *mlp_tensors(p + "mlp.", h, hp.n_ff_dense)]
    return [*tensors, *moe_tensors(p + "mlp.", h, hp.n_ff_exp, hp.n_expert, bias=f"gate.{bias_spelling}",
                                   shared="shared_experts")]


def glm_tensors(hp: TinyHparams, *, n_layers: int = 3, dense: int = 1, qk_norm: bool = False,
                nextn_copies: bool = False, bias_spelling: str = BIAS_SPELLINGS[0],
                n_nextn: int = 1) -> list[CheckpointTensor]:
    """Every tensor of the full checkpoint: trunk first, then the NextN layers ``model.layers.{n_layers}`` ...
    ``model.layers.{n_layers + n_nextn - 1}``."""
    h, v = hp.n_embd, hp.n_vocab
    trunk = [CheckpointTensor("model.embed_tokens.weight", (v, h), "BF16", "weight")]
    for layer in range(n_layers):
        trunk += _layer(hp, layer, moe=layer >= dense, qk_norm=qk_norm, bias_spelling=bias_spelling)
    trunk += [CheckpointTensor("model.norm.weight", (h,), "BF16", "norm"),
              CheckpointTensor("lm_head.weight", (v, h), "BF16", "weight")]
    nextn: list[CheckpointTensor] = []
    for layer in range(n_layers, n_layers + n_nextn):
        p = f"model.layers.{layer}."
        glue = [
            CheckpointTensor(p + "eh_proj.weight", (h, 2 * h), "BF16", "weight"),
            CheckpointTensor(p + "enorm.weight", (h,), "BF16", "norm"),
            CheckpointTensor(p + "hnorm.weight", (h,), "BF16", "norm"),
            CheckpointTensor(p + "shared_head.norm.weight", (h,), "BF16", "norm"),
        ]
        if nextn_copies:
            glue = [CheckpointTensor(p + "embed_tokens.weight", (v, h), "BF16", "weight"), *glue,
                    CheckpointTensor(p + "shared_head.head.weight", (v, h), "BF16", "weight")]
        nextn += glue + _layer(hp, layer, moe=True, qk_norm=qk_norm, bias_spelling=bias_spelling)
    return trunk + nextn


def write_glm_checkpoint(
    out_dir: Path, hp: TinyHparams = GLM_HPARAMS, *, layout: str = "shards", n_layers: int = 3, dense: int = 1,
    qk_norm: bool = False, nextn_copies: bool = False, bias_spelling: str = BIAS_SPELLINGS[0], seed: int = 0,
    n_nextn: int = 1,
) -> Path:
    """Write a full tiny GLM-4.5-family checkpoint folder (see the module docstring); returns the folder.
    No tokenizer: llama.cpp's converter needs one (``upstream.write_gpt2_tokenizer``), gguf-mtp does not."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    config = glm_config(hp, n_layers=n_layers, dense=dense, qk_norm=qk_norm, n_nextn=n_nextn)
    tensors = glm_tensors(hp, n_layers=n_layers, dense=dense, qk_norm=qk_norm, nextn_copies=nextn_copies,
                          bias_spelling=bias_spelling, n_nextn=n_nextn)
    cut = first_of_layer(tensors, n_layers)
    names = None if layout == "shards" else ["model-00001-of-00001.safetensors", "mtp.safetensors"]
    return write_checkpoint(out_dir, config, [tensors[:cut], tensors[cut:]], names=names, seed=seed,
                            index=layout != "mtp-file-no-index")
