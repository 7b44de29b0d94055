"""demo: the whole flow on the embedded tiny model, offline, with readable output and a loadable composite."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.helpers import shard_files

from gguf_mtp.check.accept import accept
from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.demo import run_demo
from gguf_mtp.format.header import read_header


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], bool]:
    """The demo without llama.cpp (its own test below runs it with llama.cpp, as a newcomer would)."""
    work = tmp_path_factory.mktemp("demo")
    lines: list[str] = []
    ok = run_demo(work, llama=False, say=lines.append)
    return work, lines, ok


def test_demo_reports_each_step_of_the_flow_in_order(demo_run: tuple[Path, list[str], bool]) -> None:
    _, lines, ok = demo_run
    assert ok
    steps = [line.split(":", 1)[0] for line in lines if re.match(r"^\d\. ", line)]
    assert steps == ["1. target", "2. head", "3. convert", "4. compose", "5. verify", "6. inspect",
                     "7. publish --dry-run", "8. accept"]
    assert lines[-1].startswith("composite: ")


def test_demo_lines_state_what_happened(demo_run: tuple[Path, list[str], bool]) -> None:
    _, lines, _ = demo_run
    text = "\n".join(lines)
    assert "3. convert: 18 head tensors -> NextN block blk.3" in text
    assert "4. compose: 26 target tensors copied byte for byte + 18 as blk.3; block_count 3->4" in text
    assert "split.tensors.count 26->44" in text
    assert "6. inspect: MTP: yes (1 block, blk.3); 4 blocks, 44 tensors" in text
    assert "llama.cpp check skipped" in text
    assert "accept skipped" in text


def test_demo_converts_from_a_safetensors_head_checkpoint(demo_run: tuple[Path, list[str], bool]) -> None:
    work, _, _ = demo_run
    head = work / "head-checkpoint"
    assert (head / "config.json").is_file() and (head / "model.safetensors.index.json").is_file()
    assert len(list(head.glob("*.safetensors"))) == 2


def test_demo_card_lists_the_composite_files_with_their_hashes(demo_run: tuple[Path, list[str], bool]) -> None:
    work, lines, _ = demo_run
    composite = Path(lines[-1].removeprefix("composite: "))
    card = (work / "README.md").read_text()
    for shard in shard_files(composite):
        assert f"`{hashlib.sha256(shard.read_bytes()).hexdigest()}`" in card


def test_demo_rerun_in_the_same_folder_replaces_its_files(demo_run: tuple[Path, list[str], bool]) -> None:
    work, _, _ = demo_run
    lines: list[str] = []
    assert run_demo(work, llama=False, say=lines.append)


def test_demo_writes_a_model_with_a_tokenizer_and_a_head_for_accept(demo_run: tuple[Path, list[str], bool]) -> None:
    work, lines, _ = demo_run
    header = read_header(work / "cycle.gguf")
    assert header.get("tokenizer.ggml.model") == "test"  # accept, bench and verify --acceptance tokenize prompts
    assert header.get("glm4moe.nextn_predict_layers") == 1
    step = next(line for line in lines if line.startswith("8. accept: "))
    assert "its head designed to draft right after 70 % of tokens" in step
    assert step.endswith(f": {work / 'cycle.gguf'}")


@pytest.fixture(scope="module")
def demo_command(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """``gguf-mtp demo --dir DIR`` with llama.cpp, as a newcomer runs it: its folder and its lines."""
    work = tmp_path_factory.mktemp("demo-command")
    proc = subprocess.run([sys.executable, "-m", "gguf_mtp", "demo", "--dir", str(work)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    return work, proc.stdout.strip().splitlines()


@pytest.mark.slow
@pytest.mark.llama
def test_demo_command_composite_loads_and_runs_in_llama_cpp(demo_command: tuple[Path, list[str]]) -> None:
    _, lines = demo_command
    assert any(line.startswith("5. verify:") and "MTP decode ok" in line for line in lines)
    composite = Path(lines[-1].removeprefix("composite: "))
    assert composite.is_file()
    check = check_with_llama(composite)
    assert check.ok and check.n_layer_nextn == 1


@pytest.mark.slow
@pytest.mark.llama
def test_demo_command_predicts_the_designed_heads_acceptance(demo_command: tuple[Path, list[str]]) -> None:
    work, lines = demo_command
    step = lines.index(next(line for line in lines if line.startswith("8. accept: ")))
    (run,) = accept(work / "cycle.gguf", tokens=64, n_max=(1,)).runs
    assert run.draft_n and 0.6 <= run.draft_n_accepted / run.draft_n <= 0.8  # the design's 70 %
    assert lines[step + 1] == (
        f"   predicted llama-server acceptance at n-max 1: {run.draft_n_accepted} of {run.draft_n} drafted tokens "
        f"({run.draft_n_accepted / run.draft_n:.2f}); every n-max: gguf-mtp accept cycle.gguf --tokens 64"
    )


# ------------------------------------------------------------------------------ whose folder it is


def demo_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GGUF_MTP_DISABLE_PROGRESS": "1"}
    return subprocess.run([sys.executable, "-m", "gguf_mtp", "demo", "--no-llama", *argv],
                          capture_output=True, text=True, timeout=300, env=env)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def users_folder(tmp_path: Path) -> Path:
    """A user's folder holding files of the demo's names."""
    folder = tmp_path / "mine"
    (folder / "composite").mkdir(parents=True)
    (folder / "README.md").write_text("my project's README\n")
    (folder / "mtp-draft.gguf").write_bytes(b"my draft")
    (folder / "composite" / "notes.txt").write_text("my notes\n")
    return folder


def test_demo_refuses_a_folder_it_did_not_make_with_one_line(tmp_path: Path) -> None:
    folder = users_folder(tmp_path)
    before = folder_bytes(folder)
    proc = demo_cli("--dir", str(folder))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert str(folder) in proc.stderr and "not empty and was not made by gguf-mtp demo" in proc.stderr
    assert folder_bytes(folder) == before


def test_demo_dir_naming_a_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("mine\n")
    proc = demo_cli("--dir", str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "--dir names a file, not a folder" in proc.stderr
    assert path.read_text() == "mine\n"


def test_demo_force_uses_a_users_folder(tmp_path: Path) -> None:
    folder = users_folder(tmp_path)
    lines: list[str] = []
    assert run_demo(folder, llama=False, say=lines.append, force=True)
    assert (folder / "composite" / "notes.txt").read_text() == "my notes\n"  # not one of the demo's names
    assert (folder / "README.md").read_text() != "my project's README\n"  # --force: replaced
    assert json.loads((folder / ".gguf-mtp-workdir").read_text()) == {"format": 1, "created_by": "demo"}


def test_demo_dir_new_or_empty_gets_the_marker_and_reruns(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        assert run_demo(folder, llama=False, say=lambda line: None)
        assert json.loads((folder / ".gguf-mtp-workdir").read_text()) == {"format": 1, "created_by": "demo"}
        assert run_demo(folder, llama=False, say=lambda line: None)  # its own folder: no --force needed


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_demo_without_dir_removes_its_temporary_folder(temp_root: Path) -> None:
    lines: list[str] = []
    assert run_demo(llama=False, say=lines.append)
    assert os.listdir(temp_root) == []
    assert lines[-1].startswith("removed the demo's temporary folder ") and "--keep" in lines[-1]


def test_demo_keep_keeps_the_temporary_folder_and_says_where(temp_root: Path) -> None:
    lines: list[str] = []
    assert run_demo(llama=False, say=lines.append, keep=True)
    (kept,) = temp_root.iterdir()
    assert lines[-1] == f"kept the demo's files in {kept}"
    assert Path(lines[-2].removeprefix("composite: ")).is_file()
    assert (kept / "README.md").is_file()


def test_demo_that_fails_removes_its_temporary_folder(temp_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf_mtp.demo as demo_module

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(demo_module, "compose", broken)
    with pytest.raises(RuntimeError, match="boom"):
        run_demo(llama=False, say=lambda line: None)
    assert os.listdir(temp_root) == []


@pytest.mark.slow
def test_demo_json_is_one_parseable_report_of_every_step(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "demo", "--dir", str(work), "--no-llama", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # the whole of stdout is the report: no progress lines around it
    assert report["command"] == "demo" and report["ok"] is True
    numbered = [line.split(".", 1)[0] for line in report["steps"] if line[:1].isdigit()]
    assert numbered == ["1", "2", "3", "4", "5", "6", "7", "8"]
    composite = Path(report["steps"][-1].removeprefix("composite: "))
    assert composite.is_file() and composite.parent == work / "composite"
