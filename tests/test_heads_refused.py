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
#: The same, for the words naming the llama.cpp build that adds what is missing (tests/test_mtp_builds.py's table).
BUILD_CASES = {
    "Cohere2MoeForCausalLM": ("cohere2moe", "still so at b11434"),
    "Glm5NextForConditionalGeneration": ("glm5-next", "MTP graph for it lands in b11474 .*not implemented yet"),
    "MellumForCausalLM": ("mellum", "MTP graph for it is newer than b11434: b11739's libllama has one"),
    "Dots3NoteForCausalLM": ("dots3note", "no llama.cpp build up to b11739 has an MTP graph for it"),
    "Glm4ForCausalLM": ("glm4", "no llama.cpp build up to b11739 has an MTP graph for it"),
    "BailingMoeV2ForCausalLM": ("bailingmoe2", "up to b11739 .*src/models/bailingmoe2.cpp"),
    "Exaone4ForCausalLM": ("exaone4", "up to b11739 .*src/models/exaone4.cpp"),
    "ExaoneMoEForCausalLM": ("exaone-moe", "up to b11739 .*src/models/exaone-moe.cpp"),
    "DeepseekV4ForCausalLM": ("deepseek4", "still so at b11434"),
}


def _checkpoint(folder: Path, hf_arch: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [hf_arch], "num_nextn_predict_layers": 1}))
    return folder


def test_each_refused_hugging_face_name_finds_its_architecture() -> None:
    # which architectures are refused is tests/test_mtp_builds.py's: the table of MTP architectures by build
    for hf_arch, (arch, _) in CASES.items():
        refused = refusal_for_hf(hf_arch)
        assert refused is not None and refused[0] == arch
    assert refusal_for_hf("Glm4MoeForCausalLM") is None
    assert refusal_for_hf("Qwen4ExpForCausalLM") is None  # b11434 has its MTP graph: test_family_qwen4exp
    # only DeepSeek-V4's head cannot sit in a trunk: compose/graft refuse it (test_arch_rules), not the others
    assert [arch for arch in HEADS_REFUSED if splice_refusal(arch)] == ["deepseek4"]


def test_nemotron_h_is_refused_by_architecture_only() -> None:
    # NemotronHForCausalLM is also Nemotron 3's (nemotron_h_moe), whose head gguf-mtp converts
    assert refusal_for_hf("NemotronHForCausalLM") is None
    assert HEADS_REFUSED["nemotron_h"].hf_architectures == ()


@pytest.mark.parametrize(("hf_arch", "arch", "words"), [(h, *case) for cases in (CASES, BUILD_CASES)
                                                          for h, case in sorted(cases.items())])
def test_convert_names_the_reason(hf_arch: str, arch: str, words: str, tmp_path: Path) -> None:
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
