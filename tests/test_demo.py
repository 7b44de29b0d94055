"""demo: the whole flow on the embedded tiny model, offline, with readable output and a loadable composite."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import shard_files

from gguf_mtp.demo import run_demo
from gguf_mtp.llama_check import check_with_llama


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
                     "7. publish --dry-run"]
    assert lines[-1].startswith("composite: ")


def test_demo_lines_state_what_happened(demo_run: tuple[Path, list[str], bool]) -> None:
    _, lines, _ = demo_run
    text = "\n".join(lines)
    assert "3. convert: 18 head tensors -> NextN block blk.3" in text
    assert "4. compose: 26 target tensors copied byte for byte + 18 as blk.3; block_count 3->4" in text
    assert "split.tensors.count 26->44" in text
    assert "6. inspect: MTP: yes (1 block, blk.3); 4 blocks, 44 tensors" in text
    assert "llama.cpp check skipped" in text


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


@pytest.mark.llama
def test_demo_command_composite_loads_and_runs_in_llama_cpp(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gguf_mtp", "demo", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "5. verify:" in proc.stdout and "MTP decode ok" in proc.stdout
    composite = Path(proc.stdout.strip().splitlines()[-1].removeprefix("composite: "))
    assert composite.is_file()
    check = check_with_llama(composite)
    assert check.ok and check.n_layer_nextn == 1
