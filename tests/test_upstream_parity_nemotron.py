"""Nemotron 3 Super (Nemotron-H MoE with a latent MoE, MTPv2) against llama.cpp's own convert_hf_to_gguf.py: what is
particular to it.

The checks every family shares are tests/test_upstream_parity.py's ``nemotron_super`` entry: one tiny full
checkpoint (trunk ``M*E`` + MTPv2 head, BF16, GPT-2's real tokenizer) converted by upstream ``--no-mtp``, ``--mtp``
and full with the router patch of ``upstream/01``, and by gguf-mtp; its allowed differences (the MTP router widened
to F32, the q/k row order) are listed there. Here, on the same shared set: upstream's unpatched full file, whose MTP
router alone differs, runs with the composite's trunk logits.
"""

from __future__ import annotations

import pytest
from support.upstream import ParitySet

from gguf_mtp.check.llama_check import check_with_llama

pytestmark = [pytest.mark.upstream, pytest.mark.llama]


@pytest.mark.parity("nemotron_super")
def test_unpatched_upstream_full_runs_with_the_composites_trunk_logits(parity: ParitySet) -> None:
    ours, unpatched = check_with_llama(parity.composite), check_with_llama(parity.full)
    for check in (ours, unpatched):
        assert check.ok and check.mtp_decode_ok, check.summary() + check.log_tail
    assert ours.trunk_logits_sha256 is not None
    assert unpatched.trunk_logits_sha256 == ours.trunk_logits_sha256  # the trunks are the same bytes
