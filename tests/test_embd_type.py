"""``--embd-type``: a standalone sidecar's ``token_embd`` and ``output`` in a low-bit type, as upstream recommends.

The oracle is llama.cpp's own ``llama-quantize --token-embedding-type T --output-tensor-type T`` run on the
sidecar written without the option: its ``token_embd``/``output`` must equal ours byte for byte (type, shape,
bytes), every other tensor of ours must be the plain sidecar's, and llama.cpp must still load ours as the
drafter of its target and run the MTP decode (``verify SIDECAR --target MODEL``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gguf_mtp.check.verify import verify
from gguf_mtp.cli import build_parser, main
from gguf_mtp.errors import ParameterError
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.extract import extract
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import GLM4MOE, with_hparams, write_target

EMBEDDINGS = ("token_embd.weight", "output.weight")


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    header = read_header(path)
    with open(path, "rb") as f:
        found = {}
        for t in header.tensors:
            f.seek(header.data_offset + t.offset)
            found[t.name] = (t.type_name, t.shape, f.read(t.nbytes))
    return found


def _llama_quantize(tool: Path, source: Path, output: Path, qtype: str) -> Path:
    done = subprocess.run([str(tool), "--allow-requantize", "--token-embedding-type", qtype, "--output-tensor-type",
                           qtype, str(source), str(output), "Q8_0"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return output


def _assert_like_llama_quantize(ours: Path, plain: Path, oracle: Path, qtype: str) -> None:
    got, want, before = _tensors(ours), _tensors(oracle), _tensors(plain)
    assert sorted(got) == sorted(before)
    for name in EMBEDDINGS:
        assert got[name][0] == qtype.upper() and got[name][:2] == want[name][:2], name
        assert got[name][2] == want[name][2], f"{name}: bytes differ from llama-quantize's"
        assert before[name][0] != qtype.upper()  # the fixture really re-types them
    assert {n: v for n, v in got.items() if n not in EMBEDDINGS} == {
        n: v for n, v in before.items() if n not in EMBEDDINGS}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model with MTP whose token_embd is Q4_K and output Q6_K (a "mixed" quant: both get re-quantized)."""
    return write_target(tmp_path_factory.mktemp("embd"), with_nextn=True, name="Model-UD-MTP", seed=51)


@pytest.mark.llama
@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_extract_embd_type_writes_what_llama_quantize_writes_and_still_drafts(
    model: Path, qtype: str, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    plain = extract(model, tmp_path / "mtp-plain.gguf", standalone=True, progress=False).output
    ours = extract(model, tmp_path / f"mtp-{qtype}.gguf", standalone=True, embd_type=qtype, progress=False).output
    oracle = _llama_quantize(llama_quantize_tool, plain, tmp_path / f"oracle-{qtype}.gguf", qtype)
    _assert_like_llama_quantize(ours, plain, oracle, qtype)
    assert ours.stat().st_size < plain.stat().st_size or qtype == "q8_0"
    report = verify(ours, target=model, llama=True, progress=False)
    assert report.ok and report.sidecar, report.describe()
    assert report.llama is not None and report.llama.mtp_decode_ok, report.describe()


@pytest.mark.llama
def test_convert_standalone_embd_type_writes_what_llama_quantize_writes(
    llama_quantize_tool: Path, tmp_path: Path
) -> None:
    target = write_target(tmp_path / "target", name="target", seed=52)
    head = write_mtpv2_checkpoint(tmp_path / "head")
    plain = convert(head, tmp_path / "plain.gguf", target=target, standalone=True, progress=False).output
    ours = convert(head, tmp_path / "q4_0.gguf", target=target, standalone=True, embd_type="q4_0",
                   progress=False).output
    oracle = _llama_quantize(llama_quantize_tool, plain, tmp_path / "oracle.gguf", "q4_0")
    _assert_like_llama_quantize(ours, plain, oracle, "q4_0")
    report = verify(ours, target=target, llama=True, progress=False)
    assert report.ok and report.llama is not None and report.llama.mtp_decode_ok, report.describe()


def test_embd_type_needs_a_standalone_file_and_a_type_whose_blocks_fit(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ParameterError, match="^embd_type needs standalone: "):
        extract(model, tmp_path / "draft.gguf", embd_type="q4_0", progress=False)
    rc = main(["extract", str(model), "-o", str(tmp_path / "draft.gguf"), "--embd-type", "q4_0"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--embd-type needs --standalone: " in err
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["extract", str(model), "--standalone", "--embd-type", "IQ2_XS"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "argument --embd-type: iq2_xs: llama.cpp only writes it with an importance matrix (llama-quantize --imatrix), "
        "which a sidecar's token_embd and output are not quantized with; choose iq4_xs, q4_k or above")
    assert not any(tmp_path.iterdir())


def test_the_plan_shows_the_embeddings_new_type(model: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["extract", str(model), "-o", str(tmp_path / "mtp.gguf"), "--standalone", "--embd-type", "q8_0",
               "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "token_embd.weight (Q8_0" in out and "output.weight (Q8_0" in out
    assert not (tmp_path / "mtp.gguf").exists()


def test_the_plan_calls_re_typed_embeddings_re_typed_not_the_sources(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["extract", str(model), "-o", str(tmp_path / "mtp.gguf"), "--standalone", "--embd-type", "q8_0",
               "--dry-run"])
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("with ")]
    assert rc == 0 and len(lines) == 2, lines
    assert re.fullmatch(r"with the source's output_norm\.weight \(F32, [^)]*\)", lines[0])
    assert re.fullmatch(r"with token_embd\.weight \(Q8_0, [^,]*, re-typed from the source's Q4_K\), "
                        r"output\.weight \(Q8_0, [^,]*, re-typed from the source's Q6_K\)", lines[1])


@pytest.mark.llama  # the quantizer is asked for before the rows are checked
def test_rows_that_do_not_fit_the_type_are_refused_in_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """llama-quantize applies --token-embedding-type without a fallback (llama-quant.cpp 721-740): a width of 320
    does not split into Q4_K's 256-blocks, so it would fail; so does gguf-mtp, before writing anything."""
    source = write_target(tmp_path / "m", family=GLM4MOE, hparams=with_hparams(n_embd=320, n_ff_exp=160),
                          with_nextn=True, quant="Q8_0", name="narrow")
    out = tmp_path / "mtp.gguf"
    rc = main(["extract", str(source), "-o", str(out), "--standalone", "--embd-type", "q4_k"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and not out.exists()
    assert "--embd-type q4_k: token_embd.weight: rows of 320 do not split into Q4_K's blocks of 256" in err


def test_convert_embd_type_needs_standalone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = write_mtpv2_checkpoint(tmp_path / "head")
    out = tmp_path / "draft.gguf"
    rc = main(["convert", str(head), "-o", str(out), "--block", "3", "--embd-type", "q4_0"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--embd-type needs --standalone: " in err and not out.exists()
