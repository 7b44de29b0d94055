"""gguf-mtp: give community GGUF quants their multi-token-prediction (MTP / NextN) head back.

Public API::

    from gguf_mtp import compose, open_model
    report = compose("Model-00001-of-00003.gguf", "mtp-draft.gguf", "out/")
"""

from __future__ import annotations

from .compose import ComposeReport, compose, plan
from .errors import (
    BadGGUFError,
    CheckpointError,
    GGUFMTPError,
    HubError,
    IncompatibleDraftError,
    KVEditError,
    OutputWriteError,
    ShardSetError,
    UnsafeOutputError,
    VerificationError,
)
from .shards import ShardSet, open_model

__version__ = "0.1.0"

__all__ = [
    "BadGGUFError",
    "CheckpointError",
    "ComposeReport",
    "GGUFMTPError",
    "HubError",
    "IncompatibleDraftError",
    "KVEditError",
    "OutputWriteError",
    "ShardSet",
    "ShardSetError",
    "UnsafeOutputError",
    "VerificationError",
    "__version__",
    "compose",
    "open_model",
    "plan",
]
