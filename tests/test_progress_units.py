"""The progress bar counts bytes in the units the reports use (issue 29 item 19): binary KiB/MiB/GiB, never
tqdm's decimal kB/MB/GB (its speed is decimal even with ``unit_divisor=1024``)."""

from __future__ import annotations

import io
import re

import pytest

import gguf_mtp.files.progress as progress
from gguf_mtp.text import human_bytes

GiB = 2**30


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("done, total", [(3 * GiB, 5 * GiB), (700 * 2**20, 900 * 2**20), (512, 2048)])
def test_the_bar_shows_bytes_and_speed_in_binary_units_like_the_reports(
    done: int, total: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(progress.sys, "stderr", terminal)
    monkeypatch.setattr(progress, "progress_disabled", lambda: False)
    bar = progress.progress_bar(total, "verify")
    bar.update(done)
    line = str(bar)
    bar.close()
    assert f" {human_bytes(done)}/{human_bytes(total)} [" in line, line
    speed = re.search(r", (\S+ \S+)/s\]$", line)
    assert speed is not None and speed[1].split()[1] in ("B", "KiB", "MiB", "GiB", "TiB"), line
    assert not re.search(r"\d(?: ?)[kMGT]B\b", line + terminal.getvalue()), line  # no decimal units anywhere
