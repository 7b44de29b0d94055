"""``convert`` of a checkpoint with several NextN layers (``num_nextn_predict_layers: 2``): every block is written,
renumbered together ``blk.N .. blk.N+k-1`` (issue 22 item 3), for glm4moe and deepseek2 alike (the base class does
it for every family whose NextN blocks are separate checkpoint layers).

Parity: llama.cpp's own ``convert_hf_to_gguf.py`` converts the 2-NextN GLM checkpoint full / ``--no-mtp`` /
``--mtp``. It writes both NextN layers (``blk.3`` and ``blk.4``) in the full and the ``--mtp`` file, so the
unpatched converter is the reference. gguf-mtp's draft equals upstream's ``--mtp`` blocks byte for byte, its
``--standalone`` sidecar every tensor of upstream's ``--mtp`` file, and ``compose`` of upstream's ``--no-mtp`` file
and the 2-block draft every tensor of upstream's full file, no difference allowed (tests/test_upstream_parity.py's
``glm4moe-2nextn`` entry).

llama.cpp loads the 2-block composite and runs its trunk; glm4moe's MTP graph asserts a single NextN block
(src/models/glm4-moe.cpp:135), so an MTP draft step aborts (upstream's own full file too): convert and inspect say
so, verify fails its NextN check, and ``nextn_blocks=1`` gives the file llama.cpp runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from support.convert_support import raw_tensor
from support.deepseek_checkpoints import as_glm47flash, write_mla_checkpoint
from support.fp8_checkpoints import quantize_checkpoint
from support.glm_checkpoints import GLM_HPARAMS, GLM_SPECIAL_TOKENS, write_glm_checkpoint
from support.helpers import reader_tensors
from support.session import shared_tmp_dir
from support.upstream import ParitySet, assert_same_tensors

from gguf_mtp.check.inspect import inspect
from gguf_mtp.check.verify import verify
from gguf_mtp.errors import CheckpointError, ParameterError
from gguf_mtp.format.header import read_header
from gguf_mtp.hub.checkpoint import head_files
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_models import GLM4MOE, write_target

Q = GGMLQuantizationType
N = 3  # trunk layers of the GLM checkpoints: NextN layers model.layers.3 and .4 -> blk.3 and blk.4
K = 2
UNRUN = ("2 NextN blocks, but llama.cpp's glm4moe MTP graph runs exactly 1 (src/models/glm4-moe.cpp:135: "
         "GGML_ASSERT n_layer_nextn == 1): its MTP decode aborts on this file")
CONVERT_NOTE = f"{UNRUN}; converting only the first block (nextn_blocks=1, --nextn-blocks 1) gives a file it runs"
ASSERTION = "GLM4_MOE MTP currently only supports a single MTP block"


def _block(tensors: dict[str, tuple[int, tuple[int, ...], bytes]], block: int) -> dict[str, tuple]:
    prefix = f"blk.{block}."
    return {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}


@pytest.fixture(scope="module")
def glm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GLM-4.5-Air style, two NextN layers model.layers.3 and .4, both in the last shard."""
    return write_glm_checkpoint(tmp_path_factory.mktemp("glm2") / "GLM-tiny-2nextn", n_nextn=K)


@pytest.fixture(scope="module")
def glm_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("glm2-target") / "t", family=GLM4MOE, hparams=GLM_HPARAMS,
                        quant="BF16", pattern="DEE")


# ------------------------------------------------------------------------------------------------ convert


def test_every_nextn_layer_becomes_its_own_block(glm2: Path, tmp_path: Path) -> None:
    report = convert(glm2, tmp_path / "d.gguf", block=N, progress=False)
    ours = reader_tensors(report.output)
    first, second = _block(ours, N), _block(ours, N + 1)
    assert set(first) == set(second) and len(first) == 21
    assert {int(n.split(".")[1]) for n in ours} == {N, N + 1}
    for block in (N, N + 1):  # each block holds its own layer's bytes (the seeds differ per tensor)
        layer = f"model.layers.{block}."
        assert ours[f"blk.{block}.nextn.eh_proj.weight"][2] == raw_tensor(glm2, layer + "eh_proj.weight")[2]
        assert ours[f"blk.{block}.attn_q.weight"][2] == raw_tensor(glm2, layer + "self_attn.q_proj.weight")[2]
        experts = [raw_tensor(glm2, f"{layer}mlp.experts.{e}.up_proj.weight")[2] for e in range(GLM_HPARAMS.n_expert)]
        assert ours[f"blk.{block}.ffn_up_exps.weight"][2] == b"".join(experts)
    assert first["nextn.eh_proj.weight"] != second["nextn.eh_proj.weight"]
    header = read_header(report.output)
    assert (header.get("glm4moe.block_count"), header.get("glm4moe.nextn_predict_layers")) == (N + K, K)
    assert (report.plan.block, report.plan.nextn_blocks) == (N, K)
    assert report.to_dict()["nextn_blocks"] == K
    assert "glm4moe 2 NextN blocks blk.3-4, 42 head tensors" in "\n".join(report.plan_lines())
    assert CONVERT_NOTE in report.plan.notes


@pytest.mark.llama
def test_every_block_takes_a_llama_quantize_outtype(glm2: Path, tmp_path: Path) -> None:
    """``--outtype q4_k`` (llama-quantize's rules) on a head of two blocks: each block gets the types and bytes the
    first block alone gets (the rule is looked up on the first block's names, ``{bid[1]}`` included)."""
    both = reader_tensors(convert(glm2, tmp_path / "both.gguf", block=N, outtype="q4_k", progress=False).output)
    one = reader_tensors(convert(glm2, tmp_path / "one.gguf", block=N, outtype="q4_k", nextn_blocks=1,
                                 progress=False).output)
    first, second = _block(both, N), _block(both, N + 1)
    assert first == _block(one, N)
    assert {n: t[:2] for n, t in second.items()} == {n: t[:2] for n, t in first.items()}
    assert Q.Q4_K in {t[0] for t in second.values()}


def test_target_places_the_blocks_after_its_trunk_and_compose_takes_both(glm2: Path, glm_target: Path,
                                                                         tmp_path: Path) -> None:
    draft = convert(glm2, tmp_path / "d.gguf", target=glm_target, progress=False).output
    assert {n.split(".")[1] for n in reader_tensors(draft)} == {"3", "4"}
    composite = compose(glm_target, draft, tmp_path / "c", progress=False).output_paths[0]
    header = read_header(composite)
    assert (header.get("glm4moe.block_count"), header.get("glm4moe.nextn_predict_layers")) == (N + K, K)
    tensors = reader_tensors(composite)
    for block in (N, N + 1):
        assert _block(tensors, block) == _block(reader_tensors(draft), block)
    summary = inspect(composite)
    assert summary.graph_note == UNRUN and f"note: {UNRUN}" in "\n".join(summary.describe())
    report = verify(composite, draft=draft, llama=False, progress=False)
    failed = [check for check in report.checks if check.ok is False]
    assert not report.ok and [c.name for c in failed] == ["NextN tensors"] and UNRUN in failed[0].detail


def test_standalone_carries_both_blocks(glm2: Path, glm_target: Path, tmp_path: Path) -> None:
    sidecar = convert(glm2, tmp_path / "mtp.gguf", target=glm_target, standalone=True, progress=False).output
    header = read_header(sidecar)
    assert (header.get("glm4moe.block_count"), header.get("glm4moe.nextn_predict_layers")) == (N + K, K)
    names = list(reader_tensors(sidecar))
    assert names[0] == "token_embd.weight" and names[-2:] == ["output_norm.weight", "output.weight"]
    assert {n.split(".")[1] for n in names[1:-2]} == {"3", "4"}


def test_nextn_blocks_keeps_the_first_blocks_only(glm2: Path, glm_target: Path, tmp_path: Path) -> None:
    both = reader_tensors(convert(glm2, tmp_path / "both.gguf", target=glm_target, progress=False).output)
    report = convert(glm2, tmp_path / "one.gguf", target=glm_target, nextn_blocks=1, progress=False)
    one = reader_tensors(report.output)
    assert one == {name: t for name, t in both.items() if name.startswith(f"blk.{N}.")}
    header = read_header(report.output)
    assert (header.get("glm4moe.block_count"), header.get("glm4moe.nextn_predict_layers")) == (N + 1, 1)
    assert not any("NextN blocks" in note for note in report.plan.notes)
    with pytest.raises(ParameterError, match=r"^nextn_blocks 3: the head has 2 NextN block\(s\); keep 1..2 of them"):
        convert(glm2, tmp_path / "three.gguf", target=glm_target, nextn_blocks=3, progress=False)


@pytest.mark.slow
def test_nextn_blocks_flag_of_the_cli(glm2: Path, glm_target: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    base = [sys.executable, "-m", "gguf_mtp", "convert", str(glm2), "--target", str(glm_target), "--quiet"]
    ok = subprocess.run([*base, "-o", str(tmp_path / "one.gguf"), "--nextn-blocks", "1"], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    assert read_header(tmp_path / "one.gguf").get("glm4moe.nextn_predict_layers") == 1
    bad = subprocess.run([*base, "-o", str(tmp_path / "zero.gguf"), "--nextn-blocks", "0"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "gguf-mtp: error: --nextn-blocks 0: the head has 2 NextN block(s); keep 1..2 of them"]
    assert not (tmp_path / "zero.gguf").exists()


def test_deepseek2_fp8_head_of_two_blocks(tmp_path: Path) -> None:
    bf16 = write_mla_checkpoint(tmp_path / "bf16", "deepseekv3", n_nextn=K)
    fp8 = quantize_checkpoint(bf16, tmp_path / "fp8")
    n = 2  # deepseek_checkpoints.N_LAYERS
    ours = reader_tensors(convert(fp8, tmp_path / "d.gguf", block=n, progress=False).output)
    assert set(_block(ours, n)) == set(_block(ours, n + 1)) and len(_block(ours, n)) == 24
    assert ours[f"blk.{n + 1}.nextn.enorm.weight"] != ours[f"blk.{n}.nextn.enorm.weight"]
    assert ours[f"blk.{n + 1}.attn_q_a.weight"][0] == Q.BF16  # FP8 dequantized, block after block
    header = read_header(tmp_path / "d.gguf")
    assert (header.get("deepseek2.block_count"), header.get("deepseek2.nextn_predict_layers")) == (n + K, K)


def test_block_bound_counts_every_nextn_block(glm2: Path, tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match=r"^blk\.511 \+ 2 NextN blocks: llama\.cpp loads at most 512 layers"):
        convert(glm2, tmp_path / "d.gguf", block=511, progress=False)


def test_missing_second_layer_and_bad_counts_are_one_line(glm2: Path, tmp_path: Path) -> None:
    config = json.loads((glm2 / "config.json").read_text())
    for value, message in ((3, r"num_nextn_predict_layers = 3, but the checkpoint has no NextN layer model\.layers\.5 "
                               r"\(NextN block 3 of 3\)"),
                           (512, r"num_nextn_predict_layers = 512 is out of range \(expected 0..511\)"),
                           (510, r"num_hidden_layers = 3 is out of range \(expected 1..2\)")):
        folder = tmp_path / f"n{value}"
        folder.mkdir()
        for path in glm2.iterdir():
            (folder / path.name).symlink_to(path)
        (folder / "config.json").unlink()
        (folder / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": value}))
        with pytest.raises(CheckpointError, match=message):
            convert(folder, tmp_path / f"d{value}.gguf", block=N, progress=False)
        assert not (tmp_path / f"d{value}.gguf").exists()


def test_hub_source_fetches_the_shards_of_both_nextn_layers_only(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants as hf_constants
    from support.convert_support import fill_hub_cache
    from support.glm_checkpoints import glm_config, glm_tensors

    from gguf_mtp.format.safetensors_io import CONFIG_NAME, INDEX_NAME
    from gguf_mtp.testing.tiny_checkpoints import write_safetensors

    # GLM-4.5's own layout scaled down: the trunk, then each NextN layer in a shard of its own
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(glm_config(GLM_HPARAMS, n_nextn=K)))
    tensors = glm_tensors(GLM_HPARAMS, n_nextn=K)
    heads = ("model.layers.3.", "model.layers.4.")
    shards = {"model-00001-of-00003.safetensors": [t for t in tensors if not t.name.startswith(heads)],
              "model-00002-of-00003.safetensors": [t for t in tensors if t.name.startswith(heads[0])],
              "model-00003-of-00003.safetensors": [t for t in tensors if t.name.startswith(heads[1])]}
    first = 0
    for name, part in shards.items():
        write_safetensors(folder / name, part, first_index=first)
        first += len(part)
    weight_map = {t.name: name for name, part in shards.items() for t in part}
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    fill_hub_cache(cache, "zai-org/Tiny-GLM-2nextn", folder, leave_out=("model-00001-of-00003.safetensors",))
    calls: list[object] = []
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: calls.append(k) or real(*a, **k))
    report = convert("zai-org/Tiny-GLM-2nextn", tmp_path / "d.gguf", block=N, progress=False)
    assert report.to_dict()["download"]["allow_patterns"] == [
        CONFIG_NAME, INDEX_NAME, "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    assert len(calls) == 1
    local = convert(folder, tmp_path / "local.gguf", block=N, progress=False).output
    assert reader_tensors(report.output) == reader_tensors(local)
    assert {n.split(".")[1] for n in reader_tensors(local)} == {"3", "4"}


def test_hub_download_takes_the_shards_of_every_nextn_layer() -> None:
    weight_map = {"model.layers.2.mlp.gate.weight": "model-00001.safetensors",
                  "model.layers.3.eh_proj.weight": "model-00002.safetensors",
                  "model.layers.4.eh_proj.weight": "model-00003.safetensors",
                  "model.layers.30.eh_proj.weight": "model-00004.safetensors"}
    from gguf_mtp.conversion.glm4moe import Glm4MoeMTPModel

    prefixes = Glm4MoeMTPModel.head_prefix({"num_hidden_layers": 3, "num_nextn_predict_layers": 2})
    assert head_files(weight_map, prefixes) == ["model-00002.safetensors", "model-00003.safetensors"]


@pytest.mark.slow
@pytest.mark.llama
def test_llama_loads_the_two_block_composite(glm2: Path, glm_target: Path, tmp_path: Path) -> None:
    from gguf_mtp.check.llama_check import check_with_llama

    draft = convert(glm2, tmp_path / "d.gguf", target=glm_target, progress=False).output
    composite = compose(glm_target, draft, tmp_path / "c", progress=False).output_paths[0]
    check = check_with_llama(composite)
    assert check.loaded and check.trunk_decode_ok is True, check.summary() + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (N, K)
    # what the note says: glm4moe's MTP graph asserts a single block, so the draft step aborts (no other failure)
    assert check.mtp_decode_ok is not True and ASSERTION in (check.error or ""), check.summary()
    # the way out the note names: the first block alone runs an MTP step
    one = convert(glm2, tmp_path / "one.gguf", target=glm_target, nextn_blocks=1, progress=False).output
    check = check_with_llama(compose(glm_target, one, tmp_path / "c1", progress=False).output_paths[0])
    assert check.ok and check.mtp_decode_ok and check.mtp_logits_finite, check.summary() + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (N, 1)


# --------------------------------------------------------------------------------------- upstream parity
# (draft, sidecar and composite against upstream's files: tests/test_upstream_parity.py's ``glm4moe-2nextn`` entry)


@pytest.mark.upstream
@pytest.mark.parity("glm4moe-2nextn")
def test_upstream_writes_both_nextn_layers(parity: ParitySet) -> None:
    # The reported drop of the first NextN layer (blk.3) does not happen in the vendored converter.
    for kind, path in (("full", parity.full), ("mtp", parity.mtp)):
        tensors = reader_tensors(path)
        assert len(_block(tensors, N)) == len(_block(tensors, N + 1)) == 25, kind
        header = read_header(path)
        assert (header.get("glm4moe.block_count"), header.get("glm4moe.nextn_predict_layers")) == (N + K, K)
        assert tensors[f"blk.{N}.nextn.eh_proj.weight"][2] == raw_tensor(
            parity.checkpoint, f"model.layers.{N}.eh_proj.weight")[2]


@pytest.mark.upstream
@pytest.mark.llama
@pytest.mark.parity("glm4moe-2nextn")
def test_llama_runs_the_composite_with_upstreams_logits(parity: ParitySet) -> None:
    from gguf_mtp.check.llama_check import check_with_llama

    ours, theirs = check_with_llama(parity.composite), check_with_llama(parity.full)
    for check in (ours, theirs):  # upstream's own 2-block file fares exactly as ours: trunk runs, MTP aborts
        assert check.loaded and check.trunk_decode_ok is True, check.summary() + check.log_tail
        assert (check.n_layer, check.n_layer_nextn) == (N, K)
        assert check.mtp_decode_ok is not True and ASSERTION in (check.error or ""), check.summary()
    assert ours.trunk_logits_sha256 is not None and ours.trunk_logits_sha256 == theirs.trunk_logits_sha256
    assert inspect(parity.composite).graph_note == inspect(parity.full).graph_note == UNRUN


@pytest.mark.upstream
def test_deepseek2_two_fp8_blocks_equal_upstreams_glm47flash_class(request: pytest.FixtureRequest) -> None:
    """DeepSeek V3 FP8 shards with two NextN layers: upstream drops DeepSeek's MTP layers, so the reference is its
    GLM-4.7-Flash class (the same deepseek2 tensor handling and FP8 dequantization) on the very same shards."""
    from support.upstream import write_gpt2_tokenizer

    work = shared_tmp_dir(request, "deepseek-2nextn-parity")
    n = 2  # deepseek_checkpoints.N_LAYERS
    ours = quantize_checkpoint(write_mla_checkpoint(work / "bf16", "deepseekv3", n_nextn=K), work / "fp8")
    write_gpt2_tokenizer(ours, GLM_SPECIAL_TOKENS)
    files = ParitySet(ours, work, reference=as_glm47flash(ours, work / "as-glm47flash"), outtype="auto")
    theirs = {name: t for name, t in reader_tensors(files.mtp).items() if name.startswith(("blk.2.", "blk.3."))}
    assert len(_block(theirs, n)) == len(_block(theirs, n + 1)) == 24
    assert_same_tensors(reader_tensors(files.draft), theirs)  # none may differ
    header = read_header(files.draft)
    assert (header.get("deepseek2.block_count"), header.get("deepseek2.nextn_predict_layers")) == (n + K, K)
