"""``compose``: splice an MTP draft into a (sharded, quantized) target GGUF as its final block."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_mtp.files.plan import OutputFile
from gguf_mtp.format.kv_edit import KVOverride, parse_set_kv
from gguf_mtp.jobs.runner import WriteReport, run_write
from gguf_mtp.model.shards import open_model
from gguf_mtp.text import change_line, human_bytes

from .compose_plan import CompositionPlan, plan_composition
from .head_type import head_notes, parse_outtype
from .replace_head import plan_head_removal, replace_lines

__all__ = ["ComposeReport", "compose", "plan", "plan_compose"]


@dataclass(kw_only=True)
class ComposeReport(WriteReport):
    """What a compose run did (or, with ``dry_run``, would do)."""

    plan: CompositionPlan
    verification: Any = None  # a VerifyReport when compose ran with verify=True
    head_advice: list[str] = field(default_factory=list)  # about the head's type: shown with the plan

    @property
    def output_paths(self) -> list[Path]:
        return [f.path for f in self.plan.files]

    def plan_lines(self) -> list[str]:
        """The plan: target, draft, each output with its metadata changes (shown before writing starts)."""
        plan = self.plan
        lines = [
            f"target: {plan.target.arch}, {len(plan.target.headers)} file(s), {plan.target.tensor_count} tensors, "
            f"blocks 0..{plan.block - 1}",
            f"draft:  {len(plan.renamed)} tensors -> blk.{plan.block}"
            + (f" (left out {', '.join(plan.dropped)})" if plan.dropped else ""),
            f"head:   {plan.head.describe()}",
            *replace_lines(plan),
            *(f"note:   {advice}" for advice in self.head_advice),
        ]
        for f in plan.files:
            lines.append(
                f"{self.action(f.path)} {f.path} ({human_bytes(f.output.size)}, {len(f.tensors)} tensors"
                + (f", -{len(f.removed_tensors)} NextN" if f.removed_tensors else "")
                + (f", +{len(f.added_tensors)} NextN" if f.added_tensors else "")
                + ")"
            )
            lines.extend(f"    {change_line(c)}" for c in f.kv_changes)
        return lines

    def outcome_lines(self) -> list[str]:
        """What was written (or, in a dry run, would be), and the verification."""
        lines = super().outcome_lines()
        if self.verification is not None:
            lines.extend(self.verification.describe())
        return lines

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        plan = self.plan
        result: dict[str, Any] = {
            "command": "compose",
            "dry_run": self.dry_run,
            "target": [str(p) for p in plan.target.paths],
            "draft": plan.draft.name,
            "architecture": plan.target.arch,
            "block": plan.block,
            "nextn_blocks": plan.nextn_blocks,
            "files": [f.to_dict() for f in plan.files],
            "tensors": {
                "target": plan.target.tensor_count,
                "added": len(plan.renamed),
                "removed": plan.replaced.tensors if plan.replaced is not None else 0,
                "total": sum(len(f.tensors) for f in plan.files),
            },
            "renamed": [{"draft": a, "composite": b} for a, b in plan.renamed],
            "dropped": list(plan.dropped),
            "head": plan.head.to_dict(),
            "replaced_head": plan.replaced.to_dict() if plan.replaced is not None else None,
            "kv_changes": [c.to_dict() for c in plan.kv_changes],
            "bytes_to_write": plan.bytes_to_write,
            **self.write_fields(),
        }
        if self.verification is not None:
            result["verification"] = self.verification.to_dict()
        return result


def _overrides(set_kv: Iterable[str | KVOverride]) -> list[KVOverride]:
    return [o if isinstance(o, KVOverride) else parse_set_kv(o) for o in set_kv]


def plan_compose(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    block: int | None = None,
    set_kv: Sequence[str | KVOverride] = (),
    basename: str | None = None,
    outtype: str | None = None,
    replace_head: bool = False,
    imatrix: str | os.PathLike[str] | None = None,
) -> CompositionPlan:
    """Read the headers of ``target`` and ``draft`` and plan their composition (nothing is written); with
    ``replace_head``, of the target without its NextN block(s) (:mod:`gguf_mtp.jobs.replace_head`)."""
    model = open_model(target)
    removal = plan_head_removal(model, "compose") if replace_head else None
    plan = plan_composition(
        removal.trunk if removal is not None else model,
        open_model(draft),
        Path(output_dir),
        block=block,
        set_kv=_overrides(set_kv),
        basename=basename,
        outtype=outtype,
        imatrix=imatrix,
    )
    return removal.apply(plan) if removal is not None else plan


#: The earlier name of :func:`plan_compose`, kept so that existing callers keep working.
plan = plan_compose


def compose(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    block: int | None = None,
    set_kv: Sequence[str | KVOverride] = (),
    basename: str | None = None,
    outtype: str | None = None,
    replace_head: bool = False,
    imatrix: str | os.PathLike[str] | None = None,
    dry_run: bool = False,
    force: bool = False,
    progress: bool = True,
    verify: bool = False,
    llama: bool | None = None,
    on_plan: Callable[[WriteReport], None] | None = None,
) -> ComposeReport:
    """Splice the NextN block(s) of ``draft`` into ``target`` and write the composite to ``output_dir``.

    Every target tensor's bytes are copied verbatim (by the kernel), the draft's block tensors are
    appended to the last shard under their new names, and the model metadata is patched:
    ``{arch}.block_count``, ``{arch}.nextn_predict_layers``, every per-layer array and
    ``split.tensors.count`` in every shard; every shard also carries the set id ``gguf_mtp.set_id``
    (:mod:`gguf_mtp.set_id`), so ``verify`` notices a set mixed from two runs. Outputs appear atomically,
    under a lock on ``output_dir`` (a concurrent writer is refused) and, with ``force``, the old files
    come back if anything fails (:mod:`gguf_mtp.files.commit`).

    Args:
        target: a single-file GGUF or any shard of a ``<prefix>-NNNNN-of-NNNNN.gguf`` set.
        draft: a GGUF whose block tensors are ``blk.0.*`` (renamed) or ``blk.N.*`` (kept).
        output_dir: folder for the composite (created if missing); files keep the target's names.
        block: the NextN block index; optional, and only the target's trunk block count is accepted.
        set_kv: ``KEY=VALUE`` / ``KEY:TYPE=VALUE`` metadata overrides.
        basename: name outputs ``NAME-0000k-of-0000n.gguf`` (``NAME.gguf`` for one file).
        outtype: write the NextN tensors in this type (``q8_0``, ``q4_k``...) exactly as ``llama-quantize --pure``
            would; ``None`` copies the draft's bytes. Target bytes are always copied.
        replace_head: the target has NextN block(s): drop them and splice the draft's in their place, in one
            pass, byte for byte what :func:`gguf_mtp.jobs.strip.strip` then compose write (the block count may
            change; the new one must be one llama.cpp's MTP graph of the architecture runs).
        imatrix: an importance matrix file (llama-imatrix's GGUF) the NextN tensors are quantized with, as
            ``llama-quantize --imatrix`` does; it lets ``outtype`` be a type that needs one (``iq2_xxs``...).
        dry_run: plan and check only (every refusal a real run would make is made); write nothing.
        force: replace existing outputs (never inputs).
        progress: show a progress bar on stderr when it is a terminal.
        verify: verify the written composite (see :func:`gguf_mtp.check.verify`) before returning.
        llama: with ``verify``, whether to load it with llama.cpp (default: when installed).
        on_plan: called with the report once the outputs passed their checks, before the first byte is
            written (the CLI prints the plan there).

    Returns:
        A :class:`ComposeReport`.

    Raises:
        GGUFMTPError: bad input (``BadGGUFError``, ``ShardSetError``, ``IncompatibleDraftError``,
            ``KVEditError``), an unsafe output (``UnsafeOutputError``) or a failed write
            (``OutputWriteError``); nothing with a final name is left behind on failure.

    Example:
        >>> report = compose("Model-UD-Q4_K_XL-00001-of-00003.gguf", "mtp-draft.gguf", "out/")  # doctest: +SKIP
        >>> report.plan.block, len(report.plan.renamed)  # doctest: +SKIP
        (88, 18)
    """

    def prepare() -> tuple[ComposeReport, list[OutputFile], list[Path]]:
        composition = plan_compose(target, draft, output_dir, block=block, set_kv=set_kv, basename=basename,
                                   outtype=outtype, replace_head=replace_head, imatrix=imatrix)
        report = ComposeReport(plan=composition, dry_run=dry_run)
        placed = {name for name, _ in composition.renamed}
        head = [t for t in composition.draft.first.tensors if t.name in placed]
        head_type = parse_outtype(outtype, imatrix=imatrix is not None)
        report.head_advice = head_notes(head, head_type, composition.target, composition.target.arch)
        report.notes.extend(report.head_advice)
        if composition.dropped:
            dropped = ", ".join(composition.dropped)
            report.notes.append(f"left out draft tensors {dropped}: the composite uses the target's")
        return report, composition.outputs, [*composition.target.paths, *composition.draft.paths]

    def verify_written(report: ComposeReport) -> None:
        from gguf_mtp.check.verify import verify as verify_composite

        composition = report.plan
        report.verification = verify_composite(
            composition.files[0].path,
            # a replaced head is no longer the target's: its trunk is what strip + compose guarantee, by the plan
            target=composition.target.paths[0] if composition.replaced is None else None,
            draft=composition.draft.paths[0] if outtype is None else None,  # re-typed: bytes differ
            llama=llama,
            progress=progress,
            allow_kv=[o.key for o in _overrides(set_kv)],  # what --set-kv changed on purpose
        )

    return run_write(
        prepare, desc="compose", force=force, progress=progress, on_plan=on_plan, output_dir=output_dir,
        after_write=verify_written if verify else None,
    )
