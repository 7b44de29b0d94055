"""Tencent Hy3 (hy_v3): ``convert`` of the MTP layer, checked by value, by llama.cpp, and against llama.cpp's own
convert_hf_to_gguf.py tensor for tensor.

The upstream part converts one tiny full checkpoint (tencent/Hy3's keys and names, 2 shards + index with the MTP
layer alone in the last, GPT-2's real tokenizer) three ways (full, ``--no-mtp``, ``--mtp``): one MTP layer in
tests/test_upstream_parity.py's ``hy_v3`` entry, two here. No tensor and no key of the composite may differ
(upstream writes the same size_label into both files here, so compose keeping the target's changes nothing).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from support.convert_support import checkpoint_bytes as _raw
from support.convert_support import widened_bf16 as _widened
from support.helpers import reader_kvs, reader_tensors
from support.hy_checkpoints import HY_HPARAMS, hy_config, hy_tensors, write_hy_checkpoint
from support.upstream import (
    ParitySet,
    assert_same_tensors,
)

from gguf_mtp.conversion import model_class_for_arch
from gguf_mtp.conversion.hy_v3 import HYV3MTPModel
from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.safetensors_io import CONFIG_NAME
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import write_safetensors
from gguf_mtp.testing.tiny_models import GLM4MOE, relabel_arch, write_target

Q = GGMLQuantizationType
N = 2  # num_hidden_layers of the tiny checkpoints: the MTP layer is model.layers.2 -> blk.2
HEAD = f"model.layers.{N}."


def _draft(folder: Path, out: Path, **kwargs: object) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    kwargs.setdefault("block", N)
    return reader_tensors(convert(folder, out, progress=False, **kwargs).output)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def hy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hy_checkpoint(tmp_path_factory.mktemp("hy") / "Hy3-tiny")


def test_names_shapes_types_and_bytes(hy: Path, tmp_path: Path) -> None:
    ours = _draft(hy, tmp_path / "d.gguf")
    h, q, kv, d, e, f = 128, 128, 64, 32, 4, 64
    expected = {
        "nextn.eh_proj.weight": (Q.BF16, (2 * h, h)), "nextn.enorm.weight": (Q.F32, (h,)),
        "nextn.hnorm.weight": (Q.F32, (h,)), "nextn.shared_head_norm.weight": (Q.F32, (h,)),
        "attn_norm.weight": (Q.F32, (h,)), "attn_q.weight": (Q.BF16, (h, q)), "attn_k.weight": (Q.BF16, (h, kv)),
        "attn_v.weight": (Q.BF16, (h, kv)), "attn_output.weight": (Q.BF16, (q, h)),
        "attn_q_norm.weight": (Q.F32, (d,)), "attn_k_norm.weight": (Q.F32, (d,)), "ffn_norm.weight": (Q.F32, (h,)),
        "ffn_gate_inp.weight": (Q.F32, (h, e)), "exp_probs_b": (Q.F32, (e,)),
        "ffn_gate_exps.weight": (Q.BF16, (h, f, e)), "ffn_up_exps.weight": (Q.BF16, (h, f, e)),
        "ffn_down_exps.weight": (Q.BF16, (f, h, e)), "ffn_gate_shexp.weight": (Q.BF16, (h, f)),
        "ffn_up_shexp.weight": (Q.BF16, (h, f)), "ffn_down_shexp.weight": (Q.BF16, (f, h)),
    }
    assert {n: (t, s) for n, (t, s, _) in ours.items()} == {f"blk.{N}.{k}": v for k, v in expected.items()}
    assert ours[f"blk.{N}.attn_q.weight"][2] == _raw(hy, HEAD + "self_attn.q_proj.weight")
    assert ours[f"blk.{N}.nextn.shared_head_norm.weight"][2] == _widened(_raw(hy, HEAD + "final_layernorm.weight"))
    assert ours[f"blk.{N}.ffn_norm.weight"][2] == _widened(_raw(hy, HEAD + "post_attention_layernorm.weight"))
    assert ours[f"blk.{N}.ffn_gate_inp.weight"][2] == _raw(hy, HEAD + "mlp.router.gate.weight")  # F32 as it is
    assert ours[f"blk.{N}.exp_probs_b"][2] == _raw(hy, HEAD + "mlp.expert_bias")
    assert ours[f"blk.{N}.ffn_up_shexp.weight"][2] == _raw(hy, HEAD + "mlp.shared_mlp.up_proj.weight")
    assert ours[f"blk.{N}.ffn_down_exps.weight"][2] == b"".join(
        _raw(hy, f"{HEAD}mlp.experts.{i}.down_proj.weight") for i in range(e))
    # the trunk is not the head: layer 1's q_proj is nowhere in the draft
    assert _raw(hy, "model.layers.1.self_attn.q_proj.weight") not in {raw for _, _, raw in ours.values()}


def test_registered_under_its_gguf_architecture() -> None:
    assert model_class_for_arch("hy_v3") is HYV3MTPModel
    assert HYV3MTPModel.head_prefix({"num_hidden_layers": 80}) == "model.layers.80."  # one prefix: a str
    assert HYV3MTPModel.head_prefix({"num_hidden_layers": 80, "num_nextn_predict_layers": 2}) == (
        "model.layers.80.", "model.layers.81.")
    assert HYV3MTPModel.head_prefix({"num_hidden_layers": "80"}) == "model.layers."


def test_draft_metadata_is_upstreams_for_hy_v3(hy: Path, tmp_path: Path) -> None:
    kvs = reader_kvs(convert(hy, tmp_path / "d.gguf", block=N, progress=False).output)
    values = {k[len("hy_v3."):]: v for k, (_, v) in kvs.items() if k.startswith("hy_v3.")}
    assert values["block_count"] == N + 1 and values["nextn_predict_layers"] == 1
    assert (values["expert_feed_forward_length"], values["expert_shared_feed_forward_length"]) == (64, 64)
    assert values["expert_weights_norm"] is True and values["expert_gating_func"] == 2  # sigmoid
    assert values["expert_weights_scale"] == pytest.approx(2.826)


def test_no_mtp_layer_is_named(tmp_path: Path) -> None:
    folder = write_hy_checkpoint(tmp_path / "hy")
    (folder / CONFIG_NAME).write_text(json.dumps(hy_config(n_nextn=0)))
    with pytest.raises(CheckpointError, match="num_nextn_predict_layers = 0: the checkpoint has no MTP layer"):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)
    assert not (tmp_path / "d.gguf").exists()


def test_two_mtp_layers_become_two_blocks_renumbered_together(tmp_path: Path) -> None:
    two = write_hy_checkpoint(tmp_path / "two", n_nextn=2)
    report = convert(two, tmp_path / "d.gguf", block=5, progress=False)  # blk.5 and blk.6 whatever N is
    assert report.plan.blocks_text == "2 NextN blocks blk.5-6" and "2 NextN blocks blk.5-6" in report.describe()[1]
    ours = reader_tensors(report.output)
    assert len(ours) == 40 and {n.split(".")[1] for n in ours} == {"5", "6"}
    for layer, block in ((2, 5), (3, 6)):  # each layer's own bytes, experts stacked per layer
        assert ours[f"blk.{block}.attn_q.weight"][2] == _raw(two, f"model.layers.{layer}.self_attn.q_proj.weight")
        assert ours[f"blk.{block}.ffn_up_exps.weight"][2] == b"".join(
            _raw(two, f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight") for e in range(4))
        assert ours[f"blk.{block}.ffn_gate_inp.weight"][0] == Q.F32
    kvs = reader_kvs(report.output)
    assert (kvs["hy_v3.block_count"][1], kvs["hy_v3.nextn_predict_layers"][1]) == (7, 2)
    # a missing expert of the second layer is named with its block
    folder = tmp_path / "gap"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(hy_config(n_nextn=2)))
    tensors = [t for t in hy_tensors(n_nextn=2) if not t.name.startswith("model.layers.3.mlp.experts.1.")]
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match=r"NextN block 1\) has 3 of 4 experts' \w+_proj .*missing experts 1"):
        convert(folder, tmp_path / "gap.gguf", block=N, progress=False)


def test_missing_expert_and_unknown_tensor_are_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "Hy"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(hy_config()))
    tensors = [t for t in hy_tensors() if not t.name.startswith(HEAD + "mlp.experts.3.")]
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match=r"tensors for 3 experts \(none for experts 3\)"):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)
    odd = [t if t.name != HEAD + "enorm.weight" else type(t)(HEAD + "e_norm.weight", t.shape, t.dtype, t.fill)
           for t in hy_tensors()]
    write_safetensors(folder / "model.safetensors", odd)
    with pytest.raises(CheckpointError, match=r"cannot map tensor 'model\.layers\.2\.e_norm\.weight'"):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)


def test_target_of_another_model_is_refused(hy: Path, tmp_path: Path) -> None:
    # a trunk of another model relabelled hy_v3: 2 trunk blocks like the head's, experts of another width
    glm = write_target(tmp_path / "glm", family=GLM4MOE, hparams=replace(HY_HPARAMS, n_ff_exp=32), quant="BF16",
                       pattern="DE")
    target = relabel_arch(glm, tmp_path / "t" / "hy.gguf", "hy_v3")
    with pytest.raises(IncompatibleDraftError, match=r"expert_feed_forward_length = 64 \(config.json "
                                                     r"moe_intermediate_size\), the target 32"):
        convert(hy, tmp_path / "d.gguf", target=target, progress=False)
    with pytest.raises(IncompatibleDraftError, match="target architecture is 'glm4moe'"):
        convert(hy, tmp_path / "d.gguf", target=glm, progress=False)
    assert not (tmp_path / "d.gguf").exists()


# --------------------------------------------------------------------------------------- upstream parity
# (one MTP layer: tests/test_upstream_parity.py's ``hy_v3`` entry)


@pytest.mark.upstream
@pytest.mark.llama
@pytest.mark.parity("hy_v3-2mtp")
def test_two_blocks_equal_upstreams_and_run_in_llama(parity: ParitySet) -> None:
    """Two MTP layers (llama.cpp's converter and graph take several): upstream's full and ``--no-mtp`` files."""
    from gguf_mtp.check.llama_check import check_with_llama

    full = reader_tensors(parity.full)
    theirs = {n: t for n, t in full.items() if n.startswith((f"blk.{N}.", f"blk.{N + 1}."))}
    assert len(theirs) == 40
    assert_same_tensors(reader_tensors(parity.draft), theirs)  # none may differ (as for one layer)
    assert_same_tensors(reader_tensors(parity.composite), full)
    ours_kvs, their_kvs = reader_kvs(parity.composite), reader_kvs(parity.full)
    assert [k for k in their_kvs if ours_kvs.get(k) != their_kvs[k]] == []
    ours, theirs_check = check_with_llama(parity.composite), check_with_llama(parity.full)
    assert ours.ok and ours.mtp_decode_ok, ours.summary() + ours.log_tail
    assert (ours.n_layer, ours.n_layer_nextn) == (N, 2)
    assert ours.mtp_logits_sha256 == theirs_check.mtp_logits_sha256
    standalone = check_with_llama(parity.standalone, trunk=False)
    assert standalone.ok and standalone.mtp_decode_ok and standalone.n_layer_nextn == 2, standalone.summary()


def test_hub_fetches_only_the_shards_of_every_mtp_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 shards: the trunk, MTP layer 2, a shard holding only layer 20's stand-in (a prefix-alike), MTP layer 3
    import huggingface_hub
    from huggingface_hub import constants as hf_constants
    from support.convert_support import fill_hub_cache

    from gguf_mtp.format.safetensors_io import INDEX_NAME

    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(hy_config(n_nextn=2)))
    tensors = hy_tensors(n_nextn=2)
    decoy = [type(t)("model.layers.20.enorm.weight", t.shape, t.dtype, t.fill)
             for t in tensors if t.name == "model.layers.2.enorm.weight"]
    parts = {"model-00001-of-00004.safetensors": [t for t in tensors if not t.name.startswith(("model.layers.2.",
                                                                                                "model.layers.3."))],
             "model-00002-of-00004.safetensors": [t for t in tensors if t.name.startswith("model.layers.2.")],
             "model-00003-of-00004.safetensors": decoy,
             "model-00004-of-00004.safetensors": [t for t in tensors if t.name.startswith("model.layers.3.")]}
    weight_map = {}
    for name, part in parts.items():
        write_safetensors(folder / name, part)
        weight_map |= {t.name: name for t in part}
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    calls: list[object] = []
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda *a, **k: calls.append(k["allow_patterns"]) or real(*a, **k))
    fill_hub_cache(cache, "tencent/Hy3-tiny", folder,
                   leave_out=("model-00001-of-00004.safetensors", "model-00003-of-00004.safetensors"))
    report = convert("tencent/Hy3-tiny", tmp_path / "d.gguf", block=N, progress=False)
    assert calls == [[CONFIG_NAME, INDEX_NAME, "model-00002-of-00004.safetensors", "model-00004-of-00004.safetensors"]]
    local = convert(folder, tmp_path / "local.gguf", block=N, progress=False).output
    assert reader_tensors(report.output) == reader_tensors(local) and len(reader_tensors(local)) == 40
