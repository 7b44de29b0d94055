"""Prove two byte ranges identical from the filesystem's extent maps (FIEMAP), without reading them.

On a reflink filesystem a composite's tensor data shares the target's extents: the same physical
blocks back both files, so their bytes are the same bytes. ``FS_IOC_FIEMAP`` maps a file's logical
offsets to physical ones; where two ranges map to the same physical addresses throughout, identity is
proven. The proof is conservative: anything unclear means "not proven" and the caller compares bytes:
another device, an ioctl the filesystem lacks, a hole, extents flagged unwritten, delayed allocation,
unknown location, encoded (compressed), encrypted, inline or tail-packed data, offsets not congruent
modulo :data:`~gguf_mtp.files.kernel_copy.SHARE_BLOCK`, or more extents than :data:`MAX_EXTENTS`.
``FIEMAP_FLAG_SYNC`` makes the kernel write dirty pages back first, so a mapping is never one of data
still in the page cache.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import os
import struct
from dataclasses import dataclass

from .kernel_copy import SHARE_BLOCK

__all__ = ["MAX_EXTENTS", "Extent", "ExtentProver", "file_extents"]

#: ``FS_IOC_FIEMAP`` = ``_IOWR('f', 11, struct fiemap)``.
_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
#: ``struct fiemap``: fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, fm_reserved.
_FIEMAP = struct.Struct("=QQIIII")
#: ``struct fiemap_extent``: fe_logical, fe_physical, fe_length, 2 reserved u64, fe_flags, 3 reserved u32.
_EXTENT = struct.Struct("=QQQ16xI12x")

_EXTENT_LAST = 0x1
_EXTENT_MERGED = 0x1000
_EXTENT_SHARED = 0x2000
#: Flags that leave the physical address meaning "these bytes live here"; any other flag (unknown,
#: delalloc, encoded, encrypted, not aligned, inline, tail, unwritten, or one added later) does not.
_TRUSTED_FLAGS = _EXTENT_LAST | _EXTENT_MERGED | _EXTENT_SHARED

#: Extents asked for per ioctl.
_BATCH = 512
#: A file mapped in more extents than this is compared byte by byte (bounds memory and time).
MAX_EXTENTS = 1_000_000

#: Errors that mean "no extent map here" (tmpfs, FUSE, procfs, an old kernel).
_NO_FIEMAP = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS, errno.EBADR, errno.EPERM}


@dataclass(frozen=True)
class Extent:
    """One mapped extent: ``length`` bytes at file offset ``logical`` live at ``physical``."""

    logical: int
    physical: int
    length: int
    flags: int

    @property
    def trusted(self) -> bool:
        """Whether ``physical`` certainly holds these bytes (see :data:`_TRUSTED_FLAGS`)."""
        return not self.flags & ~_TRUSTED_FLAGS

    @property
    def shared(self) -> bool:
        """Whether the filesystem says other files use these blocks too (a reflink, a snapshot)."""
        return bool(self.flags & _EXTENT_SHARED)


def file_extents(fd: int, *, limit: int = MAX_EXTENTS) -> list[Extent] | None:
    """Every extent of the file open as ``fd``, in logical order; ``None`` where there is no extent
    map (the filesystem has no FIEMAP) or it has more than ``limit`` extents.

    Raises:
        OSError: an I/O error reading the map (not one of "unsupported").
    """
    extents: list[Extent] = []
    start = 0
    size = os.fstat(fd).st_size
    while start < size:
        request = bytearray(_FIEMAP.size + _BATCH * _EXTENT.size)
        _FIEMAP.pack_into(request, 0, start, size - start, _FIEMAP_FLAG_SYNC, 0, _BATCH, 0)
        try:
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, request)
        except OSError as e:
            if e.errno in _NO_FIEMAP:
                return None
            raise
        mapped = min(_FIEMAP.unpack_from(request, 0)[3], _BATCH)  # bounded: never trust a count blindly
        if mapped == 0:
            break  # the rest of the file is a hole
        batch = [Extent(*_EXTENT.unpack_from(request, _FIEMAP.size + i * _EXTENT.size)) for i in range(mapped)]
        for extent in batch:
            previous_end = extents[-1].logical + extents[-1].length if extents else 0
            if extent.length == 0 or extent.logical < previous_end:
                return None  # empty or overlapping extents: not a map to reason with
            extents.append(extent)
        if len(extents) > limit:
            return None
        last = batch[-1]
        if last.flags & _EXTENT_LAST:
            break
        start = max(start + 1, last.logical + last.length)
    return extents


class ExtentProver:
    """Proves ranges of two files identical by their extent maps; maps are read once per descriptor."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[list[int], list[Extent]] | None] = {}

    def _map(self, fd: int) -> tuple[list[int], list[Extent]] | None:
        if fd not in self._maps:
            try:
                extents = file_extents(fd)
            except OSError:
                extents = None  # unreadable map: compare the bytes, which reports the real error if any
            self._maps[fd] = None if extents is None else ([e.logical for e in extents], extents)
        return self._maps[fd]

    def _physical(self, fd: int, offset: int) -> tuple[int, int] | None:
        """(physical address of file byte ``offset``, bytes left in its extent), if trusted."""
        mapped = self._map(fd)
        if mapped is None:
            return None
        starts, extents = mapped
        index = bisect.bisect_right(starts, offset) - 1
        if index < 0:
            return None
        extent = extents[index]
        inside = offset - extent.logical
        if inside >= extent.length or not extent.trusted:
            return None  # a hole, or a mapping that does not say where the bytes are
        return extent.physical + inside, extent.length - inside

    def shared_span(self, fd_a: int, offset_a: int, fd_b: int, offset_b: int, nbytes: int) -> tuple[int, int]:
        """The block-aligned part ``(lo, hi)`` of ``nbytes`` at ``offset_a`` of ``fd_a`` and ``offset_b``
        of ``fd_b`` (relative to the range) proven to be the same physical bytes; ``(0, 0)`` if none."""
        if (offset_a - offset_b) % SHARE_BLOCK or nbytes < SHARE_BLOCK:
            return 0, 0
        try:
            if os.fstat(fd_a).st_dev != os.fstat(fd_b).st_dev:
                return 0, 0
        except OSError:
            return 0, 0
        lo = -offset_a % SHARE_BLOCK
        hi = lo + (nbytes - lo) // SHARE_BLOCK * SHARE_BLOCK
        position = lo
        while position < hi:
            a = self._physical(fd_a, offset_a + position)
            b = self._physical(fd_b, offset_b + position)
            if a is None or b is None or a[0] != b[0]:
                return 0, 0  # all or nothing: a partly shared tensor is simply compared
            position += min(a[1], b[1], hi - position)
        return (lo, hi) if hi > lo else (0, 0)
