"""GLM-4.5 / 4.5-Air / 4.6 / 4.7 (glm4moe): ``convert`` of the NextN layer, checked by value and by llama.cpp.

Against llama.cpp's own convert_hf_to_gguf.py: tests/test_upstream_parity.py's ``glm4moe`` entry (one tiny full
checkpoint, GLM-4.5 355B style: QK norm and the NextN layer's own ``embed_tokens``/``shared_head.head`` copies,
2 shards + index, GPT-2's real tokenizer plus GLM's special tokens).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from support.convert_support import checkpoint_bytes as _raw
from support.convert_support import widened_bf16 as _widened
from support.glm_checkpoints import GLM_HPARAMS, glm_config, glm_tensors, write_glm_checkpoint
from support.helpers import reader_tensors

from gguf_mtp.conversion.glm4moe import Glm4MoeMTPModel
from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.safetensors_io import CONFIG_NAME, INDEX_NAME, SafetensorsFile, open_checkpoint
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import BIAS_SPELLINGS, write_safetensors
from gguf_mtp.testing.tiny_models import GLM4MOE, write_target

Q = GGMLQuantizationType
N = 3  # num_hidden_layers of the tiny checkpoints: the NextN layer is model.layers.3 -> blk.3
HEAD = f"model.layers.{N}."


def _draft(folder: Path, out: Path, **kwargs: object) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    kwargs.setdefault("block", N)
    return reader_tensors(convert(folder, out, progress=False, **kwargs).output)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def air(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GLM-4.5-Air style: no QK norm, no NextN embed/head copies, the NextN layer alone in the last shard."""
    return write_glm_checkpoint(tmp_path_factory.mktemp("air") / "GLM-tiny-Air")


@pytest.fixture(scope="module")
def glm45(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GLM-4.5 (355B) style: QK norm and the NextN layer's own embed_tokens / shared_head.head."""
    return write_glm_checkpoint(tmp_path_factory.mktemp("glm45") / "GLM-tiny", qk_norm=True, nextn_copies=True)


# ------------------------------------------------------------------------------------------------ convert


def test_names_shapes_types_and_bytes(air: Path, tmp_path: Path) -> None:
    ours = _draft(air, tmp_path / "d.gguf")
    h, q, kv, e, f = 128, 128, 64, 4, 64
    expected = {
        "nextn.eh_proj.weight": (Q.BF16, (2 * h, h)), "nextn.enorm.weight": (Q.F32, (h,)),
        "nextn.hnorm.weight": (Q.F32, (h,)), "nextn.shared_head_norm.weight": (Q.F32, (h,)),
        "attn_norm.weight": (Q.F32, (h,)), "attn_q.weight": (Q.BF16, (h, q)), "attn_q.bias": (Q.F32, (q,)),
        "attn_k.weight": (Q.BF16, (h, kv)), "attn_k.bias": (Q.F32, (kv,)), "attn_v.weight": (Q.BF16, (h, kv)),
        "attn_v.bias": (Q.F32, (kv,)), "attn_output.weight": (Q.BF16, (q, h)),
        "post_attention_norm.weight": (Q.F32, (h,)), "ffn_gate_inp.weight": (Q.F32, (h, e)),
        "exp_probs_b.bias": (Q.F32, (e,)), "ffn_gate_exps.weight": (Q.BF16, (h, f, e)),
        "ffn_up_exps.weight": (Q.BF16, (h, f, e)), "ffn_down_exps.weight": (Q.BF16, (f, h, e)),
        "ffn_gate_shexp.weight": (Q.BF16, (h, f)), "ffn_up_shexp.weight": (Q.BF16, (h, f)),
        "ffn_down_shexp.weight": (Q.BF16, (f, h)),
    }
    assert {n: (t, s) for n, (t, s, _) in ours.items()} == {f"blk.{N}.{k}": v for k, v in expected.items()}
    # matrices copied byte for byte, 1-D BF16 tensors widened exactly, the F32 routing bias copied
    assert ours[f"blk.{N}.attn_q.weight"][2] == _raw(air, HEAD + "self_attn.q_proj.weight")
    assert ours[f"blk.{N}.nextn.eh_proj.weight"][2] == _raw(air, HEAD + "eh_proj.weight")
    assert ours[f"blk.{N}.attn_k.bias"][2] == _widened(_raw(air, HEAD + "self_attn.k_proj.bias"))
    assert ours[f"blk.{N}.nextn.hnorm.weight"][2] == _widened(_raw(air, HEAD + "hnorm.weight"))
    assert ours[f"blk.{N}.ffn_gate_inp.weight"][2] == _widened(_raw(air, HEAD + "mlp.gate.weight"))
    assert ours[f"blk.{N}.exp_probs_b.bias"][2] == _raw(air, HEAD + "mlp.gate.e_score_correction_bias")
    assert ours[f"blk.{N}.ffn_down_shexp.weight"][2] == _raw(air, HEAD + "mlp.shared_experts.down_proj.weight")
    # the trunk layers are not the head: layer 2's q_proj is nowhere in the draft
    assert _raw(air, "model.layers.2.self_attn.q_proj.weight") not in {raw for _, _, raw in ours.values()}


def test_experts_are_stacked_by_index_whatever_their_order_in_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "shuffled"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(glm_config(GLM_HPARAMS)))
    tensors = glm_tensors(GLM_HPARAMS)
    experts = [t for t in tensors if t.name.startswith(HEAD + "mlp.experts.")]
    rest = [t for t in tensors if t not in experts]
    write_safetensors(folder / "model.safetensors", rest + experts[::-1])  # expert 3 first, expert 0 last
    ours = _draft(folder, tmp_path / "d.gguf")
    for proj in ("gate", "up", "down"):
        parts = [_raw(folder, f"{HEAD}mlp.experts.{e}.{proj}_proj.weight") for e in range(GLM_HPARAMS.n_expert)]
        assert len(set(parts)) == GLM_HPARAMS.n_expert
        assert ours[f"blk.{N}.ffn_{proj}_exps.weight"][2] == b"".join(parts)


def test_both_spellings_of_the_routing_bias(tmp_path: Path) -> None:
    drafts = []
    for spelling in BIAS_SPELLINGS:
        folder = write_glm_checkpoint(tmp_path / spelling / "GLM", bias_spelling=spelling)
        drafts.append(_draft(folder, tmp_path / f"{spelling}.gguf"))
        assert drafts[-1][f"blk.{N}.exp_probs_b.bias"][2] == _raw(folder, f"{HEAD}mlp.gate.{spelling}")
    assert drafts[0] == drafts[1]


def test_nextn_embed_and_head_copies_kept_by_default(glm45: Path, tmp_path: Path) -> None:
    ours = _draft(glm45, tmp_path / "d.gguf")
    assert ours[f"blk.{N}.nextn.embed_tokens.weight"][:2] == (Q.BF16, (128, GLM_HPARAMS.n_vocab))
    assert ours[f"blk.{N}.nextn.embed_tokens.weight"][2] == _raw(glm45, HEAD + "embed_tokens.weight")
    assert ours[f"blk.{N}.nextn.shared_head_head.weight"][2] == _raw(glm45, HEAD + "shared_head.head.weight")
    # the layer's own copies, not the trunk's embedding or LM head
    assert ours[f"blk.{N}.nextn.embed_tokens.weight"][2] != _raw(glm45, "model.embed_tokens.weight")
    assert ours[f"blk.{N}.attn_q_norm.weight"][:2] == (Q.F32, (32,))
    assert len(ours) == 21 + 2 + 2


def test_nextn_copies_dropped_by_option(glm45: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = _draft(glm45, tmp_path / "kept.gguf")
    copies = {f"blk.{N}.nextn.embed_tokens.weight", f"blk.{N}.nextn.shared_head_head.weight"}
    # the constructor option
    model = Glm4MoeMTPModel(open_checkpoint(glm45), keep_nextn_copies=False)
    assert {t.name for t in model.mapped_tensors(N, None)} == set(kept) - copies
    # the class attribute, as convert uses it
    monkeypatch.setattr(Glm4MoeMTPModel, "keep_nextn_copies", False)
    dropped = _draft(glm45, tmp_path / "dropped.gguf")
    assert dropped == {n: t for n, t in kept.items() if n not in copies}
    assert (tmp_path / "dropped.gguf").stat().st_size < (tmp_path / "kept.gguf").stat().st_size - 2 * 12_000_000


@pytest.mark.parametrize("layout", ["mtp-file", "mtp-file-no-index"])
def test_glm46_layout_with_the_head_in_mtp_safetensors(layout: str, air: Path, tmp_path: Path) -> None:
    folder = write_glm_checkpoint(tmp_path / layout / air.name, layout=layout)
    assert (folder / INDEX_NAME).exists() == (layout == "mtp-file")
    assert set(SafetensorsFile(folder / "mtp.safetensors").tensors) == {
        t.name for t in glm_tensors(GLM_HPARAMS) if t.name.startswith(HEAD)}
    assert _draft(folder, tmp_path / "d.gguf") == _draft(air, tmp_path / "ref.gguf")


def test_only_mtp_safetensors_and_config_downloaded(air: Path, tmp_path: Path) -> None:
    # what a user fetches of GLM-4.6 for the head: config.json + mtp.safetensors (no index, no trunk shard)
    full = write_glm_checkpoint(tmp_path / "full" / air.name, layout="mtp-file")
    folder = tmp_path / "only" / air.name
    folder.mkdir(parents=True)
    for name in (CONFIG_NAME, "mtp.safetensors"):
        shutil.copy2(full / name, folder / name)
    assert _draft(folder, tmp_path / "d.gguf") == _draft(air, tmp_path / "ref.gguf")


def test_drop_nextn_copies_option_of_the_cli(glm45: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "cli.gguf"
    cmd = [sys.executable, "-m", "gguf_mtp", "convert", str(glm45), "-o", str(out), "--block", str(N),
           "--drop-nextn-copies", "--quiet"]
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    library = _draft(glm45, tmp_path / "lib.gguf", drop_nextn_copies=True)
    assert reader_tensors(out) == library
    assert not any(name.startswith(("token_embd", "output")) or ".nextn.embed_tokens" in name
                   or ".nextn.shared_head_head" in name for name in library)


def test_drop_nextn_copies_is_refused_for_a_family_without_copies(tmp_path: Path) -> None:
    import subprocess
    import sys

    from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

    head = write_mtpv2_checkpoint(tmp_path / "head")
    cmd = [sys.executable, "-m", "gguf_mtp", "convert", str(head), "-o", str(tmp_path / "d.gguf"), "--block", "3",
           "--drop-nextn-copies"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gguf-mtp: error: --drop-nextn-copies: a nemotron_h_moe head has no embedding/LM head copies to drop"
    ]
    assert not (tmp_path / "d.gguf").exists()


def test_index_with_only_the_nextn_shard_present(air: Path, tmp_path: Path) -> None:
    folder = tmp_path / "selective" / air.name
    folder.mkdir(parents=True)
    for name in (CONFIG_NAME, INDEX_NAME, "model-00002-of-00002.safetensors"):
        shutil.copy2(air / name, folder / name)
    assert _draft(folder, tmp_path / "d.gguf") == _draft(air, tmp_path / "ref.gguf")


def test_head_prefix_names_only_the_nextn_layers() -> None:
    assert Glm4MoeMTPModel.head_prefix({"num_hidden_layers": 46}) == "model.layers.46."
    assert Glm4MoeMTPModel.head_prefix({"num_hidden_layers": 46, "num_nextn_predict_layers": 2}) == (
        "model.layers.46.", "model.layers.47.")
    assert Glm4MoeMTPModel.head_prefix({"num_hidden_layers": "46"}) == "model.layers."
    # a count that is not a layer count is left to the model's checks (one line there), never 10^9 prefixes
    for bad in (10**9, "2", True, 0):
        assert Glm4MoeMTPModel.head_prefix({"num_hidden_layers": 46, "num_nextn_predict_layers": bad}) == (
            "model.layers.")


def test_missing_expert_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "GLM"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(glm_config(GLM_HPARAMS)))
    tensors = [t for t in glm_tensors(GLM_HPARAMS) if not t.name.startswith(HEAD + "mlp.experts.2.")]
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match=r"tensors for 3 experts \(none for experts 2\)"):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)
    assert not (tmp_path / "d.gguf").exists()


def test_checkpoint_without_nextn_layer_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "GLM"
    folder.mkdir()
    config = glm_config(GLM_HPARAMS) | {"num_nextn_predict_layers": 0}
    (folder / CONFIG_NAME).write_text(json.dumps(config))
    trunk = [t for t in glm_tensors(GLM_HPARAMS) if not t.name.startswith(HEAD)]
    write_safetensors(folder / "model.safetensors", trunk)
    with pytest.raises(CheckpointError, match="num_nextn_predict_layers = 0: the checkpoint has no NextN layer"):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)
    (folder / CONFIG_NAME).write_text(json.dumps(glm_config(GLM_HPARAMS)))
    with pytest.raises(CheckpointError, match=r"no MTP head: no tensor name starts with 'model\.layers\.3\.'"):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)


def test_target_of_another_size_is_refused(air: Path, tmp_path: Path) -> None:
    # a GLM-4.5-Air head (46 layers) does not go into a GLM-4.5 trunk (92): here 3 vs a 2-block tiny trunk
    target = write_target(tmp_path / "t", family=GLM4MOE, hparams=GLM_HPARAMS, quant="BF16")
    message = r"block_count = 3 \(config.json num_hidden_layers\), the target 2"
    with pytest.raises(IncompatibleDraftError, match=message):
        convert(air, tmp_path / "d.gguf", target=target, progress=False)


@pytest.mark.llama
@pytest.mark.parametrize("variant", ["air", "glm45", "glm45-dropped-copies"])
def test_composed_into_a_tiny_glm_target_runs_an_mtp_step(
    variant: str, air: Path, glm45: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gguf_mtp.check.llama_check import check_with_llama

    if variant == "glm45-dropped-copies":  # llama.cpp then takes the trunk's token_embd / output
        monkeypatch.setattr(Glm4MoeMTPModel, "keep_nextn_copies", False)
    target = write_target(tmp_path / "t", family=GLM4MOE, hparams=GLM_HPARAMS, quant="BF16", pattern="DEE")
    report = convert(air if variant == "air" else glm45, tmp_path / "d.gguf", target=target, progress=False)
    assert any(".nextn.embed_tokens." in t.name for t in report.plan.tensors) == (variant == "glm45")
    draft = report.output
    composite = compose(target, draft, tmp_path / "out", progress=False).output_paths[0]
    check = check_with_llama(composite)
    assert check.ok, check.summary() + "\n" + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (N, 1)
    assert check.mtp_decode_ok and check.mtp_logits_finite
