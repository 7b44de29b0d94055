"""``replace_head``: a target's NextN block(s) dropped and new ones spliced in, in one pass.

Many published quants already carry a NextN block, often at whatever low type the quantizer picked; the
way to a working head is to replace it. Without this, that is ``strip`` then ``compose``: two full copies
of the model. Here the two plans are chained in memory instead. :func:`plan_head_removal` plans the
trunk-only copy ``strip`` would write and reads its headers back from the planned bytes (as graft does
with its draft); ``compose`` (or ``graft``) plans against that never-written trunk; then
:meth:`HeadRemoval.apply` re-binds every range of the trunk to the target range it was planned from
(:func:`gguf_mtp.files.plan.rebind`). So the result is, byte for byte, what ``strip`` followed by
``compose`` write, and each target byte travels once, target -> output, by the kernel (reflink where the
file system shares extents: strip and compose each keep the data in step with their input).

The one rule of its own: the new head must be one llama.cpp's MTP graph of the architecture runs
(:data:`gguf_mtp.model.arch_rules.MTP_GRAPH_BLOCKS`); a composite that is only a different dead head is
no repair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf_mtp.constants import KEY_NEXTN_PREDICT_LAYERS
from gguf_mtp.errors import IncompatibleDraftError
from gguf_mtp.files.plan import Bytes, rebind
from gguf_mtp.format.header import parse_header
from gguf_mtp.format.kv_edit import KVChange
from gguf_mtp.model.arch_rules import nextn_graph_note
from gguf_mtp.model.shards import ShardSet

from .compose_plan import CompositionPlan, ReplacedHead
from .head_type import summarize_head
from .strip import StripPlan, plan_strip

__all__ = ["VIRTUAL_FOLDER", "HeadRemoval", "plan_head_removal", "replace_lines"]

#: The folder name the never-written trunk-only files are given (messages about the trunk name it).
VIRTUAL_FOLDER = "(trunk only, never written)"


@dataclass(frozen=True)
class HeadRemoval:
    """A target without its NextN block(s), as ``strip`` would write it, planned and never written."""

    target: ShardSet  # the model with the head to replace
    strip: StripPlan  # the trunk-only copy strip would write
    trunk: ShardSet  # its headers, read back from the planned bytes: what compose plans against

    @property
    def replaced(self) -> ReplacedHead:
        """The block(s) dropped: where, how many, their types and size."""
        nextn = self.strip.nextn
        return ReplacedHead(nextn.describe(), nextn.count, summarize_head(t for _, t in nextn.tensors),
                            len(nextn.tensors))

    def apply(self, plan: CompositionPlan) -> CompositionPlan:
        """``plan`` (made against :attr:`trunk`) with the trunk's ranges read from the target itself.

        Raises:
            IncompatibleDraftError: llama.cpp's MTP graph of the architecture runs fewer blocks than the new
                head has (:func:`gguf_mtp.model.arch_rules.nextn_graph_note`).
        """
        note = nextn_graph_note(plan.target.arch, plan.nextn_blocks)
        if note is not None:
            raise IncompatibleDraftError(f"cannot replace the head with this one: {note}", plan.draft.name)
        virtual = {f.output.path: f.output for f in self.strip.files}
        files = tuple(
            dataclasses.replace(
                composed, output=rebind(composed.output, virtual), removed_tensors=stripped.removed_tensors,
                kv_changes=_net_changes(stripped.kv_changes, composed.kv_changes, composed.output.path.name),
            )
            for composed, stripped in zip(plan.files, self.strip.files, strict=True)
        )
        return dataclasses.replace(plan, target=self.target, files=files, replaced=self.replaced)


def _net_changes(stripped: Sequence[KVChange], composed: Sequence[KVChange], file: str) -> tuple[KVChange, ...]:
    """The metadata changes from the target to the output: strip's then compose's, netted per key (a key strip
    removed and compose put back as it was is no change at all)."""
    before = {c.key: c for c in stripped}
    changes = []
    for change in composed:
        first = before.pop(change.key, None)
        old = first.old if first is not None else change.old
        if old != change.new:
            changes.append(dataclasses.replace(change, old=old))
    changes += [dataclasses.replace(c, file=file) for c in before.values() if c.old != c.new]
    return tuple(changes)


def plan_head_removal(target: ShardSet, command: str = "compose") -> HeadRemoval:
    """Plan ``target`` without its NextN block(s) (pure: reads headers only; nothing is written).

    Args:
        target: a model with NextN block(s) (one file or a split set).
        command: the command that replaces it, for the refusal (``compose``, ``graft``).

    Raises:
        IncompatibleDraftError: the target has no NextN block (one line saying to leave out ``replace_head``).
        BadGGUFError: as :func:`gguf_mtp.jobs.strip.plan_strip` (an MTP-only target, unusable metadata).
    """
    if not target.nextn_predict_layers:
        raise IncompatibleDraftError(
            f"the target has no NextN block to replace ({target.arch_key(KEY_NEXTN_PREDICT_LAYERS)} is 0 or "
            f"absent): leave out replace_head, a plain {command} adds one",
            target.name,
            parameter="replace_head",
        )
    strip = plan_strip(target, Path(target.name).parent / VIRTUAL_FOLDER)
    headers = []
    for planned in strip.files:
        head = planned.output.segments[0]
        assert isinstance(head, Bytes)
        headers.append(parse_header(_reader(head.data), planned.output.size, str(planned.path)))
    return HeadRemoval(target, strip, ShardSet(tuple(headers), target.prefix))


def _reader(data: bytes) -> Callable[[int, int], bytes]:
    """``read_at`` over a planned header's bytes (all a header parse reads)."""
    return lambda offset, size: data[offset : offset + size]


def replace_lines(plan: CompositionPlan) -> list[str]:
    """The plan's line about a replaced head: old blocks, types and size -> new (none without ``replace_head``)."""
    old = plan.replaced
    if old is None:
        return []
    new = f"blk.{plan.block}" + (f"..blk.{plan.block + plan.nextn_blocks - 1}" if plan.nextn_blocks > 1 else "")
    return [f"replace: {old.blocks} ({old.head.describe()}) -> {new} ({plan.head.describe()})"]
