"""Work folders of ``demo --dir`` and ``pipeline --work-dir``: replace only what gguf-mtp made.

Both commands write (and on a re-run replace or delete) files and sub-folders of fixed names in their
work folder. They do so only in a folder they can prove they made: when a command creates the folder
(or finds it empty) it writes the marker :data:`MARKER_NAME` (``.gguf-mtp-workdir``, a small JSON
object naming the command); a later run of the same command finds it and goes on. A folder that is not
empty and has no marker (or a marker of the other command) is refused with one line, unless ``force``
says the user wants its files of those names replaced; a path that is a file is always refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf_mtp.errors import GGUFMTPError, UnsafeOutputError

from .json_io import load_json_file, write_json_file

__all__ = ["MARKER_NAME", "claim_work_dir", "marker_kind"]

MARKER_NAME = ".gguf-mtp-workdir"
MARKER_FORMAT = 1
_MAX_MARKER_BYTES = 4096


def marker_kind(folder: Path) -> str | None:
    """The command named by ``folder``'s marker, or ``None`` (no marker, or not one gguf-mtp writes)."""
    path = folder / MARKER_NAME
    if not os.path.lexists(path):
        return None
    try:
        doc = load_json_file(path, max_bytes=_MAX_MARKER_BYTES, follow_links=False)
    except GGUFMTPError:  # a link, a folder, a pipe, too big, not JSON: not a marker gguf-mtp wrote
        return None
    if not isinstance(doc, dict) or doc.get("format") != MARKER_FORMAT:
        return None
    kind = doc.get("created_by")
    return kind if isinstance(kind, str) else None


def _write_marker(folder: Path, kind: str) -> None:
    write_json_file(folder / MARKER_NAME, {"format": MARKER_FORMAT, "created_by": kind})


def claim_work_dir(
    folder: Path,
    kind: str,
    *,
    force: bool = False,
    parameter: str = "work_dir",
    also_ours: tuple[str, ...] = (),
    dry_run: bool = False,
) -> bool:
    """Make sure ``folder`` is a work folder of the command ``kind`` (``"demo"``, ``"pipeline"``).

    Args:
        folder: the work folder; created (with its parents) if missing.
        kind: the command that uses it.
        force: take a non-empty folder without the marker anyway (its files of the command's names are
            replaced).
        parameter: the caller's parameter naming the folder, for the message.
        also_ours: names whose presence proves an older run of the same command made the folder (the
            pipeline's state file, written before markers existed).
        dry_run: check only: create nothing and write no marker.

    Returns:
        Whether the folder was created by this call (with ``dry_run``: whether a real run would create it).

    Raises:
        UnsafeOutputError: one line: the path is a file, or a non-empty folder gguf-mtp did not make.
    """
    try:
        if os.path.lexists(folder) and not folder.is_dir():
            raise UnsafeOutputError(f"{parameter} names a file, not a folder", folder, parameter)
        created = not folder.exists()
        if created and dry_run:
            return True
        folder.mkdir(parents=True, exist_ok=True)
        found = marker_kind(folder)
        if found == kind:
            return created
        names = [n for n in os.listdir(folder) if n != MARKER_NAME]
        if names and not force and not any(n in names for n in also_ours):
            made_by = f"made by gguf-mtp {found}" if found else "not made by gguf-mtp " + kind
            raise UnsafeOutputError(
                f"{parameter}: this folder is not empty and was {made_by}; choose an empty or new folder "
                f"(or use force to let {kind} replace its files there)",
                folder,
                (parameter, "force"),
            )
        if not dry_run:
            _write_marker(folder, kind)
        return created
    except UnsafeOutputError:  # an OSError too: already one line
        raise
    except OSError as e:
        raise UnsafeOutputError(f"cannot use this {parameter} folder: {e.strerror or e}", folder, parameter) from None
