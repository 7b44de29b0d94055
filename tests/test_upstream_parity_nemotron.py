"""Nemotron-H MoE (MTPv2): gguf-mtp against llama.cpp's own convert_hf_to_gguf.py, tensor for tensor and by logits.

One tiny full checkpoint (trunk ``M*E`` + MTPv2 head, BF16, GPT-2's real tokenizer) is converted by upstream three
ways (full, ``--no-mtp``, ``--mtp``) and once more by upstream with the router patch of ``upstream/01``; gguf-mtp
converts the same checkpoint's head. The one allowed difference is in :data:`ALLOWED`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from support.helpers import reader_tensors
from support.session import shared_tmp_dir
from support.upstream import (
    ROOT,
    ParitySet,
    assert_runs_like,
    assert_same_tensors_up_to,
    assert_strip_gives_trunk,
    parity_set,
)

from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.testing.tiny_checkpoints import write_full_nemotron_checkpoint
from gguf_mtp.testing.tiny_models import TinyHparams

pytestmark = [pytest.mark.upstream, pytest.mark.llama]

MTP_BLOCK = 3
ROUTER = f"blk.{MTP_BLOCK}.ffn_gate_inp.weight"
#: tensor -> why gguf-mtp's bytes differ from upstream's, and how they relate (checked by :func:`_same_up_to`).
ALLOWED = {
    ROUTER: ("widened", "gguf-mtp keeps every router F32, the MTP one too; upstream's F32 rule reads the block id "
             "from the HF name (mtp.layers.1 -> 1) and leaves the MTP router BF16 (upstream/01 fixes it)"),
    f"blk.{MTP_BLOCK}.attn_q.weight": ("permuted", "upstream runs the MTP attention through LlamaModel.permute "
                                       "(Granite's undo_permute); Nemotron-H has no RoPE, so the same row order "
                                       "change in Q and K leaves Q.K^T and the logits unchanged"),
    f"blk.{MTP_BLOCK}.attn_k.weight": ("permuted", "as attn_q"),
}
PATCH = ROOT / "upstream/01-nemotronh-mtp-router-f32/nemotronh-mtp-router-f32.patch"
HPARAMS = TinyHparams(n_embd=128, n_vocab=50264, n_head=4, n_head_kv=2, head_dim=32, n_expert=4, n_ff_exp=128,
                      n_ff_shexp=128, moe_latent=128)


@pytest.fixture(scope="module")
def files(request: pytest.FixtureRequest) -> ParitySet:
    work = shared_tmp_dir(request, "nemotron-parity")
    return parity_set(write_full_nemotron_checkpoint(work / "hf", HPARAMS), work)


@pytest.fixture(scope="module")
def full_patched(files: ParitySet) -> Path:
    """Upstream's full conversion with the router patch of ``upstream/01``."""
    return files.full_with_patch(PATCH)


def _assert_same_tensors(ours: dict, theirs: dict, allowed: tuple[str, ...] = ("widened", "permuted")) -> None:
    assert_same_tensors_up_to(ours, theirs, ALLOWED, allowed, HPARAMS.n_head, HPARAMS.n_head_kv)


def test_convert_equals_upstream_mtp_block(files: ParitySet) -> None:
    prefix = f"blk.{MTP_BLOCK}."
    theirs = {n: t for n, t in reader_tensors(files.mtp).items() if n.startswith(prefix)}
    ours = reader_tensors(files.draft)
    assert len(theirs) == 18  # NextN fusion 3, attention 5, latent MoE 9, head norm 1
    _assert_same_tensors(ours, theirs)
    assert ours[ROUTER][0] == GGMLQuantizationType.F32 and theirs[ROUTER][0] == GGMLQuantizationType.BF16


def test_strip_of_upstream_full_equals_its_no_mtp_file(files: ParitySet, tmp_path: Path) -> None:
    assert_strip_gives_trunk(files.full, files.trunk, tmp_path)


def test_compose_of_no_mtp_and_draft_equals_upstream_full(files: ParitySet, full_patched: Path) -> None:
    _assert_same_tensors(reader_tensors(files.composite), reader_tensors(files.full))
    # with the router patch, upstream writes what gguf-mtp does but for the (harmless) q/k row order
    _assert_same_tensors(reader_tensors(files.composite), reader_tensors(full_patched), ("permuted",))


def test_mtp_logits_equal_patched_upstream(files: ParitySet, full_patched: Path) -> None:
    ours = assert_runs_like(files.composite, full_patched)
    unpatched = check_with_llama(files.full)
    assert unpatched.trunk_logits_sha256 == ours.trunk_logits_sha256  # the trunks are the same bytes
