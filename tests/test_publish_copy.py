"""publish by copy: a file byte-identical to a file of the source repo is copied on the Hub's side from the pinned
source commit (0 bytes uploaded), a file the repo already holds is left unchanged, only the rest is uploaded; the
plan says which, per file, and why a composite's shards are new files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from huggingface_hub import errors as hub_errors_module
from support.hub_standin import RecordingHub

from gguf_mtp.hub import client as hub_client
from gguf_mtp.hub.errors import EGRESS_LIMIT_CODE, HubCall, answer_error, hub_error
from gguf_mtp.release.publish import CARD_NAME, publish

REPO = "me/Tiny-Nemotron-MTP"
SOURCE = "unsloth/Tiny-Nemotron-GGUF"
COMMIT = "5eed" + "0" * 36


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.gguf"))


def _hub_with_source(shard: Path, *, name: str = "Q4/renamed.gguf", xet: bool = True) -> RecordingHub:
    """A Hub whose source repo holds ``shard``'s bytes (under another name: bytes decide, not names)."""
    hub = RecordingHub(commit=COMMIT)
    hub.put_source(SOURCE, name, shard.read_bytes(), xet=xet)
    hub.put_source(SOURCE, "Q4/other.gguf", b"GGUF not this one")
    return hub


def test_a_file_identical_to_the_source_is_copied_and_costs_zero_uploaded_bytes(
    composite: Path, token: str, server_copy: None
) -> None:
    shards = _shards(composite)
    hub = _hub_with_source(shards[1])
    report = publish(composite, REPO, api=hub, progress=False, copy_from=SOURCE)
    card = len(report.card.encode())
    assert hub.uploaded_bytes == shards[0].stat().st_size + shards[2].stat().st_size + card
    assert hub.files[shards[1].name]["sha256"] == hub.repos[SOURCE]["Q4/renamed.gguf"]["sha256"]
    assert [t.how for t in report.transfers] == ["uploaded", "copied", "uploaded"]
    assert report.upload is not None and report.upload.total_bytes == hub.uploaded_bytes
    assert report.upload.copied_bytes == shards[1].stat().st_size
    assert report.ok and hub.methods.count("create_commit") == 1 and "upload_folder" not in hub.methods


def test_the_copy_request_names_the_pinned_source_commit(composite: Path, token: str, server_copy: None) -> None:
    hub = _hub_with_source(_shards(composite)[1])
    publish(composite, REPO, api=hub, progress=False, copy_from=f"{SOURCE}@main")
    assert hub.copies == [{"src_repo_id": SOURCE, "src_repo_type": "model", "src_revision": COMMIT,
                           "src_path_in_repo": "Q4/renamed.gguf", "path_in_repo": _shards(composite)[1].name}]
    listed = [c for c in hub.calls if c[0] in ("list_repo_files", "get_paths_info") and c[1][0] == SOURCE]
    assert [c[2]["revision"] for c in listed] == [COMMIT, COMMIT]  # the listing read at the same commit


def test_the_plan_and_json_say_per_file_copied_from_repo_at_commit_or_uploaded(
    composite: Path, token: str, server_copy: None
) -> None:
    shards = _shards(composite)
    report = publish(composite, REPO, api=_hub_with_source(shards[1]), progress=False, copy_from=SOURCE,
                     dry_run=True)
    files = report.to_dict()["files"]
    assert [(f["transfer"], f["copied_from"], f["source_path"]) for f in files] == [
        ("uploaded", None, None), ("copied", f"{SOURCE}@{COMMIT}", "Q4/renamed.gguf"), ("uploaded", None, None)
    ]
    lines = "\n".join(report.describe())
    assert f"{shards[1].name}  {shards[1].stat().st_size:,} bytes" in lines
    assert f"copied from {SOURCE}@{COMMIT} (Q4/renamed.gguf; on the Hub's side, 0 bytes uploaded)" in lines


def test_a_source_file_with_the_same_name_but_other_bytes_is_uploaded(composite: Path, token: str) -> None:
    shards = _shards(composite)
    hub = RecordingHub(commit=COMMIT)
    data = shards[1].read_bytes()
    hub.put_source(SOURCE, shards[1].name, data[:-1] + bytes([data[-1] ^ 0xFF]))  # same name and size, one byte off
    report = publish(composite, REPO, api=hub, progress=False, copy_from=SOURCE)
    assert [t.how for t in report.transfers] == ["uploaded"] * 3 and hub.copies == []
    assert report.transfers[1].why.endswith(f"; not in {SOURCE}@{COMMIT}")


def test_a_source_file_not_stored_in_xet_is_uploaded_with_the_reason(
    composite: Path, token: str, server_copy: None
) -> None:
    shards = _shards(composite)
    hub = _hub_with_source(shards[1], xet=False)
    report = publish(composite, REPO, api=hub, progress=False, copy_from=SOURCE)
    assert report.transfers[1].how == "uploaded" and hub.copies == []
    assert report.transfers[1].why == (
        f"identical to Q4/renamed.gguf of {SOURCE}@{COMMIT}, which is not stored in Xet (only Xet files are copied "
        "between repos)"
    )


def test_without_server_copy_every_file_is_uploaded_and_that_is_said_once(
    composite: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_client, "server_copy_supported", lambda: False)
    shards = _shards(composite)
    hub = _hub_with_source(shards[1])
    report = publish(composite, REPO, api=hub, progress=False, copy_from=SOURCE)
    assert hub.copies == [] and "create_commit" not in hub.methods
    assert hub.uploaded_bytes == sum(s.stat().st_size for s in shards) + len(report.card.encode())
    said = [n for n in report.notes if "cannot copy files between repos" in n]
    assert len(said) == 1 and hub_client.SERVER_COPY_SINCE in said[0]


def test_a_file_the_repo_already_holds_is_unchanged_and_not_uploaded_again(composite: Path, token: str) -> None:
    hub = RecordingHub()
    publish(composite, REPO, api=hub, progress=False)
    hub.uploaded_bytes = 0
    report = publish(composite, REPO, api=hub, progress=False)
    assert [t.how for t in report.transfers] == ["unchanged"] * 3
    assert hub.uploaded_bytes == len(report.card.encode()) and report.ok
    assert hub.calls[-2][2]["allow_patterns"] == [CARD_NAME]  # the last upload_folder: the card alone


def test_large_set_copies_first_then_uploads_and_commits_the_card_last(
    composite: Path, token: str, server_copy: None
) -> None:
    shards = _shards(composite)
    hub = _hub_with_source(shards[1])
    report = publish(composite, REPO, api=hub, progress=False, copy_from=SOURCE, upload_mode="resumable")
    assert hub.commits[0] == [shards[1].name] and hub.commits[-1] == [CARD_NAME]
    assert report.ok and hub.uploaded_bytes == shards[0].stat().st_size + shards[2].stat().st_size + len(
        report.card.encode())


def test_the_plan_says_each_composite_shard_is_a_new_file_and_why(composite: Path) -> None:
    report = publish(composite, REPO, progress=False, dry_run=True)
    arch = report.plan.model.arch
    block = report.plan.model.block_count - 1
    assert [t.why for t in report.transfers] == [
        f"a new file: its header changed ({arch}.block_count, {arch}.nextn_predict_layers, split.tensors.count, "
        "gguf_mtp.set_id)",
        "a new file: its header changed (split.tensors.count, gguf_mtp.set_id)",
        f"a new file: its header changed (split.tensors.count, gguf_mtp.set_id) and it holds the NextN block "
        f"(blk.{block})",
    ]


def _egress_error() -> Exception:
    kind: Any = getattr(hub_errors_module, "EgressLimitError", None)
    if kind is None:
        pytest.skip("huggingface_hub before 2.5 has no EgressLimitError: test_a_402_egress_answer_* covers it")
    response: Any = SimpleNamespace(status_code=402, headers={"X-Error-Code": EGRESS_LIMIT_CODE}, request=None)
    error: Exception = kind("402 Client Error.\n\nEgress limit reached for url: https://x", response=response)
    return error


def test_egress_limit_error_is_one_line_saying_the_run_is_resumable() -> None:
    error = hub_error(_egress_error(), f"download from {SOURCE}", SOURCE)
    assert error is not None
    text = str(error)
    assert "\n" not in text and "download allowance on the Hub is spent (402 EgressLimitReached)" in text
    assert "the run is resumable: run the same command again" in text


def test_a_402_egress_answer_says_the_run_is_resumable() -> None:
    text = str(answer_error(402, EGRESS_LIMIT_CODE, HubCall(f"download from {SOURCE}", SOURCE)))
    assert text.startswith(f"cannot download from {SOURCE}: the account's download allowance") and "resumable" in text
