"""Files made by llama.cpp's own tools: ``llama-gguf-split`` (built from the llama.cpp vendored in the pinned
llama-cpp-python, see scripts/build_llama_tools.py) merges and re-splits, and a vocab-only file written the way
llama.cpp's converter writes one. gguf-mtp must accept what llama.cpp accepts (issue 11, item 12)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import gguf
import pytest
from support.helpers import reader_kvs, reader_tensors, shard_files

from gguf_mtp import compose
from gguf_mtp.check.inspect import inspect
from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.check.verify import same_ggml_shape, verify
from gguf_mtp.cli import main
from gguf_mtp.format.header import TensorInfo, read_header, serialize_header
from gguf_mtp.testing.tiny_models import write_draft


def _gguf_split(tool: Path, *args: str | Path) -> None:
    proc = subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"llama-gguf-split {' '.join(map(str, args))}: {proc.stdout[-1500:]}{proc.stderr}"


def _merge(tool: Path, first: Path, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    _gguf_split(tool, "--merge", first, out)
    return out


def _split(tool: Path, src: Path, prefix: Path, *flags: str) -> Path:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    _gguf_split(tool, "--split", *flags, src, prefix)
    found = sorted(prefix.parent.glob(prefix.name + "-00001-of-*.gguf"))
    assert len(found) == 1, list(prefix.parent.iterdir())
    return found[0]


def _split_kvs(path: Path) -> dict[str, int]:
    return {k: int(v[1]) for k, v in reader_kvs(path).items() if k.startswith("split.")}


def _with_trailing_unit_dim(src: Path, dst: Path) -> tuple[Path, str]:
    """Copy ``src`` with its first 1-D block tensor written as ``[n, 1]`` (as upstream's converter writes
    e.g. Qwen3.5's ``ffn_gate_inp_shexp``); same bytes. Returns the copy and the tensor's name."""
    header = read_header(src)
    name = next(t.name for t in header.tensors if t.name.startswith("blk.") and len(t.shape) == 1)
    tensors = [
        TensorInfo(t.name, (*t.shape, 1), t.ggml_type, t.offset, t.nbytes) if t.name == name else t
        for t in header.tensors
    ]
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(serialize_header(header.version, list(header.kvs.values()), tensors, header.alignment))
        fin.seek(header.data_offset)
        fout.write(fin.read())
    return dst, name


def test_same_ggml_shape_ignores_trailing_ones_only() -> None:
    assert same_ggml_shape((512, 1), (512,)) and same_ggml_shape((512,), (512, 1, 1))
    assert same_ggml_shape((4, 8), (4, 8))
    assert not same_ggml_shape((1, 512), (512,))  # a leading 1 is a different tensor
    assert not same_ggml_shape((512, 2), (512,))


# ------------------------------------------------------------------------------------ (a) --merge


@pytest.fixture(scope="module")
def merged_trunk(gguf_split_tool: Path, nemotron_split: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _merge(gguf_split_tool, nemotron_split, tmp_path_factory.mktemp("merge") / "trunk-merged.gguf")


def test_merge_writes_split_count_zero_and_the_same_tensors(merged_trunk: Path, nemotron_split: Path) -> None:
    assert _split_kvs(merged_trunk) == {"split.no": 0, "split.count": 0, "split.tensors.count": 44 - 18}
    assert reader_tensors(merged_trunk) == reader_tensors(nemotron_split)


def test_inspect_accepts_a_merged_file(merged_trunk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = inspect(merged_trunk)
    assert summary.problems == ()
    assert (len(summary.shards), summary.tensor_count, summary.nextn_blocks) == (1, 26, ())
    assert main(["inspect", str(merged_trunk)]) == 0
    out = capsys.readouterr().out
    assert "MTP: no" in out and "consistency: ok" in out and "problems" not in out


def test_compose_and_verify_accept_a_merged_target(
    merged_trunk: Path, nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    report = compose(merged_trunk, nemotron_draft0, tmp_path / "out")
    assert [p.name for p in report.output_paths] == ["trunk-merged.gguf"]
    checked = verify(report.output_paths[0], target=merged_trunk, draft=nemotron_draft0, llama=False, progress=False)
    assert checked.ok, checked.describe()
    # the merged target's tensors are the 3-shard trunk's, byte for byte
    composite = reader_tensors(report.output_paths[0])
    trunk = reader_tensors(nemotron_split)
    assert {k: composite[k] for k in trunk} == trunk


def test_a_merged_composite_verifies_against_its_inputs(
    gguf_split_tool: Path, nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    composite = compose(nemotron_split, nemotron_draft0, tmp_path / "comp").output_paths[0]
    merged = _merge(gguf_split_tool, composite, tmp_path / "merged" / "comp.gguf")
    assert _split_kvs(merged)["split.count"] == 0
    checked = verify(merged, target=nemotron_split, draft=nemotron_draft0, llama=False, progress=False)
    assert checked.ok, checked.describe()
    assert inspect(merged).has_mtp


@pytest.mark.llama
def test_llama_cpp_runs_the_merged_composite(
    gguf_split_tool: Path, nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    composite = compose(nemotron_split, nemotron_draft0, tmp_path / "comp").output_paths[0]
    merged = _merge(gguf_split_tool, composite, tmp_path / "merged" / "comp.gguf")
    check = check_with_llama(merged)
    assert check.ok and (check.n_layer, check.n_layer_nextn) == (3, 1), check.summary()


# --------------------------------------------------------------------- (b) --split of a composite, [n, 1]


@pytest.fixture(scope="module")
def unit_dim_case(
    nemotron_split: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, str]:
    """A composite whose draft carries an ``[n, 1]`` tensor: (composite shard 1, draft, that tensor's name)."""
    base = tmp_path_factory.mktemp("unit")
    plain = write_draft(base / "draft-plain.gguf", block=0, with_globals=True)
    draft, name = _with_trailing_unit_dim(plain, base / "draft.gguf")
    composite = compose(nemotron_split, draft, base / "comp").output_paths[0]
    return composite, draft, name


def _shape_of(first: Path, name: str) -> tuple[int, ...]:
    for path in shard_files(first):
        for t in read_header(path).tensors:
            if t.name == name:
                return t.shape
    raise AssertionError(f"{name} not found")


@pytest.mark.parametrize(
    "flags",
    [("--split-max-tensors", "20"), ("--split-max-tensors", "15", "--no-tensor-first-split")],
    ids=["by-tensors", "metadata-only-first"],
)
def test_a_re_split_composite_verifies(
    gguf_split_tool: Path,
    unit_dim_case: tuple[Path, Path, str],
    nemotron_split: Path,
    tmp_path: Path,
    flags: tuple[str, ...],
    request: pytest.FixtureRequest,
) -> None:
    composite, draft, name = unit_dim_case
    nextn_name = name.replace("blk.0.", "blk.3.")  # the draft's blk.0 is the composite's NextN block blk.3
    assert len(_shape_of(composite, nextn_name)) == 2
    # gguf-split --split reads one file: merge the 3-shard composite, then split it another way
    merged = _merge(gguf_split_tool, composite, tmp_path / "merged" / "comp.gguf")
    assert len(_shape_of(merged, nextn_name)) == 1  # gguf-split drops the trailing 1 (ggml_n_dims)
    checked = verify(merged, target=nemotron_split, draft=draft, llama=False, progress=False)
    assert checked.ok, checked.describe()
    first = _split(gguf_split_tool, merged, tmp_path / "resplit" / "comp", *flags)
    assert len(shard_files(first)) == {"by-tensors": 3, "metadata-only-first": 4}[request.node.callspec.id]
    assert len(_shape_of(first, nextn_name)) == 1
    checked = verify(first, target=nemotron_split, draft=draft, llama=False, progress=False)
    assert checked.ok, checked.describe()
    assert reader_tensors(first) == reader_tensors(merged)


def test_verify_still_fails_a_real_shape_change(unit_dim_case: tuple[Path, Path, str], tmp_path: Path) -> None:
    """The trailing-1 rule must not hide a real difference: [n, 2] (same bytes count halved) is a mismatch."""
    composite, draft, name = unit_dim_case
    header = read_header(draft)
    tensors = [
        TensorInfo(t.name, (t.shape[0] // 2, 2), t.ggml_type, t.offset, t.nbytes) if t.name == name else t
        for t in header.tensors
    ]
    bad = tmp_path / "draft-2.gguf"
    with open(draft, "rb") as fin, open(bad, "wb") as fout:
        fout.write(serialize_header(header.version, list(header.kvs.values()), tensors, header.alignment))
        fin.seek(header.data_offset)
        fout.write(fin.read())
    checked = verify(composite, draft=bad, llama=False, progress=False)
    assert not checked.ok
    assert any("in the composite" in line and name.split(".", 2)[2] in line for line in checked.describe())


# ------------------------------------------------------------------------------------ (c) vocab-only


def _vocab_only(path: Path) -> Path:
    """A vocab-only GGUF as convert_hf_to_gguf.py --vocab-only writes it: GGUFWriter, KVs, no tensors,
    header then KV data then close (no tensor-info padding to the alignment)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny vocab")
    writer.add_block_count(2)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    tokens = ["<|endoftext|>", "a", "b", "ab", "Ġa"]
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (len(tokens) - 1))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.write_header_to_file(path=path)
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_inspect_accepts_a_vocab_only_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _vocab_only(tmp_path / "ggml-vocab-tiny.gguf")
    header = read_header(path)
    assert header.tensors == () or list(header.tensors) == []
    assert path.stat().st_size < header.data_offset  # the case: the file ends before the aligned data offset
    assert len(gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].data) == 5  # gguf-py reads it too
    summary = inspect(path)
    assert summary.problems == ()
    assert (summary.architecture, summary.tensor_count, summary.block_count) == ("llama", 0, 2)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "MTP: no" in out and "truncated" not in out
