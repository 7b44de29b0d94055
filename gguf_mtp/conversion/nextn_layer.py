"""What the families whose MTP head is one more decoder layer share: GLM-4.5 (``glm4moe``), GLM-4.7-Flash and
DeepSeek V3/R1 (``deepseek2``), and the DeepSeek/GLM-shaped families after them.

The head is the checkpoint's layer ``model.layers.{N}.*`` with ``N = num_hidden_layers``: an ordinary decoder layer
of the trunk's kind, plus the NextN glue gguf-py's ``TensorNameMap`` names for every architecture
(``eh_proj``, ``enorm``, ``hnorm``, ``shared_head.norm``, and the layer's own copies of the embedding and LM head,
``embed_tokens`` and ``shared_head.head``; llama.cpp's converter keeps the copies, ``keep_nextn_copies=False``
drops them and llama.cpp then uses the trunk's). The decoder layer's names come from gguf-py's table for the
architecture, the glue's from the global ``TENSOR_NAMES`` (PyPI gguf 0.19.0 has NextN entries for few
architectures), and routed experts are stacked one expert at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from gguf import MODEL_ARCH, MODEL_TENSOR, get_tensor_name_map

from gguf_mtp.errors import CheckpointError

from .base import LLAMA_MAX_LAYERS, HeadModel, TargetCheck, TensorSource
from .safetensors_io import Checkpoint, SafetensorsTensor

__all__ = ["NEXTN_COPIES", "NEXTN_GLUE", "NextNLayerModel"]

T = MODEL_TENSOR

#: The NextN layer's own copies of the embedding and the LM head (GLM-4.5 and DeepSeek V3 ship them).
NEXTN_COPIES = (T.NEXTN_EMBED_TOKENS, T.NEXTN_SHARED_HEAD_HEAD)
#: checkpoint suffix (after ``model.layers.{N}.``) -> gguf-py tensor: llama.cpp's generic NextN sources
#: (gguf-py ``tensor_mapping.py``, ``MODEL_TENSOR.NEXTN_*``).
NEXTN_GLUE: dict[str, MODEL_TENSOR] = {
    "eh_proj.weight": T.NEXTN_EH_PROJ,
    "enorm.weight": T.NEXTN_ENORM,
    "hnorm.weight": T.NEXTN_HNORM,
    "shared_head.norm.weight": T.NEXTN_SHARED_HEAD_NORM,
    "embed_tokens.weight": T.NEXTN_EMBED_TOKENS,
    "shared_head.head.weight": T.NEXTN_SHARED_HEAD_HEAD,
}


class NextNLayerModel(HeadModel):
    """A head that is the decoder layer ``model.layers.{num_hidden_layers}`` (``num_nextn_predict_layers: 1``).

    A family subclass reads its own hyperparameters in :meth:`read_layer_hparams` (starting with
    :meth:`~HeadModel.read_common_hparams`) and lists its layer's shapes with :meth:`glue_shapes` around them.
    """

    #: What ``convert`` opens the checkpoint with before it knows ``N`` (see :meth:`head_prefix`); each
    #: instance narrows it to ``model.layers.{N}.``.
    tensor_prefix: ClassVar[str] = "model.layers."
    #: Keep the layer's ``embed_tokens`` / ``shared_head.head`` copies in the NextN block (llama.cpp's converter
    #: does); ``False`` drops them and llama.cpp uses the trunk's.
    keep_nextn_copies: ClassVar[bool] = True
    #: gguf-py's name table the decoder layer is mapped with, when :attr:`model_arch` is a name the installed gguf-py
    #: does not know (``deepseek32``: glm-dsa's table, the same Hugging Face names); ``None``: :attr:`model_arch`'s.
    name_table_arch: ClassVar[MODEL_ARCH | None] = None

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
        n_nextn = self.optional_hparam_int("num_nextn_predict_layers", minimum=0, maximum=LLAMA_MAX_LAYERS)
        if n_nextn is not None and n_nextn != 1:
            what = "the checkpoint has no NextN layer" if n_nextn == 0 else "only one NextN block is supported"
            raise CheckpointError(f"num_nextn_predict_layers = {n_nextn}: {what}", self.config_path)
        self.n_layer = self.hparam_int("num_hidden_layers", maximum=LLAMA_MAX_LAYERS - 1,
                                       limit=f"llama.cpp loads at most {LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)")
        self.tensor_prefix = f"model.layers.{self.n_layer}."  # type: ignore[misc]  # per instance
        self._present = {name for name in checkpoint.tensors if name.startswith(self.tensor_prefix)}
        self.read_layer_hparams()
        # gguf-py's name table for a model of N + 1 blocks maps model.layers.N.* to blk.N.*.
        table = self.name_table_arch or self.model_arch
        if not isinstance(table, MODEL_ARCH):  # a family gguf-py does not know has no name table there
            raise TypeError(f"{type(self).__name__}: NextNLayerModel needs an architecture in gguf-py's MODEL_ARCH")
        self._tensor_map = get_tensor_name_map(table, self.n_layer + 1)

    def read_layer_hparams(self) -> None:
        """Read the family's hyperparameters (common ones first, :meth:`~HeadModel.read_common_hparams`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ tensors

    def block_name(self, tensor: SafetensorsTensor) -> str:
        """The GGUF name of a tensor of the NextN layer, with ``{bid}`` for the block index.

        Raises:
            CheckpointError: neither the NextN glue nor gguf-py's table for the architecture names it.
        """
        suffix = tensor.name[len(self.tensor_prefix) :]
        glue = NEXTN_GLUE.get(suffix)
        if glue is not None:
            return self.format_tensor_name(glue)
        hf_name = tensor.name
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
        name = self.block_name(tensor)
        if not self.keep_copies and name in self.copy_names():
            return
        yield name, TensorSource.single(tensor)

    def copy_names(self) -> tuple[str, ...]:
        """GGUF names of the layer's embedding / LM head copies."""
        return tuple(self.format_tensor_name(key) for key in NEXTN_COPIES)

    def has(self, suffix: str) -> bool:
        """Whether the NextN layer has tensor ``model.layers.{N}.{suffix}``."""
        return self.tensor_prefix + suffix in self._present

    def glue_shapes(self, layer: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """The NextN block's shapes: the fusion (``eh_proj``, ``enorm``, ``hnorm``), the family's decoder layer
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
                    tensor = self.checkpoint.tensors[self.tensor_prefix + suffix]
                    shapes[name(key)] = (rows if rows is not None else tensor.shape[0], h)
        return shapes

    def target_checks(self) -> list[TargetCheck]:
        return [TargetCheck("block_count", self.n_layer, "num_hidden_layers"), *super().target_checks()]
