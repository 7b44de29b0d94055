"""One test (or more) per pitfall of earlier MTP-splicing tools (docs/reliability.md, "Pitfalls of earlier
MTP-splicing tools", 1-11)."""

from __future__ import annotations

import errno
import itertools
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from support.helpers import copy_model, reader_kvs, reader_tensors, rewrite_gguf

from gguf_mtp import (
    BadGGUFError,
    IncompatibleDraftError,
    OutputWriteError,
    ShardSetError,
    UnsafeOutputError,
    compose,
)
from gguf_mtp import write as output_module
from gguf_mtp.format.header import GGUFArray, encode_kv, read_header
from gguf_mtp.testing.tiny_models import add_raw_kvs, write_draft, write_target

ARCH = "nemotron_h_moe"
Q = GGMLQuantizationType
T = GGUFValueType


def _draft_with_tensors(
    path: Path, tensors: dict[str, tuple[Q, tuple[int, ...]]], *, alignment: int | None = None
) -> Path:
    """A minimal nemotron_h_moe draft (blk.0) holding the given tensors as random bytes of the right size."""
    rng = np.random.default_rng(7)
    writer = GGUFWriter(path, ARCH)
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_block_count(1)
    writer.add_nextn_predict_layers(1)
    writer.add_embedding_length(512)
    writer.add_vocab_size(512)
    writer.add_head_count_kv([2])
    writer.add_feed_forward_length([256])
    for name, (qtype, shape) in tensors.items():
        block, size = GGML_QUANT_SIZES[qtype]
        row = shape[0] // block * size
        data = rng.integers(0, 256, size=(*reversed(shape[1:]), row), dtype=np.uint8)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# 1. Wrong block sizes: K-quants with block 64, wrong IQ sizes, I8 (24) taken for IQ1_M (29).
EXOTIC = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ3_XXS, Q.IQ1_S, Q.IQ4_XS, Q.IQ1_M, Q.I8, Q.IQ2_XS, Q.TQ1_0]


def test_1_tensor_sizes_come_from_gguf_py_table_for_every_quant_type(nemotron_split: Path, tmp_path: Path) -> None:
    tensors = {f"blk.0.t_{q.name.lower()}.weight": (q, (512, 3)) for q in EXOTIC}
    draft = _draft_with_tensors(tmp_path / "exotic.gguf", tensors)
    report = compose(nemotron_split, draft, tmp_path / "out")
    last = report.output_paths[-1]
    reader = GGUFReader(last)
    ours = {t.name: t for t in read_header(last).tensors}
    offsets = sorted((t.data_offset, t.n_bytes) for t in reader.tensors)
    for (offset, nbytes), (next_offset, _) in itertools.pairwise(offsets):
        assert offset + nbytes <= next_offset  # every size fits the room before the next tensor
    for t in reader.tensors:
        assert ours[t.name].nbytes == t.n_bytes
    draft_bytes = reader_tensors(draft)
    after = reader_tensors(report.output_paths[0])
    for name in tensors:
        new = "blk.3." + name.removeprefix("blk.0.")
        assert after[new] == draft_bytes[name]
    assert after["blk.3.t_q4_k.weight"][0] == 12 and len(after["blk.3.t_q4_k.weight"][2]) == 3 * 512 // 256 * 144
    assert after["blk.3.t_i8.weight"][0] == 24 and after["blk.3.t_iq1_m.weight"][0] == 29


def test_1_a_size_that_overruns_the_next_tensor_is_refused(nemotron_single: Path, tmp_path: Path) -> None:
    header = read_header(nemotron_single)
    first, second = header.tensors[0], header.tensors[1]
    bad = tmp_path / "overlap.gguf"
    # make the first tensor claim more rows than the room before the second one
    rows = first.shape[1] * 4
    from gguf_mtp.format.header import TensorInfo, serialize_header

    tensors = [TensorInfo(first.name, (first.shape[0], rows), first.ggml_type, first.offset, 0), *header.tensors[1:]]
    with open(nemotron_single, "rb") as src, open(bad, "wb") as dst:
        dst.write(serialize_header(header.version, header.kvs.values(), tensors, header.alignment))
        src.seek(header.data_offset)
        shutil.copyfileobj(src, dst)
    with pytest.raises(BadGGUFError, match=f"'{first.name}' and '{second.name}' overlap"):
        read_header(bad)


# 2. Arrays lost their header on re-serialisation.
EXOTIC_KVS = [
    encode_kv("test.i8_array", T.ARRAY, [-128, 0, 127], T.INT8),
    encode_kv("test.i16_array", T.ARRAY, [-32768, 1, 32767], T.INT16),
    encode_kv("test.u64_array", T.ARRAY, [0, 2**64 - 1], T.UINT64),
    encode_kv("test.i64_array", T.ARRAY, [-(2**63), 5], T.INT64),
    encode_kv("test.f64_array", T.ARRAY, [1.5, -2.25e300], T.FLOAT64),
    encode_kv("test.bool_array", T.ARRAY, [True, False, True], T.BOOL),
    encode_kv("test.str_array", T.ARRAY, ["", "ü", "a b"], T.STRING),
    encode_kv("test.empty_u8_array", T.ARRAY, [], T.UINT8),
    encode_kv("test.empty_str_array", T.ARRAY, [], T.STRING),
    encode_kv(
        "test.nested",
        T.ARRAY,
        GGUFArray(T.ARRAY, (GGUFArray(T.UINT16, (1, 2)), GGUFArray(T.UINT16, ()), GGUFArray(T.UINT16, (3,)))),
    ),
    encode_kv("test.nested_str", T.ARRAY, GGUFArray(T.ARRAY, (GGUFArray(T.STRING, ("x", "yz")),))),
    encode_kv("test.i16", T.INT16, -2),
    encode_kv("test.u64", T.UINT64, 2**63),
    encode_kv("test.f64", T.FLOAT64, 0.1),
    encode_kv("test.bool", T.BOOL, True),
    encode_kv("test.i8", T.INT8, -1),
    encode_kv("test.empty_str", T.STRING, ""),
]


def test_2_every_value_type_round_trips_byte_exactly(nemotron_draft0: Path, tmp_path: Path) -> None:
    target = write_target(tmp_path / "exotic", shards=3)
    add_raw_kvs(target, EXOTIC_KVS)
    report = compose(target, nemotron_draft0, tmp_path / "out")
    after = read_header(report.output_paths[0])
    for kv in EXOTIC_KVS:
        assert after.kvs[kv.key].raw == kv.raw, kv.key
    theirs = reader_kvs(report.output_paths[0])
    assert theirs["test.i16_array"] == ([T.ARRAY, T.INT16], [-32768, 1, 32767])
    assert theirs["test.bool_array"] == ([T.ARRAY, T.BOOL], [True, False, True])
    assert theirs["test.str_array"][1] == ["", "ü", "a b"]
    # the tensor table after the KVs is intact: every target tensor still reads back identically
    before = reader_tensors(target)
    assert all(reader_tensors(report.output_paths[0])[n] == v for n, v in before.items())


# 3. Stale split.tensors.count: see test_compose.test_split_tensors_count_is_total_in_every_shard and the
#    llama.cpp oracle test; here: its integer type is kept whatever it is.
def test_3_split_tensors_count_keeps_its_integer_type(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    target = copy_model(nemotron_split, tmp_path / "u64")
    for path in sorted(target.parent.iterdir()):
        rewrite_gguf(
            path,
            path.with_suffix(".tmp"),
            set_kvs={"split.tensors.count": encode_kv("split.tensors.count", T.UINT64, 26)},
        )
        os.replace(path.with_suffix(".tmp"), path)
    report = compose(target, nemotron_draft0, tmp_path / "out")
    for path in report.output_paths:
        assert reader_kvs(path)["split.tensors.count"] == ([T.UINT64], 44)


# 4. Per-layer arrays not extended, or extended with the last trunk layer's value.
def test_4_per_layer_array_keeps_its_element_type_and_takes_the_draft_value(tmp_path: Path) -> None:
    target = write_target(tmp_path / "t", shards=1)
    add_raw_kvs(target, [encode_kv(f"{ARCH}.custom_per_layer", T.ARRAY, [1, 2, 3], T.UINT16)])
    scalar_draft = write_draft(tmp_path / "scalar.gguf")
    add_raw_kvs(scalar_draft, [encode_kv(f"{ARCH}.custom_per_layer", T.UINT32, 7)])
    array_draft = write_draft(tmp_path / "array.gguf", block="N")
    add_raw_kvs(array_draft, [encode_kv(f"{ARCH}.custom_per_layer", T.ARRAY, [0, 0, 0, 9], T.INT32)])
    for draft, expected in ((scalar_draft, 7), (array_draft, 9)):
        report = compose(target, draft, tmp_path / draft.stem)
        assert reader_kvs(report.output_paths[0])[f"{ARCH}.custom_per_layer"] == (
            [T.ARRAY, T.UINT16],
            [1, 2, 3, expected],
        )


def test_4_a_draft_without_a_value_for_a_per_layer_array_is_refused(nemotron_split: Path, tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "d.gguf")
    stripped = rewrite_gguf(draft, tmp_path / "no-ff.gguf", set_kvs={f"{ARCH}.feed_forward_length": None})
    with pytest.raises(IncompatibleDraftError, match=f"draft has no {ARCH}.feed_forward_length"):
        compose(nemotron_split, stripped, tmp_path / "out")


# 5. Typed overrides silently ignored (see test_compose.test_bad_set_kv_is_refused); a non-integer block_count.
def test_5_a_non_integer_block_count_is_refused(nemotron_draft0: Path, tmp_path: Path) -> None:
    target = write_target(tmp_path / "t")
    bad = rewrite_gguf(
        target,
        tmp_path / "f32-count.gguf",
        set_kvs={f"{ARCH}.block_count": encode_kv(f"{ARCH}.block_count", T.FLOAT32, 3.0)},
    )
    with pytest.raises(BadGGUFError, match="block_count is missing or not a non-negative integer"):
        compose(bad, nemotron_draft0, tmp_path / "out")


# 6. Shard discovery by prefix.
def test_6_siblings_are_found_by_the_exact_pattern_only(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "folder"
    first = copy_model(nemotron_split, folder)
    stem = first.name.removesuffix("-00001-of-00003.gguf")
    # decoys an earlier tool's prefix glob would have picked up
    shutil.copy(first, folder / f"{stem}-MTPv2-00001-of-00003.gguf")
    shutil.copy(first, folder / f"mmproj-{stem}.gguf")
    shutil.copy(first, folder / f"{stem}-00004-of-00004.gguf")
    report = compose(folder / f"{stem}-00002-of-00003.gguf", nemotron_draft0, tmp_path / "out")
    assert [p.name for p in report.plan.target.paths] == [f"{stem}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_6_a_missing_shard_is_named(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    first = copy_model(nemotron_split, tmp_path / "folder")
    middle = first.with_name(first.name.replace("00001-of", "00002-of"))
    middle.unlink()
    with pytest.raises(ShardSetError, match=f"missing {middle.name}"):
        compose(first, nemotron_draft0, tmp_path / "out")


# 7. Unchecked block index.
def test_7_block_option_must_be_the_trunk_block_count(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    with pytest.raises(IncompatibleDraftError, match="^[^:]*: block 5: .* can only be 3"):
        compose(nemotron_split, nemotron_draft0, tmp_path / "out", block=5)
    assert compose(nemotron_split, nemotron_draft0, tmp_path / "out", block=3).plan.block == 3


def test_7_a_target_that_already_has_the_block_tensors_is_refused(nemotron_draft0: Path, tmp_path: Path) -> None:
    target = write_target(tmp_path / "t", with_nextn=True)
    lying = rewrite_gguf(
        target,
        tmp_path / "lying.gguf",
        set_kvs={
            f"{ARCH}.block_count": encode_kv(f"{ARCH}.block_count", T.UINT32, 3),
            f"{ARCH}.nextn_predict_layers": None,
        },
    )
    with pytest.raises(IncompatibleDraftError, match="already has tensors of blk.3"):
        compose(lying, nemotron_draft0, tmp_path / "out")


# 8. Draft renaming.
@pytest.mark.parametrize(("blocks", "message"), [((5,), "blk.5: expected blk.0"), ((0, 3), "blk.0, blk.3")])
def test_8_drafts_at_other_blocks_are_refused(
    blocks: tuple[int, ...], message: str, nemotron_split: Path, tmp_path: Path
) -> None:
    tensors = {f"blk.{b}.nextn.eh_proj.weight": (Q.BF16, (1024, 512)) for b in blocks}
    draft = _draft_with_tensors(tmp_path / "d.gguf", tensors)
    with pytest.raises(IncompatibleDraftError, match=message):
        compose(nemotron_split, draft, tmp_path / "out")


def test_8_a_non_block_tensor_other_than_the_globals_is_refused(nemotron_split: Path, tmp_path: Path) -> None:
    draft = _draft_with_tensors(
        tmp_path / "d.gguf",
        {"blk.0.nextn.eh_proj.weight": (Q.BF16, (1024, 512)), "nextn.embed_tokens.weight": (Q.F16, (512, 512))},
    )
    with pytest.raises(IncompatibleDraftError, match="'nextn.embed_tokens.weight' is outside any block"):
        compose(nemotron_split, draft, tmp_path / "out")


# 9. Suffix matching of keys.
def test_9_only_the_architecture_block_count_changes(nemotron_draft0: Path, tmp_path: Path) -> None:
    target = write_target(tmp_path / "t", shards=3)
    decoys = [
        encode_kv("clip.vision.block_count", T.UINT32, 3),
        encode_kv(f"{ARCH}.posnet.block_count", T.UINT32, 3),
        encode_kv("other.block_count", T.UINT32, 3),
    ]
    add_raw_kvs(target, decoys)
    report = compose(target, nemotron_draft0, tmp_path / "out")
    after = read_header(report.output_paths[0])
    for kv in decoys:
        assert after.kvs[kv.key].raw == kv.raw
    assert after.get(f"{ARCH}.block_count") == 4


# 10. Two alignments: appended offsets and padding use the output's alignment.
@pytest.mark.parametrize("draft_alignment", [None, 128])
def test_10_appended_tensors_use_the_output_alignment(
    draft_alignment: int | None, nemotron_single: Path, tmp_path: Path
) -> None:
    draft = write_draft(tmp_path / "d.gguf", trunk_pattern="M*EM*E", alignment=draft_alignment)
    report = compose(nemotron_single, draft, tmp_path / "out")
    header = read_header(report.output_paths[0])
    assert header.alignment == 64
    assert header.first_misplaced_tensor() is None  # back to back, each padded to 64: llama.cpp's layout
    added = [t for t in header.tensors if t.name.startswith("blk.6.")]
    assert len(added) == 18 and all(t.offset % 64 == 0 for t in added)
    # the padding bytes between appended tensors are zeros
    with open(report.output_paths[0], "rb") as f:
        for t in added:
            f.seek(header.data_offset + t.offset + t.nbytes)
            pad = (-t.nbytes) % 64
            assert f.read(pad) == b"\0" * pad


# 11. Outputs truncated in place / half-written files with final names.
@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_11_output_that_is_an_input_through_a_link_is_refused(link: str, nemotron_draft0: Path, tmp_path: Path) -> None:
    target = write_target(tmp_path / "t")
    out = tmp_path / "out"
    out.mkdir()
    (out / target.name).symlink_to(target) if link == "symlink" else os.link(target, out / target.name)
    before = target.read_bytes()
    with pytest.raises(UnsafeOutputError, match="would overwrite the input"):
        compose(target, nemotron_draft0, out, force=True)
    assert target.read_bytes() == before


def test_11_a_failure_mid_write_leaves_no_file_with_a_final_name(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real_copy = output_module._copy

    def failing_copy(*args, **kwargs):  # the third copy (shard 3's data) hits a full disk
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(output_module, "_copy", failing_copy)
    with pytest.raises(OutputWriteError, match="No space left on device"):
        compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing with a final name, not even the folder the run made
