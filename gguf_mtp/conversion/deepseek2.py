"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``, BF16) and DeepSeek V3 / R1 / V3.1 / V3-0324 (``DeepseekV3ForCausalLM``,
FP8): the NextN layer -> one NextN block of ``deepseek2``.

The head is the decoder layer ``model.layers.{N}`` (N = ``num_hidden_layers``: 47 for GLM-4.7-Flash, 61 for DeepSeek
V3/R1): multi-head latent attention (MLA) with Q-LoRA, a sigmoid-routed MoE with shared experts, the NextN glue, and
(DeepSeek V3/R1) the layer's own embedding / LM head copies (kept or dropped, :class:`.nextn_layer.NextNLayerModel`).
What differs from an ordinary decoder layer is llama.cpp's MLA form (``conversion/deepseek.py``, ``modify_tensors``):
``self_attn.kv_b_proj`` ``[n_head_kv * (nope + v), kv_lora]`` is viewed per head and split into ``attn_k_b`` (the
``nope`` rows of each head, transposed: ``[n_head_kv, kv_lora, nope]``) and ``attn_v_b`` (the ``v`` rows:
``[n_head_kv, v, kv_lora]``). ``attn_v_b``'s heads are byte ranges of the checkpoint; ``attn_k_b`` is transposed one
head at a time (:class:`TransposedTensor`). An FP8 ``kv_b_proj`` is dequantized first, with the scale rows of the
whole tensor (:mod:`.fp8`).

llama.cpp's converter writes the MTP layer for GLM-4.7-Flash only (``Glm4MoeLiteModel``, ``conversion/glm.py``:
``skip_mtp = False``); for DeepSeek V3/R1 it drops it (``DeepseekV2Model.skip_mtp = True``, conversion/deepseek.py),
so this module is the way to a DeepSeek V3/R1 MTP draft. Both checkpoints go through the same code, as they go
through the same upstream class.

The graph (``src/models/deepseek2.cpp``, ``graph_mtp``) asserts MLA (``is_mla()``: ``attention.key_length_mla``
present, ``attn_k_b``/``attn_v_b`` tensors) and Q-LoRA: a target converted before MLA (``attn_kv_b`` only) cannot run
the head, and :meth:`DeepseekV2MTPModel.check_target` says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, ExpertGatingFuncType, GGUFWriter, RopeScalingType

from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.safetensors_io import SafetensorsTensor
from gguf_mtp.model.shards import ShardSet

from .base import HeadModel, TargetCheck
from .hparams import EXPERT_LIMIT, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS, config_float, config_int
from .mla import split_kv_b
from .nextn_layer import NextNLayerModel
from .tensors import TensorSource

__all__ = ["DeepseekV2MTPModel"]

T = MODEL_TENSOR

_KV_B = "self_attn.kv_b_proj.weight"
#: Why llama.cpp's MTP graph needs an MLA trunk (src/models/deepseek2.cpp, graph_mtp asserts is_mla()).
_MLA_REASON = ("llama.cpp's deepseek2 MTP graph runs only on an MLA-format model (attention.key_length_mla and "
               "attn_k_b/attn_v_b: src/models/deepseek2.cpp:174 asserts is_mla()); reconvert the trunk with a current "
               "llama.cpp")


@HeadModel.register("Glm4MoeLiteForCausalLM", "DeepseekV3ForCausalLM")
class DeepseekV2MTPModel(NextNLayerModel):
    """MLA + MoE NextN layer (GLM-4.7-Flash; DeepSeek V3, R1, V3.1, V3-0324)."""

    model_arch: ClassVar[MODEL_ARCH | str] = MODEL_ARCH.DEEPSEEK2
    default_norm_eps = 1e-6  # DeepseekV2Model.set_gguf_parameters: rms_norm_eps defaults to 1e-6
    #: Why the target must be MLA-format (what :meth:`check_target` says when it is not).
    mla_reason: ClassVar[str] = _MLA_REASON

    def read_hparams(self) -> None:
        super().read_hparams()
        need, may = self.hparam_int, self.optional_hparam_int
        q_lora = may("q_lora_rank")
        if q_lora is None:
            raise CheckpointError("q_lora_rank is absent or null: llama.cpp's deepseek2 MTP graph needs Q-LoRA "
                                  "(src/models/deepseek2.cpp:193 asserts n_lora_q > 0)", self.config_path)
        self.q_lora = q_lora
        self.kv_lora = need("kv_lora_rank")
        self.nope = need("qk_nope_head_dim")
        self.rope = need("qk_rope_head_dim")
        self.v_dim = need("v_head_dim")
        self.n_ff_exp = need("moe_intermediate_size")
        self.n_ff = may("intermediate_size")
        self.n_shared = may("n_shared_experts", minimum=0, maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT) or 0
        self.n_dense_lead = may("first_k_dense_replace", minimum=0, maximum=LLAMA_MAX_LAYERS) or 0
        self.n_group = may("n_group", maximum=self.n_expert)
        self.topk_group = may("topk_group", maximum=self.n_expert)
        self.routed_scaling_factor = self.optional_hparam_float("routed_scaling_factor")
        self.norm_topk_prob = self.optional_hparam_bool("norm_topk_prob")
        scoring = self.hparams.get("scoring_func")
        if scoring not in (None, "sigmoid", "softmax"):
            raise CheckpointError(f"scoring_func = {scoring!r:.40}: expected \"sigmoid\" or \"softmax\"",
                                  self.config_path)
        self.scoring = scoring
        self.rope_scaling = self._read_rope_scaling()

    def _read_rope_scaling(self) -> dict[str, Any]:
        """DeepSeek V3's YaRN settings (``rope_scaling``; ``rope_parameters`` in transformers 5), checked."""
        scaling = self.hparams.get("rope_scaling") or self.hparams.get("rope_parameters") or {}
        if not isinstance(scaling, dict):
            raise CheckpointError("rope_scaling is not a JSON object", self.config_path)
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            return {}
        if kind != "yarn":
            raise CheckpointError(f"rope_scaling type {kind!r:.40}: a deepseek2 head supports yarn only",
                                  self.config_path)
        where = self.config_path
        out: dict[str, Any] = {
            "factor": config_float(scaling, "factor", where=where, maximum=1e6),
            "original_max_position_embeddings": config_int(scaling, "original_max_position_embeddings",
                                                           where=where, maximum=2**32 - 1),
        }
        for key in ("beta_fast", "beta_slow", "mscale_all_dim"):
            out[key] = config_float(scaling, key, where=where, above=-1e6, maximum=1e6, optional=True)
        return out

    # ------------------------------------------------------------------------------------ tensors

    def layer_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        if self.layer_suffix(tensor) != _KV_B:
            yield from super().layer_tensors(tensor)
            return
        k_b, v_b = split_kv_b(tensor, self.n_head_kv, self.nope, self.v_dim,
                              "(num_key_value_heads x (qk_nope_head_dim + v_head_dim), kv_lora_rank)")
        yield self.format_tensor_name(T.ATTN_K_B), k_b
        yield self.format_tensor_name(T.ATTN_V_B), v_b

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        h, nh, hk = self.n_embd, self.n_head, self.n_head_kv
        name = self.format_tensor_name
        layer: dict[str, tuple[int, ...]] = {
            name(T.ATTN_NORM): (h,),
            name(T.ATTN_Q_A): (self.q_lora, h),
            name(T.ATTN_Q_A_NORM): (self.q_lora,),
            name(T.ATTN_Q_B): (nh * (self.nope + self.rope), self.q_lora),
            name(T.ATTN_KV_A_MQA): (self.kv_lora + self.rope, h),
            name(T.ATTN_KV_A_NORM): (self.kv_lora,),
            name(T.ATTN_K_B): (hk, self.kv_lora, self.nope),
            name(T.ATTN_V_B): (hk, self.v_dim, self.kv_lora),
            name(T.ATTN_OUT): (h, nh * self.v_dim),
            name(T.FFN_NORM): (h,),
        }
        biased = self.has("mlp.gate.e_score_correction_bias") or self.has("mlp.gate.e_score_correction.bias")
        layer.update(self.moe_shapes(self.n_ff_exp, self.n_ff_exp * self.n_shared, ".bias" if biased else None))
        return self.glue_shapes(layer)

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        # The keys llama.cpp's converter writes for deepseek2 (conversion/deepseek.py, set_gguf_parameters).
        super().set_gguf_parameters(writer, n_layers)
        writer.add_head_count_kv(1)  # MLA is converted to MQA (one KV head of kv_lora + rope)
        writer.add_key_length(self.kv_lora + self.rope)
        writer.add_value_length(self.kv_lora)
        if self.n_ff is not None:
            writer.add_feed_forward_length(self.n_ff)
        writer.add_leading_dense_block_count(self.n_dense_lead)
        writer.add_q_lora_rank(self.q_lora)
        writer.add_kv_lora_rank(self.kv_lora)
        writer.add_key_length_mla(self.nope + self.rope)
        writer.add_value_length_mla(self.v_dim)
        writer.add_expert_feed_forward_length(self.n_ff_exp)
        writer.add_expert_shared_count(self.n_shared)
        if self.n_group is not None:
            writer.add_expert_group_count(self.n_group)
        if self.topk_group is not None:
            writer.add_expert_group_used_count(self.topk_group)
        if self.scoring is not None:
            writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID if self.scoring == "sigmoid"
                                          else ExpertGatingFuncType.SOFTMAX)
        if self.routed_scaling_factor is not None:
            writer.add_expert_weights_scale(self.routed_scaling_factor)
        if self.norm_topk_prob:
            writer.add_expert_weights_norm(True)
        writer.add_rope_dimension_count(self.rope)
        if self.rope_scaling:
            yarn = self.rope_scaling
            writer.add_rope_scaling_type(RopeScalingType.YARN)
            writer.add_rope_scaling_factor(yarn["factor"])
            writer.add_rope_scaling_orig_ctx_len(yarn["original_max_position_embeddings"])
            if yarn["beta_fast"] is not None:
                writer.add_rope_scaling_yarn_beta_fast(yarn["beta_fast"])
            if yarn["beta_slow"] is not None:
                writer.add_rope_scaling_yarn_beta_slow(yarn["beta_slow"])
            if yarn["mscale_all_dim"] is not None:
                writer.add_rope_scaling_yarn_log_mul(0.1 * yarn["mscale_all_dim"])

    def own_layer_arrays(self) -> tuple[str, ...]:
        return ()  # deepseek2 has no per-layer arrays (conversion/deepseek.py writes scalars only)

    def nextn_layer_values(self) -> dict[str, int]:
        return {}

    def target_checks(self) -> list[TargetCheck]:
        mla = {"attention.head_count_kv": TargetCheck("attention.head_count_kv", 1, "MLA: one KV head"),
               "attention.key_length": TargetCheck("attention.key_length", self.kv_lora + self.rope,
                                                   "kv_lora_rank + qk_rope_head_dim")}
        checks = [mla.get(c.key, c) for c in super().target_checks()]
        return [
            *checks,
            TargetCheck("attention.key_length_mla", self.nope + self.rope, "qk_nope_head_dim + qk_rope_head_dim"),
            TargetCheck("attention.value_length_mla", self.v_dim, "v_head_dim"),
            TargetCheck("attention.q_lora_rank", self.q_lora, "q_lora_rank"),
            TargetCheck("attention.kv_lora_rank", self.kv_lora, "kv_lora_rank"),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
            TargetCheck("expert_shared_count", self.n_shared, "n_shared_experts"),
        ]

    def check_target(self, target: ShardSet) -> None:
        """As for every head, plus: the target must be an MLA-format deepseek2 model.

        Raises:
            IncompatibleDraftError: an ``attn_kv_b`` trunk, or one without ``attention.key_length_mla``, named with
                the reason.
        """
        if target.arch == self.arch:
            names = {t.name for header in target.headers for t in header.tensors}
            old = any(n.endswith(".attn_kv_b.weight") for n in names) and not any(n.endswith(".attn_k_b.weight")
                                                                                    for n in names)
            if old or target.get(f"{self.arch}.attention.key_length_mla") is None:
                what = "has attn_kv_b tensors" if old else "has no deepseek2.attention.key_length_mla"
                raise IncompatibleDraftError(f"the target {what}: {self.mla_reason}", target.name)
        super().check_target(target)
