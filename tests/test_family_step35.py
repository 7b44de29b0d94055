"""Step-3.5-Flash (step35): ``convert`` of the three MTP layers into three NextN blocks, checked by value, by llama.cpp
(an MTP decode through every block), and against llama.cpp's own convert_hf_to_gguf.py tensor for tensor.

The upstream part converts one tiny full checkpoint (tests/support/step_checkpoints.py: 3 trunk layers + 3 MTP layers,
2 shards + index, GPT-2's real tokenizer) three ways (full, ``--no-mtp``, ``--mtp``): tests/test_upstream_parity.py's
``step35`` entry, where no difference is allowed (every tensor of the three NextN blocks is byte-identical, the
``+ 1`` norms included); Step-3.7's layout is compared here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from support.convert_support import as_f32, raw_tensor
from support.helpers import reader_kvs, reader_tensors
from support.step_checkpoints import (
    HEAD_DIM,
    LAYER_TYPES,
    N_HEAD,
    N_HEAD_SWA,
    N_KV,
    N_LAYER,
    VOCAB,
    H,
    write_step_checkpoint,
)
from support.upstream import ParitySet, assert_same_tensors, parity_set

from gguf_mtp.check.inspect import inspect
from gguf_mtp.conversion.step35 import Step35MTPModel
from gguf_mtp.format.safetensors_io import CONFIG_NAME, INDEX_NAME
from gguf_mtp.hub.checkpoint import head_files
from gguf_mtp.jobs.convert import convert

Q = GGMLQuantizationType
BLOCKS = (3, 4, 5)  # model.layers.{3,4,5} -> blk.{3,4,5}


@pytest.fixture(scope="module")
def step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_step_checkpoint(tmp_path_factory.mktemp("step") / "Step-tiny")


def _draft(folder: Path, out: Path) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    return reader_tensors(convert(folder, out, block=N_LAYER, progress=False).output)


# ------------------------------------------------------------------------------------------------ convert


def test_three_blocks_renumbered_together_with_their_own_shapes(step: Path, tmp_path: Path) -> None:
    ours = _draft(step, tmp_path / "d.gguf")
    assert len(ours) == 3 * 17
    for offset, block in enumerate(BLOCKS):
        layer = N_LAYER + offset
        heads = N_HEAD_SWA if LAYER_TYPES[layer] == "sliding_attention" else N_HEAD
        assert ours[f"blk.{block}.attn_q.weight"][:2] == (Q.BF16, (H, heads * HEAD_DIM))
        assert ours[f"blk.{block}.attn_k.weight"][:2] == (Q.BF16, (H, N_KV * HEAD_DIM))
        assert ours[f"blk.{block}.attn_gate.weight"][:2] == (Q.BF16, (H, heads))
        assert ours[f"blk.{block}.nextn.shared_head_head.weight"][:2] == (Q.BF16, (H, VOCAB))
        p = f"model.layers.{layer}."
        # matrices byte for byte, from their own layer; the nested shared head found under transformer.
        assert ours[f"blk.{block}.nextn.eh_proj.weight"][2] == raw_tensor(step, p + "eh_proj.weight")[2]
        assert ours[f"blk.{block}.nextn.shared_head_head.weight"][2] == \
            raw_tensor(step, p + "transformer.shared_head.output.weight")[2]
        # norms + 1, in float32
        for gguf_name, hf_name in (("nextn.enorm", "enorm"), ("attn_q_norm", "self_attn.q_norm"),
                                   ("nextn.shared_head_norm", "transformer.shared_head.norm")):
            assert ours[f"blk.{block}.{gguf_name}.weight"][0] == Q.F32
            expected = as_f32(step, f"{p}{hf_name}.weight") + np.float32(1)
            assert ours[f"blk.{block}.{gguf_name}.weight"][2] == expected.tobytes()
    assert not [n for n in ours if not n.startswith(tuple(f"blk.{b}." for b in BLOCKS))]


def test_per_layer_arrays_carry_one_entry_per_block(step: Path, tmp_path: Path) -> None:
    kvs = reader_kvs(convert(step, tmp_path / "d.gguf", block=N_LAYER, progress=False).output)
    assert kvs["step35.block_count"][1] == 6 and kvs["step35.nextn_predict_layers"][1] == 3
    swa = [t == "sliding_attention" for t in LAYER_TYPES]
    assert kvs["step35.attention.sliding_window_pattern"][1] == swa
    assert kvs["step35.attention.head_count"][1] == [N_HEAD_SWA if s else N_HEAD for s in swa]
    assert kvs["step35.attention.head_count_kv"][1] == [N_KV] * 6
    assert kvs["step35.swiglu_clamp_exp"][1] == [0.0, 0.0, 7.0, 7.0, 0.0, 0.0]
    assert kvs["step35.swiglu_clamp_shexp"][1] == [0.0, 0.0, 16.0, 0.0, 0.0, 0.0]  # padded for the MTP layers


def test_head_prefix_names_only_the_mtp_layers(step: Path, tmp_path: Path) -> None:
    config = {"num_hidden_layers": 45, "num_nextn_predict_layers": 3}
    assert Step35MTPModel.head_prefix(config) == (
        "model.layers.45.", "model.layers.46.", "model.layers.47.",  # Step-3.5
        "model.language_model.layers.45.", "model.language_model.layers.46.", "model.language_model.layers.47.")
    assert Step35MTPModel.head_prefix({"num_hidden_layers": "45"}) == "model.layers."
    # what a Hub download fetches: the shards holding model.layers.45-47 only (not model.layers.4*)
    weight_map = {"model.layers.4.mlp.gate_proj.weight": "a", "model.layers.44.eh_proj.weight": "b",
                  "model.layers.45.eh_proj.weight": "c", "model.layers.47.enorm.weight": "d"}
    assert head_files(weight_map, Step35MTPModel.head_prefix(config)) == ["c", "d"]
    # with the index, only the shard of the MTP layers is needed
    folder = tmp_path / "selective" / step.name
    folder.mkdir(parents=True)
    for name in (CONFIG_NAME, INDEX_NAME, "model-00002-of-00002.safetensors"):
        shutil.copy2(step / name, folder / name)
    assert _draft(folder, tmp_path / "d.gguf") == _draft(step, tmp_path / "ref.gguf")


def test_the_plan_names_every_block(step: Path, tmp_path: Path) -> None:
    report = convert(step, tmp_path / "d.gguf", block=N_LAYER, progress=False, dry_run=True)
    assert "step35 3 NextN blocks blk.3-5, 51 head tensors" in "\n".join(report.describe())
    assert report.to_dict()["nextn_blocks"] == 3
    assert not (tmp_path / "d.gguf").exists()


# --------------------------------------------------------------------------------------- upstream parity
# (the draft, sidecar, composite and llama.cpp's runs against upstream's: tests/test_upstream_parity.py's ``step35``
# entry; here what verify and inspect say of that composite)


@pytest.mark.upstream
@pytest.mark.parity("step35")
def test_verify_passes_naming_every_block(parity: ParitySet) -> None:
    from gguf_mtp.check.verify import verify

    report = verify(parity.composite, target=parity.trunk, draft=parity.draft, llama=False, progress=False)
    assert report.ok, "\n".join(report.describe())
    draft = next(c for c in report.checks if c.name == "draft tensors")
    assert "all 51 draft block tensors" in draft.detail and "identical as blk.3-5" in draft.detail


@pytest.mark.upstream
@pytest.mark.parity("step35")
def test_inspect_sees_three_chained_blocks(parity: ParitySet) -> None:
    summary = inspect(parity.composite)
    assert summary.mtp_verdict == "MTP: yes (3 blocks, blk.3-5)" and summary.graph_note is None


# ------------------------------------------------------------------------------------------------ Step-3.7


@pytest.fixture(scope="module")
def step37(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny model as Step-3.7-Flash lays it out: text_config, model.language_model.* names."""
    return write_step_checkpoint(tmp_path_factory.mktemp("step37") / "Step37-tiny", step37=True)


def test_step37_layout_converts_to_the_same_blocks(step: Path, step37: Path, tmp_path: Path) -> None:
    ours = _draft(step37, tmp_path / "d37.gguf")
    assert ours == _draft(step, tmp_path / "d35.gguf")  # the same values under the other names
    assert len(ours) == 51
    eh_proj = raw_tensor(step37, "model.language_model.layers.4.eh_proj.weight")[2]
    assert ours["blk.4.nextn.eh_proj.weight"][2] == eh_proj
    kvs = reader_kvs(tmp_path / "d37.gguf")
    assert kvs["step35.attention.head_count"][1] == [N_HEAD_SWA if t == "sliding_attention" else N_HEAD
                                                     for t in LAYER_TYPES]


def test_step37_text_config_that_is_not_an_object_is_one_line(step37: Path, tmp_path: Path) -> None:
    import json

    from gguf_mtp.errors import CheckpointError

    folder = tmp_path / "bad"
    shutil.copytree(step37, folder)
    config = json.loads((folder / CONFIG_NAME).read_text()) | {"text_config": ["hidden_size"]}
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="text_config is not a JSON object"):
        convert(folder, tmp_path / "d.gguf", block=N_LAYER, progress=False)


@pytest.mark.upstream
def test_step37_equals_upstreams_conversion(step37: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """llama.cpp's converter takes Step-3.7 (Step3p7ForConditionalGeneration) with the same Step35Model: gguf-mtp's
    draft equals its ``--mtp`` blocks and compose of its ``--no-mtp`` file and the draft its full file, tensor for
    tensor."""
    work = tmp_path_factory.mktemp("step37-parity")
    files = parity_set(Path(shutil.copytree(step37, work / "hf")), work)
    theirs = {n: t for n, t in reader_tensors(files.mtp).items() if n.startswith("blk.")}
    assert len(theirs) == 51
    assert_same_tensors(reader_tensors(files.draft), theirs)  # none may differ, as for Step-3.5
    assert_same_tensors(reader_tensors(files.composite), reader_tensors(files.full))


@pytest.mark.parametrize(("change", "message"), [
    ({"num_nextn_predict_layers": 0}, "num_nextn_predict_layers = 0: the checkpoint has no MTP layer"),
    ({"layer_types": ["full_attention"] * 5 + ["chunked_attention"]}, "layer_types has 'chunked_attention'"),
    ({"swiglu_limits": [None, "7"]}, "swiglu_limits has '7': not a float"),
    ({"attention_other_setting": {"num_attention_heads": 0}}, "attention_other_setting.num_attention_heads = 0"),
])
def test_bad_config_is_one_line(step: Path, tmp_path: Path, change: dict, message: str) -> None:
    import json

    from gguf_mtp.errors import CheckpointError

    folder = tmp_path / "bad"
    shutil.copytree(step, folder)
    config = json.loads((folder / CONFIG_NAME).read_text()) | change
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        convert(folder, tmp_path / "d.gguf", block=N_LAYER, progress=False)
    assert not (tmp_path / "d.gguf").exists()
