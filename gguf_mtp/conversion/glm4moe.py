"""GLM-4.5 / 4.5-Air / 4.6 / 4.7 (``Glm4MoeForCausalLM``): the NextN layer -> one NextN block of ``glm4moe``.

The head is the checkpoint's extra decoder layer ``model.layers.{N}.*``, ``N = num_hidden_layers`` (46 for
GLM-4.5-Air, 92 for GLM-4.5/4.6/4.7): an ordinary MoE layer (attention with q/k/v biases, optional QK norm,
a sigmoid router with its score-correction bias, routed experts and a shared expert) plus the NextN
input fusion (``enorm``, ``hnorm``, ``eh_proj``) and the head norm ``shared_head.norm``. GLM-4.5 also ships
its own copies of the embedding and LM head in that layer (``embed_tokens``, ``shared_head.head``); they are
kept by default, as llama.cpp's converter keeps them, or dropped (``keep_nextn_copies=False``): llama.cpp then
falls back to the trunk's ``token_embd`` / ``output`` (src/models/glm4-moe.cpp). GLM-4.6 and 4.7 keep the
layer in a separate ``mtp.safetensors``, which is read like any other shard (listed by the index, or found
in a folder without one).

Names come from gguf-py's own table (``TensorNameMap`` for ``GLM4_MOE``, whose NextN entries PyPI gguf 0.19.0
has); the hand-written parts are llama.cpp's: the ``e_score_correction_bias`` spelling and the per-expert
stacking (one expert at a time, never materialised). GLM's attention is NeoX-ordered already, so q/k are
copied as they are (no permutation, as in llama.cpp's ``conversion/glm.py``); norms get no ``+ 1``.
"""

from __future__ import annotations

from gguf import MODEL_ARCH, MODEL_TENSOR, ExpertGatingFuncType, GGUFWriter

from .base import HeadModel, TargetCheck
from .hparams import EXPERT_LIMIT, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS
from .nextn_layer import NextNLayerModel

T = MODEL_TENSOR


@HeadModel.register("Glm4MoeForCausalLM")
class Glm4MoeMTPModel(NextNLayerModel):
    """GLM-4.5-family MoE with its NextN layer(s) (``num_nextn_predict_layers``; GLM-4.5 ships the layer's own
    embedding / LM head copies, GLM-4.6 does not)."""

    model_arch = MODEL_ARCH.GLM4_MOE

    def read_hparams(self) -> None:
        super().read_hparams()
        may = self.optional_hparam_int
        self.n_ff_exp = self.hparam_int("moe_intermediate_size")
        n_shared = may("n_shared_experts", minimum=0, maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT)
        self.n_shared = 1 if n_shared is None else n_shared
        self.n_ff = may("intermediate_size")
        self.n_dense_lead = may("first_k_dense_replace", minimum=0, maximum=LLAMA_MAX_LAYERS)
        self.partial_rotary = self.optional_hparam_float("partial_rotary_factor", maximum=1.0)
        self.routed_scaling_factor = self.optional_hparam_float("routed_scaling_factor")
        self.norm_topk_prob = self.optional_hparam_bool("norm_topk_prob")
        self.attention_bias = self.optional_hparam_bool("attention_bias")
        self.use_qk_norm = self.optional_hparam_bool("use_qk_norm")

    # ------------------------------------------------------------------------------------ tensors

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        h, q, kv, d = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim, self.head_dim
        name = self.format_tensor_name
        layer: dict[str, tuple[int, ...]] = {
            name(T.ATTN_NORM): (h,),
            name(T.ATTN_Q): (q, h),
            name(T.ATTN_K): (kv, h),
            name(T.ATTN_V): (kv, h),
        }
        # q/k/v biases: stated by attention_bias (true for every GLM-4.5-family model), else as present.
        if self.attention_bias or (self.attention_bias is None and self.has("self_attn.q_proj.bias")):
            layer.update({name(T.ATTN_Q, ".bias"): (q,), name(T.ATTN_K, ".bias"): (kv,),
                          name(T.ATTN_V, ".bias"): (kv,)})
        layer[name(T.ATTN_OUT)] = (h, q)
        # QK norm: GLM-4.5/4.6/4.7 (355B) have it, GLM-4.5-Air does not.
        if self.use_qk_norm or (self.use_qk_norm is None and self.has("self_attn.q_norm.weight")):
            layer.update({name(T.ATTN_Q_NORM): (d,), name(T.ATTN_K_NORM): (d,)})
        layer.update({name(T.ATTN_POST_NORM): (h,), **self.moe_shapes(self.n_ff_exp, self.n_ff_exp * self.n_shared)})
        return self.glue_shapes(layer)

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        # The keys llama.cpp's converter writes for glm4moe (conversion/glm.py), every value checked already.
        super().set_gguf_parameters(writer, n_layers)
        if self.n_ff is not None:
            writer.add_feed_forward_length(self.n_ff)
        writer.add_rope_dimension_count(int(self.head_dim * (self.partial_rotary or 0.5)))
        writer.add_expert_feed_forward_length(self.n_ff_exp)
        writer.add_expert_shared_count(self.n_shared)
        if self.n_dense_lead is not None:
            writer.add_leading_dense_block_count(self.n_dense_lead)
        writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        if self.routed_scaling_factor is not None:
            writer.add_expert_weights_scale(self.routed_scaling_factor)
        if self.norm_topk_prob is not None:
            writer.add_expert_weights_norm(self.norm_topk_prob)

    def own_layer_arrays(self) -> tuple[str, ...]:
        return ()  # glm4moe has no per-layer arrays: every value above is a scalar

    def nextn_layer_values(self) -> dict[str, int]:
        return self.moe_block_values(self.n_ff_exp, self.n_ff)

    def target_checks(self) -> list[TargetCheck]:
        return [
            *super().target_checks(),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
            TargetCheck("expert_shared_count", self.n_shared, "n_shared_experts"),
        ]
