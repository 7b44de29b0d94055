"""Choosing a pipeline's target files on the Hub: the exact shard set a pattern names (pure), the repo's file list
(online or from the cache), a target folder laid out like the repo (a mounted repo) checked against the Hub's
record, and the composite's default name."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from gguf_mtp.constants import SPLIT_NAME, split_file_name
from gguf_mtp.errors import ShardSetError
from gguf_mtp.hub import access as hub_access
from gguf_mtp.hub import client as hub
from gguf_mtp.hub.hub_api import HubApi

__all__ = [
    "basename_of",
    "check_folder_digests",
    "check_folder_matches",
    "folder_listing",
    "select_folder_files",
    "select_target_files",
    "target_listing",
]

_SPLIT_GLOB_TAIL = "-*-of-*.gguf"
_GLOB_CHARS = re.compile(r"[*?\[]")


def _group_key(path: str) -> tuple[str, str, int] | None:
    folder, _, name = path.rpartition("/")
    match = SPLIT_NAME.match(name)
    return (folder, match["prefix"], int(match["count"])) if match else None


def _complete_set(folder: str, prefix: str, count: int, available: set[str], pattern: str) -> list[str]:
    base = f"{folder}/" if folder else ""
    names = [base + split_file_name(prefix, i, count) for i in range(1, count + 1)]
    missing = [n.rpartition("/")[2] for n in names if n not in available]
    if missing:
        raise ShardSetError(f"{pattern!r}: the repo's split set is incomplete, missing {', '.join(missing)}")
    return names


def select_target_files(repo_files: Iterable[str], pattern: str) -> list[str]:
    """The exact files of the one model ``pattern`` names in a repo, in shard order (pure).

    ``pattern`` may be ``DIR/NAME-*-of-*.gguf`` (the split set whose prefix is exactly ``NAME``: a glob
    would also match ``NAME-MTP-00001-of-00003.gguf``), one shard's exact name (its whole set), one
    single-file model's name, or any other glob that matches the files of exactly one model.

    Raises:
        ShardSetError: nothing matches, several models match, or the split set is incomplete.
    """
    available = set(repo_files)
    split_glob = _split_glob(pattern)
    if split_glob is not None:
        return _split_glob_set(*split_glob, available, pattern)
    if not _GLOB_CHARS.search(pattern):
        return _named_model(pattern, available)
    return _globbed_model(pattern, available)


def _split_glob(pattern: str) -> tuple[str, str] | None:
    """``(folder, prefix)`` of a pattern ``DIR/NAME-*-of-*.gguf`` with no other glob character, else ``None``."""
    folder, _, base = pattern.rpartition("/")
    if not base.endswith(_SPLIT_GLOB_TAIL):
        return None
    prefix = base[: -len(_SPLIT_GLOB_TAIL)]
    return None if _GLOB_CHARS.search(prefix + folder) else (folder, prefix)


def _split_glob_set(folder: str, prefix: str, available: set[str], pattern: str) -> list[str]:
    """The one complete split set whose prefix is exactly ``prefix`` in ``folder``."""
    counts = sorted({k[2] for f in available if (k := _group_key(f)) and k[:2] == (folder, prefix)})
    if not counts:
        raise ShardSetError(f"{pattern!r} matches no file of the repo")
    if len(counts) > 1:
        raise ShardSetError(f"{pattern!r} matches split sets of {' and '.join(map(str, counts))} shards")
    return _complete_set(folder, prefix, counts[0], available, pattern)


def _named_model(name: str, available: set[str]) -> list[str]:
    """The model one exact file name belongs to: a shard's whole set, or that single file."""
    key = _group_key(name)
    if key is not None:
        return _complete_set(*key, available, name)
    if name not in available:
        raise ShardSetError(f"{name!r} is not a file of the repo")
    return [name]


def _globbed_model(pattern: str, available: set[str]) -> list[str]:
    """The files of the one model (a split set or a single file) whose ``.gguf`` files any glob matches."""
    groups: dict[tuple[str, str, int] | str, list[str]] = {}
    for f in sorted(available):
        if fnmatch.fnmatchcase(f, pattern) and f.endswith(".gguf"):
            groups.setdefault(_group_key(f) or f, []).append(f)
    if not groups:
        raise ShardSetError(f"{pattern!r} matches no .gguf file of the repo")
    if len(groups) > 1:
        shown = ", ".join(f"{k[1]}-*-of-{k[2]:05d}.gguf" if isinstance(k, tuple) else k for k in groups)
        raise ShardSetError(f"{pattern!r} matches {len(groups)} models ({shown}); name one exactly")
    chosen = next(iter(groups))
    return _complete_set(*chosen, available, pattern) if isinstance(chosen, tuple) else [chosen]


def target_listing(
    api: HubApi, token: str | None, repo: str, pattern: str, revision: str | None,
    cache_dir: str | os.PathLike[str] | None,
) -> list[str]:
    """The target repo's file list: the Hub's, or offline the Hub cache's (nothing is downloaded)."""
    if not hub_access.is_offline():
        return hub.list_repo_files(api, repo, token=token, revision=revision)
    # The file list comes from the cache: the listing it remembers, else the files of the cached snapshot.
    listing = hub.cached_repo_files(repo, revision=revision, cache_dir=cache_dir)
    if listing is None:
        snapshot = hub.download_files(api, repo, [pattern], token=token, revision=revision, cache_dir=cache_dir)
        listing = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]
    return listing


def basename_of(first: str) -> str:
    """The composite's default prefix for a target whose first file is named ``first``."""
    name = first.rpartition("/")[2]
    match = SPLIT_NAME.match(name)
    stem = match["prefix"] if match else Path(name).stem
    return f"{stem}-MTP"


def folder_listing(folder: Path, pattern: str) -> list[str]:
    """The files of a target folder laid out like the repo (a mounted repo, a local copy), as repo paths.

    Only the pattern's own folder is listed when it has no glob characters (a mounted repo of hundreds of files
    is not walked for nothing); otherwise the whole tree.

    Raises:
        ShardSetError: ``folder`` is not a folder (or the pattern's folder is missing in it).
    """
    if not folder.is_dir():
        raise ShardSetError("target_dir is not a folder", folder, parameter="target_dir")
    sub, _, _ = pattern.rpartition("/")
    if not _GLOB_CHARS.search(sub):
        where = folder / sub if sub else folder
        if not where.is_dir():
            raise ShardSetError(f"has no folder {sub!r}: not the target repo's layout", folder, parameter="target_dir")
        base = f"{sub}/" if sub else ""
        return sorted(base + p.name for p in where.iterdir() if p.is_file())
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def select_folder_files(folder: Path, pattern: str, repo: str) -> list[str]:
    """The exact shard set ``pattern`` names in a target folder (as :func:`select_target_files` does in the repo).

    Raises:
        ShardSetError: one line naming the folder: it does not hold that model's complete shard set, as the
            repo's layout would.
    """
    try:
        return select_target_files(folder_listing(folder, pattern), pattern)
    except ShardSetError as e:
        if e.path is not None:
            raise
        raise ShardSetError(
            f"{e.message.replace('the repo', 'the folder')} (not the layout of {repo})", folder, parameter="target_dir"
        ) from None


def check_folder_matches(
    folder: Path, names: Sequence[str], remote: Mapping[str, hub.RemoteFile], repo: str, revision: str | None
) -> None:
    """A target folder's files against the Hub's record of them at ``revision``: present there, same size.

    Raises:
        ShardSetError: one line naming the first file the Hub does not have or that differs in size (a mount
            of another revision, another repo).
    """
    where = repo + (f"@{revision}" if revision else "")
    for name in names:
        record = remote.get(name)
        if record is None:
            raise ShardSetError(f"{name} is not a file of {where}: not that repo's layout", folder,
                                parameter="target_dir")
        size = (folder / name).stat().st_size
        if size != record.size:
            raise ShardSetError(
                f"{name} is {size:,} bytes here, {record.size:,} on {where}: the folder holds another revision",
                folder, parameter="target_dir",
            )


def check_folder_digests(folder: Path, digests: Sequence[tuple[str, str]],
                         remote: Mapping[str, hub.RemoteFile], repo: str, revision: str | None) -> None:
    """Each ``(name, sha256)`` of a target folder against the Hub's sha256 of that file (where it has one).

    Raises:
        ShardSetError: one line naming the first file whose sha256 differs (another revision of the same size).
    """
    where = repo + (f"@{revision}" if revision else "")
    for name, sha256 in digests:
        record = remote.get(name)
        if record is not None and record.sha256 is not None and record.sha256 != sha256:
            raise ShardSetError(
                f"{name} has sha256 {sha256[:12]}..., {where} has {record.sha256[:12]}...: the folder holds another "
                "revision", folder, parameter="target_dir",
            )
