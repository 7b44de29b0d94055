"""Put a set of finished temporary files in place of their final names, recoverably.

:func:`gguf_mtp.write.write_outputs` writes every file of a set under a temporary name; this module
does the rest, inside one output folder:

- **a lock** on the folder for the whole run: ``flock`` on a descriptor of the folder itself (no lock
  file to leave behind), so a second gguf-mtp writer into the same folder is refused, never merged;
- **no-replace renames** (``renameat2(RENAME_NOREPLACE)``, else ``link`` + ``unlink``): a file that
  appeared at a final name after the checks is never overwritten, the run fails instead;
- **a journal** (:data:`JOURNAL_NAME`, written and fsynced before the first rename, removed after the
  last): it names every temporary file, final name and moved-aside old file of the set, so the run that
  finds it -- the writer that wrote it is dead, since the finder holds the lock -- can **roll it back**:
  the new files that were already renamed in are removed, the old ones are put back;
- **old files moved aside first** (``--force``), to hidden names ending in :data:`BACKUP_SUFFIX` that no
  loader takes for a model; they are deleted only after the journal is gone (the commit point), and
  restored by the roll-back when anything fails before it.

The rename phase is: journal, move every old file aside, rename every new file in (the entry point,
shard 1, last), remove the journal, delete the old files.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from gguf_mtp.constants import PARTIAL_SUFFIX
from gguf_mtp.errors import OutputWriteError, UnsafeOutputError

__all__ = [
    "BACKUP_SUFFIX",
    "JOURNAL_NAME",
    "Replacement",
    "backup_name",
    "commit",
    "folder_lock",
    "fsync_dir",
    "pending_recovery",
    "recover",
    "rename_noreplace",
]

log = logging.getLogger(__name__)

#: The journal of a rename phase in progress, in the output folder.
JOURNAL_NAME = ".gguf-mtp-journal"
JOURNAL_FORMAT = 1
#: Old outputs moved aside by a ``--force`` run are ``.<final name>.<pid>.replaced`` until it commits.
BACKUP_SUFFIX = ".replaced"
#: A journal names a handful of files; anything bigger is not one of ours.
_MAX_JOURNAL_BYTES = 1024 * 1024
_MAX_JOURNAL_ENTRIES = 10_000

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_NO_RENAMEAT2 = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV, errno.ENOSYS}


def _load_renameat2() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not Linux, or a libc older than glibc 2.28
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def rename_noreplace(source: Path, destination: Path) -> None:
    """Rename ``source`` to ``destination``, failing with ``FileExistsError`` if the latter exists.

    Every rename of the protocol goes through here (the fault-injection tests replace it).
    """
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(destination), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in _NO_RENAMEAT2:  # EEXIST included: someone else's file is there
            raise OSError(code, os.strerror(code), os.fspath(destination))
    try:
        os.link(source, destination)  # fails with EEXIST rather than replace
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        # A filesystem without hard links (vfat, some FUSE): no atomic no-replace rename exists there;
        # the folder lock still keeps every other gguf-mtp run out.
        if os.path.lexists(destination):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(destination)) from None
        os.rename(source, destination)
        return
    os.unlink(source)


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (which must exist) for the duration; refuse if another run has it.

    Raises:
        UnsafeOutputError: another gguf-mtp run is writing into the folder.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UnsafeOutputError(
                    "another gguf-mtp run is writing into this folder (wait for it, or use another folder)", folder
                ) from None
            raise
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def backup_name(final: str) -> str:
    """The hidden name an old output is moved to while a ``--force`` run replaces it."""
    return f".{final}.{os.getpid()}{BACKUP_SUFFIX}"


@dataclass(frozen=True)
class Replacement:
    """One file of a set: its temporary name, its final name, and where the old file goes (if any).

    Names are plain file names inside the output folder.
    """

    partial: str
    final: str
    backup: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"partial": self.partial, "final": self.final, "backup": self.backup}


def fsync_dir(folder: Path) -> None:
    """Make a folder's entries (new names, renames) durable; best effort where the filesystem cannot."""
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_journal(folder: Path, entries: Sequence[Replacement]) -> None:
    doc = {"format": JOURNAL_FORMAT, "pid": os.getpid(), "entries": [e.to_dict() for e in entries]}
    data = json.dumps(doc, indent=1).encode()
    temporary = folder / f"{JOURNAL_NAME}.{os.getpid()}{PARTIAL_SUFFIX}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        rename_noreplace(temporary, folder / JOURNAL_NAME)
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise
    fsync_dir(folder)  # the journal is on disk before any final name changes


def _plain_name(value: object, suffix: str | None) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and "/" not in value
        and "\0" not in value
        and (suffix is None or (value.startswith(".") and value.endswith(suffix)))
    )


def _read_journal(path: Path) -> tuple[int | None, list[Replacement]]:
    """The entries of a journal a dead run left; one line if it is not one gguf-mtp writes."""

    def bad(why: str) -> UnsafeOutputError:
        return UnsafeOutputError(
            f"an interrupted run's journal cannot be used ({why}); check the folder's files and remove it", path
        )

    try:
        if not path.is_file() or path.is_symlink():
            raise bad("not a regular file")
        if path.stat().st_size > _MAX_JOURNAL_BYTES:
            raise bad("too big")
        doc = json.loads(path.read_bytes())
    except UnsafeOutputError:  # bad() itself: an OSError too
        raise
    except (OSError, ValueError, RecursionError) as e:
        raise bad(f"unreadable: {e.__class__.__name__}") from None
    if not isinstance(doc, dict) or doc.get("format") != JOURNAL_FORMAT or not isinstance(doc.get("entries"), list):
        raise bad("unknown format")
    raw_entries = doc["entries"]
    if len(raw_entries) > _MAX_JOURNAL_ENTRIES:
        raise bad("too many entries")
    entries = []
    for raw in raw_entries:
        if not isinstance(raw, dict):
            raise bad("an entry is not an object")
        partial, final, backup = raw.get("partial"), raw.get("final"), raw.get("backup")
        if not (_plain_name(partial, PARTIAL_SUFFIX) and _plain_name(final, None)):
            raise bad("an entry names a file outside the folder")
        if backup is not None and not _plain_name(backup, BACKUP_SUFFIX):
            raise bad("an entry names a file outside the folder")
        entries.append(Replacement(partial, final, backup))
    pid = doc.get("pid")
    return (pid if isinstance(pid, int) else None), entries


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _roll_back(folder: Path, entries: Sequence[Replacement]) -> int:
    """Undo a rename phase that did not reach its commit point; returns how many old files came back.

    Works from what is on disk, so it serves both a failure in this process and a dead run's journal:
    old files are moved aside before any new file is renamed in, so a backup that exists means its
    final name (if any) holds a new file, and a backup that does not exist was never made.
    """
    restored = 0
    for entry in entries:
        final, partial = folder / entry.final, folder / entry.partial
        backup = folder / entry.backup if entry.backup else None
        if backup is not None and os.path.lexists(backup):
            if os.path.lexists(final):
                os.unlink(final)  # the new file (or a second link to the old one, mid-move)
            rename_noreplace(backup, final)
            restored += 1
        # Without a backup, the final name is ours when its temporary name is gone (renamed in) or is a
        # second link to it (link + unlink interrupted); otherwise this run never touched it.
        elif (backup is None and os.path.lexists(final)
              and (not os.path.lexists(partial) or _same_file(partial, final))):
            os.unlink(final)
        with suppress(FileNotFoundError):
            os.unlink(partial)
    return restored


def recover(folder: Path) -> str | None:
    """Roll back the rename phase a killed run left in ``folder`` (the caller holds :func:`folder_lock`).

    Returns:
        One line saying what was done, or ``None`` when there was no journal.

    Raises:
        UnsafeOutputError: a journal that is not one gguf-mtp writes.
        OutputWriteError: the roll-back itself failed (the journal stays for the next run).
    """
    journal = folder / JOURNAL_NAME
    if not os.path.lexists(journal):
        return None
    pid, entries = _read_journal(journal)
    try:
        restored = _roll_back(folder, entries)
    except OSError as e:
        raise OutputWriteError(
            f"rolling back an interrupted run failed: {e.strerror or e}; the journal was kept", journal
        ) from None
    os.unlink(journal)
    fsync_dir(folder)
    who = f"a gguf-mtp run (pid {pid})" if pid is not None else "a gguf-mtp run"
    if restored:
        return f"{folder}: {who} was killed while replacing {restored} file(s); the previous files were restored"
    return f"{folder}: {who} was killed while renaming its outputs into place; its incomplete set was removed"


def pending_recovery(folder: Path) -> str | None:
    """What :func:`recover` would find in ``folder``, changing nothing (a dry run's view of it).

    Returns:
        One line saying an interrupted run is to be settled first, or ``None`` when there is no journal.

    Raises:
        UnsafeOutputError: a journal that is not one gguf-mtp writes (:func:`recover` refuses it alike).
    """
    journal = folder / JOURNAL_NAME
    if not os.path.lexists(journal):
        return None
    pid, _ = _read_journal(journal)
    who = f"a gguf-mtp run (pid {pid})" if pid is not None else "a gguf-mtp run"
    return f"{folder}: {who} was killed while renaming its outputs into place; the real run settles that first"


def commit(folder: Path, entries: Sequence[Replacement]) -> None:
    """Replace the final names of ``entries`` by their finished temporary files, all or nothing.

    ``entries`` come in rename order (the entry point last). The caller holds :func:`folder_lock`, has
    fsynced every temporary file, and ran :func:`recover`.

    Raises:
        OSError: a rename failed (a file appeared at a final name: ``FileExistsError``); everything was
            rolled back first: the old files are back under their names, the new ones (temporary files
            included) are gone.
        OutputWriteError: the roll-back failed too; the journal stays, so the next run finishes it.
    """
    journal_written = False
    try:
        _write_journal(folder, entries)
        journal_written = True
        for entry in entries:
            if entry.backup is not None:
                rename_noreplace(folder / entry.final, folder / entry.backup)
        for entry in entries:
            rename_noreplace(folder / entry.partial, folder / entry.final)
    except BaseException as failure:
        try:
            _roll_back(folder, entries)
            if journal_written:
                os.unlink(folder / JOURNAL_NAME)
        except OSError as e:
            raise OutputWriteError(
                f"renaming failed ({getattr(failure, 'strerror', None) or failure}) and rolling back failed too "
                f"({e.strerror or e}); the next gguf-mtp run into this folder finishes the roll-back",
                folder,
            ) from None
        fsync_dir(folder)
        raise
    os.unlink(folder / JOURNAL_NAME)  # the commit point: from here on the new set is the set
    fsync_dir(folder)
    for entry in entries:
        if entry.backup is not None:
            with suppress(OSError):  # a leftover is removed by the next run (stale, its pid gone)
                os.unlink(folder / entry.backup)
