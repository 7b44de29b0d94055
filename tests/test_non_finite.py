"""Non-finite data and ``--outtype`` (issue 29, items 1 and 19).

What llama-quantize refuses is refused, in one line naming the tensor, with nothing written: a NaN or an infinity in
the values it would quantize (it loads with ``check_tensors``: "tensor ... has invalid data"), a NaN or infinite
Q8_0 block scale in a source it re-quantizes, and finite values whose blocks overflow the type ("quantized data
validation failed"). llama.cpp's own ``llama-quantize`` is the oracle that refuses the same files. What llama.cpp's
converter writes (f32, f16, bf16, q8_0 from a checkpoint) is written as its code writes it, NaN included. llama.cpp's
own "found tensors with invalid data" comes with the tensors' names.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants
from support.convert_support import raw_tensor, rewrite_checkpoint_tensor
from support.helpers import reader_tensors

from gguf_mtp.cli import main
from gguf_mtp.format import quantize
from gguf_mtp.format.header import read_header, tensor_nbytes
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.extract import extract
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import NEMOTRON_H_MOE, write_target

NEXTN = f"blk.{len(NEMOTRON_H_MOE.default_pattern)}."
MATRIX = NEXTN + "attn_q.weight"  # BF16 in the full model, rows of 256: every type applies without a fallback
ROW, COLUMN = 3, 5
#: The 16-bit patterns poked into a BF16 element (BF16) or a Q8_0 block's F16 scale (F16).
BF16_BITS = {"nan": 0x7FC0, "inf": 0x7F80}
F16_BITS = {"nan": 0x7E00, "inf": 0x7C00}
SAID = {"nan": "a NaN", "inf": "an infinity"}


def _poke(path: Path, tensor: str, offset: int, data: bytes) -> None:
    """Overwrite bytes of ``tensor``'s data at ``offset`` (from the tensor's first byte) in GGUF ``path``."""
    header = read_header(path)
    info = next(t for t in header.tensors if t.name == tensor)
    with open(path, "r+b") as f:
        f.seek(header.data_offset + info.offset + offset)
        f.write(data)


def _bf16_element(path: Path, tensor: str, row: int, column: int, bits: int) -> None:
    info = next(t for t in read_header(path).tensors if t.name == tensor)
    assert info.type_name == "BF16"
    _poke(path, tensor, (row * info.shape[0] + column) * 2, bits.to_bytes(2, "little"))


def _bf16_of(value: float) -> int:
    return int(np.array([value], np.float32).view(np.uint32)[0] >> 16)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("non-finite")
    full = write_target(root / "full", quant="BF16", with_nextn=True, name="full")
    target = write_target(root / "target", quant="Q8_0", name="target")
    q8 = extract(full, root / "q8.gguf", outtype="q8_0", progress=False).output  # a Q8_0 NextN block
    return {"full": full, "target": target, "q8": q8}


def _copy(source: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(source, folder / source.name))


def _refused(argv: list[str], output: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command line; assert one line on stderr, exit status 2, and nothing at or under ``output``."""
    assert main([*argv, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not output.exists() or (output.is_dir() and not any(output.iterdir())), list(output.parent.iterdir())
    assert not [p for p in output.parent.rglob("*") if "partial" in p.name]
    return err


def _llama_quantize(tool: Path, source: Path, output: Path, qtype: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), "--pure", "--allow-requantize", str(source), str(output), qtype.upper()],
                          capture_output=True, text=True, check=False)


# ------------------------------------------------------------------------ the rows llama-quantize refuses


def test_checked_rows_refuse_nan_and_infinity_naming_the_first_row() -> None:
    values = np.zeros((6, 64), np.float32)
    values[4, 7] = np.inf
    values[5, 0] = np.nan
    with pytest.raises(quantize.InvalidRowsError) as caught:
        quantize.from_f32(values, Q.Q8_0, checked=True)
    assert (caught.value.row, caught.value.problem) == (4, "an infinity")
    assert "tensor 'x' holds an infinity (row 14)" in caught.value.describe("x", first_row=10)
    assert quantize.from_f32(values[:4], Q.Q8_0, checked=True).tobytes() == quantize.from_f32(values[:4],
                                                                                              Q.Q8_0).tobytes()


@pytest.mark.parametrize(("qtype", "fits", "overflows"), [(Q.Q8_0, 1e6, 1e7), (Q.F16, 6e4, 7e4), (Q.Q4_0, 1e5, 1e6)])
def test_finite_values_whose_blocks_overflow_the_type_are_refused(qtype: Q, fits: float, overflows: float) -> None:
    """Q8_0's scale is the block's largest magnitude / 127 in F16 (at most 65504): 1e7 overflows it, 1e6 does not."""
    values = np.full((3, 64), 0.5, np.float32)
    values[1, 9] = fits
    assert np.isfinite(quantize.to_f32(quantize.from_f32(values, qtype, checked=True), qtype, values.size)).all()
    values[2, 3] = overflows
    with pytest.raises(quantize.InvalidRowsError) as caught:
        quantize.from_f32(values, qtype, checked=True)
    assert caught.value.row == 2 and f"more than {qtype.name} holds" in caught.value.problem


def test_the_converter_writes_non_finite_values_as_gguf_pys_code_does() -> None:
    """llama.cpp's converter quantizes with gguf-py's ``quants.quantize`` and refuses nothing: NaN and infinity are
    written, byte for byte as that code writes them (ggml may encode them otherwise)."""
    values = (np.random.default_rng(3).standard_normal((4, 64)) * 0.1).astype(np.float32)
    values[1, 2], values[3, 40] = np.nan, -np.inf
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0):
        with np.errstate(all="ignore"):
            want = np.ascontiguousarray(gguf_quants.quantize(values, qtype)).view(np.uint8).tobytes()
        assert quantize.converter_rows(values, qtype).tobytes() == want, qtype.name


# ----------------------------------------------------------------------- compose, graft, extract: GGUF sources


@pytest.mark.llama
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_head_value_is_refused_by_llama_quantize_and_by_every_command(
    models: dict[str, Path], value: str, llama_quantize_tool: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    full = _copy(models["full"], tmp_path / "in")
    _bf16_element(full, MATRIX, ROW, COLUMN, BF16_BITS[value])
    oracle = _llama_quantize(llama_quantize_tool, full, tmp_path / "oracle.gguf", "q4_k")
    assert oracle.returncode != 0 and f"tensor '{MATRIX}' has invalid data" in oracle.stdout + oracle.stderr

    said = f"tensor '{MATRIX}' holds {SAID[value]} (row {ROW}): llama-quantize refuses to quantize it"
    draft = extract(full, tmp_path / "draft.gguf", progress=False).output  # no outtype: a copy, as it is
    for argv, output in (
        (["extract", str(full), "-o", str(tmp_path / "x.gguf"), "--outtype", "q4_k"], tmp_path / "x.gguf"),
        (["compose", str(models["target"]), str(draft), "-o", str(tmp_path / "c"), "--outtype", "q4_k"],
         tmp_path / "c"),
        (["graft", "--from", str(full), "--into", str(models["target"]), "-o", str(tmp_path / "g"), "--outtype",
          "q8_0", "--no-verify"], tmp_path / "g"),
    ):
        err = _refused(argv, output, capsys)
        assert said in err, (argv[0], err)


@pytest.mark.llama
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_q8_0_block_scale_is_refused_when_requantized(
    models: dict[str, Path], value: str, llama_quantize_tool: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    q8 = _copy(models["q8"], tmp_path / "in")
    info = next(t for t in read_header(q8).tensors if t.name == MATRIX)
    assert info.type_name == "Q8_0"
    row_bytes = tensor_nbytes((info.shape[0],), Q.Q8_0)
    _poke(q8, MATRIX, ROW * row_bytes + 34 * 2, F16_BITS[value].to_bytes(2, "little"))  # block 2's scale of row 3
    oracle = _llama_quantize(llama_quantize_tool, q8, tmp_path / "oracle.gguf", "q4_0")
    assert oracle.returncode != 0 and f"tensor '{MATRIX}' has invalid data" in oracle.stdout + oracle.stderr

    err = _refused(["extract", str(q8), "-o", str(tmp_path / "x.gguf"), "--outtype", "q4_0"], tmp_path / "x.gguf",
                   capsys)
    # an infinite scale times a zero code reads back as NaN, times any other as an infinity: the row holds a NaN
    assert f"{q8}: tensor '{MATRIX}' holds a NaN (row {ROW}): llama-quantize refuses" in err


@pytest.mark.llama
def test_values_that_overflow_the_type_are_refused_as_llama_quantize_refuses_them(
    models: dict[str, Path], llama_quantize_tool: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    full = _copy(models["full"], tmp_path / "in")
    _bf16_element(full, MATRIX, ROW, COLUMN, _bf16_of(1e6))  # Q8_0's scale 1e6/127 fits F16: written
    fits = extract(full, tmp_path / "fits.gguf", outtype="q8_0", progress=False).output
    oracle = _llama_quantize(llama_quantize_tool, full, tmp_path / "oracle.gguf", "q8_0")
    assert oracle.returncode == 0, oracle.stderr[-2000:]
    assert reader_tensors(fits)[MATRIX] == reader_tensors(tmp_path / "oracle.gguf")[MATRIX]

    _bf16_element(full, MATRIX, ROW, COLUMN, _bf16_of(1e7))  # 1e7/127 does not
    refused = _llama_quantize(llama_quantize_tool, full, tmp_path / "oracle-2.gguf", "q8_0")
    assert refused.returncode != 0 and "quantized data validation failed" in refused.stdout + refused.stderr
    err = _refused(["extract", str(full), "-o", str(tmp_path / "x.gguf"), "--outtype", "q8_0"], tmp_path / "x.gguf",
                   capsys)
    assert (f"tensor '{MATRIX}' holds values up to 9.96147e+06, more than Q8_0 holds (row {ROW}): llama-quantize "
            "refuses to quantize it (\"quantized data validation failed\")") in err


@pytest.mark.llama
def test_llama_cpps_invalid_data_refusal_names_the_tensor(models: dict[str, Path], tmp_path: Path) -> None:
    from gguf_mtp.check.llama_check import check_with_llama

    full = _copy(models["full"], tmp_path / "in")
    _bf16_element(full, MATRIX, ROW, COLUMN, BF16_BITS["nan"])
    check = check_with_llama(full)
    assert not check.ok
    assert check.error == f"found tensors with invalid data (NaN or infinity): {MATRIX}", check.error


# ---------------------------------------------------------------------------------------- convert: checkpoints

CHECKPOINT_MATRIX = "mtp.layers.0.mixer.q_proj.weight"


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_mtpv2_checkpoint(tmp_path_factory.mktemp("nan-ckpt") / "head")
    dtype, shape, raw = raw_tensor(folder, CHECKPOINT_MATRIX)
    assert dtype == "BF16"
    bits = np.frombuffer(raw, np.uint16).copy().reshape(shape)
    bits[ROW, COLUMN], bits[ROW + 2, 0] = BF16_BITS["nan"], BF16_BITS["inf"]
    rewrite_checkpoint_tensor(folder, CHECKPOINT_MATRIX, data=bits.tobytes())
    return folder


@pytest.mark.llama
@pytest.mark.parametrize("outtype", ["q4_k", "q4_0"])
def test_convert_refuses_a_non_finite_checkpoint_value_for_llama_quantizes_types(
    nan_checkpoint: Path, outtype: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.gguf"
    err = _refused(["convert", str(nan_checkpoint), "-o", str(out), "--block", "3", "--outtype", outtype], out, capsys)
    assert f"tensor '{CHECKPOINT_MATRIX}' holds a NaN (row {ROW}): llama-quantize refuses to quantize it" in err


@pytest.mark.parametrize("outtype", [None, "f32", "f16", "bf16", "q8_0"])
def test_convert_writes_non_finite_values_as_llama_cpps_converter_does(
    nan_checkpoint: Path, outtype: str | None, tmp_path: Path
) -> None:
    out = convert(nan_checkpoint, tmp_path / "d.gguf", block=3, outtype=outtype, progress=False).output
    qtype, _, data = reader_tensors(out)["blk.3.attn_q.weight"]
    _, shape, raw = raw_tensor(nan_checkpoint, CHECKPOINT_MATRIX)
    values = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if outtype is None:  # BF16 copied as it is
        assert (qtype, data) == (Q.BF16, raw)
        return
    with np.errstate(all="ignore"):
        want = np.ascontiguousarray(gguf_quants.quantize(values, Q[outtype.upper()])).view(np.uint8).tobytes()
    assert (qtype, data) == (Q[outtype.upper()], want)
    back = quantize.to_f32(np.frombuffer(data, np.uint8), qtype, values.size).reshape(shape)
    assert np.isnan(back[ROW]).any() and not np.isfinite(back[ROW + 2]).all()


@pytest.mark.upstream
@pytest.mark.parametrize("outtype", ["q8_0", "f16"])
def test_non_finite_values_are_written_as_upstreams_converter_writes_them(
    tmp_path_factory: pytest.TempPathFactory, outtype: str
) -> None:
    from support.qwen_checkpoints import N_TRUNK, QwenDims, write_qwen_checkpoint
    from support.upstream import upstream_convert, write_gpt2_tokenizer

    work = tmp_path_factory.mktemp(f"up-non-finite-{outtype}")
    folder = write_qwen_checkpoint(work / "hf", "qwen35moe", conditional=False, packed=False, d=QwenDims(n_vocab=256))
    name = "mtp.layers.0.self_attn.q_proj.weight"
    _, shape, raw = raw_tensor(folder, name)
    bits = np.frombuffer(raw, np.uint16).copy().reshape(shape)
    bits[ROW, COLUMN], bits[ROW + 2, 0] = BF16_BITS["nan"], BF16_BITS["inf"]
    rewrite_checkpoint_tensor(folder, name, data=bits.tobytes())
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = write_gpt2_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(config))
    theirs = reader_tensors(upstream_convert(folder, work / "mtp.gguf", "--mtp", outtype=outtype))
    ours = reader_tensors(convert(folder, work / "d.gguf", block=N_TRUNK, outtype=outtype, progress=False).output)
    prefix = f"blk.{N_TRUNK}."
    mtp = {n: t for n, t in theirs.items() if n.startswith(prefix)}
    assert sorted(n for n in ours if n.startswith(prefix)) == sorted(mtp)
    for tensor_name, tensor in mtp.items():
        assert ours[tensor_name] == tensor, f"{tensor_name} differs from llama.cpp's converter"
    q = ours[f"{prefix}attn_q.weight"]
    assert not np.isfinite(quantize.to_f32(np.frombuffer(q[2], np.uint8), q[0], bits.size)).all()
