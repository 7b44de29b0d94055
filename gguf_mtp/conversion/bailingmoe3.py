"""inclusionAI Ling-3.0 (``BailingMoeV3ForCausalLM``): the MTP layer -> one NextN block of ``bailingmoe3``.

The head is the checkpoint's extra decoder layer ``model.layers.{N}.*``, ``N = num_hidden_layers`` (24 for
Ling-3.0-tiny, 42 for -flash): a full-attention layer whatever the trunk's Kimi-delta-attention pattern, i.e. MLA
(``q_proj`` or ``q_a_proj``/``q_a_layernorm``/``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``
split into ``attn_k_b``/``attn_v_b`` by :mod:`.mla`; the head-wise output gate ``g_proj``; ``dense``) and a MoE
(``mlp.gate`` + ``expert_bias``, routed and shared experts), plus ``eh_proj``/``enorm``/``hnorm`` and the trailing
``final_layernorm``, which llama.cpp loads as the block's ``layer_output_norm`` and uses as the MTP head's final
norm (src/models/bailingmoe3.cpp).

A NextN decoder layer (:class:`.nextn_layer.NextNLayerModel`) whose names come from one table (:data:`_NAMES`), the HF
spellings llama.cpp's ``TensorNameMap`` maps for this
architecture (PyPI gguf 0.19.0 has no ``bailingmoe3``); per-layer arrays as llama.cpp's converter writes them
(conversion/bailingmoe3.py): ``head_count_kv`` 1 for the MTP block (a full-attention block; 0 marks a
recurrent one), the swiglu clamps padded with 0.0 for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gguf import MODEL_TENSOR, ExpertGatingFuncType, GGUFValueType, GGUFWriter

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import SafetensorsTensor
from gguf_mtp.model.shards import ShardSet

from .base import HeadModel, TargetCheck
from .hf_names import NEXTN_FUSION_NAMES
from .hparams import EXPERT_LIMIT, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS
from .mla import split_kv_b
from .nextn_layer import NextNLayerModel
from .tensors import TensorSource

__all__ = ["BailingMoeV3MTPModel"]

T = MODEL_TENSOR

#: ``model.layers.{N}.X`` -> (gguf-py tensor, GGUF suffix). ``kv_b_proj`` and the experts are handled apart.
_NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    **NEXTN_FUSION_NAMES,
    "final_layernorm.weight": (T.LAYER_OUT_NORM, ".weight"),
    "input_layernorm.weight": (T.ATTN_NORM, ".weight"),
    "attention.q_proj.weight": (T.ATTN_Q, ".weight"),
    "attention.q_a_proj.weight": (T.ATTN_Q_A, ".weight"),
    "attention.q_a_layernorm.weight": (T.ATTN_Q_A_NORM, ".weight"),
    "attention.q_b_proj.weight": (T.ATTN_Q_B, ".weight"),
    "attention.kv_a_proj_with_mqa.weight": (T.ATTN_KV_A_MQA, ".weight"),
    "attention.kv_a_layernorm.weight": (T.ATTN_KV_A_NORM, ".weight"),
    "attention.g_proj.weight": (T.ATTN_GATE, ".weight"),
    "attention.dense.weight": (T.ATTN_OUT, ".weight"),
    "attention.o_proj.weight": (T.ATTN_OUT, ".weight"),
    "post_attention_layernorm.weight": (T.FFN_NORM, ".weight"),
    "mlp.gate.weight": (T.FFN_GATE_INP, ".weight"),
    "mlp.gate.expert_bias": (T.FFN_EXP_PROBS_B, ".bias"),
    "mlp.shared_experts.gate_proj.weight": (T.FFN_GATE_SHEXP, ".weight"),
    "mlp.shared_experts.up_proj.weight": (T.FFN_UP_SHEXP, ".weight"),
    "mlp.shared_experts.down_proj.weight": (T.FFN_DOWN_SHEXP, ".weight"),
}
_KV_B = "attention.kv_b_proj.weight"
#: The swiglu clamp lists of config.json -> the per-layer arrays llama.cpp's converter writes them as.
CLAMPS = {"expert_swiglu_limit_list": "swiglu_clamp_exp", "share_expert_swiglu_limit_list": "swiglu_clamp_shexp"}


@HeadModel.register("BailingMoeV3ForCausalLM")
class BailingMoeV3MTPModel(NextNLayerModel):
    """Ling-3.0 with its MTP layer (``num_nextn_predict_layers: 1``)."""

    model_arch = "bailingmoe3"  # not in PyPI gguf 0.19.0's MODEL_ARCH
    layer_names = _NAMES
    head_norm_names = ()  # final_layernorm is the block's layer_output_norm
    keep_nextn_copies = None
    layer_word = "MTP"

    def read_layer_counts(self) -> None:
        super().read_layer_counts()
        if self.n_nextn != 1:
            raise CheckpointError(f"num_nextn_predict_layers = {self.n_nextn}: llama.cpp's bailingmoe3 graph runs one",
                                  self.config_path)

    def read_hparams(self) -> None:
        super().read_hparams()
        need, may = self.hparam_int, self.optional_hparam_int
        self.q_lora_rank = may("q_lora_rank")
        self.kv_lora_rank = need("kv_lora_rank")
        self.qk_nope = need("qk_nope_head_dim")
        self.qk_rope = need("qk_rope_head_dim")
        self.v_head = need("v_head_dim")
        self.n_ff = may("intermediate_size")
        self.n_ff_exp = need("moe_intermediate_size")
        self.n_ff_shexp = need("moe_shared_expert_intermediate_size")
        n_shared = may("num_shared_experts", minimum=0, maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT)
        self.n_shared = 1 if n_shared is None else n_shared
        self.n_dense_lead = need("first_k_dense_replace", minimum=0, maximum=LLAMA_MAX_LAYERS)
        self.n_group = may("n_group")
        self.topk_group = may("topk_group")
        self.routed_scale = self.optional_hparam_float("routed_scaling_factor")
        self.norm_topk_prob = self.optional_hparam_bool("norm_topk_prob")
        self.conv_kernel = may("short_conv_kernel_size")
        self.kda_lower_bound = self.optional_hparam_float("kda_lower_bound", above=-1e6, maximum=0.0)
        self.clamps = {suffix: self._clamp_list(key) for key, suffix in CLAMPS.items()
                       if self.hparams.get(key) is not None}

    def _clamp_list(self, key: str) -> list[float]:
        """config.json's per-layer clamp list for the trunk (null entries: 0.0, no clamp), as llama.cpp's converter
        reads it: cut or padded with 0.0 to the trunk's length."""
        values = self.hparams[key]
        if not isinstance(values, list) or len(values) > LLAMA_MAX_LAYERS or not all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
            raise CheckpointError(f"{key} is not a list of numbers or nulls (at most {LLAMA_MAX_LAYERS})",
                                  self.config_path)
        trunk = [0.0 if v is None else float(v) for v in values[: self.n_layer]]
        return self.hparam_origin(key, trunk + [0.0] * (self.n_layer - len(trunk)))

    # ------------------------------------------------------------------------------------ tensors

    def layer_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        if self.layer_suffix(tensor) != _KV_B:
            yield from super().layer_tensors(tensor)
            return
        k_b, v_b = split_kv_b(tensor, self.n_head, self.qk_nope, self.v_head)
        yield self.format_tensor_name(T.ATTN_K_B), k_b
        yield self.format_tensor_name(T.ATTN_V_B), v_b

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        h, n, rank, rope, q_lora = self.n_embd, self.n_head, self.kv_lora_rank, self.qk_rope, self.q_lora_rank
        qk, name = self.qk_nope + rope, self.format_tensor_name
        query = ({name(T.ATTN_Q): (n * qk, h)} if q_lora is None else
                 {name(T.ATTN_Q_A): (q_lora, h), name(T.ATTN_Q_A_NORM): (q_lora,), name(T.ATTN_Q_B): (n * qk, q_lora)})
        layer = {
            name(T.ATTN_NORM): (h,), **query,
            name(T.ATTN_KV_A_MQA): (rank + rope, h), name(T.ATTN_KV_A_NORM): (rank,),
            name(T.ATTN_K_B): (n, rank, self.qk_nope), name(T.ATTN_V_B): (n, self.v_head, rank),
            name(T.ATTN_GATE): (n, h), name(T.ATTN_OUT): (h, n * self.v_head), name(T.FFN_NORM): (h,),
            **self.moe_shapes(self.n_ff_exp, self.n_ff_shexp),
            name(T.LAYER_OUT_NORM): (h,),  # required: the MTP head's final norm (bailingmoe3.cpp)
        }
        return self.glue_shapes(layer, block)

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        # The keys llama.cpp's converter writes for bailingmoe3 (conversion/bailingmoe3.py) that the head
        # implies; the trunk-only ones (KDA's) are written too when config.json has them, so a draft's metadata
        # is upstream's.
        super().set_gguf_parameters(writer, n_layers)
        if self.n_ff is not None:
            writer.add_feed_forward_length(self.n_ff)
        if self.n_group is not None:
            writer.add_expert_group_count(self.n_group)
        if self.topk_group is not None:
            writer.add_expert_group_used_count(self.topk_group)
        writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        if self.vocab_size is not None:
            writer.add_vocab_size(self.vocab_size)
        if self.conv_kernel is not None:
            writer.add_ssm_conv_kernel(self.conv_kernel)
        # PyPI gguf 0.19.0 knows only the first KDA key: the other two by llama.cpp's names (src/llama-arch.cpp)
        writer.add_kda_head_dim(self.head_dim)
        writer.add_bool(f"{self.arch}.kda.safe_gate", True)
        if self.kda_lower_bound is not None:
            writer.add_float32(f"{self.arch}.kda.gate_lower_bound", self.kda_lower_bound)
        if self.q_lora_rank is not None:
            writer.add_q_lora_rank(self.q_lora_rank)
        writer.add_kv_lora_rank(self.kv_lora_rank)
        writer.add_rope_dimension_count(self.qk_rope)
        writer.add_key_length(self.kv_lora_rank + self.qk_rope)
        writer.add_key_length_mla(self.qk_nope + self.qk_rope)
        writer.add_value_length_mla(self.v_head)
        writer.add_expert_feed_forward_length(self.n_ff_exp)
        writer.add_expert_shared_feed_forward_length(self.n_ff_shexp)
        writer.add_expert_shared_count(self.n_shared)
        writer.add_leading_dense_block_count(self.n_dense_lead)
        if self.routed_scale is not None:
            writer.add_expert_weights_scale(self.routed_scale)
        if self.norm_topk_prob is not None:
            writer.add_expert_weights_norm(self.norm_topk_prob)

    def own_layer_arrays(self) -> tuple[str, ...]:
        return ("attention.head_count_kv", *self.clamps)

    def nextn_layer_values(self) -> dict[str, int]:
        # head_count_kv 1: a full-attention block (0 marks a recurrent one, bailingmoe3.cpp); clamps 0.0: the
        # converter pads them so (conversion/bailingmoe3.py).
        return {**self.moe_block_values(self.n_ff_exp, self.n_ff), "attention.head_count_kv": 1,
                "swiglu_clamp_exp": 0, "swiglu_clamp_shexp": 0}

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[int]] | None:
        if n_trunk != self.n_layer:
            return None
        group = self.hparams.get("layer_group_size")
        if isinstance(group, bool) or not isinstance(group, int) or not 1 <= group <= LLAMA_MAX_LAYERS:
            return None
        # conversion/bailingmoe3.py: every group's last layer and the ungrouped tail are full attention
        full = [int((i + 1) % group == 0 or i >= n_trunk // group * group) for i in range(n_trunk)]
        return {"attention.head_count_kv": full, **self.clamps}  # type: ignore[dict-item]

    def layer_arrays(self, block: int, target: ShardSet | None) -> dict[str, tuple[GGUFValueType, list[Any]]]:
        arrays = super().layer_arrays(block, target)
        for suffix in self.clamps:  # f32 arrays, as the converter writes them (the base writes i32)
            etype, values = arrays[suffix]
            arrays[suffix] = (GGUFValueType.FLOAT32 if etype == GGUFValueType.INT32 else etype,
                              [float(v) for v in values])
        return arrays

    def target_checks(self) -> list[TargetCheck]:
        # Not the base's head_count_kv (0/1 per layer here, whatever config.json says) nor key_length (MLA's).
        skipped = ("attention.head_count_kv", "attention.key_length")
        common = [c for c in super().target_checks() if c.key not in skipped]
        return [
            *common,
            TargetCheck("attention.key_length", self.kv_lora_rank + self.qk_rope, "kv_lora_rank + qk_rope_head_dim"),
            TargetCheck("attention.kv_lora_rank", self.kv_lora_rank, "kv_lora_rank"),
            TargetCheck("attention.key_length_mla", self.qk_nope + self.qk_rope, "qk_nope_head_dim + qk_rope_head_dim"),
            TargetCheck("attention.value_length_mla", self.v_head, "v_head_dim"),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
        ]
