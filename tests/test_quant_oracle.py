"""``--outtype`` against llama.cpp's own ``llama-quantize --pure`` (built from the llama.cpp vendored in the pinned
llama-cpp-python, like the loader): for two families (nemotron_h_moe with rows that are multiples of 256, so
k-quants apply; glm4moe with rows of 320/640/160, so Q4_K, Q6_K and IQ4_XS fall back) and five types, compose,
extract, graft (from a Q8_0 source: requantized) and convert write NextN tensors byte-identical (type, shape,
bytes) to llama-quantize's on the full model; every trunk tensor stays the target's; llama.cpp loads each
composite and runs the MTP decode."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from support.convert_support import raw_tensor
from support.fp8_checkpoints import dequantize_reference, is_linear, quantize_checkpoint

from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.format.header import GGUFHeader, read_header
from gguf_mtp.format.quantize import from_f32, to_f32
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.extract import extract
from gguf_mtp.jobs.graft import graft
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import GLM4MOE, NEMOTRON_H_MOE, TinyFamily, TinyHparams, with_hparams, write_target

pytestmark = pytest.mark.llama

TYPES = ("q8_0", "q6_k", "q4_k", "q5_0", "iq4_xs")

#: family -> (hparams, the trunk's matrix type in the target)
FAMILIES: dict[str, tuple[TinyFamily, TinyHparams, str]] = {
    "nemotron": (NEMOTRON_H_MOE, TinyHparams(), "mixed"),  # every row a multiple of 256
    "glm-fallback": (GLM4MOE, with_hparams(n_embd=320, n_ff_exp=160), "Q8_0"),  # rows of 320, 640, 160
}


def _quantize(tool: Path, source: Path, output: Path, qtype: str) -> Path:
    if not output.exists():
        done = subprocess.run([str(tool), "--pure", "--allow-requantize", str(source), str(output), qtype.upper()],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    return output


def _tensors(path: Path, prefix: str) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (type, shape, bytes) of the tensors whose names start with ``prefix``."""
    header: GGUFHeader = read_header(path)
    found = {}
    with open(path, "rb") as f:
        for t in header.tensors:
            if t.name.startswith(prefix):
                f.seek(header.data_offset + t.offset)
                found[t.name] = (t.type_name, t.shape, f.read(t.nbytes))
    return found


@dataclass(frozen=True)
class Family:
    full: Path  # trunk + NextN block, BF16 matrices (F32 norms): what llama-quantize starts from
    q8_source: Path  # llama-quantize --pure Q8_0 of it: graft's source
    target: Path  # the trunk-only model the head goes into
    draft: Path  # the full model's NextN block, as extract writes it (BF16)
    nextn: str  # "blk.N."
    checkpoint: Path | None  # an HF head of this family, where the tiny checkpoints have one


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           llama_quantize_tool: Path) -> Family:
    arch, hparams, trunk_quant = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    full = write_target(root / "full", family=arch, hparams=hparams, quant="BF16", with_nextn=True, name="full")
    target = write_target(root / "target", family=arch, hparams=hparams, quant=trunk_quant, name="target")
    draft = extract(full, root / "draft.gguf", progress=False).output
    checkpoint = write_mtpv2_checkpoint(root / "head", hparams=hparams) if arch is NEMOTRON_H_MOE else None
    return Family(full, _quantize(llama_quantize_tool, full, root / "full-q8_0.gguf", "q8_0"), target, draft,
                  f"blk.{len(arch.default_pattern)}.", checkpoint)


def _assert_same_nextn(ours: Path, oracle: Path, nextn: str) -> None:
    got, want = _tensors(ours, nextn), _tensors(oracle, nextn)
    assert sorted(got) == sorted(want)
    for name, (qtype, shape, data) in want.items():
        assert got[name][:2] == (qtype, shape), name
        assert got[name][2] == data, f"{name} ({qtype}): bytes differ from llama-quantize's"


def _assert_trunk_kept(composite: Path, target: Path, nextn: str) -> None:
    kept = {k: v for k, v in _tensors(composite, "").items() if not k.startswith(nextn)}
    assert kept == _tensors(target, "")


@pytest.mark.parametrize("qtype", TYPES)
def test_outtype_writes_what_llama_quantize_writes(family: Family, qtype: str, llama_quantize_tool: Path,
                                                    tmp_path: Path) -> None:
    oracle = _quantize(llama_quantize_tool, family.full, family.full.with_name(f"full-{qtype}.gguf"), qtype)

    composite = compose(family.target, family.draft, tmp_path / "compose", outtype=qtype, progress=False)
    _assert_same_nextn(composite.output_paths[0], oracle, family.nextn)
    _assert_trunk_kept(composite.output_paths[0], family.target, family.nextn)
    check = check_with_llama(composite.output_paths[0])
    assert check.ok and check.mtp_decode_ok and check.n_layer_nextn == 1, check.summary()

    drafted = extract(family.full, tmp_path / "extract.gguf", outtype=qtype, progress=False)
    _assert_same_nextn(drafted.output, oracle, family.nextn)

    # From a Q8_0 source llama-quantize needs --allow-requantize: Q8_0 is dequantized first, then quantized.
    requantized = _quantize(llama_quantize_tool, family.q8_source,
                            family.full.with_name(f"q8_0-to-{qtype}.gguf"), qtype)
    grafted = graft(family.q8_source, family.target, tmp_path / "graft", outtype=qtype, verify=False, progress=False)
    _assert_same_nextn(grafted.output_paths[0], requantized, family.nextn)
    _assert_trunk_kept(grafted.output_paths[0], family.target, family.nextn)
    check = check_with_llama(grafted.output_paths[0])
    assert check.ok and check.mtp_decode_ok and check.n_layer_nextn == 1, check.summary()


@pytest.mark.parametrize("family", ["nemotron"], indirect=True)  # the tiny HF checkpoints are nemotron heads
@pytest.mark.parametrize("qtype", ["q6_k", "iq4_xs"])
def test_convert_outtype_writes_what_llama_quantize_writes_of_the_bf16_conversion(
    family: Family, qtype: str, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    assert family.checkpoint is not None
    bf16 = convert(family.checkpoint, tmp_path / "bf16.gguf", target=family.target, progress=False).output
    composed = compose(family.target, bf16, tmp_path / "composite", progress=False).output_paths[0]
    oracle = _quantize(llama_quantize_tool, composed, tmp_path / f"oracle-{qtype}.gguf", qtype)
    ours = convert(family.checkpoint, tmp_path / f"{qtype}.gguf", target=family.target, outtype=qtype,
                   progress=False).output
    _assert_same_nextn(ours, oracle, family.nextn)
    assert read_header(ours).get("general.file_type") == {"q6_k": 18, "iq4_xs": 30}[qtype]


@pytest.mark.parametrize("family", ["nemotron"], indirect=True)
@pytest.mark.parametrize("qtype", ["q4_0", "q4_k"])
def test_convert_of_an_fp8_head_writes_what_llama_quantize_writes_of_the_converters_bf16_output(
    family: Family, qtype: str, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    """The user's other path: llama.cpp's converter (BF16 for an FP8 release: its --outtype auto), then llama-quantize
    --pure. Its bytes are ours: the dequantized FP8 values are rounded to BF16 before they are quantized."""
    assert family.checkpoint is not None
    fp8 = quantize_checkpoint(family.checkpoint, tmp_path / "fp8",
                              quantized=lambda name, shape: is_linear(name, shape) and not name.endswith("gate.weight"))
    default = convert(fp8, tmp_path / "bf16.gguf", target=family.target, progress=False).output
    assert _tensors(default, family.nextn)[f"{family.nextn}attn_q.weight"][0] == "BF16"
    composed = compose(family.target, default, tmp_path / "composite", progress=False).output_paths[0]
    oracle = _quantize(llama_quantize_tool, composed, tmp_path / f"oracle-{qtype}.gguf", qtype)
    ours = convert(fp8, tmp_path / f"{qtype}.gguf", target=family.target, outtype=qtype, progress=False).output
    _assert_same_nextn(ours, oracle, family.nextn)

    # the rounding matters: quantizing the unrounded float32 dequantization gives other bytes
    codes = raw_tensor(fp8, "mtp.layers.0.mixer.q_proj.weight")
    scales = raw_tensor(fp8, "mtp.layers.0.mixer.q_proj.weight_scale_inv")
    values = dequantize_reference(codes[2], codes[1], np.frombuffer(scales[2], np.float32).reshape(scales[1]),
                                  (128, 128))
    rounded = to_f32(from_f32(values, Q.BF16), Q.BF16, values.size).reshape(values.shape)
    assert from_f32(values, Q[qtype.upper()]).tobytes() != from_f32(rounded, Q[qtype.upper()]).tobytes()


def test_the_fallback_family_really_falls_back(family: Family, llama_quantize_tool: Path) -> None:
    """The glm4moe fixture must exercise the fallbacks (else the test above proves less than it says)."""
    oracle = _quantize(llama_quantize_tool, family.full, family.full.with_name("full-q4_k.gguf"), "q4_k")
    types = {t for t, _, _ in _tensors(oracle, family.nextn).values()}
    if family.checkpoint is None:
        assert Q.Q5_0.name in types and Q.Q4_K.name in types
    else:
        assert types == {"Q4_K", "F32"}


@pytest.mark.parametrize("qtype", ["q4_k", "q8_0"])
def test_rows_that_fit_no_block_become_f16_as_llama_quantize_makes_them(
    qtype: str, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    """Expert rows of 48 split into neither 256- nor 32-element blocks: llama-quant.cpp:438 makes them F16."""
    full = write_target(tmp_path, family=GLM4MOE, hparams=with_hparams(n_embd=320, n_ff_exp=48), quant="BF16",
                        with_nextn=True, name="full")
    oracle = _quantize(llama_quantize_tool, full, tmp_path / f"oracle-{qtype}.gguf", qtype)
    nextn = f"blk.{len(GLM4MOE.default_pattern)}."
    assert "F16" in {t for t, _, _ in _tensors(oracle, nextn).values()}
    ours = extract(full, tmp_path / "extract.gguf", outtype=qtype, progress=False).output
    _assert_same_nextn(ours, oracle, nextn)
