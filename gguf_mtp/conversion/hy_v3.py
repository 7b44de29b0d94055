"""Tencent Hy3 (``HYV3ForCausalLM``): the MTP layer(s) -> NextN block(s) of ``hy_v3``.

The head is the checkpoint's extra decoder layer(s) ``model.layers.{N+i}.*``, ``N = num_hidden_layers`` (80 for
Hy3), one per ``num_nextn_predict_layers`` (Hy3 ships one; llama.cpp's graph runs a chain of several,
src/models/hy-v3.cpp:246-250, and its converter writes them all as ``blk.{N+i}``, conversion/hunyuan.py:374-381):
each an ordinary Hy3 MoE layer (QK norm, a sigmoid router ``mlp.router.gate``
with its selection bias ``mlp.expert_bias``, routed experts and the shared ``mlp.shared_mlp``) plus the NextN input
fusion (``enorm``, ``hnorm``, ``eh_proj``) and the trailing ``final_layernorm``, which llama.cpp's converter renames
to ``shared_head.norm`` (conversion/hunyuan.py:425-428) and its loader reads as ``nextn.shared_head_norm``
(src/models/hy-v3.cpp:92-95). The checkpoint has no MTP embedding or LM head of its own (hy-v3.cpp:236-238).

Names come from one table (:data:`_NAMES`), the HF spellings llama.cpp's ``TensorNameMap`` maps for
this architecture (PyPI gguf 0.19.0 has no ``hy_v3``); the GGUF names are gguf-py's global ``TENSOR_NAMES``. Note
llama.cpp's own spellings: ``post_attention_layernorm`` is ``ffn_norm`` here, and the selection bias is
``exp_probs_b`` without a ``.bias`` suffix (hy-v3.cpp:68). Experts are stacked one at a time, q/k copied as they are
(Hy3's RoPE is NeoX-ordered; no permutation upstream either).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, ClassVar

from gguf import MODEL_TENSOR, ExpertGatingFuncType, GGUFWriter

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import Checkpoint, SafetensorsTensor

from .base import HeadModel, TargetCheck
from .hf_names import DECODER_NAMES, NEXTN_GLUE_NAMES
from .hparams import EXPERT_LIMIT, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS
from .tensors import TensorSource

__all__ = ["HYV3MTPModel"]

T = MODEL_TENSOR

#: ``model.layers.{N}.X`` -> (gguf-py tensor, GGUF suffix): the decoder layer of a NextN block.
#: ``model.layers.{N}.X`` -> (gguf-py tensor, GGUF suffix): the decoder layer of a NextN block (the shared Llama-style
#: names, Hy3's router and shared expert) and the NextN glue around it (``final_layernorm`` is its head norm).
_NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    **DECODER_NAMES,
    "mlp.router.gate.weight": (T.FFN_GATE_INP, ".weight"),
    "mlp.expert_bias": (T.FFN_EXP_PROBS_B, ""),
    "mlp.shared_mlp.gate_proj.weight": (T.FFN_GATE_SHEXP, ".weight"),
    "mlp.shared_mlp.up_proj.weight": (T.FFN_UP_SHEXP, ".weight"),
    "mlp.shared_mlp.down_proj.weight": (T.FFN_DOWN_SHEXP, ".weight"),
    **NEXTN_GLUE_NAMES,
    "final_layernorm.weight": (T.NEXTN_SHARED_HEAD_NORM, ".weight"),
}
#: A head tensor: its layer (at most 3 digits: bounded before int() sees it) and its name within the layer.
_HEAD = re.compile(r"^model\.layers\.(?P<layer>[0-9]{1,3})\.(?P<local>.+)$")
#: At most 6 digits: an index is bounded before int() sees it (LLAMA_MAX_EXPERTS is far below 10^6).
_EXPERT = re.compile(
    r"^model\.layers\.[0-9]+\.mlp\.experts\.(?P<expert>[0-9]{1,6})\.(?P<proj>gate|up|down)_proj\.weight$")


@HeadModel.register("HYV3ForCausalLM")
class HYV3MTPModel(HeadModel):
    """Tencent Hy3 with its MTP layer(s) (``num_nextn_predict_layers``, 1 for Hy3)."""

    model_arch = "hy_v3"  # not in PyPI gguf 0.19.0's MODEL_ARCH
    #: What ``convert`` opens the checkpoint with before it knows ``N`` (see :meth:`head_prefix`).
    tensor_prefix: ClassVar[str | tuple[str, ...]] = "model.layers."
    expert_pattern = _EXPERT
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {
        "down": T.FFN_DOWN_EXP, "gate": T.FFN_GATE_EXP, "up": T.FFN_UP_EXP}

    @classmethod
    def head_prefix(cls, config: dict[str, Any]) -> str | tuple[str, ...]:
        """``model.layers.{N}.`` .. ``model.layers.{N+k-1}.`` (``N = num_hidden_layers``, ``k =
        num_nextn_predict_layers``): what to download and open (only the MTP layers' shards)."""
        n_layer, n_nextn = config.get("num_hidden_layers"), config.get("num_nextn_predict_layers", 1)
        counts = [v for v in (n_layer, n_nextn) if isinstance(v, int) and not isinstance(v, bool) and v >= 1]
        if len(counts) != 2 or sum(counts) > LLAMA_MAX_LAYERS:
            return cls.tensor_prefix  # refused with a proper message once the model reads its config
        first, count = counts
        return tuple(f"model.layers.{layer}." for layer in range(first, first + count))

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        self._read_hparams()

    def _read_hparams(self) -> None:
        """Every hyperparameter the converter uses, type- and range-checked once, here."""
        n_nextn = self.optional_hparam_int("num_nextn_predict_layers", minimum=0, maximum=LLAMA_MAX_LAYERS - 1)
        if n_nextn == 0:
            raise CheckpointError("num_nextn_predict_layers = 0: the checkpoint has no MTP layer", self.config_path)
        self.n_nextn = 1 if n_nextn is None else n_nextn
        limit = f"llama.cpp loads at most {LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)"
        self.n_layer = self.hparam_int("num_hidden_layers", maximum=LLAMA_MAX_LAYERS - self.n_nextn,
                                       limit=f"with {self.n_nextn} MTP layer(s) after them, {limit}")
        self.tensor_prefix = tuple(  # type: ignore[misc]  # per instance
            f"model.layers.{layer}." for layer in range(self.n_layer, self.n_layer + self.n_nextn))
        self.read_common_hparams()
        may = self.optional_hparam_int
        self.n_ff_exp = self.hparam_int("moe_intermediate_size")
        n_shared = may("num_shared_experts", minimum=0, maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT)
        self.n_shared = 1 if n_shared is None else n_shared
        self.n_ff = may("intermediate_size")
        self.route_norm = self.optional_hparam_bool("route_norm")
        self.router_scale = self.optional_hparam_float("router_scaling_factor")

    # ------------------------------------------------------------------------------------ tensors

    def modify_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        stacked = self.stack_expert(tensor)
        if stacked is not None:
            yield from stacked
            return
        head = _HEAD.match(tensor.name)
        entry = _NAMES.get(head["local"]) if head is not None else None
        if head is None or entry is None:
            raise CheckpointError(f"cannot map tensor {tensor.name!r} to a llama.cpp hy_v3 NextN tensor", tensor.path)
        key, suffix = entry
        yield self.format_tensor_name(key, suffix, block=self.nextn_block(tensor)), TensorSource.single(tensor)

    def nextn_block(self, tensor: SafetensorsTensor) -> int:
        """``model.layers.{N+i}.*`` is NextN block ``i`` (the head holds only those layers)."""
        head = _HEAD.match(tensor.name)
        assert head is not None
        return int(head["layer"]) - self.n_layer

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        h, q, kv, d = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim, self.head_dim
        e, f, s = self.n_expert, self.n_ff_exp, self.n_ff_exp * self.n_shared
        shapes: dict[T, tuple[int, ...]] = {
            T.NEXTN_EH_PROJ: (h, 2 * h), T.NEXTN_ENORM: (h,), T.NEXTN_HNORM: (h,),
            T.ATTN_NORM: (h,), T.ATTN_Q: (q, h), T.ATTN_K: (kv, h), T.ATTN_V: (kv, h), T.ATTN_OUT: (h, q),
            T.ATTN_Q_NORM: (d,), T.ATTN_K_NORM: (d,), T.FFN_NORM: (h,),
            T.FFN_GATE_INP: (e, h), T.FFN_EXP_PROBS_B: (e,),
            T.FFN_GATE_EXP: (e, f, h), T.FFN_UP_EXP: (e, f, h), T.FFN_DOWN_EXP: (e, h, f),
        }
        if self.n_shared:
            shapes.update({T.FFN_GATE_SHEXP: (s, h), T.FFN_UP_SHEXP: (s, h), T.FFN_DOWN_SHEXP: (h, s)})
        suffixes = {key: suffix for key, suffix in _NAMES.values()}
        expected: dict[str, tuple[int, ...]] = {}
        for block in range(self.n_nextn):
            for key, shape in shapes.items():
                expected[self.format_tensor_name(key, suffixes.get(key, ".weight"), block=block)] = shape
            # optional in llama.cpp's loader (hy-v3.cpp:95): written when the checkpoint has it, as upstream does
            if f"model.layers.{self.n_layer + block}.final_layernorm.weight" in self.checkpoint.tensors:
                expected[self.format_tensor_name(T.NEXTN_SHARED_HEAD_NORM, block=block)] = (h,)
        return expected

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        # The keys llama.cpp's converter writes for hy_v3 (conversion/hunyuan.py:390-403), every value checked.
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
            TargetCheck("block_count", self.n_layer, "num_hidden_layers"),
            *super().target_checks(),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
        ]
