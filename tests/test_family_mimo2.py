"""MiMo-V2 (mimo2): ``convert`` of the three MTP layers into three NextN blocks, BF16 and block-scaled FP8 with both
layouts of the fused ``qkv_proj`` (4 tensor-parallel ranks, as MiMo-V2.5 ships it, and unsharded), checked by value,
by llama.cpp (an MTP decode through every block) and against llama.cpp's own convert_hf_to_gguf.py.

Upstream runs on the BF16 and the tensor-parallel FP8 checkpoints (full, ``--no-mtp``, ``--mtp``: the entries
``mimo2-bf16`` and ``mimo2-tp4`` of tests/test_upstream_parity.py, where no difference is allowed). It refuses the
unsharded FP8 one (``_tp_aware_qkv_dequant``: "cannot detect TP - scale_inv rows 3, q+k+v 352"; its one-rank branch
cannot be reached), so there ``qkv_proj`` is checked against the plain block dequantization (llama.cpp's
``dequant_simple``, written out in tests/support/fp8_checkpoints.py) and the file is run by llama.cpp.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from support.convert_support import raw_tensor
from support.fp8_checkpoints import dequantize_reference
from support.helpers import reader_kvs, reader_tensors
from support.mimo_checkpoints import (
    HYBRID,
    IGNORED,
    N_KV_FULL,
    N_KV_SWA,
    N_LAYER,
    H,
    qkv_rows,
    write_mimo_checkpoint,
)
from support.upstream import ParitySet, assert_same_tensors, parity_set

from gguf_mtp.conversion.mimo2 import qkv_rank_count
from gguf_mtp.errors import CheckpointError
from gguf_mtp.format.safetensors_io import CONFIG_NAME
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert

Q = GGMLQuantizationType
BLOCKS = (2, 3, 4)  # model.mtp.layers.{0,1,2} -> blk.{2,3,4}
QKV = "self_attn.qkv_proj.weight"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("mimo")
    return {variant: write_mimo_checkpoint(work / variant / "MiMo-tiny", fp8=None if variant == "bf16" else variant)
            for variant in ("bf16", "tp4", "unsharded")}


def _draft(folder: Path, out: Path) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    return reader_tensors(convert(folder, out, block=N_LAYER, progress=False).output)


def _scales(folder: Path, name: str) -> np.ndarray:
    _, shape, raw = raw_tensor(folder, name + "_scale_inv")
    return np.frombuffer(raw, np.float32).reshape(shape)


# ------------------------------------------------------------------------------------------------ convert


def test_three_blocks_renumbered_together(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    folder = checkpoints["bf16"]
    ours = _draft(folder, tmp_path / "d.gguf")
    assert len(ours) == 3 * 12
    q, k, v = qkv_rows(N_KV_SWA)
    for i, block in enumerate(BLOCKS):
        p = f"model.mtp.layers.{i}."
        assert ours[f"blk.{block}.attn_qkv.weight"][:2] == (Q.BF16, (H, q + k + v))
        assert ours[f"blk.{block}.attn_qkv.weight"][2] == raw_tensor(folder, p + QKV)[2]
        assert ours[f"blk.{block}.attn_sinks.weight"][:2] == (Q.F32, (4,))
        assert ours[f"blk.{block}.layer_output_norm.weight"][0] == Q.F32
        assert ours[f"blk.{block}.nextn.eh_proj.weight"][2] == raw_tensor(folder, p + "eh_proj.weight")[2]
    kvs = reader_kvs(convert(folder, tmp_path / "d2.gguf", block=N_LAYER, progress=False).output)
    assert kvs["mimo2.nextn_predict_layers"][1] == 3 and kvs["mimo2.block_count"][1] == 5
    assert kvs["mimo2.attention.sliding_window_pattern"][1] == [*HYBRID, 1, 1, 1]
    assert kvs["mimo2.attention.head_count_kv"][1] == [N_KV_FULL, N_KV_SWA, N_KV_SWA, N_KV_SWA, N_KV_SWA]
    assert kvs["mimo2.attention.value_length"][1] == 24 and kvs["mimo2.attention.key_length"][1] == 32


def test_the_fixture_has_both_scale_layouts_and_partial_blocks(checkpoints: dict[str, Path]) -> None:
    name = "model.mtp.layers.0." + QKV
    rows = sum(qkv_rows(N_KV_SWA))
    assert rows == 352 and H == 160  # neither a multiple of 128
    assert _scales(checkpoints["unsharded"], name).shape == (3, 2) and _scales(checkpoints["tp4"], name).shape == (4, 2)
    assert qkv_rank_count(3, rows, 128) == 1 and qkv_rank_count(4, rows, 128) == 4
    assert qkv_rank_count(8, rows, 128) == 8 and qkv_rank_count(5, rows, 128) is None
    config = json.loads((checkpoints["tp4"] / CONFIG_NAME).read_text())
    assert config["quantization_config"]["ignored_layers"] == IGNORED
    assert raw_tensor(checkpoints["tp4"], "model.mtp.layers.1.self_attn.o_proj.weight")[0] == "BF16"


@pytest.mark.parametrize("layout", ["unsharded", "tp4"])
def test_fp8_qkv_is_dequantized_with_its_layouts_scales_and_regrouped(
    layout: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    folder = checkpoints[layout]
    ours = _draft(folder, tmp_path / "d.gguf")
    q, k, v = qkv_rows(N_KV_SWA)
    for i, block in enumerate(BLOCKS):
        name = f"model.mtp.layers.{i}.{QKV}"
        _, shape, codes = raw_tensor(folder, name)
        scales = _scales(folder, name)
        if layout == "unsharded":  # llama.cpp's dequant_simple over the whole tensor
            expected = dequantize_reference(codes, shape, scales, (128, 128))
        else:  # each rank on its own block rows, then [Q_0..Q_3 | K_0..K_3 | V_0..V_3]
            per_rank = shape[0] // 4
            ranks = [dequantize_reference(codes[r * per_rank * H : (r + 1) * per_rank * H], (per_rank, H),
                                          scales[r * math.ceil(per_rank / 128) : (r + 1) * math.ceil(per_rank / 128)],
                                          (128, 128)) for r in range(4)]
            cuts = [(0, q // 4), (q // 4, (q + k) // 4), ((q + k) // 4, per_rank)]
            expected = np.concatenate([rank[a:b] for a, b in cuts for rank in ranks])
        assert ours[f"blk.{block}.attn_qkv.weight"][:2] == (Q.BF16, (H, q + k + v))
        assert ours[f"blk.{block}.attn_qkv.weight"][2] == gguf_quants.quantize(expected, Q.BF16).tobytes()
    # ignored_layers stay as stored: BF16 bytes copied
    assert ours["blk.3.attn_output.weight"][2] == raw_tensor(folder, "model.mtp.layers.1.self_attn.o_proj.weight")[2]


def test_a_qkv_scale_of_neither_layout_is_one_line(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from support.convert_support import rewrite_checkpoint_tensor

    folder = tmp_path / "bad"
    shutil.copytree(checkpoints["tp4"], folder)
    name = f"model.mtp.layers.0.{QKV}_scale_inv"
    rewrite_checkpoint_tensor(folder, name, shape=[5, 2], data=np.ones((5, 2), np.float32).tobytes())
    with pytest.raises(CheckpointError, match=r"qkv_proj.weight_scale_inv is F32 \[5, 2\].*needs 3 scale rows "
                                              r"unsharded or tp \* ceil\(rows / tp / 128\) for 8 or 4"):
        convert(folder, tmp_path / "d.gguf", block=N_LAYER, progress=False)
    assert not (tmp_path / "d.gguf").exists()


def test_split_qkv_is_refused_naming_the_fused_one(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from support.convert_support import rewrite_checkpoint_tensor

    folder = tmp_path / "split"
    shutil.copytree(checkpoints["bf16"], folder)
    split = "model.mtp.layers.2.self_attn.q_proj.weight"
    rewrite_checkpoint_tensor(folder, f"model.mtp.layers.2.{QKV}", new_name=split)
    with pytest.raises(CheckpointError, match="llama.cpp's mimo2 MTP graph needs a fused qkv_proj"):
        convert(folder, tmp_path / "d.gguf", block=N_LAYER, progress=False)


# --------------------------------------------------------------------------------------- upstream parity
# (the BF16 and tensor-parallel FP8 checkpoints: tests/test_upstream_parity.py's ``mimo2-bf16`` and ``mimo2-tp4``
# entries, where no difference is allowed; here what is particular to MiMo's FP8 layouts)


@pytest.mark.upstream
@pytest.mark.parity("mimo2-tp4")
def test_fp8_to_q8_0_in_one_pass_equals_upstreams_q8_0(parity: ParitySet, tmp_path: Path) -> None:
    from support.upstream import upstream_convert

    checkpoint = parity.checkpoint
    theirs = reader_tensors(upstream_convert(checkpoint, tmp_path / "mtp-q8.gguf", "--mtp", outtype="q8_0"))
    draft = convert(checkpoint, tmp_path / "d.gguf", block=N_LAYER, outtype="q8_0", progress=False).output
    ours = reader_tensors(draft)
    assert ours["blk.2.attn_qkv.weight"][0] == Q.Q8_0
    assert_same_tensors(ours, {n: t for n, t in theirs.items() if n.startswith("blk.")})


@pytest.mark.upstream
@pytest.mark.llama
@pytest.mark.parity("mimo2-tp4")
def test_unsharded_fp8_head_runs_in_llama_through_every_block(
    checkpoints: dict[str, Path], parity: ParitySet, tmp_path: Path
) -> None:
    """Upstream converts no part of the unsharded FP8 checkpoint (its trunk's qkv_proj is unsharded too): the head is
    spliced into the trunk upstream made from the tensor-parallel variant (same model shape, other weights) and into
    a standalone MTP model, and llama.cpp runs an MTP decode through each of the three blocks."""
    from gguf_mtp.check.llama_check import check_with_llama

    trunk = parity.trunk
    draft = convert(checkpoints["unsharded"], tmp_path / "d.gguf", target=trunk, progress=False).output
    composite = compose(trunk, draft, tmp_path / "c", progress=False).output_paths[0]
    standalone = convert(checkpoints["unsharded"], tmp_path / "sa.gguf", target=trunk, standalone=True,
                         progress=False).output
    for path, with_trunk in ((composite, True), (standalone, False)):
        check = check_with_llama(path, trunk=with_trunk)
        assert check.ok and check.mtp_logits_finite, check.summary() + check.log_tail
        assert (check.n_layer_nextn, check.mtp_blocks_decoded) == (3, 3)


@pytest.mark.upstream
@pytest.mark.llama
def test_patched_upstream_converts_the_unsharded_fp8_checkpoint_as_gguf_mtp_does(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """upstream/05-mimo-unsharded-fp8-qkv: with the patch, llama.cpp's converter takes the unsharded layout as one
    rank; its output then equals gguf-mtp's (the patch's proof)."""

    from support.upstream import ROOT, patched_tree

    from gguf_mtp.check.llama_check import check_with_llama

    patch = ROOT / "upstream/05-mimo-unsharded-fp8-qkv/mimo-unsharded-fp8-qkv.patch"
    tree = patched_tree(patch, tmp_path / "llama.cpp")
    files = parity_set(Path(shutil.copytree(checkpoints["unsharded"], tmp_path / "hf")), tmp_path, tree=tree)
    theirs = {n: t for n, t in reader_tensors(files.mtp).items() if n.startswith("blk.")}
    assert len(theirs) == 36
    assert_same_tensors(reader_tensors(files.draft), theirs)
    assert_same_tensors(reader_tensors(files.composite), reader_tensors(files.full))
    ours, upstream_full = check_with_llama(files.composite), check_with_llama(files.full)
    assert ours.ok and ours.mtp_blocks_decoded == 3, ours.summary() + ours.log_tail
    assert ours.mtp_logits_sha256 is not None and ours.mtp_logits_sha256 == upstream_full.mtp_logits_sha256


def test_bad_config_or_layers_are_one_line(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from support.convert_support import rewrite_checkpoint_tensor

    folder = tmp_path / "bad"
    shutil.copytree(checkpoints["bf16"], folder)
    config = json.loads((folder / CONFIG_NAME).read_text())
    (folder / CONFIG_NAME).write_text(json.dumps(config | {"hybrid_layer_pattern": [0, 1, 1]}))
    with pytest.raises(CheckpointError, match=r"hybrid_layer_pattern is not a list of 2 entries 0 or 1"):
        convert(folder, tmp_path / "d.gguf", block=N_LAYER, progress=False)
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    rewrite_checkpoint_tensor(folder, "model.mtp.layers.1.enorm.weight", new_name="model.mtp.layers.7.enorm.weight")
    layers = r"the MTP layers are model\.mtp\.layers\.\{0, 1, 2, 7\}: expected 0\.\.k-1"
    with pytest.raises(CheckpointError, match=layers):
        convert(folder, tmp_path / "d.gguf", block=N_LAYER, progress=False)
    assert not (tmp_path / "d.gguf").exists()


@pytest.mark.upstream
@pytest.mark.llama
@pytest.mark.parity("mimo2-tp4")
def test_accept_clips_n_max_to_a_chain_of_three_heads_as_llama_server_does(parity: ParitySet) -> None:
    """Issue 37 item 9: a chain of heads drafts one token per block (common/speculative.cpp clips n-max to the
    blocks), so n-max 4 on MiMo-V2's three blocks is n-max 3; a chain built 4 long aborted llama.cpp
    (``GGML_ASSERT nextn_layer_offset out of range``)."""
    from gguf_mtp.check.accept import accept

    report = accept(parity.composite, tokens=8, n_max=(1, 2, 3, 4), threads=1)
    assert report.heads == 3
    assert [report.drafted_n_max(run) for run in report.runs] == [1, 2, 3, 3]
    three, four = report.runs[2], report.runs[3]
    assert (four.draft_n, four.draft_n_accepted) == (three.draft_n, three.draft_n_accepted)
    assert any("n-max 4 drafts at most 3 token(s)" in line for line in report.notes())
