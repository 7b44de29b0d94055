"""The one Hub boundary (issue 12 item 4) and sidecars laid out for ``llama-server -hf`` (issue 14 item 4).

One offline check (huggingface_hub's own), one translator from typed ``huggingface_hub.errors`` (never
class names), one repo-id check (``validate_repo_id``), the token from ``get_token()``; and publish
putting an MTP-only draft where llama.cpp's ``-hf`` download finds it, with a card giving both commands.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import huggingface_hub.constants
import pytest
from huggingface_hub import errors as hf_errors
from support.hub_standin import LargeFolderHub, RecordingHub, http_error

from gguf_mtp.cli import main
from gguf_mtp.errors import HubError
from gguf_mtp.hub import access, client
from gguf_mtp.hub import errors as hub_errors
from gguf_mtp.release.card import CARD_MARKER, Provenance
from gguf_mtp.release.publish import publish, sidecar_name
from gguf_mtp.testing.tiny_models import write_draft

REPO = "me/Tiny-GGUF"
QUANT = "UD-Q4_K_XL"


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _response(status: int, code: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(status_code=status, headers={"X-Error-Code": code} if code else {}, request=None)


def _typed(kind: type[BaseException], status: int, code: str | None = None) -> BaseException:
    """An instance of a huggingface_hub HTTP error class, as the installed release builds them."""
    return kind(f"{status} Client Error", response=_response(status, code))  # type: ignore[call-arg]


# ------------------------------------------------------------------------------------------------ offline


def test_offline_is_huggingface_hubs_own_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert access.is_offline()
    with pytest.raises(HubError, match="^cannot publish to o/r: HF_HUB_OFFLINE is set"):
        access.require_online("publish to o/r")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    assert not access.is_offline()
    access.require_online("publish to o/r")


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (lambda: _typed(hf_errors.GatedRepoError, 403, "GatedRepo"),
         "cannot read x: o/r is gated: accept its terms on https://huggingface.co/o/r"),
        (lambda: _typed(hf_errors.RepositoryNotFoundError, 404, "RepoNotFound"),
         "cannot read x: repository o/r not found, or private and the token was refused"),
        (lambda: _typed(hf_errors.RevisionNotFoundError, 404, "RevisionNotFound"),
         "cannot read x: revision 'v9' not found in o/r"),
        (lambda: _typed(getattr(hf_errors, "RemoteEntryNotFoundError", hf_errors.EntryNotFoundError), 404,
                        "EntryNotFound"),
         "cannot read x: no file a/b.gguf in o/r at revision v9"),
        (lambda: http_error(401), "cannot read x: the Hub refused the token (401)"),
        (lambda: http_error(403), "cannot read x: no access to o/r (403)"),
        (lambda: http_error(500, "500 Server Error: boom"), "cannot read x: the Hub answered 500: 500 Server Error"),
        (lambda: hf_errors.LocalTokenNotFoundError("no token"), "cannot read x: no Hugging Face token"),
        (lambda: ConnectionError("connection refused"), "cannot read x: ConnectionError: connection refused"),
    ],
)
def test_typed_errors_become_one_line(error: object, expected: str, online: None) -> None:
    translated = hub_errors.hub_error(error(), "read x", "o/r", revision="v9", file="a/b.gguf")  # type: ignore[operator]
    assert translated is not None
    assert str(translated).startswith(expected), str(translated)
    assert "\n" not in str(translated)


def test_entry_not_found_is_the_not_found_error_that_siblings_rely_on(online: None) -> None:
    missing = getattr(hf_errors, "RemoteEntryNotFoundError", hf_errors.EntryNotFoundError)
    translated = hub_errors.hub_error(_typed(missing, 404, "EntryNotFound"), "read x", "o/r", file="f.gguf")
    assert isinstance(translated, hub_errors.RemoteNotFoundError)


def test_a_403_while_writing_says_write_access(online: None) -> None:
    translated = hub_errors.hub_error(http_error(403), "create o/r", "o/r", write=True)
    assert str(translated).startswith("cannot create o/r: no write access to o/r (403)")


#: (status, X-Error-Code, the call's file, a write call) -> the message answer_error gives for one HubCall.
_ANSWERS = [
    (404, "GatedRepo", "f.gguf", False,
     "cannot read x: o/r is gated: accept its terms on https://huggingface.co/o/r, then set HF_TOKEN"),
    (404, "RevisionNotFound", None, False, "cannot read x: revision 'v9' not found in o/r"),
    (404, "RepoNotFound", "f.gguf", False, "cannot read x: repository o/r not found, or private"),
    (404, None, None, False, "cannot read x: repository o/r not found, or private"),
    (404, "EntryNotFound", None, False, "cannot read x: a file asked for is not in o/r at revision v9"),
    (404, None, "f.gguf", False, "cannot read x: no file f.gguf in o/r at revision v9"),
    (407, None, None, False, "cannot read x: the proxy asks for credentials (407)"),
    (401, None, None, False, "cannot read x: the Hub refused the token (401)"),
    (403, None, None, True, "cannot read x: no write access to o/r (403)"),
    (403, None, None, False, "cannot read x: no access to o/r (403); set HF_TOKEN"),
    (500, None, None, False, "cannot read x: the Hub answered 500: busy"),
]


@pytest.mark.parametrize(("status", "code", "file", "write", "expected"), _ANSWERS)
def test_each_hub_answer_to_a_call_is_its_one_line(
    status: int, code: str | None, file: str | None, write: bool, expected: str, online: None
) -> None:
    call = hub_errors.HubCall("read x", "o/r", revision="v9", file=file, write=write, path="hf://o/r")
    error = hub_errors.answer_error(status, code, call, detail="busy")
    assert error.message.startswith(expected) and error.path == "hf://o/r"
    missing_file = expected.startswith(("cannot read x: a file", "cannot read x: no file"))
    assert isinstance(error, hub_errors.RemoteNotFoundError) == missing_file


def test_errors_are_matched_by_type_never_by_class_name(online: None) -> None:
    class GatedRepoError(Exception):  # the same name as huggingface_hub's, not the same class
        pass

    class OfflineModeIsEnabled(ValueError):
        pass

    assert hub_errors.hub_error(GatedRepoError("x"), "read x", "o/r") is None  # a bug, left to surface
    assert hub_errors.hub_error(OfflineModeIsEnabled("x"), "read x", "o/r") is None
    with pytest.raises(GatedRepoError), hub_errors.hub_errors("read x", "o/r"):
        raise GatedRepoError("x")


def test_offline_cache_miss_names_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    error = hf_errors.LocalEntryNotFoundError("not cached")
    translated = hub_errors.hub_error(error, "download config.json from o/r", "o/r", file="config.json")
    assert str(translated) == (
        "cannot download config.json from o/r: HF_HUB_OFFLINE is set and config.json is not in the Hub cache "
        "(run once online, or unset HF_HUB_OFFLINE)"
    )


def test_every_hub_call_goes_through_the_one_translator(online: None) -> None:
    hub = RecordingHub(fail={"get_paths_info": _typed(hf_errors.RepositoryNotFoundError, 404, "RepoNotFound")})
    with pytest.raises(HubError, match=r"^cannot read the file list of o/r: repository o/r not found"):
        client.remote_files(hub, "o/r", ["a.gguf"], token="t", revision=None)
    hub = RecordingHub(fail={"create_repo": http_error(403)})
    with pytest.raises(HubError, match=r"^cannot create o/r: no write access to o/r \(403\)"):
        client.check_write_access(hub, "o/r", token="t")


# ------------------------------------------------------------------------------------------------ repo ids, tokens


@pytest.mark.parametrize("repo", ["a--b/c", "a/b..c", "a/-b", "just-a-name", "o/r/extra", "o/r\n", ""])
def test_repo_ids_follow_validate_repo_id(repo: str) -> None:
    with pytest.raises(HubError, match=r"is not a Hub repo id \(OWNER/NAME\)"):
        client.check_repo_id(repo)
    assert not client.is_repo_id(repo)


@pytest.mark.parametrize("repo", ["o/r", "Org-1/Model_v2.5-GGUF", "o/" + "x" * 94])
def test_good_repo_ids_pass(repo: str) -> None:
    client.check_repo_id(repo)
    assert client.is_repo_id(repo)


def test_token_is_get_tokens_answer_env_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stored = tmp_path / "token"
    stored.write_text("hf_stored\n")
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(stored))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    assert access.resolve_token() == "hf_stored"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert access.resolve_token() == "hf_from_env"
    monkeypatch.setenv("HF_TOKEN", "hf_t\u00f6ken")
    with pytest.raises(HubError, match="^HF_TOKEN contains non-ASCII characters"):
        access.resolve_token()
    monkeypatch.delenv("HF_TOKEN")
    stored.write_text("hf_st\u00f6red\n", encoding="utf-8")
    with pytest.raises(HubError, match="^the stored Hugging Face token contains non-ASCII characters"):
        access.resolve_token()


@pytest.mark.parametrize(("path", "expected"), [("Q4", "Q4"), ("/a/b/", "a/b"), ("UD-Q4_K_XL", "UD-Q4_K_XL")])
def test_folder_paths_in_a_repo(path: str, expected: str) -> None:
    assert client.check_path_in_repo(path) == expected


@pytest.mark.parametrize("path", ["..", "a/../b", "a//b", "./a", "/", "a\\b", "a\nb"])
def test_folder_paths_that_leave_the_repo_are_refused(path: str) -> None:
    with pytest.raises(HubError, match="^path_in_repo "):
        client.check_path_in_repo(path)


# ------------------------------------------------------------------------------------------------ sidecars


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A standalone MTP-only draft whose file name lacks ``mtp-`` (as a user might have named it)."""
    return write_draft(tmp_path_factory.mktemp("sidecar") / "Tiny-draft.gguf", block="N", with_globals=True)


def test_sidecar_names_carry_the_mark_llama_cpp_looks_for() -> None:
    assert sidecar_name("Tiny-draft.gguf") == "mtp-Tiny-draft.gguf"
    assert sidecar_name("mtp-Tiny.gguf") == "mtp-Tiny.gguf"
    assert sidecar_name("Tiny-mtp-Q8_0.gguf") == "Tiny-mtp-Q8_0.gguf"


def test_a_sidecar_goes_into_the_quants_folder_under_an_mtp_name(draft: Path, online: None) -> None:
    hub = RecordingHub()
    provenance = Provenance(target_repo=REPO, target_files=(f"{QUANT}/Tiny-{QUANT}-00001-of-00002.gguf",))
    report = publish(draft, REPO, api=hub, standalone=True, path_in_repo=QUANT, provenance=provenance,
                     progress=False)
    sidecar = f"{QUANT}/mtp-Tiny-draft.gguf"
    card_path = "README.md"  # issue 21 item 18: the root card is the one the Hub shows, not QUANT/README.md
    assert sorted(hub.files) == sorted([sidecar, card_path])
    assert f"{QUANT}/README.md" not in hub.files
    assert hub.files[sidecar]["sha256"] == hashlib.sha256(draft.read_bytes()).hexdigest()
    assert hub.files[sidecar]["size"] == draft.stat().st_size
    upload = next(c for c in hub.calls if c[0] == "upload_folder")
    assert upload[2]["allow_patterns"] == [sidecar, card_path]
    assert [c.name for c in report.checks] == [sidecar, card_path] and report.ok
    staged = Path(upload[2]["folder_path"])
    assert not staged.exists()  # cleaned up after a checked upload
    card = report.card.splitlines()
    assert (f"llama-server -m {QUANT}/Tiny-{QUANT}-00001-of-00002.gguf --spec-draft-model "
            f"Tiny-GGUF/{sidecar} --spec-type draft-mtp --spec-draft-n-max 3") in card
    assert f"llama-server -hf {REPO}:{QUANT} --spec-type draft-mtp --spec-draft-n-max 3" in card
    assert f"hf download {REPO} {sidecar} --local-dir Tiny-GGUF" in card
    assert f"| `{sidecar}` | {draft.stat().st_size:,} bytes" in report.card


def test_a_sidecar_in_a_folder_resumably_puts_its_card_at_the_root_last(draft: Path, online: None) -> None:
    """Issue 21 item 18: the Hub shows only the root README.md; the card goes there, after the files."""
    hub = LargeFolderHub()
    hub.put("README.md", f"---\n---\n{CARD_MARKER}\n# an earlier card\n".encode())
    provenance = Provenance(target_repo=REPO, target_files=(f"{QUANT}/Tiny-{QUANT}-00001-of-00002.gguf",))
    report = publish(draft, REPO, api=hub, standalone=True, path_in_repo=QUANT, provenance=provenance,
                     upload_mode="resumable", progress=False)
    sidecar = f"{QUANT}/mtp-Tiny-draft.gguf"
    assert report.ok and report.plan.card_path == "README.md"
    assert sorted(hub.files) == ["README.md", sidecar]
    assert hub.commits == [["-README.md"], [sidecar], ["README.md"]]  # old card out, files, new card last
    assert hub.files["README.md"]["size"] == len(report.card.encode())


def test_a_sidecar_never_replaces_the_target_repos_own_readme(draft: Path, online: None) -> None:
    """The sidecar's card is the root README.md: in a quant repo that README is the quantizer's, kept unless
    replace_readme (the CLI's --force) says otherwise, in either upload mode."""
    theirs = b"# Tiny GGUF\n\nQuants by someone else.\n"
    provenance = Provenance(target_repo=REPO, target_files=(f"{QUANT}/Tiny-{QUANT}-00001-of-00002.gguf",))
    for mode in ("one-commit", "resumable"):
        hub = LargeFolderHub()
        hub.put("README.md", theirs)
        with pytest.raises(HubError, match=rf"^{REPO}: README.md exists and was not written by gguf-mtp"):
            publish(draft, REPO, api=hub, standalone=True, path_in_repo=QUANT, provenance=provenance,
                    upload_mode=mode, progress=False)
        assert hub.commits == [] and hub.files["README.md"]["data"] == theirs
        report = publish(draft, REPO, api=hub, standalone=True, path_in_repo=QUANT, provenance=provenance,
                         upload_mode=mode, replace_readme=True, progress=False)
        assert report.ok and hub.files["README.md"]["data"] == report.card.encode()


def test_a_sidecar_in_its_own_repo_names_the_target_repo_for_hf(draft: Path) -> None:
    provenance = Provenance(target_repo="unsloth/Tiny-GGUF", target_files=("Tiny-Q4_K_M.gguf",))
    report = publish(draft, "me/Tiny-MTP", dry_run=True, standalone=True, provenance=provenance, progress=False)
    assert report.plan.names_in_repo == ["mtp-Tiny-draft.gguf"] and report.plan.card_path == "README.md"
    card = report.card.splitlines()
    assert "llama-server -m Tiny-Q4_K_M.gguf --spec-draft-model Tiny-MTP/mtp-Tiny-draft.gguf " \
        "--spec-type draft-mtp --spec-draft-n-max 3" in card
    assert "llama-server -hf unsloth/Tiny-GGUF -hfd me/Tiny-MTP --spec-type draft-mtp --spec-draft-n-max 3" in card


def test_a_sidecar_below_the_models_folder_is_refused(draft: Path) -> None:
    provenance = Provenance(target_repo=REPO, target_files=(f"{QUANT}/Tiny-{QUANT}-00001-of-00002.gguf",))
    with pytest.raises(HubError, match=rf"path_in_repo 'MTP' is not the folder of the target file .* "
                                       rf"\(use path_in_repo '{QUANT}'\)"):
        publish(draft, REPO, dry_run=True, standalone=True, path_in_repo="MTP", provenance=provenance, progress=False)
    # a parent folder of the model (the root) is fine
    report = publish(draft, REPO, dry_run=True, standalone=True, provenance=provenance, progress=False)
    assert report.plan.names_in_repo == ["mtp-Tiny-draft.gguf"]


def test_cli_path_in_repo_dry_run(draft: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["publish", str(draft), "--repo", REPO, "--standalone", "--path-in-repo", f"{QUANT}/", "--dry-run",
            "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["path_in_repo"] == QUANT and report["card_path"] == "README.md"
    assert [f["path_in_repo"] for f in report["files"]] == [f"{QUANT}/mtp-Tiny-draft.gguf"]
    assert f"llama-server -hf {REPO}:{QUANT} --spec-type draft-mtp --spec-draft-n-max 3" in report["card"]


def test_cli_path_in_repo_that_leaves_the_repo_is_one_line(draft: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", str(draft), "--repo", REPO, "--standalone", "--path-in-repo", "../x", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "it must stay inside the repository" in err
