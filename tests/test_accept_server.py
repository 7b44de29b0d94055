"""The proof of ``gguf-mtp accept``: its predicted ``draft_n`` / ``draft_n_accepted`` equal what llama.cpp's own
llama-server returns for the same greedy requests (asked through ``bench``), at n-max 1 and 2, prompt by prompt, for
the designed composite (:mod:`gguf_mtp.testing.cycle_model`, a head right on about 70 % of tokens) and for its
trunk + MTP-only sidecar (n-max 3 too), both sides on the same llama.cpp (the server's build, b11434: issue 38 item
2); accept on llama-cpp-python's own library (0c1e570) predicts the b11434 server's counts too. The greedy text is
the same too. And where the slot's context ends the generation early (fewer drafts near its end, then a stop), the
counts are still the server's. ``bench --with-accept`` shows the prediction beside the measurement. Through llama.cpp
b11434 (``--llama-cpp``) the same holds for qwen4exp, whose MTP graph takes hyper-connection rows (``hc x n_embd``
wide): its parity composite with a head designed as the cycle model's, against b11434's own llama-server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from support.upstream import ParitySet

from gguf_mtp import extract, strip
from gguf_mtp.check.accept import AcceptReport, accept
from gguf_mtp.constants import ENV_LLAMA_CPP
from gguf_mtp.llama_build import resolve
from gguf_mtp.model.prompts import builtin_prompts
from gguf_mtp.server.bench import bench
from gguf_mtp.server.bench_rules import BenchReport, completion_request, parse_completion, server_arguments
from gguf_mtp.server.process import free_port, running_server
from gguf_mtp.testing.cycle_model import EMBEDDING_SCALE, write_cycle_model

pytestmark = pytest.mark.llama

REPO = Path(__file__).resolve().parent.parent

#: One thread, one slot, a 1024-token context: the server tests' settings (a busy 2-core machine).
SERVER_FLAGS = ["-t", "1", "-c", "1024", "-np", "1"]
TOKENS = 64


@pytest.fixture(autouse=True)
def accept_runs_the_servers_llama_cpp(llama_server_tool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Predicted and measured counts come from one llama.cpp: accept (and bench --with-accept, which inherits this
    environment) runs the libllama built beside the server (b11434's, scripts/build_llama_tools.py), named by the
    user's setting (``$GGUF_MTP_LLAMA_CPP``, as ``--llama-cpp``). A server given without one beside it is compared
    with llama-cpp-python's own library."""
    if (llama_server_tool.parent / "libllama.so").is_file():
        monkeypatch.setenv(ENV_LLAMA_CPP, str(llama_server_tool.parent))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path | None]]:
    root = tmp_path_factory.mktemp("accept-server")
    composite = write_cycle_model(root).path
    trunk = Path(strip(composite, root / "trunk", progress=False).output_paths[0])
    sidecar = root / "sidecar.gguf"
    extract(composite, sidecar, standalone=True, progress=False)
    return {"composite": (composite, None), "trunk + sidecar": (trunk, sidecar)}


def assert_same_counts(predicted: AcceptReport, measured: BenchReport, which: str) -> None:
    """The server's text and its ``draft_n`` / ``draft_n_accepted`` / ``predicted_n`` are the prediction's, for every
    prompt and n-max measured (its first run is the one without MTP)."""
    assert measured.lossless
    for i, run in enumerate(measured.runs[1:]):
        for score, completion in zip(predicted.prompts, run.completions, strict=True):
            assert completion.tokens == score.greedy, score.name
            got = (completion.draft_n, completion.draft_n_accepted, completion.predicted_n)
            want = (score.runs[i].draft_n, score.runs[i].draft_n_accepted, score.runs[i].generated)
            assert got == want, f"{which}, n-max {run.n_max}, {score.name}"


@pytest.mark.parametrize("which", ["composite", "trunk + sidecar"])
def test_predicted_counts_equal_llama_server(
    llama_server_tool: Path, models: dict[str, tuple[Path, Path | None]], which: str
) -> None:
    model, draft = models[which]
    prompts = builtin_prompts()
    predicted = accept(model, draft=draft, prompts=prompts, tokens=TOKENS, n_max=(1, 2, 3), ctx_size=1024,
                       threads=1)
    measured = bench(model, str(llama_server_tool), draft=draft, n_max=(1, 2, 3), tokens=TOKENS, prompts=prompts,
                     server_args=SERVER_FLAGS)
    assert_same_counts(predicted, measured, which)
    first = predicted.runs[0]
    assert first.acceptance is not None and 0.45 < first.acceptance < 0.95  # not a vacuous agreement
    assert 0 < predicted.runs[1].accepted_per_pos[1] < predicted.runs[1].drafted_per_pos[1]


@pytest.mark.parametrize("which", ["composite", "trunk + sidecar"])
def test_accept_on_llama_cpp_pythons_own_0c1e570_predicts_the_b11434_servers_counts(
    llama_server_tool: Path, models: dict[str, tuple[Path, Path | None]], which: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # across the two builds: the NextN graph and the server's greedy draft loop did not change between them
    monkeypatch.delenv(ENV_LLAMA_CPP, raising=False)
    model, draft = models[which]
    prompts = builtin_prompts()
    predicted = accept(model, draft=draft, prompts=prompts, tokens=TOKENS, n_max=(2,), ctx_size=1024, threads=1)
    measured = bench(model, str(llama_server_tool), draft=draft, n_max=(2,), tokens=TOKENS, prompts=prompts,
                     server_args=SERVER_FLAGS)
    for score, completion in zip(predicted.prompts, measured.runs[1].completions, strict=True):
        run = score.runs[0]
        assert (completion.tokens, completion.draft_n, completion.draft_n_accepted) == (
            score.greedy, run.draft_n, run.draft_n_accepted), score.name


@pytest.mark.parametrize("n_max", [1, 3])
def test_a_full_context_stops_both_alike(
    llama_server_tool: Path, models: dict[str, tuple[Path, Path | None]], n_max: int
) -> None:
    # -c 500 is a 512-token slot (llama.cpp rounds up to 256): the ~240-300-token prompts leave it room for 200-270
    # of the 300 tokens asked; drafts shrink near its end, then generation stops.
    model, _ = models["composite"]
    prompts = builtin_prompts()
    predicted = accept(model, prompts=prompts, tokens=300, n_max=(n_max,), ctx_size=500, threads=1)
    port = free_port()
    args = server_arguments(str(model), port, n_max, None, ["-t", "1", "-c", "500", "-np", "1"])
    with running_server(str(llama_server_tool), args, port=port, health_timeout=300) as server:
        answers = [parse_completion(server.post_json("/completion", completion_request(p.text, 300), timeout=600))
                   for p in prompts]
    for score, answer in zip(predicted.prompts, answers, strict=True):
        run = score.runs[0]
        assert (answer.draft_n, answer.draft_n_accepted, answer.predicted_n) == (
            run.draft_n, run.draft_n_accepted, run.generated), score.name
        assert run.generated < 300  # the context, not n_predict, ended it


def test_bench_with_accept_shows_the_prediction_beside_the_measurement(
    llama_server_tool: Path, models: dict[str, tuple[Path, Path | None]]
) -> None:
    model, _ = models["composite"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "gguf_mtp", "bench", str(model), "--server", str(llama_server_tool), "--n-max",
            "1,2", "--tokens", "32", "--with-accept", "--quiet"]
    text = subprocess.run([*args, "--", *SERVER_FLAGS], capture_output=True, text=True, env=env, timeout=900)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    at = lines.index("measured by llama-server vs predicted by gguf-mtp accept (draft_n_accepted/draft_n):")
    assert all(line.endswith("(equal)") for line in lines[at + 1 : at + 3])
    data = json.loads(subprocess.run([*args, "--json", "--", *SERVER_FLAGS], capture_output=True, text=True,
                                     env=env, timeout=900).stdout)
    measured = [(r["draft_n"], r["draft_n_accepted"]) for r in data["runs"] if r["n_max"]]
    assert measured == [(r["draft_n"], r["draft_n_accepted"]) for r in data["accept"]["runs"]]


# ------------------------------------------------------------------- qwen4exp through llama.cpp b11434 (issue 38)


def _bf16(value: float) -> int:
    """The BF16 bits of ``value`` (exact for the small powers of two written here)."""
    return int(np.float32(value).view(np.uint32) >> 16)


def designed_qwen4exp(composite: Path, out: Path, *, good_share: float = 0.7, seed: int = 0) -> Path:
    """A copy of the qwen4exp ``composite`` designed as :mod:`gguf_mtp.testing.cycle_model`'s model, through its
    hyper-connection streams: every block's output projections (and the per-layer embedding's value) are zero, so
    each stream's residual stays the embedding of the token, ``EMBEDDING_SCALE e_c`` for token ``t`` of class
    ``c = t mod n_embd``; ``output`` sends class ``c`` to token ``cycle[c]`` (below ``n_embd``: the greedy text stays in
    one class per token); the head's ``eh_proj`` reads the trunk's row (its second half, per stream) and maps a good
    class to the next one in the cycle, a bad one to itself. Every other logit is exactly 0."""
    path = Path(shutil.copyfile(composite, out))
    reader = GGUFReader(path, "r+")
    tensors = {t.name: t.data.view(np.uint16) for t in reader.tensors}  # BF16 bits (zeros, whatever the type)
    designed = {t.name: t.tensor_type for t in reader.tensors
                if t.name in ("token_embd.weight", "output.weight") or t.name.endswith("nextn.eh_proj.weight")}
    assert set(designed.values()) == {GGMLQuantizationType.BF16}, designed
    embd, output = tensors["token_embd.weight"], tensors["output.weight"]
    n = embd.shape[1]
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    cycle = np.empty(n, dtype=np.int64)
    cycle[order] = np.roll(order, -1)
    good = rng.permutation(n)[: round(good_share * n)]
    embd[:] = 0
    embd[np.arange(len(embd)), np.arange(len(embd)) % n] = _bf16(EMBEDDING_SCALE)
    output[:] = 0
    output[cycle, np.arange(n)] = _bf16(1.0)
    (head,) = [data for name, data in tensors.items() if name.endswith("nextn.eh_proj.weight")]
    head[:] = 0
    targets = np.arange(n)
    targets[good] = cycle[good]
    head[targets, n + np.arange(n)] = _bf16(1.0)
    silenced = ("ssm_out.weight", "attn_output.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight",
                "ple_value.weight", "ple_conv1d.weight")
    for name, data in tensors.items():
        if name.endswith(silenced):
            data[:] = 0
    reader.data.flush()
    return path


@pytest.mark.upstream
@pytest.mark.parity("qwen4exp")
def test_predicted_counts_equal_llama_server_b11434_on_a_qwen4exp_composite(
    parity: ParitySet, llama_b11434: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = designed_qwen4exp(parity.composite, tmp_path / "qwen4exp-cycle.gguf")
    build = resolve(llama_b11434)
    assert build.server is not None
    monkeypatch.setenv(ENV_LLAMA_CPP, str(llama_b11434))  # accept's child runs b11434's libllama
    prompts = builtin_prompts()
    predicted = accept(model, prompts=prompts, tokens=TOKENS, n_max=(1, 2), ctx_size=1024, threads=1)
    assert predicted.llama_cpp_library == str(build.libllama)
    measured = bench(model, str(build.server), n_max=(1, 2), tokens=TOKENS, prompts=prompts,
                     server_args=SERVER_FLAGS)
    assert_same_counts(predicted, measured, "qwen4exp, b11434")
    first = predicted.runs[0]
    assert first.acceptance is not None and 0.45 < first.acceptance < 0.95  # not a vacuous agreement
    assert 0 < predicted.runs[1].accepted_per_pos[1] < predicted.runs[1].drafted_per_pos[1]
