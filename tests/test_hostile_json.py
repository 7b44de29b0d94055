"""Checkpoints and JSON cannot crash or exhaust gguf-mtp (issue 11, items 5, 7, 8, 9 and 10's state file).

Every hostile checkpoint of :mod:`hostile_checkpoints` gives exit status 2 and one line naming the
file and the key; the counts that used to allocate gigabytes are refused in a process whose address
space is limited far below the machine's memory; a pipeline state file of the wrong shape is refused
with one line naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import no_hang
from support.hostile_checkpoints import DEEP, HOSTILE, _checkpoint, _edit_config
from support.malformed import Inputs, Malformed, Sources, build_sources

from gguf_mtp.cli import main
from gguf_mtp.errors import CheckpointError, GGUFMTPError
from gguf_mtp.files.json_io import MAX_JSON_DEPTH, load_json_file, nesting_depth, parse_json
from gguf_mtp.release.pipeline import STATE_FORMAT, STATE_NAME
from gguf_mtp.release.pipeline.state import StateFileError, load_stages

BY_NAME = {case.name: case for case in HOSTILE}

#: Address-space limit of the memory-bounded runs: Python, numpy and gguf-py fit in it, a 10^9-entry
#: list (what n_routed_experts: 1e9 used to build, ~36 GB) is thirty times too large for it.
ADDRESS_SPACE = 1 * 2**30


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Sources:
    return build_sources(tmp_path_factory.mktemp("hostile-sources"))


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(status: int, err: str, inputs: Inputs, expect: str) -> str:
    assert "Traceback" not in err
    assert status == 2, f"exit {status}, stderr: {err!r}"
    lines = err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gguf-mtp: error: ")
    assert str(inputs.blamed) in lines[0], f"{lines[0]!r} does not name {inputs.blamed}"
    assert expect in lines[0], f"{lines[0]!r} does not say {expect!r}"
    return lines[0]


def test_corpus_covers_every_class_with_distinct_cases() -> None:
    assert len(HOSTILE) >= 30
    assert len({c.name for c in HOSTILE}) == len(HOSTILE) == len({c.broken for c in HOSTILE})


@pytest.mark.parametrize("case", HOSTILE, ids=str)
def test_hostile_checkpoint_gives_exit_2_and_one_line_naming_the_file_and_key(
    case: Malformed, sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    inputs = case.build(sources, work)
    before = _hashes(work)
    out = tmp_path / "out"
    capsys.readouterr()
    with no_hang(30):  # a named pipe opened for reading would block here
        status = main(inputs.command(out))
    _one_line(status, capsys.readouterr().err, inputs, case.expect)
    assert not out.exists() or not os.listdir(out)
    assert _hashes(work) == before


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _run_limited(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GGUF_MTP_DISABLE_PROGRESS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "gguf_mtp", *argv], capture_output=True, text=True, env=env,
                          timeout=120, preexec_fn=_limited)


@pytest.mark.parametrize("name", ["experts_1e9_float", "experts_10_to_the_9", "experts_more_than_the_checkpoint_holds",
                                  "config_nested_100000_deep", "safetensors_header_nested_100000_deep"])
def test_hostile_count_is_refused_in_a_memory_limited_process(name: str, sources: Sources, tmp_path: Path) -> None:
    case = BY_NAME[name]
    inputs = case.build(sources, tmp_path / "work")
    done = _run_limited(inputs.command(tmp_path / "out"))
    _one_line(done.returncode, done.stderr, inputs, case.expect)
    assert done.stdout == ""


def test_the_memory_limit_is_real(tmp_path: Path) -> None:
    # The limit above must be one a 10^9-entry list cannot live in, or the test above proves nothing.
    done = subprocess.run([sys.executable, "-c", "x = list(range(10**9))"], capture_output=True, timeout=120,
                          preexec_fn=_limited)
    assert done.returncode != 0 and b"MemoryError" in done.stderr


@pytest.mark.parametrize("block", ["100000000000", "100000", "512"])
def test_absurd_block_index_is_refused_in_a_memory_limited_process(block: str, sources: Sources,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "draft.gguf"
    done = _run_limited(["convert", str(sources.checkpoint), "-o", str(out), "--block", block])
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"--block {int(block):,}: at most 511" in done.stderr and "LLAMA_MAX_LAYERS" in done.stderr
    assert not out.exists()


def test_largest_block_index_llama_cpp_loads_is_accepted(sources: Sources, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "draft.gguf"
    assert main(["convert", str(sources.checkpoint), "-o", str(out), "--block", "511", "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    arrays = {kv["key"]: kv["value"] for kv in report["kvs"]}
    assert report["block"] == 511 and arrays["nemotron_h_moe.block_count"] == 512
    assert arrays["nemotron_h_moe.feed_forward_length"] == "<512 items>"


def test_block_other_than_the_targets_trunk_is_refused(sources: Sources, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["convert", str(sources.checkpoint), "-o", str(tmp_path / "d.gguf"), "--target", str(sources.target)]
    assert main([*argv, "--block", "4"]) == 2
    assert "--block 4: the NextN block follows the trunk, so for this target it is 3" in capsys.readouterr().err


def test_expert_count_matching_the_checkpoint_still_converts(sources: Sources, tmp_path: Path) -> None:
    # The cross-check must not refuse a good head: the corpus source converts, experts stacked.
    out = tmp_path / "draft.gguf"
    assert main(["convert", str(sources.checkpoint), "-o", str(out), "--target", str(sources.target), "-q"]) == 0
    assert out.stat().st_size > 0


def test_null_hparam_counts_as_absent(sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _checkpoint(sources, tmp_path / "work")
    _edit_config(folder, max_position_embeddings=None, routed_scaling_factor=None)
    assert main(["convert", str(folder), "-o", str(tmp_path / "d.gguf"), "--block", "3", "--dry-run", "--json"]) == 0
    keys = {kv["key"] for kv in json.loads(capsys.readouterr().out)["kvs"]}
    assert "nemotron_h_moe.context_length" not in keys and "nemotron_h_moe.expert_weights_scale" not in keys


# ------------------------------------------------------------------------------------ the JSON loader


def test_depth_scan_ignores_brackets_inside_strings() -> None:
    assert nesting_depth(b'{"a": "[[[[{{{{", "b": [1, {"c": "]]]\\"[["}]}') == 3
    assert nesting_depth(b"[]") == 1 and nesting_depth(b"7") == 0


def test_depth_scan_measures_interleaved_nesting_not_runs_of_brackets() -> None:
    # "[[]" repeated never has more than two opening brackets in a row, yet nests one level per repeat.
    text = b"[[]" * 100 + b"]" * 100
    assert nesting_depth(text, limit=1000) == 101


def test_json_nested_exactly_to_the_cap_is_accepted_one_deeper_is_not(tmp_path: Path) -> None:
    ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert parse_json(ok, tmp_path / "x.json") is not None
    with pytest.raises(GGUFMTPError, match="nested more than 64 levels"):
        parse_json(b"[" + ok + b"]", tmp_path / "x.json")


def test_deep_json_never_reaches_the_recursive_parser(tmp_path: Path) -> None:
    deep = b"[" * DEEP + b"]" * DEEP
    with pytest.raises(RecursionError):
        json.loads(deep)  # what the loader protects against
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'x.json'}: JSON nested more than 64"):
        parse_json(deep, tmp_path / "x.json", error=CheckpointError)


@pytest.mark.parametrize(("text", "shown"), [
    (b'{"a": {"b": [1, -Infinity]}}', "a.b[1] = -Infinity"),
    (b'{"n": NaN}', "n = NaN"),
    (b'{"x": [1e400]}', "x[0] = 1e400"),
    (b'{"big": 18446744073709551616}', "big = 18446744073709551616"),
])
def test_non_finite_and_overflowing_numbers_are_named_by_key(text: bytes, shown: str, tmp_path: Path) -> None:
    with pytest.raises(GGUFMTPError) as info:
        parse_json(text, tmp_path / "f.json")
    assert f"{tmp_path / 'f.json'}: {shown} is not a finite number" in str(info.value)


def test_largest_64_bit_integer_and_ordinary_floats_are_accepted(tmp_path: Path) -> None:
    doc = parse_json(b'{"n": 18446744073709551615, "eps": 1e-05, "s": "Infinity"}', tmp_path / "f.json")
    assert doc == {"n": 2**64 - 1, "eps": 1e-05, "s": "Infinity"}


def test_utf8_byte_order_mark_is_accepted_and_bad_utf8_is_one_line(tmp_path: Path) -> None:
    assert parse_json(b'\xef\xbb\xbf{"a": 1}', tmp_path / "f.json") == {"a": 1}
    with pytest.raises(GGUFMTPError, match=r"not UTF-8 text \(byte 7\)"):
        parse_json(b'{"a": "\xff"}', tmp_path / "f.json")


def test_file_larger_than_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b'{"a": "' + b"x" * 2000 + b'"}')
    with pytest.raises(GGUFMTPError, match="2,009 bytes, more than the 1,000 gguf-mtp reads"):
        load_json_file(path, max_bytes=1000)


def test_fifo_json_file_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with no_hang(10), pytest.raises(GGUFMTPError, match="is not a regular file"):
        load_json_file(fifo, max_bytes=1000)


# ------------------------------------------------------------------------- item 10: the state file


def _state(work: Path, doc: object) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    path = work / STATE_NAME
    path.write_text(json.dumps(doc))
    return path


GOOD_OUTPUT = {"path": "draft/mtp.gguf", "size": 12, "sha256": "ab" * 32}

BAD_STATES = {
    "a list": ([1, 2], "a JSON list, not an object"),
    "no format": ({"stages": {}}, "format 'None'"),
    "another format": ({"format": 99, "stages": {}}, "format '99', this gguf-mtp writes format 1"),
    "stages a list": ({"format": 1, "stages": []}, "no stages object"),
    "an unknown stage": ({"format": 1, "stages": {"rm -rf": {}}}, "unknown stage 'rm -rf'"),
    "a record without key": ({"format": 1, "stages": {"draft": {"outputs": []}}}, "stages.draft.key is not a string"),
    "outputs not a list": ({"format": 1, "stages": {"draft": {"key": "k", "outputs": "x"}}},
                           "stages.draft.outputs is not a list"),
    "a size that is a string": (
        {"format": 1, "stages": {"draft": {"key": "k", "outputs": [{**GOOD_OUTPUT, "size": "12"}]}}},
        "stages.draft.outputs[0].size is not a byte count"),
    "a bad sha256": ({"format": 1, "stages": {"draft": {"key": "k", "outputs": [{**GOOD_OUTPUT, "sha256": 5}]}}},
                     "stages.draft.outputs[0].sha256 is not a sha256"),
    "target files missing": ({"format": 1, "stages": {"target": {"key": "k", "outputs": [], "detail": {}}}},
                             "stages.target.detail.files is not a list of file names"),
}


@pytest.mark.parametrize("what", sorted(BAD_STATES))
def test_state_file_of_the_wrong_shape_is_refused_naming_it(what: str, tmp_path: Path) -> None:
    doc, expect = BAD_STATES[what]
    path = _state(tmp_path / "work", doc)
    with pytest.raises(StateFileError) as info:
        load_stages(path, STATE_FORMAT)
    message = str(info.value)
    assert message.startswith(f"{path}: not a pipeline state file gguf-mtp wrote (") and expect in message
    assert "\n" not in message


def test_state_file_that_is_a_directory_a_fifo_or_deep_json_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "a" / STATE_NAME
    directory.mkdir(parents=True)
    fifo = tmp_path / "b" / STATE_NAME
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    deep = tmp_path / "c" / STATE_NAME
    deep.parent.mkdir()
    deep.write_text('{"format": 1, "stages": ' + "[" * DEEP + "]" * DEEP + "}")
    for path, expect in ((directory, "is a directory"), (fifo, "is not a regular file"), (deep, "nested more")):
        with no_hang(10), pytest.raises(StateFileError, match=expect) as info:
            load_stages(path, STATE_FORMAT)
        assert str(info.value).startswith(str(path))


def test_state_file_pipeline_writes_is_read_back(tmp_path: Path) -> None:
    record = {"key": "k" * 64, "finished": "2026-01-01T00:00:00+00:00", "outputs": [GOOD_OUTPUT],
              "detail": {"files": ["a.gguf"], "commit": None}}
    path = _state(tmp_path, {"format": STATE_FORMAT, "stages": {"target": record}})
    assert load_stages(path, STATE_FORMAT) == {"target": record}
    assert load_stages(tmp_path / "none" / STATE_NAME, STATE_FORMAT) == {}


@pytest.mark.parametrize("doc", [[1, 2], {"format": 1, "stages": {"draft": {"outputs": []}}}], ids=["list", "no-key"])
def test_pipeline_with_a_bad_state_file_exits_2_with_one_line(doc: object, tmp_path: Path) -> None:
    work = tmp_path / "work"
    path = _state(work, doc)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "GGUF_MTP_DISABLE_PROGRESS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "pipeline", "--target-repo", "o/t", "--target-files", "x-*-of-*.gguf",
         "--head-repo", "o/h", "--work-dir", str(work)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert str(path) in done.stderr
    assert path.read_text() == json.dumps(doc)  # never rewritten
