"""``gguf-mtp bench --plot FILE.png``: tokens/s and acceptance against n-max (matplotlib, the ``bench`` extra).

The PNG is written under a temporary name created exclusively next to it (:mod:`gguf_mtp.files.create`),
then linked into place (never over an existing file) or, with ``force``, renamed over it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gguf_mtp.constants import install_hint
from gguf_mtp.errors import OutputWriteError, ParameterError, UnsafeOutputError
from gguf_mtp.files.create import create_exclusive, temporary_name
from gguf_mtp.text import printable

from .bench_rules import BenchReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["INSTALL_HINT", "check_plot_target", "plot_title", "write_plot"]

INSTALL_HINT = install_hint("bench", "matplotlib")


def check_plot_target(path: str | os.PathLike[str], *, force: bool) -> None:
    """Refuse before measuring: matplotlib missing, or ``path`` exists (without ``force``) or is not a file.

    Raises:
        ParameterError: matplotlib is not installed.
        UnsafeOutputError: the file exists and ``force`` is off, or it is not a regular file, or no folder.
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise ParameterError(f"plot needs matplotlib: {INSTALL_HINT}", os.fspath(path), "plot")
    target = Path(path)
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise UnsafeOutputError("plot: not a regular file (a link, a folder or a device)", target, "plot")
    if target.exists() and not force:
        raise UnsafeOutputError("plot: file exists (use force to replace it)", target, "force")
    if not target.parent.is_dir():
        raise UnsafeOutputError("plot: no such folder", target.parent, "plot")


def plot_title(report: BenchReport) -> str:
    """The plot's title: the model measured (its file name, and the sidecar's), never the PNG's name."""
    name = Path(report.model).name + (f" + {Path(report.draft).name}" if report.draft else "")
    return _cut(f"gguf-mtp bench: {printable(name)}", 90)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_plot(report: BenchReport, path: str | os.PathLike[str], *, force: bool) -> None:
    """Draw tokens/s (left axis) and acceptance (right axis) against n-max (0: without MTP).

    Raises:
        UnsafeOutputError: the file appeared meanwhile and ``force`` is off.
        OutputWriteError: the file could not be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = _figure(report)
    try:
        _save_png(fig, Path(path), force=force)
    finally:
        plt.close(fig)


def _figure(report: BenchReport) -> Figure:
    """The plot of ``report``: tokens/s and acceptance by n-max, titled."""
    import matplotlib.pyplot as plt

    runs = sorted(report.runs, key=lambda r: r.n_max)
    fig, speed_axis = plt.subplots(figsize=(6, 4), dpi=100)
    speed_axis.plot([r.n_max for r in runs], [r.predicted_per_second for r in runs], "o-", color="tab:blue")
    speed_axis.set_xlabel("n-max (0 = without MTP)")
    speed_axis.set_ylabel("tokens/s", color="tab:blue")
    speed_axis.set_xticks([r.n_max for r in runs])
    mtp = [r for r in runs if r.acceptance is not None]
    acceptance_axis = speed_axis.twinx()
    acceptance_axis.plot([r.n_max for r in mtp], [r.acceptance or 0.0 for r in mtp], "s--", color="tab:orange")
    acceptance_axis.set_ylabel("acceptance", color="tab:orange")
    acceptance_axis.set_ylim(0, 1.05)
    speed_axis.set_title(plot_title(report))
    fig.tight_layout()
    return fig


def _save_png(fig: Figure, target: Path, *, force: bool) -> None:
    """Write ``fig`` as a PNG at ``target``: through a temporary name created exclusively, then linked (or, with
    ``force``, renamed) into place.

    Raises:
        UnsafeOutputError: the file appeared meanwhile and ``force`` is off.
        OutputWriteError: the file could not be written.
    """
    partial = temporary_name(target)
    try:
        fd = create_exclusive(partial)  # never through a link planted at that name
        try:
            with os.fdopen(fd, "wb") as f:
                fig.savefig(f, format="png")
            if force:
                os.replace(partial, target)
            else:
                os.link(partial, target)  # fails if the file appeared meanwhile: never replaced
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
    except FileExistsError:
        raise UnsafeOutputError("plot: file exists (use force to replace it)", target, "force") from None
    except UnsafeOutputError:  # the temporary name is taken (create_exclusive): already one line
        raise
    except OSError as e:
        raise OutputWriteError(f"plot: cannot write: {e.strerror}", target, "plot") from None
