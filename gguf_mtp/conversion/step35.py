"""Step-3.5-Flash (``Step3p5ForCausalLM``) and Step-3.7-Flash (``Step3p7ForConditionalGeneration``): the three MTP
layers -> three NextN blocks of ``step35``.

Step-3.7 is the same text model inside a vision-language checkpoint: its hyperparameters sit in ``text_config`` and
its text tensors under ``model.language_model.``; as llama.cpp's converter does (conversion/base.py moves
``text_config`` to the top and drops ``language_model.`` from names), both are read as Step-3.5's.

The head is the checkpoint's extra decoder layers ``model.layers.{N+i}.*``, ``N = num_hidden_layers`` (45) and
``i < num_nextn_predict_layers`` (3), renumbered together as ``blk.{N+i}``; llama.cpp chains all of them, block k
at ``llama_set_nextn_layer_offset(ctx, k)`` (src/models/step35.cpp). Each is a Step-3.5 decoder
layer (attention with per-head QK norm and a head-wise gate ``g_proj``, a dense MLP in the released checkpoints, or a
MoE with packed 3-D experts) plus the NextN fusion (``enorm``, ``hnorm``, ``eh_proj``) and a head nested as
``transformer.shared_head.{norm,output}``, which llama.cpp's converter renames to ``shared_head.{norm,head}``
(conversion/step3.py).

Transforms, as llama.cpp's converter (conversion/step3.py) does them: every ``*norm.weight`` gets ``+ 1``
(``float32(stored) + 1``, written F32 like every 1-D tensor: equal to upstream's bytes); the router bias
``moe.router_bias`` becomes ``exp_probs_b.bias``. The per-layer arrays ``attention.head_count``,
``attention.head_count_kv``, ``attention.sliding_window_pattern`` and, when config.json has them,
``swiglu_clamp_exp`` / ``swiglu_clamp_shexp`` get one entry per NextN block, from config.json's ``layer_types``
(padded with ``full_attention``) and ``swiglu_limits`` (padded with 0.0), as conversion/step3.py writes them.

A NextN decoder layer (:class:`.nextn_layer.NextNLayerModel`) whose names come from this module's own table: PyPI gguf
0.19.0 has no NextN entries for ``step35``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, ExpertGatingFuncType, GGUFWriter

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import SafetensorsTensor

from .base import HeadModel, TargetCheck
from .hf_names import DECODER_NAMES, NEXTN_GLUE_NAMES
from .hparams import LLAMA_MAX_LAYERS, MAX_WIDTH, config_float
from .nextn_layer import NextNLayerModel
from .qwen35 import PlusOneTensor
from .tensors import TensorSource

__all__ = ["Step35MTPModel"]

T = MODEL_TENSOR

#: HF name inside an MTP layer (after llama.cpp's ``transformer.`` strip and ``output`` -> ``head``) -> GGUF tensor
#: and suffix (gguf-py's tensor_mapping.py entries for step3.5 and its six generic NextN sources).
NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    **NEXTN_GLUE_NAMES,
    **DECODER_NAMES,
    "self_attn.g_proj.weight": (T.ATTN_GATE, ".weight"),
    "moe.gate.weight": (T.FFN_GATE_INP, ".weight"),
    "moe.router_bias": (T.FFN_EXP_PROBS_B, ".bias"),
    "moe.gate_proj.weight": (T.FFN_GATE_EXP, ".weight"),
    "moe.up_proj.weight": (T.FFN_UP_EXP, ".weight"),
    "moe.down_proj.weight": (T.FFN_DOWN_EXP, ".weight"),
    "share_expert.gate_proj.weight": (T.FFN_GATE_SHEXP, ".weight"),
    "share_expert.up_proj.weight": (T.FFN_UP_SHEXP, ".weight"),
    "share_expert.down_proj.weight": (T.FFN_DOWN_SHEXP, ".weight"),
}
_SWA, _FULL = "sliding_attention", "full_attention"
HEAD_COUNT, HEAD_COUNT_KV, SWA_PATTERN = "attention.head_count", "attention.head_count_kv", \
    "attention.sliding_window_pattern"
#: per-layer clamp arrays -> the config.json list they come from
CLAMPS = {"swiglu_clamp_exp": "swiglu_limits", "swiglu_clamp_shexp": "swiglu_limits_shared"}


@HeadModel.register("Step3p5ForCausalLM", "Step3p7ForConditionalGeneration")
class Step35MTPModel(NextNLayerModel):
    """Step-3.5 / 3.7-Flash with its MTP layers (``num_nextn_predict_layers: 3``)."""

    model_arch = MODEL_ARCH.STEP35
    #: Step-3.5's layers are ``model.layers.``, Step-3.7's ``model.language_model.layers.``
    layer_roots = ("model.layers.", "model.language_model.layers.")
    nested_text_config = True
    layer_names = NAMES
    keep_nextn_copies = None
    layer_word = "MTP"
    chained_blocks = True
    nextn_count_required = True
    expert_pattern = None  # packed 3-D experts
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {}
    n_head_kv_keys = ("num_attention_groups",)
    expert_count_keys = ("moe_num_experts",)
    expert_used_keys = ("moe_top_k",)

    def read_hparams(self) -> None:
        super().read_hparams()
        need, may = self.hparam_int, self.optional_hparam_int
        self.n_blocks = self.n_layer + self.n_nextn
        other = self.hparams.get("attention_other_setting") or {}
        if not isinstance(other, dict):
            raise CheckpointError("attention_other_setting is not a JSON object", self.config_path)
        self.n_head_swa = self._nested_int(other, "num_attention_heads", self.n_head)
        self.n_head_kv_swa = self._nested_int(other, "num_attention_groups", self.n_head_kv)
        self.layer_types: list[str] = self._padded("layer_types", _FULL, str)
        unknown = sorted({t for t in self.layer_types if t not in (_SWA, _FULL)})
        if unknown:
            raise CheckpointError(f"layer_types has {unknown[0]!r}: expected {_FULL!r} or {_SWA!r}", self.config_path)
        self.clamps = {suffix: self._padded(key, 0.0, float) for suffix, key in CLAMPS.items()
                       if self.hparams.get(key) is not None}
        self.sliding_window = need("sliding_window", maximum=2**32 - 1)
        self.n_ff = may("intermediate_size")
        self.n_ff_exp = may("moe_intermediate_size")
        self.n_ff_shexp = may("share_expert_dim")
        self.router_scale = self.optional_hparam_float("moe_router_scaling_factor")
        self.norm_expert_weight = self.optional_hparam_bool("norm_expert_weight")
        self.moe_every_n = may("moe_every_n_layer") or 1
        self.leading_dense = self._leading_dense()

    def _leading_dense(self) -> int:
        """The dense layers before the first MoE layer: the smallest index of ``moe_layers_enum`` ("1,2,...")."""
        enum = self.hparams.get("moe_layers_enum")
        if not isinstance(enum, str) or not enum.strip():
            return 0
        try:
            first = min(int(item) for item in enum.strip().split(",")[:LLAMA_MAX_LAYERS + 1])
        except ValueError:
            raise CheckpointError(f"moe_layers_enum = {enum!r:.40} is not a list of layer indices",
                                  self.config_path) from None
        return self.hparam_origin("moe_layers_enum", max(0, min(first, LLAMA_MAX_LAYERS)))

    def _nested_int(self, section: dict[str, Any], key: str, default: int) -> int:
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WIDTH:
            raise CheckpointError(f"attention_other_setting.{key} = {value!r:.40} is not a head count",
                                  self.config_path)
        return self.hparam_origin(f"attention_other_setting.{key}", value)

    def _padded(self, key: str, default: Any, kind: type) -> list[Any]:
        """config.json's per-layer list ``key`` cut or padded with ``default`` to ``N + n_nextn`` entries (as
        llama.cpp's converter pads it); ``null`` entries become ``default``."""
        raw = self.hparams.get(key) or []
        if not isinstance(raw, list) or len(raw) > LLAMA_MAX_LAYERS:
            raise CheckpointError(f"{key} is not a list of at most {LLAMA_MAX_LAYERS} per-layer entries",
                                  self.config_path)
        values = []
        for item in raw[: self.n_blocks]:
            if item is None:
                item = default
            if kind is float and isinstance(item, int) and not isinstance(item, bool):
                item = float(item)
            if not isinstance(item, kind) or isinstance(item, bool):
                raise CheckpointError(f"{key} has {item!r:.40}: not a {kind.__name__}", self.config_path)
            values.append(item)
        return self.hparam_origin(key, values + [default] * (self.n_blocks - len(values)))

    # ------------------------------------------------------------------------------------ tensors

    def layer_name(self, suffix: str) -> str:
        """The name llama.cpp's converter maps: ``transformer.`` stripped, ``shared_head.output`` -> ``.head``."""
        return suffix.replace("transformer.", "", 1).replace("shared_head.output", "shared_head.head")

    def layer_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        part = PlusOneTensor.of(tensor) if self.layer_suffix(tensor).endswith("norm.weight") else tensor
        yield self.block_name(tensor), TensorSource.single(part)

    def _swa(self, offset: int) -> bool:
        return self.layer_types[self.n_layer + offset] == _SWA

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        h, d, swa = self.n_embd, self.head_dim, self._swa(block)
        n_head = self.n_head_swa if swa else self.n_head
        q, kv = n_head * d, (self.n_head_kv_swa if swa else self.n_head_kv) * d
        name = self.format_tensor_name
        shapes: dict[str, tuple[int, ...]] = {
            name(T.NEXTN_EH_PROJ): (h, 2 * h), name(T.NEXTN_ENORM): (h,), name(T.NEXTN_HNORM): (h,),
            name(T.ATTN_NORM): (h,), name(T.ATTN_Q): (q, h), name(T.ATTN_K): (kv, h), name(T.ATTN_V): (kv, h),
            name(T.ATTN_OUT): (h, q),
        }
        shapes.update(self.present_shapes(block, {"self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
                                                  "self_attn.g_proj.weight": (n_head, h)}))
        shapes[name(T.FFN_NORM)] = (h,)
        if self.has("moe.gate.weight", block):
            shapes.update(self.moe_shapes(self._need(self.n_ff_exp, "moe_intermediate_size"), self.n_ff_shexp))
        else:
            shapes.update(self.dense_ffn_shapes(self._need(self.n_ff, "intermediate_size")))
        return shapes

    def _need(self, value: int | None, key: str) -> int:
        if value is None:
            raise CheckpointError(f"config.json has no {key}, which the MTP layers need", self.config_path)
        return value

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        # The scalars llama.cpp's converter writes for step35 (conversion/step3.py), each checked already.
        super().set_gguf_parameters(writer, n_layers)
        if self.n_ff is not None:
            writer.add_feed_forward_length(self.n_ff)
        writer.add_sliding_window(self.sliding_window)
        if self.n_ff_exp is not None:
            writer.add_expert_feed_forward_length(self.n_ff_exp)
        if self.n_ff_shexp is not None:
            writer.add_expert_shared_feed_forward_length(self.n_ff_shexp)
        if self.router_scale is not None:
            writer.add_expert_weights_scale(self.router_scale)
        if self.norm_expert_weight is not None:
            writer.add_expert_weights_norm(self.norm_expert_weight)
        writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        writer.add_leading_dense_block_count(self.leading_dense)
        writer.add_moe_every_n_layers(self.moe_every_n)
        if self.rope_theta_swa is not None:
            writer.add_rope_freq_base_swa(self.rope_theta_swa)

    def _read_rope_theta(self) -> float | None:
        """``rope_theta`` may be a list: its first entry is the base, its second the sliding-window layers' base
        (what llama.cpp's converter takes, conversion/step3.py)."""
        self.rope_theta_swa: float | None = None
        theta = self.hparams.get("rope_theta")
        if not isinstance(theta, list):
            return super()._read_rope_theta()
        values = [config_float({"rope_theta": v}, "rope_theta", where=self.config_path, maximum=3.4e38)
                  for v in theta[:2]]
        if not values:
            raise CheckpointError("rope_theta is an empty list", self.config_path)
        if len(values) > 1:
            self.rope_theta_swa = self.hparam_origin("rope_theta[1]", values[1])
        return self.hparam_origin("rope_theta[0]", values[0])

    def own_layer_arrays(self) -> tuple[str, ...]:
        return (HEAD_COUNT, HEAD_COUNT_KV, SWA_PATTERN, *self.clamps)

    def _layer_values(self, layer: int) -> dict[str, Any]:
        swa = self.layer_types[layer] == _SWA
        return {
            HEAD_COUNT: self.n_head_swa if swa else self.n_head,
            HEAD_COUNT_KV: self.n_head_kv_swa if swa else self.n_head_kv,
            SWA_PATTERN: swa,
            **{suffix: values[layer] for suffix, values in self.clamps.items()},
            "feed_forward_length": self.n_ff or 0,
            "expert_used_count": self.n_expert_used,
        }

    def nextn_layer_values(self) -> dict[str, Any]:
        return self._layer_values(self.n_layer)

    def nextn_block_values(self, offset: int) -> dict[str, Any]:
        return self._layer_values(self.n_layer + offset)

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[Any]] | None:
        if n_trunk != self.n_layer:
            return None
        rows = [self._layer_values(layer) for layer in range(n_trunk)]
        return {suffix: [row[suffix] for row in rows] for suffix in self.own_layer_arrays()}

    def target_checks(self) -> list[TargetCheck]:
        # Heads differ per layer (full vs sliding attention): compared through the per-layer arrays at compose time.
        skip = {HEAD_COUNT, HEAD_COUNT_KV}
        return [c for c in super().target_checks() if c.key not in skip]
