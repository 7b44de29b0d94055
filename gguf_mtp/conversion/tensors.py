"""What a head's tensors become: GGUF name templates with the NextN block left in (``blk.{bid}...``), the checkpoint
tensors an output tensor is made of (:class:`TensorSource`, experts stacked by :class:`ExpertStack`), and the type it
is written in (:class:`MappedTensor`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gguf import GGMLQuantizationType

from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.header import tensor_nbytes
from gguf_mtp.format.safetensors_io import SafetensorsTensor

__all__ = [
    "FLOAT_DTYPES",
    "BlockIndex",
    "ExpertStack",
    "MappedTensor",
    "TensorSource",
    "at_block",
    "first_block_template",
    "shown_name",
]

Q = GGMLQuantizationType

#: Floating-point safetensors dtypes the converter reads, and the ggml type that holds them unchanged.
FLOAT_DTYPES: dict[str, GGMLQuantizationType | None] = {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16, "F64": None}


class BlockIndex(int):
    """The first NextN block's index, as GGUF name templates are formatted with it: ``{bid}`` is the block
    itself, ``{bid[k]}`` the k-th block after it (a head of several NextN blocks, renumbered together)."""

    def __getitem__(self, offset: int) -> int:
        return int(self) + offset


class _ShownBlock:
    """``{bid}`` shown as ``N`` and ``{bid[k]}`` as ``N+k`` in messages about a name template."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def __format__(self, spec: str) -> str:
        return f"N+{self.offset}" if self.offset else "N"

    def __getitem__(self, offset: int) -> _ShownBlock:
        return _ShownBlock(offset)


#: ``{bid[k]}`` in a name template (the k-th NextN block after the first).
_LATER_BLOCK = re.compile(r"\{bid\[[0-9]+\]\}")


def at_block(template: str, offset: int) -> str:
    """A name template of the first NextN block (``blk.{bid}...``) moved to the ``offset``-th block after it
    (``blk.{bid[offset]}...``); a template already naming a later block is left as it is."""
    return template.replace("{bid}", f"{{bid[{offset}]}}") if offset else template


def first_block_template(template: str) -> str:
    """A name template of any NextN block as the first block's: ``blk.{bid[2]}.x`` -> ``blk.{bid}.x`` (the rules
    that hold for every block compare against this)."""
    return _LATER_BLOCK.sub("{bid}", template)


def shown_name(template: str) -> str:
    """A GGUF name template for messages: ``blk.{bid[1]}.attn_q.weight`` -> ``blk.N+1.attn_q.weight``."""
    return template.format(bid=_ShownBlock())


@dataclass(frozen=True)
class TensorSource:
    """What one output tensor is made of: checkpoint tensors concatenated in order.

    One part for an ordinary tensor; for stacked experts one part per expert, stacked on a new
    outermost axis (so the result's bytes are the experts' bytes one after the other, which is why
    they can be written expert after expert without ever materialising the stack).
    """

    parts: tuple[SafetensorsTensor, ...]
    shape: tuple[int, ...]  # row-major (torch) shape of the result

    @classmethod
    def single(cls, tensor: SafetensorsTensor) -> TensorSource:
        return cls((tensor,), tensor.shape)

    @classmethod
    def stack(cls, parts: Sequence[SafetensorsTensor]) -> TensorSource:
        """Stack same-shaped, same-dtype tensors on a new outer axis (``torch.stack(parts, dim=0)``).

        Raises:
            CheckpointError: the parts disagree in shape or dtype.
        """
        first = parts[0]
        for part in parts[1:]:
            if part.shape != first.shape or part.dtype != first.dtype:
                raise CheckpointError(
                    f"cannot stack {part.name} ({part.dtype} {list(part.shape)}) with {first.name} "
                    f"({first.dtype} {list(first.shape)})",
                    part.path,
                )
        return cls(tuple(parts), (len(parts), *first.shape))

    @property
    def dtype(self) -> str:
        return self.parts[0].dtype

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    @property
    def ggml_shape(self) -> tuple[int, ...]:
        """The shape in ggml order (ne0, the innermost dimension, first)."""
        return tuple(reversed(self.shape))


@dataclass(frozen=True)
class MappedTensor:
    """A checkpoint tensor (or stack) under its GGUF name, with the type it will be written in.

    ``via`` is set when ``ggml_type`` follows llama-quantize's rules (an ``outtype`` llama.cpp's converter does not
    write): the type the converter writes the tensor in by default, which llama-quantize would start from. The
    values are rounded to it first (FP8 dequantized to BF16, as the converter's file holds them), then quantized
    and checked as llama-quantize does (a NaN or an infinity is refused)."""

    name: str
    source: TensorSource
    ggml_type: GGMLQuantizationType
    via: GGMLQuantizationType | None = None

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.source.ggml_shape, self.ggml_type)

    @property
    def rounded_to(self) -> GGMLQuantizationType | None:
        """``via`` where rounding to it changes the values before they are quantized: ``None`` without ``via``, when
        ``via`` is the output type itself, or when the source is stored in ``via`` already (a BF16 matrix)."""
        part = self.source.parts[0]
        if self.via is None or self.via == self.ggml_type:
            return None
        if not part.transformed and FLOAT_DTYPES.get(part.dtype) == self.via:
            return None
        return self.via


@dataclass
class ExpertStack:
    """The experts of one projection, collected until all are present (they may arrive in any order);
    only their descriptions are held, never their data."""

    count: int
    parts: dict[int, SafetensorsTensor] = field(default_factory=dict)

    def add(self, index: int, tensor: SafetensorsTensor) -> TensorSource | None:
        if not 0 <= index < self.count:
            raise CheckpointError(f"{tensor.name}: expert {index} is outside 0..{self.count - 1} (config.json)",
                                  tensor.path)
        self.parts[index] = tensor
        if len(self.parts) < self.count:
            return None
        return TensorSource.stack([self.parts[i] for i in sorted(self.parts)])

    def missing(self, limit: int = 6) -> list[int]:
        """Up to ``limit`` expert indices not seen (the count is bounded by config validation anyway)."""
        return list(itertools.islice((i for i in range(self.count) if i not in self.parts), limit))

    @property
    def n_missing(self) -> int:
        return self.count - len(self.parts)

