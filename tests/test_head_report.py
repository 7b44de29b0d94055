"""``inspect`` says what a model's head is: its types and size, whether they usually break acceptance (the one
table, :mod:`gguf_mtp.model.head_types`), whether ``nextn_predict_layers`` matches the tensors, and what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType
from support.helpers import rewrite_gguf

from gguf_mtp.check.inspect import inspect
from gguf_mtp.cli import main
from gguf_mtp.format.header import encode_kv
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.head_type import low_bit_warning
from gguf_mtp.model.head_types import WEAK_HEAD_TYPES, weak_head_types
from gguf_mtp.testing.server_models import with_test_tokenizer
from gguf_mtp.testing.tiny_models import GLM4MOE, write_draft, write_target


def test_the_table_holds_the_iq1_iq2_iq3_families_and_the_types_below_q4_k() -> None:
    families = {t for t in Q if t.name.startswith(("IQ1_", "IQ2_", "IQ3_"))}
    assert families <= set(WEAK_HEAD_TYPES)
    assert {Q.Q3_K, Q.Q2_K} <= set(WEAK_HEAD_TYPES)
    assert not {Q.Q4_K, Q.Q4_0, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.IQ4_XS, Q.IQ4_NL, Q.BF16, Q.F16, Q.F32} & set(WEAK_HEAD_TYPES)
    assert all(why for why in WEAK_HEAD_TYPES.values())


def test_weak_head_types_takes_numbers_members_and_names_once_each_in_table_order() -> None:
    assert weak_head_types(["Q8_0", int(Q.Q2_K), Q.IQ1_S, "q2_k", "F32", 10_000]) == (Q.IQ1_S, Q.Q2_K)
    assert weak_head_types(["Q4_K", "Q8_0", "BF16"]) == ()


def test_the_outtype_warning_reads_the_same_table() -> None:
    assert low_bit_warning(Q.Q2_K) is not None and low_bit_warning(Q.Q3_K) is not None
    assert low_bit_warning(Q.Q4_K) is None and low_bit_warning(None) is None


@pytest.fixture(scope="module")
def low_head(nemotron_split: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-shard model that ships with a Q2_K head."""
    draft = write_draft(tmp_path_factory.mktemp("low") / "q2_k.gguf", quant="Q2_K", seed=61)
    return compose(nemotron_split, draft, tmp_path_factory.mktemp("low-model"), progress=False).output_paths[0]


def test_a_low_type_head_is_reported_with_the_table_and_a_replace_head_suggestion(low_head: Path) -> None:
    summary = inspect(low_head)
    head = summary.head
    assert head is not None and head.blocks == (3,) and head.main_type == "Q2_K"
    assert head.weak_types == ("Q2_K",) and head.matches and head.declared == 1
    assert head.nbytes == sum(t.nbytes for t in summary.nextn_types) > 0
    assert "--replace-head" in head.suggestion and "Q8_0" in head.suggestion
    lines = summary.describe()
    first = next(i for i, line in enumerate(lines) if line.startswith("head: "))
    assert lines[first].startswith("head: blk.3: Q2_K, ") and lines[first].endswith("; Q2_K usually breaks acceptance")
    assert lines[first + 1] == "  nextn_predict_layers = 1: matches the tensors"
    assert lines[first + 2] == f"  suggestion: {head.suggestion}"


def test_a_good_head_gets_the_acceptance_measurement_suggested_on_its_own_file(tmp_path: Path) -> None:
    raw = write_target(tmp_path / "raw", family=GLM4MOE, with_nextn=True, quant="F16", name="good")
    model = with_test_tokenizer(raw, tmp_path / "good head.gguf")
    head = inspect(model).head
    assert head is not None and head.weak_types == ()
    assert head.suggestion.startswith(f"measure what the head is worth: gguf-mtp verify --acceptance '{model}'; ")


def test_a_head_without_a_tokenizer_gets_no_acceptance_measurement_suggested(nemotron_split: Path,
                                                                              nemotron_draft0: Path,
                                                                              tmp_path: Path) -> None:
    model = compose(nemotron_split, nemotron_draft0, tmp_path, progress=False).output_paths[0]
    head = inspect(model).head
    assert head is not None and head.weak_types == () and head.main_type == "BF16"
    assert head.suggestion.startswith("this file has no tokenizer, so its head cannot be measured from it; ")
    assert "verify --acceptance" not in head.suggestion


def test_json_carries_the_same_head_report(low_head: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(low_head), "--json"]) == 0
    head = json.loads(capsys.readouterr().out)["head"]
    expected = inspect(low_head).head
    assert expected is not None and head == json.loads(json.dumps(expected.to_dict()))
    assert head["usually_breaks_acceptance"] is True and head["weak_types"] == ["Q2_K"]
    assert head["nextn_predict_layers_matches_tensors"] is True and head["type"] == "Q2_K"


def test_a_declared_block_without_tensors_is_a_mismatch_and_keeps_its_warning(tmp_path: Path) -> None:
    trunk = write_target(tmp_path / "t")
    key = "nemotron_h_moe"
    edits = {f"{key}.block_count": encode_kv(f"{key}.block_count", GGUFValueType.UINT32, 4),
             f"{key}.nextn_predict_layers": encode_kv(f"{key}.nextn_predict_layers", GGUFValueType.UINT32, 1)}
    hollow = rewrite_gguf(trunk, tmp_path / "hollow.gguf", set_kvs=edits)
    summary = inspect(hollow)
    assert summary.mtp_verdict == "MTP: declared but tensors missing"
    head = summary.head
    assert head is not None and not head.matches and head.with_tensors == () and head.blocks == (3,)
    assert "does not match the tensors (NextN tensors in: none)" in "\n".join(summary.describe())
    assert "--replace-head" in head.suggestion


def test_a_model_without_a_head_has_no_head_report(nemotron_split: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect(nemotron_split).head is None
    assert main(["inspect", str(nemotron_split), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["head"] is None
