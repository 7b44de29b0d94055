"""Start writing an output's bytes to disk while the rest of the set is still being copied.

A write puts its bytes in the page cache; the ``fsync`` that makes them durable before the rename
phase (:mod:`gguf_mtp.files.commit`) then writes them all out at once, while nothing else runs. On a set
smaller than the kernel's own background-writeback threshold (10 % of RAM by default) nothing reaches
the disk before that ``fsync``: the disk idles during the copy and the copy idles during the flush, a
fixed cost each run pays (issue 41: a 1 GB compose trailed ``cp`` + ``sync`` by ~1.5x). Here, every
:data:`WRITEBACK_STEP` bytes written, ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` hands the range just
written to the disk without waiting for it, so the copy and the flush overlap and the ``fsync`` finds
little left to do.

This only moves work earlier; it promises nothing: durability still comes from the ``fsync`` of each
file and folder in :mod:`gguf_mtp.write` and :mod:`gguf_mtp.files.commit`. So it is best effort: where
``sync_file_range`` does not exist (not Linux, an old libc) or fails (a filesystem that refuses it), it
does nothing; a real I/O error is not consumed by it either (``SYNC_FILE_RANGE_WRITE`` alone does not
collect write-back errors), so the ``fsync`` still reports it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["WRITEBACK_STEP", "EarlyWriteback", "start_writeback"]

#: Bytes written between two write-back starts: large enough that the calls cost nothing (a few dozen
#: per GB), small enough that the disk gets work early in a set of a few hundred MB.
WRITEBACK_STEP = 32 * 1024 * 1024

#: ``SYNC_FILE_RANGE_WRITE`` (``<linux/fs.h>``): start write-out of the dirty pages of the range, do not wait.
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux, or a libc without it
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing bytes ``offset`` to ``offset + nbytes`` of ``fd`` to disk, without
    waiting (a no-op where the system cannot; durability still needs ``fsync``)."""
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # best effort: the result is not needed


class EarlyWriteback:
    """Starts write-back of one output as it grows: :meth:`advance` after each piece written (the file's
    position is its end), :meth:`finish` once it is complete."""

    def __init__(self, fd: int, step: int | None = None) -> None:
        self.fd = fd
        self.step = step or WRITEBACK_STEP
        self.started = 0  # bytes before this offset were handed to the disk already

    def advance(self) -> None:
        """Hand the bytes written since the last start to the disk once there are at least ``step`` of them."""
        position = os.lseek(self.fd, 0, os.SEEK_CUR)
        if position - self.started >= self.step:
            self._start(position)

    def pieces(self, offset: int, nbytes: int) -> Iterator[tuple[int, int]]:
        """``(offset, nbytes)`` pieces of a range to copy, so that :meth:`advance` runs within a long copy.

        The cuts fall on multiples of ``step`` in the source, where a reflink copy cuts anyway (a multiple
        of :data:`gguf_mtp.files.kernel_copy.SHARE_BLOCK`): every piece after the first starts block-aligned,
        so cutting shares exactly the extents one call would.
        """
        end = offset + nbytes
        while offset < end:
            cut = min(end, (offset // self.step + 1) * self.step)
            yield offset, cut - offset
            offset = cut

    def finish(self) -> None:
        """Hand the rest of the file to the disk (the fsync that follows then waits for less)."""
        self._start(os.lseek(self.fd, 0, os.SEEK_CUR))

    def _start(self, position: int) -> None:
        start_writeback(self.fd, self.started, position - self.started)
        self.started = max(self.started, position)
