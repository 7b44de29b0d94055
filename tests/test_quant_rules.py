"""llama-quantize --pure's type rules (gguf_mtp.format.quant_rules): one test per fallback rule and per kind of
tensor it never quantizes, the ``outtype`` names and refusals, and the rule table checked line by line against
the llama-quant.cpp it cites (the copy vendored in the pinned llama-cpp-python sdist)."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from support.helpers import build_llama_tools
from support.session import IN_CI

from gguf_mtp.constants import OUTTYPE_NAMES
from gguf_mtp.errors import ParameterError
from gguf_mtp.format.quant_rules import (
    FALLBACKS,
    HEAD_TYPES,
    NEVER_QUANTIZED,
    head_tensor_type,
    head_type,
    kept_by,
    n_dims,
)
from gguf_mtp.format.quantize import from_f32, to_f32
from gguf_mtp.jobs.head_type import low_bit_warning, parse_outtype

EH = "blk.40.nextn.eh_proj.weight"


# ------------------------------------------------------------------------------- fallback rules


@pytest.mark.parametrize(
    ("wanted", "row", "expected"),
    [
        (Q.IQ4_XS, 160, Q.IQ4_NL),  # llama-quant.cpp:410
        (Q.Q2_K, 160, Q.Q4_0),  # :415
        (Q.Q3_K, 160, Q.Q4_0),  # :415
        (Q.Q4_K, 160, Q.Q5_0),  # :416
        (Q.Q5_K, 160, Q.Q5_1),  # :417
        (Q.Q6_K, 160, Q.Q8_0),  # :418
    ],
)
def test_256_block_types_fall_back_to_their_32_block_type(wanted: Q, row: int, expected: Q) -> None:
    assert FALLBACKS[wanted] == expected
    assert head_tensor_type(EH, (row, 512), Q.BF16, wanted) == expected
    assert head_tensor_type(EH, (512, 512), Q.BF16, wanted) == wanted  # rows that fit: no fallback


@pytest.mark.parametrize("wanted", [Q.Q4_K, Q.Q6_K, Q.IQ4_XS, Q.Q2_K])
def test_a_fallback_that_does_not_fit_either_becomes_f16(wanted: Q) -> None:
    assert head_tensor_type(EH, (48, 512), Q.BF16, wanted) == Q.F16  # :438


@pytest.mark.parametrize("wanted", [Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1, Q.IQ4_NL])
def test_32_block_types_keep_their_type_or_become_f16(wanted: Q) -> None:
    assert head_tensor_type(EH, (96, 512), Q.BF16, wanted) == wanted
    assert head_tensor_type(EH, (48, 512), Q.BF16, wanted) == Q.F16  # :420 then :438


@pytest.mark.parametrize("wanted", [Q.F32, Q.F16, Q.BF16])
def test_float_types_take_no_fallback(wanted: Q) -> None:
    assert head_tensor_type(EH, (7, 512), Q.BF16, wanted) == wanted  # :745 (ggml_is_quantized)


def test_an_expert_stack_falls_back_on_its_rows_not_its_expert_count() -> None:
    assert head_tensor_type("blk.3.ffn_down_exps.weight", (160, 512, 8), Q.BF16, Q.Q4_K) == Q.Q5_0
    assert head_tensor_type("blk.3.ffn_down_exps.weight", (512, 160, 8), Q.BF16, Q.Q4_K) == Q.Q4_K


# ----------------------------------------------------------------------- tensors never quantized


@pytest.mark.parametrize(
    ("name", "shape", "line"),
    [
        ("blk.40.nextn.enorm.weight", (512,), 292),  # 1-D
        ("blk.40.attn_q.weight", (512, 1), 292),  # ggml_n_dims ignores trailing 1s
        ("blk.40.exp_probs_b.bias", (8, 8), 297),  # not *weight
        ("blk.40.nextn.shared_head_norm.weight", (512, 2), 300),
        ("blk.40.ffn_gate_inp.weight", (512, 8), 306),
        ("blk.2.ssm_conv1d.weight", (4, 640), 324),
        ("position_embd.weight", (512, 512), 319),
        ("blk.1.time_mix_w1.weight", (512, 512), 352),
    ],
)
def test_tensors_llama_quantize_never_quantizes_keep_their_type(name: str, shape: tuple[int, ...], line: int) -> None:
    why = kept_by(name, shape)
    assert why is not None and why.startswith(f"llama-quant.cpp:{line} ")
    assert head_tensor_type(name, shape, Q.F32, Q.Q4_K) == Q.F32
    assert head_tensor_type(name, shape, Q.BF16, Q.Q8_0) == Q.BF16


def test_architecture_rules_apply_to_their_architecture_only() -> None:
    name = "blk.78.attn_k_b.weight"
    assert head_tensor_type(name, (512, 512), Q.BF16, Q.Q4_K, "glm5-next") == Q.BF16
    assert head_tensor_type(name, (512, 512), Q.BF16, Q.Q4_K, "deepseek2") == Q.Q4_K


def test_n_dims_is_ggmls() -> None:
    assert [n_dims(s) for s in [(5,), (5, 1), (5, 1, 1), (5, 2), (5, 1, 3), (1, 1)]] == [1, 1, 1, 2, 3, 1]


# ---------------------------------------------------------------------------- names and refusals


def test_the_outtype_choices_are_the_head_types() -> None:
    assert tuple(HEAD_TYPES) == OUTTYPE_NAMES
    assert head_type("Q4_K") == head_type("q4_k") == Q.Q4_K


def test_the_command_reference_lists_the_outtype_choices_of_the_one_table() -> None:
    """docs/commands.md's list of ``--outtype`` types is :data:`gguf_mtp.constants.OUTTYPE_NAMES`, in its order
    (issue 33 item 4: one table per fact; the prose copy is checked against it)."""
    page = Path(__file__).resolve().parent.parent / "docs" / "commands.md"
    text = " ".join(page.read_text(encoding="utf-8").split())
    match = re.search(r"TYPE is one of `([a-z0-9_ ]+)`", text)
    assert match is not None, "docs/commands.md no longer says which types --outtype takes"
    assert tuple(match[1].split()) == OUTTYPE_NAMES


@pytest.mark.parametrize("name", ["iq2_xxs", "IQ2_XS", "iq1_s", "iq1_m", "iq2_s", "iq3_xxs"])
def test_importance_matrix_types_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(ParameterError, match=rf"^outtype {name.lower()}: .*importance matrix") as caught:
        parse_outtype(name)
    assert caught.value.parameters == ("outtype",)


def test_an_unknown_type_lists_the_choices() -> None:
    with pytest.raises(ParameterError, match=r"'q4': choose one of f32, .*iq4_nl$"):
        parse_outtype("q4")


def test_only_types_below_q4_k_warn() -> None:
    warned = {t for t in HEAD_TYPES.values() if low_bit_warning(t)}
    assert warned == {Q.Q3_K, Q.Q2_K}
    assert "55.3 %" in (low_bit_warning(Q.Q2_K) or "")


# ------------------------------------------------------------------------ the table vs its source


def _llama_quant_source() -> list[str] | None:
    tools = build_llama_tools()
    try:
        sdist = tools.find_sdist(tools.cache_dir(), download=IN_CI)
    except (tools.BuildError, OSError):
        return None
    with tarfile.open(sdist, "r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("vendor/llama.cpp/src/llama-quant.cpp"))
        data = tar.extractfile(member)
        assert data is not None
        return data.read().decode().splitlines()


@pytest.mark.slow
def test_every_rule_cites_the_line_of_llama_quant_cpp_it_comes_from() -> None:
    lines = _llama_quant_source()
    if lines is None:
        if IN_CI:
            pytest.fail("CI=true: the llama-cpp-python sdist (llama-quant.cpp) is not available")
        pytest.skip("the llama-cpp-python sdist is not in the tools cache")
    # llama.cpp spells these two through its tensor-name table (llama-arch.cpp: "position_embd", "token_types")
    spelled = {"position_embd.weight": "LLM_TENSOR_POS_EMBD", "token_types.weight": "LLM_TENSOR_TOKEN_TYPES"}
    for rule in NEVER_QUANTIZED:
        text = "weight" if rule.how == "not_suffix" else spelled.get(rule.text, f'"{rule.text}"')
        assert text in lines[rule.line - 1], (rule, lines[rule.line - 1])
    assert "ggml_n_dims(tensor) < 2" in lines[292 - 1]
    for wanted, fallback in FALLBACKS.items():
        line = next(i for i, text in enumerate(lines) if f"case GGML_TYPE_{wanted.name}:" in text and i > 390)
        # the case falls through to the first "return_type = ..." at or below it
        target = next(text for text in lines[line:] if "return_type = GGML_TYPE_" in text)
        assert f"GGML_TYPE_{fallback.name};" in target.replace(" ", ""), (wanted, target)
    assert "return_type = GGML_TYPE_F16;" in lines[438 - 1]


# --------------------------------------------------------------------------------- the data path


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.BF16, Q.F16])
def test_ggmls_quantizer_and_gguf_pys_agree_byte_for_byte(qtype: Q) -> None:
    from gguf import quants

    values = (np.random.default_rng(3).standard_normal((8, 256)) * 0.02).astype(np.float32)
    assert from_f32(values, qtype).tobytes() == np.ascontiguousarray(quants.quantize(values, qtype)).tobytes()


def test_dequantizing_widens_bf16_exactly() -> None:
    bits = np.array([0x3F80, 0xBF80, 0x7F80, 0x0001], dtype=np.uint16)
    assert to_f32(bits.view(np.uint8), Q.BF16, 4).tolist()[:3] == [1.0, -1.0, float("inf")]
