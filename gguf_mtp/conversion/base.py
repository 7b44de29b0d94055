"""The common work of every MTP head converter, in the shape of llama.cpp's ``conversion/base.py``.

A family module subclasses :class:`HeadModel` and registers it under the Hugging Face architecture
names it handles (``@HeadModel.register("NemotronHForCausalLM")``). It says three things: how
checkpoint names map to GGUF names (:meth:`HeadModel.modify_tensors`, a generator yielding
``(gguf_name, TensorSource)``, which is where experts get stacked), which hyperparameters to write
(:meth:`HeadModel.set_gguf_parameters`, through gguf-py's :class:`~gguf.GGUFWriter`), and what the
shapes and per-layer values of its NextN block are. The base class does the rest: reads the
checkpoint lazily (headers only), checks shapes against ``config.json``, picks output types with
llama.cpp's rule, and turns each tensor into output segments that :mod:`gguf_mtp.write` streams,
one tensor (one expert) at a time.

Unlike llama.cpp's converter, nothing here needs torch, and bytes that need no conversion (BF16 in,
BF16 out) are copied by the kernel instead of passing through numpy.

Its helpers are modules of their own: config.json's typed readers and llama.cpp's limits (:mod:`.hparams`), name
templates and tensor sources (:mod:`.tensors`), the output bytes of a tensor (:mod:`.segments`), the metadata
recorder (:mod:`.writer`).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    MODEL_TENSOR,
    TENSOR_NAMES,
    GGMLQuantizationType,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
)

from gguf_mtp._gguf_tables import NEWER_TENSOR_NAMES
from gguf_mtp.errors import CheckpointError, IncompatibleDraftError, ParameterError
from gguf_mtp.format.quant_rules import HEAD_TYPE_FILE_TYPES, head_tensor_type
from gguf_mtp.format.safetensors_io import QUANTIZED_DTYPES, Checkpoint, NamePrefix, SafetensorsTensor
from gguf_mtp.model.blocks import layer_array, per_layer_keys
from gguf_mtp.model.shards import ShardSet, vocab_size

from .fp8 import FP8_DTYPES, BlockFP8, BlockScaledTensor, dequantized_head, quantization_of
from .hparams import EXPERT_LIMIT, INT32_MAX, LLAMA_MAX_EXPERTS, U32_MAX, ConfigReader, config_float
from .tensors import (
    FLOAT_DTYPES,
    BlockIndex,
    ExpertStack,
    MappedTensor,
    TensorSource,
    at_block,
    first_block_template,
    shown_name,
)

__all__ = [
    "CONVERTER_TYPES",
    "FILE_TYPES",
    "HeadModel",
    "TargetCheck",
    "TensorKey",
    "arch_name",
]

#: A tensor as gguf-py names it: its ``MODEL_TENSOR`` member, or the member's name where PyPI gguf lacks the member
#: (a key of :data:`~gguf_mtp._gguf_tables.NEWER_TENSOR_NAMES`).
TensorKey = MODEL_TENSOR | str

Q = GGMLQuantizationType

#: The ``--outtype`` names llama.cpp's converter offers, applied its way (:meth:`HeadModel.output_type`); the
#: others are llama-quantize's and follow its rules (:mod:`gguf_mtp.format.quant_rules`) on top of the former.
CONVERTER_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q8_0})

#: ``general.file_type`` of a file whose matrices are all of one type.
FILE_TYPES: dict[GGMLQuantizationType, LlamaFileType] = HEAD_TYPE_FILE_TYPES

#: Names that only FP8 / NVFP4 checkpoints carry (scales next to packed weights).
_QUANT_SIDECARS = ("weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale", "weight_packed",
                   "weight_global_scale", "input_global_scale")


def arch_name(model_arch: MODEL_ARCH | str) -> str:
    """The GGUF architecture name of gguf-py's ``MODEL_ARCH`` member, or the name itself."""
    return model_arch if isinstance(model_arch, str) else MODEL_ARCH_NAMES[model_arch]


# -------------------------------------------------------------------------------------------- model


def _either(prefix: NamePrefix) -> str:
    """``'mtp.'`` or ``'model.layers.45.' or 'model.layers.46.'`` for messages."""
    return " or ".join(repr(p) for p in ((prefix,) if isinstance(prefix, str) else prefix))


@dataclass(frozen=True)
class TargetCheck:
    """One hyperparameter the head and the target must agree on."""

    key: str  # ``{arch}.`` suffix, e.g. ``expert_count``
    value: int
    config_key: str  # where the head's value comes from, for messages


class HeadModel(ConfigReader):
    """Base class of one model family's MTP head converter (see the module docstring)."""

    #: The GGUF architecture the head belongs to: gguf-py's member, or its name where the installed gguf-py is older
    #: than the llama.cpp that runs it (PyPI gguf 0.19.0 has no ``hy_v3``, ``bailingmoe3``...).
    model_arch: ClassVar[MODEL_ARCH | str]
    #: Checkpoint tensors of the MTP head start with this.
    tensor_prefix: ClassVar[NamePrefix] = "mtp."
    #: Whether the head's own copies of the embedding and LM head are converted (``None``: the family's head
    #: has no such copies; a family that has them takes ``keep_nextn_copies=`` in its constructor).
    keep_nextn_copies: ClassVar[bool | None] = None
    #: Whether the head is a mixture of experts: the expert counts are read, checked and written.
    has_experts: ClassVar[bool] = True
    #: A routed expert's checkpoint tensors (groups ``expert``, ``proj``): what the expert-count check counts
    #: and :meth:`stack_expert` stacks.
    expert_pattern: ClassVar[re.Pattern[str] | None] = None
    #: ``proj`` of :attr:`expert_pattern` -> the stacked GGUF tensor it becomes.
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {}
    #: Whether the family has RoPE (``rope_theta`` read and written as ``rope.freq_base``).
    has_rope: ClassVar[bool] = True
    #: config.json spellings of the norm epsilon, and the value written when none is set.
    norm_eps_keys: ClassVar[tuple[str, ...]] = ("rms_norm_eps",)
    #: config.json spellings of the KV head count and of the expert counts (routed, used per token).
    n_head_kv_keys: ClassVar[tuple[str, ...]] = ("num_key_value_heads", "n_head_kv")
    expert_count_keys: ClassVar[tuple[str, ...]] = ("n_routed_experts", "num_experts")
    expert_used_keys: ClassVar[tuple[str, ...]] = ("num_experts_per_tok",)
    default_norm_eps: ClassVar[float] = 1e-5
    #: Whether config.json may nest the text model's hyperparameters in a ``text_config`` object (the
    #: vision-language layouts of Step-3.7 and Qwen3.5): they are read as if at the top, as llama.cpp's converter
    #: reads them (:meth:`text_hparams`).
    nested_text_config: ClassVar[bool] = False
    #: HF architecture name -> converter class (filled by :meth:`register`).
    _classes: ClassVar[dict[str, type[HeadModel]]] = {}
    #: GGUF architecture name -> converter class.
    _classes_by_arch: ClassVar[dict[str, type[HeadModel]]] = {}
    hf_architectures: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def register(cls, *names: str) -> Callable[[type[HeadModel]], type[HeadModel]]:
        """Class decorator: handle the HF architectures ``names`` (``config.json`` ``architectures``)."""

        def decorate(model_class: type[HeadModel]) -> type[HeadModel]:
            # its own names only: a subclass (DeepSeek V3.2's of V3's) does not inherit its parent's
            model_class.hf_architectures = (*model_class.__dict__.get("hf_architectures", ()), *names)
            for name in names:
                cls._classes[name] = model_class
            cls._classes_by_arch[arch_name(model_class.model_arch)] = model_class
            return model_class

        return decorate

    @classmethod
    def head_prefix(cls, config: dict[str, Any]) -> NamePrefix:
        """The name prefix of the head's tensors for a ``config.json`` (what is downloaded and opened)."""
        return cls.tensor_prefix

    @classmethod
    def text_hparams(cls, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with a ``text_config`` object's keys moved to the top (:attr:`nested_text_config`); else as
        it is."""
        text = config.get("text_config") if cls.nested_text_config else None
        return {**config, **text} if isinstance(text, dict) else config

    def default_block(self) -> int | None:
        """The NextN block index when neither a target nor ``block`` gives it (``None``: one of them must)."""
        return None

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint.config, checkpoint.folder / "config.json")
        self.checkpoint = checkpoint
        self.notes: list[str] = []
        #: How many NextN blocks the head is: a family with several sets it (they are written ``blk.N .. N+k-1``).
        self.n_nextn = 1
        self._experts: dict[tuple[int, str], ExpertStack] = {}
        text = self.hparams.get("text_config") if self.nested_text_config else None
        if text is not None and not isinstance(text, dict):
            raise CheckpointError("text_config is not a JSON object", self.config_path)
        self.hparams = self.text_hparams(self.hparams)
        self.read_hparams()

    # ---------------------------------------------------------------- family hooks (override these)

    def modify_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        """Map one checkpoint tensor to zero or more ``(gguf_name, source)``; ``{bid}`` in a name stands for
        the NextN block index. May hold tensors back and yield them later (stacked experts)."""
        raise NotImplementedError

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF name (with ``{bid}``) -> row-major shape config.json implies, in output order."""
        raise NotImplementedError

    def set_gguf_parameters(self, writer: GGUFWriter, n_layers: int) -> None:
        """Write the hyperparameters the head implies (scalars; per-layer arrays come from
        :meth:`nextn_layer_values` / :meth:`trunk_layer_values`). The base writes the common ones, as
        llama.cpp's ``TextModel.set_gguf_parameters`` does; a family calls it first, then adds its own."""
        writer.add_block_count(n_layers)
        writer.add_nextn_predict_layers(self.n_nextn)
        if self.context_length is not None:
            writer.add_context_length(self.context_length)
        writer.add_embedding_length(self.n_embd)
        if self.vocab_size is not None:
            writer.add_vocab_size(self.vocab_size)
        writer.add_head_count(self.n_head)
        if "attention.head_count_kv" not in self.own_layer_arrays():
            writer.add_head_count_kv(self.n_head_kv)
        writer.add_key_length(self.head_dim)
        writer.add_value_length(self.head_dim)
        if self.rope_theta is not None:
            writer.add_rope_freq_base(self.rope_theta)
        writer.add_layer_norm_rms_eps(self.norm_eps if self.norm_eps is not None else self.default_norm_eps)
        if self.has_experts:
            writer.add_expert_count(self.n_expert)
            writer.add_expert_used_count(self.n_expert_used)

    def nextn_layer_values(self) -> dict[str, int]:
        """Per-layer array (``{arch}.`` suffix) -> the NextN block's entry."""
        raise NotImplementedError

    def moe_block_values(self, n_ff_exp: int, n_ff: int | None) -> dict[str, int]:
        """The per-layer entries of a MoE NextN block, for a target that states these per layer: heads, KV heads,
        experts used, the expert width ``n_ff_exp`` and the dense width ``n_ff`` when config.json has one."""
        return {
            "attention.head_count": self.n_head,
            "attention.head_count_kv": self.n_head_kv,
            "expert_used_count": self.n_expert_used,
            "expert_feed_forward_length": n_ff_exp,
            **({"feed_forward_length": n_ff} if n_ff is not None else {}),
        }

    def nextn_block_values(self, offset: int) -> dict[str, Any]:
        """Per-layer array -> the entry of the ``offset``-th NextN block (a family whose blocks differ overrides
        it; by default every block takes :meth:`nextn_layer_values`)."""
        return dict(self.nextn_layer_values())

    def own_layer_arrays(self) -> tuple[str, ...]:
        """The per-layer arrays this family writes, like llama.cpp's converter does for the model."""
        raise NotImplementedError

    def trunk_layer_values(self, n_trunk: int) -> dict[str, list[int]] | None:
        """Per-layer entries of the trunk blocks, when config.json describes a trunk of ``n_trunk`` blocks."""
        return None

    def target_checks(self) -> list[TargetCheck]:
        """The hyperparameters a target model must share with the head: the common ones here; a family adds its
        own to this list."""
        checks = [
            TargetCheck("embedding_length", self.n_embd, self._origin_of("hidden_size")),
            TargetCheck("attention.head_count", self.n_head, self._origin_of("num_attention_heads")),
            TargetCheck("attention.head_count_kv", self.n_head_kv, self._origin_of(*self.n_head_kv_keys)),
            TargetCheck("attention.key_length", self.head_dim, "head_dim"),
        ]
        if self.has_experts:
            checks += [TargetCheck("expert_count", self.n_expert, self.expert_count_key),
                       TargetCheck("expert_used_count", self.n_expert_used, self._origin_of(*self.expert_used_keys))]
        if self.vocab_size is not None:
            checks.append(TargetCheck("vocab_size", self.vocab_size, "vocab_size"))
        return checks

    def begin_tensors(self) -> None:
        """Called before the first tensor: reset whatever :meth:`modify_tensors` holds back (the base: one
        :class:`ExpertStack` per projection of :attr:`stacked_experts`)."""
        self._experts = {(block, proj): ExpertStack(self.n_expert) for block in range(self.n_nextn)
                         for proj in self.stacked_experts} if self.has_experts else {}

    def finish_tensors(self) -> None:
        """Called after the last tensor: complain about anything held back and never yielded (the base: experts
        of a projection that never completed; none at all means packed experts, or none: map_tensors says)."""
        if all(not stack.parts for stack in self._experts.values()):
            return
        for (block, proj), stack in self._experts.items():
            missing = stack.missing(limit=6)
            if missing:
                shown = ", ".join(str(i) for i in missing[:5]) + (", ..." if stack.n_missing > 5 else "")
                raise CheckpointError(
                    f"the MTP head{f' (NextN block {block})' if self.n_nextn > 1 else ''} has {len(stack.parts)} of "
                    f"{stack.count} experts' {proj}_proj (config.json "
                    f"{self.expert_count_key}); missing experts {shown}", self.checkpoint.folder)

    def stack_expert(self, tensor: SafetensorsTensor) -> list[tuple[str, TensorSource]] | None:
        """A routed expert's tensor (:attr:`expert_pattern`) added to its stack: the stacked tensor once its
        last expert has arrived, else nothing; ``None`` when ``tensor`` is not an expert's."""
        match = self.expert_pattern.match(tensor.name) if self.expert_pattern is not None else None
        if match is None or not self.has_experts:
            return None
        block = self.nextn_block(tensor)
        stacked = self._experts[(block, match["proj"])].add(int(match["expert"]), tensor)
        if stacked is None:
            return []
        return [(self.format_tensor_name(self.stacked_experts[match["proj"]], block=block), stacked)]

    def nextn_block(self, tensor: SafetensorsTensor) -> int:
        """Which NextN block (0 .. :attr:`n_nextn` - 1) a head tensor belongs to (a family with several says)."""
        return 0

    def keep_first_blocks(self, count: int) -> None:
        """Convert only the first ``count`` NextN blocks; a family whose llama.cpp graph runs its blocks as a chain
        keeps them all (:class:`~.nextn_layer.NextNLayerModel`, whose graphs run one, can narrow).

        Raises:
            ParameterError: ``count`` is not what this head can keep.
        """
        if count != self.n_nextn:
            raise ParameterError(f"nextn_blocks {count}: the {self.arch} head's {self.n_nextn} NextN block(s) are "
                                 f"converted together")

    # ------------------------------------------------------------------------------ common work

    @property
    def arch(self) -> str:
        """The GGUF architecture name (``nemotron_h_moe``)."""
        return arch_name(self.model_arch)


    def read_hparams(self) -> None:
        """Read every hyperparameter the converter uses, type- and range-checked once (called by the constructor).

        The base reads those every family has, with their bounds (the ones llama.cpp's
        ``TextModel.set_gguf_parameters`` reads): width, heads, KV heads, head size, vocabulary, context length,
        norm epsilon, RoPE base, and for a MoE the expert counts, checked against the experts the head holds. A
        family overrides it: ``super().read_hparams()`` first, then its own.

        Raises:
            CheckpointError: a value of the wrong type or out of range, or an expert count the head's tensors
                do not bear out; one line naming the key.
        """
        need, may = self.hparam_int, self.optional_hparam_int
        self.n_embd = need(["hidden_size", "d_model"])
        self.n_head = need(["num_attention_heads", "n_head"])
        self.n_head_kv = need(list(self.n_head_kv_keys), maximum=self.n_head)
        head_dim = may(["head_dim", "attention_head_dim"])
        if head_dim is None:
            if self.n_embd % self.n_head:
                raise CheckpointError(f"config.json has no head_dim, and hidden_size = {self.n_embd} does not split "
                                      f"into num_attention_heads = {self.n_head} heads", self.config_path)
            head_dim = self.n_embd // self.n_head
        self.head_dim = head_dim
        self.vocab_size = may("vocab_size", maximum=INT32_MAX, limit="llama.cpp's token ids are int32")
        self.context_length = may("max_position_embeddings", maximum=U32_MAX)
        self.norm_eps = self.optional_hparam_float(list(self.norm_eps_keys), maximum=1.0)
        self.rope_theta = self._read_rope_theta() if self.has_rope else None
        if self.has_experts:
            self.n_expert = need(list(self.expert_count_keys), maximum=LLAMA_MAX_EXPERTS, limit=EXPERT_LIMIT)
            self.expert_count_key = self._origin_of(*self.expert_count_keys)
            self.n_expert_used = need(list(self.expert_used_keys), maximum=self.n_expert)
            self._check_expert_count()

    def _read_rope_theta(self) -> float | None:
        """``rope_parameters.rope_theta`` (transformers 5) or ``rope_theta``: a positive finite number (whether it
        fits the f32 it is written as is the writer's check)."""
        rope = self.hparams.get("rope_parameters")
        if isinstance(rope, dict) and rope.get("rope_theta") is not None:
            theta = config_float(rope, "rope_theta", where=self.config_path, maximum=sys.float_info.max,
                                 optional=True)
            return self.hparam_origin("rope_parameters.rope_theta", theta)
        return self._read("rope_theta", config_float(self.hparams, "rope_theta", where=self.config_path,
                                                     maximum=sys.float_info.max, optional=True))

    def _check_expert_count(self) -> None:
        """Refuse an expert count the head's own per-expert tensors do not bear out, before anything is sized by
        it (a config claiming 10^9 experts must not allocate 10^9 of anything). A head without per-expert
        tensors (packed experts, or none: :meth:`map_tensors` says) is not counted."""
        if self.expert_pattern is None:
            return
        present = {int(m["expert"]) for t in self.checkpoint.tensors
                   if t.startswith(self.tensor_prefix) and (m := self.expert_pattern.match(t)) is not None}
        if not present:
            return
        key, n = self.expert_count_key, self.n_expert
        beyond = max(present)
        if beyond >= n:
            raise CheckpointError(f"the MTP head holds expert {beyond}, but config.json {key} = {n} "
                                  f"(experts 0..{n - 1})", self.config_path)
        if len(present) != n:
            absent = [i for i in range(n) if i not in present]  # n <= LLAMA_MAX_EXPERTS
            shown = ", ".join(str(i) for i in absent[:5]) + (", ..." if len(absent) > 5 else "")
            raise CheckpointError(f"{key} = {n:,}, but the MTP head has tensors for {len(present)} experts "
                                  f"(none for experts {shown})", self.config_path)

    def format_tensor_name(self, key: TensorKey, suffix: str = ".weight", block: int = 0) -> str:
        """gguf-py's name for ``key`` with the block index left in: ``blk.{bid}.nextn.eh_proj.weight`` for the
        first NextN block, ``blk.{bid[k]}...`` for the ``block`` = k-th after it (see :class:`BlockIndex`)."""
        template = TENSOR_NAMES[key] if isinstance(key, MODEL_TENSOR) else NEWER_TENSOR_NAMES[key]
        return at_block(template + suffix, block)

    def router_shapes(self, probs_bias: str | None = ".bias") -> dict[str, tuple[int, ...]]:
        """The router ``[n_expert, n_embd]`` and, unless ``probs_bias`` is ``None``, its expert-selection bias
        ``exp_probs_b`` with that suffix (``".bias"``; Hy3's has none), ``{bid}`` for the block."""
        e, h = self.n_expert, self.n_embd
        shapes: dict[str, tuple[int, ...]] = {self.format_tensor_name(MODEL_TENSOR.FFN_GATE_INP): (e, h)}
        if probs_bias is not None:
            shapes[self.format_tensor_name(MODEL_TENSOR.FFN_EXP_PROBS_B, probs_bias)] = (e,)
        return shapes

    def expert_shapes(self, n_ff_exp: int, width: int | None = None, *, gated: bool = True
                      ) -> dict[str, tuple[int, ...]]:
        """The routed experts stacked: ``ffn_{gate,up,down}_exps`` (``gated=False``: no gate) of ``n_ff_exp`` rows
        working at ``width`` (default ``n_embd``; a latent MoE's is narrower)."""
        e, f, h, name = self.n_expert, n_ff_exp, width or self.n_embd, self.format_tensor_name
        gate = {name(MODEL_TENSOR.FFN_GATE_EXP): (e, f, h)} if gated else {}
        return {**gate, name(MODEL_TENSOR.FFN_UP_EXP): (e, f, h), name(MODEL_TENSOR.FFN_DOWN_EXP): (e, h, f)}

    def shared_expert_shapes(self, n_ff_shexp: int | None, *, gated: bool = True) -> dict[str, tuple[int, ...]]:
        """The shared expert ``ffn_{gate,up,down}_shexp`` of ``n_ff_shexp`` rows (none when it is 0 or ``None``)."""
        if not n_ff_shexp:
            return {}
        s, h, name = n_ff_shexp, self.n_embd, self.format_tensor_name
        gate = {name(MODEL_TENSOR.FFN_GATE_SHEXP): (s, h)} if gated else {}
        return {**gate, name(MODEL_TENSOR.FFN_UP_SHEXP): (s, h), name(MODEL_TENSOR.FFN_DOWN_SHEXP): (h, s)}

    def moe_shapes(self, n_ff_exp: int, n_ff_shexp: int | None, probs_bias: str | None = ".bias"
                   ) -> dict[str, tuple[int, ...]]:
        """A MoE feed-forward's tensors in llama.cpp's order: the router (:meth:`router_shapes`), the routed experts
        (:meth:`expert_shapes`), the shared expert (:meth:`shared_expert_shapes`)."""
        return {**self.router_shapes(probs_bias), **self.expert_shapes(n_ff_exp),
                **self.shared_expert_shapes(n_ff_shexp)}

    def dense_ffn_shapes(self, n_ff: int) -> dict[str, tuple[int, ...]]:
        """A dense gated MLP: ``ffn_{gate,up,down}`` of ``n_ff`` rows."""
        f, h, name = n_ff, self.n_embd, self.format_tensor_name
        return {name(MODEL_TENSOR.FFN_GATE): (f, h), name(MODEL_TENSOR.FFN_UP): (f, h),
                name(MODEL_TENSOR.FFN_DOWN): (h, f)}

    def head_tensors(self) -> list[SafetensorsTensor]:
        """The checkpoint tensors of the MTP head, in natural order; in a block-scaled FP8 checkpoint its FP8 weights
        come paired with their scales (:mod:`.fp8`: read as dequantized float32), the scales themselves left out.

        Raises:
            CheckpointError: there are none; the checkpoint is quantized some other way (NVFP4, MXFP4, ...), or
                holds quantized tensors its ``quantization_config`` does not describe.
        """
        head = [t for t in self.checkpoint if t.name.startswith(self.tensor_prefix)]
        if not head:
            raise CheckpointError(
                f"no MTP head: no tensor name starts with {_either(self.tensor_prefix)} (no MTP layers in it?)",
                self.checkpoint.folder,
            )
        quant = quantization_of(self.hparams, self.config_path)
        if quant is not None:
            head = self.dequantize(head, quant)
        for tensor in head:
            if isinstance(tensor, BlockScaledTensor):
                continue
            sidecar = tensor.name.rsplit(".", 1)[-1] in _QUANT_SIDECARS
            if sidecar or tensor.dtype in QUANTIZED_DTYPES or tensor.dtype not in FLOAT_DTYPES:
                why = ("config.json's quantization_config (fp8) does not describe it" if quant is not None else
                       "a quantized tensor, and config.json has no quantization_config (only block-scaled FP8 "
                       "checkpoints are dequantized)")
                raise CheckpointError(f"tensor {tensor.name!r} is {tensor.dtype}: {why}; use the BF16 checkpoint",
                                      tensor.path)
        return head

    def dequantize(self, head: list[SafetensorsTensor], quant: BlockFP8) -> list[SafetensorsTensor]:
        """The head's tensors of a block-scaled FP8 checkpoint, FP8 weights paired with their scales
        (:func:`.fp8.dequantized_head`); a family whose checkpoints lay some scales out otherwise overrides it."""
        return dequantized_head(head, quant, self.checkpoint.tensors)

    @functools.cached_property
    def auto_outtype(self) -> GGMLQuantizationType:
        """The matrix type of dequantized (FP8) tensors when none is asked for: llama.cpp's ``--outtype auto`` rule,
        the dtype of the checkpoint's first tensor of two or more dimensions that is BF16 or F16, else F16 (the real
        FP8 releases keep embeddings and routers in BF16: BF16)."""
        for tensor in self.checkpoint:
            if len(tensor.shape) >= 2 and tensor.dtype in ("BF16", "F16"):
                return Q.BF16 if tensor.dtype == "BF16" else Q.F16
        return Q.F16

    def map_tensors(self) -> list[tuple[str, TensorSource]]:
        """Every head tensor under its GGUF name (``{bid}`` unformatted), in the family's output order,
        checked against config.json: nothing missing, nothing unknown or duplicated, shapes as implied.

        Raises:
            CheckpointError: one line naming the tensor and the problem.
        """
        expected = self.expected_shapes()
        mapped: dict[str, TensorSource] = {}
        self.begin_tensors()
        for tensor in self.head_tensors():
            for name, source in self.modify_tensors(tensor):
                if name in mapped:
                    raise CheckpointError(
                        f"{', '.join(source.names[:1])} and {mapped[name].names[0]} both map to {shown_name(name)}",
                        tensor.path,
                    )
                mapped[name] = source
        self.finish_tensors()
        unknown = [n for n in mapped if n not in expected]
        if unknown:
            raise CheckpointError(f"{self.arch}: no NextN tensor {shown_name(unknown[0])} is expected",
                                  mapped[unknown[0]].parts[0].path)
        missing = [n for n in expected if n not in mapped]
        if missing:
            raise CheckpointError(
                f"the MTP head lacks {len(missing)} tensor(s) llama.cpp needs, e.g. {shown_name(missing[0])}",
                self.checkpoint.folder,
            )
        for name, shape in expected.items():
            source = mapped[name]
            if source.shape != shape:
                what = source.names[0]
                if len(source.parts) > 1:
                    what = f"{len(source.parts)} stacked tensors like {what}"
                raise CheckpointError(
                    f"{what} has shape {list(source.shape)}, config.json implies {list(shape)} "
                    f"(for {shown_name(name)})",
                    source.parts[0].path,
                )
        return [(name, mapped[name]) for name in expected]

    def output_type(
        self, name: str, source: TensorSource, outtype: GGMLQuantizationType | None
    ) -> GGMLQuantizationType:
        """llama.cpp's type rule: 1-D tensors, norms, the router (``ffn_gate_inp``) and anything not named
        ``*.weight`` in F32; other matrices in ``outtype``, by default the source dtype (F64 becomes F32; FP8, and a
        float weight an FP8 checkpoint scales, become :attr:`auto_outtype`).

        A type llama.cpp's converter does not offer (``q4_k``, ``iq4_xs``...) is what ``llama-quantize --pure``
        gives the tensor of that default conversion (:func:`~gguf_mtp.format.quant_rules.head_tensor_type`)."""
        if outtype is not None and outtype not in CONVERTER_TYPES:
            default = self.output_type(name, source, None)
            ggml_shape = tuple(reversed(source.shape)) or (1,)
            return head_tensor_type(name.format(bid=BlockIndex(0)), ggml_shape, default, outtype, self.arch)
        router = self.format_tensor_name(MODEL_TENSOR.FFN_GATE_INP)
        is_router = first_block_template(name) == router
        if len(source.shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") or is_router:
            return Q.F32
        if outtype is None:
            dequantized = source.dtype in FP8_DTYPES or isinstance(source.parts[0], BlockScaledTensor)
            outtype = self.auto_outtype if dequantized else FLOAT_DTYPES.get(source.dtype) or Q.F32
        block_size, _ = GGML_QUANT_SIZES[outtype]
        if source.shape[-1] % block_size:
            # What llama.cpp's converter does when a row does not split into quant blocks.
            note = (f"{shown_name(name)}: rows of {source.shape[-1]} do not split into {outtype.name} blocks of "
                    f"{block_size}; written as F16")
            if note not in self.notes:
                self.notes.append(note)
            return Q.F16
        return outtype

    def check_target(self, target: ShardSet) -> None:
        """Refuse a target the head does not belong to: another architecture, or a hyperparameter of
        :meth:`target_checks` that differs (per-layer arrays are compared on their non-zero entries).

        Raises:
            IncompatibleDraftError: one line naming the key and both values.
        """
        if target.arch != self.arch:
            raise IncompatibleDraftError(
                f"target architecture is {target.arch!r}; this {', '.join(self.hf_architectures)} head converts to "
                f"{self.arch!r}",
                target.name,
            )
        for check in self.target_checks():
            key = f"{self.arch}.{check.key}"
            if check.key == "vocab_size":
                vocab = vocab_size(target)
                stated = [vocab] if vocab is not None else []
            else:
                kv = target.kv(key)
                if kv is None:
                    continue
                stated = [v for v in layer_array(kv, target.name)[1] if v] if kv.is_array else [kv.value]
            wrong = sorted({v for v in stated if v != check.value})
            if wrong:
                raise IncompatibleDraftError(
                    f"the head has {check.key} = {check.value} (config.json {check.config_key}), the target "
                    f"{wrong[0] if len(wrong) == 1 else wrong}: they are not the same model",
                    target.name,
                )

    def layer_arrays(self, block: int, target: ShardSet | None) -> dict[str, tuple[GGUFValueType, list[Any]]]:
        """The per-layer arrays of a draft whose first NextN block is ``block``: ``{arch}.`` suffix ->
        (element type, ``block + n_nextn`` entries), the NextN blocks' entries last.

        Trunk entries come from the target's own arrays when given (element types kept), else from
        config.json's layer pattern when it describes ``block`` blocks, else zeros (compose only reads
        the NextN entry). Every per-layer array of the target is covered.

        Raises:
            IncompatibleDraftError: the target has a per-layer array whose NextN value is unknown here.
        """
        per_block = [self.nextn_block_values(offset) for offset in range(self.n_nextn)]
        nextn = per_block[0]
        arrays: dict[str, tuple[GGUFValueType, list[Any]]] = {}
        trunk = self.trunk_layer_values(block) or {}
        for suffix in self.own_layer_arrays():
            entries = [values[suffix] for values in per_block]
            etype = GGUFValueType.get_type(entries[0])
            zero = type(entries[0])()  # 0, 0.0 or False where config.json gives no trunk entries
            arrays[suffix] = (etype, [*trunk.get(suffix, [zero] * block), *entries])
        if target is not None:
            for kv in per_layer_keys(target.first, self.arch, target.block_count):
                suffix = kv.key[len(self.arch) + 1 :]
                if suffix not in nextn:
                    raise IncompatibleDraftError(
                        f"the target has a per-layer array {kv.key}, and the {self.arch} converter does not know its "
                        "value for the NextN block",
                        target.name,
                    )
                etype, entries = layer_array(kv, target.name)
                arrays[suffix] = (etype, [*entries, *(values[suffix] for values in per_block)])
        return arrays

    def mapped_tensors(self, block: int, outtype: GGMLQuantizationType | None) -> list[MappedTensor]:
        """:meth:`map_tensors` with the block indices filled in (``block`` the first NextN block's) and the output
        types chosen."""
        first = BlockIndex(block)
        quantized = outtype is not None and outtype not in CONVERTER_TYPES  # llama-quantize's type, on the default
        return [
            MappedTensor(name.format(bid=first), source, self.output_type(name, source, outtype),
                         self.output_type(name, source, None) if quantized else None)
            for name, source in self.map_tensors()
        ]

