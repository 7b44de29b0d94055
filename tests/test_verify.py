"""verify: good composites pass every check; the report lists each check; llama.cpp is the last word."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import copy_model

from gguf_mtp import BadGGUFError, compose
from gguf_mtp.check.llama_check import INSTALL_HINT
from gguf_mtp.check.verify import Check, VerifyReport, verify
from gguf_mtp.cli import main
from gguf_mtp.errors import ParameterError
from gguf_mtp.format.header import encode_kv
from gguf_mtp.model.drafting import check_model
from gguf_mtp.model.shards import open_model
from gguf_mtp.testing.server_models import with_test_tokenizer
from gguf_mtp.testing.tiny_models import add_raw_kvs

STRUCTURAL = [
    "files",
    "split keys",
    "split.tensors.count",
    "tensor names",
    "tensor data",
    "per-layer arrays",
    "NextN tensors",
]


def _compose(target: Path, draft: Path, out: Path) -> Path:
    return compose(target, draft, out, progress=False).output_paths[0]


@pytest.fixture(scope="module")
def split_composite(nemotron_split: Path, nemotron_draft0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compose(nemotron_split, nemotron_draft0, tmp_path_factory.mktemp("split"))


@pytest.fixture(scope="module")
def single_composite(nemotron_single: Path, nemotron_draft0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compose(nemotron_single, nemotron_draft0, tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def glm_composite(glm_target: Path, glm_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compose(glm_target, glm_draft, tmp_path_factory.mktemp("glm"))


CASES = {
    "nemotron 3 shards": ("split_composite", "nemotron_split", "nemotron_draft0"),
    "nemotron single file": ("single_composite", "nemotron_single", "nemotron_draft0"),
    "glm4moe": ("glm_composite", "glm_target", "glm_draft"),
}


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> tuple[Path, Path, Path]:
    return tuple(request.getfixturevalue(name) for name in CASES[request.param])  # type: ignore[return-value]


def _names(report: VerifyReport) -> list[str]:
    return [c.name for c in report.checks]


def test_good_composite_passes_every_check(case: tuple[Path, Path, Path]) -> None:
    composite, target, draft = case
    report = verify(composite, target=target, draft=draft, llama=False, progress=False)
    assert report.ok, report.describe()
    assert _names(report) == [*STRUCTURAL, "target tensors", "draft tensors", "target metadata", "llama.cpp"]
    assert all(c.ok for c in report.checks[:-1])


def test_bytes_of_target_and_draft_are_all_compared(
    split_composite: Path, nemotron_split: Path, nemotron_draft0: Path
) -> None:
    report = verify(split_composite, target=nemotron_split, draft=nemotron_draft0, llama=False, progress=False)
    target = report.check("target tensors")
    draft = report.check("draft tensors")
    assert target.detail.startswith("all 26 target tensors")
    assert "all 18 draft block tensors" in draft.detail and "as blk.3" in draft.detail
    assert "left out token_embd.weight, output_norm.weight, output.weight" in draft.detail
    # every byte of every tensor of both inputs: 26 target tensors + 18 draft block tensors
    target_bytes = sum(t.nbytes for _, t in open_model(nemotron_split).iter_tensors())
    draft_bytes = sum(t.nbytes for _, t in open_model(nemotron_draft0).iter_tensors() if t.name.startswith("blk."))
    assert report.bytes_compared == target_bytes + draft_bytes


def test_metadata_check_lists_the_changes_compose_made(split_composite: Path, nemotron_split: Path) -> None:
    detail = verify(split_composite, target=nemotron_split, llama=False, progress=False).check("target metadata").detail
    for change in (
        "block_count 3->4",
        "attention.head_count_kv extended",
        "feed_forward_length extended",
        "split.tensors.count 26->44",
        "nextn_predict_layers = 1",
    ):
        assert change in detail


def test_structural_checks_alone_need_no_inputs(split_composite: Path) -> None:
    report = verify(split_composite, llama=False, progress=False)
    assert report.ok
    assert _names(report) == [*STRUCTURAL, "llama.cpp"]


def test_any_shard_names_the_composite(split_composite: Path) -> None:
    second = split_composite.with_name(split_composite.name.replace("00001-of", "00002-of"))
    assert verify(second, llama=False, progress=False).ok


def test_a_model_without_nextn_block_is_not_a_verified_composite(nemotron_split: Path) -> None:
    report = verify(nemotron_split, llama=False, progress=False)
    assert not report.ok
    assert [c.name for c in report.failures] == ["NextN tensors"]
    assert "declares no NextN block" in report.check("NextN tensors").detail


def test_skipped_llama_check_is_reported_as_skipped_not_passed(split_composite: Path) -> None:
    report = verify(split_composite, llama=False, progress=False)
    llama = report.check("llama.cpp")
    assert (llama.ok, llama.status, llama.detail) == (None, "skip", "skipped (--no-llama)")
    assert report.describe()[-1] == "verified: 7 checks passed, 1 skipped"
    assert report.to_dict()["skipped"] == 1


def test_missing_llama_cpp_python_says_how_to_install(split_composite: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.import_module("gguf_mtp.check.verify.llama"), "llama_cpp_available", lambda: False)
    when_installed = verify(split_composite, llama=None, progress=False).check("llama.cpp")
    assert when_installed.status == "skip"
    assert INSTALL_HINT in when_installed.detail
    required = verify(split_composite, llama=True, progress=False)
    assert required.check("llama.cpp").status == "fail"
    assert INSTALL_HINT in required.check("llama.cpp").detail
    assert not required.ok


def test_missing_composite_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BadGGUFError, match="no such file"):
        verify(tmp_path / "nothing.gguf", llama=False)


def test_compose_with_verify_attaches_the_report(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path, progress=False, verify=True, llama=False)
    assert isinstance(report.verification, VerifyReport)
    assert report.verification.ok
    assert "target tensors" in _names(report.verification)
    assert report.to_dict()["verification"]["ok"] is True


def test_report_to_dict_lists_each_check(split_composite: Path, nemotron_split: Path) -> None:
    data = verify(split_composite, target=nemotron_split, llama=False, progress=False).to_dict()
    assert data["ok"] is True and data["failed"] == 0
    assert [c["status"] for c in data["checks"]] == ["pass"] * 9 + ["skip"]
    assert json.loads(json.dumps(data)) == data


def test_check_status_names() -> None:
    assert [Check("x", v, "").status for v in (True, False, None)] == ["pass", "fail", "skip"]


# --------------------------------------------------------------------------------------------- the CLI


def test_cli_passes_with_exit_0_and_one_line_per_check(
    split_composite: Path, nemotron_split: Path, nemotron_draft0: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["verify", str(split_composite), "--target", str(nemotron_split), "--draft", str(nemotron_draft0), "--no-llama"]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert [line.split()[0] for line in out[1:-1]] == ["PASS"] * 10 + ["SKIP"]
    assert out[-1] == "verified: 10 checks passed, 1 skipped"


def test_cli_hints_at_bench_only_for_a_model_bench_can_run(
    single_composite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 29 item 15: bench refuses a model without a tokenizer (llama-server cannot tokenize the prompts)
    assert main(["verify", str(single_composite), "--no-llama"]) == 0
    assert "gguf-mtp bench" not in capsys.readouterr().out
    with pytest.raises(ParameterError, match="model has no tokenizer"):
        check_model(single_composite, None)
    tokenized = with_test_tokenizer(single_composite, tmp_path / "tokenized.gguf")
    assert main(["verify", str(tokenized), "--no-llama"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == f"measure what MTP gains on your machine: gguf-mtp bench {tokenized} --server " \
        "PATH/TO/llama-server"
    assert check_model(tokenized, None).nextn == 1  # and bench takes it


def test_cli_fails_with_exit_2(nemotron_split: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(nemotron_split), "--no-llama", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert [c["name"] for c in data["checks"] if c["status"] == "fail"] == ["NextN tensors"]


def test_cli_unreadable_target_exits_2_with_one_line(
    split_composite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "target.gguf"
    bogus.write_bytes(b"not a gguf at all, but long enough to have a header" * 2)
    assert main(["verify", str(split_composite), "--target", str(bogus), "--no-llama"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gguf-mtp: error: {bogus}: not a GGUF file") and err.count("\n") == 1


# ------------------------------------------------------------------------------------------ llama.cpp


@pytest.mark.llama
def test_llama_cpp_loads_each_good_composite_and_runs_the_mtp_step(case: tuple[Path, Path, Path]) -> None:
    composite, target, draft = case
    report = verify(composite, target=target, draft=draft, llama=True, progress=False)
    assert report.ok, report.describe()
    llama = report.check("llama.cpp")
    assert llama.status == "pass"
    assert "n_layer_nextn=1" in llama.detail and "MTP decode ok" in llama.detail
    assert report.llama is not None and report.llama.mtp_decode_ok is True


@pytest.mark.llama
def test_llama_cpp_check_runs_by_default_when_installed(split_composite: Path) -> None:
    assert verify(split_composite, progress=False).check("llama.cpp").status == "pass"


@pytest.mark.llama
def test_a_standalone_draft_runs_the_mtp_step_only(nemotron_draft0: Path) -> None:
    report = verify(nemotron_draft0, llama=True, progress=False)
    assert report.ok, report.describe()
    assert report.llama is not None and report.llama.trunk_decode_ok is None


def _metadata_check_with_target_kv(target_split: Path, draft: Path, tmp_path: Path, key: str, value: int) -> Check:
    """verify's "target metadata" check of a composite whose target carries one more u32 KV ``key``."""
    target = copy_model(target_split, tmp_path / "target")
    add_raw_kvs(target, [encode_kv(key, GGUFValueType.UINT32, value)])
    composite = _compose(target, draft, tmp_path / "out")
    return verify(composite, target=target, llama=False, progress=False).check("target metadata")


def test_target_stating_zero_nextn_layers_may_change_it(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    metadata = _metadata_check_with_target_kv(nemotron_split, nemotron_draft0, tmp_path,
                                              "nemotron_h_moe.nextn_predict_layers", 0)
    assert metadata.ok, metadata.detail
    assert "nextn_predict_layers 0->1" in metadata.detail


def test_target_key_without_a_dot_is_compared_like_any_other(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    metadata = _metadata_check_with_target_kv(nemotron_split, nemotron_draft0, tmp_path, "undotted", 7)
    assert metadata.ok, metadata.detail
    assert metadata.detail == (  # the 37 KVs of the target, and "undotted"
        "all 38 target KVs unchanged except block_count 3->4, attention.head_count_kv extended, "
        "feed_forward_length extended, split.tensors.count 26->44, nextn_predict_layers = 1"
    )


def test_compose_verify_accepts_the_keys_set_kv_changed(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    report = compose(
        nemotron_split,
        nemotron_draft0,
        tmp_path,
        progress=False,
        verify=True,
        llama=False,
        set_kv=["general.name=renamed", "general.note:str=with MTP"],
    )
    assert report.verification.ok, report.verification.describe()
    plain = verify(report.output_paths[0], target=nemotron_split, llama=False, progress=False)
    assert set(plain.check("target metadata").detail.split("; ")) == {
        "general.name changed: 'tiny-nemotron_h_moe' (str) -> 'renamed' (str)",
        "general.note was added ('with MTP' (str))",
    }
