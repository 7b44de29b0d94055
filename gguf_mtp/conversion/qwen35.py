"""Qwen3.5 / Qwen3.6 (dense ``qwen35``, MoE ``qwen35moe``) and Qwen3-Next (``qwen3next``): the ``mtp.*`` head ->
one NextN block.

The checkpoints keep the head under top-level ``mtp.*`` names, also when the trunk is
``model.language_model.*`` (the ``...ForConditionalGeneration`` layout, whose text hyperparameters sit in
``text_config``). llama.cpp's converter (``conversion/qwen.py``, ``_QwenMtpMixin``) renames the head to
``model.layers.{num_hidden_layers}.*`` and maps it like a full-attention trunk layer; this module does the
same with its own table (:data:`_GLUE`, :data:`_LAYER`), because PyPI gguf 0.19.0's ``TensorNameMap`` has no
NextN entries for these architectures (its ``MODEL_TENSOR`` members and global ``TENSOR_NAMES`` are used).

Transforms, as upstream does them:

* RMSNorm ``+1``: Qwen's RMSNorm multiplies by ``1 + weight``; llama.cpp's converter bakes the ``+1`` into every
  ``*norm.weight`` of the head (after the rename, so ``enorm``, ``hnorm``, ``shared_head.norm``, ``attn_norm``,
  ``post_attention_norm``, ``q_norm``, ``k_norm``), in float32, and writes the norms F32. Here it is streamed per
  tensor (:class:`PlusOneTensor`).
* a packed ``mlp.experts.gate_up_proj`` ``[E, 2F, H]`` is split on dim -2: rows ``0..F`` of each expert are the
  gate, ``F..2F`` the up projection. Each half of each expert is a contiguous byte range of the checkpoint, so
  BF16 stays a kernel copy; ``mlp.experts.down_proj`` ``[E, H, F]`` is already ``ffn_down_exps``.
* per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight`` are stacked expert after expert.
* ``ffn_gate_inp`` and ``ffn_gate_inp_shexp`` (the shared expert's gate ``[1, H]``) are F32, llama.cpp's rule.

The per-layer array llama.cpp reads for the NextN block is ``{arch}.attention.recurrent_layers`` (exact length
``block_count``); the NextN entry is ``false``. Without that array ``full_attention_interval`` already classifies
the NextN block as attention (``is_recr`` needs ``il < n_layer()``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
from gguf import MODEL_ARCH, MODEL_TENSOR, GGMLQuantizationType, GGUFValueType, GGUFWriter

from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.safetensors_io import SAFETENSORS_DTYPES, SafetensorsTensor
from gguf_mtp.model.blocks import layer_array, per_layer_keys
from gguf_mtp.model.shards import ShardSet

from .base import HeadModel, TargetCheck, TensorKey
from .hparams import LLAMA_MAX_LAYERS
from .mtp_module import MTPModuleModel
from .tensors import TensorSource

__all__ = ["PlusOneTensor", "Qwen3NextMTPModel", "Qwen35MTPModel", "Qwen35MoeMTPModel"]

T = MODEL_TENSOR
Q = GGMLQuantizationType

#: The one per-layer array of these architectures (bool, exact length block_count).
RECURRENT = "attention.recurrent_layers"

#: ``mtp.X`` -> (gguf-py tensor, norm: gets ``+1``). Upstream's rename: fc -> eh_proj, pre_fc_norm_embedding ->
#: enorm, pre_fc_norm_hidden -> hnorm, norm -> shared_head.norm (conversion/qwen.py, _QwenMtpMixin).
_GLUE: dict[str, tuple[MODEL_TENSOR, bool]] = {
    "mtp.fc.weight": (T.NEXTN_EH_PROJ, False),
    "mtp.pre_fc_norm_embedding.weight": (T.NEXTN_ENORM, True),
    "mtp.pre_fc_norm_hidden.weight": (T.NEXTN_HNORM, True),
    "mtp.norm.weight": (T.NEXTN_SHARED_HEAD_NORM, True),
}
#: ``mtp.layers.0.X`` -> (gguf-py tensor, norm: gets ``+1``): a full-attention decoder layer.
_LAYER: dict[str, tuple[MODEL_TENSOR, bool]] = {
    "input_layernorm.weight": (T.ATTN_NORM, True),
    "post_attention_layernorm.weight": (T.ATTN_POST_NORM, True),
    "self_attn.q_proj.weight": (T.ATTN_Q, False),  # query and output gate together: 2 * n_head * head_dim rows
    "self_attn.k_proj.weight": (T.ATTN_K, False),
    "self_attn.v_proj.weight": (T.ATTN_V, False),
    "self_attn.o_proj.weight": (T.ATTN_OUT, False),
    "self_attn.q_norm.weight": (T.ATTN_Q_NORM, True),
    "self_attn.k_norm.weight": (T.ATTN_K_NORM, True),
    # dense FFN (qwen35)
    "mlp.gate_proj.weight": (T.FFN_GATE, False),
    "mlp.up_proj.weight": (T.FFN_UP, False),
    "mlp.down_proj.weight": (T.FFN_DOWN, False),
    # MoE (qwen35moe, qwen3next)
    "mlp.gate.weight": (T.FFN_GATE_INP, False),
    "mlp.experts.down_proj": (T.FFN_DOWN_EXP, False),
    "mlp.experts.down_proj.weight": (T.FFN_DOWN_EXP, False),
    "mlp.shared_expert.gate_proj.weight": (T.FFN_GATE_SHEXP, False),
    "mlp.shared_expert.up_proj.weight": (T.FFN_UP_SHEXP, False),
    "mlp.shared_expert.down_proj.weight": (T.FFN_DOWN_SHEXP, False),
    "mlp.shared_expert_gate.weight": (T.FFN_GATE_INP_SHEXP, False),
}
_PACKED_GATE_UP = ("mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj.weight")
# At most 6 digits: an index is bounded before int() sees it (LLAMA_MAX_EXPERTS is far below 10^6).
_EXPERT = re.compile(
    r"^mtp\.layers\.[0-9]{1,6}\.mlp\.experts\.(?P<expert>[0-9]{1,6})\.(?P<proj>gate|up|down)_proj\.weight$")
_LAYER_PREFIX = re.compile(r"^mtp\.layers\.(?P<layer>[0-9]{1,6})\.(?P<rest>.+)$")

#: The layer kinds of ``layer_types`` (transformers' names for Gated DeltaNet and gated attention layers).
_LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class PlusOneTensor(SafetensorsTensor):
    """A norm weight read as ``float32(stored) + 1`` (Qwen's ``1 + weight`` RMSNorm, baked in as llama.cpp's
    converter does). ``dtype`` is ``"<stored>+1"`` (``"BF16+1"``), so it is never copied as is and reports say
    what it is; the rows come back as float32, which the base class writes as F32."""

    stored: str = "BF16"

    @classmethod
    def of(cls, tensor: SafetensorsTensor) -> PlusOneTensor:
        return cls(tensor.name, f"{tensor.dtype}+1", tensor.shape, tensor.path, tensor.offset, tensor.nbytes,
                   stored=tensor.dtype)

    @property
    def numpy_dtype(self) -> np.dtype:
        return SAFETENSORS_DTYPES[self.stored]

    def numpy(self) -> np.ndarray:
        """The transformed values, float32 (the tensor is a norm: small)."""
        return self._plus_one(super().numpy())

    def read_rows(self, fd: int, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        return self._plus_one(super().read_rows(fd, start, count, None))

    def _plus_one(self, raw: np.ndarray) -> np.ndarray:
        bf16 = self.stored == "BF16"
        values = (raw.astype(np.uint32) << 16).view(np.float32) if bf16 else raw.astype(np.float32)
        plus_one: np.ndarray = values + np.float32(1)
        return plus_one


def _expert_half(tensor: SafetensorsTensor, expert: int, half: int, n_ff: int) -> SafetensorsTensor:
    """Rows ``half*F .. half*F+F`` of expert ``expert`` of a packed ``[E, 2F, H]`` tensor, as a byte range."""
    row_bytes = tensor.shape[-1] * SAFETENSORS_DTYPES[tensor.dtype].itemsize
    first_row = (2 * expert + half) * n_ff
    what = "gate" if half == 0 else "up"
    return replace(tensor, name=f"{tensor.name}[{expert}].{what}", shape=(n_ff, tensor.shape[-1]),
                   offset=tensor.offset + first_row * row_bytes, nbytes=n_ff * row_bytes)


#: Every renamed tensor of the head (``mtp.layers.0.`` the one layer: others are refused first) -> (gguf-py tensor,
#: GGUF suffix); and those that get ``+1``.
_NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    **{name: (key, ".weight") for name, (key, _) in _GLUE.items()},
    **{f"mtp.layers.0.{name}": (key, ".weight") for name, (key, _) in _LAYER.items()},
}
_PLUS_ONE = frozenset({name for name, (_, norm) in _GLUE.items() if norm}
                      | {f"mtp.layers.0.{name}" for name, (_, norm) in _LAYER.items() if norm})


class _QwenMTPModel(MTPModuleModel):
    """What the three Qwen MTP heads share (the head is a full-attention block of the trunk's kind)."""

    #: The FFN of the NextN block: "dense" (qwen35) or "moe".
    ffn: ClassVar[str] = "moe"
    default_norm_eps = 1e-6
    module_names: ClassVar[Mapping[str, tuple[TensorKey, str]]] = _NAMES
    #: The checkpoint names of the norms that get ``+1`` (:class:`PlusOneTensor`).
    plus_one: ClassVar[frozenset[str]] = _PLUS_ONE
    expert_pattern = _EXPERT
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {
        "gate": T.FFN_GATE_EXP, "up": T.FFN_UP_EXP, "down": T.FFN_DOWN_EXP}

    nested_text_config = True  # the ConditionalGeneration layout nests the text model's hyperparameters

    def read_hparams(self) -> None:
        n_mtp = self.optional_hparam_int(["mtp_num_hidden_layers", "num_nextn_predict_layers"], minimum=0,
                                         maximum=LLAMA_MAX_LAYERS)
        layers = {m["layer"] for t in self.checkpoint.tensors if (m := _LAYER_PREFIX.match(t)) is not None}
        if n_mtp == 0:
            key = next(k for k in ("mtp_num_hidden_layers", "num_nextn_predict_layers") if self.hparams.get(k) == 0)
            raise CheckpointError(f"{key} = 0: the checkpoint states it has no MTP layer", self.config_path)
        if n_mtp is None:
            n_mtp = len(layers)  # Qwen3-Next and the first Qwen3.6 configs do not state it: count (as upstream)
        if n_mtp > 1 or len(layers) > 1:
            raise CheckpointError(f"the MTP head has {max(n_mtp, len(layers))} layers: llama.cpp's {self.arch} "
                                  "runs one NextN block", self.config_path)
        if layers and layers != {"0"}:
            raise CheckpointError(f"the MTP head's layer is mtp.layers.{next(iter(layers))}, expected "
                                  "mtp.layers.0", self.config_path)
        super().read_hparams()
        may = self.optional_hparam_int
        self.n_layer = may("num_hidden_layers", maximum=LLAMA_MAX_LAYERS - 1)
        self.interval = may("full_attention_interval", maximum=LLAMA_MAX_LAYERS)
        self.ssm_conv = may("linear_conv_kernel_dim", maximum=1024)
        self.ssm_state = may("linear_key_head_dim")
        self.ssm_groups = may("linear_num_key_heads")
        self.ssm_v_heads = may("linear_num_value_heads")
        self.ssm_v_dim = may("linear_value_head_dim")
        if self.ffn == "dense":
            self.n_ff = self.hparam_int("intermediate_size")
        else:
            self.n_ff_exp = self.hparam_int("moe_intermediate_size")
            self.n_ff_shexp = self.hparam_int("shared_expert_intermediate_size")
            self.norm_topk_prob = self.optional_hparam_bool("norm_topk_prob")
        if self.ssm_v_heads is not None and self.ssm_v_dim is not None:
            self.hparam_origin("linear_num_value_heads x linear_value_head_dim", self.ssm_v_heads * self.ssm_v_dim)
        self.layer_types = self._read_layer_types()
        rope = self.hparams.get("rope_parameters")
        rope = rope if isinstance(rope, dict) else {}
        factor = rope.get("partial_rotary_factor", self.hparams.get("partial_rotary_factor", 0.25))
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise CheckpointError(f"partial_rotary_factor = {factor!r} is not a number in (0, 1]", self.config_path)
        self.rope_dims = int(self.head_dim * factor)
        sections = rope.get("mrope_section")
        self.mrope_sections: list[int] | None = None
        if sections is not None:
            if not isinstance(sections, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                                         for s in sections[:4]):
                raise CheckpointError(f"rope_parameters.mrope_section = {sections!r:.40} is not a list of integers",
                                      self.config_path)
            self.mrope_sections = self.hparam_origin("rope_parameters.mrope_section",
                                                     [*sections, *[0] * (4 - len(sections))][:4])

    def _read_layer_types(self) -> list[str] | None:
        """``layer_types`` (one ``linear_attention`` / ``full_attention`` per trunk layer), when config.json has it.

        Raises:
            CheckpointError: not a list of those two words.
        """
        layer_types = self.hparams.get("layer_types")
        if layer_types is None:
            return None
        if not isinstance(layer_types, list) or len(layer_types) > LLAMA_MAX_LAYERS:
            raise CheckpointError(f"layer_types is not a list of at most {LLAMA_MAX_LAYERS} layer kinds",
                                  self.config_path)
        unknown = next((t for t in layer_types if t not in _LAYER_TYPES), None)
        if unknown is not None:
            raise CheckpointError(f"layer_types holds {unknown!r:.40}: expected {' or '.join(_LAYER_TYPES)}",
                                  self.config_path)
        return layer_types

    def default_block(self) -> int | None:
        """The NextN block index when neither a target nor ``--block`` gives it: ``num_hidden_layers`` (the head
        follows the trunk; Qwen3.6-35B-A3B: 40)."""
        return self.n_layer

    # ------------------------------------------------------------------------------------ tensors

    def stored(self, tensor: SafetensorsTensor) -> SafetensorsTensor:
        return PlusOneTensor.of(tensor) if tensor.name in self.plus_one else tensor

    def other_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        layer = _LAYER_PREFIX.match(tensor.name)
        if layer is None or layer["rest"] not in _PACKED_GATE_UP:
            return super().other_tensors(tensor)
        return self._split_gate_up(tensor)

    def _split_gate_up(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        if self.ffn != "moe":
            raise CheckpointError(f"{tensor.name}: a packed expert tensor in a dense {self.arch} head", tensor.path)
        e, f, h = self.n_expert, self.n_ff_exp, self.n_embd
        if tensor.shape != (e, 2 * f, h):
            raise CheckpointError(f"{tensor.name} has shape {list(tensor.shape)}, config.json implies "
                                  f"{[e, 2 * f, h]} (num_experts, 2 x moe_intermediate_size, hidden_size)",
                                  tensor.path)
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"tensor {tensor.name!r} is {tensor.dtype}: not a float dtype", tensor.path)
        for half, key in enumerate((T.FFN_GATE_EXP, T.FFN_UP_EXP)):
            parts = [_expert_half(tensor, expert, half, f) for expert in range(e)]
            yield self.format_tensor_name(key), TensorSource.stack(parts)

    def gated_attention_shapes(self) -> dict[str, tuple[int, ...]]:
        """The head layer's full attention: Q with its output gate (twice the query rows), K, V, the output and the
        per-head Q/K norms (every Qwen head; the layer norms around it are the family's own)."""
        h, q, kv, d = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim, self.head_dim
        name = self.format_tensor_name
        return {name(T.ATTN_Q): (2 * q, h), name(T.ATTN_K): (kv, h), name(T.ATTN_V): (kv, h),
                name(T.ATTN_OUT): (h, q), name(T.ATTN_Q_NORM): (d,), name(T.ATTN_K_NORM): (d,)}

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        h = self.n_embd
        name = self.format_tensor_name
        shapes: dict[str, tuple[int, ...]] = {
            name(T.NEXTN_EH_PROJ): (h, 2 * h),
            name(T.NEXTN_ENORM): (h,),
            name(T.NEXTN_HNORM): (h,),
            name(T.ATTN_NORM): (h,),
            **self.gated_attention_shapes(),
            name(T.ATTN_POST_NORM): (h,),
        }
        if self.ffn == "dense":
            shapes |= self.dense_ffn_shapes(self.n_ff)
        else:  # the router, the experts, the shared expert with its own gate
            shapes |= {**self.router_shapes(probs_bias=None), **self.expert_shapes(self.n_ff_exp),
                       name(T.FFN_GATE_INP_SHEXP): (1, h), **self.shared_expert_shapes(self.n_ff_shexp)}
        shapes[name(T.NEXTN_SHARED_HEAD_NORM)] = (h,)
        return shapes

    def output_type(self, name: str, source: TensorSource, outtype: GGMLQuantizationType | None
                    ) -> GGMLQuantizationType:
        # llama.cpp's converter keeps the shared expert's gate F32 as well as the router.
        if name == self.format_tensor_name(T.FFN_GATE_INP_SHEXP):
            return Q.F32
        return super().output_type(name, source, outtype)

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        super().set_gguf_parameters(writer, n_layers)
        writer.add_rope_dimension_count(self.rope_dims)
        if self.ffn == "dense":
            writer.add_feed_forward_length(self.n_ff)
        else:
            writer.add_expert_feed_forward_length(self.n_ff_exp)
            writer.add_expert_shared_feed_forward_length(self.n_ff_shexp)
        if self.ssm_conv is not None:
            writer.add_ssm_conv_kernel(self.ssm_conv)
        if self.ssm_state is not None:
            writer.add_ssm_state_size(self.ssm_state)
        if self.ssm_groups is not None:
            writer.add_ssm_group_count(self.ssm_groups)
        if self.ssm_v_heads is not None:
            writer.add_ssm_time_step_rank(self.ssm_v_heads)
            if self.ssm_v_dim is not None:
                writer.add_ssm_inner_size(self.ssm_v_heads * self.ssm_v_dim)
        writer.add_full_attention_interval(self.interval if self.interval is not None else 4)
        self.add_rope_sections(writer)

    def add_rope_sections(self, writer: GGUFWriter) -> None:
        """Qwen3.5's multi-section RoPE (qwen35*: required by llama.cpp; upstream's default [11, 11, 10, 0])."""
        writer.add_rope_dimension_sections(self.mrope_sections or [11, 11, 10, 0])

    def own_layer_arrays(self) -> tuple[str, ...]:
        return (RECURRENT,)

    def nextn_layer_values(self) -> dict[str, int]:
        return {RECURRENT: False}

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[int]] | None:
        """The trunk's recurrence flags from ``layer_types``; when a config has none (Qwen3-Next's), the
        pattern transformers derives from ``full_attention_interval`` (what upstream's converter then sees)."""
        layer_types = self.layer_types
        if layer_types is None and self.n_layer is not None:
            interval = self.interval if self.interval is not None else 4
            layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(self.n_layer)]
        if not isinstance(layer_types, list) or len(layer_types) != n_trunk:
            return None
        return {RECURRENT: [t == "linear_attention" for t in layer_types]}

    def layer_arrays(self, block: int, target: ShardSet | None) -> dict[str, tuple[GGUFValueType, list[Any]]]:
        """``attention.recurrent_layers`` as a bool array with ``false`` for the NextN block: the target's own
        entries when it has the array (none when it has not: its ``full_attention_interval`` decides), else
        config.json's layer pattern (:meth:`trunk_layer_values`, as upstream writes it) when it describes
        ``block`` trunk blocks, else nothing.

        Raises:
            IncompatibleDraftError: the target has another per-layer array, whose NextN value is unknown here.
        """
        if target is None:
            trunk = self.trunk_layer_values(block)
            return {} if trunk is None else {RECURRENT: (GGUFValueType.BOOL, [*trunk[RECURRENT], False])}
        arrays: dict[str, tuple[GGUFValueType, list[Any]]] = {}
        for kv in per_layer_keys(target.first, self.arch, target.block_count):
            suffix = kv.key[len(self.arch) + 1 :]
            if suffix != RECURRENT:
                raise IncompatibleDraftError(
                    f"the target has a per-layer array {kv.key}, and the {self.arch} converter does not know its "
                    "value for the NextN block", target.name)
            etype, entries = layer_array(kv, target.name)
            arrays[suffix] = (etype, [*entries, False])
        return arrays

    def target_checks(self) -> list[TargetCheck]:
        if self.ffn == "dense":
            return [*super().target_checks(), TargetCheck("feed_forward_length", self.n_ff, "intermediate_size")]
        return [
            *super().target_checks(),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
            TargetCheck("expert_shared_feed_forward_length", self.n_ff_shexp, "shared_expert_intermediate_size"),
        ]


@HeadModel.register("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
class Qwen35MoeMTPModel(_QwenMTPModel):
    """Qwen3.5 / Qwen3.6 MoE (35B-A3B, 122B-A10B, 397B-A17B): gated attention + MoE with a gated shared expert."""

    model_arch = MODEL_ARCH.QWEN35MOE
    ffn = "moe"


@HeadModel.register("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
class Qwen35MTPModel(_QwenMTPModel):
    """Qwen3.5 / Qwen3.6 dense (0.8B .. 27B): gated attention + a dense SwiGLU FFN."""

    model_arch = MODEL_ARCH.QWEN35
    ffn = "dense"
    has_experts = False


@HeadModel.register("Qwen3NextForCausalLM")
class Qwen3NextMTPModel(_QwenMTPModel):
    """Qwen3-Next-80B-A3B: the NextN block is a full-attention trunk block (MoE), plus the NextN fusion."""

    model_arch = MODEL_ARCH.QWEN3NEXT
    ffn = "moe"

    def add_rope_sections(self, writer: GGUFWriter) -> None:
        """Qwen3-Next has plain (partial) RoPE: no sections."""
