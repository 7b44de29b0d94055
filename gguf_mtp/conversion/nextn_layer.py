"""What the families whose MTP head is one more decoder layer share: GLM-4.5 (``glm4moe``), GLM-4.7-Flash and
DeepSeek V3/R1 (``deepseek2``), and the DeepSeek/GLM-shaped families after them.

The head is the checkpoint's layer ``model.layers.{N}.*`` with ``N = num_hidden_layers`` (with
``num_nextn_predict_layers: k`` the layers ``N`` .. ``N + k - 1``, one NextN block each): an ordinary decoder layer
of the trunk's kind, plus the NextN glue gguf-py's ``TensorNameMap`` names for every architecture
(``eh_proj``, ``enorm``, ``hnorm``, ``shared_head.norm``, and the layer's own copies of the embedding and LM head,
``embed_tokens`` and ``shared_head.head``; llama.cpp's converter keeps the copies, ``keep_nextn_copies=False``
drops them and llama.cpp then uses the trunk's). The decoder layer's names come from gguf-py's table for the
architecture, the glue's from the global ``TENSOR_NAMES`` (PyPI gguf 0.19.0 has NextN entries for few
architectures), and routed experts are stacked one expert at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, get_tensor_name_map

from gguf_mtp.errors import CheckpointError, ParameterError
from gguf_mtp.format.safetensors_io import Checkpoint, NamePrefix, SafetensorsTensor

from .base import HeadModel, TargetCheck
from .hf_names import NEXTN_GLUE_NAMES
from .hparams import LLAMA_MAX_LAYERS
from .tensors import TensorSource, at_block

__all__ = ["NEXTN_COPIES", "NEXTN_GLUE", "NextNLayerModel"]

T = MODEL_TENSOR

#: The NextN layer's own copies of the embedding and the LM head (GLM-4.5 and DeepSeek V3 ship them).
NEXTN_COPIES = (T.NEXTN_EMBED_TOKENS, T.NEXTN_SHARED_HEAD_HEAD)
#: A tensor of a decoder layer: its layer number (at most 6 digits, bounded before int() sees it) and its name in it.
_LAYER = re.compile(r"^model\.layers\.(?P<layer>[0-9]{1,6})\.(?P<suffix>.+)$")
#: checkpoint suffix (after ``model.layers.{N}.``) -> gguf-py tensor: llama.cpp's generic NextN sources
#: (gguf-py ``tensor_mapping.py``, ``MODEL_TENSOR.NEXTN_*``).
NEXTN_GLUE: dict[str, MODEL_TENSOR] = {name: key for name, (key, _) in NEXTN_GLUE_NAMES.items()}


class NextNLayerModel(HeadModel):
    """A head that is the decoder layer ``model.layers.{num_hidden_layers}``, or the ``num_nextn_predict_layers``
    layers from there on (one NextN block each, written renumbered together ``blk.N`` .. ``blk.N+k-1``).

    A family subclass reads its own hyperparameters in :meth:`read_layer_hparams` (starting with
    :meth:`~HeadModel.read_common_hparams`), maps one layer's tensors in :meth:`layer_tensors` and lists one layer's
    shapes with :meth:`layer_shapes` (:meth:`glue_shapes` around them), both with ``{bid}`` for the layer's block:
    the blocks after the first are this class's job.
    """

    #: What ``convert`` opens the checkpoint with before it knows ``N`` (see :meth:`head_prefix`); each
    #: instance narrows it to its NextN layers' ``model.layers.{N+k}.``.
    tensor_prefix: ClassVar[NamePrefix] = "model.layers."
    #: Keep the layer's ``embed_tokens`` / ``shared_head.head`` copies in the NextN block (llama.cpp's converter
    #: does); ``False`` drops them and llama.cpp uses the trunk's.
    keep_nextn_copies: ClassVar[bool] = True
    #: gguf-py's name table the decoder layer is mapped with, when :attr:`model_arch` is a name the installed gguf-py
    #: does not know (``deepseek32``: glm-dsa's table, the same Hugging Face names); ``None``: :attr:`model_arch`'s.
    name_table_arch: ClassVar[MODEL_ARCH | None] = None

    @classmethod
    def head_prefix(cls, config: dict[str, Any]) -> NamePrefix:
        """The name prefixes of the head's tensors for a ``config.json``: ``model.layers.{num_hidden_layers}.``, one
        more per further NextN layer (what to download from the Hub and open: only the shards of the NextN layers)."""
        n_layer, n_nextn = config.get("num_hidden_layers"), config.get("num_nextn_predict_layers", 1)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in (n_layer, n_nextn)):
            return cls.tensor_prefix  # refused with a proper message once the model reads its config
        assert isinstance(n_layer, int) and isinstance(n_nextn, int)
        if n_layer + n_nextn > LLAMA_MAX_LAYERS:
            return cls.tensor_prefix
        prefixes = tuple(f"model.layers.{n_layer + k}." for k in range(n_nextn))
        return prefixes[0] if n_nextn == 1 else prefixes

    def __init__(self, checkpoint: Checkpoint, *, keep_nextn_copies: bool | None = None) -> None:
        super().__init__(checkpoint)
        self.keep_copies = self.keep_nextn_copies if keep_nextn_copies is None else keep_nextn_copies
        n_nextn = self.optional_hparam_int("num_nextn_predict_layers", minimum=0, maximum=LLAMA_MAX_LAYERS - 1)
        if n_nextn == 0:
            raise CheckpointError("num_nextn_predict_layers = 0: the checkpoint has no NextN layer", self.config_path)
        self.n_nextn = 1 if n_nextn is None else n_nextn
        limit = f"llama.cpp loads at most {LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)"
        self.n_layer = self.hparam_int("num_hidden_layers", maximum=LLAMA_MAX_LAYERS - self.n_nextn,
                                       limit=f"with {self.n_nextn} NextN layer(s) after them, {limit}")
        self._narrow_to_blocks(self.n_nextn)
        self._check_layers_present()
        self._present = {name for name in checkpoint.tensors if name.startswith(self.layer_prefixes[0])}
        self.read_layer_hparams()
        # gguf-py's name table for a model of N + 1 blocks maps model.layers.N.* to blk.N.*.
        table = self.name_table_arch or self.model_arch
        if not isinstance(table, MODEL_ARCH):  # a family gguf-py does not know has no name table there
            raise TypeError(f"{type(self).__name__}: NextNLayerModel needs an architecture in gguf-py's MODEL_ARCH")
        self._tensor_map = get_tensor_name_map(table, self.n_layer + 1)

    def _narrow_to_blocks(self, count: int) -> None:
        """Open only the first ``count`` NextN layers: :attr:`layer_prefixes` and :attr:`tensor_prefix`."""
        self.n_nextn = count
        #: ``model.layers.{N+k}.`` of each NextN block, in block order.
        self.layer_prefixes = tuple(f"model.layers.{self.n_layer + k}." for k in range(count))
        self.tensor_prefix = self.layer_prefixes[0] if count == 1 else self.layer_prefixes  # type: ignore[misc]

    def _check_layers_present(self) -> None:
        """Refuse a ``num_nextn_predict_layers`` the checkpoint's layers do not bear out, naming the first absent."""
        layers = {int(m["layer"]) for name in self.checkpoint.tensors if (m := _LAYER.match(name)) is not None}
        absent = next((k for k in range(self.n_nextn) if self.n_layer + k not in layers), None)
        if absent is not None and absent > 0:  # none at all: head_tensors says "no MTP head"
            raise CheckpointError(
                f"num_nextn_predict_layers = {self.n_nextn}, but the checkpoint has no NextN layer "
                f"model.layers.{self.n_layer + absent} (NextN block {absent + 1} of {self.n_nextn})",
                self.config_path)

    def keep_first_blocks(self, count: int) -> None:
        """Convert only the first ``count`` NextN layers (llama.cpp's single-block MTP graphs run a file of one).

        Raises:
            ParameterError: ``count`` is not 1 .. :attr:`n_nextn`.
        """
        if not 1 <= count <= self.n_nextn:
            raise ParameterError(f"nextn_blocks {count}: the head has {self.n_nextn} NextN block(s); keep "
                                 f"1..{self.n_nextn} of them")
        self._narrow_to_blocks(count)

    def read_layer_hparams(self) -> None:
        """Read the family's hyperparameters (common ones first, :meth:`~HeadModel.read_common_hparams`)."""
        raise NotImplementedError

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF name (``{bid}`` for the layer's block) -> row-major shape of one NextN layer, in output order."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ tensors

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        one = self.layer_shapes()
        return {at_block(name, k): shape for k in range(self.n_nextn) for name, shape in one.items()}

    def nextn_block(self, tensor: SafetensorsTensor) -> int:
        return int(self._layer_match(tensor)["layer"]) - self.n_layer

    def layer_suffix(self, tensor: SafetensorsTensor) -> str:
        """A tensor's name inside its NextN layer (``self_attn.q_proj.weight``)."""
        return self._layer_match(tensor)["suffix"]

    def _layer_match(self, tensor: SafetensorsTensor) -> re.Match[str]:
        match = _LAYER.match(tensor.name)
        if match is None or not 0 <= int(match["layer"]) - self.n_layer < self.n_nextn:
            raise CheckpointError(f"tensor {tensor.name!r} is not in a NextN layer", tensor.path)
        return match

    def block_name(self, tensor: SafetensorsTensor) -> str:
        """The GGUF name of a tensor of a NextN layer, with ``{bid}`` for its block.

        Raises:
            CheckpointError: neither the NextN glue nor gguf-py's table for the architecture names it.
        """
        suffix = self.layer_suffix(tensor)
        glue = NEXTN_GLUE.get(suffix)
        if glue is not None:
            return self.format_tensor_name(glue)
        if suffix.endswith("e_score_correction_bias"):  # llama.cpp's converter renames it the same way
            suffix = suffix[: -len("_bias")] + ".bias"
        # Every NextN layer is mapped as the first: gguf-py's table for N + 1 blocks names model.layers.N.*.
        name = self._tensor_map.get_name(self.layer_prefixes[0] + suffix, try_suffixes=(".weight", ".bias"))
        block = f"blk.{self.n_layer}."
        if name is None or not name.startswith(block):
            raise CheckpointError(f"cannot map tensor {tensor.name!r} to a llama.cpp NextN tensor", tensor.path)
        return "blk.{bid}." + name[len(block) :]

    def modify_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        block = self.nextn_block(tensor)
        for name, source in self.layer_tensors(tensor):
            yield at_block(name, block), source

    def layer_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        """Map one tensor of a NextN layer to ``(gguf_name, source)`` pairs, ``{bid}`` for its block (stacked
        experts arrive already named for theirs)."""
        stacked = self.stack_expert(tensor)
        if stacked is not None:
            yield from stacked
            return
        name = self.block_name(tensor)
        if not self.keep_copies and name in self.copy_names():
            return
        yield name, TensorSource.single(tensor)

    def copy_names(self) -> tuple[str, ...]:
        """GGUF names of the layer's embedding / LM head copies."""
        return tuple(self.format_tensor_name(key) for key in NEXTN_COPIES)

    def has(self, suffix: str) -> bool:
        """Whether the (first) NextN layer has tensor ``model.layers.{N}.{suffix}``."""
        return self.layer_prefixes[0] + suffix in self._present

    def glue_shapes(self, layer: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """A NextN block's shapes: the fusion (``eh_proj``, ``enorm``, ``hnorm``), the family's decoder layer
        ``layer``, then what llama.cpp loads when present (``shared_head.norm``, the kept copies), in the order
        llama.cpp's converter writes them."""
        h, name = self.n_embd, self.format_tensor_name
        shapes = {name(T.NEXTN_EH_PROJ): (h, 2 * h), name(T.NEXTN_ENORM): (h,), name(T.NEXTN_HNORM): (h,), **layer}
        if self.has("shared_head.norm.weight"):
            shapes[name(T.NEXTN_SHARED_HEAD_NORM)] = (h,)
        if self.keep_copies:
            for key, suffix in ((T.NEXTN_EMBED_TOKENS, "embed_tokens.weight"),
                                (T.NEXTN_SHARED_HEAD_HEAD, "shared_head.head.weight")):
                if self.has(suffix):
                    rows = self.vocab_size
                    tensor = self.checkpoint.tensors[self.layer_prefixes[0] + suffix]
                    shapes[name(key)] = (rows if rows is not None else tensor.shape[0], h)
        return shapes

    def target_checks(self) -> list[TargetCheck]:
        return [TargetCheck("block_count", self.n_layer, "num_hidden_layers"), *super().target_checks()]
