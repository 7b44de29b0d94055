"""Put a set of finished temporary files in place of their final names, recoverably.

:func:`gguf_mtp.write.write_outputs` writes every file of a set under a temporary name; this module
does the rest, inside one output folder:

- **a lock** on the folder for the whole run: ``flock`` on a descriptor of the folder itself (no lock
  file to leave behind), so a second gguf-mtp writer into the same folder is refused, never merged;
- **no-replace renames** (``renameat2(RENAME_NOREPLACE)``, else ``link`` + ``unlink``): a file that
  appeared at a final name after the checks is never overwritten, the run fails instead;
- **a journal** (:mod:`gguf_mtp.files.journal`, written and fsynced before the first rename, removed
  after the last: the commit point): it names every temporary file, final name and moved-aside old file
  of the set with the identity (device, inode, size, mtime) of each, so the run that finds it -- the
  writer that wrote it is dead, since the finder holds the lock -- can finish it (:func:`recover`);
- **old files moved aside first** (``--force``), to hidden names ending in :data:`BACKUP_SUFFIX` that no
  loader takes for a model; they are deleted only after the journal is gone, and restored by the
  roll-back when anything fails before it.

The rename phase is: journal, move every old file aside, rename every new file in (the entry point,
shard 1, last), remove the journal (:func:`remove_journal`), delete the old files.

**One rule for a dead run's journal** (:func:`plan_recovery`, pure): when every final name holds the
journal's new file and no old file of the set is still moved aside, the set is complete and is
**rolled forward** (kept; the journal removed); otherwise it is **rolled back** (the new files removed,
the old ones put back). Either way only files whose identity matches the journal are removed or moved:
a file someone else put at a final name is left alone and reported; where an old file cannot be put
back because another file has its name, both are kept, the journal stays, and the run stops with one
line. Temporary files of dead runs (``.NAME.PID.partial``, ``.NAME.PID.replaced``) are removed by the
next run that takes the lock (:func:`remove_leftovers`), which says how much it freed.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_mtp.constants import PARTIAL_SUFFIX
from gguf_mtp.errors import OutputWriteError, UnsafeOutputError
from gguf_mtp.text import human_bytes

from .create import fsync_dir
from .journal import (
    BACKUP_SUFFIX,
    JOURNAL_NAME,
    FileIdentity,
    Replacement,
    backup_name,
    journal_document,
    read_journal,
)
from .json_io import write_json_file
from .scratch import pid_alive, remove_if_dead, scratch_pid

__all__ = [
    "BACKUP_SUFFIX",
    "JOURNAL_NAME",
    "FileIdentity",
    "RecoveryPlan",
    "Replacement",
    "Seen",
    "backup_name",
    "commit",
    "folder_lock",
    "fsync_dir",
    "pending_recovery",
    "pid_alive",
    "plan_recovery",
    "recover",
    "remove_journal",
    "remove_leftovers",
    "rename_noreplace",
]

log = logging.getLogger(__name__)

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_NO_RENAMEAT2 = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV, errno.ENOSYS}
#: ``.NAME.PID.partial`` / ``.NAME.PID.replaced``: the only names :func:`remove_leftovers` removes.
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<pid>[1-9][0-9]{0,9})(?:" + re.escape(PARTIAL_SUFFIX) + "|"
                       + re.escape(BACKUP_SUFFIX) + r")", re.DOTALL)
_BUSY = "another gguf-mtp run is writing into this folder (wait for it, or use another folder)"
#: What a run says where an old file cannot be put back because another file took its name.
_KEEP_BOTH = ("both files were kept and the journal too: keep the file you want under its name, remove the other, "
              "then run again")


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
def folder_lock(folder: Path, *, busy: str = _BUSY) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (which must exist) for the duration; refuse if another run has it.

    The lock is ``flock`` on a descriptor of the folder itself: no lock file is created or left behind.

    Args:
        busy: the message when another run holds it.

    Raises:
        UnsafeOutputError: another gguf-mtp run holds the folder.
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
                raise UnsafeOutputError(busy, folder) from None
            raise
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _write_journal(folder: Path, entries: Sequence[Replacement]) -> None:
    # Created exclusively (never through a link planted at its temporary name), renamed only to a free
    # name, and on disk (folder fsynced) before any final name changes.
    write_json_file(folder / JOURNAL_NAME, journal_document(os.getpid(), entries), rename=rename_noreplace)


def remove_journal(folder: Path) -> None:
    """The commit point: once the journal is gone, the new set is the set.

    A function of its own so the fault-injection tests can stop a run right before it.
    """
    os.unlink(folder / JOURNAL_NAME)
    fsync_dir(folder)


# ---------------------------------------------------------------------------------------- recovery


@dataclass(frozen=True)
class Seen:
    """The identities found under one entry's three names (``None``: nothing there)."""

    partial: FileIdentity | None
    final: FileIdentity | None
    backup: FileIdentity | None


@dataclass
class RecoveryPlan:
    """What to do about a rename phase that did not reach its commit point (see :func:`plan_recovery`).

    ``steps`` are ``("unlink", name)`` and ``("rename", source, destination)``, in order; ``restored``
    counts old files put back; ``left_alone`` are final names holding a file the run did not write;
    ``conflicts`` say, one phrase each, where an old file cannot be put back (nothing is done there).
    """

    forward: bool
    steps: list[tuple[str, ...]] = field(default_factory=list)
    restored: int = 0
    left_alone: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def plan_recovery(entries: Sequence[Replacement], seen: Sequence[Seen], *, may_roll_forward: bool) -> RecoveryPlan:
    """Decide, from what is on disk, how to finish a rename phase (pure: no I/O).

    Roll forward (``may_roll_forward``, a dead run's journal) when every final name holds its new file
    and no old file is still moved aside; else roll back. Only a name whose identity is the journal's is
    ever removed or renamed.
    """
    backups_ours = [e.old is not None and s.backup == e.old for e, s in zip(entries, seen)]
    backups_foreign = [e.backup is not None and s.backup is not None and not ours
                       for e, s, ours in zip(entries, seen, backups_ours)]
    complete = all(s.final == e.new for e, s in zip(entries, seen))
    plan = RecoveryPlan(forward=may_roll_forward and complete and not any(backups_ours) and not any(backups_foreign))
    for entry, state, backup_ours, backup_foreign in zip(entries, seen, backups_ours, backups_foreign):
        if state.partial == entry.new:  # not renamed yet, or a second link to the renamed file (link + unlink)
            plan.steps.append(("unlink", entry.partial))
        if plan.forward:
            continue
        if backup_foreign:
            plan.conflicts.append(f"{entry.backup} is not the file that run moved aside there")
            continue
        old_in_place = entry.old is not None and state.final == entry.old
        ours = state.final == entry.new
        foreign = state.final is not None and not ours and not old_in_place
        if backup_ours and foreign:
            plan.conflicts.append(f"{entry.final} now holds another file (the previous one is kept as {entry.backup})")
            continue
        if ours:
            plan.steps.append(("unlink", entry.final))
        elif foreign:
            plan.left_alone.append(entry.final)
        if backup_ours and entry.backup is not None:
            if old_in_place:  # a second link to the old file (moving it aside by link + unlink was cut short)
                plan.steps.append(("unlink", entry.backup))
            else:
                plan.steps.append(("rename", entry.backup, entry.final))
                plan.restored += 1
    return plan


def _observe(folder: Path, entries: Sequence[Replacement]) -> list[Seen]:
    def identity(name: str | None) -> FileIdentity | None:
        return FileIdentity.of(folder / name) if name is not None else None

    return [Seen(identity(e.partial), identity(e.final), identity(e.backup)) for e in entries]


def _carry_out(folder: Path, plan: RecoveryPlan) -> None:
    for step in plan.steps:
        if step[0] == "unlink":
            with suppress(FileNotFoundError):
                os.unlink(folder / step[1])
        else:
            rename_noreplace(folder / step[1], folder / step[2])
    fsync_dir(folder)


def _who(pid: int | None) -> str:
    return f"a gguf-mtp run (pid {pid})" if pid is not None else "a gguf-mtp run"


def _conflict_line(who: str, plan: RecoveryPlan) -> str:
    return f"{who} was killed while replacing files here, and since then {'; '.join(plan.conflicts)}; {_KEEP_BOTH}"


def recover(folder: Path) -> str | None:
    """Finish the rename phase a killed run left in ``folder`` (the caller holds :func:`folder_lock`):
    roll it forward or back, by :func:`plan_recovery`'s rule.

    Returns:
        One line saying what was done, or ``None`` when there was no journal.

    Raises:
        UnsafeOutputError: a journal that is not one gguf-mtp writes, or an old file that cannot be put
            back because another file has its name (both kept, the journal too).
        OutputWriteError: the recovery itself failed (the journal stays for the next run).
    """
    journal = folder / JOURNAL_NAME
    if not os.path.lexists(journal):
        return None
    pid, entries = read_journal(journal)
    who = _who(pid)
    try:
        plan = plan_recovery(entries, _observe(folder, entries), may_roll_forward=True)
        _carry_out(folder, plan)
        if plan.conflicts:
            raise UnsafeOutputError(_conflict_line(who, plan), journal)
        remove_journal(folder)
    except UnsafeOutputError:
        raise
    except OSError as e:
        raise OutputWriteError(
            f"finishing an interrupted run's renames failed: {e.strerror or e}; the journal was kept", journal
        ) from None
    if plan.forward:
        return (f"{folder}: {who} was killed after renaming its whole set into place; the set is complete and "
                "was kept")
    if plan.restored:
        line = f"{folder}: {who} was killed while replacing {plan.restored} file(s); the previous files were restored"
    else:
        line = f"{folder}: {who} was killed while renaming its outputs into place; its incomplete set was removed"
    if plan.left_alone:
        line += f"; left alone {', '.join(plan.left_alone)}: not the file(s) that run wrote"
    return line


def _expect(path: Path, identity: FileIdentity | None) -> None:
    """Refuse to rename a file that is no longer the one the journal names (another program changed it)."""
    if FileIdentity.of(path) != identity:
        raise UnsafeOutputError("changed by another program during the run; nothing was replaced", path)


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
    pid, entries = read_journal(journal)
    plan = plan_recovery(entries, _observe(folder, entries), may_roll_forward=True)
    settle = "keeps its complete set" if plan.forward else "rolls its renames back"
    return f"{folder}: {_who(pid)} was killed while renaming its outputs into place; the real run {settle} first"


def commit(folder: Path, entries: Sequence[Replacement]) -> None:
    """Replace the final names of ``entries`` by their finished temporary files, all or nothing.

    ``entries`` come in rename order (the entry point last), with the identities of their files. The
    caller holds :func:`folder_lock`, has fsynced every temporary file, and ran :func:`recover`.

    Raises:
        OSError: a rename failed (a file appeared at a final name: ``FileExistsError``; a file changed
            under us: ``UnsafeOutputError``); everything was rolled back first: the old files are back
            under their names, the new ones (temporary files included) are gone.
        OutputWriteError: the roll-back failed too, or an old file could not be put back (another file
            took its name); the journal stays, so the next run finishes it.
    """
    journal_written = False
    try:
        _write_journal(folder, entries)
        journal_written = True
        for entry in entries:
            if entry.backup is not None:
                _expect(folder / entry.final, entry.old)
                rename_noreplace(folder / entry.final, folder / entry.backup)
        for entry in entries:
            _expect(folder / entry.partial, entry.new)
            rename_noreplace(folder / entry.partial, folder / entry.final)
    except BaseException as failure:
        _roll_back_here(folder, entries, failure, journal_written)
        raise
    remove_journal(folder)  # the commit point: from here on the new set is the set
    for entry in entries:
        if entry.backup is not None and FileIdentity.of(folder / entry.backup) == entry.old:
            with suppress(OSError):  # a leftover is removed by the next run (remove_leftovers)
                os.unlink(folder / entry.backup)


def _roll_back_here(folder: Path, entries: Sequence[Replacement], failure: BaseException, journal: bool) -> None:
    """Undo this process's own rename phase after ``failure``; raise if that is not entirely possible."""
    reason = getattr(failure, "strerror", None) or failure.__class__.__name__
    try:
        plan = plan_recovery(entries, _observe(folder, entries), may_roll_forward=False)
        _carry_out(folder, plan)
        if plan.conflicts:
            raise OutputWriteError(f"renaming failed ({reason}) and {'; '.join(plan.conflicts)}: {_KEEP_BOTH}", folder)
        if journal:
            remove_journal(folder)
    except OutputWriteError:
        raise
    except OSError as e:
        raise OutputWriteError(
            f"renaming failed ({reason}) and rolling back failed too ({e.strerror or e}); the next gguf-mtp "
            "run into this folder finishes the roll-back",
            folder,
        ) from None


# --------------------------------------------------------------------------------------- leftovers


def remove_leftovers(folder: Path) -> str | None:
    """Remove the temporary files of dead gguf-mtp runs from ``folder`` (the caller holds
    :func:`folder_lock` and ran :func:`recover`, so no journal names them).

    Only regular files (never through a link) named exactly ``.NAME.PID.partial`` or
    ``.NAME.PID.replaced`` whose PID is no running process are removed: a run killed while writing
    leaves its full-size partials, one killed after its commit point its moved-aside old files. This
    process's own pid counts as dead: under the lock, before writing, no such file is this run's.
    A head scratch folder (``.gguf-mtp-head.PID.*``, :mod:`.scratch`) is removed only when its pid is no
    running process and its own lock can be taken: a live run fetches into it before it locks this folder.

    Returns:
        One line saying how many files and bytes were freed, and whose they were; ``None`` if none.
    """
    removed = freed = 0
    pids: set[int] = set()
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return None
    for entry in listing:
        taken = _remove_leftover(entry)
        if taken is not None:
            pid, nbytes = taken
            removed, freed = removed + 1, freed + nbytes
            pids.add(pid)
    if not removed:
        return None
    fsync_dir(folder)
    whose = (f"a killed gguf-mtp run (pid {pids.pop()})" if len(pids) == 1
             else f"killed gguf-mtp runs (pids {', '.join(str(p) for p in sorted(pids))})")
    return f"{folder}: removed {removed} temporary file(s) ({human_bytes(freed)}) left by {whose}"


def _remove_leftover(entry: os.DirEntry[str]) -> tuple[int, int] | None:
    """Remove ``entry`` if it is a dead run's temporary file or head scratch folder: (its run's pid, the bytes
    freed), else ``None``."""
    scratch_of = scratch_pid(entry.name)
    if scratch_of is not None:
        freed = remove_if_dead(Path(entry.path), scratch_of)  # proved by its pid and its lock
        return None if freed is None else (scratch_of, freed)
    match = _LEFTOVER.fullmatch(entry.name)
    if match is None:
        return None
    pid = int(match["pid"])
    try:
        info = entry.stat(follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or (pid != os.getpid() and pid_alive(pid)):
            return None
        os.unlink(entry.path)
    except OSError:
        return None
    return pid, getattr(info, "st_blocks", 0) * 512 or info.st_size
