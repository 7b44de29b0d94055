"""Per-architecture rules for per-layer arrays (gguf_mtp.model.arch_rules): which ``{arch}.*`` arrays get
which entry for an appended NextN block -- the draft's, a constant, or none (trunk-length arrays)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFValueType
from support.helpers import file_hashes, reader_kvs

from gguf_mtp import IncompatibleDraftError, compose
from gguf_mtp.check.inspect import inspect
from gguf_mtp.check.verify import verify
from gguf_mtp.format.header import GGUFArray, KeyValue, encode_kv, read_header
from gguf_mtp.jobs.extract import extract
from gguf_mtp.jobs.graft import graft
from gguf_mtp.jobs.strip import strip
from gguf_mtp.model.arch_rules import (
    ARCH_RULES,
    COMMON_RULES,
    MTP_GRAPH_BLOCKS,
    NextNValue,
    extended_arrays,
    is_known_arch,
    nextn_graph_note,
    rule_for,
    trunk_only_arrays,
)
from gguf_mtp.model.blocks import per_layer_keys
from gguf_mtp.testing.tiny_models import GLM4MOE, relabel_arch, write_draft, write_target

ARR, BOOL, I32, F32 = GGUFValueType.ARRAY, GGUFValueType.BOOL, GGUFValueType.INT32, GGUFValueType.FLOAT32

#: Every architecture with a NextN draft graph in llama.cpp 0c1e570 (``graph_mtp`` in its src/models/models.h;
#: docs/families.md, "MTP architectures by llama.cpp build"), and qwen4exp.
MTP_ARCHS = (
    "nemotron_h_moe", "glm4moe", "deepseek2", "deepseek32", "glm-dsa", "qwen35", "qwen35moe", "qwen3next",
    "step35", "mimo2", "hy_v3", "cohere2moe", "bailingmoe3", "deepseek4",
    "qwen4exp",  # llama.cpp b11434's (src/models/qwen4exp.cpp, graph_mtp)
)


def _array(key: str, etype: GGUFValueType, values: tuple[Any, ...]) -> KeyValue:
    return encode_kv(key, ARR, GGUFArray(etype, values))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A glm4moe trunk (2 blocks, one file), a blk.0 draft, a 3-block blk.0 draft and a model with its NextN
    block: relabelled below as models of other architectures."""
    folder = tmp_path_factory.mktemp("arch_rules")
    return {
        "target": write_target(folder / "t", family=GLM4MOE, name="trunk"),
        "draft": write_draft(folder / "d" / "mtp.gguf", family=GLM4MOE, block=0, quant="Q8_0"),
        "draft3": write_draft(folder / "d" / "mtp3.gguf", family=GLM4MOE, block=0, nextn=3, quant="Q8_0"),
        "full": write_target(folder / "f", family=GLM4MOE, with_nextn=True, name="full", quant="Q8_0", seed=3),
    }


def _as(arch: str, src: Path, dst: Path, *kvs: KeyValue, drop: tuple[str, ...] = ()) -> Path:
    return relabel_arch(src, dst, arch, set_kvs=kvs, drop_keys=drop)


# --------------------------------------------------------------------------------------------- the table


def test_every_architecture_with_an_mtp_graph_has_rules() -> None:
    assert [a for a in MTP_ARCHS if not is_known_arch(a)] == []
    assert not is_known_arch("llama")


def test_the_rules_say_what_llama_cpp_reads() -> None:
    assert rule_for("glm-dsa", "glm-dsa.attention.indexer.types").kind is NextNValue.TRUNK
    recurrent = rule_for("qwen35moe", "qwen35moe.attention.recurrent_layers")
    assert recurrent is not None and recurrent.kind is NextNValue.CONSTANT and recurrent.value is False
    for arch in ("qwen35", "qwen3next"):
        assert rule_for(arch, "attention.recurrent_layers") == recurrent
    for arch in MTP_ARCHS:  # the generic loader's n_layer_all arrays
        for suffix in ("attention.head_count", "attention.head_count_kv", "feed_forward_length", "expert_used_count"):
            assert rule_for(arch, suffix) is COMMON_RULES[suffix]
    for arch in ("step35", "mimo2"):
        swa = rule_for(arch, "attention.sliding_window_pattern")
        assert swa is not None and swa.kind is NextNValue.FROM_DRAFT and not swa.exact
    assert rule_for("step35", "swiglu_clamp_exp").kind is NextNValue.FROM_DRAFT  # type: ignore[union-attr]
    assert rule_for("glm4moe", "glm4moe.attention.some_future_array") is None
    assert rule_for("unknown-arch", "attention.head_count_kv") is COMMON_RULES["attention.head_count_kv"]
    assert set(ARCH_RULES["glm-dsa"]) == {"attention.indexer.types"}


# ------------------------------------------------------------------------------------- glm-dsa: trunk-length


@pytest.fixture(scope="module")
def dsa(base: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dsa")
    types = _array("glm-dsa.attention.indexer.types", BOOL, (True, False))
    target = _as("glm-dsa", base["target"], folder / "t" / "glm5.gguf", types)
    draft = _as("glm-dsa", base["draft"], folder / "mtp.gguf", _array("glm-dsa.attention.indexer.types", BOOL, (True,)))
    composite = compose(target, draft, folder / "c", progress=False).output_paths[0]
    return {"target": target, "draft": draft, "composite": composite, "folder": folder}


def test_glm_dsa_indexer_types_is_not_extended(dsa: dict[str, Path]) -> None:
    key = "glm-dsa.attention.indexer.types"
    composite, target = read_header(dsa["composite"]), read_header(dsa["target"])
    assert composite.get("glm-dsa.block_count") == 3 and composite.get("glm-dsa.nextn_predict_layers") == 1
    assert composite.get(key) == [True, False]
    assert composite.kvs[key].raw == target.kvs[key].raw  # the very bytes: type, count and items
    assert per_layer_keys(target, "glm-dsa", 2) == []
    assert [kv.key for kv in trunk_only_arrays(composite, "glm-dsa")] == [key]


def test_glm_dsa_composite_is_clean_for_inspect_and_verify(dsa: dict[str, Path]) -> None:
    assert inspect(dsa["composite"]).problems == ()
    report = verify(dsa["composite"], target=dsa["target"], draft=dsa["draft"], llama=False, progress=False)
    assert report.ok, report.describe()
    assert "indexer.types" not in report.check("target metadata").detail  # unchanged, so not listed


def test_glm_dsa_strip_and_round_trip_are_byte_identical(dsa: dict[str, Path], tmp_path: Path) -> None:
    strip(dsa["composite"], tmp_path / "trunk", progress=False)
    assert file_hashes(tmp_path / "trunk") == file_hashes(dsa["target"].parent)
    draft = extract(dsa["composite"], tmp_path / "mtp.gguf", progress=False).output
    assert read_header(draft).get("glm-dsa.attention.indexer.types") == [True, False]
    compose(tmp_path / "trunk" / dsa["composite"].name, draft, tmp_path / "again", progress=False)
    assert file_hashes(tmp_path / "again") == file_hashes(dsa["composite"].parent)


def test_an_extended_indexer_types_is_named_by_inspect_and_verify_and_repaired_by_strip(
    dsa: dict[str, Path], tmp_path: Path
) -> None:
    key = "glm-dsa.attention.indexer.types"
    bad = _as("glm-dsa", dsa["composite"], tmp_path / "bad" / "glm5.gguf", _array(key, BOOL, (True, False, True)))
    problems = inspect(bad).problems
    assert any(p.startswith(f"{key} has 3 entries, but llama.cpp reads it with the trunk's 2") for p in problems)
    check = verify(bad, llama=False, progress=False).check("per-layer arrays")
    assert check.ok is False and key in check.detail
    trunk = strip(bad, tmp_path / "trunk", progress=False).output_paths[0]
    assert read_header(trunk).get(key) == [True, False]


# ---------------------------------------------------------------------------------- qwen35moe: a constant


@pytest.fixture(scope="module")
def qwen(base: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("qwen")
    key = "qwen35moe.attention.recurrent_layers"
    target = _as("qwen35moe", base["target"], folder / "t" / "qwen.gguf", _array(key, BOOL, (True, False)))
    draft = _as("qwen35moe", base["draft"], folder / "mtp.gguf")  # no recurrent_layers: the value is known
    composite = compose(target, draft, folder / "c", progress=False).output_paths[0]
    return {"target": target, "draft": draft, "composite": composite}


def test_qwen35moe_recurrent_layers_gets_false_for_the_nextn_block(qwen: dict[str, Path]) -> None:
    key = "qwen35moe.attention.recurrent_layers"
    kvs = reader_kvs(qwen["composite"])
    assert kvs[key] == ([ARR, BOOL], [True, False, False])
    assert kvs["qwen35moe.block_count"][1] == 3
    assert inspect(qwen["composite"]).problems == ()
    report = verify(qwen["composite"], target=qwen["target"], draft=qwen["draft"], llama=False, progress=False)
    assert report.ok and "recurrent_layers extended" in report.check("target metadata").detail


def test_qwen35moe_recurrent_layers_is_false_even_when_the_draft_says_otherwise(
    qwen: dict[str, Path], tmp_path: Path
) -> None:
    key = "qwen35moe.attention.recurrent_layers"
    draft = _as("qwen35moe", qwen["draft"], tmp_path / "mtp.gguf", _array(key, BOOL, (True,)))
    composite = compose(qwen["target"], draft, tmp_path / "c", progress=False).output_paths[0]
    assert read_header(composite).get(key) == [True, False, False]


def test_three_qwen35moe_blocks_get_three_false_entries(
    base: dict[str, Path], qwen: dict[str, Path], tmp_path: Path
) -> None:
    draft = _as("qwen35moe", base["draft3"], tmp_path / "mtp3.gguf")
    composite = compose(qwen["target"], draft, tmp_path / "c", progress=False).output_paths[0]
    assert read_header(composite).get("qwen35moe.attention.recurrent_layers") == [True, False, False, False, False]
    strip(composite, tmp_path / "trunk", progress=False)
    assert file_hashes(tmp_path / "trunk") == file_hashes(qwen["target"].parent)


def test_a_recurrent_nextn_entry_is_named_by_inspect(qwen: dict[str, Path], tmp_path: Path) -> None:
    key = "qwen35moe.attention.recurrent_layers"
    bad = _as("qwen35moe", qwen["composite"], tmp_path / "bad.gguf", _array(key, BOOL, (True, False, True)))
    assert f"blk.2: {key}[2] is True, but a NextN block's entry is false (constant)" in inspect(bad).problems
    assert verify(bad, llama=False, progress=False).check("per-layer arrays").ok is False


def test_qwen35moe_strip_gives_back_the_target(qwen: dict[str, Path], tmp_path: Path) -> None:
    strip(qwen["composite"], tmp_path / "trunk", progress=False)
    assert file_hashes(tmp_path / "trunk") == file_hashes(qwen["target"].parent)


# -------------------------------------------------------------------------- unknown arrays and architectures


def test_an_unknown_arch_with_a_trunk_length_array_is_refused_naming_the_key(
    base: dict[str, Path], tmp_path: Path
) -> None:
    key = "tinyarch.attention.layer_flavour"
    target = _as("tinyarch", base["target"], tmp_path / "t" / "tiny.gguf", _array(key, I32, (1, 2)))
    draft = _as("tinyarch", base["draft"], tmp_path / "mtp.gguf")
    expected = rf"per-layer array\(s\) {key} whose NextN value gguf-mtp has no rules for 'tinyarch'"
    with pytest.raises(IncompatibleDraftError, match=expected) as e:
        compose(target, draft, tmp_path / "c", progress=False)
    assert "draft carries no values" in str(e.value)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_every_unknown_array_is_named_at_once(base: dict[str, Path], tmp_path: Path) -> None:
    one, two = "glm4moe.attention.future_a", "glm4moe.future_b"
    target = _as("glm4moe", base["target"], tmp_path / "t" / "glm.gguf",
                 _array(one, I32, (1, 2)), _array(two, F32, (0.5, 0.25)))
    with pytest.raises(IncompatibleDraftError, match=rf"{one}, {two} whose NextN value gguf-mtp's glm4moe rules"):
        compose(target, base["draft"], tmp_path / "c", progress=False)


def test_the_draft_carried_values_of_an_unknown_array_are_taken(base: dict[str, Path], tmp_path: Path) -> None:
    key = "tinyarch.attention.layer_flavour"
    target = _as("tinyarch", base["target"], tmp_path / "t" / "tiny.gguf", _array(key, I32, (1, 2)))
    draft = _as("tinyarch", base["draft"], tmp_path / "mtp.gguf", _array(key, I32, (7,)))
    composite = compose(target, draft, tmp_path / "c", progress=False).output_paths[0]
    assert reader_kvs(composite)[key] == ([ARR, I32], [1, 2, 7])
    assert inspect(composite).problems == ()
    strip(composite, tmp_path / "trunk", progress=False)
    assert file_hashes(tmp_path / "trunk") == file_hashes(target.parent)


def test_a_blk_n_draft_carries_the_tail_of_its_longer_arrays(base: dict[str, Path], tmp_path: Path) -> None:
    key = "tinyarch.attention.layer_flavour"
    target = _as("tinyarch", base["target"], tmp_path / "t" / "tiny.gguf", _array(key, I32, (1, 2)))
    draft_n = write_draft(tmp_path / "dn.gguf", family=GLM4MOE, block="N", nextn=3)
    draft = _as("tinyarch", draft_n, tmp_path / "mtp.gguf", _array(key, I32, (1, 2, 5, 6, 7)))
    composite = compose(target, draft, tmp_path / "c", progress=False).output_paths[0]
    assert read_header(composite).get(key) == [1, 2, 5, 6, 7]


def test_common_arrays_of_an_unknown_arch_come_from_the_draft(base: dict[str, Path], tmp_path: Path) -> None:
    key = "tinyarch.attention.head_count_kv"
    target = _as("tinyarch", base["target"], tmp_path / "t" / "tiny.gguf", _array(key, I32, (2, 4)))  # was a scalar
    draft = _as("tinyarch", base["draft"], tmp_path / "mtp.gguf", _array(key, I32, (8,)))
    composite = compose(target, draft, tmp_path / "c", progress=False).output_paths[0]
    assert read_header(composite).get(key) == [2, 4, 8]
    without = _as("tinyarch", base["draft"], tmp_path / "mtp-none.gguf", drop=(key,))
    with pytest.raises(IncompatibleDraftError, match=f"the draft has no {key}"):
        compose(target, without, tmp_path / "c2", progress=False)


def test_mimo2_three_blocks_take_the_draft_sliding_window_entries(base: dict[str, Path], tmp_path: Path) -> None:
    swa, kv = "mimo2.attention.sliding_window_pattern", "mimo2.attention.head_count_kv"
    target = _as("mimo2", base["target"], tmp_path / "t" / "mimo.gguf",
                 _array(swa, I32, (0, 1)), _array(kv, I32, (4, 8)))
    draft = _as("mimo2", base["draft3"], tmp_path / "mtp.gguf",
                _array(swa, I32, (1, 1, 1)), _array(kv, I32, (8, 8, 8)))
    composite = compose(target, draft, tmp_path / "c", progress=False).output_paths[0]
    header = read_header(composite)
    assert (header.get(swa), header.get(kv)) == ([0, 1, 1, 1, 1], [4, 8, 8, 8, 8])
    assert inspect(composite).problems == ()
    strip(composite, tmp_path / "trunk", progress=False)
    assert file_hashes(tmp_path / "trunk") == file_hashes(target.parent)


def test_deepseek4_heads_are_refused_as_sidecar_only(base: dict[str, Path], tmp_path: Path) -> None:
    target = _as("deepseek4", base["target"], tmp_path / "t" / "dsv4.gguf")
    draft = _as("deepseek4", base["draft"], tmp_path / "mtp.gguf")
    with pytest.raises(IncompatibleDraftError, match="cannot compose deepseek4: .*hyper-connection head"):
        compose(target, draft, tmp_path / "c", progress=False)


def test_graft_follows_the_same_rules(base: dict[str, Path], tmp_path: Path) -> None:
    key = "qwen35moe.attention.recurrent_layers"
    donor = _as("qwen35moe", base["full"], tmp_path / "q8" / "full.gguf", _array(key, BOOL, (True, False, False)))
    receiver = _as("qwen35moe", base["target"], tmp_path / "ud" / "trunk.gguf", _array(key, BOOL, (True, False)))
    report = graft(donor, receiver, tmp_path / "out", verify=True, llama=False, progress=False)
    assert report.ok, report.describe()
    assert read_header(report.output_paths[0]).get(key) == [True, False, False]


def test_per_layer_keys_keeps_its_signature_and_leaves_out_trunk_length_arrays(dsa: dict[str, Path]) -> None:
    header = read_header(dsa["target"])
    assert per_layer_keys(header, "glm-dsa", 2) == [kv for kv, _ in extended_arrays(header, "glm-dsa", 2)] == []
    composite = read_header(dsa["composite"])
    assert [kv.key for kv in trunk_only_arrays(composite, "glm-dsa")] == ["glm-dsa.attention.indexer.types"]


# ---------------------------------------------------------- qwen4exp: its per-layer arrays named, not guessed


U64 = GGUFValueType.UINT64


def test_qwen4exp_ple_arrays_as_long_as_the_trunk_are_not_extended(base: dict[str, Path], tmp_path: Path) -> None:
    """Two PLE hash heads on a 2-block trunk: ``ple.head_offsets`` is exactly ``block_count`` long, yet one entry
    per hash head (b11434 src/models/qwen4exp.cpp); compose extends the named arrays and leaves it as it is."""
    recurrent, ratios = "qwen4exp.attention.recurrent_layers", "qwen4exp.attention.compress_ratios"
    offsets = _array("qwen4exp.ple.head_offsets", U64, (0, 5))
    target = _as("qwen4exp", base["target"], tmp_path / "t" / "q.gguf", offsets,
                 _array(recurrent, BOOL, (True, False)), _array(ratios, I32, (0, 4)))
    assert [kv.key for kv in per_layer_keys(read_header(target), "qwen4exp", 2)] == [recurrent, ratios]
    draft = _as("qwen4exp", base["draft"], tmp_path / "mtp.gguf", _array(ratios, I32, (4,)))
    composite = read_header(compose(target, draft, tmp_path / "c", progress=False).output_paths[0])
    assert composite.get("qwen4exp.ple.head_offsets") == [0, 5]
    assert composite.get(recurrent) == [True, False, False]
    assert composite.get(ratios) == [0, 4, 4]


# --------------------------------------------------------------------------- NextN blocks the MTP graph runs


def test_every_architecture_with_an_mtp_graph_says_how_many_blocks_it_runs() -> None:
    assert sorted(MTP_GRAPH_BLOCKS) == sorted(MTP_ARCHS)
    chained = sorted(a for a, (runs, _) in MTP_GRAPH_BLOCKS.items() if runs is None)
    assert chained == ["hy_v3", "mimo2", "step35"]
    assert all(runs in (None, 1) and source.startswith("src/models/") for runs, source in MTP_GRAPH_BLOCKS.values())
    assert nextn_graph_note("glm4moe", 1) is None and nextn_graph_note("step35", 3) is None
    assert nextn_graph_note("llama", 2) is None and nextn_graph_note(None, 2) is None
    note = nextn_graph_note("glm4moe", 2)
    assert note is not None and "runs exactly 1 (src/models/glm4-moe.cpp:135" in note


def test_inspect_and_verify_say_when_a_file_has_more_nextn_blocks_than_the_graph_runs(
    base: dict[str, Path], tmp_path: Path
) -> None:
    composite = compose(base["target"], base["draft3"], tmp_path / "c", progress=False).output_paths[0]
    summary = inspect(composite)
    assert summary.nextn_predict_layers == 3 and summary.graph_note is not None
    assert "3 NextN blocks, but llama.cpp's glm4moe MTP graph runs exactly 1" in "\n".join(summary.describe())
    assert summary.to_dict()["nextn_graph_note"] == summary.graph_note
    report = verify(composite, llama=False, progress=False)
    nextn = next(c for c in report.checks if c.name == "NextN tensors")
    assert nextn.ok is False and "glm4moe MTP graph runs exactly 1" in nextn.detail
    # the same blocks under an architecture whose graph chains every block: no note
    step = _as("step35", composite, tmp_path / "s" / "step.gguf")
    assert inspect(step).graph_note is None
    assert inspect(base["full"]).graph_note is None
