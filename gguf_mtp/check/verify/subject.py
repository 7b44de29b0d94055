"""What one ``verify`` run checks (:class:`Subject`): the file as scanned, its block layout, whether it is a model
or an MTP-only draft, what it is compared with, and how; and the shape of a check group (:data:`CheckGroup`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gguf_mtp.model.blocks import BlockLayout, block_indices, block_layout_problem, is_mtp_only
from gguf_mtp.model.shard_scan import ScannedModel
from gguf_mtp.model.shards import ShardSet

from .report import VerifyReport

__all__ = ["CheckGroup", "Subject", "VerifyOptions", "is_mtp_draft", "read_layout"]


@dataclass(frozen=True)
class VerifyOptions:
    """How to verify (the keywords of :func:`gguf_mtp.check.verify.verify`, which documents each)."""

    llama: bool | None
    progress: bool
    allow_kv: tuple[str, ...]
    acceptance: bool
    floor: float


@dataclass(frozen=True)
class Subject:
    """The file verified and what it is compared with, read once before any check group runs."""

    model: ScannedModel
    layout: BlockLayout | None  # None: the metadata states no usable layout, ``layout_error`` says why
    layout_error: str | None
    is_draft: bool  # an MTP-only file, checked as a draft
    options: VerifyOptions
    target: ShardSet | None = None
    draft: ShardSet | None = None
    #: draft tensor -> its name in the composite, and the draft's globals the composite leaves out
    renames: dict[str, str] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()


#: A group of checks: appends its checks (and what they found) to the report.
CheckGroup = Callable[[Subject, VerifyReport], None]


def read_layout(model: ScannedModel) -> tuple[BlockLayout | None, str | None]:
    """The file's block layout as its first shard's metadata states it, or (None, why there is none)."""
    first = model.first
    if first is None:
        return None, f"{model.shards[0].label} is unreadable, so the model metadata is unknown"
    return block_layout_problem(first)  # bounded: nothing below loops 4e9 times


def is_mtp_draft(model: ScannedModel, layout: BlockLayout | None) -> bool:
    """Whether the file is MTP-only (NextN block tensors, none of a trunk block): a draft, not a model."""
    if layout is None:
        return False
    return is_mtp_only(layout, block_indices(t.name for h in model.headers for t in h.tensors))
