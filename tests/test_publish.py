"""publish: token and access checked first, one commit for a small set, resumable with the card last for a
large one, a card that tells the truth about the files, and the Hub's record compared afterwards."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest
from support.helpers import copy_model, shard_files
from support.hub_standin import LargeFolderHub, RecordingHub, http_error

from gguf_mtp import HubError, NoNextNBlockError, ShardSetError
from gguf_mtp._version import __version__
from gguf_mtp.cli import main
from gguf_mtp.files.digests import FileDigest
from gguf_mtp.hub import client as hub_client
from gguf_mtp.release.card import CARD_MARKER, Provenance
from gguf_mtp.release.publish import CARD_NAME, STAGING_NAME, publish
from gguf_mtp.text import markdown_text

# the package exports the function `publish`; this is the module it lives in
publish_module = importlib.import_module("gguf_mtp.release.publish")

REPO = "me/Tiny-Nemotron-MTP"
PROVENANCE = Provenance(
    target_repo="unsloth/Tiny-Nemotron-GGUF",
    target_revision="a" * 40,
    target_files=("UD-Q4_K_XL/Tiny-Nemotron-UD-Q4_K_XL-00001-of-00003.gguf",),
    head_source="nvidia/Tiny-Nemotron-MTPv2",
    head_revision="main",
    base_model="nvidia/Tiny-Nemotron",
)


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-stored-token"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hashing_forbidden(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Fails the test if publish hashes anything (records the attempt)."""
    attempts: list[object] = []

    def refuse(paths: object, **kwargs: object) -> None:
        attempts.append(paths)
        raise AssertionError("hashed files before the Hub checks passed")

    monkeypatch.setattr(publish_module, "digest_files", refuse)
    return attempts


def _shards(folder: Path) -> list[Path]:
    return shard_files(sorted(folder.glob("*-00001-of-*.gguf"))[0])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


UPLOADS = ("upload_folder", "upload_large_folder", "delete_file")


# ------------------------------------------------------------------------------------------- the one-commit path


def test_small_set_goes_up_as_one_commit_with_every_shard_and_the_card(composite: Path, token: str) -> None:
    hub = RecordingHub()
    report = publish(composite, REPO, api=hub, provenance=PROVENANCE, progress=False)
    names = sorted(p.name for p in _shards(composite))
    assert hub.commits == [sorted([*names, CARD_NAME])]
    assert [m for m in hub.methods if m in UPLOADS] == ["upload_folder"]
    assert report.plan.mode == "one-commit"
    assert report.commit_url and report.commit_url.startswith(f"https://huggingface.co/{REPO}/commit/")


def test_checks_token_and_write_access_before_uploading(composite: Path, token: str) -> None:
    hub = RecordingHub()
    publish(composite, REPO, api=hub, progress=False)
    # get_paths_info: is there a README.md gguf-mtp did not write? then: which files does the repo already hold?
    assert hub.methods[:6] == [
        "whoami", "create_repo", "auth_check", "get_paths_info", "get_paths_info", "upload_folder"
    ]
    assert hub.calls[1][2]["exist_ok"] is True
    assert hub.calls[2][2]["write"] is True
    assert all(kwargs.get("token", token) == token for _, _, kwargs in hub.calls)


def test_uploaded_bytes_are_the_composite_and_the_remote_check_passes(composite: Path, token: str) -> None:
    hub = RecordingHub()
    report = publish(composite, REPO, api=hub, progress=False)
    for shard in _shards(composite):
        assert hub.files[shard.name]["sha256"] == _sha256(shard)
        assert hub.files[shard.name]["size"] == shard.stat().st_size
    assert {c.name for c in report.checks} == {*(p.name for p in _shards(composite)), CARD_NAME}
    assert all(c.ok for c in report.checks)
    assert hub.methods[-1] == "get_paths_info"


def test_only_the_models_files_are_uploaded_not_other_files_in_the_folder(composite: Path, token: str) -> None:
    (composite / "notes.txt").write_text("not for the Hub")
    (composite / "mtp-draft.gguf.partial").write_bytes(b"half a file")
    hub = RecordingHub()
    publish(composite, REPO, api=hub, progress=False)
    assert set(hub.files) == {*(p.name for p in _shards(composite)), CARD_NAME}


def test_revision_commits_to_a_branch_created_first(composite: Path, token: str) -> None:
    hub = RecordingHub()
    publish(composite, REPO, api=hub, revision="mtp", progress=False)
    assert "create_branch" in hub.methods
    assert hub.methods.index("create_branch") < hub.methods.index("upload_folder")
    upload = next(c for c in hub.calls if c[0] == "upload_folder")
    assert upload[2]["revision"] == "mtp"


def test_private_is_passed_to_create_repo(composite: Path, token: str) -> None:
    hub = RecordingHub()
    publish(composite, REPO, api=hub, private=True, progress=False)
    assert next(c for c in hub.calls if c[0] == "create_repo")[2]["private"] is True


def test_staging_is_recreated_so_a_stale_link_is_never_uploaded(composite: Path, token: str, tmp_path: Path) -> None:
    first = _shards(composite)[0]
    stale = tmp_path / "stale.gguf"
    stale.write_bytes(b"GGUF stale bytes from an earlier run")
    staging = composite / STAGING_NAME
    staging.mkdir()
    os.symlink(stale, staging / first.name)
    (staging / CARD_NAME).write_text("an old card")
    hub = RecordingHub()
    publish(composite, REPO, api=hub, progress=False)
    assert hub.files[first.name]["sha256"] == _sha256(first)
    assert not staging.exists()  # removed after a successful publish


def test_a_staging_name_that_is_a_link_never_empties_the_folder_it_points_to(
    composite: Path, token: str, tmp_path: Path
) -> None:
    users = tmp_path / "users-folder"
    users.mkdir()
    (users / "notes.txt").write_bytes(b"the user's notes")
    staging = composite / STAGING_NAME
    staging.symlink_to(users, target_is_directory=True)  # planted in the model folder
    hub = RecordingHub()
    publish(composite, REPO, api=hub, progress=False)
    first = _shards(composite)[0]
    assert hub.files[first.name]["sha256"] == _sha256(first)  # staged elsewhere, uploaded all the same
    assert sorted(os.listdir(users)) == ["notes.txt"] and (users / "notes.txt").read_bytes() == b"the user's notes"
    assert staging.is_symlink()  # the link itself is left alone too


def test_given_digests_are_reused_instead_of_hashing_again(
    composite: Path, token: str, hashing_forbidden: list[object]
) -> None:
    known = {str(p): FileDigest(p, p.stat().st_size, _sha256(p)) for p in _shards(composite)}
    report = publish(composite, REPO, api=RecordingHub(), digests=known, progress=False)
    assert [f.sha256 for f in report.files] == [known[str(p)].sha256 for p in _shards(composite)]


# ------------------------------------------------------------------------------------------- the resumable path


def test_large_set_goes_up_resumably_and_the_card_is_committed_last(composite: Path, token: str) -> None:
    hub = LargeFolderHub()
    report = publish(composite, REPO, api=hub, one_commit_max_bytes=1, progress=False)
    names = sorted(p.name for p in _shards(composite))
    assert report.plan.mode == "resumable"
    large = next(c for c in hub.calls if c[0] == "upload_large_folder")
    assert sorted(large[2]["allow_patterns"]) == names  # no card in the resumable part
    assert hub.commits[-1] == [CARD_NAME]
    assert sorted(n for commit in hub.commits[:-1] for n in commit) == names
    # the shards were checked on the Hub before the card went up
    card_upload = max(i for i, m in enumerate(hub.methods) if m == "upload_folder")
    assert "get_paths_info" in hub.methods[hub.methods.index("upload_large_folder") : card_upload]
    assert report.upload_method == "upload_large_folder"


def test_large_set_removes_an_earlier_card_before_uploading_files(composite: Path, token: str) -> None:
    hub = LargeFolderHub()
    hub.put(CARD_NAME, f"---\n---\n{CARD_MARKER}\n# an earlier card\n".encode())
    report = publish(composite, REPO, api=hub, one_commit_max_bytes=1, progress=False)
    assert hub.methods.index("delete_file") < hub.methods.index("upload_large_folder")
    assert hub.files[CARD_NAME]["size"] == len(report.card.encode())


def test_large_set_uses_upload_folder_where_huggingface_hub_has_no_upload_large_folder(
    composite: Path, token: str
) -> None:
    hub = RecordingHub()  # huggingface_hub >= 1.0: upload_folder itself is resumable
    report = publish(composite, REPO, api=hub, upload_mode="resumable", progress=False)
    assert report.upload_method == "upload_folder"
    assert hub.commits[-1] == [CARD_NAME]
    assert CARD_NAME not in hub.commits[0]


def test_file_count_alone_can_select_the_resumable_path(composite: Path, token: str) -> None:
    report = publish(composite, REPO, api=LargeFolderHub(), one_commit_max_files=2, progress=False)
    assert report.plan.mode == "resumable"


# ------------------------------------------------------------------------------------------- refusals come first


def test_missing_token_stops_before_any_hub_call_or_hashing(
    composite: Path, no_token: None, hashing_forbidden: list[object]
) -> None:
    hub = RecordingHub()
    with pytest.raises(HubError, match="no Hugging Face token"):
        publish(composite, REPO, api=hub, progress=False)
    assert hub.calls == [] and hashing_forbidden == []


def test_refused_token_stops_before_upload_and_hashing(
    composite: Path, token: str, hashing_forbidden: list[object]
) -> None:
    hub = RecordingHub(fail={"whoami": http_error(401)})
    with pytest.raises(HubError, match="refused the token"):
        publish(composite, REPO, api=hub, progress=False)
    assert not set(hub.methods) & set(UPLOADS) and hashing_forbidden == []


def test_read_only_token_is_refused_before_anything_is_created(
    composite: Path, token: str, hashing_forbidden: list[object]
) -> None:
    hub = RecordingHub(role="read")
    with pytest.raises(HubError, match="read-only"):
        publish(composite, REPO, api=hub, progress=False)
    assert hub.methods == ["whoami"]


def test_no_write_access_stops_before_upload_and_hashing(
    composite: Path, token: str, hashing_forbidden: list[object]
) -> None:
    hub = RecordingHub(fail={"auth_check": http_error(403)})
    with pytest.raises(HubError, match=r"no write access to me/Tiny-Nemotron-MTP \(403\)"):
        publish(composite, REPO, api=hub, progress=False)
    assert not set(hub.methods) & set(UPLOADS) and hashing_forbidden == []


def test_namespace_without_permission_fails_at_create_repo(composite: Path, token: str) -> None:
    hub = RecordingHub(fail={"create_repo": http_error(403)})
    with pytest.raises(HubError, match="403"):
        publish(composite, "someone-else/Model", api=hub, progress=False)
    assert not set(hub.methods) & set(UPLOADS)


THEIR_README = b"# My model\n\nWritten by hand; no tool may replace it.\n"


@pytest.mark.parametrize("mode", ["one-commit", "resumable"])
def test_a_readme_gguf_mtp_did_not_write_is_refused_before_anything_is_hashed_or_uploaded(
    composite: Path, token: str, hashing_forbidden: list[object], mode: str
) -> None:
    hub = LargeFolderHub()
    hub.put(CARD_NAME, THEIR_README)
    with pytest.raises(HubError, match=rf"^{REPO}: README.md exists and was not written by gguf-mtp; .*"
                                       r"\(pass replace_readme to replace it\)$") as caught:
        publish(composite, REPO, api=hub, upload_mode=mode, progress=False)
    assert caught.value.parameters == ("replace_readme",)
    assert not set(hub.methods) & set(UPLOADS) and hashing_forbidden == []
    assert hub.files[CARD_NAME]["data"] == THEIR_README and hub.commits == []


def test_a_large_readme_is_not_downloaded_and_is_not_ours(composite: Path, token: str) -> None:
    hub = RecordingHub()
    hub.put(CARD_NAME, CARD_MARKER.encode() + b"x" * (publish_module.CARD_MAX_BYTES + 1))
    with pytest.raises(HubError, match="not written by gguf-mtp"):
        publish(composite, REPO, api=hub, progress=False)
    assert "hf_hub_download" not in hub.methods


@pytest.mark.parametrize("mode", ["one-commit", "resumable"])
def test_replace_readme_replaces_a_readme_gguf_mtp_did_not_write_and_says_so(
    composite: Path, token: str, mode: str
) -> None:
    hub = LargeFolderHub()
    hub.put(CARD_NAME, THEIR_README)
    report = publish(composite, REPO, api=hub, upload_mode=mode, replace_readme=True, progress=False)
    assert report.ok and hub.files[CARD_NAME]["data"] == report.card.encode()
    assert any("not written by gguf-mtp; it is replaced, as asked" in n for n in report.notes)


def test_a_card_gguf_mtp_wrote_is_replaced_without_being_asked(composite: Path, token: str) -> None:
    hub = LargeFolderHub()
    first = publish(composite, REPO, api=hub, progress=False)
    after_front_matter = first.card.split("\n---\n", 1)[1]
    assert after_front_matter.lstrip("\n").splitlines()[0] == CARD_MARKER
    second = publish(composite, REPO, api=hub, provenance=PROVENANCE, upload_mode="resumable", progress=False)
    assert second.card != first.card and hub.files[CARD_NAME]["data"] == second.card.encode()
    assert not any("as asked" in n for n in second.notes)
    # a card written before the marker existed is recognised by its provenance row
    hub.put(CARD_NAME, b"# Old\n\n| part | source |\n|---|---|\n| written by | gguf-mtp 0.1.0 (the `gguf-mtp`...) |\n")
    assert publish(composite, REPO, api=hub, progress=False).ok


def test_cli_refuses_a_readme_it_did_not_write_in_one_line_naming_force(
    composite: Path, token: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = RecordingHub()
    hub.put(CARD_NAME, THEIR_README)
    monkeypatch.setattr(hub_client, "make_api", lambda api=None, token=None: hub)
    assert main(["publish", str(composite), "--repo", REPO, "-q"]) == 2
    err = capsys.readouterr().err
    assert err == (f"gguf-mtp: error: {REPO}: README.md exists and was not written by gguf-mtp; publishing would "
                   "replace it with the model card (pass --force to replace it)\n")
    assert hub.files[CARD_NAME]["data"] == THEIR_README
    assert main(["publish", str(composite), "--repo", REPO, "-q", "--force"]) == 0
    assert hub.files[CARD_NAME]["data"] != THEIR_README


def test_offline_publish_is_refused_in_one_line(composite: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_TOKEN="hf_test_token")
    proc = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "publish", str(composite), "--repo", REPO],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "HF_HUB_OFFLINE" in proc.stderr


def test_dry_run_works_offline_without_a_token_and_prints_the_card(composite: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    proc = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "publish", str(composite), "--repo", REPO, "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    for shard in _shards(composite):
        assert f"{shard.name}  {shard.stat().st_size:,} bytes  sha256 {_sha256(shard)}" in proc.stdout
    assert f"----- {CARD_NAME} -----" in proc.stdout and "--spec-type draft-mtp" in proc.stdout
    assert not (composite / STAGING_NAME).exists()


def test_bad_repo_id_is_refused(composite: Path, token: str) -> None:
    with pytest.raises(HubError, match="not a Hub repo id"):
        publish(composite, "just-a-name", api=RecordingHub(), progress=False)


def test_folder_with_two_models_is_refused(composite: Path, nemotron_single: Path, token: str) -> None:
    copy_model(nemotron_single, composite)
    with pytest.raises(ShardSetError, match="holds 2 models"):
        publish(composite, REPO, api=RecordingHub(), progress=False)


def test_incomplete_shard_set_is_refused(composite: Path, token: str) -> None:
    _shards(composite)[1].unlink()
    hub = RecordingHub()
    with pytest.raises(ShardSetError, match="missing"):
        publish(composite, REPO, api=hub, progress=False)
    assert hub.calls == []


def test_model_without_nextn_block_is_refused(nemotron_split: Path, token: str) -> None:
    with pytest.raises(NoNextNBlockError, match="not an MTP composite"):
        publish(nemotron_split, REPO, api=RecordingHub(), progress=False)


# ------------------------------------------------------------------------------------------- after the upload


def test_size_mismatch_on_the_hub_is_a_hub_error(composite: Path, token: str) -> None:
    last = _shards(composite)[-1].name
    hub = RecordingHub(tamper={last: {"size": 123}})
    with pytest.raises(HubError, match=rf"{re.escape(last)} on the Hub does not match: size on the Hub 123 bytes"):
        publish(composite, REPO, api=hub, progress=False)


def test_sha256_mismatch_on_the_hub_is_a_hub_error(composite: Path, token: str) -> None:
    first = _shards(composite)[0].name
    hub = RecordingHub(tamper={first: {"sha256": "f" * 64}})
    with pytest.raises(HubError, match="sha256 on the Hub f{64}"):
        publish(composite, REPO, api=hub, progress=False)


def test_resumable_mismatch_holds_the_card_back(composite: Path, token: str) -> None:
    first = _shards(composite)[0].name
    hub = LargeFolderHub(tamper={first: {"sha256": "0" * 64}})
    with pytest.raises(HubError, match=f"{CARD_NAME} was not uploaded"):
        publish(composite, REPO, api=hub, one_commit_max_bytes=1, progress=False)
    assert CARD_NAME not in hub.files


def test_changed_card_on_the_hub_is_a_hub_error(composite: Path, token: str) -> None:
    hub = RecordingHub(tamper={CARD_NAME: {"blob_id": "1" * 40}})
    with pytest.raises(HubError, match="model card on the Hub differs"):
        publish(composite, REPO, api=hub, progress=False)


# ------------------------------------------------------------------------------------------- the model card


def _card_rows(card: str) -> dict[str, tuple[int, str]]:
    rows = re.findall(r"^\| `([^`]+\.gguf)` \| ([\d,]+) bytes [^|]*\| `([0-9a-f]{64})` \|$", card, re.MULTILINE)
    return {name: (int(size.replace(",", "")), sha) for name, size, sha in rows}


def test_card_lists_every_file_with_its_real_size_and_sha256(composite: Path) -> None:
    report = publish(composite, REPO, dry_run=True, progress=False)
    expected = {p.name: (p.stat().st_size, _sha256(p)) for p in _shards(composite)}
    assert _card_rows(report.card) == expected


def test_card_names_sources_version_llama_release_and_serve_command(composite: Path) -> None:
    card = publish(composite, REPO, dry_run=True, provenance=PROVENANCE, progress=False).card
    first = _shards(composite)[0].name
    assert f"llama-server -m {first} --spec-type draft-mtp --spec-draft-n-max 3" in card
    assert "llama.cpp release b11025 or later" in card
    assert f"| written by | gguf-mtp {markdown_text(__version__)} (the `gguf-mtp` command" in card
    assert "pypi.org" not in card  # no link to a page that does not exist
    assert "[unsloth/Tiny-Nemotron-GGUF](https://huggingface.co/unsloth/Tiny-Nemotron-GGUF) at `" + "a" * 40 in card
    assert "`UD-Q4_K_XL/Tiny-Nemotron-UD-Q4_K_XL-00001-of-00003.gguf`" in card
    assert "[nvidia/Tiny-Nemotron-MTPv2](https://huggingface.co/nvidia/Tiny-Nemotron-MTPv2) at `main`" in card
    assert "`blk.3`: 18 tensors" in card


def test_card_front_matter_has_base_model_tags_and_library(composite: Path) -> None:
    card = publish(composite, REPO, dry_run=True, provenance=PROVENANCE, progress=False).card
    data = huggingface_hub.ModelCard(card).data.to_dict()
    assert data["base_model"] == "nvidia/Tiny-Nemotron"
    assert data["base_model_relation"] == "quantized"
    assert data["library_name"] == "gguf"
    assert {"gguf", "mtp", "nemotron_h_moe"} <= set(data["tags"])


def test_card_without_provenance_says_so(composite: Path) -> None:
    card = publish(composite, REPO, dry_run=True, progress=False).card
    assert "| target quant | not recorded |" in card and "| MTP head | not recorded |" in card


def test_uploaded_card_is_the_rendered_card(composite: Path, token: str) -> None:
    hub = RecordingHub()
    report = publish(composite, REPO, api=hub, provenance=PROVENANCE, progress=False)
    from gguf_mtp.files.digests import git_blob_sha1

    assert hub.files[CARD_NAME]["blob_id"] == git_blob_sha1(report.card.encode())


# ------------------------------------------------------------------------------------------- CLI


def test_cli_dry_run_json_lists_files_card_and_mode(composite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["publish", str(composite), "--repo", REPO, "--dry-run", "--json", "--head-repo", "nvidia/H"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["dry_run"] is True and out["mode"] == "one-commit"
    assert [f["name"] for f in out["files"]] == [p.name for p in _shards(composite)]
    assert "nvidia/H" in out["card"]


def test_hf_token_in_the_environment_overrides_the_stored_login(
    composite: Path, no_token: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = tmp_path / "stored-token"
    stored.write_text("hf_stored_login")
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(stored))
    hub = RecordingHub()
    publish(composite, REPO, api=hub, progress=False)
    assert hub.calls[0][2]["token"] == "hf_stored_login"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    hub = RecordingHub()
    publish(composite, REPO, api=hub, progress=False)
    assert {kwargs["token"] for _, _, kwargs in hub.calls if "token" in kwargs} == {"hf_from_env"}


def test_a_card_request_renders_its_sections_in_reading_order() -> None:
    from gguf_mtp.release.card import CardRequest, ModelFacts, render_model_card
    from gguf_mtp.server.bench_rules import BenchRow, BenchSummary

    bench = BenchSummary("m.gguf", None, (BenchRow(0, 0, 0, 64, 10.0), BenchRow(3, 30, 24, 64, 20.0)), True, 3, 64, 1,
                         ())
    facts = ModelFacts("nemotron_h_moe", "Tiny", 4, 1, 40, 5, ("Q8_0",), 4096)
    files = [FileDigest(Path("M-00001-of-00002.gguf"), 1000, "a" * 64),
             FileDigest(Path("M-00002-of-00002.gguf"), 10, "b" * 64)]
    card = render_model_card(CardRequest("me/Tiny-MTP", files, facts, "1.0", bench=bench))
    headings = [line for line in card.splitlines() if line.startswith("#")]
    assert headings == ["# Tiny\\-MTP", "## Where it comes from", "## Files", "## Run it", "## Measured speed",
                        "## Check it"]
    assert "| NextN block | `blk.4`: 5 tensors (Q8\\_0), 4.1 KB |" in card
    assert "2 file(s), 40 tensors, 1.0 KB in all." in card
    assert "gguf-mtp verify M-00001-of-00002.gguf\n" in card


def _model_with_a_hostile_block_number(tmp_path: Path) -> Path:
    """One file, two blocks of which the last is the NextN block (``blk.1``), and a tensor claiming block
    99999999999: past any block, and more digits than :func:`gguf_mtp.model.blocks.block_index` reads."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "hostile.gguf"
    writer = GGUFWriter(path, "glm4moe")
    writer.add_block_count(2)
    writer.add_uint32("glm4moe.nextn_predict_layers", 1)
    for name, rows in (("blk.0.attn_norm.weight", 4), ("blk.1.attn_norm.weight", 8),
                       ("blk.99999999999.attn_norm.weight", 16)):
        writer.add_tensor(name, np.ones(rows, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_tensor_past_every_block_is_not_in_the_cards_head(tmp_path: Path) -> None:
    from gguf_mtp.model.shards import open_model
    from gguf_mtp.release.card import ModelFacts

    facts = ModelFacts.from_model(open_model(_model_with_a_hostile_block_number(tmp_path)))
    assert (facts.nextn_tensors, facts.nextn_bytes, facts.nextn_types) == (1, 8 * 4, ("F32",))


def test_a_tensor_past_every_block_is_not_published_as_the_head(tmp_path: Path) -> None:
    from gguf_mtp.model.shards import open_model
    from gguf_mtp.release.publish import bytes_beyond_target, why_new_files

    model = open_model(_model_with_a_hostile_block_number(tmp_path))
    assert why_new_files(model, standalone=False)[0].endswith("and it holds the NextN block (blk.1)")
    # the target's bytes: blk.0 (16 bytes) and the hostile tensor (64 bytes), each padded to the alignment of 32
    assert model.first.alignment == 32
    assert bytes_beyond_target(model) == model.first.file_size - (32 + 64)
