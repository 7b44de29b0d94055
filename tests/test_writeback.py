"""Early write-back (issue 41): each output is handed to the disk as it is written, so the fsync that ends
a write finds little left, and the bytes written are unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gguf_mtp.files import writeback as writeback_module
from gguf_mtp.files.plan import Bytes, CopyRange, OutputFile
from gguf_mtp.files.writeback import EarlyWriteback
from gguf_mtp.write import write_outputs

STEP = 64 * 1024


class DiskLog:
    """Records, in order, each write-back start ``("start", name, offset, nbytes)`` and each fsync
    ``("fsync", name)`` of the files the writer opens."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[object, ...]] = []
        real_start, real_fsync = writeback_module.start_writeback, os.fsync

        def start(fd: int, offset: int, nbytes: int) -> None:
            self.events.append(("start", _name(fd), offset, nbytes))
            real_start(fd, offset, nbytes)

        def fsync(fd: int) -> None:
            self.events.append(("fsync", _name(fd)))
            real_fsync(fd)

        monkeypatch.setattr(writeback_module, "start_writeback", start)
        monkeypatch.setattr(os, "fsync", fsync)

    def started(self, name: str) -> list[tuple[int, int]]:
        return [(e[2], e[3]) for e in self.events if e[0] == "start" and e[1] == name]  # type: ignore[misc]


def _name(fd: int) -> str:
    return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))


def _source(tmp_path: Path, nbytes: int) -> tuple[Path, bytes]:
    data = bytes(i * 7 % 251 for i in range(nbytes))
    path = tmp_path / "input.bin"
    path.write_bytes(data)
    return path, data


def test_pieces_cut_a_range_on_multiples_of_the_step_in_the_source() -> None:
    pieces = list(EarlyWriteback(-1, step=8192).pieces(100, 20_000))

    assert pieces == [(100, 8092), (8192, 8192), (16384, 3716)]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to name the files")
def test_a_long_copy_is_handed_to_the_disk_in_steps_while_it_is_copied_and_its_bytes_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writeback_module, "WRITEBACK_STEP", STEP)
    source, data = _source(tmp_path, 5 * STEP)
    disk = DiskLog(monkeypatch)
    out = tmp_path / "out" / "model.gguf"

    write_outputs([OutputFile(out, [Bytes(b"head"), CopyRange(source, 10, 4 * STEP)])], progress=False)

    assert out.read_bytes() == b"head" + data[10 : 10 + 4 * STEP]
    started = disk.started(f".model.gguf.{os.getpid()}.partial")
    assert len(started) >= 4  # during the copy, not once at its end
    assert [offset for offset, _ in started] == [0] + [offset + n for offset, n in started[:-1]]  # contiguous
    assert started[-1][0] + started[-1][1] == 4 + 4 * STEP  # up to the last byte


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to name the files")
def test_every_output_of_a_set_is_handed_to_the_disk_whole_before_its_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, _ = _source(tmp_path, 3 * 4096)
    disk = DiskLog(monkeypatch)
    names = [f"set-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    files = [OutputFile(tmp_path / "out" / name, [CopyRange(source, 0, 4096 * (i + 1))])
             for i, name in enumerate(names)]

    write_outputs(files, progress=False)

    for i, name in enumerate(names):
        partial = f".{name}.{os.getpid()}.partial"
        assert disk.started(partial) == [(0, 4096 * (i + 1))]
        fsyncs = [n for n, e in enumerate(disk.events) if e == ("fsync", partial)]
        assert len(fsyncs) == 1  # once: not the same file twice
        last_start = max(n for n, e in enumerate(disk.events) if e[:2] == ("start", partial))
        assert last_start < fsyncs[0]
