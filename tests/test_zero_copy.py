"""Plans for sharing extents: every copied range of the file an output derives from lands at an offset
congruent to its source offset mod 4 KiB, through a padding KV that llama.cpp and gguf-py ignore.

These tests need no reflink filesystem: they check the plans (pure) and the written files' bytes; the
kernel path that shares extents is tested on a real XFS image in ``test_reflink.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType
from support.helpers import file_hashes, reader_kvs, reader_tensors

from gguf_mtp import compose, open_model
from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.files.kernel_copy import SHARE_BLOCK, CopyTally, copy_range
from gguf_mtp.files.plan import Bytes, CopyRange, OutputFile, Zeros
from gguf_mtp.format.header import GGUFArray, encode_kv, parse_header, read_header
from gguf_mtp.format.layout import PAD_KEY, appended_data_residue, congruence, congruent_header, placements
from gguf_mtp.jobs.compose_plan import plan_composition
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.extract import extract, plan_extraction
from gguf_mtp.jobs.graft import plan_graft
from gguf_mtp.jobs.strip import plan_strip, strip
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import write_target
from gguf_mtp.write import write_outputs

#: The padding KV's own bytes besides its items (key, type, item type, count).
PAD_OVERHEAD = 8 + len(PAD_KEY) + 4 + 4 + 8


def _in_step(destination: int, segment: CopyRange) -> bool:
    return (destination - segment.offset) % SHARE_BLOCK == 0


def _assert_ranges_from_in_step(output: OutputFile, source: Path) -> int:
    """Every range copied from ``source`` is congruent; returns how many bytes those ranges hold."""
    nbytes = 0
    for destination, segment in placements(output):
        if segment.source == source:
            assert _in_step(destination, segment), f"{output.path.name}: {segment} lands at {destination:,}"
            nbytes += segment.nbytes
    return nbytes


def _padding(path: Path) -> int:
    """Bytes the padding KV occupies in a file (0 without one)."""
    kv = read_header(path).kvs.get(PAD_KEY)
    return 0 if kv is None else len(kv.raw)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zero_copy")


@pytest.fixture(scope="module")
def converted(work: Path) -> Path:
    """As llama.cpp's converter writes a model with MTP: the NextN block spans shards 2 and 3, and
    output_norm / output follow it (so strip moves tensors, and extract reads two files)."""
    return write_target(work / "converted", with_nextn=True, shards=3, name="Zc-Q8-MTP", quant="Q8_0", seed=11)


# ------------------------------------------------------------------------------------------------ plans


@pytest.mark.parametrize("target_name", ["nemotron_split", "nemotron_metaonly", "nemotron_single", "glm_target"])
def test_compose_puts_every_target_range_in_step_with_its_shard(
    target_name: str, request: pytest.FixtureRequest, nemotron_draft0: Path, glm_draft: Path, tmp_path: Path
) -> None:
    target = request.getfixturevalue(target_name)
    draft = glm_draft if target_name == "glm_target" else nemotron_draft0
    plan = plan_composition(open_model(target), open_model(draft), tmp_path)
    for planned in plan.files:
        in_step = _assert_ranges_from_in_step(planned.output, planned.source)
        header = planned.output.segments[0]
        assert isinstance(header, Bytes)
        source = read_header(planned.source)
        if in_step:  # (a metadata-only first shard copies nothing, and is left unpadded)
            assert len(header.data) % SHARE_BLOCK == source.data_offset % SHARE_BLOCK
        else:
            assert source.tensors == () and PAD_KEY.encode() not in header.data
        # Still exactly llama.cpp's layout: the data section starts at a multiple of general.alignment.
        assert len(header.data) % read_header(planned.source).alignment == 0


def test_padding_costs_less_than_a_block_and_is_deterministic(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    one = plan_composition(open_model(nemotron_split), open_model(nemotron_draft0), tmp_path / "a")
    two = plan_composition(open_model(nemotron_split), open_model(nemotron_draft0), tmp_path / "b")
    padded = 0
    for a, b in zip(one.files, two.files):
        assert a.output.segments[0] == b.output.segments[0]  # same inputs, same header bytes
        head = a.output.segments[0].data  # type: ignore[union-attr]
        start = head.find(PAD_KEY.encode())
        if start < 0:
            continue
        padded += 1
        items = int.from_bytes(head[start + len(PAD_KEY) + 8 : start + len(PAD_KEY) + 16], "little")
        assert items < SHARE_BLOCK  # at most 4,095 zero bytes plus the KV's own 36
        assert head[start + len(PAD_KEY) + 16 : start + len(PAD_KEY) + 16 + items] == bytes(items)
    assert padded  # the fixture's headers change size, so some shard needs padding


def test_an_unpadded_header_already_in_step_gets_no_padding(nemotron_split: Path) -> None:
    header = read_header(nemotron_split)
    kvs = list(header.kvs.values())
    data = [CopyRange(Path(header.path), header.data_offset, 4096)]
    same = congruent_header(header.version, kvs, header.tensors, header.alignment, data, Path(header.path))
    assert same == Path(nemotron_split).read_bytes()[: header.data_offset]
    assert PAD_KEY.encode() not in same


@pytest.mark.parametrize("shift", [0, 1, 32, 4064, 4095])
def test_padding_reaches_every_residue_the_alignment_allows(nemotron_split: Path, shift: int) -> None:
    header = read_header(nemotron_split)
    kvs = [*header.kvs.values(), encode_kv("x.y", GGUFValueType.STRING, "z" * shift)]  # another header length
    source = Path(header.path)
    for residue in (0, 32, 2048, 4064):
        data = [Zeros(0), CopyRange(source, SHARE_BLOCK * 3 + residue, 100)]
        head = congruent_header(header.version, kvs, header.tensors, header.alignment, data, source)
        assert len(head) % SHARE_BLOCK == residue and len(head) % header.alignment == 0
        parsed = parse_header(lambda o, n, h=head: h[o : o + n], len(head) + header.data_size, "padded")
        assert parsed.data_offset == len(head) and list(parsed.kvs)[: len(kvs)] == [kv.key for kv in kvs]


def test_an_input_padding_kv_is_dropped_and_recomputed(nemotron_split: Path) -> None:
    header = read_header(nemotron_split)
    stale = encode_kv(PAD_KEY, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.UINT8, (0,) * 777))
    source = Path(header.path)
    data = [CopyRange(source, header.data_offset, 64)]
    fresh = congruent_header(header.version, [stale, *header.kvs.values()], header.tensors, header.alignment, data)
    assert fresh == Path(nemotron_split).read_bytes()[: header.data_offset]  # in step without any padding


def test_strip_of_a_composite_drops_the_padding_and_keeps_every_range_in_step(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    composite = compose(nemotron_split, nemotron_draft0, tmp_path / "c", progress=False).output_paths[0]
    assert any(_padding(p) for p in sorted((tmp_path / "c").glob("*.gguf")))  # the fixture's headers grew
    plan = plan_strip(open_model(composite), tmp_path / "trunk")
    for planned in plan.files:
        _assert_ranges_from_in_step(planned.output, planned.source)
    strip(composite, tmp_path / "trunk", progress=False)
    assert file_hashes(tmp_path / "trunk") == file_hashes(Path(nemotron_split).parent)
    assert not any(_padding(p) for p in (tmp_path / "trunk").iterdir())


def test_strip_that_moves_tensors_keeps_the_biggest_range_in_step(converted: Path, tmp_path: Path) -> None:
    plan = plan_strip(open_model(converted), tmp_path / "trunk")
    for planned in plan.files:
        ranges = [(d, s) for d, s in placements(planned.output) if s.source == planned.source]
        biggest = max(ranges, key=lambda r: r[1].nbytes)
        assert _in_step(*biggest)
    assert congruence(plan.outputs).in_step > 0.9 * congruence(plan.outputs).copied


def test_extract_puts_the_nextn_data_in_step(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    composite = compose(nemotron_split, nemotron_draft0, tmp_path / "c", progress=False).output_paths[0]
    plan = plan_extraction(open_model(composite), tmp_path / "draft.gguf")
    tally = congruence([plan.output])
    assert tally.copied > 0 and tally.in_step == tally.copied


def test_extract_then_compose_puts_even_the_draft_ranges_in_step(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    # The draft's data offset follows the NextN data in the model it came from, which is where compose
    # appends it again: a round trip on a reflink filesystem shares every byte.
    composite = compose(nemotron_split, nemotron_draft0, tmp_path / "c", progress=False).output_paths[0]
    draft = extract(composite, tmp_path / "draft.gguf", progress=False).output
    trunk = strip(composite, tmp_path / "trunk", progress=False).output_paths[0]
    plan = plan_composition(open_model(trunk), open_model(draft), tmp_path / "again")
    tally = congruence(plan.outputs)
    assert tally.in_step == tally.copied


@pytest.mark.parametrize("target_fixture", ["nemotron_split", "nemotron_single", "nemotron_metaonly"])
def test_a_draft_converted_for_its_target_lands_in_step_in_the_composite(
    target_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # convert --target lays the draft's data out where compose will append it (mod 4 KiB): every byte of
    # the composite, the draft's included, can then share extents with an input.
    target = request.getfixturevalue(target_fixture)
    head = write_mtpv2_checkpoint(tmp_path / "head", files=2)
    draft = convert(head, tmp_path / "draft.gguf", target=target, progress=False).output
    assert read_header(draft).data_offset % SHARE_BLOCK == appended_data_residue(open_model(target).headers[-1])
    plan = plan_composition(open_model(target), open_model(draft), tmp_path / "c")
    tally = congruence(plan.outputs)
    assert tally.in_step == tally.copied
    assert _assert_ranges_from_in_step(plan.outputs[-1], draft) == sum(t.nbytes for t in read_header(draft).tensors)
    # the padding is ours: compose does not carry the draft's into the composite, and the bytes are as before
    composite = compose(target, draft, tmp_path / "out", progress=False).output_paths[-1]
    assert reader_kvs(composite).keys() == reader_kvs(
        compose(target, draft, tmp_path / "again", progress=False).output_paths[-1]).keys()
    unpadded = convert(head, tmp_path / "plain.gguf", block=open_model(target).block_count, progress=False).output
    assert reader_tensors(draft) == reader_tensors(unpadded)


def test_graft_puts_every_target_range_in_step(converted: Path, nemotron_split: Path, tmp_path: Path) -> None:
    trunk = strip(converted, tmp_path / "trunk", progress=False).output_paths[0]
    plan = plan_graft(open_model(converted), open_model(trunk), tmp_path / "grafted")
    for planned in plan.composition.files:
        assert _assert_ranges_from_in_step(planned.output, planned.source) > 0


# ------------------------------------------------------------------------------------------ the outputs


def test_padded_outputs_read_back_with_gguf_py(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "c", progress=False)
    padded = [p for p in report.output_paths if _padding(p)]
    assert padded
    for path in padded:
        reader = GGUFReader(path)
        field = reader.fields[PAD_KEY]
        assert len(field.data) == (_padding(path) - PAD_OVERHEAD)  # one u8 per item, all zero
        assert reader.data_offset == read_header(path).data_offset
        assert reader.data_offset % SHARE_BLOCK == read_header(shard_of(nemotron_split, path)).data_offset % SHARE_BLOCK
    source = {k: v for k, v in reader_tensors(nemotron_split).items()}
    assert all(reader_tensors(report.output_paths[0])[name] == data for name, data in source.items())
    assert "nemotron_h_moe.block_count" in reader_kvs(report.output_paths[0])


def shard_of(target: Path, output: Path) -> Path:
    """The target shard an output shard of compose was made from (same name)."""
    return Path(target).parent / output.name


@pytest.mark.llama
def test_llama_cpp_loads_a_padded_composite_and_decodes_through_the_nextn_block(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "c", progress=False)
    assert _padding(report.output_paths[0]) or _padding(report.output_paths[-1])
    result = check_with_llama(report.output_paths[0])
    assert result.ok and result.n_layer_nextn == 1 and result.mtp_decode_ok, result.summary()


# ------------------------------------------------------------------------------------ the kernel copy


def _copy_once(tmp_path: Path, source_bytes: bytes, prefix: bytes, offset: int, nbytes: int) -> tuple[bytes, CopyTally]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(source_bytes)
    fd_in = os.open(src, os.O_RDONLY)
    fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd_out, prefix)

        class Bar:
            n = 0

            def update(self, k: int) -> None:
                Bar.n += k

        tally = CopyTally(Bar())
        copy_range(fd_in, fd_out, offset, nbytes, tally, "auto")
        assert Bar.n == nbytes  # the bar saw every byte, shared or copied
    finally:
        os.close(fd_in)
        os.close(fd_out)
    return dst.read_bytes(), tally


@pytest.mark.parametrize(
    ("prefix", "offset", "nbytes"),
    [(100, 100, 3 * SHARE_BLOCK + 7), (0, 0, 2 * SHARE_BLOCK), (4000, 4000, 96), (5, 700, 3 * SHARE_BLOCK)],
)
def test_head_body_tail_copies_give_the_same_bytes_on_any_filesystem(
    tmp_path: Path, prefix: int, offset: int, nbytes: int
) -> None:
    data = os.urandom(offset + nbytes + 333)
    got, tally = _copy_once(tmp_path, data, b"h" * prefix, offset, nbytes)
    assert got == b"h" * prefix + data[offset : offset + nbytes]
    assert tally.shared + tally.copied == nbytes
    assert tally.shared % SHARE_BLOCK == 0


def test_write_outputs_reports_bytes_shared_and_copied(tmp_path: Path) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom(5 * SHARE_BLOCK))
    output = OutputFile(tmp_path / "out" / "o.bin", (Bytes(b"x" * 10), CopyRange(src, 10, 4 * SHARE_BLOCK)))
    stats = write_outputs([output], progress=False)
    assert (tmp_path / "out" / "o.bin").read_bytes() == b"x" * 10 + src.read_bytes()[10 : 10 + 4 * SHARE_BLOCK]
    assert stats.bytes_written == 10 + 4 * SHARE_BLOCK
    # On ext4 or tmpfs nothing is shared; on XFS/btrfs three whole blocks are (test_reflink proves it).
    assert stats.bytes_shared in (0, 3 * SHARE_BLOCK)
    assert ("reflink" in stats.copy_methods) == bool(stats.bytes_shared)


def test_every_input_is_read_front_to_back_as_cp_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: each input a copy reads is opened with POSIX_FADV_SEQUENTIAL (coreutils cp does the same): a cold
    input streams with the larger readahead instead of in small reads."""
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(1 << 20))
    advised: list[tuple[str, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    out = OutputFile(tmp_path / "out" / "o.bin", (Bytes(b"GGUF"), CopyRange(source, 0, 1 << 20)))
    write_outputs([out], progress=False)
    assert (tmp_path / "out" / "o.bin").read_bytes() == b"GGUF" + source.read_bytes()
    assert advised == [(str(source), os.POSIX_FADV_SEQUENTIAL)]
