"""Nemotron 3 Nano / 3.5 Lightning: ``nemotron_h_moe`` whose MoE has no latent projection (experts at full width).

The existing Nemotron-H converter handles it (no ``moe_latent_size`` -> no ``ffn_latent_*``, experts
``[hidden, ff]``); these tests prove it by value and through llama.cpp. Against llama.cpp's own converter:
tests/test_upstream_parity.py's ``nemotron_nano`` entry (one tiny full Nano checkpoint converted ``--no-mtp``,
``--mtp``, and full with the router patch of ``upstream/01``, which only changes the MTP router's type: the one
thing that keeps an unpatched full file's MTP logits from matching; its allowed differences are listed there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from support.convert_support import checkpoint_bytes as _raw
from support.helpers import reader_kvs, reader_tensors
from support.nano_checkpoints import NANO_HPARAMS, write_nano_head_checkpoint

from gguf_mtp.errors import CheckpointError
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import BIAS_SPELLINGS, mtpv2_config, write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import NEMOTRON_H_MOE, write_target

Q = GGMLQuantizationType
BLOCK = 3  # the M*E trunk's block count: the NextN block is blk.3
#: Nano's NextN block: NextN fusion 3, attention 5, MoE 7 (no latent projections), head norm 1.
NANO_BLOCK = {
    "nextn.enorm.weight": (Q.F32, (128,)), "nextn.hnorm.weight": (Q.F32, (128,)),
    "nextn.eh_proj.weight": (Q.BF16, (256, 128)), "attn_norm.weight": (Q.F32, (128,)),
    "attn_q.weight": (Q.BF16, (128, 128)), "attn_k.weight": (Q.BF16, (128, 64)), "attn_v.weight": (Q.BF16, (128, 64)),
    "attn_output.weight": (Q.BF16, (128, 128)), "post_attention_norm.weight": (Q.F32, (128,)),
    "ffn_gate_inp.weight": (Q.F32, (128, 4)), "exp_probs_b.bias": (Q.F32, (4,)),
    "ffn_up_exps.weight": (Q.BF16, (128, 128, 4)), "ffn_down_exps.weight": (Q.BF16, (128, 128, 4)),
    "ffn_up_shexp.weight": (Q.BF16, (128, 128)), "ffn_down_shexp.weight": (Q.BF16, (128, 128)),
    "nextn.shared_head_norm.weight": (Q.F32, (128,)),
}


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_nano_head_checkpoint(tmp_path_factory.mktemp("nano") / "Nano-head")


def test_nano_head_names_shapes_types(head: Path, tmp_path: Path) -> None:
    draft = convert(head, tmp_path / "d.gguf", block=BLOCK, progress=False).output
    ours = reader_tensors(draft)
    assert {n: (t, s) for n, (t, s, _) in ours.items()} == {f"blk.{BLOCK}.{k}": v for k, v in NANO_BLOCK.items()}
    assert not any("latent" in n for n in ours)
    kvs = reader_kvs(draft)
    assert "nemotron_h_moe.moe_latent_size" not in kvs
    assert kvs["nemotron_h_moe.expert_feed_forward_length"][1] == NANO_HPARAMS.n_ff_exp
    assert kvs["nemotron_h_moe.feed_forward_length"][1] == [0, 0, 128, 128]  # M*E + NextN (attention + MoE)
    assert kvs["nemotron_h_moe.attention.head_count_kv"][1] == [0, 2, 0, 2]
    # experts stacked in index order at full width, bytes unchanged
    for proj in ("up", "down"):
        parts = [_raw(head, f"mtp.layers.1.mixer.experts.{e}.{proj}_proj.weight") for e in range(4)]
        assert len(set(parts)) == 4
        assert ours[f"blk.{BLOCK}.ffn_{proj}_exps.weight"][2] == b"".join(parts)
    assert ours[f"blk.{BLOCK}.attn_q.weight"][2] == _raw(head, "mtp.layers.0.mixer.q_proj.weight")


def test_null_latent_size_and_both_bias_spellings_give_the_same_draft(head: Path, tmp_path: Path) -> None:
    reference = reader_tensors(convert(head, tmp_path / "ref.gguf", block=BLOCK, progress=False).output)
    for latent_key, spelling in (("null", BIAS_SPELLINGS[0]), ("absent", BIAS_SPELLINGS[1])):
        folder = write_nano_head_checkpoint(tmp_path / f"{latent_key}-{spelling}" / head.name, latent_key=latent_key,
                                            bias_spelling=spelling, files=1)
        out = convert(folder, tmp_path / f"{latent_key}-{spelling}.gguf", block=BLOCK, progress=False).output
        assert reader_tensors(out) == reference


def test_latent_tensors_without_latent_size_are_refused(tmp_path: Path) -> None:
    # a Super-shaped head whose config lost moe_latent_size: one line, nothing written
    folder = write_mtpv2_checkpoint(tmp_path / "h", hparams=NANO_HPARAMS)
    config = mtpv2_config(NANO_HPARAMS)
    del config["moe_latent_size"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"no NextN tensor blk\.N\.ffn_latent_(down|up)\.weight is expected"):
        convert(folder, tmp_path / "d.gguf", block=BLOCK, progress=False)
    assert not (tmp_path / "d.gguf").exists()


@pytest.mark.slow
@pytest.mark.llama
def test_nano_draft_composed_into_a_tiny_target_runs_an_mtp_step(head: Path, tmp_path: Path) -> None:
    from gguf_mtp.check.llama_check import check_with_llama

    # tiny_models' Nemotron trunk always has latent projections; with moe_latent = n_embd its experts are at full
    # width, so Nano's head (no latent projection) fits it, and llama.cpp skips the absent latent tensors.
    assert NANO_HPARAMS.moe_latent == NANO_HPARAMS.n_embd
    target = write_target(tmp_path / "t", family=NEMOTRON_H_MOE, hparams=NANO_HPARAMS, quant="BF16")
    draft = convert(head, tmp_path / "d.gguf", target=target, progress=False)
    assert not any("latent" in t.name for t in draft.plan.tensors)
    composite = compose(target, draft.output, tmp_path / "out", progress=False).output_paths[0]
    check = check_with_llama(composite)
    assert check.ok, check.summary() + "\n" + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (BLOCK, 1)
    assert check.mtp_decode_ok and check.mtp_logits_finite
