"""``-v`` logs what happens (INFO on stderr): the plan, the copy method, shared and copied bytes per
output, the commit, kernel-copy fallbacks and the llama.cpp command. Without ``-v``, nothing."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_mtp.check import llama_check
from gguf_mtp.files import kernel_copy
from gguf_mtp.files.kernel_copy import CopyTally
from gguf_mtp.files.plan import CopyRange
from gguf_mtp.jobs.compose import plan_compose
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

_WROTE = re.compile(
    r"^INFO: wrote (?P<name>\S+) \((?P<size>[\d,]+) bytes\): (?P<shared>[\d,]+) bytes shared with the inputs "
    r"\(reflink\), (?P<copied>[\d,]+) copied \((?P<how>[^)]*)\), (?P<written>[\d,]+) written$"
)


def _gguf_mtp(*argv: str, method: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GGUF_MTP_DISABLE_PROGRESS="1")
    env.pop(kernel_copy.ENV_COPY_METHOD, None)
    if method is not None:
        env[kernel_copy.ENV_COPY_METHOD] = method
    return subprocess.run([sys.executable, "-m", "gguf_mtp", *argv], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _written(stderr: str) -> dict[str, dict[str, str]]:
    lines = [m.groupdict() for m in map(_WROTE.match, stderr.splitlines()) if m]
    return {line["name"]: line for line in lines}


def _planned_copies(target: Path, draft: Path, out: Path) -> dict[str, tuple[int, int]]:
    """Output name -> (size, bytes planned as copies of input ranges)."""
    plan = plan_compose(target, draft, out)
    return {
        f.path.name: (f.output.size, sum(s.nbytes for s in f.output.segments if isinstance(s, CopyRange)))
        for f in plan.files
    }


@pytest.mark.slow
def test_verbose_compose_logs_method_bytes_and_commit(nemotron_split: Path, nemotron_draft0: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    planned = _planned_copies(nemotron_split, nemotron_draft0, out)
    done = _gguf_mtp("-v", "compose", str(nemotron_split), str(nemotron_draft0), "-o", str(out),
                     method="readwrite")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert f"INFO: writing {len(planned)} file(s)" in done.stderr
    assert any(line.startswith("INFO: writing ") and line.endswith(
        "; copy method: readwrite (forced by GGUF_MTP_COPY_METHOD)") for line in lines)
    wrote = _written(done.stderr)
    assert set(wrote) == set(planned)
    for name, (size, copies) in planned.items():
        line = wrote[name]
        assert _number(line["size"]) == size == (out / name).stat().st_size
        # Forced read/write never shares: every planned copy is copied, the rest (headers, padding) written.
        assert (_number(line["shared"]), _number(line["copied"]), line["how"]) == (0, copies, "readwrite")
        assert _number(line["written"]) == size - copies
    commits = [line for line in lines if line.startswith("INFO: committed ")]
    assert len(commits) == 1 and commits[0].startswith(f"INFO: committed {len(planned)} file(s) in {out}: ")
    assert set(commits[0].rsplit(": ", 1)[1].split(", ")) == set(planned)


def test_verbose_compose_with_auto_accounts_for_every_copied_byte(nemotron_split: Path, nemotron_draft0: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    planned = _planned_copies(nemotron_split, nemotron_draft0, out)
    done = _gguf_mtp("-v", "compose", str(nemotron_split), str(nemotron_draft0), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "; copy method: auto (reflink where possible, else copy_file_range, sendfile, read/write)" in done.stderr
    wrote = _written(done.stderr)
    assert set(wrote) == set(planned)
    for name, (size, copies) in planned.items():
        line = wrote[name]
        # Shared (reflink) or copied, whatever the filesystem: together they are the planned copies.
        assert _number(line["shared"]) + _number(line["copied"]) == copies
        assert _number(line["written"]) == size - copies


@pytest.mark.slow
def test_without_verbose_nothing_is_logged(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    done = _gguf_mtp("compose", str(nemotron_split), str(nemotron_draft0), "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_verbose_convert_logs_the_plan(nemotron_split: Path, tmp_path: Path) -> None:
    head = write_mtpv2_checkpoint(tmp_path / "head", dtype="bfloat16")
    out = tmp_path / "draft.gguf"
    done = _gguf_mtp("-v", "convert", str(head), "-o", str(out), "--target", str(nemotron_split), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    summary = [line for line in done.stderr.splitlines() if line.startswith("INFO: convert plan: ") and " -> " in line]
    assert summary == [
        f"INFO: convert plan: {report['source']} -> {out}, draft nemotron_h_moe NextN block blk.{report['block']}, "
        f"{len(report['tensors'])} tensors, {len(report['kvs'])} KVs, header "
        f"{_header_size(out):,} bytes, {out.stat().st_size:,} bytes in all, "
        "matrices: source"
    ]
    for tensor in report["tensors"]:
        assert (f"INFO: convert plan: {tensor['name']} {tensor['type']} {tensor['shape']} at data offset "
                f"{tensor['offset']:,} ({tensor['bytes']:,} bytes): {tensor['how']}") in done.stderr
    assert "INFO: wrote draft.gguf (" in done.stderr and f"INFO: committed 1 file(s) in {tmp_path}: draft.gguf" \
        in done.stderr


def _header_size(path: Path) -> int:
    from gguf_mtp.format.header import read_header

    return read_header(path).data_offset


# ------------------------------------------------------------------------------------------ in-process


def test_a_kernel_copy_fallback_is_logged_once_per_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(bytes(range(256)) * 64)

    def no_copy_file_range(*args: object) -> int:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "copy_file_range", no_copy_file_range)
    caplog.set_level(logging.DEBUG, logger="gguf_mtp.files.kernel_copy")
    tally = CopyTally(type("Bar", (), {"update": lambda self, n: None})())
    src = os.open(source, os.O_RDONLY)
    dst = os.open(tmp_path / "out.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        methods = [kernel_copy.copy_range(src, dst, offset, 100, tally, "auto") for offset in (1, 2001)]
    finally:
        os.close(src)
        os.close(dst)
    assert methods == ["sendfile", "sendfile"]
    assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()[1:101] + source.read_bytes()[2001:2101]
    records = [(r.levelno, r.getMessage()) for r in caplog.records if "copy_file_range" in r.getMessage()]
    message = f"copy_file_range is not possible here (EXDEV: {os.strerror(errno.EXDEV)}): trying sendfile"
    assert records == [(logging.INFO, message), (logging.DEBUG, message)]


def test_the_llama_cpp_command_is_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    child = [sys.executable, "-c", "print('{\"loaded\": true, \"n_layer\": 4, \"n_layer_nextn\": 1}')"]
    monkeypatch.setattr(llama_check, "llama_cpp_available", lambda: True)
    monkeypatch.setattr(llama_check, "_child_command", lambda path, mtp, trunk: [*child, path])
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    caplog.set_level(logging.INFO, logger="gguf_mtp.check.llama_check")
    result = llama_check.check_with_llama(tmp_path / "m.gguf")
    assert result.loaded and result.n_layer_nextn == 1
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == f"llama.cpp check: OMP_NUM_THREADS=3 {shlex.join([*child, str(tmp_path / 'm.gguf')])}"
    assert re.fullmatch(r"llama\.cpp check: exit status 0 after \d+\.\d s", messages[1])
    assert messages[2] == f"llama.cpp check of {tmp_path / 'm.gguf'}: {result.summary()}"
