"""DeepSeek V3.2 (``DeepseekV32ForCausalLM`` -> ``deepseek32``, FP8) and GLM-5.x (``GlmMoeDsaForCausalLM`` ->
``glm-dsa``, BF16 and FP8) MTP heads (issue 22): convert, llama.cpp, and llama.cpp's own converter as the reference.

* convert of tiny checkpoints (:mod:`deepseek_checkpoints`: two shards + index, the NextN layer in the second; FP8
  in 128x128 blocks with partial blocks everywhere, the indexer's ``weights_proj`` and GLM-5's ``eh_proj`` left in
  BF16 as the releases leave them): the NextN block's DSA indexer (names, shapes, ``indexer.proj`` in F32), required
  for deepseek32 (a head without it is refused in one line) and optional for glm-dsa; GLM-5.2's trunk-length
  ``attention.indexer.types``; ``--target`` checks (MLA trunk, indexer sizes).
* parity (``upstream``): llama.cpp's ``convert_hf_to_gguf.py`` (``DeepseekV32Model``, ``GlmMoeDsaModel``: both export
  the MTP layer) writes full / ``--no-mtp`` / ``--mtp`` of each checkpoint; convert equals the ``--mtp`` NextN block,
  compose of ``--no-mtp`` + draft equals the full file, ``--standalone`` equals ``--mtp``; llama.cpp runs them.

Allowed differences (the one place they are listed): :data:`ALLOWED`, empty: every NextN tensor is byte-identical;
:data:`ALLOWED_KVS`: the composite's ``general.size_label`` (DeepSeek V3.2: upstream counts the NextN layer's own
embedding / LM head copies). The draft's own metadata is not compared with upstream's ``--mtp`` file (compose keeps
the target's KVs and moves only ``block_count`` / ``nextn_predict_layers``, compared here).
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
from support.deepseek_checkpoints import DIMS, GLM52_INDEXER_TYPES, N_LAYERS, write_mla_checkpoint
from support.fp8_checkpoints import is_linear, quantize_checkpoint
from support.glm_checkpoints import GLM_SPECIAL_TOKENS
from support.helpers import reader_tensors
from support.upstream import (
    ParitySet,
    assert_runs_like,
    assert_runs_mtp_only,
    assert_same_tensors,
    write_gpt2_tokenizer,
)

from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.header import TensorInfo, encode_kv, read_header, serialize_header
from gguf_mtp.jobs.convert import convert

Q = GGMLQuantizationType
N = N_LAYERS
B = f"blk.{N}."
#: NextN tensor -> (how gguf-mtp's bytes may differ from llama.cpp's converter's, why). None do.
ALLOWED: dict[str, tuple[str, str]] = {}
#: KV of the composite -> why it may differ from upstream's full file (compose keeps the trunk's metadata).
ALLOWED_KVS: dict[str, str] = {
    "general.size_label": "upstream's full DeepSeek V3.2 file counts the NextN layer's own embedding / LM head copies "
                          "in its parameter count; compose keeps the trunk's label",
}
ARCH = {"deepseekv32": "deepseek32", "glm5": "glm-dsa", "glm5-bf16": "glm-dsa"}
INDEXER = {f"{B}indexer.attn_q_b.weight": (Q.BF16, (DIMS.q_lora, DIMS.index_n_heads * DIMS.index_head_dim)),
           f"{B}indexer.attn_k.weight": (Q.BF16, (DIMS.n_embd, DIMS.index_head_dim)),
           f"{B}indexer.k_norm.weight": (Q.F32, (DIMS.index_head_dim,)),
           f"{B}indexer.k_norm.bias": (Q.F32, (DIMS.index_head_dim,)),
           f"{B}indexer.proj.weight": (Q.F32, (DIMS.n_embd, DIMS.index_n_heads))}


def _fp8_release(keep_bf16: tuple[str, ...]) -> object:
    """What an FP8 release quantizes: the linear weights except the indexer's ``weights_proj`` (BF16 in V3.2) and
    ``keep_bf16`` (GLM-5 keeps ``eh_proj``)."""
    return lambda name, shape: is_linear(name, shape) and not any(k in name for k in ("weights_proj", *keep_bf16))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("dsa")
    v32 = write_mla_checkpoint(work / "deepseekv32-bf16", "deepseekv32")
    glm5 = write_mla_checkpoint(work / "glm5-bf16", "glm5")
    return {"deepseekv32": quantize_checkpoint(v32, work / "deepseekv32", quantized=_fp8_release(())),
            "glm5-bf16": glm5, "glm5": quantize_checkpoint(glm5, work / "glm5", quantized=_fp8_release(("eh_proj",))),
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


# --------------------------------------------------------------------- llama.cpp's converter: the reference


@pytest.fixture(scope="module")
def upstream(ckpts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, ParitySet]:
    """Per checkpoint: upstream's full / --no-mtp / --mtp (``--outtype auto``), gguf-mtp's draft (block from the
    --no-mtp trunk), its --standalone sidecar and the composite."""
    work = tmp_path_factory.mktemp("dsa-parity")
    out: dict[str, ParitySet] = {}
    for name in ("deepseekv32", "glm5", "glm5-bf16"):
        ours = Path(shutil.copytree(ckpts[name], work / name / "hf"))
        write_gpt2_tokenizer(ours, GLM_SPECIAL_TOKENS)
        # DeepseekV32Model.set_vocab asserts the tokenizer adds a BOS token (V3.2's tokenizer_config.json does)
        config = json.loads((ours / "tokenizer_config.json").read_text())
        (ours / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": True}))
        out[name] = ParitySet(ours, work / name, outtype="auto")
    return out


def _assert_same_tensors(ours: dict, theirs: dict) -> None:
    assert_same_tensors(ours, theirs, ALLOWED)


def _kvs(header: object) -> dict[str, bytes]:
    return {k: kv.raw for k, kv in header.kvs.items()  # type: ignore[attr-defined]
            if not k.startswith("gguf_mtp.") and k not in ALLOWED_KVS}


NAMES = ["deepseekv32", "glm5", "glm5-bf16"]


@pytest.mark.upstream
@pytest.mark.parametrize("name", NAMES)
def test_convert_equals_upstreams_mtp_block(upstream: dict[str, ParitySet], name: str) -> None:
    files = upstream[name]
    theirs = {n: t for n, t in reader_tensors(files.mtp).items() if n.startswith(B)}
    assert len(theirs) == (29 if name == "deepseekv32" else 27) and INDEXER.keys() <= theirs.keys()
    _assert_same_tensors(reader_tensors(files.draft), theirs)


@pytest.mark.upstream
@pytest.mark.parametrize("name", NAMES)
def test_compose_of_no_mtp_and_draft_equals_upstream_full(upstream: dict[str, ParitySet], name: str) -> None:
    files = upstream[name]
    _assert_same_tensors(reader_tensors(files.composite), reader_tensors(files.full))
    composite, full, arch = read_header(files.composite), read_header(files.full), ARCH[name]
    for key in (f"{arch}.block_count", f"{arch}.nextn_predict_layers"):
        assert composite.get(key) == full.get(key), key
    assert _kvs(composite) == _kvs(full)  # every KV, gguf_mtp.* bookkeeping and ALLOWED_KVS aside
    if name != "deepseekv32":  # no copies: the label is the same too
        assert composite.get("general.size_label") == full.get("general.size_label")
    if arch == "glm-dsa":  # compose left the trunk-length array alone, as upstream writes it
        assert composite.kvs["glm-dsa.attention.indexer.types"].array_length == N


@pytest.mark.upstream
@pytest.mark.parametrize("name", NAMES)
def test_standalone_equals_upstreams_mtp_export(upstream: dict[str, ParitySet], name: str) -> None:
    _assert_same_tensors(reader_tensors(upstream[name].standalone), reader_tensors(upstream[name].mtp))


@pytest.mark.upstream
@pytest.mark.llama
@pytest.mark.parametrize("name", ["deepseekv32", "glm5"])
def test_llama_runs_the_composite_with_upstreams_mtp_logits(upstream: dict[str, ParitySet], name: str) -> None:
    ours = assert_runs_like(upstream[name].composite, upstream[name].full)
    assert (ours.n_layer, ours.n_layer_nextn) == (N, 1)
    assert_runs_mtp_only(upstream[name].standalone)


@pytest.mark.upstream
@pytest.mark.llama
def test_verify_accepts_the_glm_dsa_composite(upstream: dict[str, ParitySet]) -> None:
    from gguf_mtp.check.verify import verify

    files = upstream["glm5"]
    report = verify(files.composite, target=files.trunk, draft=files.draft, llama=True, progress=False)
    assert report.ok, report


@pytest.mark.upstream
def test_fp8_v32_to_q8_0_equals_upstreams_q8_0_mtp_block(upstream: dict[str, ParitySet], tmp_path: Path) -> None:
    from support.upstream import upstream_convert

    files = upstream["deepseekv32"]
    mtp = upstream_convert(files.checkpoint, tmp_path / "mtp-q8.gguf", "--mtp", outtype="q8_0")
    theirs = {n: t for n, t in reader_tensors(mtp).items() if n.startswith(B)}
    ours = reader_tensors(convert(files.checkpoint, tmp_path / "d.gguf", target=files.trunk, outtype="q8_0",
                                  progress=False).output)
    assert ours[f"{B}indexer.proj.weight"][0] == Q.F32 and ours[f"{B}indexer.attn_q_b.weight"][0] == Q.Q8_0
    _assert_same_tensors(ours, theirs)
