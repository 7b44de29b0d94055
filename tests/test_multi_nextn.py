"""More than one NextN block (``nextn_predict_layers`` > 1, as Step-3.5 and MiMo-V2 ship three): compose,
extract, strip, graft, inspect and verify keep the blocks' order and renumber them together."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import copy_model, file_hashes, reader_kvs, reader_tensors, rewrite_gguf

from gguf_mtp import IncompatibleDraftError, compose
from gguf_mtp.check.inspect import inspect
from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.check.verify import verify
from gguf_mtp.format.header import GGUFArray, encode_kv, read_header
from gguf_mtp.jobs.extract import extract
from gguf_mtp.jobs.graft import graft
from gguf_mtp.jobs.strip import strip
from gguf_mtp.testing.tiny_models import GLM4MOE, relabel_arch, write_draft, write_target

NEM = "nemotron_h_moe"
I32 = GGUFValueType.INT32


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multi_nextn")


@pytest.fixture(scope="module")
def glm3(work: Path, glm_target: Path, glm_draft3: Path) -> Path:
    """glm4moe composite: a 2-shard trunk of 2 blocks + 3 NextN blocks (blk.2..blk.4)."""
    return compose(glm_target, glm_draft3, work / "glm3", progress=False).output_paths[0]


@pytest.fixture(scope="module")
def nemotron_draft3_distinct(work: Path, nemotron_draft3: Path) -> Path:
    """The 3-block nemotron draft with a different feed_forward_length / head_count_kv entry per NextN block,
    so a test can tell which draft entry went to which composite block."""
    ff = encode_kv(f"{NEM}.feed_forward_length", GGUFValueType.ARRAY, GGUFArray(I32, (0, 0, 256, 256, 257, 258)))
    kv = encode_kv(f"{NEM}.attention.head_count_kv", GGUFValueType.ARRAY, GGUFArray(I32, (0, 2, 0, 2, 3, 4)))
    return relabel_arch(nemotron_draft3, work / "drafts" / "mtp-x3-distinct.gguf", NEM, set_kvs=[ff, kv])


@pytest.fixture(scope="module")
def nemotron3(work: Path, nemotron_split: Path, nemotron_draft3_distinct: Path) -> Path:
    """nemotron_h_moe composite: a 3-shard M*E trunk + 3 NextN blocks (blk.3..blk.5)."""
    return compose(nemotron_split, nemotron_draft3_distinct, work / "nemotron3", progress=False).output_paths[0]


def _blocks(path: Path, block: int) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    """The tensors of ``blk.{block}`` by name after ``blk.N.``."""
    prefix = f"blk.{block}."
    return {name[len(prefix) :]: t for name, t in reader_tensors(path).items() if name.startswith(prefix)}


# ------------------------------------------------------------------------------------------------ compose


def test_compose_renumbers_three_blocks_together_in_their_order(glm3: Path, glm_draft3: Path) -> None:
    kvs = read_header(glm3)
    assert (kvs.get("glm4moe.block_count"), kvs.get("glm4moe.nextn_predict_layers")) == (5, 3)
    for draft_block in range(3):
        ours = _blocks(glm3, 2 + draft_block)
        assert ours == _blocks(glm_draft3, draft_block) and "nextn.eh_proj.weight" in ours
    # the seeds differ per block, so order is observable: blk.2 is the draft's blk.0, not its blk.1
    assert _blocks(glm3, 2)["nextn.eh_proj.weight"] != _blocks(glm_draft3, 1)["nextn.eh_proj.weight"]
    assert not _blocks(glm3, 5)


def test_compose_plan_lists_the_renames_in_draft_order(glm_target: Path, glm_draft3: Path, tmp_path: Path) -> None:
    report = compose(glm_target, glm_draft3, tmp_path, dry_run=True, progress=False)
    renames = [(old.split(".")[1], new.split(".")[1]) for old, new in report.plan.renamed]
    assert [b for b, _ in renames] == sorted(b for b, _ in renames)
    assert {(old, new) for old, new in renames} == {("0", "2"), ("1", "3"), ("2", "4")}
    assert report.plan.nextn_blocks == 3 and report.plan.block == 2


def test_per_layer_arrays_get_one_draft_entry_per_nextn_block(nemotron3: Path) -> None:
    header = read_header(nemotron3)
    assert header.get(f"{NEM}.feed_forward_length") == [0, 0, 256, 256, 257, 258]
    assert header.get(f"{NEM}.attention.head_count_kv") == [0, 2, 0, 2, 3, 4]
    assert reader_kvs(nemotron3)[f"{NEM}.feed_forward_length"][0] == [GGUFValueType.ARRAY, I32]


def test_a_draft_with_a_gap_between_its_blocks_is_refused(glm_target: Path, glm_draft3: Path, tmp_path: Path) -> None:
    # blk.1 left out of the table: blk.0 and blk.2 remain, not contiguous
    dropped = tuple(t.name for t in read_header(glm_draft3).tensors if t.name.startswith("blk.1."))
    holed = rewrite_gguf(glm_draft3, tmp_path / "holed.gguf", drop_tensors=dropped)
    with pytest.raises(IncompatibleDraftError, match=r"draft blocks blk\.0, blk\.2"):
        compose(glm_target, holed, tmp_path / "out", progress=False)


# ------------------------------------------------------------------------------------ extract and strip


@pytest.mark.parametrize("name", ["glm3", "nemotron3"])
def test_strip_of_a_three_block_composite_gives_back_its_target_byte_for_byte(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    composite = request.getfixturevalue(name)
    target = request.getfixturevalue("glm_target" if name == "glm3" else "nemotron_split")
    report = strip(composite, tmp_path / "trunk", progress=False)
    assert list(report.plan.nextn.indices) == ([2, 3, 4] if name == "glm3" else [3, 4, 5])
    assert file_hashes(tmp_path / "trunk") == file_hashes(target.parent)


@pytest.mark.parametrize("name", ["glm3", "nemotron3"])
def test_extract_takes_all_three_blocks_and_compose_gives_back_the_composite(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    composite = request.getfixturevalue(name)
    draft = extract(composite, tmp_path / "mtp.gguf", progress=False).output
    header = read_header(draft)
    arch = header.get("general.architecture")
    first = 2 if name == "glm3" else 3
    assert header.get(f"{arch}.nextn_predict_layers") == 3
    assert sorted({int(t.name.split(".")[1]) for t in header.tensors}) == [first, first + 1, first + 2]
    for block in range(first, first + 3):
        assert _blocks(draft, block) == _blocks(composite, block)
    trunk = strip(composite, tmp_path / "trunk", progress=False).output_paths[0]
    again = compose(trunk, draft, tmp_path / "again", progress=False).output_paths[0]
    assert file_hashes(tmp_path / "again") == file_hashes(composite.parent)
    assert again.name == composite.name


def test_round_trip_of_a_converted_three_block_model(glm_converted3: Path, tmp_path: Path) -> None:
    draft = extract(glm_converted3, tmp_path / "mtp.gguf", progress=False).output
    trunk = strip(glm_converted3, tmp_path / "trunk", progress=False).output_paths[0]
    assert read_header(trunk).get("glm4moe.block_count") == 2
    assert "glm4moe.nextn_predict_layers" not in read_header(trunk).kvs
    assert not any(name.startswith(("blk.2.", "blk.3.", "blk.4.")) for name in reader_tensors(trunk))
    again = compose(trunk, draft, tmp_path / "again", progress=False).output_paths[0]
    assert reader_tensors(again) == reader_tensors(glm_converted3)
    assert reader_kvs(again) == reader_kvs(glm_converted3)


def test_standalone_extract_of_three_blocks_carries_the_globals(glm_converted3: Path, tmp_path: Path) -> None:
    draft = extract(glm_converted3, tmp_path / "mtp-glm.gguf", standalone=True, progress=False).output
    names = {t.name for t in read_header(draft).tensors}
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= names
    assert {n.split(".")[1] for n in names if n.startswith("blk.")} == {"2", "3", "4"}
    assert inspect(draft).mtp_verdict.startswith("MTP: draft only (3 blocks, blk.2-4)")


# ------------------------------------------------------------------------------------------------ graft


def test_graft_moves_three_blocks_and_equals_extract_then_compose(glm_converted3: Path, tmp_path: Path) -> None:
    receiver = write_target(tmp_path / "ud", family=GLM4MOE, quant="mixed", shards=2, name="glm-UD", seed=4)
    report = graft(glm_converted3, receiver, tmp_path / "grafted", verify=True, llama=False, progress=False)
    assert report.plan.composition.nextn_blocks == 3
    # Every check passes but the one that says llama.cpp's glm4moe MTP graph takes exactly one NextN block.
    assert report.verification is not None
    assert [c.name for c in report.verification.failures] == ["NextN tensors"]
    assert "MTP graph runs exactly 1" in report.verification.check("NextN tensors").detail
    draft = extract(glm_converted3, tmp_path / "mtp.gguf", progress=False).output
    compose(receiver, draft, tmp_path / "composed", progress=False)
    assert file_hashes(tmp_path / "grafted") == file_hashes(tmp_path / "composed")
    for block in (2, 3, 4):
        assert _blocks(report.output_paths[0], block) == _blocks(glm_converted3, block)


# ---------------------------------------------------------------------------------- inspect and verify


def test_inspect_says_three_blocks_and_finds_no_problem(glm3: Path, nemotron3: Path) -> None:
    glm = inspect(glm3)
    assert glm.mtp_verdict == "MTP: yes (3 blocks, blk.2-4)"
    assert glm.nextn_blocks == (2, 3, 4) and glm.problems == () and glm.nextn_missing == {}
    nemotron = inspect(nemotron3)
    assert nemotron.mtp_verdict == "MTP: yes (3 blocks, blk.3-5)" and nemotron.problems == ()
    assert nemotron.layer_kinds == ("M", "*", "E", "*E", "*E", "*E")


def test_inspect_names_the_one_incomplete_block_of_three(glm_converted3: Path, tmp_path: Path) -> None:
    shards = sorted(glm_converted3.parent.glob("glm-mtp3-*.gguf"))
    holder = next(p for p in shards if any(t.name == "blk.3.nextn.eh_proj.weight" for t in read_header(p).tensors))
    folder = tmp_path / "broken"
    for shard in shards:
        if shard == holder:
            rewrite_gguf(shard, folder / shard.name, drop_tensors=("blk.3.nextn.eh_proj.weight",))
        else:
            (folder / shard.name).parent.mkdir(parents=True, exist_ok=True)
            (folder / shard.name).write_bytes(shard.read_bytes())
    # split.tensors.count is now one too high in every shard; inspect reports that too, but names the block
    summary = inspect(folder / shards[0].name)
    assert summary.nextn_missing == {3: ("blk.3.nextn.eh_proj.weight",)}
    assert summary.mtp_verdict == "MTP: declared but tensors missing"


@pytest.mark.parametrize("name", ["glm3", "nemotron3"])
def test_verify_checks_a_three_block_composite_against_target_and_draft(
    name: str, request: pytest.FixtureRequest
) -> None:
    composite = request.getfixturevalue(name)
    target = request.getfixturevalue("glm_target" if name == "glm3" else "nemotron_split")
    draft = request.getfixturevalue("glm_draft3" if name == "glm3" else "nemotron_draft3_distinct")
    report = verify(composite, target=target, draft=draft, llama=False, progress=False)
    # The blocks, bytes and metadata are right; only the architecture's MTP graph takes exactly one NextN block.
    assert [c.name for c in report.failures] == ["NextN tensors"], report.describe()
    n_draft = len(read_header(draft).tensors)
    assert report.check("draft tensors").detail.startswith(f"all {n_draft} draft block tensors")
    nextn = report.check("NextN tensors").detail
    assert "MTP graph runs exactly 1" in nextn and "its MTP decode aborts on this file" in nextn


def test_verify_fails_a_composite_whose_arrays_have_one_nextn_entry_for_three_blocks(
    nemotron3: Path, tmp_path: Path
) -> None:
    broken = copy_model(nemotron3, tmp_path / "broken")
    first = relabel_arch(
        broken, tmp_path / "b1" / broken.name, NEM,
        set_kvs=[encode_kv(f"{NEM}.feed_forward_length", GGUFValueType.ARRAY, GGUFArray(I32, (0, 0, 256, 256)))],
    )
    for other in sorted(broken.parent.glob("*.gguf"))[1:]:
        (first.parent / other.name).write_bytes(other.read_bytes())
    check = verify(first, llama=False, progress=False).check("per-layer arrays")
    assert check.ok is False and "feed_forward_length has 4 entries, but block_count is 6" in check.detail


# ------------------------------------------------------------------------------------------------ llama.cpp


@pytest.mark.slow
@pytest.mark.llama
def test_llama_cpp_loads_a_three_block_glm4moe_composite_with_all_its_nextn_blocks(glm3: Path) -> None:
    check = check_with_llama(glm3)
    assert check.loaded and check.n_layer == 2 and check.n_layer_nextn == 3, check.summary()
    assert check.trunk_decode_ok is True, check.summary()
    # llama.cpp 0c1e570's glm4moe MTP graph runs a single block (src/models/glm4-moe.cpp:135); the file is
    # accepted with its three blocks loaded, and the draft step stops exactly at that assertion.
    assert check.mtp_decode_ok is not True
    assert "GLM4_MOE MTP currently only supports a single MTP block" in (check.error or ""), check.summary()


@pytest.mark.llama
def test_llama_cpp_loads_a_three_block_draft_as_an_mtp_only_model(glm_converted3: Path, tmp_path: Path) -> None:
    draft = extract(glm_converted3, tmp_path / "mtp-glm.gguf", standalone=True, progress=False).output
    check = check_with_llama(draft, trunk=False, mtp=False)
    assert check.loaded and check.n_layer_nextn == 3, check.summary()


def test_a_three_block_draft_written_by_tiny_models_declares_three(tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "d.gguf", family=GLM4MOE, block="N", nextn=3)
    header = read_header(draft)
    assert header.get("glm4moe.nextn_predict_layers") == 3 and header.get("glm4moe.block_count") == 5
    assert sorted({t.name.split(".")[1] for t in header.tensors}) == ["2", "3", "4"]


# --------------------------------------------------------------- more NextN blocks than the graph runs


def test_inspect_and_verify_say_when_the_graph_runs_fewer_blocks_than_the_file_has(glm3: Path, work: Path) -> None:
    summary = inspect(glm3)
    expected = ("3 NextN blocks, but llama.cpp's glm4moe MTP graph runs exactly 1 (src/models/glm4-moe.cpp:135: "
                "GGML_ASSERT n_layer_nextn == 1): its MTP decode aborts on this file")
    assert summary.graph_note == expected
    assert f"  note: {expected}" in summary.describe() and summary.to_dict()["nextn_graph_note"] == expected
    assert expected in verify(glm3, llama=False, progress=False).check("NextN tensors").detail
    # a chaining architecture runs every block: nothing to say
    step = relabel_arch(glm3, work / "step35" / "step.gguf", "step35")
    assert inspect(step).graph_note is None


def test_one_nextn_block_gets_no_note(glm_target: Path, glm_draft: Path, work: Path) -> None:
    composite = compose(glm_target, glm_draft, work / "glm1", progress=False).output_paths[0]
    assert inspect(composite).graph_note is None
