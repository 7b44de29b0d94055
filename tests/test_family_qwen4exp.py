"""Qwen3.8-Flash-Next (qwen4exp) MTP heads: convert, and every command on a qwen4exp composite, against b11434.

Two groups:

* convert of a small-vocabulary checkpoint (:mod:`support.qwen4exp_checkpoints`): ``eh_proj`` is ``fc_embedding``
  beside ``fc_hidden``, the head's hyper-connection mixer becomes ``nextn.hc_head_{norm,down,up}``, ``nextn.hnorm``
  keeps the checkpoint's type after its ``+1``, the indexer's ``index_qk_proj`` splits by rows, the per-layer arrays,
  and one-line refusals of a head with half an ``eh_proj``;
* on the shared ``qwen4exp`` parity set (``upstream``: b11434's converter made full / ``--no-mtp`` / ``--mtp`` of the
  GPT-2-vocabulary checkpoint; tests/test_upstream_parity.py compares tensors and counts): the sidecar's metadata is
  b11434's ``--mtp`` export's key for key (no per-layer-embedding key), compose leaves the ``ple.*`` arrays one entry
  per hash head, and extract / strip / graft / ``--replace-head`` / ``--outtype`` / ``--embd-type`` give back what
  they should, byte for byte.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from support.convert_support import raw_tensor, rewrite_checkpoint_tensor
from support.helpers import reader_kvs, reader_tensors
from support.qwen4exp_checkpoints import (
    COMPRESS_RATIO,
    HC,
    HC_LOWRANK,
    INDEXER_DIM,
    INDEXER_HEADS,
    N_TRUNK,
    PLE_HEADS,
    write_qwen4exp_checkpoint,
)
from support.qwen_checkpoints import DIMS, QwenDims
from support.upstream import ParitySet, raw_kvs, raw_tensors

from gguf_mtp.check.draft_checks import draft_globals_check
from gguf_mtp.errors import CheckpointError, IncompatibleDraftError
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.extract import extract
from gguf_mtp.jobs.graft import graft
from gguf_mtp.jobs.strip import strip

Q = GGMLQuantizationType
BLOCK = N_TRUNK
H = DIMS.n_embd
SMALL = QwenDims(n_vocab=256)
PLE_ARRAYS = ("qwen4exp.ple.head_offsets", "qwen4exp.ple.head_vocab_sizes")


def _bf16_to_f32(raw: bytes) -> np.ndarray:
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> bytes:
    """Round to nearest even, as gguf-py's BF16 quantizer does (the values here are finite)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def _block(name: str) -> str:
    return f"blk.{BLOCK}.{name}"


# ----------------------------------------------------------------------------------- convert (no llama.cpp)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen4exp_checkpoint(tmp_path_factory.mktemp("qwen4exp-small") / "hf", SMALL)


@pytest.fixture(scope="module")
def draft(small: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(small, tmp_path_factory.mktemp("qwen4exp-draft") / "d.gguf", progress=False).output


def test_eh_proj_is_fc_embedding_beside_fc_hidden(small: Path, draft: Path) -> None:
    embedding = np.frombuffer(raw_tensor(small, "mtp.fc_embedding.weight")[2], np.uint16).reshape(H, H)
    hidden = np.frombuffer(raw_tensor(small, "mtp.fc_hidden.weight")[2], np.uint16).reshape(H, H)
    qtype, shape, data = reader_tensors(draft)[_block("nextn.eh_proj.weight")]
    assert (qtype, shape) == (Q.BF16, (2 * H, H))
    assert data == np.concatenate([embedding, hidden], axis=1).tobytes()


def test_the_heads_mixer_becomes_hc_head_norm_down_and_up(small: Path, draft: Path) -> None:
    tensors = reader_tensors(draft)
    qtype, shape, norm = tensors[_block("nextn.hc_head_norm.weight")]
    assert (qtype, shape) == (Q.F32, (HC * H,))  # flat, as stored; llama.cpp loads it as {n_embd, hc}
    stored = raw_tensor(small, "mtp.hyper_connection_mixer.hc_norm.weight")[2]
    assert norm == (_bf16_to_f32(stored) + np.float32(1)).tobytes()
    for part, name, ggml_shape in (("down", "input_mix_weight_down", (HC * H, HC_LOWRANK)),
                                   ("up", "input_mix_weight_up", (HC_LOWRANK, HC * H))):
        qtype, shape, data = tensors[_block(f"nextn.hc_head_{part}.weight")]
        assert (qtype, shape) == (Q.BF16, ggml_shape)
        assert data == raw_tensor(small, f"mtp.hyper_connection_mixer.{name}.weight")[2]


def test_hnorm_gets_plus_one_in_f32(small: Path, draft: Path) -> None:
    qtype, shape, data = reader_tensors(draft)[_block("nextn.hnorm.weight")]
    assert (qtype, shape) == (Q.F32, (HC * H,))
    assert data == (_bf16_to_f32(raw_tensor(small, "mtp.pre_fc_norm_hidden.weight")[2]) + np.float32(1)).tobytes()


def test_hnorm_stored_per_stream_keeps_the_checkpoint_type_after_plus_one(small: Path, tmp_path: Path) -> None:
    """A ``[hc, n_embd]`` gamma is 2-D and not named ``*_norm``: upstream's type rule writes it as a matrix (BF16), of
    ``float32(x) + 1``."""
    per_stream = Path(shutil.copytree(small, tmp_path / "hf"))
    rewrite_checkpoint_tensor(per_stream, "mtp.pre_fc_norm_hidden.weight", shape=[HC, H])
    qtype, shape, data = reader_tensors(convert(per_stream, tmp_path / "d.gguf", progress=False).output)[
        _block("nextn.hnorm.weight")]
    assert (qtype, shape) == (Q.BF16, (H, HC))
    stored = raw_tensor(small, "mtp.pre_fc_norm_hidden.weight")[2]
    assert data == _f32_to_bf16(_bf16_to_f32(stored) + np.float32(1))


def test_the_indexers_qk_projection_is_split_into_q_and_k_rows(small: Path, draft: Path) -> None:
    rows = raw_tensor(small, "mtp.layers.0.self_attn.indexer.index_qk_proj.weight")[2]
    n_q_bytes = INDEXER_HEADS * INDEXER_DIM * H * 2
    tensors = reader_tensors(draft)
    assert tensors[_block("indexer.q_proj.weight")][1:] == ((H, INDEXER_HEADS * INDEXER_DIM), rows[:n_q_bytes])
    assert tensors[_block("indexer.k_proj.weight")][1:] == ((H, INDEXER_DIM), rows[n_q_bytes:])


def test_the_draft_states_the_block_neither_recurrent_nor_without_its_compress_ratio(draft: Path) -> None:
    header = read_header(draft)
    assert header.get("qwen4exp.attention.recurrent_layers") == [True, True, True, False, False]
    assert header.get("qwen4exp.attention.compress_ratios") == [0, 0, 0, COMPRESS_RATIO, COMPRESS_RATIO]
    assert (header.get("qwen4exp.hyper_connection.count"), header.get("qwen4exp.hyper_connection.low_rank")) == \
        (HC, HC_LOWRANK)
    assert not [k for k in reader_kvs(draft) if k.startswith("qwen4exp.ple.")]


def test_the_conditional_generation_layout_gives_the_same_draft(draft: Path, tmp_path: Path) -> None:
    """``Qwen4ExpForConditionalGeneration``: hyperparameters in ``text_config``, the trunk under
    ``model.language_model.``, the head still top-level ``mtp.*``: the same bytes as the CausalLM layout's."""
    nested = write_qwen4exp_checkpoint(tmp_path / "qwen4exp-small" / "hf", SMALL, conditional=True)
    ours = convert(nested, tmp_path / "d.gguf", progress=False).output
    assert reader_tensors(ours) == reader_tensors(draft)
    assert reader_kvs(ours) == reader_kvs(draft)


def _without(checkpoint: Path, tensor: str, into: Path) -> Path:
    """A copy of ``checkpoint`` without ``tensor``."""
    copy = Path(shutil.copytree(checkpoint, into))
    rewrite_checkpoint_tensor(copy, tensor, drop=True)
    return copy


@pytest.mark.parametrize(("missing", "present"), [("mtp.fc_hidden.weight", "mtp.fc_embedding.weight"),
                                                  ("mtp.fc_embedding.weight", "mtp.fc_hidden.weight")])
def test_a_head_with_half_an_eh_proj_is_refused_naming_both(missing: str, present: str, small: Path,
                                                            tmp_path: Path) -> None:
    damaged = _without(small, missing, tmp_path / "hf")
    with pytest.raises(CheckpointError, match=f"has {present} but not {missing}"):
        convert(damaged, tmp_path / "d.gguf", progress=False)
    assert not (tmp_path / "d.gguf").exists()


def test_cli_refusal_of_half_an_eh_proj_is_one_line_naming_the_file(small: Path, tmp_path: Path) -> None:
    damaged = _without(small, "mtp.fc_hidden.weight", tmp_path / "hf")
    done = subprocess.run([sys.executable, "-m", "gguf_mtp", "convert", str(damaged), "-o", str(tmp_path / "d.gguf")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "safetensors" in lines[0] and "but not mtp.fc_hidden.weight" in lines[0], done.stderr
    assert not (tmp_path / "d.gguf").exists()


# ------------------------------------------------------------ on b11434's conversions (upstream, shared parity set)


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_the_sidecars_metadata_is_b11434s_mtp_export_key_for_key(parity: ParitySet) -> None:
    """Every KV, in its encoding: the trunk's per-layer-embedding keys stay behind, as b11434 writes none."""
    assert raw_kvs(parity.standalone) == raw_kvs(parity.mtp)


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_b11434s_own_sidecar_is_a_loadable_drafter_without_output_norm(parity: ParitySet) -> None:
    header = read_header(parity.mtp)
    check = draft_globals_check(header, [header])
    assert "output_norm.weight" not in {t.name for t in header.tensors}
    assert check.sidecar and check.problems == (), check
    shown = subprocess.run([sys.executable, "-m", "gguf_mtp", "inspect", str(parity.mtp), "--json"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["standalone"] is True  # inspect: "run it beside its target"


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_a_head_of_another_indexer_budget_is_refused_against_the_trunk(parity: ParitySet, tmp_path: Path) -> None:
    other = Path(shutil.copytree(parity.checkpoint, tmp_path / "hf"))
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "indexer_budget": 2 * config["indexer_budget"]}))
    with pytest.raises(IncompatibleDraftError, match="attention.indexer.top_k = 128 .*indexer_budget.*, the target 64"):
        convert(other, tmp_path / "d.gguf", target=parity.trunk, progress=False)
    assert not (tmp_path / "d.gguf").exists()


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_compose_leaves_the_ple_arrays_one_entry_per_hash_head(parity: ParitySet) -> None:
    """The trunk's ``ple.head_offsets`` is exactly ``block_count`` long (as many hash heads as blocks): not a
    per-layer array for all that, so the composite keeps it as b11434's full conversion writes it."""
    trunk, composite = read_header(parity.trunk), read_header(parity.composite)
    assert trunk.get("qwen4exp.block_count") == PLE_HEADS
    for key in PLE_ARRAYS:
        assert len(trunk.get(key)) == PLE_HEADS
        assert composite.kvs[key].raw == read_header(parity.full).kvs[key].raw == trunk.kvs[key].raw


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_extract_then_compose_gives_the_composite_back(parity: ParitySet, tmp_path: Path) -> None:
    extracted = extract(parity.composite, tmp_path / "x.gguf", progress=False).output
    again = compose(parity.trunk, extracted, tmp_path / "again", progress=False).output_paths[0]
    assert raw_tensors(again) == raw_tensors(parity.composite)
    assert raw_kvs(again) == raw_kvs(parity.composite)


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_extract_standalone_is_b11434s_mtp_export(parity: ParitySet, tmp_path: Path) -> None:
    """A qwen4exp sidecar carries token_embd and output, no output_norm (the model has none) and no PLE key."""
    sidecar = extract(parity.composite, tmp_path / "mtp.gguf", standalone=True, progress=False).output
    assert raw_tensors(sidecar) == raw_tensors(parity.mtp)
    assert raw_kvs(sidecar) == raw_kvs(parity.mtp)


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_strip_of_the_composite_is_the_trunk(parity: ParitySet, tmp_path: Path) -> None:
    stripped = strip(parity.composite, tmp_path / "stripped", progress=False).output_paths[0]
    assert raw_tensors(stripped) == raw_tensors(parity.trunk)
    assert raw_kvs(stripped) == raw_kvs(parity.trunk)


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_graft_of_b11434s_full_file_onto_its_trunk_is_the_full_file(parity: ParitySet, tmp_path: Path) -> None:
    grafted = graft(parity.full, parity.trunk, tmp_path / "grafted", progress=False).output_paths[0]
    assert raw_tensors(grafted) == raw_tensors(parity.full)
    ours, theirs = raw_kvs(grafted), raw_kvs(parity.full)
    assert {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)} == {"general.size_label"}


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_replace_head_swaps_b11434s_head_for_the_draft(parity: ParitySet, tmp_path: Path) -> None:
    replaced = compose(parity.full, parity.draft, tmp_path / "replaced", replace_head=True,
                       progress=False).output_paths[0]
    assert raw_tensors(replaced) == raw_tensors(parity.composite)


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_outtype_q8_0_at_compose_is_extract_outtype_q8_0_of_the_composite(parity: ParitySet, tmp_path: Path) -> None:
    """Two ways to a Q8_0 head, one answer; llama-quantize's rule keeps the indexer's projections BF16."""
    composite = compose(parity.trunk, parity.draft, tmp_path / "q8", outtype="q8_0", progress=False).output_paths[0]
    head = extract(parity.composite, tmp_path / "q8.gguf", outtype="q8_0", progress=False).output
    ours, theirs = raw_tensors(composite), raw_tensors(head)
    assert {n: ours[n] for n in theirs} == theirs
    assert ours[_block("attn_q.weight")][0] == Q.Q8_0
    assert ours[_block("indexer.q_proj.weight")][0] == ours[_block("indexer.k_proj.weight")][0] == Q.BF16


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_outtype_heads_are_llama_quantize_pures_of_the_bf16_composite(parity: ParitySet, llama_quantize_tool: Path,
                                                                      tmp_path: Path) -> None:
    """The head ``compose --outtype`` writes is what llama-quantize --pure makes of the BF16 composite's, for a type
    of llama.cpp's converter (q8_0) and one of llama-quantize's alone (q4_k). The one difference: llama-quantize
    drops the trailing 1 of the shared expert's ``[n_embd, 1]`` gate (llama.cpp reads both)."""
    gate = _block("ffn_gate_inp_shexp.weight")
    for outtype in ("q8_0", "q4_k"):
        ours = raw_tensors(compose(parity.trunk, parity.draft, tmp_path / outtype, outtype=outtype,
                                   progress=False).output_paths[0])
        quantized = tmp_path / f"llama-quantize-{outtype}.gguf"
        done = subprocess.run([str(llama_quantize_tool), "--pure", str(parity.composite), str(quantized), outtype],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        theirs = raw_tensors(quantized)
        block = [n for n in theirs if n.startswith(f"blk.{BLOCK}.") and n != gate]
        assert len(block) == 31
        assert {n: ours[n] for n in block} == {n: theirs[n] for n in block}, outtype
        assert (ours[gate][0], ours[gate][1], ours[gate][2]) == (theirs[gate][0], (H, 1), theirs[gate][2])
        assert theirs[gate][1] == (H,)


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_embd_type_q8_0_sidecar_is_the_same_from_convert_and_extract(parity: ParitySet, tmp_path: Path) -> None:
    converted = convert(parity.checkpoint, tmp_path / "c.gguf", target=parity.trunk, standalone=True,
                        embd_type="q8_0", progress=False).output
    extracted = extract(parity.composite, tmp_path / "x.gguf", standalone=True, embd_type="q8_0",
                        progress=False).output
    tensors = raw_tensors(extracted)
    assert tensors == raw_tensors(converted)
    assert raw_kvs(extracted) == raw_kvs(converted)
    assert (tensors["token_embd.weight"][0], tensors["output.weight"][0]) == (Q.Q8_0, Q.Q8_0)


# --------------------------------------------------- verify and accept through b11434's libllama (its MTP graph)


def _cli_with(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gguf-mtp ARGS --llama-cpp BUILD``: the command run through that llama.cpp build (the user's setting)."""
    return subprocess.run([sys.executable, "-m", "gguf_mtp", *args, "--llama-cpp", str(build)], capture_output=True,
                          text=True)


@pytest.mark.llama
@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_verify_runs_the_composite_through_b11434s_mtp_graph(parity: ParitySet, llama_b11434: Path) -> None:
    done = _cli_with(llama_b11434, "verify", str(parity.composite), "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.llama
@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_accept_predicts_through_b11434s_mtp_graph(parity: ParitySet, llama_b11434: Path) -> None:
    """Its masked MTP graph has as many nodes as the unmasked one the context was planned with: accept re-plans it
    (else b11434 dies in ggml_gallocr_alloc_graph); the counts themselves are llama-server's
    (tests/test_accept_server.py)."""
    done = _cli_with(llama_b11434, "accept", str(parity.composite), "--tokens", "16", "--n-max", "1,2", "--threads",
                     "1", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["llama_cpp_library"] == str(llama_b11434 / "bin" / "libllama.so")
    assert report["llama_cpp_build"] == "llama.cpp b11434 (ggml 0.26.0)"
    assert [run["n_max"] for run in report["runs"]] == [1, 2]
    assert all(run["draft_n"] > 0 for run in report["runs"])
