"""Architectures llama.cpp knows whose MTP head gguf-mtp does not make: ``convert`` names the reason in one line
(exit 2, nothing written), from the one table :data:`gguf_mtp.model.arch_rules.HEADS_REFUSED`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_mtp.errors import CheckpointError
from gguf_mtp.jobs.convert import convert
from gguf_mtp.model.arch_rules import HEADS_REFUSED, refusal_for_hf, splice_refusal

#: HF architecture -> (GGUF architecture, words its one line must say).
CASES = {
    "Cohere2MoeForCausalLM": ("cohere2moe", "no official MTP weights"),
    "Glm5NextForConditionalGeneration": ("glm5-next", "not implemented yet"),
    "DeepseekV4ForCausalLM": ("deepseek4", "its own hyper-connection head"),
}


def _checkpoint(folder: Path, hf_arch: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [hf_arch], "num_nextn_predict_layers": 1}))
    return folder


def test_the_table_covers_the_three_architectures() -> None:
    assert set(HEADS_REFUSED) == {"cohere2moe", "glm5-next", "deepseek4"}
    for hf_arch, (arch, _) in CASES.items():
        refused = refusal_for_hf(hf_arch)
        assert refused is not None and refused[0] == arch
    assert refusal_for_hf("Glm4MoeForCausalLM") is None
    assert refusal_for_hf("Qwen4ExpForCausalLM") is None  # b11434 has its MTP graph: test_family_qwen4exp
    # only DeepSeek-V4's head cannot sit in a trunk: compose/graft refuse it (test_arch_rules), not the others
    assert [arch for arch in HEADS_REFUSED if splice_refusal(arch)] == ["deepseek4"]


@pytest.mark.parametrize("hf_arch", sorted(CASES))
def test_convert_names_the_reason(hf_arch: str, tmp_path: Path) -> None:
    arch, words = CASES[hf_arch]
    folder = _checkpoint(tmp_path / "hf", hf_arch)
    with pytest.raises(CheckpointError, match=f"{hf_arch} \\({arch}\\): gguf-mtp makes no MTP head for it: .*{words}"):
        convert(folder, tmp_path / "d.gguf", block=3, progress=False)
    assert not (tmp_path / "d.gguf").exists()


def test_cli_says_it_in_one_line(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "hf", "Cohere2MoeForCausalLM")
    done = subprocess.run([sys.executable, "-m", "gguf_mtp", "convert", str(folder), "-o", str(tmp_path / "d.gguf"),
                           "--block", "3"], capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Cohere2MoeForCausalLM (cohere2moe): gguf-mtp makes no MTP head for it: no official " \
        "MTP weights exist" in lines[0], done.stderr
    assert not (tmp_path / "d.gguf").exists()
