"""Open an input for reading only if it is a regular file, without ever blocking on a named pipe.

Every input gguf-mtp reads (GGUF shards, ``config.json``, safetensors files, indexes, the pipeline's
state file) goes through :func:`open_regular`: a FIFO would make ``open()`` wait for a writer forever,
and a device could be read without end, so both are refused before a byte is read.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotARegularFileError", "open_regular"]


class NotARegularFileError(OSError):
    """The path is a named pipe, socket or device: reading it could block forever or never end."""


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading, refusing anything but a regular file, and never wait on a FIFO.

    Args:
        follow_links: open what a symbolic link at ``path`` points to; ``False`` refuses the link
            (``O_NOFOLLOW``: an ``OSError`` with ``ELOOP``), for the files gguf-mtp writes itself.

    Returns:
        ``(descriptor, its fstat)``; the caller closes the descriptor.

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: ``path`` is a directory.
        NotARegularFileError: a named pipe, socket or device.
        OSError: any other reason it cannot be opened (``ELOOP``: a link, with ``follow_links=False``).
    """
    name = os.fspath(path)
    # O_NONBLOCK: opening a named pipe must not wait for a writer (it is refused just below). Reads of
    # regular files ignore the flag.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(name, flags)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFileError(0, "not a regular file (a pipe, socket or device)", name)
    except BaseException:
        os.close(fd)
        raise
    return fd, info
