"""Streaming file digests: size and sha256 of model files, in constant memory.

The model card lists them, ``publish`` compares them with what the Hub reports after an upload, and
the pipeline records them to decide whether a finished stage's outputs can be reused. Files are read
with plain ``readinto`` into one reused buffer (never memory-mapped: a flaky network mount then gives
an I/O error instead of a SIGBUS).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.errors import GGUFNotFoundError, InputReadError
from gguf_mtp.files.progress import progress_bar

__all__ = ["FileDigest", "digest_files", "git_blob_sha1", "sha256_file"]

#: Bytes read per ``readinto`` call while hashing.
HASH_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileDigest:
    """A file's path, size in bytes and sha256 (lowercase hex)."""

    path: Path
    size: int
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileDigest:
        return cls(Path(data["path"]), int(data["size"]), str(data["sha256"]))


def sha256_file(path: str | os.PathLike[str], *, bar: Any = None) -> str:
    """The sha256 of a file, read in :data:`HASH_CHUNK` pieces into one reused buffer.

    Args:
        path: the file.
        bar: an optional tqdm bar, advanced by the bytes read.

    Raises:
        InputReadError: the file cannot be read (the message names it).
    """
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK)
    view = memoryview(buffer)
    try:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
                if bar is not None:
                    bar.update(n)
    except OSError as e:
        raise InputReadError(f"cannot read: {e.strerror or e}", path) from None
    return digest.hexdigest()


def digest_files(
    paths: Sequence[str | os.PathLike[str]], *, progress: bool = True, desc: str = "sha256"
) -> list[FileDigest]:
    """Size and sha256 of each file, with one byte progress bar over all of them.

    Raises:
        GGUFNotFoundError: a file is missing.
        InputReadError: a file cannot be read.
    """
    files = [Path(p) for p in paths]
    sizes = []
    for f in files:
        try:
            sizes.append(f.stat().st_size)
        except FileNotFoundError:
            raise GGUFNotFoundError("no such file", f) from None
        except OSError as e:
            raise InputReadError(f"cannot read: {e.strerror or e}", f) from None
    with progress_bar(sum(sizes), desc, enabled=progress) as bar:
        return [FileDigest(f, size, sha256_file(f, bar=bar)) for f, size in zip(files, sizes)]


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob with these contents (what the Hub reports for a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
