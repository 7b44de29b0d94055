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

import re
from collections.abc import Iterable
from typing import Any, ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, ExpertGatingFuncType, GGUFWriter, get_tensor_name_map

from gguf_mtp.errors import CheckpointError

from .base import EXPERT_LIMIT, LLAMA_MAX_EXPERTS, LLAMA_MAX_LAYERS, HeadModel, TargetCheck, TensorSource
from .safetensors_io import Checkpoint, SafetensorsTensor

T = MODEL_TENSOR

#: The NextN layer's own copies of the embedding and the LM head (GLM-4.5 ships them, GLM-4.6 does not).
NEXTN_COPIES = (T.NEXTN_EMBED_TOKENS, T.NEXTN_SHARED_HEAD_HEAD)
#: At most 6 digits: an index is bounded before int() sees it (LLAMA_MAX_EXPERTS is far below 10^6).
_EXPERT = re.compile(
    r"^model\.layers\.[0-9]+\.mlp\.experts\.(?P<expert>[0-9]{1,6})\.(?P<proj>gate|up|down)_proj\.weight$")


@HeadModel.register("Glm4MoeForCausalLM")
class Glm4MoeMTPModel(HeadModel):
    """GLM-4.5-family MoE with its NextN layer (``num_nextn_predict_layers: 1``)."""

    model_arch = MODEL_ARCH.GLM4_MOE
    #: What ``convert`` opens the checkpoint with before it knows ``N`` (see :meth:`head_prefix`); each
    #: instance narrows it to ``model.layers.{N}.``.
    tensor_prefix: ClassVar[str] = "model.layers."
    #: Keep GLM-4.5's ``embed_tokens`` / ``shared_head.head`` copies in the NextN block (llama.cpp's
    #: converter does); ``False`` drops them (about 1.5 GB each for GLM-4.5) and llama.cpp uses the trunk's.
    keep_nextn_copies: ClassVar[bool] = True
    expert_pattern = _EXPERT
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {
        "down": T.FFN_DOWN_EXP, "gate": T.FFN_GATE_EXP, "up": T.FFN_UP_EXP}

    @classmethod
    def head_prefix(cls, config: dict[str, Any]) -> str:
        """The name prefix of the head's tensors for a ``config.json``: ``model.layers.{num_hidden_layers}.``
        (what to download from the Hub and open, so only the shard(s) of the NextN layer are read)."""
        n_layer = config.get("num_hidden_layers")
        if isinstance(n_layer, bool) or not isinstance(n_layer, int) or not 1 <= n_layer < LLAMA_MAX_LAYERS:
            return cls.tensor_prefix  # refused with a proper message once the model reads its config
        return f"model.layers.{n_layer}."

    def __init__(self, checkpoint: Checkpoint, *, keep_nextn_copies: bool | None = None) -> None:
        super().__init__(checkpoint)
        self.keep_copies = self.keep_nextn_copies if keep_nextn_copies is None else keep_nextn_copies
        self._read_hparams()
        # gguf-py's name table for a model of N + 1 blocks maps model.layers.N.* to blk.N.*.
        self._tensor_map = get_tensor_name_map(self.model_arch, self.n_layer + 1)
        self._present = {name for name in checkpoint.tensors if name.startswith(self.tensor_prefix)}

    def _read_hparams(self) -> None:
        """Every hyperparameter the converter uses, type- and range-checked once, here."""
        may = self.optional_hparam_int
        n_nextn = may("num_nextn_predict_layers", minimum=0, maximum=LLAMA_MAX_LAYERS)
        if n_nextn is not None and n_nextn != 1:
            what = "the checkpoint has no NextN layer" if n_nextn == 0 else "only one NextN block is supported"
            raise CheckpointError(f"num_nextn_predict_layers = {n_nextn}: {what}", self.config_path)
        self.n_layer = self.hparam_int("num_hidden_layers", maximum=LLAMA_MAX_LAYERS - 1,
                                       limit=f"llama.cpp loads at most {LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)")
        self.tensor_prefix = f"model.layers.{self.n_layer}."  # type: ignore[misc]  # per instance
        self.read_common_hparams()
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

    def _block_name(self, hf_name: str, tensor: SafetensorsTensor) -> str:
        """gguf-py's GGUF name of an HF tensor of the NextN layer, with ``{bid}`` for the block index."""
        if hf_name.endswith("e_score_correction_bias"):  # llama.cpp's converter renames it the same way
            hf_name = hf_name[: -len("_bias")] + ".bias"
        name = self._tensor_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        block = f"blk.{self.n_layer}."
        if name is None or not name.startswith(block):
            raise CheckpointError(f"cannot map tensor {tensor.name!r} to a llama.cpp NextN tensor", tensor.path)
        return "blk.{bid}." + name[len(block) :]

    def modify_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        stacked = self.stack_expert(tensor)
        if stacked is not None:
            yield from stacked
            return
        name = self._block_name(tensor.name, tensor)
        if not self.keep_copies and name in self._copy_names():
            return
        yield name, TensorSource.single(tensor)

    def _copy_names(self) -> tuple[str, ...]:
        return tuple(self.format_tensor_name(key) for key in NEXTN_COPIES)

    def _has(self, suffix: str) -> bool:
        return self.tensor_prefix + suffix in self._present

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        h, q, kv, d = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim, self.head_dim
        e, f, s = self.n_expert, self.n_ff_exp, self.n_ff_exp * self.n_shared
        name = self.format_tensor_name
        shapes: dict[str, tuple[int, ...]] = {
            name(T.NEXTN_EH_PROJ): (h, 2 * h),
            name(T.NEXTN_ENORM): (h,),
            name(T.NEXTN_HNORM): (h,),
            name(T.ATTN_NORM): (h,),
            name(T.ATTN_Q): (q, h),
            name(T.ATTN_K): (kv, h),
            name(T.ATTN_V): (kv, h),
        }
        # q/k/v biases: stated by attention_bias (true for every GLM-4.5-family model), else as present.
        if self.attention_bias or (self.attention_bias is None and self._has("self_attn.q_proj.bias")):
            shapes.update({name(T.ATTN_Q, ".bias"): (q,), name(T.ATTN_K, ".bias"): (kv,),
                           name(T.ATTN_V, ".bias"): (kv,)})
        shapes[name(T.ATTN_OUT)] = (h, q)
        # QK norm: GLM-4.5/4.6/4.7 (355B) have it, GLM-4.5-Air does not.
        if self.use_qk_norm or (self.use_qk_norm is None and self._has("self_attn.q_norm.weight")):
            shapes.update({name(T.ATTN_Q_NORM): (d,), name(T.ATTN_K_NORM): (d,)})
        shapes.update({
            name(T.ATTN_POST_NORM): (h,),
            name(T.FFN_GATE_INP): (e, h),
            name(T.FFN_EXP_PROBS_B, ".bias"): (e,),
            name(T.FFN_GATE_EXP): (e, f, h),
            name(T.FFN_UP_EXP): (e, f, h),
            name(T.FFN_DOWN_EXP): (e, h, f),
        })
        if self.n_shared:
            shapes.update({name(T.FFN_GATE_SHEXP): (s, h), name(T.FFN_UP_SHEXP): (s, h),
                           name(T.FFN_DOWN_SHEXP): (h, s)})
        # Optional in llama.cpp's loader: each is written when the checkpoint has it.
        if self._has("shared_head.norm.weight"):
            shapes[name(T.NEXTN_SHARED_HEAD_NORM)] = (h,)
        if self.keep_copies:
            rows = self.vocab_size
            for key, suffix in ((T.NEXTN_EMBED_TOKENS, "embed_tokens.weight"),
                                (T.NEXTN_SHARED_HEAD_HEAD, "shared_head.head.weight")):
                if self._has(suffix):
                    tensor = self.checkpoint.tensors[self.tensor_prefix + suffix]
                    shapes[name(key)] = (rows if rows is not None else tensor.shape[0], h)
        return shapes

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
        # For a target that states one of these per layer anyway: the NextN block is a MoE block.
        return {
            "attention.head_count": self.n_head,
            "attention.head_count_kv": self.n_head_kv,
            "expert_used_count": self.n_expert_used,
            "expert_feed_forward_length": self.n_ff_exp,
            **({"feed_forward_length": self.n_ff} if self.n_ff is not None else {}),
        }

    def target_checks(self) -> list[TargetCheck]:
        return [
            TargetCheck("block_count", self.n_layer, "num_hidden_layers"),
            *super().target_checks(),
            TargetCheck("expert_feed_forward_length", self.n_ff_exp, "moe_intermediate_size"),
            TargetCheck("expert_shared_count", self.n_shared, "n_shared_experts"),
        ]
