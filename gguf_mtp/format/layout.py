"""Where copied byte ranges land in an output: headers padded so tensor data can share extents.

A filesystem with reflink (XFS, btrfs, ZFS block cloning) can make an output share an input's
extents instead of copying the bytes, but only for a range whose destination offset and source offset
are equal modulo the block size. A header that changes size (compose adds KVs and tensor entries,
strip removes them) shifts the whole data section and breaks that. So every planned header is padded
to put the data section back in step with its source, modulo :data:`~gguf_mtp.files.kernel_copy.SHARE_BLOCK`
(4 KiB, a multiple of every common block size):

- the padding is one KV of our own namespace, :data:`PAD_KEY` (``gguf_mtp.pad``), an array of zero
  ``u8`` appended after every other KV; llama.cpp and gguf-py read and ignore it. Its length is the
  smallest that puts the data section (still a multiple of ``general.alignment``, with the header's
  usual zero fill up to it) at the wanted offset: at most 4,095 bytes plus the KV's own 36;
- it is a pure function of the header without padding and of the source offset: the same inputs give
  the same bytes on every filesystem, and no padding is added where the data is already in step;
- a padding KV an input carries is dropped first and recomputed, so ``strip`` of a composite gives
  back its target byte for byte (the target's data offset is what compose matched).

Which source offset the data section follows: the ranges taken from the file the output is derived
from (a target shard for compose and graft, the source shard for strip) when there are any, else all
copied ranges; of those, the offset residue covering the most bytes. Ranges from another file (the
appended draft tensors) can only be in step where their own offsets happen to agree.

Where tensors land inside a data section is here too (:func:`pack_tensors`): llama.cpp's dense
layout, which every planner that places tensors (compose, extract, strip, convert) follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gguf.constants import GGUFValueType

from gguf_mtp.files.kernel_copy import SHARE_BLOCK
from gguf_mtp.files.plan import CopyRange, OutputFile, Segment, Zeros

from .header import GGUFArray, GGUFHeader, KeyValue, TensorInfo, align_up, encode_kv, serialize_header

__all__ = [
    "PAD_KEY",
    "Congruence",
    "appended_data_residue",
    "congruence",
    "congruent_header",
    "header_at_residue",
    "placements",
    "without_padding",
]

#: The padding KV compose, strip, graft and extract add (and drop again).
PAD_KEY = "gguf_mtp.pad"

#: Bytes of the padding KV besides its items: key length (8) + key + type (4) + item type (4) + count (8).
_PAD_OVERHEAD = 8 + len(PAD_KEY.encode()) + 4 + 4 + 8


def pack_tensors(
    items: Iterable[tuple[TensorInfo, Sequence[Segment]]], alignment: int, *, start: int = 0, pad_end: bool = True
) -> tuple[list[TensorInfo], list[Segment], int]:
    """Place tensors as llama.cpp reads a data section: each at the previous one's end rounded up to
    ``alignment``, in order, from ``start`` (data-relative).

    Each item is a tensor (its ``offset`` is ignored) and the segments that make its bytes. Returns the
    tensors at their offsets, the segments with zero fill between them (and after the last with
    ``pad_end``, as llama.cpp's writer pads every tensor), and the end of the data written.
    """
    infos: list[TensorInfo] = []
    segments: list[Segment] = []
    position = start
    for tensor, data in items:
        offset = align_up(position, alignment)
        if offset > position:
            segments.append(Zeros(offset - position))
        infos.append(replace(tensor, offset=offset))
        segments += data
        position = offset + tensor.nbytes
    end = align_up(position, alignment) if pad_end else position
    if end > position:
        segments.append(Zeros(end - position))
    return infos, segments, end


def without_padding(kvs: Iterable[KeyValue]) -> list[KeyValue]:
    """``kvs`` without a padding KV (an input made by gguf-mtp carries one)."""
    return [kv for kv in kvs if kv.key != PAD_KEY]


def _padding_kv(nbytes: int) -> KeyValue:
    return encode_kv(PAD_KEY, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.UINT8, (0,) * nbytes))


def _wanted_residue(data: Sequence[Segment], source: Path | None, alignment: int) -> int | None:
    """The data offset residue (mod SHARE_BLOCK) that puts the most bytes in step, or None."""
    by_residue: dict[int, int] = {}
    from_source: dict[int, int] = {}
    position = 0  # relative to the start of the data section
    for segment in data:
        if isinstance(segment, CopyRange):
            residue = (segment.offset - position) % SHARE_BLOCK
            # A data section starts at a multiple of the alignment: other residues are out of reach.
            if residue % min(alignment, SHARE_BLOCK) == 0:
                by_residue[residue] = by_residue.get(residue, 0) + segment.nbytes
                if source is not None and segment.source == source:
                    from_source[residue] = from_source.get(residue, 0) + segment.nbytes
        position += segment.nbytes
    candidates = from_source or by_residue
    if not candidates:
        return None
    # max() keeps the first of equal counts: dicts keep insertion order, so ties are deterministic.
    return max(candidates, key=candidates.__getitem__)


def congruent_header(
    version: int,
    kvs: Iterable[KeyValue],
    tensors: Sequence[TensorInfo],
    alignment: int,
    data: Sequence[Segment],
    source: Path | None = None,
) -> bytes:
    """A complete header (like :func:`~gguf_mtp.format.header.serialize_header`) whose data section
    starts in step, modulo :data:`SHARE_BLOCK`, with the copied ranges of ``data``.

    Args:
        version, kvs, tensors, alignment: the header's contents (a padding KV among ``kvs`` is dropped).
        data: the data section's planned segments, in order (its offsets are what is matched).
        source: the file the output is derived from: its ranges decide (see the module docstring).

    Returns:
        The header bytes, zero-filled to the data section; with a :data:`PAD_KEY` KV last where needed.
    """
    kv_list = without_padding(kvs)
    return header_at_residue(version, kv_list, tensors, alignment, _wanted_residue(data, source, alignment))


def header_at_residue(
    version: int, kvs: Iterable[KeyValue], tensors: Sequence[TensorInfo], alignment: int, residue: int | None
) -> bytes:
    """A complete header whose data section starts at ``residue`` modulo :data:`SHARE_BLOCK` (padded with a
    :data:`PAD_KEY` KV where needed; ``None``, or a residue the alignment cannot reach: no padding).

    ``residue`` must be a multiple of ``alignment`` (a data section starts at a multiple of it).
    """
    kv_list = without_padding(kvs)
    plain = serialize_header(version, kv_list, tensors, alignment)
    if residue is None or alignment >= SHARE_BLOCK or len(plain) % SHARE_BLOCK == residue:
        return plain
    if residue % alignment:
        raise ValueError(f"data residue {residue} is not a multiple of the alignment {alignment}")
    # Without the alignment fill the tensor table ends here; the padding KV goes before the table.
    unpadded = len(serialize_header(version, kv_list, tensors, 1))
    start = unpadded + _PAD_OVERHEAD
    items = (residue - start) % SHARE_BLOCK
    header = serialize_header(version, [*kv_list, _padding_kv(items)], tensors, alignment)
    assert len(header) == start + items and len(header) % SHARE_BLOCK == residue, "padding arithmetic"
    return header


def appended_data_residue(last_shard: GGUFHeader) -> int:
    """Where compose puts a draft's data section in the composite's last shard, modulo :data:`SHARE_BLOCK`.

    Compose keeps the shard's data in step with its source and appends the draft's tensors right after the
    shard's packed data, with their relative offsets unchanged (the same alignment). A draft whose data
    section starts at this residue is therefore in step too, and a reflink filesystem shares its bytes.
    """
    return (last_shard.data_offset + last_shard.packed_data_size) % SHARE_BLOCK


def placements(output: OutputFile) -> Iterator[tuple[int, CopyRange]]:
    """Every copied range of ``output`` with its absolute destination offset."""
    position = 0
    for segment in output.segments:
        if isinstance(segment, CopyRange):
            yield position, segment
        position += segment.nbytes


@dataclass(frozen=True)
class Congruence:
    """How much of a plan's copied bytes can share extents with their inputs."""

    copied: int  # bytes planned as copies of input ranges
    in_step: int  # of those, bytes in ranges whose destination offset is congruent to the source's
    shareable: int  # of those, bytes in whole SHARE_BLOCK blocks (what a reflink filesystem can share)


def congruence(outputs: Iterable[OutputFile]) -> Congruence:
    """Tally the copied ranges of ``outputs`` by whether they can share extents."""
    copied = in_step = shareable = 0
    for output in outputs:
        for destination, segment in placements(output):
            copied += segment.nbytes
            if (destination - segment.offset) % SHARE_BLOCK == 0:
                in_step += segment.nbytes
                head = -segment.offset % SHARE_BLOCK
                shareable += max(0, segment.nbytes - head) // SHARE_BLOCK * SHARE_BLOCK
    return Congruence(copied, in_step, shareable)
