"""Hostile inputs through the real command line: every malformed input of :mod:`malformed` gives exit
status 2 and exactly one line on stderr naming the file and the problem, writes nothing, and leaves its
inputs as they were. ``inspect`` and ``verify`` report the same files without a traceback."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from support.helpers import no_hang
from support.malformed import CORPUS, Inputs, Malformed, Sources, build_sources

from gguf_mtp.cli import main
from gguf_mtp.errors import BadGGUFError
from gguf_mtp.format.header import parse_header

#: Files whose bytes are broken: ``inspect`` and ``verify`` must say so too.
INSPECTABLE = [case for case in CORPUS if case.kind == "gguf"]
BY_NAME = {case.name: case for case in CORPUS}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Sources:
    return build_sources(tmp_path_factory.mktemp("corpus-sources"))



def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``gguf-mtp ARGV`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    with no_hang():
        try:
            status = main(argv)
        except SystemExit as e:  # argparse usage errors
            status = int(e.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def input_files(inputs: Inputs, work: Path) -> dict[str, str]:
    """sha256 of every regular file the command reads (named on its command line or under ``work``)."""
    paths = {Path(arg) for arg in inputs.argv[1:] if os.path.isfile(arg)}
    if work.exists():
        paths |= {p for p in work.rglob("*") if p.is_file()}
    for arg in inputs.argv[1:]:
        if os.path.isdir(arg):
            paths |= {p for p in Path(arg).rglob("*") if p.is_file()}
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)}


def assert_one_line_error(status: int, err: str, case: Malformed, inputs: Inputs) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert status == 2, f"exit {status}, stderr: {err!r}"
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    line = lines[0]
    assert line.startswith("gguf-mtp: error: ")
    assert inputs.blamed.name in line, f"{line!r} does not name {inputs.blamed.name}"
    assert case.expect in line, f"{line!r} does not say {case.expect!r}"
    return line


def assert_nothing_written(out: Path) -> None:
    assert not out.exists() or sorted(os.listdir(out)) == [], f"left in {out}: {os.listdir(out)}"


def test_corpus_holds_at_least_30_distinct_inputs_with_a_description_each() -> None:
    assert len(CORPUS) >= 30
    assert len({case.name for case in CORPUS}) == len(CORPUS)
    assert len({case.broken for case in CORPUS}) == len(CORPUS)
    assert {case.kind for case in CORPUS} == {"gguf", "path", "split set", "target", "draft", "checkpoint"}


@pytest.mark.parametrize("case", CORPUS, ids=str)
def test_malformed_input_gives_exit_2_and_one_line_naming_the_file(
    case: Malformed, sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    inputs = case.build(sources, work)
    before = input_files(inputs, work)
    out = tmp_path / "out"

    status, _, err = run_cli(inputs.command(out), capsys)

    assert_one_line_error(status, err, case, inputs)
    assert_nothing_written(out)
    assert input_files(inputs, work) == before


@pytest.mark.parametrize(
    "name",
    ["wrong_magic", "array_of_2_60_items", "split_missing_shard", "draft_other_width", "checkpoint_config_not_json"],
)
def test_malformed_input_in_a_real_process_prints_one_line_and_no_traceback(
    name: str, sources: Sources, tmp_path: Path
) -> None:
    case = BY_NAME[name]
    inputs = case.build(sources, tmp_path / "work")
    out = tmp_path / "out"
    env = {**os.environ, "GGUF_MTP_DISABLE_PROGRESS": "1"}

    result = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", *inputs.command(out)], capture_output=True, text=True, env=env, timeout=120
    )

    assert_one_line_error(result.returncode, result.stderr, case, inputs)
    assert result.stdout == ""
    assert_nothing_written(out)


@pytest.mark.parametrize("case", INSPECTABLE, ids=str)
def test_inspect_reports_the_malformed_file_without_a_traceback(
    case: Malformed, sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = case.build(sources, tmp_path / "work")

    status, out, err = run_cli(["inspect", str(inputs.blamed)], capsys)

    if "problems (" not in out:
        assert_one_line_error(status, err, case, inputs)
    else:
        # inspect describes files it can still read (a truncated data section), lists what is wrong,
        # and still fails (exit 2, one line) so that `inspect x && upload x` stops
        assert status == 2 and err.count("\n") == 1 and "inconsistent" in err, err
        problems = out[out.index("problems (") :]
        assert inputs.blamed.name in problems


@pytest.mark.parametrize("case", INSPECTABLE, ids=str)
def test_verify_fails_the_malformed_file_and_names_it(
    case: Malformed, sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = case.build(sources, tmp_path / "work")

    status, out, err = run_cli(["verify", "--no-llama", str(inputs.blamed)], capsys)

    assert status == 2
    assert "Traceback" not in err
    if err:
        assert_one_line_error(status, err, case, inputs)
    else:
        assert "NOT verified" in out
        failed = [line for line in out.splitlines() if line.lstrip().startswith("FAIL")]
        assert any(inputs.blamed.name in line for line in failed), out


@pytest.mark.parametrize(
    "name", ["kv_count_absurd", "tensor_count_absurd", "array_of_2_60_items", "key_length_past_end", "dimension_absurd"]
)
def test_absurd_counts_are_refused_without_reading_or_allocating_for_them(
    name: str, sources: Sources, tmp_path: Path
) -> None:
    inputs = BY_NAME[name].build(sources, tmp_path)
    data = inputs.blamed.read_bytes()
    requested: list[int] = []

    def read_at(offset: int, size: int) -> bytes:
        requested.append(size)
        return data[offset : offset + size]

    tracemalloc.start()
    try:
        with pytest.raises(BadGGUFError):
            parse_header(read_at, len(data), str(inputs.blamed), min_read=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The file is ~1.2 MB and claims up to 2**64 entries: only its header is read, and memory stays small.
    assert sum(requested) <= 64 * 1024
    assert peak < 1024 * 1024


def test_unreadable_output_name_is_refused_before_writing(
    sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / ("y" * 300)

    status, _, err = run_cli(["compose", str(sources.target), str(sources.draft0), "-o", str(out)], capsys)

    assert status == 2
    assert err.count("\n") == 1
    assert "cannot use this output path: File name too long" in err
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("content", [b"hello, not a model\n", bytes(100), b"GGUF\x03\x00\x00\x00"],
                         ids=["text", "zeros", "header-cut-short"])
def test_verify_of_a_file_that_is_not_a_gguf_says_one_line_as_inspect_does(
    content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 29 item 16: no PASS rows about a header there is none of, and no llama.cpp run on it
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    verified = run_cli(["verify", str(path)], capsys)  # llama.cpp check on by default when installed
    inspected = run_cli(["inspect", str(path)], capsys)
    assert verified == inspected
    status, out, err = verified
    assert status == 2 and out == "" and err.count("\n") == 1 and str(path) in err, verified


def test_verify_of_a_split_set_with_a_shard_that_is_not_a_gguf_names_that_shard(
    nemotron_split: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = [tmp_path / p.name for p in sorted(nemotron_split.parent.glob("*.gguf"))]
    for source, copy in zip(sorted(nemotron_split.parent.glob("*.gguf")), shards):
        copy.write_bytes(source.read_bytes())
    shards[1].write_bytes(b"not a gguf")
    status, out, err = run_cli(["verify", str(shards[0])], capsys)
    assert (status, out) == (2, "")
    assert err == f"gguf-mtp: error: {shards[1]}: not a GGUF file (magic b'not ', expected b'GGUF')\n"
