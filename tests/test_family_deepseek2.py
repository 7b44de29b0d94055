"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``, BF16) and DeepSeek V3 (``DeepseekV3ForCausalLM``, FP8) MTP heads ->
``deepseek2`` (issue 22): convert, llama.cpp, and llama.cpp's own converter as the reference.

* convert of tiny checkpoints (:mod:`deepseek_checkpoints`: two shards + index, the NextN layer in the second; the
  DeepSeek one FP8 in 128x128 blocks with partial blocks everywhere): MLA names and shapes, the ``kv_b_proj`` split
  (``attn_k_b`` transposed per head, ``attn_v_b``), the copies kept or dropped, an old ``attn_kv_b`` trunk refused;
* parity (``upstream``): llama.cpp's ``convert_hf_to_gguf.py`` writes full / ``--no-mtp`` / ``--mtp`` of the
  GLM-4.7-Flash checkpoint; for DeepSeek V3, whose MTP layer upstream drops (``skip_mtp = True``), the reference is
  upstream's GLM-4.7-Flash class run on the very same FP8 shards (:mod:`support.parity_sets`' ``deepseekv3``). The
  checks every family shares, and the differences allowed (none in the tensors; DeepSeek V3's composite
  ``general.size_label``), are tests/test_upstream_parity.py's ``glm47flash`` and ``deepseekv3`` entries; here, on
  the same shared set, a trunk without MLA metadata refused.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from support.convert_support import raw_tensor
from support.deepseek_checkpoints import DIMS, N_LAYERS, write_mla_checkpoint
from support.fp8_checkpoints import dequantize_reference, quantize_checkpoint
from support.helpers import reader_tensors
from support.upstream import ParitySet

from gguf_mtp.cli import main
from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.header import TensorInfo, encode_kv, read_header, serialize_header
from gguf_mtp.jobs.convert import convert

Q = GGMLQuantizationType
N = N_LAYERS
KV_B = f"model.layers.{N}.self_attn.kv_b_proj.weight"
PER_HEAD = DIMS.nope + DIMS.v_dim


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("mla")
    deepseek = write_mla_checkpoint(work / "deepseekv3-bf16", "deepseekv3")
    return {"glm": write_mla_checkpoint(work / "glm47flash", "glm47flash"), "deepseek-bf16": deepseek,
            "deepseek": quantize_checkpoint(deepseek, work / "deepseekv3")}


def _bf16(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


def test_mla_names_shapes_and_types(ckpts: dict[str, Path], tmp_path: Path) -> None:
    d = DIMS
    tensors = reader_tensors(convert(ckpts["glm"], tmp_path / "d.gguf", block=N, progress=False).output)
    b = f"blk.{N}."
    assert tensors[b + "attn_k_b.weight"][:2] == (Q.BF16, (d.nope, d.kv_lora, d.n_head))
    assert tensors[b + "attn_v_b.weight"][:2] == (Q.BF16, (d.kv_lora, d.v_dim, d.n_head))
    assert tensors[b + "attn_q_a.weight"][:2] == (Q.BF16, (d.n_embd, d.q_lora))
    assert tensors[b + "attn_kv_a_mqa.weight"][:2] == (Q.BF16, (d.n_embd, d.kv_lora + d.rope))
    assert tensors[b + "ffn_norm.weight"][0] == Q.F32 and tensors[b + "ffn_gate_inp.weight"][0] == Q.F32
    assert tensors[b + "ffn_gate_exps.weight"][1] == (d.n_embd, d.n_ff_exp, d.n_expert)
    assert len(tensors) == 22 and not any("embed_tokens" in n for n in tensors)  # GLM-4.7-Flash has no copies


def test_kv_b_is_split_per_head_k_transposed(ckpts: dict[str, Path], tmp_path: Path) -> None:
    tensors = reader_tensors(convert(ckpts["glm"], tmp_path / "d.gguf", block=N, outtype="f32",
                                     progress=False).output)
    _, shape, raw = raw_tensor(ckpts["glm"], KV_B)
    kv_b = _bf16(raw, shape).reshape(DIMS.n_head, PER_HEAD, DIMS.kv_lora)
    k_b = np.ascontiguousarray(kv_b[:, : DIMS.nope, :].transpose(0, 2, 1))
    v_b = np.ascontiguousarray(kv_b[:, DIMS.nope :, :])
    assert tensors[f"blk.{N}.attn_k_b.weight"][2] == k_b.tobytes()
    assert tensors[f"blk.{N}.attn_v_b.weight"][2] == v_b.tobytes()
    # in BF16 the v heads are the checkpoint's bytes, copied by the kernel
    report = convert(ckpts["glm"], tmp_path / "b.gguf", block=N, progress=False)
    v = next(t for t in report.plan.tensors if t.name.endswith("attn_v_b.weight"))
    k = next(t for t in report.plan.tensors if t.name.endswith("attn_k_b.weight"))
    assert v.how == f"stack {DIMS.n_head} experts, copy" and "convert BF16->BF16" in k.how


def test_fp8_kv_b_is_dequantized_with_the_whole_tensors_block_scales(ckpts: dict[str, Path], tmp_path: Path) -> None:
    folder = ckpts["deepseek"]
    tensors = reader_tensors(convert(folder, tmp_path / "d.gguf", block=N, outtype="f32", progress=False).output)
    dtype, shape, codes = raw_tensor(folder, KV_B)
    # 320 rows in blocks of 128 (the last partial): heads of 80 rows straddle the blocks
    scale = np.frombuffer(raw_tensor(folder, KV_B + "_scale_inv")[2], np.float32).reshape(3, 1)
    assert (dtype, shape) == ("F8_E4M3", (DIMS.n_head * PER_HEAD, DIMS.kv_lora))
    kv_b = dequantize_reference(codes, shape, scale, (128, 128)).reshape(DIMS.n_head, PER_HEAD, DIMS.kv_lora)
    assert tensors[f"blk.{N}.attn_k_b.weight"][2] == np.ascontiguousarray(kv_b[:, : DIMS.nope].transpose(0, 2, 1)
                                                                          ).tobytes()
    assert tensors[f"blk.{N}.attn_v_b.weight"][2] == np.ascontiguousarray(kv_b[:, DIMS.nope :]).tobytes()


def test_deepseek_copies_are_kept_by_default_and_dropped_on_request(ckpts: dict[str, Path], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    kept = reader_tensors(convert(ckpts["deepseek"], tmp_path / "k.gguf", block=N, progress=False).output)
    assert kept[f"blk.{N}.nextn.embed_tokens.weight"][:2] == (Q.BF16, (DIMS.n_embd, DIMS.n_vocab))
    assert main(["convert", str(ckpts["deepseek"]), "-o", str(tmp_path / "x.gguf"), "--block", str(N),
                 "--drop-nextn-copies", "-q"]) == 0
    dropped = reader_tensors(tmp_path / "x.gguf")
    assert sorted(kept) == sorted([*dropped, f"blk.{N}.nextn.embed_tokens.weight",
                                   f"blk.{N}.nextn.shared_head_head.weight"])


def test_yarn_and_mla_metadata(ckpts: dict[str, Path], tmp_path: Path) -> None:
    header = read_header(convert(ckpts["deepseek"], tmp_path / "d.gguf", block=N, progress=False).output)
    kv = {k[len("deepseek2.") :]: header.get(k) for k in header.kvs if k.startswith("deepseek2.")}
    d = DIMS
    assert kv["attention.head_count_kv"] == 1 and kv["attention.key_length"] == d.kv_lora + d.rope
    assert kv["attention.key_length_mla"] == d.nope + d.rope and kv["attention.value_length_mla"] == d.v_dim
    assert kv["attention.q_lora_rank"] == d.q_lora and kv["rope.scaling.type"] == "yarn"
    assert kv["rope.scaling.original_context_length"] == 1024 and kv["nextn_predict_layers"] == 1


def _mutated(folder: Path, tmp_path: Path, **changes: object) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / "ckpt"))
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(("changes", "message"), [
    ({"q_lora_rank": None}, "q_lora_rank is absent or null: llama.cpp's deepseek2 MTP graph needs Q-LoRA"),
    ({"scoring_func": "sqrtsoftplus"}, "scoring_func = 'sqrtsoftplus': expected \"sigmoid\" or \"softmax\""),
    ({"num_nextn_predict_layers": 0}, "num_nextn_predict_layers = 0: the checkpoint has no NextN layer"),
    ({"rope_scaling": {"type": "longrope", "factor": 2}}, "rope_scaling type 'longrope': a deepseek2 head"),
])
def test_bad_configs_are_one_line(ckpts: dict[str, Path], tmp_path: Path, changes: dict[str, object],
                                  message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        convert(_mutated(ckpts["deepseek"], tmp_path, **changes), tmp_path / "d.gguf", block=N, progress=False)


def test_misshapen_kv_b_is_refused(ckpts: dict[str, Path], tmp_path: Path) -> None:
    folder = _mutated(ckpts["glm"], tmp_path, v_head_dim=DIMS.v_dim + 16)
    with pytest.raises(CheckpointError, match=r"kv_b_proj.weight has shape \[320, 64\], config.json implies \[384"):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)


def _deepseek2_target(path: Path, tensor: str, *, mla: bool = True) -> Path:
    """A deepseek2 trunk of N blocks as far as convert --target reads it: metadata and one block tensor."""
    kvs = [encode_kv("general.architecture", GGUFValueType.STRING, "deepseek2"),
           encode_kv("deepseek2.block_count", GGUFValueType.UINT32, N),
           encode_kv("deepseek2.embedding_length", GGUFValueType.UINT32, DIMS.n_embd),
           encode_kv("deepseek2.attention.head_count_kv", GGUFValueType.UINT32, 1),
           encode_kv("deepseek2.attention.key_length", GGUFValueType.UINT32, DIMS.kv_lora + DIMS.rope)]
    if mla:
        kvs.append(encode_kv("deepseek2.attention.key_length_mla", GGUFValueType.UINT32, DIMS.nope + DIMS.rope))
    data = np.zeros((4, 32), np.float32).tobytes()
    header = serialize_header(3, kvs, [TensorInfo(tensor, (32, 4), Q.F32, 0, len(data))], 32)
    path.write_bytes(header + data)
    return path


@pytest.mark.parametrize(("tensor", "mla", "refusal"), [
    ("blk.0.attn_kv_b.weight", True, "the target has attn_kv_b tensors: llama.cpp's deepseek2 MTP graph runs only on "
                                     "an MLA-format model"),
    ("blk.0.attn_k_b.weight", False, "the target has no deepseek2.attention.key_length_mla: llama.cpp's deepseek2 "
                                     "MTP graph runs only on an MLA-format model"),
    ("blk.0.attn_k_b.weight", True, None),
])
def test_target_must_be_mla_format(ckpts: dict[str, Path], tmp_path: Path, tensor: str, mla: bool,
                                   refusal: str | None) -> None:
    target = _deepseek2_target(tmp_path / "trunk.gguf", tensor, mla=mla)
    if refusal is None:
        assert convert(ckpts["glm"], tmp_path / "d.gguf", target=target, progress=False).plan.block == N
        return
    with pytest.raises(IncompatibleDraftError, match=re.escape(refusal)):
        convert(ckpts["glm"], tmp_path / "d.gguf", target=target, progress=False)


def test_target_with_other_mla_sizes_is_refused(ckpts: dict[str, Path], tmp_path: Path) -> None:
    target = _deepseek2_target(tmp_path / "trunk.gguf", "blk.0.attn_k_b.weight")
    folder = _mutated(ckpts["glm"], tmp_path, qk_nope_head_dim=DIMS.nope)  # same sizes: accepted
    assert convert(folder, tmp_path / "a.gguf", target=target, progress=False).plan.block == N
    other = _mutated(ckpts["glm"], tmp_path / "x", kv_lora_rank=DIMS.kv_lora * 2)
    with pytest.raises(IncompatibleDraftError, match=r"key_length = 144 \(config.json kv_lora_rank \+ "
                                                     r"qk_rope_head_dim\), the target 80"):
        convert(other, tmp_path / "b.gguf", target=target, progress=False)


# --------------------------------------------------------------------------------------- upstream parity
# (draft, sidecar, strip, composite and llama.cpp's runs against upstream's files: tests/test_upstream_parity.py's
# ``glm47flash`` and ``deepseekv3`` entries; here what holds for a trunk upstream wrote)


@pytest.mark.upstream
@pytest.mark.parity("glm47flash")
def test_an_attn_kv_b_trunk_is_refused_with_the_reason(parity: ParitySet, tmp_path: Path) -> None:
    from support.malformed import edit_kvs

    no_mla = edit_kvs(parity.trunk, tmp_path / "old.gguf", drop=["deepseek2.attention.key_length_mla"])
    with pytest.raises(IncompatibleDraftError, match=r"has no deepseek2.attention.key_length_mla: llama.cpp's "
                                                     r"deepseek2 MTP graph runs only on an MLA-format model"):
        convert(parity.checkpoint, tmp_path / "d.gguf", target=no_mla, progress=False)
