"""Tencent Hy3 (``HYV3ForCausalLM``): the MTP layer(s) -> NextN block(s) of ``hy_v3``.

The head is the checkpoint's extra decoder layer(s) ``model.layers.{N+i}.*``, ``N = num_hidden_layers`` (80 for
Hy3), one per ``num_nextn_predict_layers`` (Hy3 ships one; llama.cpp's graph runs a chain of several,
src/models/hy-v3.cpp, and its converter writes them all as ``blk.{N+i}``, conversion/hunyuan.py):
each an ordinary Hy3 MoE layer (QK norm, a sigmoid router ``mlp.router.gate``
with its selection bias ``mlp.expert_bias``, routed experts and the shared ``mlp.shared_mlp``) plus the NextN input
fusion (``enorm``, ``hnorm``, ``eh_proj``) and the trailing ``final_layernorm``, which llama.cpp's converter renames
to ``shared_head.norm`` (conversion/hunyuan.py) and its loader reads as ``nextn.shared_head_norm``
(src/models/hy-v3.cpp). The checkpoint has no MTP embedding or LM head of its own (hy-v3.cpp).

A NextN decoder layer (:class:`.nextn_layer.NextNLayerModel`) whose names come from one table (:data:`_NAMES`), the
HF spellings llama.cpp's ``TensorNameMap`` maps for this architecture (PyPI gguf 0.19.0 has no ``hy_v3``). Note
llama.cpp's own spellings: ``post_attention_layernorm`` is ``ffn_norm`` here, and the selection bias is
``exp_probs_b`` without a ``.bias`` suffix (hy-v3.cpp). Experts are stacked one at a time, q/k copied as they are
(Hy3's RoPE is NeoX-ordered; no permutation upstream either).
"""

from __future__ import annotations

from gguf import MODEL_TENSOR, ExpertGatingFuncType, GGUFWriter

from .base import HeadModel, TargetCheck
from .hf_names import DECODER_NAMES, NEXTN_FUSION_NAMES
from .hparams import EXPERT_LIMIT, LLAMA_MAX_EXPERTS
from .nextn_layer import NextNLayerModel

__all__ = ["HYV3MTPModel"]

T = MODEL_TENSOR

#: ``model.layers.{N}.X`` -> (gguf-py tensor, GGUF suffix): the NextN fusion, the decoder layer of a NextN block (the
#: shared Llama-style names, Hy3's router and shared expert) and ``final_layernorm``, the head norm.
_NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    **NEXTN_FUSION_NAMES,
    **DECODER_NAMES,
    "mlp.router.gate.weight": (T.FFN_GATE_INP, ".weight"),
    "mlp.expert_bias": (T.FFN_EXP_PROBS_B, ""),
    "mlp.shared_mlp.gate_proj.weight": (T.FFN_GATE_SHEXP, ".weight"),
    "mlp.shared_mlp.up_proj.weight": (T.FFN_UP_SHEXP, ".weight"),
    "mlp.shared_mlp.down_proj.weight": (T.FFN_DOWN_SHEXP, ".weight"),
    "final_layernorm.weight": (T.NEXTN_SHARED_HEAD_NORM, ".weight"),
}


@HeadModel.register("HYV3ForCausalLM")
class HYV3MTPModel(NextNLayerModel):
    """Tencent Hy3 with its MTP layer(s) (``num_nextn_predict_layers``, 1 for Hy3)."""

    model_arch = "hy_v3"  # not in PyPI gguf 0.19.0's MODEL_ARCH
    layer_names = _NAMES
    # optional in llama.cpp's loader (hy-v3.cpp): written when the checkpoint has it, as upstream does
    head_norm_names = ("final_layernorm.weight",)
    keep_nextn_copies = None  # the checkpoint has no MTP embedding or LM head of its own
    layer_word = "MTP"
    chained_blocks = True

    def read_hparams(self) -> None:
        super().read_hparams()
        may = self.optional_hparam_int
        self.n_ff_exp = self.hparam_int("moe_intermediate_size")
        n_shared = may("num_shared_experts", minimum=0, maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT)
        self.n_shared = 1 if n_shared is None else n_shared
        self.n_ff = may("intermediate_size")
        self.route_norm = self.optional_hparam_bool("route_norm")
        self.router_scale = self.optional_hparam_float("router_scaling_factor")

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        h, q, kv, d = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim, self.head_dim
        name = self.format_tensor_name
        layer: dict[str, tuple[int, ...]] = {
            name(T.ATTN_NORM): (h,), name(T.ATTN_Q): (q, h), name(T.ATTN_K): (kv, h), name(T.ATTN_V): (kv, h),
            name(T.ATTN_OUT): (h, q), name(T.ATTN_Q_NORM): (d,), name(T.ATTN_K_NORM): (d,), name(T.FFN_NORM): (h,),
            **self.moe_shapes(self.n_ff_exp, self.n_ff_exp * self.n_shared, probs_bias=""),
        }
        return self.glue_shapes(layer, block)

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        # The keys llama.cpp's converter writes for hy_v3 (conversion/hunyuan.py), every value checked.
        super().set_gguf_parameters(writer, n_layers)
        if self.n_ff is not None:
            writer.add_feed_forward_length(self.n_ff)
        writer.add_expert_feed_forward_length(self.n_ff_exp)
        writer.add_expert_shared_feed_forward_length(self.n_ff_exp * max(self.n_shared, 1))
        writer.add_expert_weights_norm(True if self.route_norm is None else self.route_norm)
        writer.add_expert_weights_scale(1.0 if self.router_scale is None else self.router_scale)
        writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)

    def own_layer_arrays(self) -> tuple[str, ...]:
        return ()  # hy_v3 writes only scalars

    def nextn_layer_values(self) -> dict[str, int]:
        return self.moe_block_values(self.n_ff_exp, self.n_ff)

    def target_checks(self) -> list[TargetCheck]:
        return [
            *super().target_checks(),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
        ]
