"""Scratch folders beside an output (the MTP head fetched by byte ranges, up to ~15 GB), and their removal once
the run that made one is dead.

A scratch folder is named ``.gguf-mtp-head.PID.XXXXXXXX`` (the pid of the run, a random tail) and its run holds
an ``flock`` on the folder itself for as long as it uses it. A run killed outright (SIGKILL, a power cut) cannot
remove it; the next run that looks into that folder does, when both proofs hold: no process has that pid, and
the lock can be taken (the kernel drops a dead process's locks; a pid reused by another process only keeps the
folder longer). A live run's scratch, this process's own included, is never touched.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gguf_mtp.errors import UnsafeOutputError
from gguf_mtp.text import human_bytes

__all__ = [
    "SCRATCH_PREFIX", "existing_ancestor", "pid_alive", "remove_dead_scratch", "remove_if_dead", "scratch_folder",
    "scratch_pid",
]

logger = logging.getLogger(__name__)

#: The start of every scratch folder's name: ``.gguf-mtp-head.PID.`` and a random tail follow.
SCRATCH_PREFIX = ".gguf-mtp-head."
_SCRATCH = re.compile(re.escape(SCRATCH_PREFIX) + r"(?P<pid>[1-9][0-9]{0,9})\.[A-Za-z0-9_]{1,32}")
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def existing_ancestor(path: Path) -> Path:
    """``path`` (absolute) if it exists, else its nearest parent that does: where a folder to be made would lie."""
    probe = path.absolute()
    while not os.path.lexists(probe) and probe.parent != probe:  # lexists never raises
        probe = probe.parent
    return probe


def scratch_pid(name: str) -> int | None:
    """The pid in a scratch folder's name, or ``None`` when ``name`` is not one."""
    match = _SCRATCH.fullmatch(name)
    return int(match["pid"]) if match else None


@contextmanager
def scratch_folder(parent: Path) -> Iterator[Path]:
    """A new, locked scratch folder in ``parent`` (which exists), removed when the block ends, however it ends.

    Dead runs' scratch folders in ``parent`` are removed first (see the module).

    Raises:
        UnsafeOutputError: the folder cannot be made there (not a folder, not writable).
    """
    note = remove_dead_scratch(parent)
    if note is not None:
        logger.warning(note)
    try:
        folder = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}.", dir=parent))
    except OSError as e:
        raise UnsafeOutputError(f"cannot make a scratch folder for the head here: {e.strerror or e}", parent) from None
    fd = os.open(folder, _DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)


def remove_dead_scratch(folder: Path) -> str | None:
    """Remove the scratch folders of dead runs from ``folder``.

    Returns:
        One line saying how many folders and bytes were freed, and whose they were; ``None`` if none.
    """
    removed = freed = 0
    pids: set[int] = set()
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in names:
        pid = scratch_pid(name)
        if pid is None:
            continue
        nbytes = remove_if_dead(folder / name, pid)
        if nbytes is not None:
            removed, freed = removed + 1, freed + nbytes
            pids.add(pid)
    if not removed:
        return None
    whose = ", ".join(str(p) for p in sorted(pids))
    return f"{folder}: removed {removed} scratch folder(s) ({human_bytes(freed)}) left by killed gguf-mtp runs " \
           f"(pid {whose})"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (``os.kill(pid, 0)``; one we may not signal exists too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):  # not a pid this system can have
        return False
    return True


def remove_if_dead(path: Path, pid: int) -> int | None:
    """Remove the scratch folder ``path`` of the run ``pid`` when that run is proved dead; the bytes freed, or
    ``None`` when it was left (a live run's, a link, not a folder, locked)."""
    if pid_alive(pid):
        return None
    try:
        fd = os.open(path, _DIRECTORY)  # never through a link
    except OSError:
        return None
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live run holds it (another pid namespace's, a reused pid's)
            return None
        freed = _disk_bytes(path)
        shutil.rmtree(path, ignore_errors=True)
        return freed
    finally:
        os.close(fd)


def _disk_bytes(folder: Path) -> int:
    """The blocks the files under ``folder`` take (links not followed)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                total += getattr(info, "st_blocks", 0) * 512 or info.st_size
    return total
