"""gguf-mtp: give community GGUF quants their multi-token-prediction (MTP / NextN) head back.

The public API, one function per job (each has a ``gguf-mtp`` command of the same name)::

    from gguf_mtp import convert, compose, verify, inspect

    convert("nvidia/...-MTPv2", "mtp-draft.gguf", target="Model-00001-of-00003.gguf")
    report = compose("Model-00001-of-00003.gguf", "mtp-draft.gguf", "out/", verify=True)
    print(inspect("out/Model-00001-of-00003.gguf").mtp_verdict)

Every error a user can cause is a :class:`GGUFMTPError` (see :mod:`gguf_mtp.errors`).
"""

from __future__ import annotations

from .compose import ComposeReport, compose, plan
from .convert import ConvertReport, convert
from .errors import (
    BadGGUFError,
    CheckpointError,
    GGUFMTPError,
    HubError,
    IncompatibleDraftError,
    KVEditError,
    NoNextNBlockError,
    OutputWriteError,
    ShardSetError,
    UnsafeOutputError,
    VerificationError,
)
from .extract import extract
from .graft import graft
from .inspect import ModelSummary, inspect
from .pipeline import run_pipeline
from .publish import publish
from .shards import ShardSet, open_model
from .strip import strip
from .verify import VerifyReport, verify

__version__ = "0.1.0"

__all__ = [
    "BadGGUFError",
    "CheckpointError",
    "ComposeReport",
    "ConvertReport",
    "GGUFMTPError",
    "HubError",
    "IncompatibleDraftError",
    "KVEditError",
    "ModelSummary",
    "NoNextNBlockError",
    "OutputWriteError",
    "ShardSet",
    "ShardSetError",
    "UnsafeOutputError",
    "VerificationError",
    "VerifyReport",
    "__version__",
    "compose",
    "convert",
    "extract",
    "graft",
    "inspect",
    "open_model",
    "plan",
    "publish",
    "run_pipeline",
    "strip",
    "verify",
]
