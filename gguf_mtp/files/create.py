"""Create a file gguf-mtp writes: exclusively, and never through a link someone planted.

Every file the package creates -- the temporary outputs (``.NAME.PID.partial``), the commit journal and
its temporary file, the work-folder marker, the pipeline's state file, model cards -- is created by
:func:`create_exclusive`, the one place that opens a file for writing by name. ``O_CREAT | O_EXCL``
fails if anything already has the name (a file, a link, even a dangling one), and ``O_NOFOLLOW`` keeps
the last component from being followed, so a symlink planted in a shared output folder can never make
a run write somewhere else (or truncate another file): the run fails with one line instead.

:func:`write_then_rename` builds "write a temporary file, fsync it, rename it, fsync the folder" on top of
it: with :func:`replace_atomically` the rename goes over the old name, for the small files gguf-mtp
rewrites in a folder it owns (the model card); gguf-mtp's small JSON files (the work-folder marker, the
pipeline's state, the commit journal, which is renamed only to a free name) go through
:func:`gguf_mtp.files.json_io.write_json_file`, which builds on it too.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from gguf_mtp.constants import PARTIAL_SUFFIX
from gguf_mtp.errors import UnsafeOutputError

__all__ = ["create_exclusive", "fsync_dir", "replace_atomically", "temporary_name", "write_all", "write_then_rename"]

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def temporary_name(final: Path) -> Path:
    """``.NAME.PID.partial`` beside ``final`` (``NAME.PID.partial`` for a hidden ``NAME``): the temporary
    name of everything gguf-mtp writes."""
    hidden = final.name if final.name.startswith(".") else f".{final.name}"
    return final.with_name(f"{hidden}.{os.getpid()}{PARTIAL_SUFFIX}")


def create_exclusive(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """Create ``path`` and open it for writing; it must not exist in any form (file, link, dangling link).

    Returns:
        The descriptor (the caller closes it).

    Raises:
        UnsafeOutputError: something already has that name: one line naming it (nothing was touched).
        OSError: any other reason the file cannot be created.
    """
    try:
        return os.open(path, _FLAGS, mode)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ELOOP):
            raise UnsafeOutputError(
                "cannot create this file: something already has its name (a link or a file gguf-mtp did not "
                "create); nothing was written through it, remove it and run again",
                path,
            ) from None
        raise


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Make ``path`` hold ``data``: written to a new temporary file (:func:`create_exclusive`), fsynced,
    then renamed over ``path`` (a link at ``path`` is replaced, never followed).

    Only for files of a folder gguf-mtp owns (its work folders), where the old file is its own.

    Raises:
        UnsafeOutputError: the temporary name is taken (see :func:`create_exclusive`).
        OSError: writing or renaming failed (the temporary file is removed).
    """
    write_then_rename(path, data, os.replace, mode)


def write_then_rename(
    path: Path, data: bytes, rename: Callable[[Path, Path], object], mode: int = 0o644
) -> None:
    """Write ``data`` to a new temporary file beside ``path`` (:func:`create_exclusive`), fsync it,
    ``rename(temporary, path)`` and fsync the folder: ``path`` holds all of ``data`` or is untouched.

    Raises:
        UnsafeOutputError: the temporary name is taken (see :func:`create_exclusive`).
        OSError: writing or ``rename`` failed (the temporary file is removed).
    """
    temporary = temporary_name(path)
    fd = create_exclusive(temporary, mode)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        rename(temporary, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make a folder's entries (new names, renames) durable; best effort where the filesystem cannot."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        with suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
