"""The journal of a rename phase (:mod:`gguf_mtp.files.commit`): what it holds, and reading it back.

A journal names, for every file of a set, its temporary name, its final name and the hidden name its
old file is moved to (``--force``), with the **identity** of the new file and of the old one: device,
inode, size and modification time. A rename keeps all four; a copy, a new file or a file rewritten in
place (``cp`` onto an existing name) changes at least one. So a run that finds a dead run's journal can
prove which files under those names are that run's, and touches nothing else.

:func:`pending_journal` is how ``inspect`` and ``verify`` tell a set that was never committed (a run
was killed during its rename phase) from a finished one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from gguf_mtp.constants import PARTIAL_SUFFIX
from gguf_mtp.errors import GGUFMTPError, UnsafeOutputError

from .json_io import encode_json, load_json_file

__all__ = [
    "BACKUP_SUFFIX",
    "JOURNAL_NAME",
    "FileIdentity",
    "Replacement",
    "backup_name",
    "encode_journal",
    "journal_document",
    "pending_journal",
    "read_journal",
    "uncommitted_line",
]

#: The journal of a rename phase in progress, in the output folder.
JOURNAL_NAME = ".gguf-mtp-journal"
#: 2: entries carry the identities of the new and the old file (format 1 had none, and is refused).
JOURNAL_FORMAT = 2
#: Old outputs moved aside by a ``--force`` run are ``.<final name>.<pid>.replaced`` until it commits.
BACKUP_SUFFIX = ".replaced"
#: A journal names a handful of files; anything bigger is not one of ours.
_MAX_JOURNAL_BYTES = 1024 * 1024
_MAX_JOURNAL_ENTRIES = 10_000
_MAX_STAT_FIELD = 2**64


@dataclass(frozen=True)
class FileIdentity:
    """What a rename keeps and a rewrite changes: device, inode, size, modification time (ns)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileIdentity | None:
        """The identity of whatever has the name ``path`` (a link itself, never its target); ``None``
        when nothing has it.

        Raises:
            OSError: the name cannot be looked up (other than not existing).
        """
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def same_inode(self, info: os.stat_result) -> bool:
        """Whether ``info`` (an ``fstat``) is of the same file, whatever it holds now."""
        return (self.dev, self.ino) == (info.st_dev, info.st_ino)

    def to_list(self) -> list[int]:
        return [self.dev, self.ino, self.size, self.mtime_ns]


def backup_name(final: str) -> str:
    """The hidden name an old output is moved to while a ``--force`` run replaces it."""
    return f".{final}.{os.getpid()}{BACKUP_SUFFIX}"


@dataclass(frozen=True)
class Replacement:
    """One file of a set: its temporary name, its final name, where the old file goes (if any), and the
    identities of the new file (``new``) and of the old one (``old``, with ``backup``).

    Names are plain file names inside the output folder.
    """

    partial: str
    final: str
    new: FileIdentity
    backup: str | None = None
    old: FileIdentity | None = None

    def __post_init__(self) -> None:
        if (self.backup is None) != (self.old is None):
            raise ValueError("a replacement names a backup exactly when it knows the old file's identity")

    def to_dict(self) -> dict[str, Any]:
        return {
            "partial": self.partial,
            "final": self.final,
            "new": self.new.to_list(),
            "backup": self.backup,
            "old": self.old.to_list() if self.old is not None else None,
        }


def journal_document(pid: int, entries: Iterable[Replacement]) -> dict[str, Any]:
    """The journal (written with :func:`~gguf_mtp.files.json_io.write_json_file`): what :func:`read_journal`
    reads back."""
    return {"format": JOURNAL_FORMAT, "pid": pid, "entries": [e.to_dict() for e in entries]}


def encode_journal(pid: int, entries: Iterable[Replacement]) -> bytes:
    """The journal's bytes, as :func:`~gguf_mtp.files.json_io.write_json_file` writes them."""
    return encode_json(journal_document(pid, entries))


class _Unusable(GGUFMTPError):
    """The journal file cannot be read as JSON (said again by :func:`read_journal`)."""


def _plain_name(value: object, suffix: str | None) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and "/" not in value
        and "\0" not in value
        and (suffix is None or (value.startswith(".") and value.endswith(suffix)))
    )


def _identity(value: object) -> FileIdentity | None:
    if not isinstance(value, list) or len(value) != 4:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _MAX_STAT_FIELD for v in value):
        return None
    return FileIdentity(*value)


def read_journal(path: Path) -> tuple[int | None, list[Replacement]]:
    """The pid and entries of a journal a run left; one line if it is not one gguf-mtp writes.

    Raises:
        UnsafeOutputError: not a regular file (a link included), too big, not JSON, another format, or an
            entry that names a file outside the folder or lacks an identity.
    """

    def bad(why: str) -> UnsafeOutputError:
        return UnsafeOutputError(
            f"an interrupted run's journal cannot be used ({why}); check the folder's files and remove it", path
        )

    try:
        doc = load_json_file(path, max_bytes=_MAX_JOURNAL_BYTES, error=_Unusable, follow_links=False)
    except _Unusable as e:  # a link, a folder, a pipe, too big, not JSON
        raise bad(e.message) from None
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
        new, old = _identity(raw.get("new")), _identity(raw.get("old"))
        if new is None or (old is None) != (backup is None):
            raise bad("an entry lacks the identity of its files")
        entries.append(Replacement(partial, final, new, backup, old))
    pid = doc.get("pid")
    return (pid if isinstance(pid, int) and not isinstance(pid, bool) else None), entries


def pending_journal(paths: Iterable[str | os.PathLike[str]]) -> Path | None:
    """The journal beside ``paths`` that names one of them as a final name: the set is **uncommitted**
    (a run was killed, or is still running, between its first rename and its commit point; the next
    gguf-mtp run into the folder completes or undoes it). ``None`` when there is none.

    A journal that cannot be read counts too: it is beside the set, and the next run refuses it.
    """
    by_folder: dict[Path, set[str]] = {}
    for path in paths:
        absolute = Path(os.path.abspath(path))
        by_folder.setdefault(absolute.parent, set()).add(absolute.name)
    for folder, names in sorted(by_folder.items()):
        journal = folder / JOURNAL_NAME
        if not os.path.lexists(journal):
            continue
        try:
            _, entries = read_journal(journal)
        except UnsafeOutputError:
            return journal
        if any(entry.final in names for entry in entries):
            return journal
    return None


def uncommitted_line(journal: str | os.PathLike[str]) -> str:
    """What ``inspect`` and ``verify`` say about a set that :func:`pending_journal` found uncommitted."""
    return (
        f"uncommitted set: the journal {os.fspath(journal)} names these files (a gguf-mtp run was killed, or is "
        "still running, while renaming them into place); the next gguf-mtp run into this folder completes or "
        "undoes it"
    )
