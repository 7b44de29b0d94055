"""inspect: a summary of what a (split, possibly broken) GGUF holds, and the one-line MTP verdict."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType
from support.helpers import copy_model, shard_files

from gguf_mtp import BadGGUFError, compose
from gguf_mtp.check.inspect import inspect
from gguf_mtp.cli import main
from gguf_mtp.format.header import align_up, encode_kv, read_header, serialize_header
from gguf_mtp.testing.tiny_models import GLM4MOE, write_target

ARCH = "nemotron_h_moe"


@pytest.fixture(scope="module")
def composite(nemotron_split: Path, nemotron_draft0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 3-shard nemotron trunk with its MTP draft spliced in as blk.3."""
    report = compose(nemotron_split, nemotron_draft0, tmp_path_factory.mktemp("composite"), progress=False)
    return report.output_paths[0]


def _rewrite(src: Path, dst: Path, *, kvs: dict | None = None, drop: tuple[str, ...] = ()) -> None:
    """Copy one GGUF with some KVs replaced and some tensors removed (the rest re-packed)."""
    header = read_header(src)
    new_kvs = [(kvs or {}).get(k, kv) for k, kv in header.kvs.items()]
    kept = [t for t in header.tensors if t.name not in drop]
    placed, offset = [], 0
    for t in kept:
        placed.append(replace(t, offset=offset))
        offset = align_up(offset + t.nbytes, header.alignment)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(serialize_header(header.version, new_kvs, placed, header.alignment))
        for old, new in zip(kept, placed):
            fin.seek(header.data_offset + old.offset)
            fout.write(fin.read(old.nbytes))
            fout.write(b"\0" * (align_up(new.offset + new.nbytes, header.alignment) - new.offset - new.nbytes))


# ------------------------------------------------------------------------------------------ good models


def test_trunk_only_split_model_has_no_mtp(nemotron_split: Path) -> None:
    summary = inspect(nemotron_split)
    assert summary.mtp_verdict == "MTP: no"
    assert not summary.has_mtp
    assert (summary.architecture, summary.block_count, summary.trunk_blocks, summary.nextn_predict_layers) == (
        ARCH, 3, 3, 0,
    )


def test_composite_verdict_names_the_nextn_block(composite: Path) -> None:
    summary = inspect(composite)
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert summary.has_mtp
    assert summary.nextn_blocks == (3,)
    assert summary.trunk_blocks == 3


def test_any_shard_summarises_the_whole_set(composite: Path) -> None:
    by_first = inspect(composite).to_dict()
    by_second = inspect(composite.with_name(composite.name.replace("00001-of", "00002-of"))).to_dict()
    by_first.pop("source")
    by_second.pop("source")
    assert by_first == by_second


def test_shard_list_has_sizes_and_tensor_counts_of_every_file(composite: Path) -> None:
    summary = inspect(composite)
    files = shard_files(composite)
    assert [s.name for s in summary.shards] == [str(p) for p in files]
    assert [s.size for s in summary.shards] == [p.stat().st_size for p in files]
    assert [s.tensors for s in summary.shards] == [len(GGUFReader(p).tensors) for p in files]
    assert [(s.split_no, s.split_count, s.split_tensors_count) for s in summary.shards] == [
        (0, 3, 44), (1, 3, 44), (2, 3, 44),
    ]
    assert summary.tensor_count == 44
    assert summary.total_size == sum(p.stat().st_size for p in files)
    assert summary.problems == ()


def test_type_histogram_counts_tensors_and_bytes_per_type(composite: Path) -> None:
    expected: dict[str, list[int]] = {}
    for path in shard_files(composite):
        for t in GGUFReader(path).tensors:
            entry = expected.setdefault(t.tensor_type.name, [0, 0])
            entry[0] += 1
            entry[1] += int(t.n_bytes)
    summary = inspect(composite)
    assert {u.type_name: [u.count, u.nbytes] for u in summary.types} == expected
    assert [u.nbytes for u in summary.types] == sorted((u.nbytes for u in summary.types), reverse=True)
    assert {"Q4_K", "Q6_K", "Q8_0", "IQ4_XS", "BF16", "F32"} <= set(expected)


def test_hybrid_layer_kinds_come_from_the_per_layer_arrays(composite: Path) -> None:
    summary = inspect(composite)
    assert summary.layer_kinds == ("M", "*", "E", "*E")
    assert "layers: M*E (1 M recurrent, 1 * attention, 1 E MoE) + NextN *E" in summary.describe()


def test_layer_kinds_of_a_longer_pattern(tmp_path: Path) -> None:
    target = write_target(tmp_path, pattern="MEM*EMM*E", name="hybrid")
    assert "".join(inspect(target).layer_kinds or ()) == "MEM*EMM*E"


def test_non_hybrid_model_has_no_layer_kinds(glm_target: Path) -> None:
    assert inspect(glm_target).layer_kinds is None


def test_alignment_is_reported(nemotron_single: Path, nemotron_split: Path) -> None:
    assert inspect(nemotron_single).alignment == 64
    assert inspect(nemotron_split).alignment == 32


def test_model_written_with_its_nextn_block_has_mtp(tmp_path: Path) -> None:
    summary = inspect(write_target(tmp_path, family=GLM4MOE, with_nextn=True))
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.2)"


def test_tensors_option_lists_every_tensor_with_its_shard(composite: Path) -> None:
    summary = inspect(composite, tensors=True)
    assert summary.tensors is not None
    rows = {t.name: t for t in summary.tensors}
    for number, path in enumerate(shard_files(composite), start=1):
        for t in GGUFReader(path).tensors:
            row = rows[t.name]
            assert (row.shard, row.type_name, row.shape, row.nbytes) == (
                number, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes),
            )
    assert len(rows) == 44
    assert inspect(composite).tensors is None


# ---------------------------------------------------------------------------------------- broken models


def test_missing_nextn_tensor_gives_declared_but_missing(composite: Path, tmp_path: Path) -> None:
    broken = copy_model(composite, tmp_path / "broken")
    _rewrite(shard_files(composite)[-1], shard_files(broken)[-1], drop=("blk.3.nextn.eh_proj.weight",))
    summary = inspect(broken)
    assert summary.mtp_verdict == "MTP: declared but tensors missing"
    assert summary.nextn_missing == {3: ("blk.3.nextn.eh_proj.weight",)}
    assert "  blk.3 lacks nextn.eh_proj.weight" in summary.describe()


def test_stale_split_tensors_count_in_one_shard_is_reported_not_raised(composite: Path, tmp_path: Path) -> None:
    broken = copy_model(composite, tmp_path / "broken")
    second = shard_files(broken)[1]
    stale = encode_kv("split.tensors.count", GGUFValueType.INT32, 26)
    _rewrite(shard_files(composite)[1], second, kvs={"split.tensors.count": stale})
    summary = inspect(broken)
    assert summary.problems == (
        f"shard 2 ({second.name}): split.tensors.count = 26, but the 3 shards hold 44 tensors",
    )
    assert summary.mtp_verdict == "MTP: yes (1 block, blk.3)"
    assert "problems (1):" in summary.describe()


def test_missing_middle_shard_is_reported(composite: Path, tmp_path: Path) -> None:
    broken = copy_model(composite, tmp_path / "broken")
    second = shard_files(composite)[1].name
    (broken.parent / second).unlink()
    summary = inspect(broken)
    assert f"shard 2 ({second}) is missing (3 files expected)" in summary.problems
    assert summary.shards[1].size is None
    assert any("MISSING" in line for line in summary.describe())


def test_unextended_per_layer_array_is_reported(composite: Path, tmp_path: Path) -> None:
    broken = copy_model(composite, tmp_path / "broken")
    key = f"{ARCH}.feed_forward_length"
    _rewrite(composite, broken, kvs={key: encode_kv(key, GGUFValueType.ARRAY, [0, 0, 256], GGUFValueType.INT32)})
    problems = inspect(broken).problems
    assert f"{key} has 3 entries, but block_count is 4 (not extended for the NextN block)" in problems


def test_not_a_gguf_file_is_one_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(BadGGUFError, match=r"model\.gguf: not a GGUF file"):
        inspect(bogus)


def test_unreadable_shard_of_a_set_is_one_clear_error(nemotron_split: Path, tmp_path: Path) -> None:
    broken = copy_model(nemotron_split, tmp_path / "broken")
    third = shard_files(broken)[2]
    third.write_bytes(third.read_bytes()[:300])  # cut inside its tensor table
    with pytest.raises(BadGGUFError, match=rf"{third.name}: truncated in the tensor table"):
        inspect(broken)


# ---------------------------------------------------------------------------------------------- the CLI


def test_cli_json_report_is_the_summary(composite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(composite), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads(json.dumps(inspect(composite).to_dict()))
    assert report["mtp_verdict"] == "MTP: yes (1 block, blk.3)"
    assert report["layer_kinds"] == "M*E[*E]"
    assert [f["tensors"] for f in report["files"]] == [9, 9, 26]


def test_cli_text_report_ends_with_the_verdict(nemotron_split: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(nemotron_split), "--tensors"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "MTP: no"
    assert "consistency: ok" in out
    assert any(line.strip().startswith("blk.1.attn_q.weight") and "Q4_K" in line for line in out)


def test_cli_bad_file_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.gguf"
    assert main(["inspect", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"gguf-mtp: error: {missing}: no such file\n"


def test_inspect_never_writes(composite: Path, tmp_path: Path) -> None:
    folder = copy_model(composite, tmp_path / "copy").parent
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}
    inspect(folder / composite.name, tensors=True)
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()} == before
    shutil.rmtree(folder)


def test_a_named_pipe_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(BadGGUFError, match=r"model\.gguf: is not a regular file"):
        inspect(fifo)
