"""publish a trunk + sidecars, as ggml-org ships a head: a folder holding one model without a NextN block and the
``mtp-*.gguf`` sidecars beside it publishes the trunk untouched (copied on the Hub's side from the source repo, 0
bytes uploaded) and uploads only the sidecars; each sidecar must fit the trunk; the card says which sidecar
``llama-server -hf`` pairs with the trunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.hub_standin import RecordingHub

from gguf_mtp.cli import main
from gguf_mtp.errors import IncompatibleDraftError, ParameterError
from gguf_mtp.hub import client as hub_client
from gguf_mtp.jobs.sidecar_set import write_sidecar_set
from gguf_mtp.release.publish import publish
from gguf_mtp.testing.tiny_models import GLM4MOE, TinyHparams, write_draft, write_target

REPO = "me/Tiny-GLM-MTP"
SOURCE = "unsloth/Tiny-GLM-GGUF"
COMMIT = "5eed" + "0" * 36
TRUNK = [f"Model-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
SIDECARS = ["mtp-tiny-glm4moe-Q4_0.gguf", "mtp-tiny-glm4moe-Q8_0.gguf"]  # sorted, as published


@pytest.fixture(scope="module")
def head_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model as the trunk, carrying its BF16 head (what the sidecars are made from)."""
    return write_target(tmp_path_factory.mktemp("head"), family=GLM4MOE, with_nextn=True, name="Model-BF16",
                        quant="BF16", seed=5)


@pytest.fixture(scope="module")
def built(head_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("release")
    write_target(folder, family=GLM4MOE, name="Model-Q4_K_M", shards=3, seed=6)
    write_sidecar_set(head_model, folder, types="q8_0,q4_0", progress=False)
    return folder


@pytest.fixture
def release(built: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "release"
    folder.mkdir()
    for f in built.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def _hub(release: Path) -> RecordingHub:
    """A Hub whose source repo holds the trunk's shards in a quant folder, as unsloth's repos do."""
    hub = RecordingHub(commit=COMMIT)
    for name in TRUNK:
        hub.put_source(SOURCE, f"Q4_K_M/{name}", (release / name).read_bytes())
    return hub


def _size(release: Path, names: list[str]) -> int:
    return sum((release / n).stat().st_size for n in names)


def test_the_trunk_is_copied_on_the_hubs_side_and_only_the_sidecars_are_uploaded(
    release: Path, token: str, server_copy: None
) -> None:
    hub = _hub(release)
    report = publish(release, REPO, api=hub, progress=False, copy_from=f"{SOURCE}@main")
    assert hub.uploaded_bytes == _size(release, SIDECARS) + len(report.card.encode())
    assert hub.copies == [{"src_repo_id": SOURCE, "src_repo_type": "model", "src_revision": COMMIT,
                           "src_path_in_repo": f"Q4_K_M/{n}", "path_in_repo": n} for n in TRUNK]
    assert [(t.name, t.how) for t in report.transfers] == [(n, "copied") for n in TRUNK] + [
        (n, "uploaded") for n in SIDECARS]
    assert report.upload is not None and report.upload.copied_bytes == _size(release, TRUNK)
    assert report.upload.differing_bytes == hub.uploaded_bytes  # the sidecars and the card: all new
    assert report.ok and {c.name for c in report.checks} == {*TRUNK, *SIDECARS, "README.md"}


def test_the_dry_run_and_json_say_per_file_copied_or_uploaded_and_the_pairing(
    release: Path, token: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, server_copy: None
) -> None:
    hub = _hub(release)
    monkeypatch.setattr(hub_client, "make_api", lambda api=None, token=None: hub)
    assert main(["publish", str(release), "--repo", REPO, "--copy-from", SOURCE, "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(f["path_in_repo"], f["transfer"], f["copied_from"]) for f in out["files"]] == [
        (n, "copied", f"{SOURCE}@{COMMIT}") for n in TRUNK] + [(n, "uploaded", None) for n in SIDECARS]
    assert [f["why"] for f in out["files"][3:]] == [f"the MTP head: a new file; not in {SOURCE}@{COMMIT}"] * 2
    assert out["pairings"] == [{"trunk": TRUNK[0], "shards": 3, "tag": "Q4_K_M", "sidecar": SIDECARS[0],
                                "failure": None}]
    assert hub.uploaded_bytes == 0 and hub.copies == []


def test_the_card_says_which_sidecar_llama_server_hf_pairs_with_the_trunk(release: Path) -> None:
    report = publish(release, REPO, dry_run=True, progress=False)
    assert f"| `{TRUNK[0]}` | `Q4_K_M` | `{SIDECARS[0]}` |" in report.card
    assert f"llama-server -hf {REPO}:Q4_K_M --spec-type draft-mtp" in report.card
    assert f"gguf-mtp verify {SIDECARS[0]} --target {TRUNK[0]}" in report.card
    assert f"llama-server -hf {REPO}:Q4_K_M pairs the trunk {TRUNK[0]} with {SIDECARS[0]}" in report.describe()
    assert [t.why for t in report.transfers[:3]] == ["the trunk, unchanged"] * 3


def test_a_sidecar_of_another_model_is_refused_in_one_line(
    release: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_target(tmp_path / "other", family=GLM4MOE, with_nextn=True, name="Other-BF16", quant="BF16",
                         hparams=TinyHparams(n_vocab=768), seed=7)
    write_sidecar_set(other, tmp_path / "otherset", types="q8_0", name="Other", progress=False)
    (tmp_path / "otherset" / "mtp-Other-Q8_0.gguf").rename(release / "mtp-Other-Q8_0.gguf")
    with pytest.raises(IncompatibleDraftError, match="does not fit the trunk .*vocabulary has 768 tokens"):
        publish(release, REPO, dry_run=True, progress=False)
    assert main(["publish", str(release), "--repo", REPO, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mtp-Other-Q8_0.gguf" in err[0] and "does not fit the trunk" in err[0]


def test_a_composite_beside_sidecars_is_refused_it_is_no_trunk(release: Path, head_model: Path) -> None:
    for name in TRUNK:
        (release / name).unlink()
    (release / head_model.name).write_bytes(head_model.read_bytes())
    with pytest.raises(ParameterError, match="carries a NextN block .*a composite, not a trunk"):
        publish(release, REPO, dry_run=True, progress=False)


def test_a_sidecar_made_for_a_trunk_of_another_depth_is_refused(release: Path) -> None:
    deeper = GLM4MOE.default_pattern + "E"
    write_draft(release / "mtp-deeper-BF16.gguf", family=GLM4MOE, trunk_pattern=deeper, block="N",
                with_globals=True)
    with pytest.raises(IncompatibleDraftError, match=f"its head follows {len(deeper)} trunk blocks, the trunk has "
                                                     f"{len(GLM4MOE.default_pattern)}"):
        publish(release, REPO, dry_run=True, progress=False)


def test_a_bare_draft_beside_the_trunk_is_refused_llama_cpp_cannot_load_it_alone(release: Path) -> None:
    write_draft(release / "mtp-bare-BF16.gguf", family=GLM4MOE, block="N")
    with pytest.raises(IncompatibleDraftError, match="no token_embd/output_norm of its own"):
        publish(release, REPO, dry_run=True, progress=False)
