"""The template of every head that is one more decoder layer: GLM-4.5 (``glm4moe``), GLM-4.7-Flash and DeepSeek V3/R1
(``deepseek2``), the DeepSeek/GLM-shaped families after them, Hy3 (``hy_v3``), Ling-3.0 (``bailingmoe3``) and
Step-3.5 (``step35``), MiMo-V2 (``mimo2``).

The head is the checkpoint's layer ``model.layers.{N}.*`` with ``N = num_hidden_layers`` (with
``num_nextn_predict_layers: k`` the layers ``N`` .. ``N + k - 1``, one NextN block each; MiMo-V2 numbers its own
``model.mtp.layers.{0..k-1}``, :attr:`NextNLayerModel.numbered_after_trunk`): an ordinary decoder layer
of the trunk's kind, plus the NextN glue gguf-py's ``TensorNameMap`` names for every architecture
(``eh_proj``, ``enorm``, ``hnorm``, ``shared_head.norm``, and the layer's own copies of the embedding and LM head,
``embed_tokens`` and ``shared_head.head``; llama.cpp's converter keeps the copies, ``keep_nextn_copies=False``
drops them and llama.cpp then uses the trunk's). A layer's names come from the family's own table
(:attr:`NextNLayerModel.layer_names`, built from :mod:`.hf_names`) or, where the installed gguf-py has entries for
the architecture, from gguf-py's table (the glue's from the global ``TENSOR_NAMES``); routed experts are stacked one
expert at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, get_tensor_name_map

from gguf_mtp.errors import CheckpointError, ParameterError
from gguf_mtp.format.safetensors_io import Checkpoint, NamePrefix, SafetensorsTensor

from .base import HeadModel, TargetCheck
from .hf_names import NEXTN_GLUE_NAMES
from .hparams import LLAMA_MAX_LAYERS
from .tensors import TensorSource, at_block

__all__ = ["MLP_EXPERTS", "NEXTN_COPIES", "NEXTN_GLUE", "NextNLayerModel"]

T = MODEL_TENSOR

#: The NextN layer's own copies of the embedding and the LM head (GLM-4.5 and DeepSeek V3 ship them).
NEXTN_COPIES = ((T.NEXTN_EMBED_TOKENS, "embed_tokens.weight"), (T.NEXTN_SHARED_HEAD_HEAD, "shared_head.head.weight"))
#: A layer number: at most 6 digits, bounded before int() sees it.
_LAYER_NUMBER = re.compile(r"[0-9]{1,6}")
#: checkpoint suffix (after ``model.layers.{N}.``) -> gguf-py tensor: llama.cpp's generic NextN sources
#: (gguf-py ``tensor_mapping.py``, ``MODEL_TENSOR.NEXTN_*``).
NEXTN_GLUE: dict[str, MODEL_TENSOR] = {name: key for name, (key, _) in NEXTN_GLUE_NAMES.items()}
#: A routed expert's projection ``mlp.experts.{e}.{gate,up,down}_proj`` (at most 6 digits: an index is bounded before
#: int() sees it; LLAMA_MAX_EXPERTS is far below 10^6).
MLP_EXPERTS = re.compile(
    r"^model\.layers\.[0-9]+\.mlp\.experts\.(?P<expert>[0-9]{1,6})\.(?P<proj>gate|up|down)_proj\.weight$")


class NextNLayerModel(HeadModel):
    """A head that is the decoder layer ``model.layers.{num_hidden_layers}``, or the ``num_nextn_predict_layers``
    layers from there on (one NextN block each, written renumbered together ``blk.N`` .. ``blk.N+k-1``).

    A family says what differs: its hyperparameters (:meth:`~HeadModel.read_hparams`, ``super()`` first: the layer
    counts and the common ones are read by then), its names (:attr:`layer_names`, or gguf-py's table), one block's
    shapes (:meth:`layer_shapes`, :meth:`glue_shapes` around them), and any tensor that is not one checkpoint tensor
    under another name (:meth:`layer_tensors`). The blocks after the first are this class's job.
    """

    #: What ``convert`` opens the checkpoint with before it knows ``N`` (see :meth:`head_prefix`); each
    #: instance narrows it to its NextN layers' ``model.layers.{N+k}.``.
    tensor_prefix: ClassVar[NamePrefix] = "model.layers."
    #: Where the checkpoint's decoder layers are numbered (Step-3.7 nests them in ``model.language_model.layers.``).
    layer_roots: ClassVar[tuple[str, ...]] = ("model.layers.",)
    #: Whether the NextN layers continue the trunk's numbering (``N`` .. ``N + k - 1``); ``False``: they are
    #: numbered ``0`` .. ``k - 1`` under a root of their own (MiMo-V2's ``model.mtp.layers.``).
    numbered_after_trunk: ClassVar[bool] = True
    #: Keep the layer's ``embed_tokens`` / ``shared_head.head`` copies in the NextN block (llama.cpp's converter
    #: does); ``False`` drops them and llama.cpp uses the trunk's.
    keep_nextn_copies: ClassVar[bool | None] = True
    #: The family's names: HF name inside a layer -> (gguf-py tensor, GGUF suffix), where PyPI gguf 0.19.0 has no
    #: entries for the architecture; ``None``: gguf-py's ``TensorNameMap`` of :attr:`name_table_arch`.
    layer_names: ClassVar[Mapping[str, tuple[MODEL_TENSOR, str]] | None] = None
    #: gguf-py's name table the decoder layer is mapped with, when :attr:`model_arch` is a name the installed gguf-py
    #: does not know (``deepseek32``: glm-dsa's table, the same Hugging Face names); ``None``: :attr:`model_arch`'s.
    name_table_arch: ClassVar[MODEL_ARCH | None] = None
    #: The HF names of the head's final norm, written as ``nextn.shared_head_norm`` when the layer has one.
    head_norm_names: ClassVar[tuple[str, ...]] = ("shared_head.norm.weight",)
    #: What the family calls its head's layers, in messages (``NextN``, ``MTP``).
    layer_word: ClassVar[str] = "NextN"
    #: Whether llama.cpp's graph runs the blocks as a chain (all are converted) rather than one (any first ones may
    #: be, :meth:`keep_first_blocks`).
    chained_blocks: ClassVar[bool] = False
    #: Whether config.json must state ``num_nextn_predict_layers`` (else one layer is assumed).
    nextn_count_required: ClassVar[bool] = False
    expert_pattern: ClassVar[re.Pattern[str] | None] = MLP_EXPERTS
    stacked_experts: ClassVar[dict[str, MODEL_TENSOR]] = {
        "down": T.FFN_DOWN_EXP, "gate": T.FFN_GATE_EXP, "up": T.FFN_UP_EXP}

    @classmethod
    def head_prefix(cls, config: dict[str, Any]) -> NamePrefix:
        """The name prefixes of the head's tensors for a ``config.json``: ``model.layers.{num_hidden_layers}.``, one
        more per further NextN layer (what to download from the Hub and open: only the shards of the NextN layers)."""
        if not cls.numbered_after_trunk:
            return cls.tensor_prefix
        config = cls.text_hparams(config)
        n_layer, n_nextn = config.get("num_hidden_layers"), config.get("num_nextn_predict_layers", 1)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in (n_layer, n_nextn)):
            return cls.tensor_prefix  # refused with a proper message once the model reads its config
        assert isinstance(n_layer, int) and isinstance(n_nextn, int)
        if n_layer + n_nextn > LLAMA_MAX_LAYERS:
            return cls.tensor_prefix
        prefixes = tuple(f"{root}{n_layer + k}." for root in cls.layer_roots for k in range(n_nextn))
        return prefixes[0] if len(prefixes) == 1 else prefixes

    def __init__(self, checkpoint: Checkpoint, *, keep_nextn_copies: bool | None = None) -> None:
        self.keep_copies = self.keep_nextn_copies is not False if keep_nextn_copies is None else keep_nextn_copies
        super().__init__(checkpoint)
        if self.layer_names is None:  # gguf-py's table for a model of N + 1 blocks maps model.layers.N.* to blk.N.*
            table = self.name_table_arch or self.model_arch
            if not isinstance(table, MODEL_ARCH):  # a family gguf-py does not know has no name table there
                raise TypeError(f"{type(self).__name__}: a family gguf-py does not know needs its own layer_names")
            self._tensor_map = get_tensor_name_map(table, self.n_layer + 1)

    def read_hparams(self) -> None:
        """The layer counts (:meth:`read_layer_counts`), narrowed to the NextN layers, then the common ones."""
        self.read_layer_counts()
        self._narrow_to_blocks(self.n_nextn)
        self._check_layers_present()
        super().read_hparams()

    def read_layer_counts(self) -> None:
        """:attr:`n_nextn` (``num_nextn_predict_layers``) and :attr:`n_layer` (``num_hidden_layers``), bounded together
        by llama.cpp's layer limit."""
        word = self.layer_word
        read = self.hparam_int if self.nextn_count_required else self.optional_hparam_int
        n_nextn = read("num_nextn_predict_layers", minimum=0, maximum=LLAMA_MAX_LAYERS - 1)
        if n_nextn == 0:
            raise CheckpointError(f"num_nextn_predict_layers = 0: the checkpoint has no {word} layer", self.config_path)
        self.n_nextn = 1 if n_nextn is None else n_nextn
        limit = f"llama.cpp loads at most {LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)"
        self.n_layer = self.hparam_int("num_hidden_layers", maximum=LLAMA_MAX_LAYERS - self.n_nextn,
                                       limit=f"with {self.n_nextn} {word} layer(s) after them, {limit}")

    def _narrow_to_blocks(self, count: int) -> None:
        """Open only the first ``count`` NextN layers: :attr:`layer_prefixes` and :attr:`tensor_prefix`."""
        self.n_nextn = count
        #: ``model.layers.{N+k}.`` of each NextN block, in block order.
        self.layer_prefixes = tuple(f"{self.layer_roots[0]}{self.first_layer + k}." for k in range(count))
        prefixes = tuple(f"{root}{self.first_layer + k}." for root in self.layer_roots for k in range(count))
        self.tensor_prefix = prefixes[0] if len(prefixes) == 1 else prefixes  # type: ignore[misc]
        #: (block, name inside the layer) -> tensor, for every tensor of the NextN layers
        self._present = {found: tensor for tensor in self.checkpoint.tensors.values()
                         if (found := self._in_layer(tensor.name)) is not None and found[0] < count}

    @property
    def first_layer(self) -> int:
        """The checkpoint's number of the first NextN layer: ``N`` (:attr:`numbered_after_trunk`), else 0."""
        return self.n_layer if self.numbered_after_trunk else 0

    def _in_layer(self, name: str) -> tuple[int, str] | None:
        """(NextN block, name inside the layer as :meth:`layer_name` gives it) of a checkpoint tensor of a layer
        ``first_layer + k`` (``k`` may be beyond the head's blocks), else ``None``."""
        root = next((r for r in self.layer_roots if name.startswith(r)), None)
        if root is None:
            return None
        layer, _, suffix = name[len(root) :].partition(".")
        if not suffix or _LAYER_NUMBER.fullmatch(layer) is None or int(layer) < self.first_layer:
            return None
        return int(layer) - self.first_layer, self.layer_name(suffix)

    def _check_layers_present(self) -> None:
        """Refuse a ``num_nextn_predict_layers`` the checkpoint's layers do not bear out, naming the first absent."""
        blocks = {found[0] for name in self.checkpoint.tensors if (found := self._in_layer(name)) is not None}
        absent = next((k for k in range(self.n_nextn) if k not in blocks), None)
        if absent is not None and absent > 0:  # none at all: head_tensors says "no MTP head"
            raise CheckpointError(
                f"num_nextn_predict_layers = {self.n_nextn}, but the checkpoint has no NextN layer "
                f"{self.layer_roots[0]}{self.first_layer + absent} (NextN block {absent + 1} of {self.n_nextn})",
                self.config_path)

    def keep_first_blocks(self, count: int) -> None:
        """Convert only the first ``count`` NextN layers (llama.cpp's single-block MTP graphs run a file of one); a
        family whose graph chains its blocks (:attr:`chained_blocks`) converts them all.

        Raises:
            ParameterError: ``count`` is not 1 .. :attr:`n_nextn`.
        """
        if self.chained_blocks:
            super().keep_first_blocks(count)
            return
        if not 1 <= count <= self.n_nextn:
            raise ParameterError(f"nextn_blocks {count}: the head has {self.n_nextn} NextN block(s); keep "
                                 f"1..{self.n_nextn} of them")
        self._narrow_to_blocks(count)

    # ---------------------------------------------------------------- family hooks (override these)

    def layer_name(self, suffix: str) -> str:
        """A checkpoint name inside a layer as the family's names take it (Step-3.5 renames some first)."""
        return suffix

    def layer_shapes(self, block: int) -> dict[str, tuple[int, ...]]:
        """GGUF name (``{bid}`` for the layer's block) -> row-major shape of the ``block``-th NextN layer, in output
        order (most families: :meth:`glue_shapes` around the decoder layer's)."""
        raise NotImplementedError

    def layer_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        """Map one tensor of a NextN layer to ``(gguf_name, source)`` pairs, ``{bid}`` for its block (stacked
        experts arrive already named for theirs); a family whose tensors are split or transformed extends it."""
        stacked = self.stack_expert(tensor)
        if stacked is not None:
            yield from stacked
            return
        name = self.block_name(tensor)
        if not self.keep_copies and name in self.copy_names():
            return
        yield name, TensorSource.single(tensor)

    def unmapped_hint(self, suffix: str) -> str:
        """What to add to the refusal of a layer tensor ``suffix`` the family's names do not map (e.g. what its graph
        needs instead); empty by default."""
        return ""

    # ------------------------------------------------------------------------------------ tensors

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        return {at_block(name, k): shape for k in range(self.n_nextn) for name, shape in self.layer_shapes(k).items()}

    def nextn_block(self, tensor: SafetensorsTensor) -> int:
        return self._layer_match(tensor)[0]

    def layer_suffix(self, tensor: SafetensorsTensor) -> str:
        """A tensor's name inside its NextN layer (``self_attn.q_proj.weight``), as :meth:`layer_name` gives it."""
        return self._layer_match(tensor)[1]

    def _layer_match(self, tensor: SafetensorsTensor) -> tuple[int, str]:
        found = self._in_layer(tensor.name)
        if found is None or found[0] >= self.n_nextn:
            raise CheckpointError(f"tensor {tensor.name!r} is not in the head's {self.layer_word} layers", tensor.path)
        return found

    def block_name(self, tensor: SafetensorsTensor) -> str:
        """The GGUF name of a tensor of a NextN layer, with ``{bid}`` for its block.

        Raises:
            CheckpointError: neither the family's names (or the NextN glue and gguf-py's table) name it.
        """
        suffix = self.layer_suffix(tensor)
        hint = self.unmapped_hint(suffix)
        unknown = f"cannot map tensor {tensor.name!r} to a llama.cpp {self.arch} NextN tensor{hint}"
        if self.layer_names is not None:
            entry = self.layer_names.get(suffix)
            if entry is None:
                raise CheckpointError(unknown, tensor.path)
            return self.format_tensor_name(*entry)
        glue = NEXTN_GLUE.get(suffix)
        if glue is not None:
            return self.format_tensor_name(glue)
        if suffix.endswith("e_score_correction_bias"):  # llama.cpp's converter renames it the same way
            suffix = suffix[: -len("_bias")] + ".bias"
        # Every NextN layer is mapped as the first: gguf-py's table for N + 1 blocks names model.layers.N.*.
        name = self._tensor_map.get_name(self.layer_prefixes[0] + suffix, try_suffixes=(".weight", ".bias"))
        block = f"blk.{self.n_layer}."
        if name is None or not name.startswith(block):
            raise CheckpointError(unknown, tensor.path)
        return "blk.{bid}." + name[len(block) :]

    def modify_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        block = self.nextn_block(tensor)
        for name, source in self.layer_tensors(tensor):
            yield at_block(name, block), source

    def copy_names(self) -> tuple[str, ...]:
        """GGUF names of the layer's embedding / LM head copies."""
        return tuple(self.format_tensor_name(key) for key, _ in NEXTN_COPIES)

    def has(self, suffix: str, block: int = 0) -> bool:
        """Whether NextN layer ``block`` (by default the first) has tensor ``{suffix}`` (as :meth:`layer_name` names
        it)."""
        return (block, suffix) in self._present

    def copy_rows(self, suffix: str, block: int = 0) -> int:
        """The vocabulary rows of a layer's embedding / LM head copy: ``vocab_size``, else the tensor's own."""
        if self.vocab_size is not None:
            return self.vocab_size
        tensor = self._present.get((block, suffix))
        return tensor.shape[0] if tensor is not None and tensor.shape else 0

    def present_shapes(self, block: int, optional: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """GGUF name -> shape of what NextN layer ``block`` has of ``optional`` (name inside the layer -> shape) and of
        its own embedding, head norm and LM head, in that order, named by :attr:`layer_names` (for a family whose
        block holds them between its attention and its MLP, as Step-3.5's and MiMo-V2's do)."""
        assert self.layer_names is not None, "present_shapes names tensors by the family's own table"
        h = self.n_embd
        candidates = {**optional, "embed_tokens.weight": (self.copy_rows("embed_tokens.weight", block), h),
                      "shared_head.norm.weight": (h,),
                      "shared_head.head.weight": (self.copy_rows("shared_head.head.weight", block), h)}
        return {self.format_tensor_name(*self.layer_names[rest]): shape for rest, shape in candidates.items()
                if self.has(rest, block)}

    def glue_shapes(self, layer: dict[str, tuple[int, ...]], block: int = 0) -> dict[str, tuple[int, ...]]:
        """A NextN block's shapes: the fusion (``eh_proj``, ``enorm``, ``hnorm``), the family's decoder layer
        ``layer``, then what llama.cpp loads when NextN layer ``block`` has it (the head norm, the kept copies), in
        the order llama.cpp's converter writes them."""
        h, name = self.n_embd, self.format_tensor_name
        shapes = {name(T.NEXTN_EH_PROJ): (h, 2 * h), name(T.NEXTN_ENORM): (h,), name(T.NEXTN_HNORM): (h,), **layer}
        if any(self.has(norm, block) for norm in self.head_norm_names):
            shapes[name(T.NEXTN_SHARED_HEAD_NORM)] = (h,)
        if self.keep_copies:
            for key, suffix in NEXTN_COPIES:
                if self.has(suffix, block):
                    shapes[name(key)] = (self.copy_rows(suffix, block), h)
        return shapes

    def target_checks(self) -> list[TargetCheck]:
        return [TargetCheck("block_count", self.n_layer, "num_hidden_layers"), *super().target_checks()]
