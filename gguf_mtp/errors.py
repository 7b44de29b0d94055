"""The typed errors of gguf-mtp.

Every error a user can cause (a malformed file, an incompatible draft, an unsafe output path) is a
:class:`GGUFMTPError`. The command line maps these to exit status 2 and one line on stderr; anything
else escaping the library is a bug (exit status 1).
"""

from __future__ import annotations

import os


class GGUFMTPError(Exception):
    """Base class of every error gguf-mtp raises on purpose."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.message = message
        super().__init__(f"{self.path}: {message}" if self.path else message)


class BadGGUFError(GGUFMTPError):
    """A file is not a well-formed GGUF (bad magic, truncated, inconsistent sizes, ...)."""


class ShardSetError(GGUFMTPError):
    """A split set is incomplete or inconsistent (missing shard, mixed counts, wrong ``split.no``)."""


class IncompatibleDraftError(GGUFMTPError):
    """The draft cannot be spliced into the target (other architecture, width, block index, ...)."""


class NoNextNBlockError(IncompatibleDraftError):
    """The model has no NextN (MTP) block to extract, strip or graft."""


class KVEditError(GGUFMTPError):
    """A ``--set-kv`` override is malformed or does not fit the key's type."""


class UnsafeOutputError(GGUFMTPError):
    """Writing the output would overwrite an input or an existing file, or cannot be done safely."""


class OutputWriteError(GGUFMTPError):
    """Writing the output failed (disk full, permission denied, ...); partial outputs were removed."""


class CheckpointError(GGUFMTPError):
    """A Hugging Face checkpoint (config.json, safetensors, index) is malformed or unsupported."""


class HubError(GGUFMTPError):
    """A Hugging Face Hub operation failed (offline, missing token, no write access, ...)."""


class VerificationError(GGUFMTPError):
    """A composite failed verification."""
