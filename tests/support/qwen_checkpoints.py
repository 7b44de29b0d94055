"""Tiny random Hugging Face checkpoints of the Qwen MTP families, with the real config keys and tensor names.

* ``qwen35moe``: ``Qwen3_5MoeForConditionalGeneration`` by default (trunk ``model.language_model.*``, text
  hyperparameters in ``text_config``), packed experts (``mlp.experts.gate_up_proj`` ``[E, 2F, H]`` and
  ``mlp.experts.down_proj``), or ``Qwen3_5MoeForCausalLM`` with per-expert tensors;
* ``qwen35``: ``Qwen3_5ForCausalLM``, a dense SwiGLU FFN;
* ``qwen3next``: ``Qwen3NextForCausalLM``, per-expert tensors, Qwen3-Next's fused ``in_proj_qkvz``/``in_proj_ba``,
  no ``layer_types`` and no ``mtp_num_hidden_layers`` (as its config on the Hub).

The trunk is 3 ``linear_attention`` (gated delta-net) layers and one ``full_attention`` layer, so the MTP block is
``blk.4``; the head is top-level ``mtp.*``. Norm weights are stored zero-centred (Qwen's RMSNorm multiplies by
``1 + weight``), except the delta-net's own ``linear_attn.norm``. Two safetensors files with an index: the trunk
in the first, the head in the second (``head_only`` writes the head alone, one file). A tokenizer is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf_mtp.testing.tiny_checkpoints import CheckpointTensor, write_checkpoint

VARIANTS = ("qwen35moe", "qwen35", "qwen3next")
N_TRUNK = 4
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
BF16 = "BF16"


@dataclass(frozen=True)
class QwenDims:
    """The tiny dimensions (hidden size <= 128 keeps the 50,264-token embedding small)."""

    n_embd: int = 128
    n_vocab: int = 50264
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 64
    n_ff_shexp: int = 64
    n_ff: int = 128  # dense FFN width (qwen35) and intermediate_size
    lin_k_heads: int = 2
    lin_v_heads: int = 4
    lin_k_dim: int = 16
    lin_v_dim: int = 16
    conv: int = 4


DIMS = QwenDims()
ARCHITECTURES = {
    ("qwen35moe", True): "Qwen3_5MoeForConditionalGeneration",
    ("qwen35moe", False): "Qwen3_5MoeForCausalLM",
    ("qwen35", True): "Qwen3_5ForConditionalGeneration",
    ("qwen35", False): "Qwen3_5ForCausalLM",
    ("qwen3next", False): "Qwen3NextForCausalLM",
}


def text_config(variant: str, d: QwenDims = DIMS) -> dict[str, object]:
    """The text model's hyperparameters, with the keys the real configs use."""
    config: dict[str, object] = {
        "hidden_size": d.n_embd, "num_hidden_layers": N_TRUNK, "num_attention_heads": d.n_head,
        "num_key_value_heads": d.n_head_kv, "head_dim": d.head_dim, "vocab_size": d.n_vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attn_output_gate": True,
        "full_attention_interval": 4, "linear_conv_kernel_dim": d.conv, "linear_key_head_dim": d.lin_k_dim,
        "linear_value_head_dim": d.lin_v_dim, "linear_num_key_heads": d.lin_k_heads,
        "linear_num_value_heads": d.lin_v_heads, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    if variant == "qwen3next":
        config |= {"model_type": "qwen3_next", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                   "intermediate_size": d.n_ff, "decoder_sparse_step": 1, "mlp_only_layers": [],
                   "norm_topk_prob": True}
    else:
        config |= {"model_type": "qwen3_5_moe_text" if variant == "qwen35moe" else "qwen3_5_text",
                   "layer_types": LAYER_TYPES, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                       "mrope_section": [2, 1, 1], "mrope_interleaved": True}}
        if variant == "qwen35":
            config["intermediate_size"] = d.n_ff
    if variant != "qwen35":
        config |= {"num_experts": d.n_expert, "num_experts_per_tok": d.n_expert_used,
                   "moe_intermediate_size": d.n_ff_exp, "shared_expert_intermediate_size": d.n_ff_shexp}
    return config


def config_json(variant: str, conditional: bool, d: QwenDims = DIMS) -> dict[str, object]:
    """``config.json``: flat for ``...ForCausalLM``, ``text_config``-nested for ``...ForConditionalGeneration``."""
    arch = ARCHITECTURES[(variant, conditional)]
    text = text_config(variant, d)
    if not conditional:
        return {"architectures": [arch], **text}
    return {"architectures": [arch], "model_type": "qwen3_5_moe" if variant == "qwen35moe" else "qwen3_5",
            "text_config": text, "tie_word_embeddings": False,
            "vision_config": {"depth": 2, "hidden_size": 64, "out_hidden_size": d.n_embd}}


def _t(name: str, shape: tuple[int, ...], fill: str = "weight", dtype: str = BF16) -> CheckpointTensor:
    return CheckpointTensor(name, shape, dtype, fill)


def ffn_tensors(variant: str, pre: str, packed: bool, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """One layer's FFN (``pre`` ends with the layer's ``.``)."""
    h = d.n_embd
    if variant == "qwen35":
        return [_t(pre + "mlp.gate_proj.weight", (d.n_ff, h)), _t(pre + "mlp.up_proj.weight", (d.n_ff, h)),
                _t(pre + "mlp.down_proj.weight", (h, d.n_ff))]
    e, f, s = d.n_expert, d.n_ff_exp, d.n_ff_shexp
    out = [_t(pre + "mlp.gate.weight", (e, h))]
    if packed:
        out += [_t(pre + "mlp.experts.gate_up_proj", (e, 2 * f, h)), _t(pre + "mlp.experts.down_proj", (e, h, f))]
    else:
        for x in range(e):
            out += [_t(f"{pre}mlp.experts.{x}.gate_proj.weight", (f, h)),
                    _t(f"{pre}mlp.experts.{x}.up_proj.weight", (f, h)),
                    _t(f"{pre}mlp.experts.{x}.down_proj.weight", (h, f))]
    shared = pre + "mlp.shared_expert."
    out += [_t(shared + "gate_proj.weight", (s, h)), _t(shared + "up_proj.weight", (s, h)),
            _t(shared + "down_proj.weight", (h, s)), _t(pre + "mlp.shared_expert_gate.weight", (1, h))]
    return out


def attention_tensors(pre: str, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """A full-attention layer's norms and gated attention (q_proj carries query and gate)."""
    h, q, kv = d.n_embd, d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    return [
        _t(pre + "input_layernorm.weight", (h,), "bias"),
        _t(pre + "self_attn.q_proj.weight", (2 * q, h)), _t(pre + "self_attn.k_proj.weight", (kv, h)),
        _t(pre + "self_attn.v_proj.weight", (kv, h)), _t(pre + "self_attn.o_proj.weight", (h, q)),
        _t(pre + "self_attn.q_norm.weight", (d.head_dim,), "bias"),
        _t(pre + "self_attn.k_norm.weight", (d.head_dim,), "bias"),
        _t(pre + "post_attention_layernorm.weight", (h,), "bias"),
    ]


def linear_tensors(variant: str, pre: str, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """A gated delta-net layer (Qwen3.5's split projections, or Qwen3-Next's fused ones)."""
    h, nk, nv = d.n_embd, d.lin_k_heads, d.lin_v_heads
    key_dim, value_dim = nk * d.lin_k_dim, nv * d.lin_v_dim
    conv_dim = 2 * key_dim + value_dim
    la = pre + "linear_attn."
    out = [_t(pre + "input_layernorm.weight", (h,), "bias")]
    if variant == "qwen3next":
        out += [_t(la + "in_proj_qkvz.weight", (2 * key_dim + 2 * value_dim, h)),
                _t(la + "in_proj_ba.weight", (2 * nv, h))]
    else:
        out += [_t(la + "in_proj_qkv.weight", (conv_dim, h)), _t(la + "in_proj_z.weight", (value_dim, h)),
                _t(la + "in_proj_b.weight", (nv, h)), _t(la + "in_proj_a.weight", (nv, h))]
    out += [_t(la + "conv1d.weight", (conv_dim, 1, d.conv)), _t(la + "dt_bias", (nv,), "bias"),
            _t(la + "A_log", (nv,), "bias", "F32"), _t(la + "norm.weight", (d.lin_v_dim,), "norm"),
            _t(la + "out_proj.weight", (h, value_dim)),
            _t(pre + "post_attention_layernorm.weight", (h,), "bias")]
    return out


def head_tensors(variant: str, packed: bool, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    """The MTP head: NextN fusion, one full-attention layer, its FFN, the head norm."""
    h = d.n_embd
    pre = "mtp.layers.0."
    return [
        _t("mtp.fc.weight", (h, 2 * h)),
        _t("mtp.pre_fc_norm_embedding.weight", (h,), "bias"),
        _t("mtp.pre_fc_norm_hidden.weight", (h,), "bias"),
        *attention_tensors(pre, d),
        *ffn_tensors(variant, pre, packed, d),
        _t("mtp.norm.weight", (h,), "bias"),
    ]


def trunk_tensors(variant: str, conditional: bool, packed: bool, d: QwenDims = DIMS) -> list[CheckpointTensor]:
    model = "model.language_model." if conditional else "model."
    out = [_t(model + "embed_tokens.weight", (d.n_vocab, d.n_embd))]
    for layer, kind in enumerate(LAYER_TYPES):
        pre = f"{model}layers.{layer}."
        if kind == "full_attention":
            out += attention_tensors(pre, d)
        else:
            out += linear_tensors(variant, pre, d)
        out += ffn_tensors(variant, pre, packed, d)
    out += [_t(model + "norm.weight", (d.n_embd,), "bias"), _t("lm_head.weight", (d.n_vocab, d.n_embd))]
    return out


def write_qwen_checkpoint(out_dir: Path, variant: str, *, conditional: bool | None = None,
                          packed: bool | None = None, head_only: bool = False, d: QwenDims = DIMS) -> Path:
    """Write a checkpoint folder; returns it.

    Args:
        variant: ``qwen35moe``, ``qwen35`` or ``qwen3next``.
        conditional: the ``...ForConditionalGeneration`` layout (default: for ``qwen35moe`` only).
        packed: packed experts (default: for ``qwen35moe`` only; ignored by the dense ``qwen35``).
        head_only: only ``config.json`` and the ``mtp.*`` tensors, in one ``model.safetensors``.
    """
    conditional = variant == "qwen35moe" if conditional is None else conditional
    packed = variant == "qwen35moe" if packed is None else packed
    config = config_json(variant, conditional, d)
    head = head_tensors(variant, packed, d)
    if head_only:
        return write_checkpoint(out_dir, config, [head], first_indices=[1000], index=False)
    return write_checkpoint(out_dir, config, [trunk_tensors(variant, conditional, packed, d), head],
                            first_indices=[0, 1000])
