"""MiMo-V2-Flash / V2.5 / V2.5-Pro (``MiMoV2FlashForCausalLM``, ``MiMoV2ForCausalLM``): the three MTP layers ->
three NextN blocks of ``mimo2``.

The head is ``model.mtp.layers.{0,1,2}.*``, renumbered together as ``blk.{N..N+2}`` (``N = num_hidden_layers``,
48), as llama.cpp's converter does (conversion/mimo.py); llama.cpp chains all of them, block k at
``llama_set_nextn_layer_offset(ctx, k)`` (src/models/mimo2.cpp). Each is a sliding-window decoder layer with
a fused ``qkv_proj`` (its graph requires it, :285), attention sinks, a dense MLP and ``final_layernorm``
(``layer_output_norm``), plus the NextN fusion (``enorm``, ``hnorm``, ``eh_proj``). The config does not give the
count: the layers present in the checkpoint are counted (0..k-1, contiguous); the releases have 3.

FP8 releases (block-scaled, ``ignored_layers`` left BF16) go through :mod:`.fp8`, except the fused ``qkv_proj``: a
tensor-parallel checkpoint (V2.5 with 4 ranks, V2.5-Pro with 8) stores it rank after rank, each rank's rows
``[Q_r | K_r | V_r]`` with its own ``ceil(rows_per_rank / 128)`` scale rows. As llama.cpp's ``_tp_aware_qkv_dequant``
(conversion/mimo.py) does, the rank count is found from the scale rows (8 tried first, then 4), each row
takes its rank's scale, and the rows are regrouped into ``[Q | K | V]``; here one rank's Q, K or V rows at a time
(:class:`RankRows`), never the whole tensor. An unsharded ``qkv_proj`` (``ceil(rows / 128)`` scale rows: one
rank), which llama.cpp's converter refuses ("cannot detect TP"), is dequantized as any block-scaled weight. When
both readings fit the scale rows (each rank's rows a multiple of the block), the sharded one is taken, as upstream
takes it.

Per-layer arrays as llama.cpp's converter writes them (conversion/mimo.py): ``attention.head_count_kv``
(``swa_num_key_value_heads`` for sliding-window layers, the NextN blocks included) and
``attention.sliding_window_pattern`` (``hybrid_layer_pattern`` + ``1`` per NextN block). Names come from this
module's own table: PyPI gguf 0.19.0 has no NextN entries for ``mimo2``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from gguf import MODEL_ARCH, MODEL_TENSOR, ExpertGatingFuncType, GGUFWriter

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import NamePrefix, SafetensorsTensor

from .base import HeadModel, TargetCheck
from .fp8 import FP8_DTYPES, BlockFP8, BlockScaledTensor, fp8_lut
from .hf_names import DECODER_NAMES, NEXTN_GLUE_NAMES
from .hparams import LLAMA_MAX_LAYERS
from .nextn_layer import NextNLayerModel
from .tensors import TensorSource

__all__ = ["MimoV2MTPModel", "RankRows", "qkv_rank_count"]

T = MODEL_TENSOR

#: HF name inside ``model.mtp.layers.{i}.`` -> GGUF tensor and suffix (gguf-py's tensor_mapping.py entries: the six
#: generic NextN sources, the mimo2 block, ``final_layernorm`` -> ``layer_output_norm``).
NAMES: dict[str, tuple[MODEL_TENSOR, str]] = {
    **NEXTN_GLUE_NAMES,
    # the attention is fused (qkv_proj below), without QK norm: separate q/k/v projections are refused, naming it
    **{name: entry for name, entry in DECODER_NAMES.items()
       if name.split(".")[1] not in ("q_proj", "k_proj", "v_proj", "q_norm", "k_norm")},
    "self_attn.qkv_proj.weight": (T.ATTN_QKV, ".weight"),
    "self_attn.attention_sink_bias": (T.ATTN_SINKS, ".weight"),
    "final_layernorm.weight": (T.LAYER_OUT_NORM, ".weight"),
}
PREFIX = "model.mtp.layers."
_QKV = "self_attn.qkv_proj.weight"
#: The tensor-parallel rank counts llama.cpp's converter recognises, in the order it tries them.
TP_RANKS = (8, 4)
HEAD_COUNT_KV, SWA_PATTERN = "attention.head_count_kv", "attention.sliding_window_pattern"


def qkv_rank_count(scale_rows: int, rows: int, block: int) -> int | None:
    """How many tensor-parallel ranks a fused ``qkv_proj`` of ``rows`` rows was saved with, from its scale rows:
    ``tp`` when they are ``tp * ceil(rows / tp / block)`` (8 tried first, then 4, as llama.cpp's converter tries
    them), 1 when they are ``ceil(rows / block)`` (unsharded), ``None`` for neither."""
    for tp in TP_RANKS:
        if rows % tp == 0 and scale_rows == tp * math.ceil(rows // tp / block):
            return tp
    return 1 if scale_rows == math.ceil(rows / block) else None


@dataclass(frozen=True)
class RankRows(BlockScaledTensor):
    """A run of rows of a tensor-parallel fused FP8 weight, dequantized with its rank's scales: row ``j`` of the run
    takes scale row ``rank_block + (rank_row + j) // block_rows`` (``rank_block``: the rank's first scale row,
    ``rank_row``: the run's first row within its rank)."""

    rank_block: int = 0
    rank_row: int = 0

    def read_rows(self, fd: int, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        raw = SafetensorsTensor.read_rows(self, fd, start, count, None).reshape(count, self.row_size)
        assert self.scale is not None and self.block is not None
        scale = self.scale.numpy()
        if self.scale.dtype == "BF16":
            scale = (scale.astype(np.uint32) << 16).view(np.float32)
        scale = np.asarray(scale, dtype=np.float32)
        b0, b1 = self.block
        per_row = scale[self.rank_block + (self.rank_row + np.arange(start, start + count)) // b0]
        scaled: np.ndarray = fp8_lut(self.dtype)[raw] * np.repeat(per_row, b1, axis=1)[:, : self.row_size]
        return scaled


@dataclass(frozen=True)
class RegroupedQKV(BlockScaledTensor):
    """A fused FP8 ``qkv_proj`` as the runs of rows it is written from (:class:`RankRows`, in output order)."""

    runs: tuple[RankRows, ...] = ()


@HeadModel.register("MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM")
class MimoV2MTPModel(NextNLayerModel):
    """MiMo-V2 with its MTP layers ``model.mtp.layers.{0,1,2}``: NextN decoder layers numbered on their own, all
    converted (llama.cpp chains them)."""

    model_arch = MODEL_ARCH.MIMO2
    tensor_prefix: ClassVar[NamePrefix] = PREFIX
    layer_roots = (PREFIX,)
    numbered_after_trunk = False
    layer_names = NAMES
    keep_nextn_copies = None  # the copies are converted when present, never dropped
    layer_word = "MTP"
    chained_blocks = True
    expert_pattern = None  # the MTP layers have a dense MLP
    norm_eps_keys = ("layernorm_epsilon", "rms_norm_eps")

    def read_layer_counts(self) -> None:
        """:attr:`n_layer` from config.json and :attr:`n_nextn` from the checkpoint: its MTP layers are counted
        (``model.mtp.layers.{0..k-1}``, contiguous); config.json does not state them."""
        self.n_layer = self.hparam_int("num_hidden_layers", maximum=LLAMA_MAX_LAYERS - 1,
                                       limit=f"llama.cpp loads at most {LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)")
        layers = sorted({found[0] for name in self.checkpoint.tensors if (found := self._in_layer(name)) is not None})
        if not layers:
            raise CheckpointError(f"no MTP head: no tensor name starts with {PREFIX!r} (no MTP layers in it?)",
                                  self.checkpoint.folder)
        if layers != list(range(len(layers))) or self.n_layer + len(layers) > LLAMA_MAX_LAYERS:
            shown = ", ".join(str(n) for n in layers[:6])
            raise CheckpointError(f"the MTP layers are {PREFIX}{{{shown}}}: expected 0..k-1 with at most "
                                  f"{LLAMA_MAX_LAYERS - self.n_layer} layers", self.checkpoint.folder)
        self.n_nextn = len(layers)

    def read_hparams(self) -> None:
        super().read_hparams()
        need, may = self.hparam_int, self.optional_hparam_int
        self.v_head_dim = need("v_head_dim")
        self.n_head_kv_swa = need("swa_num_key_value_heads", maximum=self.n_head)
        for key, value in (("swa_head_dim", self.head_dim), ("swa_v_head_dim", self.v_head_dim),
                           ("swa_num_attention_heads", self.n_head)):
            stated = may(key)
            if stated is not None and stated != value:  # llama.cpp's converter asserts the same
                raise CheckpointError(f"{key} = {stated} differs from the full-attention layers' {value}: llama.cpp's "
                                      "mimo2 has one head size and head count", self.config_path)
        pattern = self.hparams.get("hybrid_layer_pattern")
        if (not isinstance(pattern, list) or len(pattern) != self.n_layer
                or any(p not in (0, 1) or isinstance(p, bool) for p in pattern)):
            raise CheckpointError(f"hybrid_layer_pattern is not a list of {self.n_layer} entries 0 or 1 "
                                  "(num_hidden_layers)", self.config_path)
        self.hybrid = self.hparam_origin("hybrid_layer_pattern", list(pattern))
        self.sliding_window = need("sliding_window", maximum=2**32 - 1)
        self.n_ff = need("intermediate_size")
        self.n_ff_exp = may("moe_intermediate_size")
        self.partial_rotary = self.optional_hparam_float("partial_rotary_factor", maximum=1.0)
        self.value_scale = self.optional_hparam_float("attention_value_scale")
        self.routed_scaling_factor = self.optional_hparam_float("routed_scaling_factor")
        self.n_group = may("n_group", maximum=self.n_expert)
        self.topk_group = may("topk_group", maximum=self.n_expert)
        self.rope_theta_swa = self.optional_hparam_float("swa_rope_theta", maximum=3.4e38)

    # ------------------------------------------------------------------------------------ tensors

    def dequantize(self, head: list[SafetensorsTensor], quant: BlockFP8) -> list[SafetensorsTensor]:
        """The base's dequantization, with each FP8 fused ``qkv_proj`` read rank by rank (see the module docstring)."""
        fused = {t.name: t for t in head
                 if t.name.endswith(_QKV) and t.dtype in FP8_DTYPES and quant.block is not None}
        scales = {name + "_scale_inv" for name in fused}
        rest = super().dequantize([t for t in head if t.name not in fused and t.name not in scales], quant)
        regrouped = {name: self._regrouped_qkv(tensor, quant) for name, tensor in fused.items()}
        order = {t.name: i for i, t in enumerate(head)}
        return sorted([*rest, *regrouped.values()], key=lambda t: order[t.name])

    def _regrouped_qkv(self, weight: SafetensorsTensor, quant: BlockFP8) -> RegroupedQKV:
        assert quant.block is not None
        scale = self.checkpoint.tensors.get(weight.name + "_scale_inv")
        if scale is None:
            raise CheckpointError(f"FP8 tensor {weight.name!r} has no {weight.name}_scale_inv", weight.path)
        b0, b1 = quant.block
        rows, cols = weight.shape if len(weight.shape) == 2 else (0, 0)
        q, k, v = self.n_head * self.head_dim, self.n_head_kv_swa * self.head_dim, self.n_head_kv_swa * self.v_head_dim
        tp = qkv_rank_count(scale.shape[0], rows, b0) if len(scale.shape) == 2 else None
        if (rows != q + k + v or tp is None or scale.dtype not in ("F32", "BF16")
                or scale.shape[1] != math.ceil(cols / b1) or q % tp or k % tp or v % tp):
            raise CheckpointError(
                f"{scale.name} is {scale.dtype} {list(scale.shape)}: {weight.name} {list(weight.shape)} (q+k+v = "
                f"{q + k + v} rows) in blocks of {[b0, b1]} needs {math.ceil(rows / b0)} scale rows unsharded or "
                f"tp * ceil(rows / tp / {b0}) for {' or '.join(map(str, TP_RANKS))} tensor-parallel ranks",
                scale.path)
        per_rank, blocks_per_rank = rows // tp, math.ceil(rows // tp / b0)
        row_bytes = weight.nbytes // rows  # FP8: one byte per value
        runs = []
        for start_in_rank, count in ((0, q // tp), (q // tp, k // tp), ((q + k) // tp, v // tp)):
            for rank in range(tp):
                first = rank * per_rank + start_in_rank
                runs.append(RankRows(f"{weight.name}[rank {rank}]", weight.dtype, (count, cols), weight.path,
                                     weight.offset + first * row_bytes, count * row_bytes, scale=scale,
                                     block=quant.block, rank_block=rank * blocks_per_rank, rank_row=start_in_rank))
        return RegroupedQKV(weight.name, weight.dtype, weight.shape, weight.path, weight.offset, weight.nbytes,
                            scale=scale, block=quant.block, runs=tuple(runs))

    def layer_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        if isinstance(tensor, RegroupedQKV):
            yield self.block_name(tensor), TensorSource(tuple(tensor.runs), tensor.shape)
        else:
            yield from super().layer_tensors(tensor)

    def unmapped_hint(self, suffix: str) -> str:
        return " (llama.cpp's mimo2 MTP graph needs a fused qkv_proj)" if "_proj" in suffix else ""

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        # One block in the order llama.cpp's converter writes it: the fusion, the attention, what this layer has
        # of the sinks, the output norm and the head's own embedding, norm and LM head, then the dense MLP.
        h, d, vd, f = self.n_embd, self.head_dim, self.v_head_dim, self.n_ff
        q, kv_rows = self.n_head * d, self.n_head_kv_swa * (d + vd)
        name = self.format_tensor_name
        shapes: dict[str, tuple[int, ...]] = {
            name(T.NEXTN_EH_PROJ): (h, 2 * h), name(T.NEXTN_ENORM): (h,), name(T.NEXTN_HNORM): (h,),
            name(T.ATTN_NORM): (h,), name(T.ATTN_QKV): (q + kv_rows, h), name(T.ATTN_OUT): (h, self.n_head * vd),
        }
        shapes.update(self.present_shapes(block, {"self_attn.attention_sink_bias": (self.n_head,),
                                                  "final_layernorm.weight": (h,)}))
        shapes.update({name(T.FFN_NORM): (h,), name(T.FFN_GATE): (f, h), name(T.FFN_UP): (f, h),
                       name(T.FFN_DOWN): (h, f)})
        return shapes

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        # The scalars llama.cpp's converter writes for mimo2 (conversion/mimo.py), each checked already.
        super().set_gguf_parameters(writer, n_layers)
        writer.add_feed_forward_length(self.n_ff)
        writer.add_value_length(self.v_head_dim)
        writer.add_sliding_window(self.sliding_window)
        if self.n_ff_exp is not None:
            writer.add_expert_feed_forward_length(self.n_ff_exp)
        writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        if self.routed_scaling_factor is not None:
            writer.add_expert_weights_scale(self.routed_scaling_factor)
        if self.n_group is not None:
            writer.add_expert_group_count(self.n_group)
        if self.topk_group is not None:
            writer.add_expert_group_used_count(self.topk_group)
        if self.rope_theta_swa is not None:
            writer.add_rope_freq_base_swa(self.rope_theta_swa)
        if self.partial_rotary is not None:
            writer.add_rope_dimension_count(int(self.head_dim * self.partial_rotary))
        if self.value_scale is not None:
            # gguf-py 0.19.0 has no add_attn_value_scale: the key llama.cpp's gguf-py writes (constants.py)
            writer.add_float32(f"{self.arch}.attention.value_scale", self.value_scale)

    def own_layer_arrays(self) -> tuple[str, ...]:
        return (HEAD_COUNT_KV, SWA_PATTERN)

    def nextn_layer_values(self) -> dict[str, Any]:
        # The NextN blocks are sliding-window blocks (conversion/mimo.py appends [1] * n_nextn).
        return {HEAD_COUNT_KV: self.n_head_kv_swa, SWA_PATTERN: 1, "attention.head_count": self.n_head,
                "feed_forward_length": self.n_ff, "expert_used_count": self.n_expert_used}

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[Any]] | None:
        if n_trunk != self.n_layer:
            return None
        return {HEAD_COUNT_KV: [self.n_head_kv_swa if swa else self.n_head_kv for swa in self.hybrid],
                SWA_PATTERN: list(self.hybrid)}

    def target_checks(self) -> list[TargetCheck]:
        # head_count_kv differs per layer (full vs sliding attention): compared through the arrays at compose time.
        return [*(c for c in super().target_checks() if c.key != HEAD_COUNT_KV),
                TargetCheck("attention.value_length", self.v_head_dim, "v_head_dim")]
