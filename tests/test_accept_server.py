"""The proof of ``gguf-mtp accept``: its predicted ``draft_n`` / ``draft_n_accepted`` equal what llama.cpp's own
llama-server returns for the same greedy requests (asked through ``bench``), at n-max 1 and 2, prompt by prompt, for
the designed composite (:mod:`gguf_mtp.testing.cycle_model`, a head right on about 70 % of tokens) and for its
trunk + MTP-only sidecar (n-max 3 too), both sides on the same llama.cpp (the server's build, b11434: issue 38 item
2); accept on llama-cpp-python's own library (0c1e570) predicts the b11434 server's counts too. The greedy text is
the same too. And where the slot's context ends the generation early (fewer drafts near its end, then a stop), the
counts are still the server's. ``bench --with-accept`` shows the prediction beside the measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_mtp import extract, strip
from gguf_mtp.check.accept import accept
from gguf_mtp.constants import ENV_LLAMA_CPP
from gguf_mtp.server.bench import bench, builtin_prompts
from gguf_mtp.server.bench_rules import completion_request, parse_completion, server_arguments
from gguf_mtp.server.process import free_port, running_server
from gguf_mtp.testing.cycle_model import write_cycle_model

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
    assert measured.lossless
    for i, run in enumerate(measured.runs[1:]):
        for score, completion in zip(predicted.prompts, run.completions, strict=True):
            assert completion.tokens == score.greedy, score.name
            got = (completion.draft_n, completion.draft_n_accepted, completion.predicted_n)
            want = (score.runs[i].draft_n, score.runs[i].draft_n_accepted, score.runs[i].generated)
            assert got == want, f"{which}, n-max {run.n_max}, {score.name}"
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
