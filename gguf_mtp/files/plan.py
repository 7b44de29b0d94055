"""The plan vocabulary: what an output file is made of, in order.

A planned file is a list of segments: literal bytes (a header), a byte range of an input file copied
verbatim, zero padding, or bytes generated on the fly in bounded chunks (converted tensor data). The
planners (``gguf_mtp.format.layout``, ``gguf_mtp.jobs``, ``gguf_mtp.conversion``) build them; the one
writer (``gguf_mtp.write``) writes exactly them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Bytes", "CopyRange", "Generated", "OutputFile", "Segment", "Zeros"]


@dataclass(frozen=True)
class Bytes:
    """Literal bytes (a serialised header)."""

    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class CopyRange:
    """``nbytes`` bytes of ``source`` starting at absolute ``offset``, copied verbatim."""

    source: Path
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Zeros:
    """Zero padding."""

    nbytes: int


@dataclass(frozen=True)
class Generated:
    """``nbytes`` bytes produced by ``chunks()`` one bounded buffer at a time (data transformed on the way,
    e.g. a tensor converted from BF16 to F32), so memory stays flat whatever the total."""

    nbytes: int
    chunks: Callable[[], Iterable[Any]]  # each chunk supports the buffer protocol (bytes, numpy array)


Segment = Bytes | CopyRange | Zeros | Generated


@dataclass(frozen=True)
class OutputFile:
    """One file to write: its final path and its contents as segments, in order."""

    path: Path
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(s.nbytes for s in self.segments)

    @property
    def sources(self) -> set[Path]:
        return {s.source for s in self.segments if isinstance(s, CopyRange)}
