"""NVIDIA Nemotron-H MoE (Nemotron 3 Super, Nano, 3.5 Lightning): the MTPv2 head -> one NextN block of
``nemotron_h_moe``.

The checkpoint's head has two layers: ``mtp.layers.0`` is the NextN input fusion (``enorm``,
``hnorm``, ``eh_proj``) plus an attention sub-layer, ``mtp.layers.1`` a latent-MoE sub-layer plus the
final head norm. llama.cpp folds both into one trailing block ``blk.N`` (N = the trunk's block
count), which is therefore both an attention and a MoE layer in the per-layer metadata. Names and
shapes follow llama.cpp's ``src/models/nemotron-h.cpp``; no transposes beyond the usual reversal to
ggml order and no ``norm + 1``. Super's MoE is latent (``moe_latent_size``, ``fc1/fc2_latent_proj``); Nano's
is not: without ``moe_latent_size`` (absent or null) the experts work at full width and no ``ffn_latent_*``
tensor is expected, as in llama.cpp's loader, where both are optional.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, GGUFWriter

from gguf_mtp.errors import CheckpointError

from .base import HeadModel, TargetCheck
from .hparams import EXPERT_LIMIT, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS
from .mtp_module import MTPModuleModel

T = MODEL_TENSOR

#: The MTP layer pattern of an MTPv2 head: an attention layer, then a MoE layer. NVIDIA configs spell
#: it ``mtp_hybrid_override_pattern: "*E"`` or ``mtp_layers_block_type: ["attention", "moe"]``.
MTP_PATTERN = "*E"
_BLOCK_TYPE_LETTERS = {"attention": "*", "moe": "E", "mamba": "M", "mlp": "-"}

#: checkpoint name -> (gguf-py tensor, suffix). Experts are stacked separately.
_RENAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    "mtp.layers.0.enorm.weight": (T.NEXTN_ENORM, ".weight"),
    "mtp.layers.0.hnorm.weight": (T.NEXTN_HNORM, ".weight"),
    "mtp.layers.0.eh_proj.weight": (T.NEXTN_EH_PROJ, ".weight"),
    "mtp.layers.0.norm.weight": (T.ATTN_NORM, ".weight"),
    "mtp.layers.0.mixer.q_proj.weight": (T.ATTN_Q, ".weight"),
    "mtp.layers.0.mixer.k_proj.weight": (T.ATTN_K, ".weight"),
    "mtp.layers.0.mixer.v_proj.weight": (T.ATTN_V, ".weight"),
    "mtp.layers.0.mixer.o_proj.weight": (T.ATTN_OUT, ".weight"),
    "mtp.layers.1.norm.weight": (T.ATTN_POST_NORM, ".weight"),
    "mtp.layers.1.mixer.gate.weight": (T.FFN_GATE_INP, ".weight"),
    # Both spellings of the routing bias occur in NVIDIA's checkpoints.
    "mtp.layers.1.mixer.gate.e_score_correction_bias": (T.FFN_EXP_PROBS_B, ".bias"),
    "mtp.layers.1.mixer.gate.e_score_correction.bias": (T.FFN_EXP_PROBS_B, ".bias"),
    "mtp.layers.1.mixer.fc1_latent_proj.weight": (T.MOE_LATENT_DOWN, ".weight"),
    "mtp.layers.1.mixer.fc2_latent_proj.weight": (T.MOE_LATENT_UP, ".weight"),
    "mtp.layers.1.mixer.shared_experts.up_proj.weight": (T.FFN_UP_SHEXP, ".weight"),
    "mtp.layers.1.mixer.shared_experts.down_proj.weight": (T.FFN_DOWN_SHEXP, ".weight"),
    "mtp.layers.1.final_layernorm.weight": (T.NEXTN_SHARED_HEAD_NORM, ".weight"),
}
# At most 6 digits: an index is bounded before int() sees it (LLAMA_MAX_EXPERTS is far below 10^6).
_EXPERT = re.compile(r"^mtp\.layers\.1\.mixer\.experts\.(?P<expert>[0-9]{1,6})\.(?P<proj>up|down)_proj\.weight$")


def mtp_pattern(config: dict[str, Any]) -> str | None:
    """The MTP layer pattern a config states (``"*E"``), from either spelling; ``None`` when absent.
    A value of another type comes back as its ``repr`` (it is refused as an unsupported pattern)."""
    pattern = config.get("mtp_hybrid_override_pattern")
    if pattern is None and isinstance(config.get("mtp_layers_block_type"), list):
        pattern = "".join(_BLOCK_TYPE_LETTERS.get(t, "?") if isinstance(t, str) else "?"
                          for t in config["mtp_layers_block_type"])
    return pattern if pattern is None or isinstance(pattern, str) else repr(pattern)[:40]


def trunk_pattern(config: dict[str, Any]) -> str | None:
    """The trunk's layer pattern (``"M*EM*E..."``) from ``hybrid_override_pattern`` or ``layers_block_type``."""
    pattern = config.get("hybrid_override_pattern")
    if pattern is None and isinstance(config.get("layers_block_type"), list):
        pattern = "".join(_BLOCK_TYPE_LETTERS.get(str(t), "?") for t in config["layers_block_type"])
    return pattern if isinstance(pattern, str) else None


@HeadModel.register("NemotronHForCausalLM")
class NemotronHMTPModel(MTPModuleModel):
    """Nemotron-H MoE with an MTPv2 head (``num_nextn_predict_layers: 1``)."""

    model_arch = MODEL_ARCH.NEMOTRON_H_MOE
    module_names = _RENAMES
    expert_pattern = _EXPERT
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {"up": T.FFN_UP_EXP, "down": T.FFN_DOWN_EXP}
    has_rope = False  # Nemotron-H's attention layers have no positional encoding
    norm_eps_keys: ClassVar[tuple[str, ...]] = ("layer_norm_epsilon", "norm_eps", "rms_norm_eps")

    def read_hparams(self) -> None:
        config = self.config_path
        if "num_experts_per_tok" not in self.hparams and "n_routed_experts" not in self.hparams:
            raise CheckpointError("a Nemotron-H without experts (nemotron_h) has no MTP head llama.cpp can use; "
                                  "only the MoE variant (nemotron_h_moe) does", config)
        n_nextn = self.optional_hparam_int("num_nextn_predict_layers", minimum=0, maximum=LLAMA_MAX_LAYERS)
        n_nextn = 1 if n_nextn is None else n_nextn
        if n_nextn != 1:
            raise CheckpointError(f"num_nextn_predict_layers = {n_nextn}: only one NextN block is supported", config)
        pattern = mtp_pattern(self.hparams)
        if pattern is None:
            self.notes.append(f"config.json states no MTP layer pattern; assuming {MTP_PATTERN!r} (MTPv2)")
        elif pattern != MTP_PATTERN:
            raise CheckpointError(
                f"MTP layer pattern {pattern!r}: only {MTP_PATTERN!r} (an attention layer, then a MoE layer) is "
                "supported", config)
        super().read_hparams()
        may = self.optional_hparam_int
        self.n_ff_exp = self.hparam_int("moe_intermediate_size")
        self.n_ff_shexp = self.hparam_int("moe_shared_expert_intermediate_size")
        self.moe_latent = may("moe_latent_size")
        self.n_shared_experts = may("n_shared_experts", minimum=0, maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT)
        self.norm_topk_prob = self.optional_hparam_bool("norm_topk_prob")
        self.routed_scaling_factor = self.optional_hparam_float("routed_scaling_factor")
        self.n_group = may("n_group", maximum=self.n_expert)
        self.ssm_conv = may("conv_kernel", maximum=1024)
        self.ssm_heads = may("mamba_num_heads")
        self.ssm_head_dim = may("mamba_head_dim")
        self.ssm_state = may("ssm_state_size")
        self.ssm_groups = may("n_groups")
        if self.ssm_heads is not None and self.ssm_head_dim is not None:
            self.hparam_origin("mamba_num_heads x mamba_head_dim", self.ssm_heads * self.ssm_head_dim)

    # ------------------------------------------------------------------------------------ tensors

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        h, q, kv = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        name = self.format_tensor_name
        # Without a latent size the experts work at full width and there is no latent projection.
        latent = {} if self.moe_latent is None else {name(T.MOE_LATENT_DOWN): (self.moe_latent, h),
                                                      name(T.MOE_LATENT_UP): (h, self.moe_latent)}
        return {
            name(T.NEXTN_ENORM): (h,),
            name(T.NEXTN_HNORM): (h,),
            name(T.NEXTN_EH_PROJ): (h, 2 * h),
            name(T.ATTN_NORM): (h,),
            name(T.ATTN_Q): (q, h),
            name(T.ATTN_K): (kv, h),
            name(T.ATTN_V): (kv, h),
            name(T.ATTN_OUT): (h, q),
            name(T.ATTN_POST_NORM): (h,),
            **self.router_shapes(),
            **latent,
            **self.expert_shapes(self.n_ff_exp, self.moe_latent, gated=False),
            **self.shared_expert_shapes(self.n_ff_shexp, gated=False),
            name(T.NEXTN_SHARED_HEAD_NORM): (h,),
        }

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        super().set_gguf_parameters(writer, n_layers)
        # llama.cpp's nemotron_h loader requires layer_norm_epsilon (the head's final norm) as well.
        writer.add_layer_norm_eps(self.norm_eps if self.norm_eps is not None else self.default_norm_eps)
        writer.add_expert_feed_forward_length(self.n_ff_exp)
        writer.add_expert_shared_feed_forward_length(self.n_ff_shexp)
        writer.add_expert_shared_count(1 if self.n_shared_experts is None else self.n_shared_experts)
        if self.norm_topk_prob is not None:
            writer.add_expert_weights_norm(self.norm_topk_prob)
        if self.routed_scaling_factor is not None:
            writer.add_expert_weights_scale(self.routed_scaling_factor)
        if self.n_group is not None:
            writer.add_expert_group_count(self.n_group)
        if self.moe_latent is not None:
            writer.add_moe_latent_size(self.moe_latent)
        # The trunk's Mamba-2 settings: a head-only config usually still carries them, and a draft that
        # states them describes the model it belongs to.
        if self.ssm_conv is not None:
            writer.add_ssm_conv_kernel(self.ssm_conv)
        if self.ssm_heads is not None and self.ssm_head_dim is not None:
            writer.add_ssm_inner_size(self.ssm_heads * self.ssm_head_dim)
        if self.ssm_state is not None:
            writer.add_ssm_state_size(self.ssm_state)
        if self.ssm_heads is not None:
            writer.add_ssm_time_step_rank(self.ssm_heads)
        if self.ssm_groups is not None:
            writer.add_ssm_group_count(self.ssm_groups)

    def own_layer_arrays(self) -> tuple[str, ...]:
        return ("attention.head_count_kv", "feed_forward_length")

    def nextn_layer_values(self) -> dict[str, int]:
        # The folded block is attention (kv heads) and MoE (feed_forward_length) at once.
        return {
            "attention.head_count_kv": self.n_head_kv,
            "feed_forward_length": self.n_ff_exp,
            "attention.head_count": self.n_head,
            "expert_used_count": self.n_expert_used,
            "expert_feed_forward_length": self.n_ff_exp,
        }

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[int]] | None:
        pattern = trunk_pattern(self.hparams)
        if pattern is None or len(pattern) != n_trunk:
            return None
        return {
            "attention.head_count_kv": [self.n_head_kv if c == "*" else 0 for c in pattern],
            "feed_forward_length": [self.n_ff_exp if c == "E" else 0 for c in pattern],
        }

    def target_checks(self) -> list[TargetCheck]:
        checks = [
            *super().target_checks(),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
            TargetCheck("expert_shared_feed_forward_length", self.n_ff_shexp, "moe_shared_expert_intermediate_size"),
        ]
        if self.moe_latent is not None:
            checks.append(TargetCheck("moe_latent_size", self.moe_latent, "moe_latent_size"))
        return checks
