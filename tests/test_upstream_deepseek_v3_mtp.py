"""upstream/06-deepseek-v3-mtp-export: llama.cpp's own converter, patched, exports DeepSeek V3/R1/V3.1's MTP layer.

Unpatched, ``convert_hf_to_gguf.py`` drops it (``DeepseekV2Model.skip_mtp = True``) and refuses ``--mtp`` for
``DeepseekV3ForCausalLM``. On a tiny DeepSeek V3 FP8 checkpoint (:mod:`deepseek_checkpoints` quantized by
:mod:`fp8_checkpoints`: 128x128 blocks, partial ones everywhere) the proof is:

* the gap: the unpatched full file stops at the trunk (no ``blk.N``, no ``nextn_predict_layers``) and ``--mtp`` is
  refused;
* the patched full and ``--mtp`` files carry ``blk.N`` byte for byte as gguf-mtp's ``convert`` writes it, the
  patched full trunk is the unpatched file's, and the patched ``--no-mtp`` file is the unpatched full file itself;
* llama.cpp runs the patched full file's MTP decode with the very logits of gguf-mtp's ``compose`` of
  ``--no-mtp`` + draft;
* two NextN layers come out as ``blk.N``, ``blk.N+1`` (``nextn_predict_layers = 2``) as gguf-mtp's own, and llama.cpp
  loads that file (its deepseek2 graph runs one block, so no MTP decode);
* the model that already had the path, GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``, whose MTP code the patch moves
  into the new DeepSeek V3 class), converts to the same bytes as before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.deepseek_checkpoints import N_LAYERS, write_mla_checkpoint
from support.fp8_checkpoints import quantize_checkpoint
from support.glm_checkpoints import GLM_SPECIAL_TOKENS
from support.helpers import reader_tensors

from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert

pytestmark = pytest.mark.upstream

N = N_LAYERS
PATCH = "upstream/06-deepseek-v3-mtp-export/deepseek-v3-mtp-export.patch"
#: Tensors of DeepSeek V3's NextN block in this checkpoint: 20 of the decoder layer + eh_proj, enorm, hnorm,
#: shared_head.norm + its own embed_tokens and shared_head.head copies.
NEXTN_TENSORS = 24
ONE_BLOCK_ONLY = "GLM4 MTP currently only supports a single MTP block"


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The vendored llama.cpp as it is, and a copy with the patch applied."""
    from support.upstream import ROOT, llama_cpp_tree

    patched = tmp_path_factory.mktemp("deepseek-v3-patched") / "llama.cpp"
    shutil.copytree(llama_cpp_tree(), patched, ignore=shutil.ignore_patterns(".complete", "__pycache__"))
    for check in (["--check"], []):
        subprocess.run(["git", "apply", *check, str(ROOT / PATCH)], cwd=patched, check=True)
    return {"unpatched": llama_cpp_tree(), "patched": patched}


def _checkpoint(work: Path, variant: str, n_nextn: int = 1) -> Path:
    bf16 = write_mla_checkpoint(work / f"{variant}-bf16", variant, n_nextn=n_nextn)
    folder = quantize_checkpoint(bf16, work / variant) if variant == "deepseekv3" else bf16
    from support.upstream import write_gpt2_tokenizer

    write_gpt2_tokenizer(folder, GLM_SPECIAL_TOKENS)
    return folder


@pytest.fixture(scope="module")
def files(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Unpatched full; patched full / --no-mtp / --mtp (``--outtype auto``); gguf-mtp's draft of the checkpoint
    (placed after the patched --no-mtp trunk) and its composite with that trunk."""
    from support.upstream import upstream_convert

    work = tmp_path_factory.mktemp("deepseek-v3-mtp-export")
    ckpt = _checkpoint(work, "deepseekv3")
    patched = trees["patched"]
    out = {"checkpoint": ckpt,
           "unpatched": upstream_convert(ckpt, work / "unpatched-full.gguf", outtype="auto", tree=trees["unpatched"]),
           "full": upstream_convert(ckpt, work / "full.gguf", outtype="auto", tree=patched),
           "trunk": upstream_convert(ckpt, work / "no-mtp.gguf", "--no-mtp", outtype="auto", tree=patched),
           "mtp": upstream_convert(ckpt, work / "mtp.gguf", "--mtp", outtype="auto", tree=patched)}
    out["draft"] = convert(ckpt, work / "draft.gguf", target=out["trunk"], progress=False).output
    out["composite"] = compose(out["trunk"], out["draft"], work / "composite", progress=False).output_paths[0]
    return out


def _block(tensors: dict, block: int) -> dict:
    return {name: t for name, t in tensors.items() if name.startswith(f"blk.{block}.")}


def _counts(path: Path) -> tuple[object, object]:
    header = read_header(path)
    return header.get("deepseek2.block_count"), header.get("deepseek2.nextn_predict_layers")


def _refusal(checkpoint: Path, tree: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    from support.upstream import upstream_python

    return subprocess.run([upstream_python(), str(tree / "convert_hf_to_gguf.py"), str(checkpoint), "--mtp",
                           "--outfile", str(tmp_path / "x.gguf")], capture_output=True, text=True, cwd=tree,
                          env={"PYTHONPATH": str(tree / "gguf-py"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
                          timeout=300)


def test_unpatched_converter_drops_the_mtp_layer_and_refuses_mtp(files: dict[str, Path], trees: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    tensors = reader_tensors(files["unpatched"])
    assert _counts(files["unpatched"]) == (N, None)
    assert _block(tensors, N) == {} and _block(tensors, N - 1)
    refused = _refusal(files["checkpoint"], trees["unpatched"], tmp_path)
    assert refused.returncode == 1
    assert "--mtp / --no-nextn are not supported for DeepseekV3ForCausalLM" in refused.stderr


def test_patched_full_and_mtp_carry_gguf_mtps_nextn_block(files: dict[str, Path]) -> None:
    ours = reader_tensors(files["draft"])
    assert len(ours) == NEXTN_TENSORS and ours == _block(ours, N)
    for kind in ("full", "mtp"):
        theirs = _block(reader_tensors(files[kind]), N)
        assert sorted(theirs) == sorted(ours), kind
        for name, tensor in theirs.items():
            assert tensor == ours[name], f"{kind}: {name} differs from gguf-mtp's convert"
        assert _counts(files[kind]) == (N + 1, 1), kind


def test_patched_trunk_is_the_unpatched_output(files: dict[str, Path]) -> None:
    before = reader_tensors(files["unpatched"])
    full = reader_tensors(files["full"])
    assert {name: t for name, t in full.items() if not name.startswith(f"blk.{N}.")} == before
    assert files["trunk"].read_bytes() == files["unpatched"].read_bytes()  # --no-mtp: the old full file, every byte


def test_compose_of_no_mtp_and_draft_equals_patched_full(files: dict[str, Path]) -> None:
    assert reader_tensors(files["composite"]) == reader_tensors(files["full"])
    assert _counts(files["composite"]) == _counts(files["full"])


@pytest.mark.llama
def test_llama_runs_the_patched_full_file_with_gguf_mtps_mtp_logits(files: dict[str, Path]) -> None:
    from gguf_mtp.check.llama_check import check_with_llama

    theirs, ours = check_with_llama(files["full"]), check_with_llama(files["composite"])
    for check in (theirs, ours):
        assert check.ok and check.mtp_decode_ok and check.mtp_logits_finite, check.summary() + check.log_tail
        assert (check.n_layer, check.n_layer_nextn) == (N, 1)
    assert theirs.mtp_logits_sha256 is not None and theirs.mtp_logits_sha256 == ours.mtp_logits_sha256
    assert theirs.trunk_logits_sha256 is not None and theirs.trunk_logits_sha256 == ours.trunk_logits_sha256


@pytest.mark.llama
def test_two_nextn_layers_are_exported_as_two_blocks(trees: dict[str, Path], tmp_path: Path) -> None:
    from support.upstream import upstream_convert

    from gguf_mtp.check.llama_check import check_with_llama

    ckpt = _checkpoint(tmp_path, "deepseekv3", n_nextn=2)
    full = upstream_convert(ckpt, tmp_path / "full.gguf", outtype="auto", tree=trees["patched"])
    trunk = upstream_convert(ckpt, tmp_path / "no-mtp.gguf", "--no-mtp", outtype="auto", tree=trees["patched"])
    assert _counts(full) == (N + 2, 2) and _counts(trunk) == (N, None)
    draft = reader_tensors(convert(ckpt, tmp_path / "draft.gguf", target=trunk, progress=False).output)
    theirs = reader_tensors(full)
    assert len(_block(theirs, N)) == len(_block(theirs, N + 1)) == NEXTN_TENSORS
    assert {**_block(theirs, N), **_block(theirs, N + 1)} == draft
    check = check_with_llama(full)
    assert check.loaded and check.trunk_decode_ok, check.summary() + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (N, 2)
    # src/models/deepseek2.cpp:173: the MTP graph asserts a single NextN block (its message names GLM4)
    assert check.mtp_decode_ok is not True and ONE_BLOCK_ONLY in (check.error or ""), check.summary()


def test_glm47flash_output_is_unchanged(trees: dict[str, Path], tmp_path: Path) -> None:
    from support.upstream import upstream_convert

    ckpt = _checkpoint(tmp_path, "glm47flash")
    for flags in ((), ("--mtp",)):
        name = "".join(flags) or "full"
        before = upstream_convert(ckpt, tmp_path / f"before{name}.gguf", *flags, tree=trees["unpatched"])
        after = upstream_convert(ckpt, tmp_path / f"after{name}.gguf", *flags, tree=trees["patched"])
        assert after.read_bytes() == before.read_bytes(), flags


def test_a_deepseek_v3_checkpoint_without_nextn_layers_is_unchanged(files: dict[str, Path], trees: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """Kimi-K2 ships ``DeepseekV3ForCausalLM`` with ``num_nextn_predict_layers = 0``: such a config converts as
    before, byte for byte (here the checkpoint still holds a layer past the trunk, dropped as before)."""
    from support.upstream import upstream_convert

    ckpt = Path(shutil.copytree(files["checkpoint"], tmp_path / "no-nextn"))
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": 0}))
    before = upstream_convert(ckpt, tmp_path / "before.gguf", outtype="auto", tree=trees["unpatched"])
    after = upstream_convert(ckpt, tmp_path / "after.gguf", outtype="auto", tree=trees["patched"])
    assert after.read_bytes() == before.read_bytes()
