"""The head type around the plan: warnings and hints, what reports, --json, inspect and the card say about the
head, the kernel copies kept for every other byte, and installs without llama-cpp-python's quantizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from gguf_mtp.check.inspect import inspect
from gguf_mtp.cli import main
from gguf_mtp.errors import ParameterError
from gguf_mtp.files.plan import CopyRange, Generated
from gguf_mtp.format import quantize
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.compose import compose, plan_compose
from gguf_mtp.jobs.extract import extract
from gguf_mtp.jobs.head_type import parse_outtype
from gguf_mtp.model.shards import open_model
from gguf_mtp.release.card import ModelFacts


@pytest.fixture(scope="module")
def bf16_draft(models: Path) -> Path:
    from gguf_mtp.testing.tiny_models import write_draft

    return write_draft(models / "drafts" / "head-type-bf16.gguf", quant="BF16", seed=11)


def test_only_the_nextn_tensors_are_generated_every_target_byte_stays_a_copy(
    nemotron_split: Path, bf16_draft: Path, tmp_path: Path
) -> None:
    composition = plan_compose(nemotron_split, bf16_draft, tmp_path, outtype="q8_0")
    target_sources = {Path(p) for p in open_model(nemotron_split).paths}
    last = composition.files[-1]
    for planned in composition.files:
        for segment in planned.output.segments:
            if isinstance(segment, Generated):
                assert planned is last
            elif isinstance(segment, CopyRange):  # the target's bytes, and the draft's F32 norms and router
                assert segment.source in target_sources | {bf16_draft}
    head = composition.head
    assert head.main_type == "Q8_0" and head.types == {"Q8_0": 11, "F32": 7}
    generated = sum(s.nbytes for s in last.output.segments if isinstance(s, Generated))
    added = set(last.added_tensors)
    assert generated == sum(t.nbytes for t in last.tensors if t.name in added and t.type_name == "Q8_0")


def test_a_bf16_head_into_a_quantized_target_gets_the_q8_0_hint(
    nemotron_split: Path, bf16_draft: Path, tmp_path: Path
) -> None:
    report = compose(nemotron_split, bf16_draft, tmp_path, dry_run=True)
    assert report.notes == ["the head is 5.8 MiB in BF16 in a quantized target; --outtype q8_0 would make it 3.1 MiB"]
    assert compose(nemotron_split, bf16_draft, tmp_path, dry_run=True, outtype="q8_0").notes == []


@pytest.mark.llama  # q3_k/q2_k: llama.cpp's quantizer
@pytest.mark.parametrize("qtype", ["q3_k", "Q2_K"])
def test_a_head_below_q4_k_is_warned_about(nemotron_split: Path, bf16_draft: Path, tmp_path: Path,
                                           qtype: str) -> None:
    notes = compose(nemotron_split, bf16_draft, tmp_path, dry_run=True, outtype=qtype).notes
    assert len(notes) == 1 and "Q3_K_M 63.5 %, Q2_K 55.3 %" in notes[0]
    composite = compose(nemotron_split, bf16_draft, tmp_path / "composite", progress=False).output_paths[0]
    assert "Q2_K 55.3 %" in extract(composite, tmp_path / "x.gguf", outtype=qtype, dry_run=True).notes[0]


@pytest.mark.llama  # q6_k: llama.cpp's quantizer
def test_json_reports_and_inspect_give_the_heads_type_and_size(
    nemotron_split: Path, bf16_draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q6"
    assert main(["compose", str(nemotron_split), str(bf16_draft), "-o", str(out), "--outtype", "Q6_K", "--json",
                 "-q"]) == 0
    head = json.loads(capsys.readouterr().out)["head"]
    assert head["type"] == "Q6_K" and head["tensor_types"] == {"Q6_K": 11, "F32": 7}
    first = next(iter(sorted(out.glob("*-00001-of-*.gguf"))))
    summary = inspect(first)
    nextn = {t.type_name: t.count for t in summary.nextn_types}
    assert nextn == {"Q6_K": 11, "F32": 7} and sum(t.nbytes for t in summary.nextn_types) == head["bytes"]
    assert sum(t.count for t in summary.rest_types) == 26
    assert "  NextN block: " in "\n".join(summary.describe())
    facts = ModelFacts.from_model(open_model(first))
    assert facts.nextn_bytes == head["bytes"]


@pytest.mark.llama  # compares with ggml's own bytes first, then hides it
def test_without_llama_cpp_the_numpy_quantizers_serve_and_other_types_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = (np.random.default_rng(5).standard_normal((4, 256)) * 0.02).astype(np.float32)
    with_ggml = {q: quantize.from_f32(values, q).tobytes() for q in (Q.Q8_0, Q.Q4_1, Q.BF16)}
    q6 = quantize.from_f32(values, Q.Q6_K)
    q6_values = quantize.to_f32(q6, Q.Q6_K, values.size)
    monkeypatch.setattr(quantize, "_ggml", lambda: None)
    for q, data in with_ggml.items():
        assert quantize.from_f32(values, q).tobytes() == data
    assert parse_outtype("q5_1") == Q.Q5_1
    with pytest.raises(ParameterError, match=r"^outtype q4_k needs llama.cpp's quantizer: in your gguf-mtp clone "
                                             r"run `make install` or `pip install '\.\[llama\]'`"):
        parse_outtype("q4_k")
    with pytest.raises(quantize.QuantizerUnavailableError, match="pip install"):
        quantize.from_f32(values, Q.Q6_K)
    # a k-quant source still dequantizes (gguf-py's numpy gives ggml's values), as a requantizing graft needs
    assert np.array_equal(quantize.to_f32(q6, Q.Q6_K, values.size), q6_values)


def test_the_draft_type_stays_where_a_tensor_is_already_in_it(nemotron_split: Path, tmp_path: Path) -> None:
    """llama-quantize copies a tensor already in the wanted type; so do we (a Q8_0 block at q8_0)."""
    from gguf_mtp.testing.tiny_models import write_draft

    draft = write_draft(tmp_path / "q8.gguf", quant="Q8_0")
    composition = plan_compose(nemotron_split, draft, tmp_path / "out", outtype="q8_0")
    assert not any(isinstance(s, Generated) for f in composition.files for s in f.output.segments)
    assert read_header(draft).tensors[0].type_name in ("Q8_0", "F32")


def test_an_integer_source_tensor_is_refused_at_planning_time(tmp_path: Path) -> None:
    from gguf_mtp.errors import BadGGUFError
    from gguf_mtp.format.header import TensorInfo
    from gguf_mtp.jobs.head_type import retype_head_tensor

    tensor = TensorInfo("blk.3.nextn.eh_proj.weight", (32, 4), int(Q.I32), 0, 32 * 4 * 4)
    with pytest.raises(BadGGUFError, match=r"eh_proj.weight: cannot convert a I32 tensor \(llama-quantize cannot"):
        retype_head_tensor(tensor, tmp_path / "x.gguf", 0, Q.Q8_0, "nemotron_h_moe")


def _outtype_help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    start = text.index("--outtype TYPE write")
    return text[start : text.index(" Default:", start)]


@pytest.mark.parametrize("command", ["convert", "pipeline"])
def test_converts_outtype_help_is_one_sentence_saying_both_rules_once(command: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """One clause: the converter's four types its way, the others llama-quantize's way (issue 29 item 19)."""
    text = _outtype_help(command, capsys)
    assert text.startswith("--outtype TYPE write the head's matrices in TYPE, exactly as llama.cpp's converter "
                           "writes f32, f16, bf16 and q8_0, and as llama-quantize --pure writes the converter's "
                           "default output in the other types"), text
    assert text.count("llama-quantize --pure") == 1 and text.count("exactly as") == 1 and text.count("(") == 1
