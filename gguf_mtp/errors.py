"""The typed errors of gguf-mtp.

Every error a user can cause (a malformed file, an incompatible draft, an unsafe output path) is a
:class:`GGUFMTPError`, with the file it is about (:attr:`~GGUFMTPError.path`) and the problem
(:attr:`~GGUFMTPError.message`). Each one is also the builtin exception of its kind, so a caller that
knows nothing of gguf-mtp can still tell them apart:

- :class:`ValueError`: the input is wrong (:class:`BadGGUFError`, :class:`ShardSetError`,
  :class:`IncompatibleDraftError`, :class:`NoNextNBlockError`, :class:`KVEditError`,
  :class:`CheckpointError`, :class:`VerificationError`, :class:`ParameterError`);
- :class:`OSError`: the file system or the network failed or refused (:class:`UnsafeOutputError`,
  :class:`OutputWriteError`, :class:`InputReadError`, :class:`HubError`, :class:`HubUnreachableError`,
  :class:`LlamaServerError`);
- :class:`RuntimeError`: llama.cpp failed running a model in a child process (:class:`LlamaCppError`);
- :class:`FileNotFoundError`: an input does not exist (:class:`GGUFNotFoundError`,
  :class:`CheckpointNotFoundError`; still a :class:`BadGGUFError` / :class:`CheckpointError`).

The command line maps every :class:`GGUFMTPError` to exit status 2 and one line on stderr; anything
else escaping the library is a bug (exit status 1). Library messages name parameters
(``outtype 'q4'``), not command-line flags.
"""

from __future__ import annotations

import os

__all__ = [
    "BadGGUFError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "GGUFMTPError",
    "GGUFNotFoundError",
    "HubError",
    "HubUnreachableError",
    "IncompatibleDraftError",
    "InputReadError",
    "KVEditError",
    "LlamaCppError",
    "LlamaServerError",
    "NoNextNBlockError",
    "OutputWriteError",
    "ParameterError",
    "ShardSetError",
    "UnsafeOutputError",
    "VerificationError",
]


class GGUFMTPError(Exception):
    """Base class of every error gguf-mtp raises on purpose.

    Attributes:
        message: the problem, one line.
        path: the file (or folder, or Hub address) it is about, or ``None``.
        parameters: the parameters of the call the message names (``("set_kv",)``), as written in Python;
            the command line shows their flags instead (``--set-kv``).
    """

    def __init__(
        self, message: str, path: str | os.PathLike[str] | None = None, parameter: str | tuple[str, ...] | None = None
    ) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.message = message
        self.parameters = (parameter,) if isinstance(parameter, str) else tuple(parameter or ())
        # One argument only: for the OSError kinds, two would be read as (errno, strerror).
        super().__init__(f"{self.path}: {message}" if self.path else message)

    def __reduce__(self) -> tuple[type[GGUFMTPError], tuple[str, str | None, tuple[str, ...]]]:
        # Pickled (multiprocessing, concurrent.futures) with message, path and parameters kept apart.
        return type(self), (self.message, self.path, self.parameters)


class BadGGUFError(GGUFMTPError, ValueError):
    """A file is not a well-formed GGUF (bad magic, truncated, inconsistent sizes, ...)."""


class GGUFNotFoundError(BadGGUFError, FileNotFoundError):
    """A GGUF file given as input does not exist."""


class ShardSetError(GGUFMTPError, ValueError):
    """A split set is incomplete or inconsistent (missing shard, mixed counts, wrong ``split.no``)."""


class IncompatibleDraftError(GGUFMTPError, ValueError):
    """The draft cannot be spliced into the target (other architecture, width, block index, ...)."""


class NoNextNBlockError(IncompatibleDraftError):
    """The model has no NextN (MTP) block to extract, strip, graft or publish."""


class KVEditError(GGUFMTPError, ValueError):
    """A KV override (the ``set_kv`` parameter) is malformed or does not fit the key's type."""

    def __init__(
        self,
        message: str,
        path: str | os.PathLike[str] | None = None,
        parameter: str | tuple[str, ...] | None = "set_kv",
    ) -> None:
        super().__init__(message, path, parameter)


class ParameterError(GGUFMTPError, ValueError):
    """A parameter has a value the operation cannot take (a negative block index, an unknown outtype,
    options that contradict each other, a malformed ``GGUF_MTP_*`` environment setting)."""


class InputReadError(GGUFMTPError, OSError):
    """An input exists but cannot be read (permission denied, an I/O error)."""


class UnsafeOutputError(GGUFMTPError, OSError):
    """Writing the output would overwrite an input or an existing file, or cannot be done safely."""


class OutputWriteError(GGUFMTPError, OSError):
    """Writing the output failed (disk full, permission denied, ...); partial outputs were removed."""


class CheckpointError(GGUFMTPError, ValueError):
    """A Hugging Face checkpoint (config.json, safetensors, index) is malformed or unsupported."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint (folder or file) given as input does not exist."""


class HubError(GGUFMTPError, OSError):
    """A Hugging Face Hub operation failed (offline, missing token, no write access, ...)."""


class HubUnreachableError(HubError):
    """The Hub (or the server a Hub address names) cannot be reached: the connection was refused, the
    name does not resolve, the connection timed out or broke, TLS failed. The message names the host and
    the cause, whatever HTTP library the installed huggingface_hub uses."""


class VerificationError(GGUFMTPError, ValueError):
    """A composite failed verification."""


class _LoggedError(GGUFMTPError):
    """A llama.cpp program that failed in a child process, with the last lines of its log (``log_tail``)."""

    def __init__(
        self,
        message: str,
        path: str | os.PathLike[str] | None = None,
        parameter: str | tuple[str, ...] | None = None,
        *,
        log_tail: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, path, parameter)
        self.log_tail = log_tail


class LlamaServerError(_LoggedError, OSError):
    """llama-server (``gguf-mtp bench``) is not usable: not llama-server, too old, never ready, crashed, or
    answered something else than llama-server answers.

    Attributes:
        log_tail: the last lines of the server's log, when there is one (the full log is kept at ``log``).
        log: the kept log file, or ``None``.
    """

    def __init__(
        self,
        message: str,
        path: str | os.PathLike[str] | None = None,
        parameter: str | tuple[str, ...] | None = None,
        *,
        log_tail: tuple[str, ...] = (),
        log: str | None = None,
    ) -> None:
        super().__init__(message, path, parameter, log_tail=log_tail)
        self.log = log


class LlamaCppError(_LoggedError, RuntimeError):
    """llama.cpp (through llama-cpp-python, in a child process: ``gguf-mtp accept``) aborted or failed while running
    a model.

    Attributes:
        log_tail: llama.cpp's last log lines.
    """
