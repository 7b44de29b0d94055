"""convert: a synthetic NVIDIA-style MTPv2 head -> a GGUF draft, checked tensor by tensor and value by value.

The expected names come from docs/families.md's table of Nemotron 3 Super's head, the expected bytes from the
checkpoint read naively (``convert_support``), the output through gguf-py's own ``GGUFReader`` (``helpers``).
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from support.convert_support import as_f32, raw_tensor
from support.helpers import file_hashes, reader_kvs, reader_tensors

from gguf_mtp.cli import main
from gguf_mtp.conversion import get_model_class, model_class_for_arch, supported_architectures, tensor_segments
from gguf_mtp.errors import GGUFMTPError, IncompatibleDraftError, UnsafeOutputError
from gguf_mtp.files.plan import CopyRange, Generated
from gguf_mtp.format.safetensors_io import open_checkpoint
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import GLM4MOE, TinyHparams, with_hparams, write_target

HP = TinyHparams()
ARCH = "nemotron_h_moe"
BLOCK = 3  # the conftest targets have the trunk pattern M*E
Q = GGMLQuantizationType

#: docs/families.md's table of Nemotron 3 Super's head: GGUF name (block-relative) -> checkpoint tensors (several:
#: stacked experts).
MTP_TABLE: dict[str, list[str]] = {
    "nextn.enorm.weight": ["mtp.layers.0.enorm.weight"],
    "nextn.hnorm.weight": ["mtp.layers.0.hnorm.weight"],
    "nextn.eh_proj.weight": ["mtp.layers.0.eh_proj.weight"],
    "attn_norm.weight": ["mtp.layers.0.norm.weight"],
    "attn_q.weight": ["mtp.layers.0.mixer.q_proj.weight"],
    "attn_k.weight": ["mtp.layers.0.mixer.k_proj.weight"],
    "attn_v.weight": ["mtp.layers.0.mixer.v_proj.weight"],
    "attn_output.weight": ["mtp.layers.0.mixer.o_proj.weight"],
    "post_attention_norm.weight": ["mtp.layers.1.norm.weight"],
    "ffn_gate_inp.weight": ["mtp.layers.1.mixer.gate.weight"],
    "exp_probs_b.bias": ["mtp.layers.1.mixer.gate.e_score_correction_bias"],
    "ffn_latent_down.weight": ["mtp.layers.1.mixer.fc1_latent_proj.weight"],
    "ffn_latent_up.weight": ["mtp.layers.1.mixer.fc2_latent_proj.weight"],
    "ffn_up_exps.weight": [f"mtp.layers.1.mixer.experts.{e}.up_proj.weight" for e in range(HP.n_expert)],
    "ffn_down_exps.weight": [f"mtp.layers.1.mixer.experts.{e}.down_proj.weight" for e in range(HP.n_expert)],
    "ffn_up_shexp.weight": ["mtp.layers.1.mixer.shared_experts.up_proj.weight"],
    "ffn_down_shexp.weight": ["mtp.layers.1.mixer.shared_experts.down_proj.weight"],
    "nextn.shared_head_norm.weight": ["mtp.layers.1.final_layernorm.weight"],
}
F32_BY_RULE = {"nextn.enorm.weight", "nextn.hnorm.weight", "attn_norm.weight", "post_attention_norm.weight",
               "ffn_gate_inp.weight", "exp_probs_b.bias", "nextn.shared_head_norm.weight"}
MATRICES = [name for name in MTP_TABLE if name not in F32_BY_RULE]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="module")
def bf16_head(work: Path) -> Path:
    """BF16 head (F32 routing bias), split over two safetensors files with an index."""
    return write_mtpv2_checkpoint(work / "head-bf16", files=2, dtype="bfloat16")


@pytest.fixture(scope="module")
def f32_head(work: Path) -> Path:
    return write_mtpv2_checkpoint(work / "head-f32", files=2, dtype="float32", seed=7)


@pytest.fixture(scope="module")
def draft(bf16_head: Path, nemotron_split: Path, work: Path) -> Path:
    return convert(bf16_head, work / "draft.gguf", target=nemotron_split, progress=False).output


@pytest.fixture(scope="module")
def draft_tensors(draft: Path) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    return reader_tensors(draft)


def _sources_bytes(head: Path, names: list[str]) -> bytes:
    return b"".join(raw_tensor(head, n)[2] for n in names)


def _sources_f32(head: Path, names: list[str]) -> np.ndarray:
    parts = [as_f32(head, n) for n in names]
    return parts[0] if len(parts) == 1 else np.stack(parts)


# ------------------------------------------------------------------------------------------- names


def test_registry_finds_the_converter_by_hf_architecture_and_by_gguf_architecture() -> None:
    by_hf = get_model_class("NemotronHForCausalLM")
    assert model_class_for_arch(ARCH) is by_hf
    assert by_hf.hf_architectures == ("NemotronHForCausalLM",)
    assert supported_architectures() == sorted([
        "BailingMoeV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "HYV3ForCausalLM", "MiMoV2FlashForCausalLM",
        "MiMoV2ForCausalLM", "NemotronHForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
    ])
    assert model_class_for_arch("qwen4exp") is get_model_class("Qwen4ExpForCausalLM")
    assert model_class_for_arch("glm4moe") is get_model_class("Glm4MoeForCausalLM")
    assert model_class_for_arch("deepseek2") is get_model_class("DeepseekV3ForCausalLM")
    assert model_class_for_arch("deepseek32") is get_model_class("DeepseekV32ForCausalLM")  # a name gguf-py lacks
    assert model_class_for_arch("glm-dsa") is get_model_class("GlmMoeDsaForCausalLM")
    assert get_model_class("DeepseekV32ForCausalLM").hf_architectures == ("DeepseekV32ForCausalLM",)  # not V3's too
    assert get_model_class("Qwen3_5MoeForCausalLM") is get_model_class("Qwen3_5MoeForConditionalGeneration")


def test_draft_holds_exactly_the_18_nextn_tensors_as_llama_cpp_names_them(draft_tensors: dict) -> None:
    assert sorted(draft_tensors) == sorted(f"blk.{BLOCK}.{name}" for name in MTP_TABLE)


def test_block_index_is_the_target_trunk_block_count(bf16_head: Path, nemotron_single: Path, tmp_path: Path) -> None:
    # nemotron_single has the pattern M*EM*E: six trunk blocks.
    report = convert(bf16_head, tmp_path / "d.gguf", target=nemotron_single, dry_run=True)
    assert report.plan.block == 6
    assert {t.name.split(".")[1] for t in report.plan.tensors} == {"6"}


def test_block_index_can_be_given_without_a_target(bf16_head: Path, tmp_path: Path) -> None:
    out = convert(bf16_head, tmp_path / "d.gguf", block=5, progress=False).output
    assert {name.split(".")[1] for name in reader_tensors(out)} == {"5"}


# ------------------------------------------------------------------------------------------ values


@pytest.mark.parametrize("name", MATRICES)
def test_bf16_matrix_is_a_bit_exact_copy_of_the_checkpoint(name: str, bf16_head: Path, draft_tensors: dict) -> None:
    ggml_type, _, raw = draft_tensors[f"blk.{BLOCK}.{name}"]
    assert ggml_type == Q.BF16
    assert raw == _sources_bytes(bf16_head, MTP_TABLE[name])


@pytest.mark.parametrize("name", sorted(F32_BY_RULE))
def test_norms_router_and_bias_are_the_checkpoint_values_in_f32(name: str, bf16_head: Path,
                                                                draft_tensors: dict) -> None:
    ggml_type, _, raw = draft_tensors[f"blk.{BLOCK}.{name}"]
    assert ggml_type == Q.F32
    expected = _sources_f32(bf16_head, MTP_TABLE[name])
    assert np.array_equal(np.frombuffer(raw, np.float32), expected.ravel())


@pytest.mark.parametrize("name", list(MTP_TABLE))
def test_shapes_are_the_checkpoint_shapes_in_ggml_order(name: str, bf16_head: Path, draft_tensors: dict) -> None:
    sources = MTP_TABLE[name]
    shape = raw_tensor(bf16_head, sources[0])[1]
    torch_shape = (len(sources), *shape) if len(sources) > 1 else shape
    assert draft_tensors[f"blk.{BLOCK}.{name}"][1] == tuple(reversed(torch_shape))


def test_stacked_expert_shapes_are_the_ones_llama_cpp_creates(draft_tensors: dict) -> None:
    # src/models/nemotron-h.cpp: ffn_up_exps {latent, n_ff_exp, n_expert}, ffn_down_exps {n_ff_exp, latent, n_expert}
    assert draft_tensors[f"blk.{BLOCK}.ffn_up_exps.weight"][1] == (HP.moe_latent, HP.n_ff_exp, HP.n_expert)
    assert draft_tensors[f"blk.{BLOCK}.ffn_down_exps.weight"][1] == (HP.n_ff_exp, HP.moe_latent, HP.n_expert)
    assert draft_tensors[f"blk.{BLOCK}.nextn.eh_proj.weight"][1] == (2 * HP.n_embd, HP.n_embd)


def test_f32_checkpoint_stays_f32_bit_exactly(f32_head: Path, tmp_path: Path) -> None:
    out = convert(f32_head, tmp_path / "d.gguf", block=BLOCK, progress=False).output
    tensors = reader_tensors(out)
    for name, sources in MTP_TABLE.items():
        ggml_type, _, raw = tensors[f"blk.{BLOCK}.{name}"]
        assert ggml_type == Q.F32, name
        assert raw == _sources_bytes(f32_head, sources), name


@pytest.mark.parametrize("outtype", ["q8_0", "f16", "bf16"])
def test_outtype_matrices_match_gguf_py_quantizer(outtype: str, f32_head: Path, tmp_path: Path) -> None:
    qtype = {"q8_0": Q.Q8_0, "f16": Q.F16, "bf16": Q.BF16}[outtype]
    out = convert(f32_head, tmp_path / "d.gguf", block=BLOCK, outtype=outtype, progress=False).output
    tensors = reader_tensors(out)
    for name in MATRICES:
        ggml_type, _, raw = tensors[f"blk.{BLOCK}.{name}"]
        assert ggml_type == qtype, name
        expected = gguf_quants.quantize(_sources_f32(f32_head, MTP_TABLE[name]), qtype)
        assert raw == expected.tobytes(), name
    for name in F32_BY_RULE:
        assert tensors[f"blk.{BLOCK}.{name}"][0] == Q.F32, name


def test_q8_0_from_bf16_quantizes_the_widened_values(bf16_head: Path, tmp_path: Path) -> None:
    out = convert(bf16_head, tmp_path / "d.gguf", block=BLOCK, outtype="q8_0", progress=False).output
    ggml_type, _, raw = reader_tensors(out)[f"blk.{BLOCK}.ffn_down_exps.weight"]
    expected = gguf_quants.quantize(_sources_f32(bf16_head, MTP_TABLE["ffn_down_exps.weight"]), Q.Q8_0)
    assert ggml_type == Q.Q8_0 and raw == expected.tobytes()


def test_q8_0_falls_back_to_f16_where_rows_do_not_split_into_blocks(tmp_path: Path) -> None:
    hp = with_hparams(head_dim=18)  # attn_output rows of 8 * 18 = 144 values: not a multiple of 32
    head = write_mtpv2_checkpoint(tmp_path / "head", hparams=hp, files=1)
    report = convert(head, tmp_path / "d.gguf", block=BLOCK, outtype="q8_0", progress=False)
    tensors = reader_tensors(report.output)
    assert tensors[f"blk.{BLOCK}.attn_output.weight"][0] == Q.F16
    assert tensors[f"blk.{BLOCK}.attn_q.weight"][0] == Q.Q8_0
    assert any("attn_output" in note and "F16" in note for note in report.to_dict()["notes"])


@pytest.mark.parametrize("bias_spelling", ["e_score_correction_bias", "e_score_correction.bias"])
def test_both_spellings_of_the_routing_bias_become_exp_probs_b(bias_spelling: str, tmp_path: Path) -> None:
    head = write_mtpv2_checkpoint(tmp_path / "head", bias_spelling=bias_spelling, files=1)
    out = convert(head, tmp_path / "d.gguf", block=BLOCK, progress=False).output
    _, _, raw = reader_tensors(out)[f"blk.{BLOCK}.exp_probs_b.bias"]
    assert raw == raw_tensor(head, f"mtp.layers.1.mixer.gate.{bias_spelling}")[2]


def test_single_file_checkpoint_without_index_converts(tmp_path: Path, draft_tensors: dict) -> None:
    head = write_mtpv2_checkpoint(tmp_path / "head", files=1)  # same seed as bf16_head: same values
    assert not (head / "model.safetensors.index.json").exists()
    out = convert(head, tmp_path / "d.gguf", block=BLOCK, progress=False).output
    assert reader_tensors(out) == draft_tensors


# ---------------------------------------------------------------------------------------- metadata


def test_draft_states_architecture_and_one_nextn_layer(draft: Path) -> None:
    kvs = reader_kvs(draft)
    assert kvs["general.architecture"][1] == ARCH
    assert kvs[f"{ARCH}.nextn_predict_layers"][1] == 1
    assert kvs[f"{ARCH}.block_count"][1] == BLOCK + 1


def test_nextn_entry_of_per_layer_arrays_is_both_attention_and_moe(draft: Path) -> None:
    kvs = reader_kvs(draft)
    head_count_kv = kvs[f"{ARCH}.attention.head_count_kv"][1]
    ff = kvs[f"{ARCH}.feed_forward_length"][1]
    assert len(head_count_kv) == len(ff) == BLOCK + 1
    assert head_count_kv[BLOCK] == HP.n_head_kv and ff[BLOCK] == HP.n_ff_exp


def test_per_layer_arrays_take_trunk_entries_and_element_type_from_the_target(draft: Path,
                                                                              nemotron_split: Path) -> None:
    target, mine = reader_kvs(nemotron_split), reader_kvs(draft)
    for suffix in ("attention.head_count_kv", "feed_forward_length"):
        types, values = target[f"{ARCH}.{suffix}"]
        assert mine[f"{ARCH}.{suffix}"][0] == types
        assert mine[f"{ARCH}.{suffix}"][1][:BLOCK] == values


def test_without_target_trunk_entries_follow_the_config_pattern(bf16_head: Path, tmp_path: Path) -> None:
    kvs = reader_kvs(convert(bf16_head, tmp_path / "d.gguf", block=BLOCK, progress=False).output)
    # config.json: hybrid_override_pattern "M*E"
    assert kvs[f"{ARCH}.attention.head_count_kv"][1] == [0, HP.n_head_kv, 0, HP.n_head_kv]
    assert kvs[f"{ARCH}.feed_forward_length"][1] == [0, 0, HP.n_ff_exp, HP.n_ff_exp]


def test_block_type_config_style_gives_the_same_draft(tmp_path: Path, draft: Path, nemotron_split: Path) -> None:
    head = write_mtpv2_checkpoint(tmp_path / "head", config_style="block_type")
    out = convert(head, tmp_path / "d.gguf", target=nemotron_split, progress=False).output
    assert reader_tensors(out) == reader_tensors(draft)
    assert {k: v for k, v in reader_kvs(out).items() if k != "general.name"} == {
        k: v for k, v in reader_kvs(draft).items() if k != "general.name"
    }


def test_draft_states_the_hparams_llama_cpp_needs(draft: Path) -> None:
    kvs = reader_kvs(draft)
    expected = {
        "embedding_length": HP.n_embd, "attention.head_count": HP.n_head, "attention.key_length": HP.head_dim,
        "expert_count": HP.n_expert, "expert_used_count": HP.n_expert_used,
        "expert_feed_forward_length": HP.n_ff_exp, "expert_shared_feed_forward_length": HP.n_ff_shexp,
        "moe_latent_size": HP.moe_latent, "vocab_size": HP.n_vocab,
    }
    assert {k: kvs[f"{ARCH}.{k}"][1] for k in expected} == expected
    # llama.cpp's nemotron_h loader requires the plain layer-norm epsilon, not only the RMS one.
    assert kvs[f"{ARCH}.attention.layer_norm_epsilon"][1] == pytest.approx(1e-5)


# -------------------------------------------------------------------------------------- standalone


def test_standalone_globals_are_the_target_bytes(bf16_head: Path, nemotron_split: Path, tmp_path: Path) -> None:
    out = convert(bf16_head, tmp_path / "mtp-tiny.gguf", target=nemotron_split, standalone=True, progress=False).output
    mine, theirs = reader_tensors(out), reader_tensors(nemotron_split)
    for name in ("token_embd.weight", "output_norm.weight", "output.weight"):
        assert mine[name] == theirs[name], name


def test_standalone_metadata_is_the_target_grown_by_one_nextn_block(bf16_head: Path, nemotron_split: Path,
                                                                   tmp_path: Path) -> None:
    out = convert(bf16_head, tmp_path / "mtp-tiny.gguf", target=nemotron_split, standalone=True, progress=False).output
    mine, theirs = reader_kvs(out), reader_kvs(nemotron_split)
    changed = {f"{ARCH}.block_count", f"{ARCH}.nextn_predict_layers", f"{ARCH}.attention.head_count_kv",
               f"{ARCH}.feed_forward_length"}
    assert not any(key.startswith("split.") for key in mine)
    assert {k: v for k, v in mine.items() if k not in changed} == {
        k: v for k, v in theirs.items() if k not in changed and not k.startswith("split.")
    }
    assert mine[f"{ARCH}.block_count"] == (theirs[f"{ARCH}.block_count"][0], 4)
    assert mine[f"{ARCH}.nextn_predict_layers"][1] == 1
    assert mine[f"{ARCH}.attention.head_count_kv"][1] == [*theirs[f"{ARCH}.attention.head_count_kv"][1], 2]


# ------------------------------------------------------------------------------------------ target


def test_neither_target_nor_block_is_refused(bf16_head: Path, tmp_path: Path) -> None:
    with pytest.raises(GGUFMTPError, match="give target .* or block$"):
        convert(bf16_head, tmp_path / "d.gguf")
    assert not (tmp_path / "d.gguf").exists()


def test_block_other_than_the_target_trunk_count_is_refused(bf16_head: Path, nemotron_split: Path,
                                                            tmp_path: Path) -> None:
    with pytest.raises(IncompatibleDraftError, match="block 7: .* it is 3"):
        convert(bf16_head, tmp_path / "d.gguf", target=nemotron_split, block=7)


def test_target_with_another_expert_count_is_refused(bf16_head: Path, tmp_path: Path) -> None:
    other = write_target(tmp_path / "t", hparams=with_hparams(n_expert=16))
    with pytest.raises(IncompatibleDraftError, match="expert_count = 8 .* the target 16"):
        convert(bf16_head, tmp_path / "d.gguf", target=other)


def test_target_with_another_width_is_refused(tmp_path: Path, nemotron_split: Path) -> None:
    head = write_mtpv2_checkpoint(tmp_path / "head", hparams=with_hparams(n_embd=768), files=1)
    with pytest.raises(IncompatibleDraftError, match="embedding_length = 768"):
        convert(head, tmp_path / "d.gguf", target=nemotron_split)


def test_target_of_another_architecture_is_refused(bf16_head: Path, glm_target: Path, tmp_path: Path) -> None:
    with pytest.raises(IncompatibleDraftError, match="'glm4moe'.*'nemotron_h_moe'"):
        convert(bf16_head, tmp_path / "d.gguf", target=glm_target)


def test_target_that_already_has_a_nextn_block_is_refused(bf16_head: Path, tmp_path: Path) -> None:
    with_mtp = write_target(tmp_path / "t", with_nextn=True)
    with pytest.raises(IncompatibleDraftError, match="already has 1 NextN block"):
        convert(bf16_head, tmp_path / "d.gguf", target=with_mtp)


def test_a_target_with_a_head_is_refused_naming_how_to_replace_it(
    bf16_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with_mtp = write_target(tmp_path / "t", with_nextn=True)  # 3 trunk blocks + blk.3
    out = tmp_path / "d.gguf"
    assert main(["convert", str(bf16_head), "-o", str(out), "--target", str(with_mtp)]) == 2
    err = capsys.readouterr().err
    assert err.endswith("; to replace it, convert with --block 3 instead of --target and splice the draft in with "
                        "replace_head (gguf-mtp compose --replace-head)\n") and err.count("\n") == 1
    assert not out.exists()


def test_a_target_with_a_head_is_refused_for_a_standalone_file_naming_a_stripped_copy(
    bf16_head: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with_mtp = write_target(tmp_path / "t", with_nextn=True)
    out = tmp_path / "mtp.gguf"
    assert main(["convert", str(bf16_head), "-o", str(out), "--target", str(with_mtp), "--standalone"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("; to convert another head as a standalone file, give a copy without it as --target "
                        "(gguf-mtp strip)\n") and err.count("\n") == 1


# --------------------------------------------------------------------------------------- streaming


def _mapped(head: Path, outtype: GGMLQuantizationType | None) -> dict[str, object]:
    checkpoint = open_checkpoint(head, prefix="mtp.")
    model = get_model_class("NemotronHForCausalLM")(checkpoint)
    return {t.name: t for t in model.mapped_tensors(BLOCK, outtype)}


def test_bf16_expert_stack_is_copied_by_the_kernel_expert_after_expert(bf16_head: Path) -> None:
    stack = _mapped(bf16_head, None)[f"blk.{BLOCK}.ffn_up_exps.weight"]
    segments = tensor_segments(stack)
    one_expert = HP.n_ff_exp * HP.moe_latent * 2
    # Experts are interleaved with down_proj in the file: one kernel copy per expert, in expert order.
    assert [type(s) for s in segments] == [CopyRange] * HP.n_expert
    assert [s.nbytes for s in segments] == [one_expert] * HP.n_expert
    assert [s.offset for s in segments] == sorted(s.offset for s in segments)


def test_quantized_expert_stack_is_generated_expert_after_expert(bf16_head: Path) -> None:
    stack = _mapped(bf16_head, Q.Q8_0)[f"blk.{BLOCK}.ffn_up_exps.weight"]
    segments = tensor_segments(stack)
    assert [type(s) for s in segments] == [Generated] * HP.n_expert
    assert sum(s.nbytes for s in segments) == stack.nbytes


def test_converted_chunks_stay_bounded_and_equal_the_whole(bf16_head: Path) -> None:
    eh_proj = _mapped(bf16_head, Q.Q8_0)[f"blk.{BLOCK}.nextn.eh_proj.weight"]
    whole = b"".join(bytes(c) for s in tensor_segments(eh_proj) for c in s.chunks())
    chunk_bytes = 8 * 2 * HP.n_embd * 4  # eight rows of float32
    chunks = [bytes(c) for s in tensor_segments(eh_proj, chunk_bytes=chunk_bytes) for c in s.chunks()]
    assert len(chunks) == HP.n_embd // 8
    assert b"".join(chunks) == whole


def test_quantizing_a_large_stack_never_holds_more_than_a_few_experts(tmp_path: Path) -> None:
    # One stack: 64 x 512 x 256 values, 32 MiB as float32; one expert is 0.5 MiB, the largest other tensor 2 MiB.
    hp = with_hparams(n_expert=64, n_ff_exp=512)
    head = write_mtpv2_checkpoint(tmp_path / "head", hparams=hp, files=1)
    tracemalloc.start()
    try:
        convert(head, tmp_path / "d.gguf", block=BLOCK, outtype="q8_0", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"peak Python/numpy allocation {peak / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------------------ output


def test_dry_run_writes_nothing_and_plans_the_exact_file(bf16_head: Path, nemotron_split: Path, draft: Path,
                                                        tmp_path: Path) -> None:
    report = convert(bf16_head, tmp_path / "d.gguf", target=nemotron_split, dry_run=True)
    assert not (tmp_path / "d.gguf").exists()
    assert report.plan.bytes_to_write == draft.stat().st_size
    header = report.plan.output.segments[0].data
    assert draft.read_bytes()[: len(header)] == header
    planned = {t.name: (t.offset, t.nbytes, t.type_name) for t in report.plan.tensors}
    actual = reader_tensors(draft)
    assert {n: (len(v[2]), Q(v[0]).name) for n, v in actual.items()} == {n: (p[1], p[2]) for n, p in planned.items()}


def test_inputs_are_never_modified(bf16_head: Path, nemotron_split: Path, tmp_path: Path) -> None:
    before = file_hashes(bf16_head), file_hashes(nemotron_split.parent)
    convert(bf16_head, tmp_path / "d.gguf", target=nemotron_split, outtype="q8_0", progress=False)
    assert (file_hashes(bf16_head), file_hashes(nemotron_split.parent)) == before


def test_existing_output_is_kept_without_force(bf16_head: Path, tmp_path: Path) -> None:
    out = tmp_path / "d.gguf"
    out.write_bytes(b"precious")
    with pytest.raises(UnsafeOutputError, match="exists"):
        convert(bf16_head, out, block=BLOCK)
    assert out.read_bytes() == b"precious"
    convert(bf16_head, out, block=BLOCK, force=True, progress=False)
    assert out.read_bytes()[:4] == b"GGUF"


def test_output_over_an_input_is_refused(bf16_head: Path, tmp_path: Path) -> None:
    shard = bf16_head / "model-00002-of-00002.safetensors"
    before = shard.read_bytes()
    with pytest.raises(UnsafeOutputError, match="overwrite the input"):
        convert(bf16_head, shard, block=BLOCK, force=True)
    assert shard.read_bytes() == before
    assert [p.name for p in bf16_head.iterdir() if p.name.startswith(".")] == []


def test_nemotron_head_under_another_family_name_is_not_converted_as_that_family(tmp_path: Path) -> None:
    # An MTPv2 head whose config.json claims GLM: the GLM converter looks for model.layers.{N}.* and says so.
    head = write_mtpv2_checkpoint(tmp_path / "head", files=1)
    config = (head / "config.json").read_text().replace("NemotronHForCausalLM", "Glm4MoeForCausalLM")
    (head / "config.json").write_text(config)
    with pytest.raises(GGUFMTPError, match=r"no MTP head: no tensor name starts with 'model\.layers\.3\.'"):
        convert(head, tmp_path / "d.gguf", block=BLOCK)
    assert not (tmp_path / "d.gguf").exists()
    assert GLM4MOE.arch == "glm4moe"


# --------------------------------------------------------------------------------------------- CLI


def test_cli_dry_run_prints_the_plan_and_writes_nothing(bf16_head: Path, nemotron_split: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.gguf"
    assert main(["convert", str(bf16_head), "-o", str(out), "--target", str(nemotron_split), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"blk.{BLOCK}.ffn_up_exps.weight" in text and "stack 8 experts, copy" in text
    assert f"{ARCH}.feed_forward_length (arr[i32]) = [0, 0, 256, 256]" in text
    assert "nothing was written" in text
    assert not out.exists()


def test_cli_json_report_is_machine_readable(bf16_head: Path, nemotron_split: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.gguf"
    args = ["convert", str(bf16_head), "-o", str(out), "--target", str(nemotron_split), "--outtype", "q8_0", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    summary = (report["command"], report["block"], report["outtype"], report["standalone"])
    assert summary == ("convert", BLOCK, "q8_0", False)
    assert len(report["tensors"]) == len(MTP_TABLE)
    assert report["bytes_written"] == report["bytes_to_write"] == out.stat().st_size
    assert {"key": f"{ARCH}.nextn_predict_layers", "type": "u32", "value": 1} in report["kvs"]


# ------------------------------------------------------------------------------------------- the request


def test_one_conversion_request_plans_what_convert_writes(bf16_head: Path, nemotron_split: Path, work: Path) -> None:
    from gguf_mtp.jobs.convert import ConversionRequest, plan_conversion
    from gguf_mtp.model.shards import open_model

    output = work / "request-draft.gguf"
    request = ConversionRequest(output, source=str(bf16_head), target=open_model(nemotron_split), outtype="f32")
    plan = plan_conversion(open_checkpoint(bf16_head), request)
    report = convert(bf16_head, output, target=nemotron_split, outtype="f32", dry_run=True, progress=False)
    assert plan.output.segments[0] == report.plan.output.segments[0]  # the header, byte for byte
    assert plan.tensors == report.plan.tensors and plan.bytes_to_write == report.plan.bytes_to_write
    assert (plan.block, plan.outtype, plan.source) == (report.plan.block, "f32", str(bf16_head))
