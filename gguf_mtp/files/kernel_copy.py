"""Copy byte ranges between files in the kernel, sharing extents where the filesystem can.

A range is appended to the destination's current position. When the destination position and the
source offset are congruent modulo :data:`SHARE_BLOCK` (what :mod:`gguf_mtp.format.layout` plans for), the
range splits into an unaligned head, a block-aligned body and a tail: the body is cloned with
``FICLONERANGE`` (XFS with reflink, btrfs, ZFS with block cloning: the output then shares the input's
extents, no data is read or written), head and tail are copied. Wherever cloning is impossible
(ext4, tmpfs, another filesystem, offsets that are not congruent) the copy goes through
``copy_file_range``, then ``sendfile``, then a plain ``pread``/``write`` loop, exactly as before.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from gguf_mtp.constants import COPY_CHUNK
from gguf_mtp.errors import OutputWriteError

__all__ = [
    "COPY_METHODS",
    "ENV_COPY_METHOD",
    "SHARE_BLOCK",
    "CopyTally",
    "Progress",
    "can_share",
    "copy_method",
    "copy_range",
    "shareable_bytes",
]

#: Which kernel path copies use: ``auto`` (clone where possible, else copy_file_range, falling back), or
#: one forced method (never cloning, so each method can be tested on its own).
ENV_COPY_METHOD = "GGUF_MTP_COPY_METHOD"
COPY_METHODS = ("auto", "copy_file_range", "sendfile", "readwrite")

#: Ranges are shared in units of this many bytes: a multiple of the block size of every common
#: filesystem set-up (XFS and ext4 default to 4 KiB; 1 and 2 KiB blocks divide it).
SHARE_BLOCK = 4096

#: ``FICLONERANGE`` = ``_IOW(0x94, 13, struct file_clone_range)``; the struct is
#: ``{s64 src_fd; u64 src_offset; u64 src_length; u64 dest_offset}``.
_FICLONERANGE = 0x4020940D
_CLONE_ARGS = struct.Struct("=qQQQ")

#: Bytes cloned per ioctl: each call is quick, and Ctrl-C is seen between calls.
CLONE_CHUNK = 1024 * 1024 * 1024

#: Errors that mean "this path cannot do it here", so the next path is tried.
_FALLBACK_ERRNOS = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.ETXTBSY, errno.EPERM}
#: ... and for cloning also "no such ioctl on this filesystem" and a range the filesystem will not clone.
_NO_CLONE_ERRNOS = _FALLBACK_ERRNOS | {errno.ENOTTY, errno.EISDIR, errno.ENOTSUP}

logger = logging.getLogger(__name__)


class Progress(Protocol):
    """What a copy reports its progress to (a tqdm bar, or a :class:`CopyTally`)."""

    def update(self, n: int) -> object: ...


class CopyTally:
    """Counts the bytes a write shared (cloned extents) apart from those it copied, and moves the
    progress bar for both: a shared range advances it in one step, it does not crawl."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.shared = 0
        self.copied = 0
        self.fallbacks: set[tuple[str, int | None]] = set()  # (method, errno) already logged at INFO

    def update(self, n: int) -> None:
        """``n`` more bytes copied."""
        self.copied += n
        self.bar.update(n)

    def share(self, n: int) -> None:
        """``n`` more bytes shared with the input."""
        self.shared += n
        self.bar.update(n)


def copy_method() -> str:
    """The copy method ``GGUF_MTP_COPY_METHOD`` asks for (``auto`` when unset).

    Raises:
        OutputWriteError: the variable names no method.
    """
    method = os.environ.get(ENV_COPY_METHOD, "auto")
    if method not in COPY_METHODS:
        raise OutputWriteError(f"{ENV_COPY_METHOD}={method!r}: use one of {', '.join(COPY_METHODS)}")
    return method


def copy_range(src_fd: int, dst_fd: int, offset: int, nbytes: int, bar: Progress, method: str) -> str:
    """Append ``nbytes`` of ``src_fd`` at ``offset`` to ``dst_fd`` (at its current position).

    With ``method`` ``auto`` and congruent offsets, the block-aligned body is cloned (reported to
    ``bar.share`` when ``bar`` is a :class:`CopyTally`); everything else is copied.

    Returns:
        The method that moved the copied bytes, or ``"reflink"`` when every byte was shared.

    Raises:
        OutputWriteError: the input ended early.
        OSError: an I/O error no fallback can avoid (disk full, say).
    """
    if method != "auto" or nbytes < SHARE_BLOCK:
        return _stream(src_fd, dst_fd, offset, nbytes, bar, method)
    position = os.lseek(dst_fd, 0, os.SEEK_CUR)
    if (position - offset) % SHARE_BLOCK:
        return _stream(src_fd, dst_fd, offset, nbytes, bar, method)
    head = -offset % SHARE_BLOCK
    body = (nbytes - head) // SHARE_BLOCK * SHARE_BLOCK
    if not body:
        return _stream(src_fd, dst_fd, offset, nbytes, bar, method)
    used: list[str] = []
    if head:
        used.append(_stream(src_fd, dst_fd, offset, head, bar, method))
    cloned = _clone(src_fd, dst_fd, offset + head, body, position + head, bar)
    if cloned:
        os.lseek(dst_fd, position + head + cloned, os.SEEK_SET)
    rest = offset + head + cloned
    if rest < offset + nbytes:
        used.append(_stream(src_fd, dst_fd, rest, offset + nbytes - rest, bar, method))
    return used[0] if used else "reflink"


def _clone(src_fd: int, dst_fd: int, offset: int, nbytes: int, dst_offset: int, bar: Progress) -> int:
    """Clone block-aligned ``nbytes`` of ``src_fd`` at ``offset`` to ``dst_fd`` at ``dst_offset``; the
    number of bytes cloned (0 where the filesystem cannot share them)."""
    done = 0
    while done < nbytes:
        n = min(CLONE_CHUNK, nbytes - done)
        try:
            fcntl.ioctl(dst_fd, _FICLONERANGE, _CLONE_ARGS.pack(src_fd, offset + done, n, dst_offset + done))
        except OSError as e:
            if e.errno in _NO_CLONE_ERRNOS:
                _fallback(bar, "reflink (FICLONERANGE)", e, "copying instead")
                break
            raise
        done += n
        share = getattr(bar, "share", None)
        (share or bar.update)(n)
    return done


def _stream(src_fd: int, dst_fd: int, offset: int, nbytes: int, bar: Progress, method: str) -> str:
    """Copy ``nbytes`` of ``src_fd`` at ``offset`` to ``dst_fd``: copy_file_range, sendfile, read/write."""
    end = offset + nbytes
    if method in ("auto", "copy_file_range") and hasattr(os, "copy_file_range"):
        try:
            while offset < end:
                n = os.copy_file_range(src_fd, dst_fd, min(COPY_CHUNK, end - offset), offset)
                if n == 0:
                    raise OutputWriteError(f"input ended early (at byte {offset:,})")
                offset += n
                bar.update(n)
            return "copy_file_range"
        except OSError as e:
            if method != "auto" or e.errno not in _FALLBACK_ERRNOS:
                raise
            _fallback(bar, "copy_file_range", e, "trying sendfile" if hasattr(os, "sendfile") else "using read/write")
    if method in ("auto", "sendfile") and hasattr(os, "sendfile"):
        try:
            while offset < end:
                n = os.sendfile(dst_fd, src_fd, offset, min(COPY_CHUNK, end - offset))
                if n == 0:
                    raise OutputWriteError(f"input ended early (at byte {offset:,})")
                offset += n
                bar.update(n)
            return "sendfile"
        except OSError as e:
            if method != "auto" or e.errno not in _FALLBACK_ERRNOS:
                raise
            _fallback(bar, "sendfile", e, "using read/write")
    while offset < end:
        chunk = os.pread(src_fd, min(8 * 1024 * 1024, end - offset), offset)
        if not chunk:
            raise OutputWriteError(f"input ended early (at byte {offset:,})")
        view = memoryview(chunk)
        while view:
            written = os.write(dst_fd, view)
            view = view[written:]
        offset += len(chunk)
        bar.update(len(chunk))
    return "readwrite"


def _fallback(bar: Progress, method: str, error: OSError, then: str) -> None:
    """Log that ``method`` cannot be used here: at INFO the first time a :class:`CopyTally` (one write)
    meets it, at DEBUG after that (a write of many ranges would otherwise repeat it for each)."""
    code = errno.errorcode.get(error.errno, str(error.errno)) if error.errno is not None else "no errno"
    seen: set[tuple[str, int | None]] | None = getattr(bar, "fallbacks", None)
    key = (method, error.errno)
    first = seen is None or key not in seen
    if seen is not None:
        seen.add(key)
    level = logging.INFO if first else logging.DEBUG
    logger.log(level, "%s is not possible here (%s: %s): %s", method, code, error.strerror or error, then)


def can_share(source: Path, folder: Path) -> bool:
    """Whether a file written in ``folder`` can share extents with ``source``: one block of it is
    cloned into an unnamed temporary file there (``O_TMPFILE``: nothing to clean up). False where
    anything stands in the way (another filesystem, no reflink, a source under one block, no O_TMPFILE).
    """
    if copy_method() != "auto" or not hasattr(os, "O_TMPFILE"):
        return False
    try:
        src = os.open(source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        if os.fstat(src).st_size < SHARE_BLOCK:
            return False
        try:
            dst = os.open(folder, os.O_TMPFILE | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError:
            return False
        try:
            fcntl.ioctl(dst, _FICLONERANGE, _CLONE_ARGS.pack(src, 0, SHARE_BLOCK, 0))
        except OSError:
            return False
        finally:
            os.close(dst)
        return True
    finally:
        os.close(src)


def shareable_bytes(files: Iterable[Any], folder: Path) -> int:
    """Bytes of the planned ``files`` (:class:`gguf_mtp.files.plan.OutputFile`) that writing them into
    ``folder`` will share with their inputs instead of copying: the whole blocks of every copied range
    that is congruent to its source, from a source :func:`can_share` with ``folder``. The disk-space
    preflight counts them as free (they take no new blocks)."""
    probed: dict[Path, bool] = {}
    total = 0
    for planned in files:
        position = 0
        for segment in planned.segments:
            source = getattr(segment, "source", None)  # a CopyRange (this module does not import output)
            if source is not None and (position - segment.offset) % SHARE_BLOCK == 0:
                head = -segment.offset % SHARE_BLOCK
                body = max(0, segment.nbytes - head) // SHARE_BLOCK * SHARE_BLOCK
                if body and probed.setdefault(source, can_share(source, folder)):
                    total += body
            position += segment.nbytes
    return total
