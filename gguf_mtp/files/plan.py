"""The plan vocabulary: what an output file is made of, in order.

A planned file is a list of segments: literal bytes (a header), a byte range of an input file copied
verbatim, zero padding, or bytes generated on the fly in bounded chunks (converted tensor data). The
planners (``gguf_mtp.format.layout``, ``gguf_mtp.jobs``, ``gguf_mtp.conversion``) build them; the one
writer (``gguf_mtp.write``) writes exactly them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Bytes", "CopyRange", "Generated", "OutputFile", "Segment", "Zeros", "rebind", "slice_segments"]


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


def slice_segments(segments: Sequence[Segment], offset: int, nbytes: int, name: str) -> Iterator[Segment]:
    """The pieces of bytes ``offset .. offset + nbytes`` of a file planned as ``segments``.

    A generated segment can only be taken whole (its bytes exist only as a stream).

    Raises:
        TypeError: the range cuts through a generated segment.
        ValueError: the range lies beyond the planned file.
    """
    position, end = 0, offset + nbytes
    for segment in segments:
        segment_end = position + segment.nbytes
        lo, hi = max(offset, position), min(end, segment_end)
        if lo < hi:
            if isinstance(segment, Bytes):
                yield Bytes(segment.data[lo - position : hi - position])
            elif isinstance(segment, Zeros):
                yield Zeros(hi - lo)
            elif isinstance(segment, CopyRange):
                yield CopyRange(segment.source, segment.offset + lo - position, hi - lo)
            elif isinstance(segment, Generated) and (lo, hi) == (position, segment_end):
                yield segment  # a re-typed tensor, taken whole
            else:
                raise TypeError(f"{name}: cannot slice a {type(segment).__name__} segment")
        position = segment_end
        if position >= end:
            return
    raise ValueError(f"{name}: bytes {offset:,}..{end:,} lie beyond the planned file ({position:,} bytes)")


def rebind(output: OutputFile, virtual: Mapping[Path, OutputFile]) -> OutputFile:
    """``output`` with every range it copies from a planned, never written file (``virtual``, by path) replaced
    by the segments that file was planned from: the bytes travel once, from the real inputs to ``output``.

    A plan made against a planned file (graft's draft, ``--replace-head``'s trunk-only target) is thus the
    same bytes as the two runs it stands for, without the file in between.
    """
    segments: list[Segment] = []
    for segment in output.segments:
        planned = virtual.get(segment.source) if isinstance(segment, CopyRange) else None
        if isinstance(segment, CopyRange) and planned is not None:
            segments.extend(slice_segments(planned.segments, segment.offset, segment.nbytes, str(planned.path)))
        else:
            segments.append(segment)
    rebound = OutputFile(output.path, tuple(segments))
    assert rebound.size == output.size and not rebound.sources & set(virtual), "rebinding keeps every byte"
    return rebound
