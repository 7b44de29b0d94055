"""Block counts read from a file are bounded before anything loops (issue 11, item 5), through the one
shared reading in :mod:`gguf_mtp.model.blocks` that inspect, verify, compose, extract, strip and graft use."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType as T
from support.helpers import no_hang, rewrite_gguf

from gguf_mtp import compose
from gguf_mtp.check.inspect import inspect
from gguf_mtp.check.verify import verify
from gguf_mtp.errors import BadGGUFError, IncompatibleDraftError
from gguf_mtp.format.header import encode_kv, read_header
from gguf_mtp.jobs.extract import extract
from gguf_mtp.jobs.strip import strip
from gguf_mtp.model.blocks import MAX_BLOCK_COUNT, block_tensor_problems, is_mtp_only, read_block_layout
from gguf_mtp.testing.tiny_models import write_target

ARCH = "nemotron_h_moe"
COUNT, NEXTN = f"{ARCH}.block_count", f"{ARCH}.nextn_predict_layers"
HUGE = 2**32 - 1


def _with(src: Path, dst: Path, **kvs: int) -> Path:
    edits = {f"{ARCH}.{k}": encode_kv(f"{ARCH}.{k}", T.UINT32, v) for k, v in kvs.items()}
    return rewrite_gguf(src, dst, set_kvs=edits)


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("mtp"), with_nextn=True)


@pytest.mark.parametrize("kvs", [{"block_count": HUGE}, {"block_count": HUGE, "nextn_predict_layers": HUGE}])
def test_a_huge_block_count_is_refused_by_every_command_without_looping(
    kvs: dict[str, int], mtp_model: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    hostile = _with(mtp_model, tmp_path / "hostile.gguf", **kvs)
    expect = f"{COUNT} = {HUGE:,} is beyond any model (gguf-mtp accepts at most {MAX_BLOCK_COUNT:,} blocks"
    with no_hang(20):
        assert any(expect in p for p in inspect(hostile).problems)
        report = verify(hostile, llama=False, progress=False)
        assert not report.ok and expect in report.check("per-layer arrays").detail
        for run in (
            lambda: extract(hostile, tmp_path / "d.gguf"),
            lambda: strip(hostile, tmp_path / "s"),
            lambda: compose(hostile, nemotron_draft0, tmp_path / "c"),
            lambda: compose(tmp_path / "hostile.gguf", hostile, tmp_path / "c"),
        ):
            with pytest.raises(BadGGUFError, match=expect.replace("(", r"\(")):
                run()
    assert not (tmp_path / "d.gguf").exists() and not (tmp_path / "s").exists() and not (tmp_path / "c").exists()


def test_nextn_beyond_block_count_is_refused(mtp_model: Path, tmp_path: Path) -> None:
    hostile = _with(mtp_model, tmp_path / "h.gguf", nextn_predict_layers=HUGE)
    with pytest.raises(BadGGUFError, match=rf"{NEXTN} = {HUGE} is not within 0..4 \(block_count\)"):
        read_block_layout(read_header(hostile))


def test_a_scalar_feed_forward_length_with_the_largest_block_count_stays_cheap(mtp_model: Path, tmp_path: Path) -> None:
    key = f"{ARCH}.feed_forward_length"
    wide = rewrite_gguf(
        mtp_model, tmp_path / "w.gguf",
        set_kvs={COUNT: encode_kv(COUNT, T.UINT32, MAX_BLOCK_COUNT), key: encode_kv(key, T.UINT32, 256)},
    )
    with no_hang(20):
        summary = inspect(wide)
    # the model has blocks 0..3; blocks 4 .. 65534 have no tensors, and the NextN block is declared as blk.65535
    assert f"{COUNT} = {MAX_BLOCK_COUNT} declares 65535 trunk block(s), but blk.4, blk.5, blk.6 and 65,528 more " \
        "have no tensors" in summary.problems


def test_block_tensor_problems_and_the_mtp_only_predicate() -> None:
    from gguf_mtp.model.blocks import BlockLayout

    layout = BlockLayout(ARCH, 4, 1)
    assert block_tensor_problems(layout, {0, 1, 2, 3}) == []
    assert block_tensor_problems(layout, set()) == []  # vocab-only
    assert block_tensor_problems(layout, {3}) == []  # MTP-only: the trunk is empty by design
    assert block_tensor_problems(layout, {0, 3}) == [f"{ARCH}.block_count = 4 declares 3 trunk block(s), but blk.1, "
                                                     "blk.2 have no tensors"]
    assert block_tensor_problems(layout, {0, 1, 2, 3, 4}) == ["tensors of blk.4, beyond block_count 4"]
    assert is_mtp_only(layout, {3}) and is_mtp_only(BlockLayout(ARCH, 1, 1), {0})
    assert not is_mtp_only(layout, {0, 1, 2, 3}) and not is_mtp_only(BlockLayout(ARCH, 3, 0), {0, 1, 2})


def test_compose_target_target_is_refused_as_a_trunk_model_draft(nemotron_single: Path, tmp_path: Path) -> None:
    with pytest.raises(IncompatibleDraftError, match="the draft has no NextN block: it looks like a trunk model"):
        compose(nemotron_single, nemotron_single, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_compose_draft_target_says_the_arguments_look_swapped(
    nemotron_split: Path, nemotron_draftN: Path, tmp_path: Path
) -> None:
    with pytest.raises(IncompatibleDraftError, match="the arguments look swapped: .* is an MTP draft"):
        compose(nemotron_draftN, nemotron_split, tmp_path / "out")


def test_a_target_whose_block_count_disagrees_with_its_tensors_is_refused(
    nemotron_single: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    lying = _with(nemotron_single, tmp_path / "lying.gguf", block_count=7)  # 6 blocks of tensors
    with pytest.raises(BadGGUFError, match="declares 7 trunk block\\(s\\), but blk.6 has no tensors"):
        compose(lying, nemotron_draft0, tmp_path / "out")
