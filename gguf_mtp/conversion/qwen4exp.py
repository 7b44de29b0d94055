"""Qwen3.8-Flash-Next (``qwen4exp``): the ``mtp.*`` head -> one NextN block, as llama.cpp b11434's converter
(``conversion/qwen4exp.py``, on Qwen3.5's ``_QwenMtpMixin``) exports it with ``--mtp``.

The head is Qwen3.5's (top-level ``mtp.*``, one full-attention layer at ``num_hidden_layers``, norms stored
zero-centred and written ``+1`` in F32 where 1-D or named ``*_norm``) with what qwen4exp adds:

* the fusion's projection comes in two halves, ``mtp.fc_embedding`` and ``mtp.fc_hidden``: upstream concatenates them
  along dim 1 (the embedding's columns first) into ``nextn.eh_proj`` and refuses a head with one half only;
  :class:`ColumnConcat` streams the same rows;
* ``mtp.pre_fc_norm_hidden`` holds one gamma row per hyper-connection stream (``nextn.hnorm`` ``{n_embd, hc}``): 2-D
  and not named ``*_norm``, so written in the output type after its ``+1`` (upstream's type rule);
* ``mtp.hyper_connection_mixer`` (the head's own mixer) -> ``nextn.hc_head_{norm,down,up}``, the block's
  ``{attn,mlp}_hyper_connection`` -> ``hc_{attn,ffn}_{norm,down,up,inject}`` (no ``attn_norm`` /
  ``post_attention_norm``: the hyper-connections replace every layer norm);
* the QSA indexer's one ``index_qk_proj`` is split by rows into ``indexer.q_proj`` (``indexer_n_heads x
  indexer_head_dim`` rows) and ``indexer.k_proj``; its ``q_layernorm`` / ``k_layernorm`` get ``+1`` too.

An MTP-only file carries no per-layer-embedding (PLE) table or key: the head never reads it. The per-layer arrays are
``attention.recurrent_layers`` (``false`` for the NextN block) and ``attention.compress_ratios`` (the block is a QSA
layer: ``indexer_compress_ratio``); the ``ple.*`` arrays are not per layer, whatever their length
(:mod:`gguf_mtp.model.arch_rules`). PyPI gguf 0.19.0 lacks the architecture, the new tensors and keys: their names
come from :mod:`gguf_mtp._gguf_tables`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from gguf import MODEL_TENSOR, GGMLQuantizationType, GGUFValueType, GGUFWriter

from gguf_mtp._gguf_tables import NEWER_ARCH_NAMES, NEWER_KEYS
from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import SafetensorsTensor
from gguf_mtp.model.shards import ShardSet

from .base import HeadModel, TargetCheck, TensorKey
from .qwen35 import _LAYER, RECURRENT, PlusOneTensor, _QwenMTPModel
from .tensors import FLOAT_DTYPES, TensorSource

__all__ = ["ColumnConcat", "Qwen4ExpMTPModel"]

T = MODEL_TENSOR

#: The per-layer array of the QSA compress ratio (0 for a linear-attention layer).
COMPRESS_RATIOS = NEWER_KEYS["Attention.COMPRESS_RATIOS"].removeprefix("{arch}.")

_FC_HALVES = ("mtp.fc_embedding.weight", "mtp.fc_hidden.weight")  # eh_proj's columns, in this order
_INDEXER_QK = "mtp.layers.0.self_attn.indexer.index_qk_proj.weight"

#: ``mtp.X`` -> (tensor, norm: gets ``+1``): the fusion's norms and the head's own mixer.
_GLUE: dict[str, tuple[TensorKey, bool]] = {
    "mtp.pre_fc_norm_embedding.weight": (T.NEXTN_ENORM, True),
    "mtp.pre_fc_norm_hidden.weight": (T.NEXTN_HNORM, True),
    "mtp.hyper_connection_mixer.hc_norm.weight": ("NEXTN_HC_HEAD_NORM", True),
    "mtp.hyper_connection_mixer.input_mix_weight_down.weight": ("NEXTN_HC_HEAD_DOWN", False),
    "mtp.hyper_connection_mixer.input_mix_weight_up.weight": ("NEXTN_HC_HEAD_UP", False),
}
_HYPER_CONNECTIONS: dict[str, tuple[TensorKey, bool]] = {
    f"{module}_hyper_connection.{part}.weight": (f"HC_{kind}_{tensor}", part == "hc_norm")
    for module, kind in (("attn", "ATTN"), ("mlp", "FFN"))
    for part, tensor in (("hc_norm", "NORM"), ("input_mix_weight_down", "DOWN"), ("input_mix_weight_up", "UP"),
                         ("block_inject_weight", "INJECT"))
}
#: ``mtp.layers.0.X`` -> (tensor, norm): Qwen3.5's full-attention MoE layer less its two layer norms, plus the
#: hyper-connections and the indexer's norms.
_LAYER4: dict[str, tuple[TensorKey, bool]] = {
    **{name: entry for name, entry in _LAYER.items()
       if name not in ("input_layernorm.weight", "post_attention_layernorm.weight")
       and entry[0] not in (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN)},
    **_HYPER_CONNECTIONS,
    "self_attn.indexer.q_layernorm.weight": ("INDEXER_Q_NORM", True),
    "self_attn.indexer.k_layernorm.weight": (T.INDEXER_K_NORM, True),
}
_NAMES: dict[str, tuple[TensorKey, str]] = {
    **{name: (key, ".weight") for name, (key, _) in _GLUE.items()},
    **{f"mtp.layers.0.{name}": (key, ".weight") for name, (key, _) in _LAYER4.items()},
}
_PLUS_ONE = frozenset({name for name, (_, norm) in _GLUE.items() if norm}
                      | {f"mtp.layers.0.{name}" for name, (_, norm) in _LAYER4.items() if norm})


@dataclass(frozen=True)
class ColumnConcat(SafetensorsTensor):
    """Two matrices with as many rows side by side (``torch.cat([left, right], dim=1)``), read a run of rows at a
    time: each output row is the left one's row, then the right one's. Each half is read as itself (a dequantized FP8
    half as float32), from its own file."""

    halves: tuple[SafetensorsTensor, ...] = ()
    transformed: ClassVar[bool] = True

    @classmethod
    def of(cls, left: SafetensorsTensor, right: SafetensorsTensor, name: str) -> ColumnConcat:
        rows, width = left.shape[0], left.shape[1] + right.shape[1]
        return cls(name, left.dtype, (rows, width), left.path, left.offset, left.nbytes + right.nbytes,
                   halves=(left, right))

    def numpy(self) -> np.ndarray:
        return self.read_rows(-1, 0, self.n_rows).reshape(self.shape)

    def read_rows(self, fd: int, start: int, count: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start .. start+count`` (``fd`` is not used: each half is read through its own file)."""
        parts = []
        for half in self.halves:
            half_fd = os.open(half.path, os.O_RDONLY)
            try:
                parts.append(half.read_rows(half_fd, start, count, None))
            finally:
                os.close(half_fd)
        return np.concatenate(parts, axis=1)


@HeadModel.register("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration")
class Qwen4ExpMTPModel(_QwenMTPModel):
    """Qwen3.8-Flash-Next: a full-attention QSA block with hyper-connections, MoE with a gated shared expert."""

    model_arch = NEWER_ARCH_NAMES["QWEN4EXP"]  # not in PyPI gguf 0.19.0's MODEL_ARCH
    ffn = "moe"
    module_names = _NAMES
    plus_one = _PLUS_ONE

    def read_hparams(self) -> None:
        super().read_hparams()
        self.hc = self.hparam_int("hc_count", maximum=64)
        self.hc_lowrank = self.hparam_int("hc_lowrank")
        self.indexer_heads = self.hparam_int("indexer_n_heads", maximum=4096)
        self.indexer_dim = self.hparam_int("indexer_head_dim")
        self.indexer_top_k = self.hparam_int("indexer_budget")
        self.compress_ratio = self.hparam_int("indexer_compress_ratio")

    # ------------------------------------------------------------------------------------ tensors

    def begin_tensors(self) -> None:
        super().begin_tensors()
        self._fc_halves: dict[str, SafetensorsTensor] = {}

    def other_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        if tensor.name in _FC_HALVES:
            return self._eh_proj(tensor)
        if tensor.name == _INDEXER_QK:
            return self._split_indexer_qk(tensor)
        return super().other_tensors(tensor)

    def _eh_proj(self, half: SafetensorsTensor) -> list[tuple[str, TensorSource]]:
        """``eh_proj`` once both halves have come (``fc_embedding``'s columns, then ``fc_hidden``'s), else nothing."""
        self._fc_halves[half.name] = half
        if len(self._fc_halves) < len(_FC_HALVES):
            return []
        embedding, hidden = (self._fc_halves.pop(name) for name in _FC_HALVES)
        if hidden.dtype != embedding.dtype or len(hidden.shape) != 2 or hidden.shape[0] != embedding.shape[0]:
            raise CheckpointError(f"{hidden.name} ({hidden.dtype} {list(hidden.shape)}) cannot sit beside "
                                  f"{embedding.name} ({embedding.dtype} {list(embedding.shape)}) in eh_proj",
                                  hidden.path)
        name = self.format_tensor_name(T.NEXTN_EH_PROJ)
        return [(name, TensorSource.single(ColumnConcat.of(embedding, hidden, name)))]

    def finish_tensors(self) -> None:
        """Refuse a head with one half of ``eh_proj`` (upstream: "MTP projection missing its other half")."""
        super().finish_tensors()
        for name, half in self._fc_halves.items():
            other = next(n for n in _FC_HALVES if n != name)
            raise CheckpointError(f"the MTP head has {name} but not {other}: llama.cpp's nextn.eh_proj is the two "
                                  "side by side", half.path)

    def _split_indexer_qk(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        """``index_qk_proj``'s rows: the indexer's query heads, then its one key head."""
        n_q, h = self.indexer_heads * self.indexer_dim, self.n_embd
        if tensor.shape != (n_q + self.indexer_dim, h):
            raise CheckpointError(f"{tensor.name} has shape {list(tensor.shape)}, config.json implies "
                                  f"{[n_q + self.indexer_dim, h]} ((indexer_n_heads + 1) x indexer_head_dim, "
                                  "hidden_size)", tensor.path)
        yield self.format_tensor_name("INDEXER_Q_PROJ"), TensorSource.single(tensor.rows(0, n_q, tensor.name))
        yield self.format_tensor_name("INDEXER_K_PROJ"), TensorSource.single(
            tensor.rows(n_q, self.indexer_dim, tensor.name))

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        h, hc_dim, lr = self.n_embd, self.hc * self.n_embd, self.hc_lowrank
        name = self.format_tensor_name
        mixers: dict[str, tuple[int, ...]] = {}
        for kind, gamma in (("NEXTN_HC_HEAD", "mtp.hyper_connection_mixer.hc_norm.weight"),
                            ("HC_ATTN", "mtp.layers.0.attn_hyper_connection.hc_norm.weight"),
                            ("HC_FFN", "mtp.layers.0.mlp_hyper_connection.hc_norm.weight")):
            mixers |= {name(f"{kind}_NORM"): self._gamma_shape(gamma), name(f"{kind}_DOWN"): (lr, hc_dim),
                       name(f"{kind}_UP"): (hc_dim, lr)}
        return {
            name(T.NEXTN_EH_PROJ): (h, 2 * h),
            name(T.NEXTN_ENORM): (h,),
            name(T.NEXTN_HNORM): self._gamma_shape("mtp.pre_fc_norm_hidden.weight"),
            **mixers,
            name("HC_ATTN_INJECT"): (self.hc, hc_dim),
            name("HC_FFN_INJECT"): (self.hc, hc_dim),
            **self.gated_attention_shapes(),
            name("INDEXER_Q_PROJ"): (self.indexer_heads * self.indexer_dim, h),
            name("INDEXER_K_PROJ"): (self.indexer_dim, h),
            name("INDEXER_Q_NORM"): (self.indexer_dim,),
            name(T.INDEXER_K_NORM): (self.indexer_dim,),
            **self.router_shapes(probs_bias=None),
            **self.expert_shapes(self.n_ff_exp),
            name(T.FFN_GATE_INP_SHEXP): (1, h),
            **self.shared_expert_shapes(self.n_ff_shexp),
        }

    def _gamma_shape(self, checkpoint_name: str) -> tuple[int, ...]:
        """A per-stream gamma's shape: flat ``hc x n_embd`` or ``[hc, n_embd]``, as the checkpoint stores it (llama.cpp
        loads either as ``{n_embd, hc}``: TENSOR_ALLOW_RESHAPE; upstream's converter writes the stored shape)."""
        stored = self.checkpoint.tensors.get(checkpoint_name)
        return (self.hc * self.n_embd,) if stored is not None and len(stored.shape) == 1 else (self.hc, self.n_embd)

    def output_type(self, name: str, source: TensorSource, outtype: GGMLQuantizationType | None
                    ) -> GGMLQuantizationType:
        # A norm's "+1" is computed in float32 (as upstream does), but a 2-D one not named *_norm (nextn.hnorm) is
        # then written in the checkpoint's type, like any matrix.
        part = source.parts[0]
        if outtype is None and isinstance(part, PlusOneTensor):
            outtype = FLOAT_DTYPES.get(part.stored)
        return super().output_type(name, source, outtype)

    # --------------------------------------------------------------------------------- metadata

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        super().set_gguf_parameters(writer, n_layers)
        writer.add_uint32(NEWER_KEYS["HyperConnection.COUNT"].format(arch=self.arch), self.hc)
        writer.add_uint32(NEWER_KEYS["HyperConnection.LOW_RANK"].format(arch=self.arch), self.hc_lowrank)
        writer.add_indexer_head_count(self.indexer_heads)
        writer.add_indexer_key_length(self.indexer_dim)
        writer.add_indexer_top_k(self.indexer_top_k)

    def target_checks(self) -> list[TargetCheck]:
        """Qwen3.5's, and the hyper-connection and indexer sizes the block's tensors and graph depend on."""
        return [
            *super().target_checks(),
            TargetCheck(NEWER_KEYS["HyperConnection.COUNT"].removeprefix("{arch}."), self.hc, "hc_count"),
            TargetCheck(NEWER_KEYS["HyperConnection.LOW_RANK"].removeprefix("{arch}."), self.hc_lowrank, "hc_lowrank"),
            TargetCheck("attention.indexer.head_count", self.indexer_heads, "indexer_n_heads"),
            TargetCheck("attention.indexer.key_length", self.indexer_dim, "indexer_head_dim"),
            TargetCheck("attention.indexer.top_k", self.indexer_top_k, "indexer_budget"),
        ]

    def own_layer_arrays(self) -> tuple[str, ...]:
        return (RECURRENT, COMPRESS_RATIOS)

    def nextn_layer_values(self) -> dict[str, int]:
        return {RECURRENT: False, COMPRESS_RATIOS: self.compress_ratio}

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[int]] | None:
        """The trunk's recurrence flags and compress ratios (the ratio on full-attention layers), from
        ``layer_types``."""
        if self.layer_types is None or len(self.layer_types) != n_trunk:
            return None
        full = [t == "full_attention" for t in self.layer_types]
        return {RECURRENT: [not f for f in full], COMPRESS_RATIOS: [self.compress_ratio if f else 0 for f in full]}

    def layer_arrays(self, block: int, target: ShardSet | None) -> dict[str, tuple[GGUFValueType, list[Any]]]:
        """Both per-layer arrays, always, as upstream writes them from ``layer_types`` (the base rule, not Qwen3.5's,
        which leaves ``recurrent_layers`` out for a target without it)."""
        return HeadModel.layer_arrays(self, block, target)
