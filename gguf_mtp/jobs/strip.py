"""``strip``: a trunk-only copy of a model with NextN (MTP) blocks -- the inverse of ``compose``.

The NextN tensors leave the tensor tables, ``{arch}.block_count`` drops to the trunk count (its type
kept), ``{arch}.nextn_predict_layers`` is removed (what llama.cpp's converters write for a model
without MTP, and what a target had before ``compose`` added the key), every per-layer array that
``compose`` extends (:mod:`gguf_mtp.model.arch_rules`) is cut back to the trunk, and
``split.tensors.count`` is lowered in every shard. Every other KV and tensor is kept byte for byte,
so stripping a composite gives back its target, and ``compose`` of the stripped model with the
extracted block gives back the composite.

Tensor data moves with the kernel. Where the NextN tensors sit at the end of a shard (as ``compose``
puts them) every other tensor keeps its data offset and the shard is one copy up to where the NextN
data began; where they sit in the middle, the tensors after them move up (still kernel copies), as
llama.cpp wants every tensor right after the previous one (rounded up to the alignment).
A model whose metadata declares a NextN block with no tensors (a converter that dropped them) is
repaired the same way: only its metadata changes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType

from gguf_mtp.constants import KEY_BLOCK_COUNT, KEY_NEXTN_PREDICT_LAYERS, KEY_SPLIT_TENSORS_COUNT
from gguf_mtp.errors import BadGGUFError
from gguf_mtp.files.plan import Bytes, CopyRange, OutputFile, Segment, Zeros
from gguf_mtp.format.header import GGUFArray, GGUFHeader, KeyValue, TensorInfo, align_up, encode_kv
from gguf_mtp.format.kv_edit import apply_kv_edits, with_int_value
from gguf_mtp.format.layout import congruent_header, pack_tensors
from gguf_mtp.jobs.runner import WriteReport, run_write
from gguf_mtp.model.arch_rules import extended_arrays, trunk_only_arrays
from gguf_mtp.model.set_id import without_set_id
from gguf_mtp.model.shards import ShardSet, open_model
from gguf_mtp.text import change_line, human_bytes

from .compose_plan import FilesPlan, PlannedFile
from .extract import NextNBlocks, find_nextn_blocks

__all__ = ["StripPlan", "StripReport", "plan_strip", "strip"]


@dataclass(frozen=True)
class StripPlan(FilesPlan):
    """Everything a strip run will write."""

    source: ShardSet
    nextn: NextNBlocks
    files: tuple[PlannedFile, ...]

    @property
    def removed(self) -> list[str]:
        return [name for f in self.files for name in f.removed_tensors]


def _model_kv_edits(model: ShardSet, trunk: int) -> dict[str, KeyValue | None]:
    """Shard-1 edits by key (``None`` removes the key)."""
    first = model.first
    count_key = model.arch_key(KEY_BLOCK_COUNT)
    edits: dict[str, KeyValue | None] = {count_key: with_int_value(first, count_key, trunk)}
    edits[model.arch_key(KEY_NEXTN_PREDICT_LAYERS)] = None
    # What compose extended (gguf_mtp.model.arch_rules), and a trunk-length array someone extended anyway
    # (llama.cpp would refuse the stripped model with it too).
    cut = [kv for kv, _ in extended_arrays(first, model.arch, model.block_count)]
    cut += [kv for kv in trunk_only_arrays(first, model.arch) if kv.array_length == model.block_count != trunk]
    for kv in cut:
        array = kv.typed_value
        edits[kv.key] = encode_kv(kv.key, GGUFValueType.ARRAY, GGUFArray(array.element_type, array.items[:trunk]))
    return edits


def _shard_layout(header: GGUFHeader, removed: frozenset[str]) -> tuple[list[TensorInfo], list[Segment], list[str]]:
    """(tensor table, data segments, moved tensor names) of one shard without the ``removed`` tensors.

    llama.cpp reads a data section densely: each tensor at the previous one's end rounded up to the
    alignment, in table order. So the kept tensors are placed that way; runs of them that keep their
    distance to each other are copied as one range (padding included), so a shard whose NextN tensors
    sit at the end is one copy and keeps every offset.
    """
    path = Path(header.path)
    tensors, _, _ = pack_tensors(((t, ()) for t in header.tensors if t.name not in removed), header.alignment)
    old = header.tensor_by_name
    segments: list[Segment] = []
    written = 0
    # Consecutive tensors that moved by the same distance (none, mostly) are one verbatim copy.
    for _, group in itertools.groupby(tensors, key=lambda t: old[t.name].offset - t.offset):
        run = list(group)
        first, last = run[0], run[-1]
        if first.offset > written:
            segments.append(Zeros(first.offset - written))
        start = old[first.name].offset
        segments.append(CopyRange(path, header.data_offset + start, old[last.name].offset + last.nbytes - start))
        written = last.offset + last.nbytes
    end = align_up(written, header.alignment)
    if end > written:
        segments.append(Zeros(end - written))
    return tensors, segments, [t.name for t in tensors if t.offset != old[t.name].offset]


def plan_strip(source: ShardSet, output_dir: str | os.PathLike[str]) -> StripPlan:
    """Plan a trunk-only copy of ``source`` in ``output_dir`` (pure: reads headers only).

    Args:
        source: a model with NextN blocks (one file or a split set).
        output_dir: folder for the output; files keep the source's names.

    Returns:
        The :class:`StripPlan`.

    Raises:
        NoNextNBlockError: the source has no NextN block.
        BadGGUFError: the source is an MTP-only file (no trunk block tensors) or its metadata is unusable.
    """
    nextn = find_nextn_blocks(source, require_tensors=False)
    trunk = nextn.first
    if not any(i < trunk for i in source.block_indices()):
        raise BadGGUFError(
            f"an MTP-only model (no tensors of blocks 0..{trunk - 1}): stripping its NextN block would leave nothing",
            source.name,
        )
    removed = nextn.names
    model_edits = _model_kv_edits(source, trunk)
    output_dir = Path(output_dir)
    files: list[PlannedFile] = []
    for index, header in enumerate(source.headers):
        final = output_dir / Path(header.path).name
        edits = dict(model_edits) if index == 0 else {}
        if KEY_SPLIT_TENSORS_COUNT in header.kvs:
            total = header.kvs[KEY_SPLIT_TENSORS_COUNT].value
            edits[KEY_SPLIT_TENSORS_COUNT] = with_int_value(header, KEY_SPLIT_TENSORS_COUNT, total - len(removed))
        kvs, changes = apply_kv_edits(header, edits, final.name)
        kvs = without_set_id(kvs)  # the composite's set id (gguf_mtp.set_id): the target had none
        tensors, segments, moved = _shard_layout(header, removed)
        # Drops compose's padding KV, and pads again only where the data would be out of step (reflink).
        head = congruent_header(header.version, kvs, tensors, header.alignment, segments, Path(header.path))
        files.append(
            PlannedFile(
                output=OutputFile(final, (Bytes(head), *segments)),
                source=Path(header.path),
                tensors=tuple(tensors),
                removed_tensors=tuple(t.name for t in header.tensors if t.name in removed),
                moved_tensors=tuple(moved),
                kv_changes=tuple(changes),
            )
        )
    return StripPlan(source, nextn, tuple(files))


@dataclass(kw_only=True)
class StripReport(WriteReport):
    """What a strip run did (or, with ``dry_run``, would do)."""

    plan: StripPlan

    @property
    def output_paths(self) -> list[Path]:
        return [f.path for f in self.plan.files]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        plan = self.plan
        return {
            "command": "strip",
            "dry_run": self.dry_run,
            "source": [str(p) for p in plan.source.paths],
            "architecture": plan.source.arch,
            "nextn_blocks": list(plan.nextn.indices),
            "files": [f.to_dict() for f in plan.files],
            "tensors": {
                "source": plan.source.tensor_count,
                "removed": len(plan.removed),
                "total": plan.source.tensor_count - len(plan.removed),
            },
            "kv_changes": [c.to_dict() for c in plan.kv_changes],
            "bytes_to_write": plan.bytes_to_write,
            **self.write_fields(),
        }

    def plan_lines(self) -> list[str]:
        """The plan: what is removed, each output with its metadata changes (shown before writing starts)."""
        plan = self.plan
        lines = [
            f"source: {plan.source.arch}, {len(plan.source.headers)} file(s), {plan.source.tensor_count} tensors, "
            f"NextN block(s) {plan.nextn.describe()} ({len(plan.removed)} tensors) removed",
        ]
        for f in plan.files:
            extra = f", -{len(f.removed_tensors)} NextN" if f.removed_tensors else ""
            extra += f", {len(f.moved_tensors)} moved up" if f.moved_tensors else ""
            size = human_bytes(f.output.size)
            lines.append(f"{self.action(f.path)} {f.path} ({size}, {len(f.tensors)} tensors{extra})")
            lines.extend(f"    {change_line(c)}" for c in f.kv_changes)
        lines.extend(f"note: {n}" for n in self.notes)
        return lines


def strip(
    source: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    dry_run: bool = False,
    progress: bool = True,
    on_plan: Callable[[WriteReport], None] | None = None,
) -> StripReport:
    """Write a trunk-only copy of ``source`` (its NextN blocks removed) to ``output_dir``.

    Args:
        source: a GGUF with NextN blocks: one file or any shard of a ``<prefix>-NNNNN-of-NNNNN.gguf`` set.
        output_dir: folder for the output (created if missing); files keep the source's names.
        force: replace existing outputs (never inputs).
        dry_run: plan and check only (every refusal a real run would make is made); write nothing.
        progress: show a progress bar on stderr when it is a terminal.
        on_plan: called with the report once the outputs passed their checks, before the first byte is
            written (the CLI prints the plan there).

    Returns:
        A :class:`StripReport`.

    Raises:
        NoNextNBlockError: the source has no NextN block.
        BadGGUFError, ShardSetError: the source is malformed, incomplete or MTP-only.
        UnsafeOutputError: an output is an input, exists (without ``force``) or cannot be written.
        OutputWriteError: writing failed; nothing was left behind.

    Example:
        >>> strip("Model-Q8_0-00001-of-00003.gguf", "trunk-only/")  # doctest: +SKIP
    """

    def prepare() -> tuple[StripReport, list[OutputFile], list[Path]]:
        model = open_model(source)
        plan = plan_strip(model, output_dir)
        report = StripReport(plan=plan, dry_run=dry_run)
        if not plan.removed:
            report.notes.append(
                f"no NextN tensors were present ({plan.nextn.describe()} was declared but empty): only the metadata "
                "was repaired"
            )
        return report, plan.outputs, model.paths

    return run_write(prepare, desc="strip", force=force, progress=progress, on_plan=on_plan, output_dir=output_dir)
