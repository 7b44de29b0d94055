"""Options are honoured or refused in one line, never silently ignored (issue 15, items 6 and 7; issue 11, item 15).

- ``compose``/``graft`` ``--no-llama --no-verify``: exit 2, one line; ``--dry-run --verify``: a one-line note.
- ``-v`` after the subcommand as well as before it; word choices in any case (``--outtype Q8_0``).
- long per-layer arrays in a change line show where they differ (``… 0, 2] -> … 0, 2, 2]``).
- verify's metadata check names every KV the plan changed (``--set-kv general.name=...`` included).
- ``pipeline`` and ``publish`` build their options object once from every flag, and their keyword API takes the
  same options with the same defaults (issue 33 item 3).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gguf_mtp.cli import build_parser, main
from gguf_mtp.testing.tiny_models import write_draft, write_target
from gguf_mtp.text import short_change


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli-options")
    return write_target(root / "target"), write_draft(root / "mtp-draft.gguf", block="N")


def test_no_llama_without_verify_is_refused_in_one_line(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    out = tmp_path / "out"
    assert main(["compose", str(target), str(draft), "-o", str(out), "--no-llama", "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert err == "gguf-mtp: error: --no-llama only applies when verifying (drop --no-verify)\n"
    assert not out.exists()


def test_no_llama_without_verify_gives_a_json_error(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    argv = ["compose", str(target), str(draft), "-o", str(tmp_path / "o"), "--no-llama", "--no-verify", "--json"]
    assert main(argv) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["exit_status"] == 2 and report["error"].startswith("--no-llama only applies when verifying")


def test_dry_run_with_verify_says_verify_is_ignored(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    out = tmp_path / "out"
    assert main(["compose", str(target), str(draft), "-o", str(out), "--dry-run", "--verify"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "gguf-mtp: note: --verify is ignored with --dry-run: nothing is written, so there is nothing to verify\n"
    )
    assert "dry run:" in captured.out and not out.exists()


@pytest.mark.parametrize(
    ("argv", "verbose"),
    [
        (["-v", "inspect", "x.gguf"], True),
        (["inspect", "-v", "x.gguf"], True),
        (["inspect", "x.gguf", "--verbose"], True),
        (["inspect", "x.gguf"], False),
    ],
)
def test_verbose_is_accepted_before_and_after_the_subcommand(argv: list[str], verbose: bool) -> None:
    assert build_parser().parse_args(argv).verbose is verbose


def test_verbose_after_the_subcommand_runs_the_command(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target, _ = pair
    assert main(["inspect", str(target), "-v"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "MTP: no"


@pytest.mark.parametrize("spelling", ["Q8_0", "q8_0", "Q8_0".swapcase()])
def test_outtype_is_accepted_in_any_case(spelling: str) -> None:
    args = build_parser().parse_args(["convert", "src", "-o", "d.gguf", "--block", "3", "--outtype", spelling])
    assert args.outtype == "q8_0"


def test_an_unknown_outtype_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["convert", "src", "-o", "d.gguf", "--outtype", "Q9"])
    assert exit_info.value.code == 2
    assert "argument --outtype: 'q9': choose one of f32, f16, bf16, q8_0, q6_k" in (
        capsys.readouterr().err)


def test_an_importance_matrix_outtype_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["pipeline", "--target-repo", "me/t", "--target-files", "*.gguf", "--head-repo",
                                   "me/h", "--outtype", "IQ2_XS"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.endswith("argument --outtype: iq2_xs: llama.cpp only writes it with an importance matrix "
                        "(llama-quantize --imatrix); give one (convert, compose, extract and graft take --imatrix "
                        "FILE; llama-imatrix --nextn makes one), or choose iq4_xs, q4_k or above")


@pytest.mark.parametrize("command", [["compose", "{target}", "{draft}", "-o", "{out}"],
                                     ["graft", "--from", "{full}", "--into", "{target}", "-o", "{out}"],
                                     ["extract", "{full}", "-o", "{out}/d.gguf"]])
def test_an_importance_matrix_outtype_without_imatrix_is_refused_by_the_command(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {"target": write_target(tmp_path / "target"), "draft": write_draft(tmp_path / "d.gguf", block="N"),
             "full": write_target(tmp_path / "full", with_nextn=True), "out": tmp_path / "out"}
    assert main([word.format(**files) for word in command] + ["--outtype", "IQ2_XS"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--outtype iq2_xs: llama.cpp only writes it with an importance matrix (llama-quantize --imatrix); give one "
        "with --imatrix FILE (llama-imatrix --nextn makes one), or choose iq4_xs, q4_k or above")
    assert not (tmp_path / "out").exists()


def test_other_word_choices_take_any_case_too() -> None:
    args = build_parser().parse_args(["publish", "out", "--repo", "me/x", "--upload-mode", "One-Commit"])
    assert args.upload_mode == "one-commit"


def test_a_long_array_change_shows_the_differing_tail() -> None:
    old, new = [0] * 87 + [2], [0] * 87 + [2, 2]  # an 88-entry per-layer array extended by one entry
    assert short_change(old, new) == "… 0, 2] -> … 0, 2, 2]"
    assert short_change(list(range(40)), list(range(41))) == "… 38, 39] -> … 38, 39, 40]"


def test_short_values_and_early_differences_are_shown_plainly() -> None:
    assert short_change(3, 4) == "3 -> 4"
    assert short_change([0, 2], [0, 2, 2]) == "[0, 2] -> [0, 2, 2]"
    old, new = [1] + [0] * 40, [5] + [0] * 40
    changed = short_change(old, new)
    assert changed.startswith("[1, 0, 0") and " -> [5, 0, 0" in changed
    assert all(len(side) <= 60 for side in changed.split(" -> "))


def test_a_long_differing_tail_is_cut_to_the_limit() -> None:
    old, new = [0] * 40 + [1] * 40, [0] * 40 + [2] * 40
    a, b = short_change(old, new).split(" -> ")
    assert a.startswith("… 0, 1, 1") and b.startswith("… 0, 2, 2")
    assert len(a) <= 60 and len(b) <= 60 and a.endswith("...") and b.endswith("...")


def test_verify_lists_a_set_kv_change_among_the_metadata_changes(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    argv = [
        "compose", str(target), str(draft), "-o", str(tmp_path / "out"), "--verify", "--no-llama",
        "--set-kv", "general.name=Renamed", "--json",
    ]
    assert main(argv) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["verification"]["checks"]}
    detail = checks["target metadata"]["detail"]
    assert checks["target metadata"]["status"] == "pass"
    assert "general.name 'tiny-nemotron_h_moe' -> 'Renamed'" in detail
    assert "block_count 3->4" in detail and "nextn_predict_layers = 1" in detail
    assert "gguf_mtp." not in detail  # its own bookkeeping keys are not model metadata



def test_verify_after_set_kv_names_allow_kv(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    out = tmp_path / "out"
    argv = ["compose", str(target), str(draft), "-o", str(out), "--set-kv", "general.name=Renamed",
            "--set-kv", "general.note:str=x", "-q"]
    assert main(argv) == 0
    capsys.readouterr()
    composite = str(out / target.name)
    assert main(["verify", composite, "--target", str(target), "--no-llama"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == (
        "hint: if compose --set-kv changed general.name, general.note on purpose, "
        "pass --allow-kv general.name --allow-kv general.note"
    )
    assert main(["verify", composite, "--target", str(target), "--no-llama", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["hints"] == [lines[-1].removeprefix("hint: ")]
    allowed = ["--allow-kv", "general.name", "--allow-kv", "general.note"]
    assert main(["verify", composite, "--target", str(target), "--no-llama", *allowed]) == 0
    assert "hint:" not in capsys.readouterr().out


@pytest.fixture(scope="module")
def split_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli-options-split")
    return write_target(root / "target", shards=3), write_draft(root / "mtp-draft.gguf", block="N")


@pytest.mark.parametrize("basename", ["X", "X.gguf", "X-00001-of-00003.gguf", "X-00003-of-00003.gguf"])
def test_a_basename_given_as_a_file_name_is_not_doubled(
    split_pair: tuple[Path, Path], tmp_path: Path, basename: str
) -> None:
    from gguf_mtp.jobs.compose import compose

    target, draft = split_pair
    report = compose(target, draft, tmp_path, basename=basename, dry_run=True)
    assert [p.name for p in report.output_paths] == [f"X-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_a_basename_of_another_shard_count_is_refused_in_one_line(
    split_pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = split_pair
    out = tmp_path / "out"
    assert main(["compose", str(target), str(draft), "-o", str(out), "--basename", "X-00001-of-00005.gguf"]) == 2
    assert capsys.readouterr().err == (
        "gguf-mtp: error: --basename 'X-00001-of-00005.gguf' names a set of 5 file(s), but the output has 3: "
        "give the prefix only ('X')\n"
    )
    assert not out.exists()


def test_a_single_file_basename_with_gguf_is_not_doubled(pair: tuple[Path, Path], tmp_path: Path) -> None:
    from gguf_mtp.jobs.compose import compose

    target, draft = pair
    assert [p.name for p in compose(target, draft, tmp_path, basename="Y.gguf", dry_run=True).output_paths] == [
        "Y.gguf"
    ]


@pytest.mark.parametrize("command", ["compose", "strip", "graft"])
def test_output_dir_naming_a_file_says_it_must_be_a_folder(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    target, draft = pair
    source = write_target(tmp_path / "with-mtp", with_nextn=True)
    existing = tmp_path / "existing.gguf"
    existing.write_bytes(b"mine")
    argv = {
        "compose": ["compose", str(target), str(draft)],
        "strip": ["strip", str(source)],
        "graft": ["graft", "--from", str(source), "--into", str(target)],
    }[command]
    assert main([*argv, "-o", str(existing)]) == 2
    assert capsys.readouterr().err == (
        f"gguf-mtp: error: {existing}: --output-dir must be a folder (the outputs go inside it), but this is a file\n"
    )
    assert existing.read_bytes() == b"mine"


# ------------------------------------------------------------------ issue 29 item 17: one verification rule


def _composite(pair: tuple[Path, Path], root: Path) -> Path:
    target, draft = pair
    assert main(["compose", str(target), str(draft), "-o", str(root / "donor"), "--no-verify", "-q"]) == 0
    return next((root / "donor").glob("*.gguf"))


def _argv(command: str, pair: tuple[Path, Path], root: Path, out: Path) -> list[str]:
    target, draft = pair
    if command == "compose":
        return ["compose", str(target), str(draft), "-o", str(out)]
    return ["graft", "--from", str(_composite(pair, root)), "--into", str(target), "-o", str(out)]


@pytest.mark.parametrize("command", ["compose", "graft"])
@pytest.mark.parametrize("flags", [[], ["--verify"], ["--no-verify"]], ids=["default", "verify", "no-verify"])
def test_compose_and_graft_verify_by_default_with_the_same_flags(
    command: str, flags: list[str], pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = [] if flags == ["--no-verify"] else ["--no-llama"]  # verify without loading llama.cpp
    assert main([*_argv(command, pair, tmp_path, tmp_path / "out"), *flags, *quick]) == 0
    out = capsys.readouterr().out
    verified = "verified: 10 checks passed, 1 skipped" in out  # --no-llama: the llama.cpp row skipped
    assert verified == (flags != ["--no-verify"]), out


@pytest.mark.parametrize("command", ["compose", "graft"])
def test_a_failed_verification_says_which_files_are_kept_and_where(
    command: str, pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gguf_mtp.check.verify

    real = gguf_mtp.check.verify.verify

    def verify_a_damaged_copy(composite: str, **kwargs: object) -> object:
        data = bytearray(Path(composite).read_bytes())  # a writer bug: the last NextN byte is wrong
        data[-1] ^= 0xFF
        Path(composite).write_bytes(bytes(data))
        return real(composite, **kwargs)

    monkeypatch.setattr(gguf_mtp.check.verify, "verify", verify_a_damaged_copy)  # compose and graft import it late
    out = tmp_path / "out"
    argv = _argv(command, pair, tmp_path, out)
    capsys.readouterr()
    assert main([*argv, "--no-llama"]) == 2
    captured = capsys.readouterr()
    [written] = sorted(out.glob("*.gguf"))
    assert "NOT verified: 1 of 11 checks failed, 1 skipped" in captured.out
    assert captured.err == (
        f"gguf-mtp: error: {written}: failed verification (1 check(s) failed, listed above); the 1 file(s) written "
        f"are kept in {out} for inspection (delete them, or write again with --force)\n"
    )


# ------------------------------------------------------------------ options objects (issue 33 item 3)


def _keywords(function: Callable[..., object], leave_out: set[str]) -> dict[str, object]:
    """A function's keyword-only parameters and their defaults (``REQUIRED`` for none), less ``leave_out``."""
    import inspect

    return {
        name: (REQUIRED if p.default is inspect.Parameter.empty else p.default)
        for name, p in inspect.signature(function).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in leave_out
    }


REQUIRED = object()


def _fields(options_class: type) -> dict[str, object]:
    import dataclasses

    result: dict[str, object] = {}
    for f in dataclasses.fields(options_class):
        if f.default is not dataclasses.MISSING:
            result[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            result[f.name] = f.default_factory()
        else:
            result[f.name] = REQUIRED
    return result


def test_the_public_keywords_and_the_options_objects_are_the_same_options() -> None:
    """run_pipeline's and publish's keywords (the public API) are exactly their options' fields, defaults included;
    what is not an option (the Hub client, the token, the message sink, known digests) stays a keyword of the run."""
    from gguf_mtp.release.card import Provenance
    from gguf_mtp.release.pipeline import PipelineOptions, run_pipeline
    from gguf_mtp.release.publish import PublishOptions, publish

    pipeline = _keywords(run_pipeline, {"api", "say"})
    assert pipeline == _fields(PipelineOptions)
    published = _keywords(publish, {"api", "token", "digests"})
    assert published | {"repo": REQUIRED, "provenance": Provenance()} == _fields(PublishOptions)


def test_the_pipeline_command_builds_its_options_once_from_every_flag(tmp_path: Path) -> None:
    import dataclasses

    from gguf_mtp.cli.pipeline import pipeline_options

    argv = ["pipeline", "--target-repo", "u/T-GGUF", "--target-files", "Q4/T-*-of-*.gguf", "--head-repo", "n/H",
            "--out-repo", "me/T-MTP", "--work-dir", str(tmp_path / "w"), "--keep", "--force", "--target-revision", "r1",
            "--target-dir", str(tmp_path / "mnt"), "--head-revision", "r2", "--out-revision", "b", "--private",
            "--replace-readme", "--basename", "T-MTP", "--outtype", "Q8_0", "--cache-dir", "c", "--no-llama", "-q",
            "--dry-run", "--if-changed"]
    options = pipeline_options(build_parser().parse_args(argv))
    assert dataclasses.asdict(options) == {
        "target_repo": "u/T-GGUF", "target_files": "Q4/T-*-of-*.gguf", "head_repo": "n/H", "work_dir": tmp_path / "w",
        "out_repo": "me/T-MTP", "keep": True, "force": True, "target_revision": "r1", "target_dir": tmp_path / "mnt",
        "head_revision": "r2", "out_revision": "b", "private": True, "replace_readme": True, "basename": "T-MTP",
        "outtype": "q8_0", "cache_dir": "c", "llama": False, "progress": False, "dry_run": True,
        "if_changed": True,
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.force = False  # type: ignore[misc]
    bare = pipeline_options(build_parser().parse_args(argv[:7]))
    assert (bare.out_repo, bare.keep, bare.force, bare.target_dir, bare.llama, bare.progress, bare.dry_run) == (
        None, False, False, None, None, True, False)


def test_the_publish_command_builds_its_options_once_from_every_flag(tmp_path: Path) -> None:
    from gguf_mtp.cli.publish import publish_options
    from gguf_mtp.release.card import Provenance

    argv = ["publish", str(tmp_path), "--repo", "me/T-MTP", "--private", "--revision", "b", "--upload-mode",
            "resumable", "--standalone", "--path-in-repo", "Q4", "--force", "--target-repo", "u/T-GGUF",
            "--target-file", "Q4/T-00001-of-00002.gguf", "--head-repo", "n/H", "--json", "--dry-run"]
    options = publish_options(build_parser().parse_args(argv))
    assert (options.repo, options.private, options.revision, options.upload_mode, options.standalone,
            options.path_in_repo, options.replace_readme, options.progress, options.dry_run, options.bench) == (
        "me/T-MTP", True, "b", "resumable", True, "Q4", True, False, True, None)
    assert options.provenance == Provenance(target_repo="u/T-GGUF", target_files=("Q4/T-00001-of-00002.gguf",),
                                            head_source="n/H")


def test_a_parameter_is_shown_as_its_flag_but_not_inside_a_file_name_or_path() -> None:
    from gguf_mtp.cli import _in_cli_terms

    flags = {"prompts": "--prompts"}
    assert _in_cli_terms("/tmp/prompts.json: prompts: bad", ("prompts",), flags) == "/tmp/prompts.json: --prompts: bad"
    assert _in_cli_terms("prompts.json: give prompts.", ("prompts",), flags) == "prompts.json: give --prompts."
