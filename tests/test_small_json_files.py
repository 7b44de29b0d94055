"""gguf-mtp's own small JSON files -- the commit journal, the work-folder marker, the pipeline's state -- are
written by one helper with one durability and read back by one bounded reader (issue 24 item 4).

Each is written to a new temporary file (created exclusively), fsynced, renamed to its name, and its
folder fsynced, in that order; the journal's rename never replaces a file. Each is read back bounded in
size and depth; the journal and the marker never through a link.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

import gguf_mtp.files.commit as commit_module
from gguf_mtp.errors import GGUFMTPError, UnsafeOutputError
from gguf_mtp.files.commit import JOURNAL_NAME, FileIdentity, Replacement, read_journal
from gguf_mtp.files.json_io import load_json_file, write_json_file
from gguf_mtp.files.workdir import MARKER_NAME, claim_work_dir, marker_kind
from gguf_mtp.release.pipeline import STATE_FORMAT, STATE_NAME
from gguf_mtp.release.pipeline.state import StateFile


def _journal(folder: Path) -> Path:
    (folder / ".one.1.partial").write_bytes(b"new one")
    new = FileIdentity.of(folder / ".one.1.partial")
    assert new is not None
    commit_module._write_journal(folder, [Replacement(".one.1.partial", "one", new)])
    return folder / JOURNAL_NAME


def _marker(folder: Path) -> Path:
    claim_work_dir(folder, "demo")
    return folder / MARKER_NAME


def _state(folder: Path) -> Path:
    state = StateFile(folder)
    state.stages["verify"] = {"key": "k", "finished": "now", "outputs": [], "detail": {"summary": "ok"}}
    state._save()
    return folder / STATE_NAME


WRITERS: dict[str, Callable[[Path], Path]] = {"journal": _journal, "marker": _marker, "state": _state}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_each_file_is_fsynced_renamed_and_its_folder_fsynced(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        final = [n for n in os.listdir(folder) if n in (JOURNAL_NAME, MARKER_NAME, STATE_NAME)]
        events.append(f"{kind} fsynced, {'named' if final else 'not named yet'}")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = WRITERS[writer](folder)
    assert events == ["file fsynced, not named yet", "folder fsynced, named"]
    assert sorted(n for n in os.listdir(folder) if n.endswith(".partial") and "one" not in n) == []  # no temporary
    assert load_json_file(path, max_bytes=1 << 20, follow_links=False)["format"] in (1, 2, STATE_FORMAT)


def test_the_journal_never_replaces_a_file_and_the_others_do(tmp_path: Path) -> None:
    taken = tmp_path / "taken.json"
    taken.write_bytes(b"someone's file")
    with pytest.raises(FileExistsError):
        write_json_file(taken, {"format": 2}, rename=commit_module.rename_noreplace)
    assert taken.read_bytes() == b"someone's file" and os.listdir(tmp_path) == ["taken.json"]
    write_json_file(taken, {"format": 2})
    assert json.loads(taken.read_bytes()) == {"format": 2} and os.listdir(tmp_path) == ["taken.json"]


@pytest.mark.parametrize("writer", ["journal", "marker"])
def test_the_journal_and_the_marker_are_never_read_through_a_link(writer: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = WRITERS[writer](elsewhere)
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / real.name).symlink_to(real)
    if writer == "journal":
        with pytest.raises(UnsafeOutputError, match=r"journal cannot be used \(is a symbolic link"):
            read_journal(folder / real.name)
    else:
        assert marker_kind(elsewhere) == "demo" and marker_kind(folder) is None


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_each_file_is_read_back_bounded(writer: str, tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    path = WRITERS[writer](folder)
    path.unlink()
    path.write_bytes(b" " * (16 * 1024 * 1024 + 1) + b"{}")  # past every cap: the state file's is the largest
    if writer == "journal":
        with pytest.raises(UnsafeOutputError, match="more than the 1,048,576 gguf-mtp reads"):
            read_journal(path)
    elif writer == "marker":
        assert marker_kind(folder) is None
    else:
        with pytest.raises(GGUFMTPError, match="more than the 16,777,216 gguf-mtp reads"):
            StateFile(folder)
