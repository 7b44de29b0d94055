"""The typed errors: one base with a path, and the matching builtin, so callers that only know Python's
exceptions (``except OSError``, ``except ValueError``, ``except FileNotFoundError``) can still catch
them; real failing calls, not hand-made exceptions, prove it."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from gguf_mtp import errors
from gguf_mtp.errors import (
    BadGGUFError,
    CheckpointError,
    CheckpointNotFoundError,
    GGUFMTPError,
    GGUFNotFoundError,
    IncompatibleDraftError,
    NoNextNBlockError,
    OutputWriteError,
    ParameterError,
    UnsafeOutputError,
)
from gguf_mtp.files.commit import JOURNAL_NAME
from gguf_mtp.files.plan import Bytes, CopyRange, OutputFile
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.write import write_outputs

#: error class -> the builtin it must also be.
KINDS: dict[type[GGUFMTPError], type[Exception]] = {
    errors.BadGGUFError: ValueError,
    errors.GGUFNotFoundError: FileNotFoundError,
    errors.ShardSetError: ValueError,
    errors.IncompatibleDraftError: ValueError,
    errors.NoNextNBlockError: ValueError,
    errors.KVEditError: ValueError,
    errors.ParameterError: ValueError,
    errors.CheckpointError: ValueError,
    errors.CheckpointNotFoundError: FileNotFoundError,
    errors.VerificationError: ValueError,
    errors.UnsafeOutputError: OSError,
    errors.OutputWriteError: OSError,
    errors.InputReadError: OSError,
    errors.HubError: OSError,
    errors.HubUnreachableError: OSError,
    errors.LlamaServerError: OSError,
    errors.LlamaCppError: RuntimeError,
}


def test_every_error_class_is_covered() -> None:
    public = {getattr(errors, name) for name in errors.__all__} - {GGUFMTPError}
    assert public == set(KINDS)


@pytest.mark.parametrize("cls", list(KINDS), ids=lambda c: c.__name__)
def test_each_error_is_a_gguf_mtp_error_and_its_builtin(cls: type[GGUFMTPError]) -> None:
    error = cls("it broke", Path("/models/x.gguf"))
    assert isinstance(error, GGUFMTPError) and isinstance(error, KINDS[cls])
    assert (error.message, error.path, str(error)) == ("it broke", "/models/x.gguf", "/models/x.gguf: it broke")
    assert (cls("no path").path, str(cls("no path"))) == (None, "no path")


@pytest.mark.parametrize("cls", [c for c, kind in KINDS.items() if issubclass(kind, OSError)], ids=lambda c: c.__name__)
def test_os_kinds_do_not_pretend_to_have_an_errno(cls: type[GGUFMTPError]) -> None:
    # Two arguments to OSError would be read as (errno, strerror): the message must stay the message.
    error = cls("it broke", "/x")
    assert isinstance(error, OSError)
    assert (error.errno, error.strerror, error.filename, error.args) == (None, None, None, ("/x: it broke",))


def test_the_not_found_kinds_stay_in_their_family() -> None:
    assert issubclass(GGUFNotFoundError, BadGGUFError) and issubclass(CheckpointNotFoundError, CheckpointError)
    assert issubclass(NoNextNBlockError, IncompatibleDraftError)


@pytest.mark.parametrize("cls", list(KINDS), ids=lambda c: c.__name__)
def test_pickling_keeps_message_and_path_apart(cls: type[GGUFMTPError]) -> None:
    copy = pickle.loads(pickle.dumps(cls("it broke", "/x")))
    assert (type(copy), copy.message, copy.path, str(copy)) == (cls, "it broke", "/x", "/x: it broke")


# ------------------------------------------------------------------------------ real failing calls


def test_existing_output_is_caught_as_oserror(tmp_path: Path) -> None:
    out = tmp_path / "out.gguf"
    out.write_bytes(b"mine")
    try:
        write_outputs([OutputFile(out, (Bytes(b"new"),))], progress=False)
    except OSError as e:  # a caller that knows nothing of gguf-mtp
        caught: OSError = e
    else:
        pytest.fail("an existing output was replaced without force")
    assert isinstance(caught, UnsafeOutputError)
    assert str(caught) == f"{out}: output exists (use force to replace it)"  # not re-wrapped as an OS failure
    assert out.read_bytes() == b"mine"


def test_input_ending_early_is_caught_as_oserror(tmp_path: Path) -> None:
    source = tmp_path / "short.bin"
    source.write_bytes(b"x" * 100)
    out = tmp_path / "out.bin"
    with pytest.raises(OSError) as caught:
        write_outputs([OutputFile(out, (CopyRange(source, 0, 200),))], progress=False)
    assert isinstance(caught.value, OutputWriteError)
    assert caught.value.path == str(out)
    assert caught.value.message.startswith("input ended early (at byte 100) in ")
    assert caught.value.message.endswith("; no output was left behind")
    assert not out.exists()


def test_a_refused_journal_keeps_its_own_message(tmp_path: Path) -> None:
    # recover() raises UnsafeOutputError, an OSError: the writer must not re-wrap it as "cannot use this folder".
    (tmp_path / JOURNAL_NAME).write_bytes(b"not json")
    with pytest.raises(OSError, match="an interrupted run's journal cannot be used") as caught:
        write_outputs([OutputFile(tmp_path / "out.bin", (Bytes(b"x"),))], progress=False)
    assert isinstance(caught.value, UnsafeOutputError) and "cannot use this output folder" not in str(caught.value)


def test_missing_gguf_is_file_not_found_and_bad_gguf_is_value_error(tmp_path: Path) -> None:
    with pytest.raises(BadGGUFError, match="no such file"):
        read_header(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"JUNK" + b"\0" * 60)
    with pytest.raises(ValueError, match="not a GGUF file") as caught:
        read_header(tmp_path / "junk.gguf")
    assert isinstance(caught.value, BadGGUFError) and caught.value.path == str(tmp_path / "junk.gguf")


def test_missing_checkpoint_is_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nothing" / "here"
    with pytest.raises(FileNotFoundError) as caught:
        convert(missing, tmp_path / "d.gguf", block=3, progress=False)
    assert isinstance(caught.value, CheckpointNotFoundError)
    assert (caught.value.path, caught.value.message) == (str(missing), "no such folder, and not a Hub repo id "
                                                                        "(owner/name)")


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mtpv2_checkpoint(tmp_path_factory.mktemp("errors") / "head", dtype="bfloat16")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block": 3, "outtype": "q4"}, "outtype 'q4': choose one of f32, f16, bf16, q8_0"),
        ({"block": -1}, "block -1: a block index cannot be negative"),
        ({}, "the NextN block index is unknown: give target (the model the head belongs to; its trunk block count "
             "is the index) or block"),
        ({"standalone": True}, "standalone needs target: an MTP-only model takes token_embd, output_norm, output "
                               "and the tokenizer from the target"),
        ({"block": 3, "revision": "main"}, "revision 'main': a revision applies to Hub sources only, "),
    ],
    ids=["outtype", "negative-block", "no-block", "standalone", "revision"],
)
def test_bad_parameters_are_value_errors_named_by_parameter(head: Path, tmp_path: Path, kwargs: dict[str, object],
                                                            message: str) -> None:
    out = tmp_path / "d.gguf"
    with pytest.raises(ValueError) as caught:
        convert(head, out, progress=False, **kwargs)  # type: ignore[arg-type]
    assert isinstance(caught.value, ParameterError)
    assert caught.value.message.startswith(message)
    assert "--" not in caught.value.message  # a library names parameters; only the CLI knows flags
    assert not out.exists()


# ------------------------------------------------------------------------ library words, CLI words


def test_the_library_names_the_parameter_and_the_cli_names_its_flag(
    head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gguf_mtp.cli import main

    out = tmp_path / "d.gguf"
    convert(head, out, block=3, progress=False)
    with pytest.raises(UnsafeOutputError) as caught:
        convert(head, out, block=3, progress=False)
    assert caught.value.message == "output exists (use force to replace it)"
    assert caught.value.parameters == ("force",)

    assert main(["convert", str(head), "-o", str(out), "--block", "3", "-q"]) == 2
    assert capsys.readouterr().err == f"gguf-mtp: error: {out}: output exists (use --force to replace it)\n"
    assert main(["convert", str(head), "-o", str(out), "--block", "3", "-q", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "output exists (use --force to replace it)"


def test_only_the_named_parameter_becomes_a_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gguf_mtp.cli import main

    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF")
    # set_kv names a parameter; the KV key inside the message must stay as written.
    code = main(["compose", str(target), str(target), "-o", str(tmp_path / "o"), "--set-kv", "block_count", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "set_kv" not in err


def test_every_error_and_job_is_exported_from_the_package_without_loading_numpy() -> None:
    import subprocess
    import sys

    import gguf_mtp

    assert set(errors.__all__) <= set(gguf_mtp.__all__)
    assert {"bench", "BenchReport", "publish", "run_pipeline"} <= set(gguf_mtp.__all__)
    assert all(getattr(gguf_mtp, name) is not None for name in gguf_mtp.__all__)
    from gguf_mtp.server.bench import bench

    assert gguf_mtp.bench is bench
    code = "import sys, gguf_mtp; gguf_mtp.HubUnreachableError; print('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
