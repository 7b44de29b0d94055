"""The template of every head that is a separate MTP module under ``mtp.*`` (Nemotron-H's MTPv2, Qwen3.5's and
Qwen3-Next's), folded into one NextN block.

The module's tensors are named by the family's table of checkpoint names (:attr:`MTPModuleModel.module_names`);
routed experts are stacked one expert at a time; a family transforms a tensor on the way (:meth:`stored`: Qwen's
``1 + weight`` norms) or maps what is not one tensor under another name (:meth:`other_tensors`: packed experts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import NamePrefix, SafetensorsTensor

from .base import HeadModel, TensorKey
from .tensors import TensorSource

__all__ = ["MTPModuleModel"]


class MTPModuleModel(HeadModel):
    """A head that is an ``mtp.*`` module of its own, converted to one NextN block."""

    tensor_prefix: ClassVar[NamePrefix] = "mtp."
    #: checkpoint name -> (gguf-py tensor, GGUF suffix) of every tensor that is one checkpoint tensor renamed.
    module_names: ClassVar[Mapping[str, tuple[TensorKey, str]]] = {}

    def stored(self, tensor: SafetensorsTensor) -> SafetensorsTensor:
        """A renamed tensor's values as written (the tensor itself; Qwen's norms read ``+ 1``)."""
        return tensor

    def other_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        """Map a tensor that is neither renamed nor a routed expert's (none by default: refused, naming it)."""
        raise CheckpointError(f"cannot map tensor {tensor.name!r} to a llama.cpp {self.arch} NextN tensor",
                              tensor.path)

    def modify_tensors(self, tensor: SafetensorsTensor) -> Iterable[tuple[str, TensorSource]]:
        entry = self.module_names.get(tensor.name)
        if entry is not None:
            yield self.format_tensor_name(*entry), TensorSource.single(self.stored(tensor))
            return
        stacked = self.stack_expert(tensor)
        yield from self.other_tensors(tensor) if stacked is None else stacked
