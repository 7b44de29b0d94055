"""The head's scratch folder (``.gguf-mtp-head.PID.*``): removed by the next run only when its run is proved dead
(its pid gone and its lock free), never a live run's, never through a link (issue 37 item 7)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from gguf_mtp.files.commit import remove_leftovers
from gguf_mtp.files.scratch import SCRATCH_PREFIX, scratch_folder


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def _planted(folder: Path, pid: int, nbytes: int = 10_000) -> Path:
    scratch = folder / f"{SCRATCH_PREFIX}{pid}.k3x9q2ab"
    scratch.mkdir()
    (scratch / "model-00002-of-00002.safetensors").write_bytes(b"\1" * nbytes)
    return scratch


def test_a_dead_runs_scratch_is_removed_and_reported(tmp_path: Path) -> None:
    pid = _dead_pid()
    scratch = _planted(tmp_path, pid)
    note = remove_leftovers(tmp_path)
    assert not scratch.exists()
    assert note is not None and f"(pid {pid})" in note and "removed 1 temporary file(s)" in note


def test_a_live_runs_scratch_is_left_alone(tmp_path: Path) -> None:
    with scratch_folder(tmp_path) as live:
        (live / "config.json").write_text("{}")
        assert remove_leftovers(tmp_path) is None
        assert (live / "config.json").read_text() == "{}"
    assert not live.exists()  # its own run removes it at the end


def test_a_scratch_whose_lock_is_held_is_left_alone_though_its_pid_is_gone(tmp_path: Path) -> None:
    scratch = _planted(tmp_path, _dead_pid())  # a pid reused, or one of another pid namespace
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_leftovers(tmp_path) is None
        assert (scratch / "model-00002-of-00002.safetensors").stat().st_size == 10_000
    finally:
        os.close(fd)


def test_a_link_named_like_a_scratch_is_left_alone_and_so_is_what_it_points_to(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"mine")
    link = tmp_path / "out" / f"{SCRATCH_PREFIX}{_dead_pid()}.k3x9q2ab"
    link.parent.mkdir()
    link.symlink_to(elsewhere, target_is_directory=True)
    assert remove_leftovers(link.parent) is None
    assert link.is_symlink() and (elsewhere / "keep").read_bytes() == b"mine"


def test_a_scratch_name_with_a_pid_that_is_not_one_is_not_ours(tmp_path: Path) -> None:
    folder = tmp_path / f"{SCRATCH_PREFIX}0.k3x9q2ab"
    folder.mkdir()
    assert remove_leftovers(tmp_path) is None and folder.is_dir()
