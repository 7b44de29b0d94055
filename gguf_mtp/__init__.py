"""gguf-mtp: give community GGUF quants their multi-token-prediction (MTP / NextN) head back.

The public API, one function per job (each has a ``gguf-mtp`` command of the same name)::

    from gguf_mtp import bench, compose, convert, inspect, verify

    convert("nvidia/...-MTPv2", "mtp-draft.gguf", target="Model-00001-of-00003.gguf")
    report = compose("Model-00001-of-00003.gguf", "mtp-draft.gguf", "out/", verify=True)
    print(inspect("out/Model-00001-of-00003.gguf").mtp_verdict)
    print("\n".join(bench("out/Model-00001-of-00003.gguf", "llama-server", server_args=["-ngl", "99"]).describe()))

Every error a user can cause is a :class:`GGUFMTPError` (see :mod:`gguf_mtp.errors`).

The names are imported on first use (PEP 562), so ``import gguf_mtp`` and ``gguf-mtp --version``
load neither numpy nor gguf-py. gguf-py's package is registered so that its tables (``gguf.constants``)
load without the rest of it and numpy (:mod:`gguf_mtp._gguf_tables`): copying bytes needs only the tables.
The package's layers, bottom up, are declared once, in :data:`gguf_mtp._layers.LAYERS`; every import goes
down them (``tests/test_layers.py`` enforces it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._gguf_tables import defer_gguf_package
from ._version import __version__
from .errors import (
    BadGGUFError,
    CheckpointError,
    CheckpointNotFoundError,
    GGUFMTPError,
    GGUFNotFoundError,
    HubError,
    HubUnreachableError,
    IncompatibleDraftError,
    InputReadError,
    KVEditError,
    LlamaCppError,
    LlamaServerError,
    NoNextNBlockError,
    OutputWriteError,
    ParameterError,
    ShardSetError,
    UnsafeOutputError,
    VerificationError,
)

defer_gguf_package()  # before any module of the package imports gguf.constants

if TYPE_CHECKING:
    from .check.accept import AcceptReport, SampledReport, accept, accept_sampled
    from .check.accept_sampling import Sampling
    from .check.inspect import ModelSummary, inspect
    from .check.verify import VerifyReport, verify
    from .jobs.compose import ComposeReport, compose, plan, plan_compose
    from .jobs.convert import ConvertReport, convert
    from .jobs.extract import extract
    from .jobs.graft import graft
    from .jobs.sidecar_pairing import sidecar_pairing
    from .jobs.sidecar_set import write_sidecar_set
    from .jobs.strip import strip
    from .model.shards import ShardSet, open_model
    from .release.pipeline import run_pipeline
    from .release.publish import publish
    from .server.bench import bench
    from .server.bench_rules import BenchReport

#: Public name -> the module that defines it (imported by :func:`__getattr__` on first use).
_LAZY: dict[str, str] = {
    "ComposeReport": "jobs.compose",
    "compose": "jobs.compose",
    "plan": "jobs.compose",
    "plan_compose": "jobs.compose",
    "ConvertReport": "jobs.convert",
    "convert": "jobs.convert",
    "extract": "jobs.extract",
    "graft": "jobs.graft",
    "sidecar_pairing": "jobs.sidecar_pairing",
    "write_sidecar_set": "jobs.sidecar_set",
    "strip": "jobs.strip",
    "ModelSummary": "check.inspect",
    "inspect": "check.inspect",
    "VerifyReport": "check.verify",
    "verify": "check.verify",
    "BenchReport": "server.bench_rules",
    "bench": "server.bench",
    "AcceptReport": "check.accept",
    "accept": "check.accept",
    "SampledReport": "check.accept",
    "accept_sampled": "check.accept",
    "Sampling": "check.accept_sampling",
    "run_pipeline": "release.pipeline",
    "publish": "release.publish",
    "ShardSet": "model.shards",
    "open_model": "model.shards",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AcceptReport",
    "BadGGUFError",
    "BenchReport",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ComposeReport",
    "ConvertReport",
    "GGUFMTPError",
    "GGUFNotFoundError",
    "HubError",
    "HubUnreachableError",
    "IncompatibleDraftError",
    "InputReadError",
    "KVEditError",
    "LlamaCppError",
    "LlamaServerError",
    "ModelSummary",
    "NoNextNBlockError",
    "OutputWriteError",
    "ParameterError",
    "SampledReport",
    "Sampling",
    "ShardSet",
    "ShardSetError",
    "UnsafeOutputError",
    "VerificationError",
    "VerifyReport",
    "__version__",
    "accept",
    "accept_sampled",
    "bench",
    "compose",
    "convert",
    "extract",
    "graft",
    "inspect",
    "open_model",
    "plan",
    "plan_compose",
    "publish",
    "run_pipeline",
    "sidecar_pairing",
    "strip",
    "verify",
    "write_sidecar_set",
]
