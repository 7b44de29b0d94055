"""``gguf-mtp accept --spec-draft-sampling probabilistic`` (issue 38 item 5): llama-server b11434's acceptance when it
samples the draft and verifies it by rejection, predicted as an expectation with an interval
(:mod:`gguf_mtp.check.accept_sampling`).

The proof is the last part: b11434's own llama-server, run with ``--spec-draft-sampling probabilistic`` on the
designed cycle model, measures an acceptance inside the interval predicted for its head, and outside the interval
predicted for a head that is wrong everywhere on the same trunk (so the comparison can fail).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf_mtp.check.accept_sampling import (
    Distribution,
    SampledText,
    Sampling,
    check_probabilistic_support,
    draft_distribution,
    keep_probability,
    simulate,
    target_distribution,
)
from gguf_mtp.check.accept_schedule import Limits
from gguf_mtp.errors import ParameterError
from gguf_mtp.llama_build import LlamaCppBuild
from gguf_mtp.model.drafting import RequestSampling
from gguf_mtp.server.bench_rules import (
    BenchReport,
    BenchRun,
    Completion,
    completion_request,
    server_arguments,
)
from gguf_mtp.server.options import ServerOptions

REPO = Path(__file__).resolve().parent.parent


def _dist(pairs: dict[int, float]) -> Distribution:
    return Distribution(np.array(list(pairs)), np.array(list(pairs.values())))


# ------------------------------------------------------------------------- the samplers, as llama.cpp's


def test_the_target_is_cut_by_top_k_top_p_and_min_p_on_the_raw_logits_then_tempered() -> None:
    logits = np.array([0.0, 5.0, 4.0, 1.0, 4.5, -3.0])
    # top-k 4 keeps 1, 4, 2, 3; top-p 0.95 of their softmax keeps 1, 4, 2 (0.50 + 0.30 + 0.18 >= 0.95);
    # min-p 0.3 keeps logits >= 5 + ln 0.3 = 3.80: all three; then temperature 2
    got = target_distribution(logits, Sampling(2.0, top_k=4, top_p=0.95, min_p=0.3))
    assert got.ids.tolist() == [1, 4, 2]
    want = np.exp(np.array([5.0, 4.5, 4.0]) / 2)
    assert np.allclose(got.probs, want / want.sum())


def test_min_p_drops_what_is_below_its_share_of_the_best_before_the_temperature() -> None:
    logits = np.array([10.0, 7.5, 6.0])  # min-p 0.05: ln 0.05 = -3.0, so 6.0 goes, 7.5 stays
    got = target_distribution(logits, Sampling(100.0, top_k=0, top_p=1.0, min_p=0.05))
    assert got.ids.tolist() == [0, 1]
    want = np.exp(np.array([10.0, 7.5]) / 100)
    assert np.allclose(got.probs, want / want.sum())


def test_the_draft_is_the_heads_top_10_at_the_requests_temperature() -> None:
    logits = np.arange(20, dtype=np.float32)
    got = draft_distribution(logits, 4.0)
    assert got.ids.tolist() == list(range(19, 9, -1))
    want = np.exp(np.arange(19, 9, -1) / 4.0)
    assert np.allclose(got.probs, want / want.sum())


def test_a_keep_given_the_text_token_is_min_p_q_over_p() -> None:
    p, q = _dist({1: 0.5, 2: 0.3, 3: 0.2}), _dist({1: 0.2, 2: 0.6, 4: 0.2})
    assert [keep_probability(p, q, y) for y in (1, 2, 3)] == [pytest.approx(0.4), 1.0, 0.0]


def test_averaged_over_the_text_a_keep_is_the_overlap_of_p_and_q() -> None:
    p, q = _dist({1: 0.5, 2: 0.3, 3: 0.2}), _dist({1: 0.2, 2: 0.6, 4: 0.2})
    overlap = 0.2 + 0.3  # sum of min(p, q): the rejection sampler's acceptance rate
    assert sum(p.of(y) * keep_probability(p, q, y) for y in (1, 2, 3)) == pytest.approx(overlap)


# ------------------------------------------------------------------------- the simulated server runs


def _text(n: int, keep: float, depth: int) -> SampledText:
    return SampledText(tuple(range(n)), tuple((keep,) * min(depth, n - j - 2) for j in range(n)), None)


def test_a_head_always_kept_is_predicted_at_one_with_no_spread() -> None:
    run = simulate([[_text(32, 1.0, 2)]], [Limits(8, 32, 1024)], 2, 2, Sampling(1.0, draws=1, replicates=50))
    assert (run.acceptance_mean, run.acceptance_sd, run.interval) == (1.0, 0.0, (1.0, 1.0))
    assert run.draft_n_accepted == run.draft_n


def test_a_head_never_kept_is_predicted_at_zero() -> None:
    run = simulate([[_text(32, 0.0, 1)]], [Limits(8, 32, 1024)], 1, 1, Sampling(1.0, draws=1, replicates=50))
    assert run.acceptance_mean == 0.0 and run.draft_n == 30  # every step drafts one token, none is kept
    assert not run.holds(0.1)


def test_the_mean_is_the_keep_chance_at_n_max_1_and_the_interval_holds_it() -> None:
    run = simulate([[_text(64, 0.5, 1)]] * 3, [Limits(8, 64, 1024)] * 3, 1, 1,
                   Sampling(1.0, draws=1, replicates=500))
    assert run.acceptance_mean == pytest.approx(0.5, abs=0.02)
    assert run.interval is not None and run.interval[0] < 0.5 < run.interval[1]


def test_the_spread_assumes_the_prompts_of_one_run_move_together() -> None:
    # three alike prompts moving together spread as one prompt does, not sqrt(3) less
    one = simulate([[_text(64, 0.5, 1)]], [Limits(8, 64, 1024)], 1, 1, Sampling(1.0, draws=1, replicates=500))
    three = simulate([[_text(64, 0.5, 1)]] * 3, [Limits(8, 64, 1024)] * 3, 1, 1,
                     Sampling(1.0, draws=1, replicates=500))
    assert three.acceptance_sd == pytest.approx(one.acceptance_sd, rel=0.15)


# ------------------------------------------------------------------------- which llama.cpp has the mode


def _fake_build(tmp_path: Path, help_text: str) -> LlamaCppBuild:
    server = tmp_path / "llama-server"
    server.write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}\nEOF\n")
    server.chmod(0o755)
    return LlamaCppBuild(tmp_path, tmp_path, server, None, None)


HELP = "--model FNAME --host H --port P\n--spec-type [none|draft-mtp]\n"


def test_the_embedded_llama_cpp_is_refused_naming_it() -> None:
    with pytest.raises(ParameterError, match=r"0c1e570\) has no probabilistic drafting"):
        check_probabilistic_support(None)


def test_a_build_whose_server_lacks_the_flag_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="has no '--spec-draft-sampling probabilistic'"):
        check_probabilistic_support(_fake_build(tmp_path, HELP))


def test_a_build_whose_server_has_the_flag_is_taken(tmp_path: Path) -> None:
    check_probabilistic_support(_fake_build(tmp_path, HELP + "--spec-draft-sampling {greedy,probabilistic}\n"))


def test_a_build_without_a_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="no llama-server"):
        check_probabilistic_support(LlamaCppBuild(tmp_path, tmp_path, None, None, None))


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "GGUF_MTP_LLAMA_CPP"} | {"PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "gguf_mtp", "accept", *args], capture_output=True, text=True,
                          env=environ, timeout=120)


@pytest.mark.slow  # a gguf-mtp child process each: about 1 s
@pytest.mark.parametrize(("args", "says"), [
    (["--spec-draft-sampling", "probabilistic"], "needs the requests' --temp"),
    (["--spec-draft-sampling", "probabilistic", "--temp", "0"], "temperature above 0"),
    (["--temp", "0.8"], "give --spec-draft-sampling probabilistic"),
    (["--spec-draft-sampling", "probabilistic", "--temp", "0.8"], "(0c1e570) has no probabilistic drafting"),
])
def test_the_command_refuses_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    done = _cli(str(tmp_path / "model.gguf"), *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


# ------------------------------------------------------------------------- bench's sampled requests


def test_sampled_requests_carry_the_temperature_seed_and_cut_offs() -> None:
    body = completion_request("hi", 16, RequestSampling(0.7, seed=5, top_k=20, top_p=0.9, min_p=0.1))
    assert {k: body[k] for k in ("temperature", "seed", "top_k", "top_p", "min_p")} == {
        "temperature": 0.7, "seed": 5, "top_k": 20, "top_p": 0.9, "min_p": 0.1}
    assert (body["n_predict"], body["cache_prompt"], body["return_tokens"]) == (16, False, True)


def test_only_the_mtp_runs_draft_probabilistically() -> None:
    assert "--spec-draft-sampling" not in server_arguments("m.gguf", 1, 0, None, [], probabilistic=True)
    args = server_arguments("m.gguf", 1, 2, None, [], probabilistic=True)
    assert args[args.index("--spec-draft-sampling") + 1] == "probabilistic"


def test_the_servers_help_says_whether_it_drafts_probabilistically() -> None:
    recorded = (REPO / "tests" / "support" / "llama_server_help.txt").read_text()  # 0c1e570's llama-server
    assert not ServerOptions.from_help(recorded).probabilistic
    b11434 = recorded + ("--spec-draft-sampling {greedy,probabilistic}\n"
                         "                                        how the draft is sampled\n")
    assert ServerOptions.from_help(b11434).probabilistic


def test_a_sampled_bench_does_not_claim_lossless() -> None:
    base = BenchRun(0, (Completion(64, 500.0, 0, 0, "a", (1, 2)),))
    mtp = BenchRun(1, (Completion(64, 400.0, 40, 30, "b", (1, 3)),))
    report = BenchReport("m.gguf", None, "llama-server", 1, 64, (base, mtp), (), 1.0, sampling=RequestSampling(0.8))
    assert report.to_dict()["lossless"] is None
    assert report.to_dict()["sampling"] == {"temperature": 0.8, "seed": 42, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    assert any("losslessness is not checked" in line for line in report.describe())
    assert not any(line.startswith("lossless:") for line in report.describe())


@pytest.mark.slow  # a gguf-mtp child process and a tiny model: about 3 s
def test_bench_refuses_probabilistic_drafting_with_a_server_without_it(tmp_path: Path) -> None:
    from gguf_mtp.testing.cycle_model import write_cycle_model

    model = write_cycle_model(tmp_path / "m").path
    server = _fake_build(tmp_path, HELP).server
    done = subprocess.run([sys.executable, "-m", "gguf_mtp", "bench", str(model), "--server", str(server),
                           "--spec-draft-sampling", "probabilistic", "--temp", "0.8"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{server}: its --help has no '--spec-draft-sampling probabilistic'" in done.stderr


# ------------------------------------------------------------------------- against b11434's llama-server

#: One thread, one slot, a 1024-token context: the server tests' settings (a busy 2-core machine).
SERVER_FLAGS = ["-t", "1", "-c", "1024", "-np", "1", "--spec-draft-sampling", "probabilistic"]
TOKENS = 64
#: The server's seed for every request (one run: each prompt sent once).
SERVER_SEED = 1234
#: The server's default chain on the designed model (min-p leaves the trunk one token: only the head's q matters),
#: and the whole vocabulary at a temperature where the trunk's p is soft too (the text itself is random).
SETTINGS = {
    "default chain, temperature 8": Sampling(8.0, draws=4, replicates=200),
    "whole vocabulary, temperature 2": Sampling(2.0, top_k=0, top_p=1.0, min_p=0.0, draws=4, replicates=200),
}
N_MAX = (1, 3)


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The designed composite, and the same trunk with a head that is one step behind after every token."""
    from gguf_mtp.testing.cycle_model import write_cycle_model

    root = tmp_path_factory.mktemp("accept-sampling")
    return {"designed": write_cycle_model(root / "designed").path,
            "wrong everywhere": write_cycle_model(root / "wrong", good_share=0.0).path}


@pytest.fixture(scope="module")
def measured(llama_b11434: Path, heads: dict[str, Path]) -> dict[tuple[str, int], float]:
    """b11434's llama-server on the designed composite: draft_n_accepted / draft_n over the prompts, per setting
    and n-max."""
    from gguf_mtp.model.prompts import builtin_prompts
    from gguf_mtp.server.bench_rules import completion_request, parse_completion, server_arguments
    from gguf_mtp.server.process import free_port, running_server

    out = {}
    for n_max in N_MAX:
        port = free_port()
        args = server_arguments(str(heads["designed"]), port, n_max, None, SERVER_FLAGS)
        with running_server(str(llama_b11434 / "bin" / "llama-server"), args, port=port,
                            health_timeout=300) as server:
            for name, s in SETTINGS.items():
                sampled = {"temperature": s.temp, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
                           "seed": SERVER_SEED}
                answers = [parse_completion(server.post_json("/completion",
                                                             completion_request(p.text, TOKENS) | sampled,
                                                             timeout=600))
                           for p in builtin_prompts()]
                out[name, n_max] = sum(a.draft_n_accepted or 0 for a in answers) / sum(a.draft_n or 0
                                                                                        for a in answers)
    return out


@pytest.fixture(scope="module")
def predicted(llama_b11434: Path, heads: dict[str, Path]) -> dict[tuple[str, str], object]:
    """accept's prediction through b11434's libllama, per head and setting."""
    from gguf_mtp.check.accept import accept_sampled
    from gguf_mtp.model.prompts import builtin_prompts

    os.environ["GGUF_MTP_LLAMA_CPP"] = str(llama_b11434)
    try:
        return {(head, name): accept_sampled(path, s, prompts=builtin_prompts(), tokens=TOKENS, n_max=N_MAX,
                                             ctx_size=1024, threads=1)
                for head, path in heads.items() for name, s in SETTINGS.items()}
    finally:
        del os.environ["GGUF_MTP_LLAMA_CPP"]


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.parametrize("n_max", N_MAX)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_llama_servers_measured_acceptance_falls_in_the_predicted_interval(
    measured: dict[tuple[str, int], float], predicted: dict[tuple[str, str], object], setting: str, n_max: int
) -> None:
    run = next(r for r in predicted["designed", setting].runs if r.n_max == n_max)  # type: ignore[attr-defined]
    assert run.holds(measured[setting, n_max]), (measured[setting, n_max], run.to_dict())
    assert run.interval[1] - run.interval[0] < 0.5  # an interval that says something


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.parametrize("n_max", N_MAX)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_the_measurement_is_outside_the_interval_of_a_head_wrong_everywhere(
    measured: dict[tuple[str, int], float], predicted: dict[tuple[str, str], object], setting: str, n_max: int
) -> None:
    run = next(r for r in predicted["wrong everywhere", setting].runs if r.n_max == n_max)  # type: ignore[attr-defined]
    assert not run.holds(measured[setting, n_max]), (measured[setting, n_max], run.to_dict())


@pytest.mark.llama
@pytest.mark.slow
def test_bench_with_accept_puts_the_measured_acceptance_inside_the_predicted_interval(
    llama_b11434: Path, heads: dict[str, Path]
) -> None:
    args = [sys.executable, "-m", "gguf_mtp", "bench", str(heads["designed"]), "--llama-cpp", str(llama_b11434),
            "--n-max", "1", "--tokens", str(TOKENS), "--with-accept", "--spec-draft-sampling", "probabilistic",
            "--temp", "8", "--seed", str(SERVER_SEED), "--json", "--", "-t", "1", "-c", "1024", "-np", "1"]
    done = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    measured = next(r for r in data["runs"] if r["n_max"] == 1)
    low, high = data["accept"]["runs"][0]["interval"]
    assert data["sampling"]["temperature"] == 8 and data["lossless"] is None
    assert low <= measured["draft_n_accepted"] / measured["draft_n"] <= high
