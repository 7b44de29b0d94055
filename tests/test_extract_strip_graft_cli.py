"""The extract, strip and graft commands: plans, JSON reports, exit codes and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import file_hashes, reader_tensors

from gguf_mtp.cli import main
from gguf_mtp.constants import KEY_TOKENS
from gguf_mtp.format.header import KeyValue, encode_kv, read_header
from gguf_mtp.testing.tiny_models import with_hparams, write_target


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shard 1 of a 2-shard model with a NextN block, as llama.cpp's converter writes it."""
    return write_target(tmp_path_factory.mktemp("cli-src"), with_nextn=True, shards=2, quant="Q8_0", name="Model-Q8_0")


@pytest.fixture(scope="module")
def trunk_quant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trunk-only "community quant" of the same model."""
    return write_target(tmp_path_factory.mktemp("cli-dst"), shards=2, name="Model-UD-Q4_K_XL", seed=5)


def _json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out)


def test_extract_json_lists_the_nextn_tensors_it_wrote(
    mtp_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extract", str(mtp_model), "-o", str(tmp_path / "draft.gguf"), "--json"]) == 0
    report = _json(capsys)
    assert report["command"] == "extract" and report["nextn_blocks"] == [3]
    assert len(report["tensors"]) == 18 and report["bytes_written"] == (tmp_path / "draft.gguf").stat().st_size


def test_extract_names_its_output_after_the_model_by_default(
    mtp_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    second_shard = mtp_model.with_name("Model-Q8_0-00002-of-00002.gguf")
    assert main(["extract", str(second_shard), "-q"]) == 0
    assert main(["extract", str(mtp_model), "--standalone", "-q"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mtp-Model-Q8_0.gguf", "mtp-draft-Model-Q8_0.gguf"]
    assert "standalone MTP-only model" in capsys.readouterr().out
    (tmp_path / "drafts").mkdir()
    assert main(["extract", str(mtp_model), "-o", "drafts", "-q"]) == 0
    assert [p.name for p in (tmp_path / "drafts").iterdir()] == ["mtp-draft-Model-Q8_0.gguf"]


def test_extract_of_a_model_without_nextn_block_exits_2_with_one_line(
    trunk_quant: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extract", str(trunk_quant), "-o", str(tmp_path / "d.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(trunk_quant) in err and "no NextN (MTP) block" in err


def test_strip_dry_run_prints_the_metadata_changes_and_writes_nothing(
    mtp_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["strip", str(mtp_model), "-o", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "nemotron_h_moe.block_count (u32): 4 -> 3" in out
    assert "nemotron_h_moe.nextn_predict_layers (u32): 1 -> (removed)" in out
    assert "nothing was written" in out
    assert not (tmp_path / "out").exists()


def test_strip_json_counts_the_removed_tensors(
    mtp_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["strip", str(mtp_model), "-o", str(tmp_path / "out"), "--json"]) == 0
    report = _json(capsys)
    assert report["tensors"]["removed"] == 18
    assert report["tensors"]["total"] == report["tensors"]["source"] - 18
    written = sum(len(read_header(Path(f["path"])).tensors) for f in report["files"])
    assert written == report["tensors"]["total"]


def test_strip_refuses_existing_outputs_without_force(
    mtp_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["strip", str(mtp_model), "-o", str(tmp_path / "out"), "-q"]) == 0
    before = file_hashes(tmp_path / "out")
    assert main(["strip", str(mtp_model), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert "use --force" in capsys.readouterr().err
    assert file_hashes(tmp_path / "out") == before
    assert main(["strip", str(mtp_model), "-o", str(tmp_path / "out"), "-q", "--force"]) == 0


def test_graft_dry_run_shows_the_plan_and_writes_nothing(
    mtp_model: Path, trunk_quant: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["graft", "--from", str(mtp_model), "--into", str(trunk_quant), "-o", str(tmp_path / "out"), "--dry-run"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "NextN block(s) blk.3, 18 tensors" in out and "+18 NextN" in out
    assert not (tmp_path / "out").exists()


def test_graft_json_reports_the_composite(
    mtp_model: Path, trunk_quant: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["graft", "--from", str(mtp_model), "--into", str(trunk_quant), "-o", str(out), "--json", "--no-llama"]
    assert main(args) == 0
    report = _json(capsys)
    assert report["command"] == "graft" and report["block"] == 3 and report["tensors"]["added"] == 18
    assert report["ok"] is True and report["verification"]["ok"] is True
    grafted = reader_tensors(out / trunk_quant.name)
    assert grafted["blk.3.nextn.eh_proj.weight"] == reader_tensors(mtp_model)["blk.3.nextn.eh_proj.weight"]


def test_graft_across_vocabularies_exits_2_naming_what_differs(
    mtp_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_target(tmp_path / "other", hparams=with_hparams(n_vocab=1024), name="other")
    assert main(["graft", "--from", str(mtp_model), "--into", str(other), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "vocabularies (nemotron_h_moe.vocab_size) differ: 512 in the source, 1024 in the target" in err
    assert not (tmp_path / "out").exists()


def _with_tokens(src: Path, dst: Path, tokens: KeyValue) -> Path:
    from support.helpers import rewrite_gguf

    return rewrite_gguf(src, dst, set_kvs={KEY_TOKENS: tokens})


_TOKEN_LIST = encode_kv(KEY_TOKENS, GGUFValueType.ARRAY, ["<s>", "a", "b"], GGUFValueType.STRING)


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        (encode_kv(KEY_TOKENS, GGUFValueType.STRING, "<s> a b"), "str"),
        (encode_kv(KEY_TOKENS, GGUFValueType.UINT32, 3), "u32"),
        (encode_kv(KEY_TOKENS, GGUFValueType.ARRAY, [1, 2, 3], GGUFValueType.INT32), "arr[i32]"),
    ],
)
@pytest.mark.parametrize("side", ["source", "target"])
def test_graft_with_a_token_list_that_is_not_an_array_of_strings_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: KeyValue, shown: str, side: str
) -> None:
    source = write_target(tmp_path / "src", with_nextn=True, name="src")
    target = write_target(tmp_path / "dst", name="dst", seed=5)
    source = _with_tokens(source, tmp_path / "src.gguf", bad if side == "source" else _TOKEN_LIST)
    target = _with_tokens(target, tmp_path / "dst.gguf", bad if side == "target" else _TOKEN_LIST)
    before = file_hashes(tmp_path)
    out = tmp_path / "out"
    assert main(["graft", "--from", str(source), "--into", str(target), "-o", str(out), "--no-llama"]) == 2
    err = capsys.readouterr().err
    broken = source if side == "source" else target
    assert err == (
        f"gguf-mtp: error: {broken}: tokenizer.ggml.tokens is {shown}, not an array of strings (arr[str])\n"
    )
    assert not out.exists() and file_hashes(tmp_path) == before


def test_graft_with_equal_token_lists_still_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _with_tokens(write_target(tmp_path / "src", with_nextn=True), tmp_path / "src.gguf", _TOKEN_LIST)
    target = _with_tokens(write_target(tmp_path / "dst", seed=5), tmp_path / "dst.gguf", _TOKEN_LIST)
    out = tmp_path / "out"
    assert main(["graft", "--from", str(source), "--into", str(target), "-o", str(out), "--dry-run"]) == 0
    assert "+18 NextN" in capsys.readouterr().out


@pytest.fixture(scope="module")
def over_claiming(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model with one real NextN block (blk.3) whose nextn_predict_layers says 2 (blk.2, a trunk block, too)."""
    from support.helpers import rewrite_gguf

    root = tmp_path_factory.mktemp("over-claiming")
    model = write_target(root / "src", with_nextn=True, name="one-nextn")
    key = "nemotron_h_moe.nextn_predict_layers"
    vtype = read_header(model).kvs[key].vtype
    return rewrite_gguf(model, root / "over-claiming.gguf", set_kvs={key: encode_kv(key, vtype, 2)})


@pytest.mark.parametrize("command", ["strip", "extract"])
def test_a_declared_nextn_block_without_nextn_tensors_is_refused_by_strip_and_extract(
    over_claiming: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    before = file_hashes(over_claiming.parent)
    trunk_block = [t for t in read_header(over_claiming).tensors if t.name.startswith("blk.2.")]
    assert trunk_block and not any(".nextn." in t.name for t in trunk_block)
    out = tmp_path / ("out" if command == "strip" else "draft.gguf")
    assert main([command, str(over_claiming), "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"gguf-mtp: error: {over_claiming}: nemotron_h_moe.nextn_predict_layers = 2 declares NextN block(s) "
        f"blk.2..blk.3, but blk.2 holds {len(trunk_block)} tensor(s) and no nextn.* tensor: it is a trunk block "
        "(nemotron_h_moe.nextn_predict_layers over-claims)\n"
    )
    assert captured.out == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert file_hashes(over_claiming.parent) == before  # the trunk block's bytes stay where they are


def test_graft_and_strip_show_where_a_long_per_layer_array_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33 item 4: one change-line rendering. With 30 blocks, ``feed_forward_length`` cut at 60 characters
    reads the same on both sides; the plan shows the arrays' tails, where they differ (as compose does)."""
    pattern = "ME" * 15
    source = write_target(tmp_path / "src", pattern=pattern, with_nextn=True, name="Long-Q8_0", quant="Q8_0")
    trunk = write_target(tmp_path / "dst", pattern=pattern, name="Long-Q4", seed=5)
    key = "nemotron_h_moe.feed_forward_length (arr[i32]): "
    for argv in (["graft", "--from", str(source), "--into", str(trunk)], ["strip", str(source)]):
        assert main([*argv, "-o", str(tmp_path / "out"), "--dry-run"]) == 0
        (line,) = [line for line in capsys.readouterr().out.splitlines() if key in line]
        old, new = line.split(key, 1)[1].split(" -> ")
        assert {old, new} == {"… 0, 256]", "… 0, 256, 256]"}, line  # the tails, where the NextN entry differs
