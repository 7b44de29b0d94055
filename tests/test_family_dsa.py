"""DeepSeek V3.2 (``DeepseekV32ForCausalLM`` -> ``deepseek32``, FP8) and GLM-5.x (``GlmMoeDsaForCausalLM`` ->
``glm-dsa``, BF16 and FP8) MTP heads (issue 22): convert, llama.cpp, and llama.cpp's own converter as the reference.

* convert of tiny checkpoints (:mod:`deepseek_checkpoints`: two shards + index, the NextN layer in the second; FP8
  in 128x128 blocks with partial blocks everywhere, the indexer's ``weights_proj`` and GLM-5's ``eh_proj`` left in
  BF16 as the releases leave them): the NextN block's DSA indexer (names, shapes, ``indexer.proj`` in F32), required
  for deepseek32 (a head without it is refused in one line) and optional for glm-dsa; GLM-5.2's trunk-length
  ``attention.indexer.types``; ``--target`` checks (MLA trunk, indexer sizes).
* parity (``upstream``): llama.cpp's ``convert_hf_to_gguf.py`` (``DeepseekV32Model``, ``GlmMoeDsaModel``: both export
  the MTP layer) writes full / ``--no-mtp`` / ``--mtp`` of each checkpoint. The checks every family shares (convert
  equals the ``--mtp`` NextN block, ``--standalone`` the ``--mtp`` file, compose of ``--no-mtp`` + draft the full
  file; llama.cpp runs them), and the differences allowed (none in the tensors; DeepSeek V3.2's composite
  ``general.size_label``), are tests/test_upstream_parity.py's ``deepseekv32`` / ``glm5`` / ``glm5-bf16`` entries;
  here, on the same shared sets, the indexer in upstream's block, the trunk-length ``indexer.types``, verify, and
  FP8 to Q8_0 in one pass.
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
from support.deepseek_checkpoints import DIMS, GLM52_INDEXER_TYPES, N_LAYERS, dsa_fp8_release, write_mla_checkpoint
from support.fp8_checkpoints import quantize_checkpoint
from support.helpers import reader_tensors
from support.upstream import ParitySet, assert_same_tensors, raw_tensors

from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.header import TensorInfo, encode_kv, read_header, serialize_header
from gguf_mtp.jobs.convert import convert

Q = GGMLQuantizationType
N = N_LAYERS
B = f"blk.{N}."
ARCH = {"deepseekv32": "deepseek32", "glm5": "glm-dsa", "glm5-bf16": "glm-dsa"}
INDEXER = {f"{B}indexer.attn_q_b.weight": (Q.BF16, (DIMS.q_lora, DIMS.index_n_heads * DIMS.index_head_dim)),
           f"{B}indexer.attn_k.weight": (Q.BF16, (DIMS.n_embd, DIMS.index_head_dim)),
           f"{B}indexer.k_norm.weight": (Q.F32, (DIMS.index_head_dim,)),
           f"{B}indexer.k_norm.bias": (Q.F32, (DIMS.index_head_dim,)),
           f"{B}indexer.proj.weight": (Q.F32, (DIMS.n_embd, DIMS.index_n_heads))}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("dsa")
    v32 = write_mla_checkpoint(work / "deepseekv32-bf16", "deepseekv32")
    glm5 = write_mla_checkpoint(work / "glm5-bf16", "glm5")
    return {"deepseekv32": quantize_checkpoint(v32, work / "deepseekv32", quantized=dsa_fp8_release()),
            "glm5-bf16": glm5,
            "glm5": quantize_checkpoint(glm5, work / "glm5", quantized=dsa_fp8_release(("eh_proj",))),
            "deepseekv3": write_mla_checkpoint(work / "deepseekv3", "deepseekv3"),
            "glm47flash": write_mla_checkpoint(work / "glm47flash", "glm47flash")}


def _mutated(folder: Path, out: Path, **changes: object) -> Path:
    copy = Path(shutil.copytree(folder, out))
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("name", ["deepseekv32", "glm5", "glm5-bf16"])
def test_the_nextn_block_carries_its_indexer(ckpts: dict[str, Path], tmp_path: Path, name: str) -> None:
    out = convert(ckpts[name], tmp_path / "d.gguf", block=N, progress=False).output
    tensors = reader_tensors(out)
    assert {n: t[:2] for n, t in tensors.items() if ".indexer." in n} == INDEXER
    assert len(tensors) == (29 if name == "deepseekv32" else 27)  # V3.2 keeps its NextN embedding / LM head copies
    kvs = read_header(out)
    arch = ARCH[name]
    assert kvs.get("general.architecture") == arch
    assert kvs.get(f"{arch}.attention.indexer.head_count") == DIMS.index_n_heads
    assert kvs.get(f"{arch}.attention.indexer.key_length") == DIMS.index_head_dim
    assert kvs.get(f"{arch}.attention.indexer.top_k") == 8


def test_glm5_fp8_keeps_eh_proj_as_released(ckpts: dict[str, Path], tmp_path: Path) -> None:
    tensors = reader_tensors(convert(ckpts["glm5"], tmp_path / "d.gguf", block=N, progress=False).output)
    dtype, _, raw = raw_tensor(ckpts["glm5"], f"model.layers.{N}.eh_proj.weight")
    assert dtype == "BF16" and tensors[f"{B}nextn.eh_proj.weight"][2] == raw
    assert raw_tensor(ckpts["glm5"], f"model.layers.{N}.self_attn.indexer.wq_b.weight")[0] == "F8_E4M3"


def test_indexer_types_stay_trunk_length(ckpts: dict[str, Path], tmp_path: Path) -> None:
    header = read_header(convert(ckpts["glm5-bf16"], tmp_path / "d.gguf", block=N, progress=False).output)
    kv = header.kvs["glm-dsa.attention.indexer.types"]
    assert kv.element_type == GGUFValueType.BOOL and list(kv.value) == [t == "full" for t in GLM52_INDEXER_TYPES]
    assert header.get("glm-dsa.block_count") == N + 1  # the array stays N long (src/models/glm-dsa.cpp:66)


def test_a_v32_head_without_its_indexer_is_refused_in_one_line(ckpts: dict[str, Path], tmp_path: Path) -> None:
    # DeepSeek V3's layer (no indexer) under V3.2's config
    folder = _mutated(ckpts["deepseekv3"], tmp_path / "v32", architectures=["DeepseekV32ForCausalLM"],
                      index_n_heads=DIMS.index_n_heads, index_head_dim=DIMS.index_head_dim, index_topk=8)
    message = (f"the NextN layer has no DSA indexer tensor model.layers.{N}.self_attn.indexer.wq_b.weight: llama.cpp's "
               "deepseek32 loader requires the indexer in the NextN block (src/models/deepseek32.cpp:109-114")
    with pytest.raises(CheckpointError, match=re.escape(message)):
        convert(folder, tmp_path / "d.gguf", block=N, progress=False)


def test_a_glm5_head_without_an_indexer_converts(ckpts: dict[str, Path], tmp_path: Path) -> None:
    folder = _mutated(ckpts["glm47flash"], tmp_path / "g5", architectures=["GlmMoeDsaForCausalLM"],
                      index_n_heads=DIMS.index_n_heads, index_head_dim=DIMS.index_head_dim, index_topk=8)
    tensors = reader_tensors(convert(folder, tmp_path / "d.gguf", block=N, progress=False).output)
    assert len(tensors) == 22 and not any(".indexer." in n for n in tensors)  # optional: glm-dsa.cpp:144-148


@pytest.mark.parametrize(("changes", "message"), [
    ({"index_n_heads": None}, "index_n_heads"),
    ({"indexer_types": ["full"]}, "indexer_types has 1 entries, num_hidden_layers = 2"),
    ({"indexer_types": ["full", "sparse"]}, 'indexer_types is not a list of "full" / "shared"'),
])
def test_bad_dsa_configs_are_one_line(ckpts: dict[str, Path], tmp_path: Path, changes: dict[str, object],
                                      message: str) -> None:
    with pytest.raises(CheckpointError, match=re.escape(message)):
        convert(_mutated(ckpts["glm5-bf16"], tmp_path / "c", **changes), tmp_path / "d.gguf", block=N,
                progress=False)


def _dsa_target(path: Path, arch: str, tensor: str, *, index_heads: int = DIMS.index_n_heads) -> Path:
    """A DSA trunk of N blocks as far as convert --target reads it: metadata and one block tensor."""
    d, u32 = DIMS, GGUFValueType.UINT32
    kvs = [encode_kv("general.architecture", GGUFValueType.STRING, arch),
           encode_kv(f"{arch}.block_count", u32, N),
           encode_kv(f"{arch}.embedding_length", u32, d.n_embd),
           encode_kv(f"{arch}.attention.head_count_kv", u32, 1),
           encode_kv(f"{arch}.attention.key_length", u32, d.kv_lora + d.rope),
           encode_kv(f"{arch}.attention.key_length_mla", u32, d.nope + d.rope),
           encode_kv(f"{arch}.attention.indexer.head_count", u32, index_heads),
           encode_kv(f"{arch}.attention.indexer.key_length", u32, d.index_head_dim)]
    data = np.zeros((4, 32), np.float32).tobytes()
    path.write_bytes(serialize_header(3, kvs, [TensorInfo(tensor, (32, 4), Q.F32, 0, len(data))], 32) + data)
    return path


@pytest.mark.parametrize(("name", "tensor", "index_heads", "refusal"), [
    ("deepseekv32", "blk.0.attn_k_b.weight", DIMS.index_n_heads, None),
    ("glm5", "blk.0.attn_k_b.weight", DIMS.index_n_heads, None),
    ("deepseekv32", "blk.0.attn_kv_b.weight", DIMS.index_n_heads,
     "the target has attn_kv_b tensors: llama.cpp's deepseek32 model runs only in MLA format"),
    ("glm5", "blk.0.attn_kv_b.weight", DIMS.index_n_heads,
     "the target has attn_kv_b tensors: llama.cpp's glm-dsa model runs only in MLA format"),
    ("glm5", "blk.0.attn_k_b.weight", 2 * DIMS.index_n_heads,
     "attention.indexer.head_count = 3 (config.json index_n_heads), the target 6"),
])
def test_target_checks(ckpts: dict[str, Path], tmp_path: Path, name: str, tensor: str, index_heads: int,
                       refusal: str | None) -> None:
    target = _dsa_target(tmp_path / "trunk.gguf", ARCH[name], tensor, index_heads=index_heads)
    if refusal is None:
        assert convert(ckpts[name], tmp_path / "d.gguf", target=target, progress=False).plan.block == N
        return
    with pytest.raises(IncompatibleDraftError, match=re.escape(refusal)):
        convert(ckpts[name], tmp_path / "d.gguf", target=target, progress=False)


def test_a_deepseek2_target_is_not_a_v32_one(ckpts: dict[str, Path], tmp_path: Path) -> None:
    target = _dsa_target(tmp_path / "trunk.gguf", "deepseek2", "blk.0.attn_k_b.weight")
    with pytest.raises(IncompatibleDraftError, match="target architecture is 'deepseek2'; this DeepseekV32ForCausalLM "
                                                     "head converts to 'deepseek32'"):
        convert(ckpts["deepseekv32"], tmp_path / "d.gguf", target=target, progress=False)


# --------------------------------------------------------------------------------------- upstream parity
# (draft, sidecar, strip, composite and llama.cpp's runs against upstream's files: tests/test_upstream_parity.py's
# ``deepseekv32``, ``glm5`` and ``glm5-bf16`` entries, where no tensor may differ; here what is particular to DSA)

SETS = ["deepseekv32", "glm5", "glm5-bf16"]


def _on(*names: str) -> list[object]:
    return [pytest.param(name, marks=pytest.mark.parity(name)) for name in names]


@pytest.mark.upstream
@pytest.mark.parametrize("name", _on(*SETS))
def test_upstreams_nextn_block_carries_the_indexer(name: str, parity: ParitySet) -> None:
    theirs = raw_tensors(parity.mtp)
    assert {n: t[:2] for n, t in theirs.items() if ".indexer." in n and n.startswith(B)} == INDEXER


@pytest.mark.upstream
@pytest.mark.parametrize("name", _on("glm5", "glm5-bf16"))
def test_compose_leaves_the_indexer_types_trunk_length(name: str, parity: ParitySet) -> None:
    composite, full = read_header(parity.composite), read_header(parity.full)
    assert composite.kvs["glm-dsa.attention.indexer.types"].array_length == N  # as upstream writes it
    assert composite.get("glm-dsa.attention.indexer.types") == full.get("glm-dsa.attention.indexer.types")


@pytest.mark.upstream
@pytest.mark.llama
@pytest.mark.parity("glm5")
def test_verify_accepts_the_glm_dsa_composite(parity: ParitySet) -> None:
    from gguf_mtp.check.verify import verify

    report = verify(parity.composite, target=parity.trunk, draft=parity.draft, llama=True, progress=False)
    assert report.ok, report


@pytest.mark.upstream
@pytest.mark.parity("deepseekv32")
def test_fp8_v32_to_q8_0_equals_upstreams_q8_0_mtp_block(parity: ParitySet, tmp_path: Path) -> None:
    from support.upstream import upstream_convert

    mtp = upstream_convert(parity.checkpoint, tmp_path / "mtp-q8.gguf", "--mtp", outtype="q8_0")
    theirs = {n: t for n, t in raw_tensors(mtp).items() if n.startswith(B)}
    ours = raw_tensors(convert(parity.checkpoint, tmp_path / "d.gguf", target=parity.trunk, outtype="q8_0",
                                  progress=False).output)
    assert ours[f"{B}indexer.proj.weight"][0] == Q.F32 and ours[f"{B}indexer.attn_q_b.weight"][0] == Q.Q8_0
    assert_same_tensors(ours, theirs)
