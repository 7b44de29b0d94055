"""Run a writing job, the same way for every command, and report it: :func:`run_write` checks the output folder,
plans, writes the planned files with :func:`gguf_mtp.write.write_outputs` (a dry run only checks) and verifies;
:class:`WriteReport` is the report every writing command extends with its plan.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gguf_mtp.files.plan import OutputFile
from gguf_mtp.text import human_bytes
from gguf_mtp.write import OutputCheck, WriteStats, check_output_folder, write_outputs

__all__ = ["WriteReport", "run_write"]


@dataclass
class WriteReport:
    """What every command that writes files reports: a dry run or not, bytes written, time, how copied.

    The command reports (compose, convert, extract, strip, graft) extend it with their plan, which they
    say in :meth:`plan_lines` (what the CLI prints before the first byte is written); the end,
    :meth:`outcome_lines`, is the same :meth:`outcome_line` for every command (a report that verifies
    adds its verification). :meth:`describe` is both.
    """

    dry_run: bool = False
    bytes_written: int = 0
    seconds: float = 0.0
    copy_methods: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    bytes_shared: int = 0
    replaced: tuple[Path, ...] = ()  # existing outputs replaced with force (or, in a dry run, that would be)
    written: bool = False  # the files are in place
    planned: tuple[Path, ...] = ()  # the outputs checked (and, unless a dry run, written) by :meth:`write`
    bytes_planned: int = 0  # their size

    def write(
        self,
        files: Sequence[OutputFile],
        *,
        inputs: Sequence[Path],
        force: bool,
        progress: bool,
        desc: str,
        on_plan: Callable[[WriteReport], None] | None = None,
    ) -> None:
        """Check ``files`` and, unless this is a dry run, write them (:func:`write_outputs`); record the figures.

        Args:
            on_plan: called with this report once every check passed, before the first byte is written
                (the CLI prints :meth:`plan_lines` there, so a long run shows its plan first).
        """

        def checked(check: OutputCheck) -> None:
            self.replaced = check.replaced
            self.notes.extend(n for n in check.notes if n not in self.notes)
            if on_plan is not None:
                on_plan(self)

        self.planned = tuple(f.path for f in files)
        self.bytes_planned = sum(f.size for f in files)
        stats = write_outputs(
            files, inputs=inputs, force=force, progress=progress, desc=desc, dry_run=self.dry_run, on_checked=checked
        )
        self.record(stats)

    def record(self, stats: WriteStats) -> None:
        """Take the figures of a finished :func:`write_outputs`."""
        self.bytes_written = stats.bytes_written
        self.copy_methods = stats.copy_methods
        self.bytes_shared = stats.bytes_shared
        self.replaced = stats.replaced
        self.notes.extend(n for n in stats.notes if n not in self.notes)
        self.written = not self.dry_run

    def action(self, path: Path) -> str:
        """What happens to the output ``path``, as the report says it: ``would write``/``would replace`` in
        a dry run, ``writing``/``replacing`` in the plan shown before the first byte, ``wrote``/``replaced``
        once done."""
        replacing = path in self.replaced
        if self.dry_run:
            return "would replace" if replacing else "would write"
        if not self.written:
            return "replacing" if replacing else "writing"
        return "replaced" if replacing else "wrote"

    def plan_lines(self) -> list[str]:
        """The plan part of the human-readable report (shown before writing starts)."""
        return []

    def outcome_lines(self) -> list[str]:
        """The outcome part of the human-readable report (shown at the end): :meth:`outcome_line`."""
        return [self.outcome_line()]

    def outcome_line(self) -> str:
        """The last line of every writing command, one wording for all: ``done: OUTPUT (SIZE) in S s (R MiB/s)``
        or, in a dry run, ``dry run: OUTPUT (SIZE) would be written; nothing was written``. OUTPUT is the one
        output's path or ``N files in FOLDER``; replaced files and (reflink) shared bytes are said too."""
        what = self._planned_text()
        if self.dry_run:
            replacing = self._replaced_text("replacing")
            size = human_bytes(self.bytes_planned)
            return f"dry run: {what} ({size}) would be written{replacing}; nothing was written"
        rate = self.bytes_written / self.seconds / 2**20 if self.seconds else 0
        size = human_bytes(self.bytes_written)
        speed = f"{rate:.0f} MiB/s{self.sharing()}"
        return f"done: {what} ({size}) in {self.seconds:.2f} s ({speed}){self._replaced_text('replaced')}"

    def _planned_text(self) -> str:
        """The outputs as the outcome line names them: the one path, or how many in which folder."""
        if len(self.planned) == 1:
            return str(self.planned[0])
        folders = {p.parent for p in self.planned}
        where = f" in {folders.pop()}" if len(folders) == 1 else ""
        return f"{len(self.planned)} files{where}"

    def _replaced_text(self, verb: str) -> str:
        """``" (replacing the existing file)"``, ``" (replaced 2 existing files)"``, or ``""``."""
        count = len(self.replaced)
        if not count:
            return ""
        if count == 1 == len(self.planned):
            return f" ({verb} the existing file)"
        return f" ({verb} {count} existing file{'s' * (count != 1)})"

    def describe(self) -> list[str]:
        """The human-readable report (what the CLI prints): the plan, then the outcome."""
        return [*self.plan_lines(), *self.outcome_lines()]

    def sharing(self) -> str:
        """``", 3.4 MiB shared with the inputs, 5.7 MiB copied"`` after a write that shared extents
        (reflink), else ``""`` (nothing changes on other filesystems)."""
        if not self.bytes_shared:
            return ""
        copied = human_bytes(self.bytes_written - self.bytes_shared)
        return f", {human_bytes(self.bytes_shared)} shared with the inputs, {copied} copied"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report); each command's report adds its plan."""
        return {"dry_run": self.dry_run, **self.write_fields()}

    def write_fields(self) -> dict[str, Any]:
        """The shared part of the ``--json`` report."""
        return {
            "bytes_written": self.bytes_written,
            "seconds": round(self.seconds, 3),
            "bytes_shared": self.bytes_shared,
            "bytes_copied": self.bytes_written - self.bytes_shared,
            "copy_methods": list(self.copy_methods),
            "replaced": [str(p) for p in self.replaced],
            "notes": list(self.notes),
        }


ReportT = TypeVar("ReportT", bound=WriteReport)


def run_write(
    prepare: Callable[[], tuple[ReportT, Sequence[OutputFile], Sequence[Path]]],
    *,
    desc: str,
    force: bool,
    progress: bool,
    on_plan: Callable[[WriteReport], None] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    after_write: Callable[[ReportT], None] | None = None,
) -> ReportT:
    """Run a writing job, the same way for every command: check the output folder, open the inputs and
    plan, check and write the files (a dry run only checks), then verify; time all of it.

    Args:
        prepare: opens the inputs and plans (nothing written): returns the job's report (which knows
            whether this is a dry run), the files to write and the inputs they must never overwrite.
        desc: the progress bar's label (the command's name).
        force: replace existing outputs (never inputs).
        progress: show a progress bar on stderr when it is a terminal.
        on_plan: called with the report once the outputs passed their checks, before the first byte is
            written (the CLI prints :meth:`WriteReport.plan_lines` there).
        output_dir: the folder the outputs go into, refused first if it is not one
            (:func:`check_output_folder`); ``None`` when the job names an output file.
        after_write: called with the report once the files are in place (not in a dry run): verification.

    Returns:
        The report of ``prepare``, with the figures of the write and ``seconds`` covering the whole run.

    Raises:
        GGUFMTPError: whatever ``prepare`` or ``after_write`` raise (bad input), ``UnsafeOutputError`` or
            ``OutputWriteError`` (see :func:`write_outputs`).
    """
    started = time.perf_counter()
    if output_dir is not None:
        check_output_folder(output_dir)
    report, files, inputs = prepare()
    report.write(files, inputs=inputs, force=force, progress=progress, desc=desc, on_plan=on_plan)
    if after_write is not None and report.written:
        after_write(report)
    report.seconds = time.perf_counter() - started
    return report
