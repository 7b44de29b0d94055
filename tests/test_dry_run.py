"""A dry run is refused exactly when the real run would be, and every writing command shows its plan first.

Issue 21 items 15 and 16, for each writing command (convert, compose, extract, strip, graft):

- a dry run makes the checks the real run makes before its first byte (they are one function,
  ``gguf_mtp.write._check_before_writing``): an existing output without ``--force``, an output that is
  an input, a file where the output folder must be, a folder another run holds, too little free space,
  a journal that is not one gguf-mtp writes each give the real run's one line and exit status 2; with
  ``--force`` the dry run says what it would replace; nothing is created or changed either way;
- the plan (``target: …``, ``writing …``, the metadata changes) reaches stdout before the writer starts,
  also with ``-q`` and a pipe for stdout; the outcome line comes after; ``--json`` stays one document.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from support.helpers import file_hashes

from gguf_mtp.cli import main
from gguf_mtp.files.commit import JOURNAL_NAME, folder_lock
from gguf_mtp.files.journal import encode_journal
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import write_target

COMMANDS = ("convert", "compose", "extract", "strip", "graft")


class Inputs(NamedTuple):
    head: Path  # an MTPv2 checkpoint (convert)
    target: Path  # a trunk-only 2-shard model (convert --target, compose, graft --into)
    draft: Path  # a draft for target (compose)
    model: Path  # a 2-shard model with a NextN block (extract, strip, graft --from)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    work = tmp_path_factory.mktemp("dry-run-inputs")
    head = write_mtpv2_checkpoint(work / "head", files=2, dtype="bfloat16")
    target = write_target(work / "target", shards=2, name="Model-UD-Q4_K_XL", seed=5)
    model = write_target(work / "model", with_nextn=True, shards=2, quant="Q8_0", name="Model-Q8_0")
    draft = work / "draft.gguf"
    assert main(["convert", str(head), "-o", str(draft), "--target", str(target), "-q"]) == 0
    return Inputs(head, target, draft, model)


def argv(command: str, ins: Inputs, out: Path) -> list[str]:
    """The command writing into ``out`` (a folder; convert and extract write ``out/draft.gguf``)."""
    return {
        "convert": ["convert", str(ins.head), "-o", str(out / "draft.gguf"), "--target", str(ins.target)],
        "compose": ["compose", str(ins.target), str(ins.draft), "-o", str(out), "--no-verify"],
        "extract": ["extract", str(ins.model), "-o", str(out / "draft.gguf")],
        "strip": ["strip", str(ins.model), "-o", str(out)],
        "graft": ["graft", "--from", str(ins.model), "--into", str(ins.target), "-o", str(out), "--no-verify"],
    }[command]


class Run(NamedTuple):
    status: int
    out: str
    err: str


def run(capsys: pytest.CaptureFixture[str], args: list[str]) -> Run:
    capsys.readouterr()
    status = main(args)
    captured = capsys.readouterr()
    return Run(status, captured.out, captured.err)


def assert_refused_alike(capsys: pytest.CaptureFixture[str], args: list[str], *phrases: str) -> str:
    """The real run and the dry run of ``args``: both exit 2 with the same one line, print no plan."""
    dry = run(capsys, [*args, "--dry-run"])
    real = run(capsys, args)
    assert (dry.status, real.status) == (2, 2), (dry, real)
    assert dry.err == real.err and dry.err.count("\n") == 1 and dry.err.startswith("gguf-mtp: error: "), (dry, real)
    assert dry.out == real.out == ""
    for phrase in phrases:
        assert phrase in dry.err, dry.err
    return dry.err


@pytest.mark.parametrize("command", COMMANDS)
def test_dry_run_refuses_an_existing_output_like_the_real_run(
    command: str, inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = argv(command, inputs, out)
    assert run(capsys, [*args, "-q"]).status == 0
    before = file_hashes(out)

    line = assert_refused_alike(capsys, args, "output exists (use --force to replace it)")
    assert str(out) in line
    assert file_hashes(out) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_dry_run_with_force_says_what_it_would_replace(
    command: str, inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = argv(command, inputs, out)
    assert run(capsys, [*args, "-q"]).status == 0
    before = file_hashes(out)
    existing = sorted(out / name for name in before)

    dry = run(capsys, [*args, "--force", "--dry-run"])
    assert dry.status == 0 and dry.err == "", dry
    for path in existing:
        if command == "convert":
            assert f"dry run: {path} (" in dry.out and "would be written (replacing the existing file)" in dry.out
        else:
            assert f"would replace {'draft ' if command == 'extract' else ''}{path} (" in dry.out, dry.out
    assert "would write" not in dry.out
    report = json.loads(run(capsys, [*args, "--force", "--dry-run", "--json"]).out)
    assert sorted(Path(p) for p in report["replaced"]) == existing and report["bytes_written"] == 0
    assert file_hashes(out) == before

    # Into an empty folder nothing is replaced: "would write", and an empty "replaced".
    fresh = run(capsys, [*argv(command, inputs, tmp_path / "fresh"), "--force", "--dry-run", "--json"])
    assert json.loads(fresh.out)["replaced"] == [] and not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_dry_run_refuses_a_file_in_place_of_the_output_folder(
    command: str, inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    in_the_way = tmp_path / "out"
    in_the_way.write_bytes(b"a user's file")

    assert_refused_alike(capsys, argv(command, inputs, in_the_way), str(in_the_way))
    assert in_the_way.read_bytes() == b"a user's file" and sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("command", COMMANDS)
def test_dry_run_refuses_a_folder_another_run_is_writing_into(
    command: str, inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with folder_lock(out):
        assert_refused_alike(capsys, argv(command, inputs, out), "another gguf-mtp run is writing into this folder")
    assert os.listdir(out) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_dry_run_refuses_a_disk_without_room(
    command: str, inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=4096))

    assert_refused_alike(capsys, argv(command, inputs, tmp_path / "out"), "not enough free space", "4,096 free")
    assert os.listdir(tmp_path) == []  # the real run removed the folder it had made to lock it


@pytest.mark.parametrize("command", ["compose", "strip", "graft"])
def test_dry_run_refuses_to_write_over_an_input(
    command: str, inputs: Inputs, capsys: pytest.CaptureFixture[str]
) -> None:
    source = inputs.model if command == "strip" else inputs.target  # the outputs keep its names
    before = file_hashes(source.parent)
    args = [*argv(command, inputs, source.parent), "--force"]

    assert_refused_alike(capsys, args, "output would overwrite the input")
    assert file_hashes(source.parent) == before


def test_dry_run_refuses_a_journal_the_real_run_refuses(
    inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / JOURNAL_NAME).write_text("not a journal")

    assert_refused_alike(capsys, argv("compose", inputs, out), "an interrupted run's journal cannot be used")
    assert (out / JOURNAL_NAME).read_text() == "not a journal"


def test_dry_run_reports_an_interrupted_run_and_leaves_its_journal(
    inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    journal = encode_journal(2**22 + 1, []).decode()
    (out / JOURNAL_NAME).write_text(journal)

    dry = run(capsys, [*argv("compose", inputs, out), "--dry-run", "--json"])
    assert dry.status == 0 and sorted(os.listdir(out)) == [JOURNAL_NAME], dry
    assert (out / JOURNAL_NAME).read_text() == journal
    assert any("was killed while renaming its outputs" in n for n in json.loads(dry.out)["notes"]), dry.out
    real = run(capsys, [*argv("compose", inputs, out), "--json"])
    assert real.status == 0 and JOURNAL_NAME not in os.listdir(out)  # the real run settled it


# -------------------------------------------------------------------- the plan before the first byte

#: Runs the CLI with a marker written straight to fd 1 (no buffer) when the writer starts: its progress
#: bar is made before the first temporary file is opened, and the marker names what the folder holds then.
HOOKED_CLI = """
import os, sys
import gguf_mtp.write as write
real_bar = write.progress_bar
def marked(total, desc, **kwargs):
    folder = os.environ["OUTPUT_FOLDER"]
    held = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    os.write(1, f"<<the writer starts: {held}>>\\n".encode())
    return real_bar(total, desc, **kwargs)
write.progress_bar = marked
from gguf_mtp.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_hooked(args: list[str], out: Path) -> tuple[list[str], list[str]]:
    """stdout before and after the writer started (stdout a pipe, stderr apart)."""
    env = {**os.environ, "OUTPUT_FOLDER": str(out), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", HOOKED_CLI, *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    lines = done.stdout.splitlines()
    marker = [i for i, line in enumerate(lines) if line.startswith("<<the writer starts: ")]
    assert marker, lines
    assert lines[marker[0]] == "<<the writer starts: []>>"  # nothing written yet
    return lines[: marker[0]], lines[marker[0] + 1 :]


PLAN_START = {"convert": "source: ", "compose": "target: ", "extract": "source: ", "strip": "source: ",
              "graft": "source: "}


@pytest.mark.parametrize("command", COMMANDS)
def test_the_plan_is_printed_before_the_writer_starts(command: str, inputs: Inputs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    before, after = run_hooked([*argv(command, inputs, out), "-q"], out)

    assert before and before[0].startswith(PLAN_START[command]), before
    written = sorted(out / name for name in os.listdir(out))
    for path in written:
        assert any(line.startswith("writing ") and str(path) in line for line in before), (path, before)
    if command in ("compose", "strip", "graft"):
        assert any(line.startswith("    ") and " -> " in line for line in before), before  # the metadata changes
    # After the writer: the outcome only, never a line of the plan again.
    assert len(after) == 1, after
    assert after[0].startswith(f"done: {out / 'draft.gguf'} (" if command == "convert" else "done: "), after


@pytest.mark.parametrize("command", ["compose", "extract"])
def test_json_stays_one_document_at_the_end(command: str, inputs: Inputs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    before, after = run_hooked([*argv(command, inputs, out), "--json"], out)

    assert before == []
    report = json.loads("\n".join(after))
    assert report["command"] == command and report["dry_run"] is False and report["bytes_written"] > 0


def test_the_report_of_a_library_call_reads_in_the_past_once_written(inputs: Inputs, tmp_path: Path) -> None:
    from gguf_mtp.jobs.compose import compose

    seen: list[list[str]] = []
    report = compose(inputs.target, inputs.draft, tmp_path / "out", progress=False,
                     on_plan=lambda r: seen.append(r.plan_lines()))
    assert len(seen) == 1 and sum(line.startswith("writing ") for line in seen[0]) == 2
    plan_heads = ("    ", "target:", "draft:", "head:", "note:")  # a note (head-type advice) is part of the plan
    assert [line.split(" ")[0] for line in report.describe() if not line.startswith(plan_heads)] \
        == ["wrote", "wrote", "done:"]
    assert report.describe() == [*report.plan_lines(), *report.outcome_lines()]



@pytest.mark.parametrize("command", COMMANDS)
def test_every_writing_command_ends_with_the_same_outcome_line(
    command: str, inputs: Inputs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One wording for all five (issue 24 item 3): OUTPUT is the one file, or how many files in which folder.
    out = tmp_path / "out"
    args = [*argv(command, inputs, out), "-q"]
    one_file = command in ("convert", "extract")
    planned = str(out / "draft.gguf") if one_file else "2 files in " + str(out)
    size = r"\(\d+(?:\.\d)? (?:B|KiB|MiB)\)"

    dry = run(capsys, [*args, "--dry-run"])
    assert dry.status == 0 and not out.exists(), dry
    tail = dry.out.splitlines()[-1]
    assert re.fullmatch(rf"dry run: {re.escape(planned)} {size} would be written; nothing was written", tail), tail

    done = run(capsys, args)
    assert done.status == 0, done
    tail = done.out.splitlines()[-1]
    assert re.fullmatch(rf"done: {re.escape(planned)} {size} in \d+\.\d\d s \(\d+ MiB/s[^)]*\)", tail), tail
    report = json.loads(run(capsys, [*args, "--dry-run", "--json", "--force"]).out)
    assert report["bytes_written"] == 0 and report["bytes_to_write"] == sum(os.path.getsize(p) for p in out.iterdir())

    again = run(capsys, [*args, "--force"])
    replaced = "the existing file" if one_file else "2 existing files"
    assert again.status == 0 and again.out.splitlines()[-1].endswith(f") (replaced {replaced})"), again
    forced_dry = run(capsys, [*args, "--force", "--dry-run"]).out.splitlines()[-1]
    assert forced_dry.endswith(f" would be written (replacing {replaced}); nothing was written"), forced_dry
