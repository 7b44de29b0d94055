"""The Hugging Face tensor names that several families' MTP layers share, as gguf-py's ``tensor_mapping.py`` maps them:
name inside a layer -> (gguf-py tensor, GGUF suffix). A family's own table starts from these and adds what differs
(PyPI gguf 0.19.0 has no NextN entries for most MTP architectures, so the tables live here)."""

from __future__ import annotations

from gguf import MODEL_TENSOR

__all__ = ["DECODER_NAMES", "NEXTN_FUSION_NAMES", "NEXTN_GLUE_NAMES"]

T = MODEL_TENSOR

#: The NextN input fusion: the embedding's and the hidden state's norms and their projection.
NEXTN_FUSION_NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    "eh_proj.weight": (T.NEXTN_EH_PROJ, ".weight"),
    "enorm.weight": (T.NEXTN_ENORM, ".weight"),
    "hnorm.weight": (T.NEXTN_HNORM, ".weight"),
}
#: llama.cpp's six generic NextN sources (``MODEL_TENSOR.NEXTN_*``): the fusion, and the layer's own copies of the
#: embedding, final norm and LM head.
NEXTN_GLUE_NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    **NEXTN_FUSION_NAMES,
    "embed_tokens.weight": (T.NEXTN_EMBED_TOKENS, ".weight"),
    "shared_head.norm.weight": (T.NEXTN_SHARED_HEAD_NORM, ".weight"),
    "shared_head.head.weight": (T.NEXTN_SHARED_HEAD_HEAD, ".weight"),
}

#: A Llama-style decoder layer: norms, separate q/k/v/o projections with per-head QK norm, a gated MLP.
DECODER_NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    "input_layernorm.weight": (T.ATTN_NORM, ".weight"),
    "self_attn.q_proj.weight": (T.ATTN_Q, ".weight"),
    "self_attn.k_proj.weight": (T.ATTN_K, ".weight"),
    "self_attn.v_proj.weight": (T.ATTN_V, ".weight"),
    "self_attn.o_proj.weight": (T.ATTN_OUT, ".weight"),
    "self_attn.q_norm.weight": (T.ATTN_Q_NORM, ".weight"),
    "self_attn.k_norm.weight": (T.ATTN_K_NORM, ".weight"),
    "post_attention_layernorm.weight": (T.FFN_NORM, ".weight"),
    "mlp.gate_proj.weight": (T.FFN_GATE, ".weight"),
    "mlp.up_proj.weight": (T.FFN_UP, ".weight"),
    "mlp.down_proj.weight": (T.FFN_DOWN, ".weight"),
}
