"""extract, strip and graft: move a NextN block between GGUFs, byte for byte, for any architecture."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import copy_model, file_hashes, flip_byte, reader_kvs, reader_tensors, rewrite_gguf, shard_files

from gguf_mtp import BadGGUFError, IncompatibleDraftError, UnsafeOutputError, compose, open_model
from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.check.verify import verify
from gguf_mtp.errors import NoNextNBlockError
from gguf_mtp.files.plan import Bytes, CopyRange, Zeros, slice_segments
from gguf_mtp.format.header import GGUFArray, align_up, encode_kv, read_header
from gguf_mtp.format.layout import PAD_KEY
from gguf_mtp.jobs.extract import extract, find_nextn_blocks
from gguf_mtp.jobs.graft import graft
from gguf_mtp.jobs.strip import strip
from gguf_mtp.testing.tiny_models import GLM4MOE, NEMOTRON_H_MOE, TinyFamily, add_raw_kvs, with_hparams, write_target

FAMILIES = {"nemotron_h_moe": NEMOTRON_H_MOE, "glm4moe": GLM4MOE}
TOKENS = "tokenizer.ggml.tokens"


def _family(arch: str) -> TinyFamily:
    return FAMILIES[arch]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("extract_strip_graft")


@pytest.fixture(scope="module")
def nemotron_composite(work: Path, nemotron_split: Path, nemotron_draft0: Path) -> Path:
    """3 shards made by compose: the NextN tensors sit at the end of the last shard."""
    return compose(nemotron_split, nemotron_draft0, work / "nemotron-composite", progress=False).output_paths[0]


@pytest.fixture(scope="module")
def glm_composite(work: Path, glm_target: Path, glm_draft: Path) -> Path:
    return compose(glm_target, glm_draft, work / "glm-composite", progress=False).output_paths[0]


@pytest.fixture(scope="module", params=["nemotron_h_moe", "glm4moe"])
def composite(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """(composite, the trunk-only target it was composed from), for both architectures."""
    if request.param == "nemotron_h_moe":
        return request.getfixturevalue("nemotron_composite"), request.getfixturevalue("nemotron_split")
    return request.getfixturevalue("glm_composite"), request.getfixturevalue("glm_target")


@pytest.fixture(scope="module")
def nemotron_converted(work: Path) -> Path:
    """3 shards as llama.cpp's converter writes a model with MTP: the NextN block spans shards 2 and 3,
    and output_norm / output follow it."""
    return write_target(work / "converted", with_nextn=True, shards=3, name="Nemotron-Q8-MTP", quant="Q8_0", seed=7)


@pytest.fixture(scope="module")
def glm_converted(work: Path) -> Path:
    return write_target(
        work / "glm-converted", family=GLM4MOE, with_nextn=True, name="glm-Q8-MTP", quant="Q8_0", seed=8
    )


@pytest.fixture(scope="module", params=["nemotron_h_moe", "glm4moe"])
def converted(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("nemotron_converted" if request.param == "nemotron_h_moe" else "glm_converted")


def _nextn_names(model: Path) -> set[str]:
    return set(find_nextn_blocks(open_model(model)).names)


def _hollow(trunk: Path, dest: Path) -> Path:
    """``trunk`` re-labelled as if it had a NextN block (block_count, nextn_predict_layers, per-layer arrays),
    without its tensors: what a converter that drops the tensors but keeps the count writes."""
    arch = "nemotron_h_moe"
    header = read_header(trunk)

    def extended(key: str, value: int) -> object:
        kv = header.kvs[key]
        return encode_kv(key, GGUFValueType.ARRAY, GGUFArray(kv.element_type, (*kv.value, value)))

    edits = {
        f"{arch}.block_count": encode_kv(f"{arch}.block_count", GGUFValueType.UINT32, 4),
        f"{arch}.attention.head_count_kv": extended(f"{arch}.attention.head_count_kv", 2),
        f"{arch}.feed_forward_length": extended(f"{arch}.feed_forward_length", 256),
        f"{arch}.nextn_predict_layers": encode_kv(f"{arch}.nextn_predict_layers", GGUFValueType.UINT32, 1),
    }
    return rewrite_gguf(trunk, dest, set_kvs=edits)


# ------------------------------------------------------------------------------------------------ extract


def test_extract_copies_every_nextn_tensor_byte_for_byte_keeping_its_name(converted: Path, tmp_path: Path) -> None:
    report = extract(converted, tmp_path / "draft.gguf", progress=False)
    source, draft = reader_tensors(converted), reader_tensors(report.output)
    block = open_model(converted).trunk_block_count
    assert set(draft) == {n for n in source if n.startswith(f"blk.{block}.")}
    assert all(draft[name] == source[name] for name in draft)


def test_nextn_blocks_come_from_block_count_and_nextn_predict_layers_not_from_names(tmp_path: Path) -> None:
    # Blocks M,*,E and two blocks with NextN tensors; the metadata says how many of them are NextN blocks.
    one = write_target(tmp_path / "m", pattern="M*E+", with_nextn=True, name="two")
    key = "nemotron_h_moe.nextn_predict_layers"
    two = rewrite_gguf(one, tmp_path / "two-nextn.gguf", set_kvs={key: encode_kv(key, GGUFValueType.UINT32, 2)})
    for model, blocks in ((one, {"4"}), (two, {"3", "4"})):
        report = extract(model, tmp_path / f"draft-{len(blocks)}.gguf", progress=False)
        assert {name.split(".")[1] for name in reader_tensors(report.output)} == blocks
    assert report.plan.nextn.describe() == "blk.3..blk.4"


def test_draft_carries_the_model_kvs_compose_needs_and_not_the_tokenizer(
    nemotron_converted: Path, tmp_path: Path
) -> None:
    report = extract(nemotron_converted, tmp_path / "draft.gguf", progress=False)
    source, draft = read_header(nemotron_converted), read_header(report.output)
    arch = "nemotron_h_moe"
    for key in (
        "general.architecture", f"{arch}.embedding_length", f"{arch}.vocab_size", f"{arch}.block_count",
        f"{arch}.nextn_predict_layers", f"{arch}.attention.head_count_kv", f"{arch}.feed_forward_length",
    ):
        assert draft.kvs[key].raw == source.kvs[key].raw, key
    assert draft.get(f"{arch}.attention.head_count_kv")[3] == 2  # the NextN block is attention ...
    assert draft.get(f"{arch}.feed_forward_length")[3] == 256  # ... and MoE
    assert not [k for k in draft.kvs if k.startswith(("tokenizer.", "split."))]


def test_draft_states_the_vocabulary_size_of_a_source_with_only_a_token_list(tmp_path: Path) -> None:
    model = write_target(tmp_path / "m", with_nextn=True, name="tokens")
    arch = "nemotron_h_moe"
    tokens = encode_kv(TOKENS, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.STRING, tuple(f"t{i}" for i in range(512))))
    listed = rewrite_gguf(model, tmp_path / "listed.gguf", set_kvs={f"{arch}.vocab_size": None, TOKENS: tokens})
    report = extract(listed, tmp_path / "draft.gguf", progress=False)
    vocab = read_header(report.output).kvs[f"{arch}.vocab_size"]
    assert (vocab.vtype, vocab.value) == (GGUFValueType.UINT32, 512)
    assert report.plan.added_kvs == (f"{arch}.vocab_size",)


def test_draft_tensor_offsets_use_the_source_alignment(tmp_path: Path) -> None:
    model = write_target(tmp_path / "m", with_nextn=True, alignment=64, name="aligned")
    report = extract(model, tmp_path / "draft.gguf", progress=False)
    header = read_header(report.output)
    assert header.alignment == 64
    assert all(t.offset % 64 == 0 for t in header.tensors)
    assert header.file_size == header.data_offset + align_up(header.tensor_data_end, 64)


def test_standalone_carries_the_source_globals_and_every_model_kv(nemotron_converted: Path, tmp_path: Path) -> None:
    report = extract(nemotron_converted, tmp_path / "mtp.gguf", standalone=True, progress=False)
    source, standalone = reader_tensors(nemotron_converted), reader_tensors(report.output)
    for name in ("token_embd.weight", "output_norm.weight", "output.weight"):
        assert standalone[name] == source[name]
    globals_ = {"token_embd.weight", "output_norm.weight", "output.weight"}
    assert set(standalone) == _nextn_names(nemotron_converted) | globals_
    source_kvs = {k: v for k, v in reader_kvs(nemotron_converted).items() if not k.startswith("split.")}
    assert reader_kvs(report.output) == source_kvs


def test_standalone_keeps_the_tokenizer(tmp_path: Path) -> None:
    model = write_target(tmp_path / "m", with_nextn=True, name="tok")
    tokens = encode_kv(TOKENS, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.STRING, tuple(f"t{i}" for i in range(512))))
    add_raw_kvs(model, [tokens])
    standalone = extract(model, tmp_path / "mtp.gguf", standalone=True, progress=False).output
    assert read_header(standalone).kvs[TOKENS].raw == tokens.raw
    assert TOKENS not in read_header(extract(model, tmp_path / "draft.gguf", progress=False).output).kvs


@pytest.mark.llama
def test_standalone_loads_in_llama_cpp_as_an_mtp_only_model(converted: Path, tmp_path: Path) -> None:
    report = extract(converted, tmp_path / "mtp.gguf", standalone=True, progress=False)
    check = check_with_llama(report.output, trunk=False)
    assert check.ok, check.summary() + "\n" + check.log_tail
    assert check.n_layer_nextn == 1 and check.mtp_decode_ok


def test_extracted_standalone_is_accepted_by_compose_with_its_globals_left_out(
    nemotron_converted: Path, nemotron_split: Path, tmp_path: Path
) -> None:
    standalone = extract(nemotron_converted, tmp_path / "mtp.gguf", standalone=True, progress=False).output
    report = compose(nemotron_split, standalone, tmp_path / "out", progress=False)
    assert set(report.plan.dropped) == {"token_embd.weight", "output_norm.weight", "output.weight"}
    assert len(report.plan.renamed) == 18


def test_extract_refuses_a_model_without_nextn_block(nemotron_split: Path, tmp_path: Path) -> None:
    with pytest.raises(NoNextNBlockError, match="no NextN"):
        extract(nemotron_split, tmp_path / "draft.gguf")
    assert not (tmp_path / "draft.gguf").exists()


def test_extract_refuses_a_declared_nextn_block_without_tensors(tmp_path: Path) -> None:
    hollow = _hollow(write_target(tmp_path / "m", name="hollow"), tmp_path / "hollow.gguf")
    with pytest.raises(BadGGUFError, match=r"blk\.3 has no tensors"):
        extract(hollow, tmp_path / "draft.gguf")


def test_extract_refuses_a_nextn_block_llama_cpp_would_silently_ignore(tmp_path: Path) -> None:
    model = write_target(tmp_path / "m", with_nextn=True, name="no-eh-proj")
    broken = rewrite_gguf(model, tmp_path / "broken.gguf", drop_tensors=("blk.3.nextn.eh_proj.weight",))
    with pytest.raises(BadGGUFError, match=r"blk\.3 is incomplete: no blk\.3\.nextn\.eh_proj\.weight"):
        extract(broken, tmp_path / "draft.gguf")


def test_extract_refuses_block_tensors_beyond_block_count(tmp_path: Path) -> None:
    model = write_target(tmp_path / "m", with_nextn=True, name="short")
    arch = "nemotron_h_moe"
    short = rewrite_gguf(
        model, tmp_path / "short.gguf",
        set_kvs={f"{arch}.block_count": encode_kv(f"{arch}.block_count", GGUFValueType.UINT32, 3)},
    )
    with pytest.raises(BadGGUFError, match=r"lies beyond nemotron_h_moe.block_count = 3"):
        extract(short, tmp_path / "draft.gguf")


def test_standalone_needs_the_source_token_embedding(nemotron_draftN: Path, tmp_path: Path) -> None:
    with pytest.raises(BadGGUFError, match="no token_embd.weight"):
        extract(nemotron_draftN, tmp_path / "mtp.gguf", standalone=True)


def test_extract_dry_run_writes_nothing(nemotron_converted: Path, tmp_path: Path) -> None:
    report = extract(nemotron_converted, tmp_path / "draft.gguf", dry_run=True)
    assert report.plan.output.size > 0 and report.bytes_written == 0
    assert list(tmp_path.iterdir()) == []


def test_extract_refuses_an_existing_output_unless_forced(nemotron_converted: Path, tmp_path: Path) -> None:
    output = tmp_path / "draft.gguf"
    output.write_bytes(b"keep me")
    with pytest.raises(UnsafeOutputError, match="exists"):
        extract(nemotron_converted, output, progress=False)
    assert output.read_bytes() == b"keep me"
    extract(nemotron_converted, output, force=True, progress=False)
    assert read_header(output).tensors


def test_extract_refuses_to_write_over_its_source(tmp_path: Path) -> None:
    model = write_target(tmp_path, with_nextn=True, name="self")
    before = file_hashes(tmp_path)
    with pytest.raises(UnsafeOutputError, match="overwrite the input"):
        extract(model, model, force=True)
    assert file_hashes(tmp_path) == before


# -------------------------------------------------------------------------------------------------- strip


def test_strip_of_a_composite_gives_back_its_target_byte_for_byte(
    composite: tuple[Path, Path], tmp_path: Path
) -> None:
    composed, target = composite
    report = strip(composed, tmp_path / "trunk", progress=False)
    assert file_hashes(tmp_path / "trunk") == file_hashes(target.parent)
    assert all(not f.moved_tensors for f in report.plan.files)


def test_strip_restores_block_count_arrays_and_split_counts(nemotron_converted: Path, tmp_path: Path) -> None:
    report = strip(nemotron_converted, tmp_path / "trunk", progress=False)
    arch = "nemotron_h_moe"
    first = read_header(report.output_paths[0])
    source = read_header(nemotron_converted)
    assert first.kvs[f"{arch}.block_count"].vtype == source.kvs[f"{arch}.block_count"].vtype
    assert first.get(f"{arch}.block_count") == 3
    assert f"{arch}.nextn_predict_layers" not in first.kvs
    assert first.get(f"{arch}.attention.head_count_kv") == [0, 2, 0]
    assert first.get(f"{arch}.feed_forward_length") == [0, 0, 256]
    total = sum(len(read_header(p).tensors) for p in report.output_paths)
    assert total == open_model(nemotron_converted).tensor_count - 18
    for path in report.output_paths:
        kv = read_header(path).kvs["split.tensors.count"]
        assert (kv.vtype, kv.value) == (GGUFValueType.INT32, total)


def test_strip_keeps_every_other_tensor_and_kv_exactly(converted: Path, tmp_path: Path) -> None:
    report = strip(converted, tmp_path / "trunk", progress=False)
    before, after = reader_tensors(converted), reader_tensors(report.output_paths[0])
    nextn = _nextn_names(converted)
    assert set(after) == set(before) - nextn
    assert all(after[name] == before[name] for name in after)
    changed = {c.key for c in report.plan.kv_changes}
    source, stripped = read_header(converted), read_header(report.output_paths[0])
    kept = [k for k in source.kvs if k not in changed]
    assert [k for k in stripped.kvs if k in kept] == kept
    assert all(stripped.kvs[k].raw == source.kvs[k].raw for k in kept)


def test_strip_moves_up_the_tensors_that_followed_the_nextn_block(nemotron_converted: Path, tmp_path: Path) -> None:
    report = strip(nemotron_converted, tmp_path / "trunk", progress=False)
    assert set(report.plan.files[-1].moved_tensors) == {"output_norm.weight", "output.weight"}
    # llama.cpp's rule: in table order, each tensor starts where the previous one ends, rounded up.
    for path in report.output_paths:
        header = read_header(path)
        position = 0
        for tensor in header.tensors:
            assert tensor.offset == align_up(position, header.alignment), tensor.name
            position = tensor.offset + tensor.nbytes
        assert header.file_size == header.data_offset + align_up(position, header.alignment)


def test_strip_repairs_a_model_that_declares_a_nextn_block_without_tensors(tmp_path: Path) -> None:
    trunk = write_target(tmp_path / "m", name="hollow")
    hollow = _hollow(trunk, tmp_path / "hollow" / "hollow.gguf")
    report = strip(hollow, tmp_path / "repaired", progress=False)
    assert report.plan.removed == [] and any("only the metadata" in n for n in report.notes)
    # The trunk again, but for the padding KV that keeps the data in step with the hollow file's (reflink).
    repaired = tmp_path / "repaired" / "hollow.gguf"
    assert reader_kvs(repaired) == reader_kvs(trunk) and reader_tensors(repaired) == reader_tensors(trunk)
    assert PAD_KEY in read_header(repaired).kvs and PAD_KEY not in read_header(trunk).kvs
    assert read_header(repaired).data_offset % 4096 == read_header(hollow).data_offset % 4096


@pytest.mark.llama
def test_strip_repair_turns_a_model_llama_cpp_refuses_into_one_it_loads(tmp_path: Path) -> None:
    hollow = _hollow(write_target(tmp_path / "m", name="hollow"), tmp_path / "hollow" / "hollow.gguf")
    refused = check_with_llama(hollow)
    assert not refused.ok and "'blk.3.nextn.enorm.weight' not found" in refused.log_tail
    repaired = strip(hollow, tmp_path / "repaired", progress=False).output_paths[0]
    check = check_with_llama(repaired, mtp=False)
    assert check.ok, check.summary()


@pytest.mark.slow
@pytest.mark.llama
def test_stripped_model_loads_in_llama_cpp_as_a_plain_model(converted: Path, tmp_path: Path) -> None:
    stripped = strip(converted, tmp_path / "trunk", progress=False).output_paths[0]
    plain = check_with_llama(stripped, mtp=False)
    assert plain.ok and plain.trunk_decode_ok, plain.summary() + "\n" + plain.log_tail
    with_mtp = check_with_llama(stripped)
    assert with_mtp.ok and with_mtp.n_layer_nextn == 0, with_mtp.summary()
    assert with_mtp.n_layer == open_model(converted).trunk_block_count


def test_strip_refuses_a_model_without_nextn_block(nemotron_split: Path, tmp_path: Path) -> None:
    with pytest.raises(NoNextNBlockError, match="no NextN"):
        strip(nemotron_split, tmp_path / "out")


def test_strip_refuses_an_mtp_only_model(nemotron_converted: Path, tmp_path: Path) -> None:
    standalone = extract(nemotron_converted, tmp_path / "mtp.gguf", standalone=True, progress=False).output
    with pytest.raises(BadGGUFError, match="MTP-only"):
        strip(standalone, tmp_path / "out")


def test_strip_dry_run_writes_nothing(nemotron_converted: Path, tmp_path: Path) -> None:
    report = strip(nemotron_converted, tmp_path / "out", dry_run=True)
    assert len(report.plan.files) == 3 and report.plan.bytes_to_write > 0
    assert not (tmp_path / "out").exists()


def test_strip_refuses_to_write_into_the_source_folder(nemotron_converted: Path) -> None:
    before = file_hashes(nemotron_converted.parent)
    with pytest.raises(UnsafeOutputError, match="overwrite the input"):
        strip(nemotron_converted, nemotron_converted.parent, force=True)
    assert file_hashes(nemotron_converted.parent) == before


# --------------------------------------------------------------------------------------------- round trip


def test_extract_strip_compose_gives_back_the_composite_byte_for_byte(
    composite: tuple[Path, Path], tmp_path: Path
) -> None:
    composed, _ = composite
    draft = extract(composed, tmp_path / "draft.gguf", progress=False).output
    trunk = strip(composed, tmp_path / "trunk", progress=False).output_paths[0]
    again = compose(trunk, draft, tmp_path / "again", progress=False)
    assert file_hashes(tmp_path / "again") == file_hashes(composed.parent)
    assert again.plan.renamed == tuple((n, n) for n, _ in again.plan.renamed)  # blk.N kept as is


def test_extract_strip_compose_of_a_converted_model_gives_identical_tensors_and_kvs(
    converted: Path, tmp_path: Path
) -> None:
    draft = extract(converted, tmp_path / "draft.gguf", progress=False).output
    trunk = strip(converted, tmp_path / "trunk", progress=False).output_paths[0]
    again = compose(trunk, draft, tmp_path / "again", progress=False).output_paths[0]
    assert reader_tensors(again) == reader_tensors(converted)
    assert reader_kvs(again) == reader_kvs(converted)
    for before, after in zip(shard_files(converted), shard_files(again)):
        assert reader_kvs(after) == reader_kvs(before)


def test_round_trip_moves_several_nextn_blocks_together(tmp_path: Path) -> None:
    one = write_target(tmp_path / "m", pattern="M*E+", with_nextn=True, name="two")
    key = "nemotron_h_moe.nextn_predict_layers"
    two = rewrite_gguf(one, tmp_path / "two" / "two.gguf", set_kvs={key: encode_kv(key, GGUFValueType.UINT32, 2)})
    draft = extract(two, tmp_path / "draft.gguf", progress=False).output
    trunk = strip(two, tmp_path / "trunk", progress=False).output_paths[0]
    assert read_header(trunk).get("nemotron_h_moe.feed_forward_length") == [0, 0, 256]
    again = compose(trunk, draft, tmp_path / "again", progress=False).output_paths[0]
    assert reader_tensors(again) == reader_tensors(two)
    assert reader_kvs(again) == reader_kvs(two)


@pytest.mark.slow
@pytest.mark.llama
def test_every_round_trip_intermediate_loads_in_llama_cpp(nemotron_composite: Path, tmp_path: Path) -> None:
    draft = extract(nemotron_composite, tmp_path / "mtp.gguf", standalone=True, progress=False).output
    trunk = strip(nemotron_composite, tmp_path / "trunk", progress=False).output_paths[0]
    again = compose(trunk, draft, tmp_path / "again", progress=False).output_paths[0]
    assert check_with_llama(draft, trunk=False).ok
    assert check_with_llama(trunk, mtp=False).ok
    check = check_with_llama(again)
    assert check.ok and check.n_layer_nextn == 1 and check.mtp_decode_ok, check.summary()


# -------------------------------------------------------------------------------------------------- graft


@pytest.fixture(scope="module", params=["nemotron_h_moe", "glm4moe"])
def donor_and_receiver(request: pytest.FixtureRequest, work: Path) -> tuple[Path, Path]:
    """A Q8_0 model with its NextN block, and a differently quantized ("mixed") trunk-only quant in 2 shards."""
    family = _family(request.param)
    folder = work / f"graft-{request.param}"
    donor = write_target(folder / "q8", family=family, with_nextn=True, quant="Q8_0", name="Model-Q8_0", seed=3)
    receiver = write_target(folder / "ud", family=family, quant="mixed", shards=2, name="Model-UD-Q4_K_XL", seed=4)
    return donor, receiver


def test_graft_keeps_every_target_byte_and_adds_the_source_block_verbatim(
    donor_and_receiver: tuple[Path, Path], tmp_path: Path
) -> None:
    donor, receiver = donor_and_receiver
    report = graft(donor, receiver, tmp_path / "out", verify=False, progress=False)
    result, target, source = reader_tensors(report.output_paths[0]), reader_tensors(receiver), reader_tensors(donor)
    nextn = _nextn_names(donor)
    assert set(result) == set(target) | nextn
    assert all(result[name] == target[name] for name in target)
    assert all(result[name] == source[name] for name in nextn)
    assert [p.name for p in report.output_paths] == [p.name for p in shard_files(receiver)]


def test_graft_gives_the_same_files_as_extract_then_compose(
    donor_and_receiver: tuple[Path, Path], tmp_path: Path
) -> None:
    donor, receiver = donor_and_receiver
    graft(donor, receiver, tmp_path / "grafted", verify=False, progress=False)
    draft = extract(donor, tmp_path / "draft.gguf", progress=False).output
    compose(receiver, draft, tmp_path / "composed", progress=False)
    assert file_hashes(tmp_path / "grafted") == file_hashes(tmp_path / "composed")


def test_graft_reads_nextn_bytes_straight_from_the_source_without_a_temporary_draft(
    donor_and_receiver: tuple[Path, Path], tmp_path: Path
) -> None:
    donor, receiver = donor_and_receiver
    report = graft(donor, receiver, tmp_path / "out", verify=False, progress=False)
    sources = {s for output in report.plan.outputs for s in output.sources}
    assert sources == {*shard_files(donor), *shard_files(receiver)}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in report.output_paths)


def test_graft_verification_compares_the_nextn_bytes_with_the_source(
    donor_and_receiver: tuple[Path, Path], tmp_path: Path
) -> None:
    donor, receiver = donor_and_receiver
    report = graft(donor, receiver, tmp_path / "out", verify=True, llama=False, progress=False)
    assert report.ok and report.verification is not None
    draft_check = report.verification.check("draft tensors")
    assert draft_check.ok and f"{len(_nextn_names(donor))} draft block tensors" in draft_check.detail
    # and it would notice a NextN byte that differs from the source's
    composite = copy_model(report.output_paths[0], tmp_path / "flipped")
    last = shard_files(composite)[-1]
    header = read_header(last)
    nextn = next(t for t in header.tensors if t.name in _nextn_names(donor))
    flip_byte(last, header.data_offset + nextn.offset)
    again = verify(composite, target=receiver, draft=donor, llama=False, progress=False)
    assert again.check("draft tensors").ok is False and nextn.name in again.check("draft tensors").detail


@pytest.mark.slow
@pytest.mark.llama
def test_grafted_model_runs_an_mtp_decode_step_in_llama_cpp(
    donor_and_receiver: tuple[Path, Path], tmp_path: Path
) -> None:
    donor, receiver = donor_and_receiver
    report = graft(donor, receiver, tmp_path / "out", verify=True, llama=True, progress=False)
    assert report.ok and report.verification is not None, report.describe()
    check = check_with_llama(report.output_paths[0])
    assert check.ok and check.n_layer_nextn == 1 and check.mtp_decode_ok, check.summary()


def _refused(source: Path, target: Path, out: Path, match: str) -> None:
    with pytest.raises(IncompatibleDraftError, match=match):
        graft(source, target, out, progress=False)
    assert not out.exists()


def test_graft_refuses_a_different_vocabulary_size(nemotron_converted: Path, tmp_path: Path) -> None:
    other = write_target(tmp_path / "v", hparams=with_hparams(n_vocab=1024), name="big-vocab")
    expected = r"vocabularies \(nemotron_h_moe.vocab_size\) differ: 512 in the source, 1024 in the target"
    _refused(nemotron_converted, other, tmp_path / "out", expected)


def test_graft_refuses_a_different_token_list_of_the_same_size(tmp_path: Path) -> None:
    donor = write_target(tmp_path / "a", with_nextn=True, name="donor")
    receiver = write_target(tmp_path / "b", name="receiver")
    words = [f"t{i}" for i in range(512)]
    add_raw_kvs(donor, [encode_kv(TOKENS, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.STRING, tuple(words)))])
    words[17] = "other"
    add_raw_kvs(receiver, [encode_kv(TOKENS, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.STRING, tuple(words)))])
    expected = r"tokenizer.ggml.tokens hashes differ .*token 17 is 't17' in the source, 'other'"
    _refused(donor, receiver, tmp_path / "out", expected)


def test_graft_accepts_identical_token_lists(tmp_path: Path) -> None:
    donor = write_target(tmp_path / "a", with_nextn=True, name="donor")
    receiver = write_target(tmp_path / "b", name="receiver", quant="Q8_0")
    tokens = encode_kv(TOKENS, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.STRING, tuple(f"t{i}" for i in range(512))))
    add_raw_kvs(donor, [tokens])
    add_raw_kvs(receiver, [tokens])
    assert graft(donor, receiver, tmp_path / "out", dry_run=True).plan.composition.nextn_blocks == 1


def test_graft_refuses_a_different_embedding_width(nemotron_converted: Path, tmp_path: Path) -> None:
    other = write_target(tmp_path / "w", hparams=with_hparams(n_embd=768), name="wide")
    expected = r"embedding widths \(nemotron_h_moe.embedding_length\) differ: 512 in the source, 768 in the target"
    _refused(nemotron_converted, other, tmp_path / "out", expected)


def test_graft_refuses_a_different_architecture(glm_converted: Path, nemotron_split: Path, tmp_path: Path) -> None:
    expected = "architectures differ: 'glm4moe' in the source, 'nemotron_h_moe' in the target"
    _refused(glm_converted, nemotron_split, tmp_path / "out", expected)


def test_graft_refuses_a_different_trunk_block_count(
    nemotron_converted: Path, nemotron_single: Path, tmp_path: Path
) -> None:
    _refused(nemotron_converted, nemotron_single, tmp_path / "out", r"trunk block counts differ: 3 .* 6 in the target")


def test_graft_refuses_a_target_that_already_has_a_nextn_block(
    nemotron_converted: Path, nemotron_composite: Path, tmp_path: Path
) -> None:
    _refused(nemotron_converted, nemotron_composite, tmp_path / "out", "already has 1 NextN block.*strip them first")


def test_graft_refuses_a_source_without_nextn_block(nemotron_split: Path, tmp_path: Path) -> None:
    with pytest.raises(NoNextNBlockError):
        graft(nemotron_split, nemotron_split, tmp_path / "out")


def test_graft_notes_other_hyperparameters_that_differ(tmp_path: Path) -> None:
    donor = write_target(tmp_path / "a", with_nextn=True, name="donor")
    receiver = write_target(tmp_path / "b", name="receiver")
    key = "nemotron_h_moe.context_length"
    edits = {key: encode_kv(key, GGUFValueType.UINT32, 8192)}
    longer = rewrite_gguf(receiver, tmp_path / "c" / "receiver.gguf", set_kvs=edits)
    report = graft(donor, longer, tmp_path / "out", dry_run=True)
    assert report.notes == [f"hyperparameters differ: {key} is 4096 in the source, 8192 in the target"]


def test_graft_dry_run_checks_everything_and_writes_nothing(
    donor_and_receiver: tuple[Path, Path], tmp_path: Path
) -> None:
    donor, receiver = donor_and_receiver
    report = graft(donor, receiver, tmp_path / "out", dry_run=True)
    assert report.plan.bytes_to_write > 0 and report.verification is None
    assert not (tmp_path / "out").exists()


def test_virtual_draft_ranges_resolve_to_the_bytes_they_were_planned_from() -> None:
    planned = (Bytes(b"HEAD"), Zeros(4), CopyRange(Path("/src"), 100, 8), Zeros(2))
    assert list(slice_segments(planned, 2, 12, "draft")) == [Bytes(b"AD"), Zeros(4), CopyRange(Path("/src"), 100, 6)]
    assert list(slice_segments(planned, 10, 6, "draft")) == [CopyRange(Path("/src"), 102, 6)]
    with pytest.raises(ValueError, match="beyond the planned file"):
        list(slice_segments(planned, 16, 4, "draft"))
