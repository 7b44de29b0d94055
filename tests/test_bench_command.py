"""``gguf-mtp bench`` without a real llama-server: its rules (requests, timings, acceptance, the table, the
recommendation, the lossless decision), its inputs, and its refusals and clean-up with fake servers.

The end-to-end runs against llama.cpp's own llama-server are in tests/test_bench_server.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from support.helpers import pid_alive

from gguf_mtp.errors import LlamaServerError, NoNextNBlockError, ParameterError
from gguf_mtp.llama_server import probe_server
from gguf_mtp.model.drafting import MAX_N_MAX, SEED, Threads, check_model
from gguf_mtp.model.prompts import builtin_prompts, load_prompts
from gguf_mtp.server.bench_rules import (
    FLOAT_OPTIONS,
    BenchReport,
    BenchRun,
    check_float_options,
    completion_request,
    first_difference,
    parse_bench_json,
    parse_completion,
    parse_n_max_list,
    recommend_n_max,
    server_arguments,
)
from gguf_mtp.server.options import ServerOptions, check_extra_arguments, choose_threads, option_name
from gguf_mtp.testing.server_models import with_test_tokenizer
from gguf_mtp.testing.tiny_models import GLM4MOE, write_target

REPO = Path(__file__).resolve().parent.parent


def gguf_mtp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "gguf_mtp", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def answer(predicted_n: int, predicted_ms: float, draft: tuple[int, int] | None, tokens: list[int]) -> dict:
    """A /completion answer in the shape llama-server's server_task_result_cmpl_final::to_json_non_oaicompat
    and server_slot_stats::to_json give it (draft_* only when something was drafted)."""
    timings = {
        "cache_n": 0, "prompt_n": 12, "prompt_ms": 3.5, "prompt_per_token_ms": 0.29, "prompt_per_second": 3428.5,
        "predicted_n": predicted_n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n, "predicted_per_second": predicted_n * 1000 / predicted_ms,
    }
    if draft is not None:
        timings["draft_n"], timings["draft_n_accepted"] = draft
    return {
        "index": 0, "content": "".join(f"{t:x}" for t in tokens), "tokens": tokens, "id_slot": 0, "stop": True,
        "tokens_predicted": predicted_n, "tokens_evaluated": 12, "stop_type": "limit", "timings": timings,
    }


def run_of(n_max: int, *answers: dict) -> BenchRun:
    return BenchRun(n_max, tuple(parse_completion(a) for a in answers))


# --- arguments and requests -------------------------------------------------------------------------------------


def test_n_max_list_sorted_distinct_and_bounded() -> None:
    assert parse_n_max_list("3,1,2,1") == (1, 2, 3)
    assert parse_n_max_list(" 2 ") == (2,)
    assert parse_n_max_list(str(MAX_N_MAX)) == (MAX_N_MAX,)
    for bad in ("", "0", "1,,2", "-1", "x", "1.5", str(MAX_N_MAX + 1)):
        with pytest.raises(ParameterError, match="n_max"):
            parse_n_max_list(bad)


def test_server_arguments_per_run() -> None:
    assert server_arguments("m.gguf", 8080, 0, None, ["-t", "2"]) == [
        "-m", "m.gguf", "--host", "127.0.0.1", "--port", "8080", "-t", "2"]
    assert server_arguments("m.gguf", 8080, 2, None, []) == [
        "-m", "m.gguf", "--host", "127.0.0.1", "--port", "8080", "--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    assert server_arguments("trunk.gguf", 1, 3, "mtp.gguf", ["-ngl", "99"])[-4:] == [
        "--spec-draft-model", "mtp.gguf", "-ngl", "99"]
    # the run without MTP never gets the sidecar
    assert "--spec-draft-model" not in server_arguments("trunk.gguf", 1, 0, "mtp.gguf", [])


def test_server_arguments_ask_for_metrics_in_mtp_runs() -> None:
    assert server_arguments("m.gguf", 1, 2, None, [], metrics=True)[-1] == "--metrics"
    assert "--metrics" not in server_arguments("m.gguf", 1, 0, None, [], metrics=True)


#: Entries of llama-server's --help (llama.cpp of llama-cpp-python 0.3.36), recorded from the binary the tests
#: build (tests/test_bench_server.py checks that each entry is still there, verbatim): the spellings from column 0,
#: the help indented by 40 columns, the environment variable last.
RECORDED_HELP = (REPO / "tests" / "support" / "llama_server_help.txt").read_text()

#: Every spelling of an option bench sets itself, in the help above (item 7 of issue 29).
OWNED_SPELLINGS = ["-m", "--model", "-mu", "--model-url", "-dr", "--docker-repo", "-hf", "-hfr", "--hf-repo",
                   "-hff", "--hf-file", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf", "--host", "--port",
                   "--api-prefix", "--spec-type", "--spec-draft-n-max", "--spec-draft-model", "-md", "--model-draft",
                   "--fim-qwen-7b-spec"]


def test_the_reserved_flags_come_from_the_servers_help() -> None:
    options = ServerOptions.from_help(RECORDED_HELP)
    assert options.reserved == frozenset(OWNED_SPELLINGS)
    assert options.reserved_env == {"LLAMA_ARG_MODEL", "LLAMA_ARG_MODEL_URL", "LLAMA_ARG_DOCKER_REPO",
                                    "LLAMA_ARG_HF_REPO", "LLAMA_ARG_HF_FILE", "LLAMA_ARG_SPEC_DRAFT_HF_REPO",
                                    "LLAMA_ARG_HOST", "LLAMA_ARG_PORT", "LLAMA_ARG_API_PREFIX",
                                    "LLAMA_ARG_SPEC_TYPE", "LLAMA_ARG_SPEC_DRAFT_N_MAX",
                                    "LLAMA_ARG_SPEC_DRAFT_MODEL"}
    assert options.trunk_threads == {"-t", "--threads"}
    assert options.draft_threads == {"--spec-draft-threads", "-td", "--threads-draft"}
    assert options.metrics
    environment = options.server_environment({"LLAMA_ARG_MODEL_URL": "http://x", "LLAMA_ARG_THREADS": "2", "A": "b"})
    assert environment == {"LLAMA_ARG_THREADS": "2", "A": "b"}
    bare = ServerOptions.from_help("-m, --model FNAME --host HOST --port PORT --spec-type none,draft-mtp")
    assert {"--hf-repo", "--model-url", "--spec-draft-model"} <= bare.reserved and not bare.metrics


@pytest.mark.parametrize("flag", [*OWNED_SPELLINGS, "--host=0.0.0.0", "-hfr=me/x"])
def test_extra_arguments_refuse_every_spelling_of_what_bench_sets(flag: str) -> None:
    with pytest.raises(ParameterError, match=rf"server_args: {flag.split('=')[0]} is set by bench itself"):
        check_extra_arguments(["-t", "2", flag, "x"], ServerOptions.from_help(RECORDED_HELP))


#: The underscore spellings of the long options bench sets (issue 37 item 1): llama.cpp's parser replaces every
#: ``_`` of an argument starting with ``--`` by ``-`` before it looks it up (common/arg.cpp,
#: ``common_params_parse_ex``), so each reaches llama-server as the option it spells.
UNDERSCORE_SPELLINGS = ["--hf_repo", "--model_url", "--spec_draft_model", "--spec_type", "--spec_draft_n_max",
                        "--api_prefix", "--docker_repo", "--hf_file", "--model_draft", "--hf_repo_draft",
                        "--spec_draft_hf"]


@pytest.mark.parametrize("given", [lambda flag: [flag, "x"], lambda flag: [f"{flag}=x"]], ids=["value", "=value"])
@pytest.mark.parametrize("flag", UNDERSCORE_SPELLINGS)
def test_extra_arguments_refuse_the_underscore_spellings_llama_server_reads_as_what_bench_sets(
    flag: str, given: Callable[[str], list[str]]
) -> None:
    as_read = flag.replace("_", "-")
    with pytest.raises(ParameterError,
                       match=rf"^server_args: {flag} \(llama-server's {as_read}\) is set by bench itself"):
        check_extra_arguments(["-t", "2", *given(flag)], ServerOptions.from_help(RECORDED_HELP))


def test_a_server_option_is_named_as_llama_cpp_looks_it_up() -> None:
    assert option_name("--hf_repo") == "--hf-repo"
    assert option_name("--spec_draft_n_max=2") == "--spec-draft-n-max"
    assert option_name("--hf-repo=me/a_b") == "--hf-repo"
    assert option_name("-hf_r") == "-hf_r"  # only arguments starting with -- are rewritten
    assert option_name("-t=2") == "-t"


def test_extra_arguments_pass_what_bench_does_not_set() -> None:
    check_extra_arguments(["-ngl", "99", "-c", "8192", "-t", "4", "-td", "2", "--spec-draft-p-min", "0.5"],
                          ServerOptions.from_help(RECORDED_HELP))


# --- threads (issue 29 item 14) -------------------------------------------------------------------------------


@pytest.mark.parametrize("free, each", [(1, 1), (2, 1), (3, 1), (4, 2), (16, 8)])
def test_threads_split_the_free_cores_when_none_are_given(free: int, each: int) -> None:
    options = ServerOptions.from_help(RECORDED_HELP)
    composite = choose_threads(["-ngl", "99"], options, free, draft=False, environ={})
    assert composite == Threads(("-t", str(each)), (), each, each, free)
    sidecar = choose_threads([], options, free, draft=True, environ={})
    assert sidecar.arguments + sidecar.draft_arguments == ("-t", str(each), "-td", str(each))
    assert not sidecar.oversubscribed  # bench's own choice is never warned of (one core: 1 + 1 is the least)


def test_threads_given_by_the_user_stand_and_oversubscription_is_told() -> None:
    options = ServerOptions.from_help(RECORDED_HELP)
    mine = choose_threads(["--threads", "2"], options, 2, draft=False, environ={})
    assert (mine.arguments, mine.trunk, mine.head, mine.oversubscribed) == ((), 2, 2, True)  # two pools of 2
    assert not choose_threads(["-t", "1"], options, 2, draft=False, environ={}).oversubscribed
    split = choose_threads(["-t=3", "--threads-draft", "1"], options, 4, draft=True, environ={})
    assert (split.trunk, split.head, split.oversubscribed) == (3, 1, False)
    inherited = choose_threads(["-t", "3"], options, 4, draft=True, environ={})
    assert (inherited.head, inherited.oversubscribed) == (3, True)  # -td defaults to -t
    from_env = choose_threads([], options, 2, draft=False, environ={"LLAMA_ARG_THREADS": "8"})
    assert from_env.arguments == () and not from_env.oversubscribed


@pytest.mark.parametrize("given", [["--threads_draft", "1"], ["--threads_draft=1"], ["--spec_draft_threads", "1"],
                                   ["--spec_draft_threads=1"]])
def test_thread_options_spelled_with_underscores_are_the_users_choice(given: list[str]) -> None:
    options = ServerOptions.from_help(RECORDED_HELP)
    draft_only = choose_threads(given, options, 4, draft=True, environ={})
    assert (draft_only.arguments, draft_only.draft_arguments, draft_only.head) == ((), (), 1)
    both = choose_threads(["-t", "3", *given], options, 4, draft=True, environ={})
    assert (both.trunk, both.head, both.oversubscribed) == (3, 1, False)


def test_accept_beside_bench_reads_the_servers_context_and_threads_under_underscore_spellings() -> None:
    from gguf_mtp.cli.bench import _server_value

    assert _server_value(["--ctx_size", "1024"], ("-c", "--ctx-size")) == 1024
    assert _server_value(["--ctx_size=512"], ("-c", "--ctx-size")) == 512


def test_accept_beside_bench_reads_the_last_of_a_server_value_given_twice_as_llama_cpp_does() -> None:
    from gguf_mtp.cli.bench import _server_value

    assert _server_value(["-c", "1024", "--ctx-size", "2048"], ("-c", "--ctx-size")) == 2048


def test_completion_request_is_greedy_and_uncached() -> None:
    body = completion_request("Hello", 32)
    assert body == {"prompt": "Hello", "n_predict": 32, "temperature": 0.0, "seed": SEED, "cache_prompt": False,
                    "return_tokens": True, "stream": False}


# --- timings ------------------------------------------------------------------------------------------------------


def test_parse_completion_with_and_without_draft_fields() -> None:
    plain = parse_completion(answer(16, 40.0, None, [5, 6, 7]))
    assert (plain.predicted_n, plain.predicted_ms, plain.draft_n, plain.draft_n_accepted) == (16, 40.0, 0, 0)
    assert plain.tokens == (5, 6, 7) and plain.content == "567"
    mtp = parse_completion(answer(16, 20.0, (12, 9), [5, 6, 7]))
    assert (mtp.draft_n, mtp.draft_n_accepted) == (12, 9)
    no_tokens = answer(1, 1.0, None, [1])
    del no_tokens["tokens"]
    assert parse_completion(no_tokens).tokens is None


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: a.pop("timings"), "without timings"),
        (lambda a: a["timings"].__setitem__("predicted_n", -1), "predicted_n"),
        (lambda a: a["timings"].__setitem__("predicted_n", True), "predicted_n"),
        (lambda a: a["timings"].__setitem__("predicted_ms", float("nan")), "predicted_ms"),
        (lambda a: a["timings"].update(draft_n=3, draft_n_accepted=4), "4 accepted of 3"),
        (lambda a: a["timings"].update(draft_n="3"), "draft_n"),
        (lambda a: a.pop("content"), "content"),
    ],
)
def test_parse_completion_refuses_what_llama_server_never_answers(change, match: str) -> None:
    bad = answer(4, 2.0, (2, 1), [1, 2])
    change(bad)
    with pytest.raises(LlamaServerError, match=match):
        parse_completion(bad)
    with pytest.raises(LlamaServerError):
        parse_completion([1, 2])


def test_run_sums_prompts_and_rates_over_total_time() -> None:
    run = run_of(2, answer(10, 100.0, (8, 6), [1]), answer(30, 100.0, (20, 4), [2]))
    assert (run.predicted_n, run.draft_n, run.draft_n_accepted) == (40, 28, 10)
    assert run.predicted_per_second == pytest.approx(200.0)  # 40 tokens in 0.2 s, not the mean of 100 and 300
    assert run.acceptance == pytest.approx(10 / 28)
    assert run_of(0, answer(10, 100.0, None, [1])).acceptance is None
    assert run_of(1, answer(10, 100.0, (0, 0), [1])).acceptance is None  # nothing drafted: no ratio
    assert run.text_sha256 != run_of(2, answer(10, 100.0, (8, 6), [1]), answer(30, 100.0, (20, 4), [3])).text_sha256


# --- lossless and the recommendation -----------------------------------------------------------------------------


def test_first_difference_by_tokens_then_text() -> None:
    base = run_of(0, answer(3, 1.0, None, [1, 2, 3]), answer(3, 1.0, None, [4, 5, 6]))
    assert first_difference(base, run_of(1, answer(3, 1.0, (3, 1), [1, 2, 3]), answer(3, 1.0, (3, 0), [4, 5, 6]))) \
        is None
    diff = first_difference(base, run_of(2, answer(3, 1.0, (3, 1), [1, 2, 3]), answer(3, 1.0, (3, 0), [4, 9, 6])))
    assert diff is not None and (diff.n_max, diff.prompt, diff.position, diff.unit) == (2, 1, 1, "token")
    assert "n-max 2" in diff.describe() and "prompt 2" in diff.describe()
    short = first_difference(base, run_of(1, answer(2, 1.0, (3, 1), [1, 2]), answer(3, 1.0, None, [4, 5, 6])))
    assert short is not None and (short.prompt, short.position) == (0, 2)  # stopped early: a difference too
    no_ids = answer(3, 1.0, None, [1, 2, 3])
    no_ids["content"] = "abX"
    del no_ids["tokens"]
    text = first_difference(base, run_of(1, no_ids, answer(3, 1.0, None, [4, 5, 6])))
    assert text is not None and (text.unit, text.position) == ("character", 0)  # "123" vs "abX"


def test_recommendation_rule() -> None:
    base = run_of(0, answer(100, 1000.0, None, [1]))  # 100 tokens/s

    def mtp(n: int, per_second: float) -> BenchRun:
        return run_of(n, answer(100, 100_000.0 / per_second, (50, 25), [1]))

    assert recommend_n_max([base, mtp(1, 150), mtp(2, 180), mtp(3, 170)]) == 2
    assert recommend_n_max([base, mtp(1, 180), mtp(2, 180)]) == 1  # a tie goes to the shorter draft
    assert recommend_n_max([base, mtp(1, 102), mtp(2, 90)]) == 0  # within the noise: MTP off
    assert recommend_n_max([base, mtp(1, 103.5)]) == 1
    assert recommend_n_max([base]) == 0


def test_report_table_json_and_verdicts() -> None:
    base = run_of(0, answer(64, 500.0, None, [1, 2]))
    fast = run_of(1, answer(64, 400.0, (40, 30), [1, 2]))
    report = BenchReport("m.gguf", None, "llama-server", 1, 64, (base, fast), (), 1.0)
    lines = report.describe()
    assert lines[1].split() == ["n-max", "acceptance", "tokens/s", "speed-up", "tokens"]
    assert lines[2].split() == ["0", "(no", "MTP)", "-", "128.0", "1.00x", "64"]
    assert lines[3].split() == ["1", "0.75", "(30/40)", "160.0", "1.25x", "64"]
    assert lines[-2].startswith("lossless:")
    assert lines[-1] == "recommended: --spec-type draft-mtp --spec-draft-n-max 1 (1.25x)"
    data = report.to_dict()
    assert data["lossless"] is True and data["recommended_n_max"] == 1
    assert [r["n_max"] for r in data["runs"]] == [0, 1]
    assert set(data["runs"][1]) >= {"n_max", "draft_n", "draft_n_accepted", "predicted_n", "predicted_per_second",
                                    "text_sha256"}
    assert (data["runs"][1]["draft_n"], data["runs"][1]["draft_n_accepted"], data["runs"][1]["acceptance"]) == (
        40, 30, 0.75)
    json.dumps(data, allow_nan=False)
    wrong = run_of(1, answer(64, 400.0, (40, 30), [1, 3]))
    broken = BenchReport("m.gguf", None, "llama-server", 1, 64, (base, wrong), (first_difference(base, wrong),), 1.0)
    assert not broken.lossless and broken.recommended_n_max is None
    assert broken.to_dict()["lossless"] is False and broken.to_dict()["recommended_n_max"] is None
    assert any(line.startswith("NOT lossless: with MTP (n-max 1) prompt 1") for line in broken.describe())


# --- prompts and model checks -------------------------------------------------------------------------------------


def test_builtin_prompts_are_code_prose_and_chat() -> None:
    prompts = builtin_prompts()
    assert [p.name for p in prompts] == ["code", "prose", "chat"]
    assert all(800 < len(p.text) < 4000 for p in prompts)  # a few hundred tokens each


def test_prompt_files(tmp_path: Path) -> None:
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps(["one", "two"]))
    assert [p.text for p in load_prompts(listed)] == ["one", "two"]
    shaped = tmp_path / "q.json"
    shaped.write_text(json.dumps({"prompts": [{"name": "n", "text": "t"}]}))
    assert [(p.name, p.text) for p in load_prompts(shaped)] == [("n", "t")]
    text = tmp_path / "p.txt"
    text.write_text("first\nprompt\n---\nsecond\n---\n\n")
    assert [p.text for p in load_prompts(text)] == ["first\nprompt", "second"]
    for name, content, match in [
        ("e.txt", "\n---\n", "no prompt"),
        ("e.json", "[]", "no prompt"),
        ("n.json", "[1]", "not a non-empty string"),
        ("many.json", json.dumps(["x"] * 65), "more than"),
        ("bad.txt", b"\xff\xfe", "not UTF-8"),
    ]:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(ParameterError, match=match):
            load_prompts(path)
    with pytest.raises(ParameterError, match="no such file"):
        load_prompts(tmp_path / "missing.txt")


@pytest.fixture(scope="module")
def glm_trunk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A glm4moe trunk without NextN, with llama.cpp's test tokenizer."""
    folder = tmp_path_factory.mktemp("bench-trunk")
    return with_test_tokenizer(write_target(folder / "raw", family=GLM4MOE, name="glm"), folder / "glm-trunk.gguf")


def test_check_model_needs_mtp_and_a_tokenizer(glm_trunk: Path, tmp_path: Path, glm_converted3: Path) -> None:
    with pytest.raises(NoNextNBlockError, match="no NextN"):
        check_model(glm_trunk, None)
    with pytest.raises(NoNextNBlockError, match="draft has no NextN"):
        check_model(glm_trunk, glm_trunk)
    with pytest.raises(ParameterError, match="no tokenizer"):
        check_model(glm_converted3, None)  # the tiny models' no_vocab: llama-server aborts on it
    info = check_model(glm_trunk, glm_converted3)
    assert (info.nextn, info.context_length, info.draft) == (3, 4096, str(glm_converted3))


# --- refusals and clean-up with fake servers ---------------------------------------------------------------------


def fake_server(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


HELP = (
    'if [ "$1" = --help ]; then\n'
    '  echo "-m, --model FNAME --host HOST --port PORT --spec-type none,draft-mtp"; exit 0\n'
    "fi\n"
)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gguf-mtp: error: ")
    return last


def test_refuses_a_binary_that_is_not_llama_server(tmp_path: Path, glm_trunk: Path, glm_converted3: Path) -> None:
    with pytest.raises(LlamaServerError, match="not llama-server"):
        probe_server("/bin/true")
    script = fake_server(tmp_path / "srv", "echo usage: frobnicate [--verbose]\n")
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(script)))
    assert str(script) in line and "not llama-server" in line
    assert "--server" in one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3),
                                                 "--server", str(tmp_path / "missing")))
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", "/bin/true"))
    assert "/bin/true: not llama-server" in line


def test_refuses_a_llama_server_too_old_for_mtp(tmp_path: Path, glm_trunk: Path, glm_converted3: Path) -> None:
    old = fake_server(tmp_path / "old", 'echo "-m, --model FNAME --host HOST --port PORT -md, --model-draft FNAME"\n')
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(old)))
    assert "too old for MTP" in line and "draft-mtp" in line
    assert "(needed: llama.cpp b11025 or later: `cmake -B build && cmake --build build --target llama-server`" in line


def test_refuses_a_model_without_nextn(tmp_path: Path, glm_trunk: Path) -> None:
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--server", "/bin/true"))
    assert str(glm_trunk) in line and "no NextN" in line and "--draft" in line


def test_refuses_bad_arguments_in_one_line(glm_trunk: Path, glm_converted3: Path, tmp_path: Path) -> None:
    common = [str(glm_trunk), "--draft", str(glm_converted3), "--server", "/bin/true"]
    assert "--n-max" in one_error_line(gguf_mtp("bench", *common, "--n-max", "0,1"))
    assert "--tokens" in one_error_line(gguf_mtp("bench", *common, "--tokens", "0"))
    started = tmp_path / "started"
    server = fake_server(tmp_path / "srv", HELP + f"touch {started}\nexec sleep 600\n")
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(server),
                                   "--", "--port", "1"))
    assert "--port is set by bench" in line
    assert not started.exists()  # refused before any server started


@pytest.mark.slow  # a gguf-mtp child process: about 2 s
def test_an_underscore_spelling_of_a_flag_bench_sets_is_refused_before_any_server_starts(
    glm_trunk: Path, glm_converted3: Path, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    server = fake_server(tmp_path / "srv", HELP + f"touch {started}\nexec sleep 600\n")
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(server),
                                   "--", "--model_url", "http://127.0.0.1:9/other.gguf"))
    assert "--model_url (llama-server's --model-url) is set by bench itself" in line
    assert not started.exists()


def test_no_llama_server_names_how_to_build_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from gguf_mtp.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server on it
    assert main(["bench", str(tmp_path / "m.gguf")]) == 2
    err = capsys.readouterr().err
    assert err == ("gguf-mtp: error: --server: no llama-server on PATH; give your build's binary (llama.cpp b11025 "
                   "or later: `cmake -B build && cmake --build build --target llama-server` in its checkout makes "
                   "build/bin/llama-server; in a gguf-mtp checkout `make tools` builds one and prints its path)\n")


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400", "0", "-1", "604801"])
def test_float_options_are_finite_and_in_range(value: str, glm_trunk: Path, glm_converted3: Path) -> None:
    """Item 6: nan never expires as a deadline (``<= 0`` let it through); one rule refuses it, inf and the rest."""
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", "/bin/true",
                                   f"--health-timeout={value}"))
    assert line.startswith("gguf-mtp: error: --health-timeout ")
    assert line.endswith(": give a finite number more than 0 and at most 604800")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -1.0, 10**400, "5", True])
def test_float_options_are_checked_in_the_library_too(value: object) -> None:
    with pytest.raises(ParameterError, match=r"^health_timeout .*: give a finite number more than 0"):
        check_float_options(health_timeout=value)  # type: ignore[arg-type]
    check_float_options(health_timeout=0.5)
    check_float_options(health_timeout=604800)
    assert set(FLOAT_OPTIONS) == {"health_timeout"}  # bench's only float option; a new one gets a row there


@pytest.mark.slow
def test_a_server_that_never_becomes_healthy(tmp_path: Path, glm_trunk: Path, glm_converted3: Path) -> None:
    pidfile = tmp_path / "pid"
    sleeper = fake_server(tmp_path / "sleeper", HELP + f'echo "loading model"\necho $$ > {pidfile}\nexec sleep 600\n')
    proc = gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(sleeper),
                    "--health-timeout", "1.5", "--tokens", "4", "--n-max", "1")
    line = one_error_line(proc)
    assert "did not become healthy" in line and "within 1.5 s (--health-timeout)" in line
    assert "loading model" in proc.stderr  # the log's last lines are shown
    log = Path(line.rsplit("log: ", 1)[1])
    assert log.read_text().startswith("loading model")  # and the log is kept
    log.unlink()
    assert not pid_alive(int(pidfile.read_text()))


def test_a_server_that_dies_while_loading(tmp_path: Path, glm_trunk: Path, glm_converted3: Path) -> None:
    dying = fake_server(tmp_path / "dying", HELP + 'echo "error: failed to load model"\nexit 1\n')
    proc = gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(dying), "--tokens", "4")
    line = one_error_line(proc)
    assert "stopped before it was ready (llama-server exited with status 1)" in line
    assert "  error: failed to load model" in proc.stderr
    Path(line.rsplit("log: ", 1)[1]).unlink()


def test_plot_needs_matplotlib_and_a_new_file(tmp_path: Path, glm_trunk: Path, glm_converted3: Path) -> None:
    existing = tmp_path / "b.png"
    existing.write_bytes(b"keep")
    line = one_error_line(gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", "/bin/true",
                                   "--plot", str(existing)))
    if importlib.util.find_spec("matplotlib") is None:  # the dependency floors: no bench extra
        assert line.endswith("--plot needs matplotlib: in your gguf-mtp clone run `make install` or "
                             "`pip install '.[bench]'` (matplotlib)")
    else:
        assert "exists" in line and "--force" in line
    assert existing.read_bytes() == b"keep"


# --- publish --bench-json ----------------------------------------------------------------------------------------


def bench_json(model: str) -> dict:
    base = run_of(0, answer(64, 500.0, None, [1, 2]))
    fast = run_of(1, answer(64, 400.0, (40, 30), [1, 2]))
    slower = run_of(2, answer(64, 450.0, (60, 33), [1, 2]))
    report = BenchReport(model, None, "llama-server", 3, 64, (base, fast, slower), (), 1.0, ("-ngl", "99"))
    return report.to_dict()


def test_bench_json_is_read_back_strictly() -> None:
    summary = parse_bench_json(bench_json("/x/m.gguf"), "b.json")
    assert [r.n_max for r in summary.rows] == [0, 1, 2] and summary.recommended_n_max == 1
    assert summary.server_args == ("-ngl", "99") and summary.lossless
    for change, match in [
        (lambda d: d.update(command="verify"), "not a gguf-mtp bench --json report"),
        (lambda d: d["runs"].pop(), None),
        (lambda d: d["runs"][1].update(draft_n_accepted=41), "impossible counts"),
        (lambda d: d["runs"].reverse(), "increasing"),
        (lambda d: d.update(recommended_n_max=7), "recommended_n_max"),
        (lambda d: d["runs"][0].update(predicted_n="64"), "predicted_n"),
        (lambda d: d.update(lossless="yes"), "lossless"),
        (lambda d: d.update(runs=[d["runs"][0]] * 40), "runs"),
    ]:
        data = bench_json("/x/m.gguf")
        change(data)
        if match is None:  # two runs (0 and 1) are still a table
            parse_bench_json(data, "b.json")
            continue
        with pytest.raises(ParameterError, match=match):
            parse_bench_json(data, "b.json")


@pytest.mark.slow
def test_publish_card_carries_the_measured_table(glm_converted3: Path, tmp_path: Path) -> None:
    data = tmp_path / "bench.json"
    data.write_text(json.dumps(bench_json(str(glm_converted3))))
    proc = gguf_mtp("publish", str(glm_converted3.parent), "--repo", "me/glm-mtp", "--dry-run",
                    "--bench-json", str(data))
    assert proc.returncode == 0, proc.stderr
    card = proc.stdout.split("----- README.md -----", 1)[1]
    section = card.split("## Measured speed", 1)[1].split("## Check it", 1)[0]
    assert "own llama-server (`-ngl 99`): 3 prompt(s), up to 64 tokens each" in section
    assert "| 0 (no MTP) | - | 128.0 | 1.00x |" in section
    assert "| 1 | 0.75 (30/40) | 160.0 | 1.25x |" in section
    assert "| 2 | 0.55 (33/60) | 142.2 | 1.11x |" in section
    assert "Greedy output with MTP: identical to the output without it. Recommended: `--spec-draft-n-max 1`." \
        in section
    assert f"gguf-mtp bench {glm_converted3.name} --server PATH/TO/llama-server" in card.split("## Check it")[1]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(bench_json("/elsewhere/another-model.gguf")))
    line = one_error_line(gguf_mtp("publish", str(glm_converted3.parent), "--repo", "me/glm-mtp", "--dry-run",
                                   "--bench-json", str(other)))
    assert "--bench-json measured another-model.gguf, not the published glm-mtp3-00001-of-00002.gguf" in line
    plain = gguf_mtp("publish", str(glm_converted3.parent), "--repo", "me/glm-mtp", "--dry-run")
    assert plain.returncode == 0 and "## Measured speed" not in plain.stdout


def test_what_follows_a_double_dash_goes_to_the_server_only_for_bench() -> None:
    from gguf_mtp.cli import _parse, build_parser

    parser = build_parser()
    args = _parse(parser, ["-v", "bench", "m.gguf", "--server", "s", "--tokens", "4", "--", "-ngl", "99", "--", "x"])
    assert (args.model, args.server, args.tokens, args.server_args) == ("m.gguf", "s", 4, ["-ngl", "99", "--", "x"])
    assert _parse(parser, ["bench", "m.gguf"]).server_args == []
    assert _parse(parser, ["inspect", "--", "-odd-name.gguf"]).path == "-odd-name.gguf"  # argparse's own meaning


# --- the whole run against a fake llama-server (the real one: tests/test_bench_server.py) -------------------------

FAKE_SERVER = '''#!PYTHON
"""A stand-in llama-server: --help, /health, /props, /tokenize and /completion in llama-server's shapes."""
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

argv = sys.argv[1:]
if argv == ["--help"]:
    print("-m, --model FNAME\\n--host HOST\\n--port PORT\\n--spec-type none,draft-simple,draft-mtp")
    sys.exit(0)
port = int(argv[argv.index("--port") + 1])
n_max = int(argv[argv.index("--spec-draft-n-max") + 1]) if "--spec-type" in argv else 0
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, data):
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.answer({"status": "ok"})
        else:
            self.answer({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self.answer({"tokens": list(range(len(request["content"]) // 5 + 1))})
            return
        n = request["n_predict"]
        tokens = [(len(request["prompt"]) + i) % 97 for i in range(n)]
        if n_max and os.environ.get("FAKE_DIFFER") == str(n_max):
            tokens[-1] += 1
        timings = {"prompt_n": 10, "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": 100.0 / (1 + n_max),
                   "predicted_per_second": n * 10.0 * (1 + n_max)}
        if n_max:
            timings.update(draft_n=n * n_max, draft_n_accepted=n)
        self.answer({"content": "".join(f"{t:x}" for t in tokens), "tokens": tokens, "stop": True, "timings": timings})


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture
def fake_llama_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    script = tmp_path / "llama-server"
    script.write_text(FAKE_SERVER.replace("PYTHON", sys.executable))
    script.chmod(0o755)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    return script, log


def test_a_whole_run_against_a_fake_server(fake_llama_server: tuple[Path, Path], glm_trunk: Path,
                                           glm_converted3: Path, tmp_path: Path) -> None:
    server, log = fake_llama_server
    prompts = tmp_path / "p.txt"
    prompts.write_text("one prompt\n---\nanother prompt\n")
    proc = gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(server), "--n-max",
                    "2,1", "--tokens", "5", "--prompts", str(prompts), "--json", "--", "-ngl", "99")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(r["n_max"], r["predicted_n"], r["draft_n"], r["draft_n_accepted"]) for r in report["runs"]] == [
        (0, 10, 0, 0), (1, 10, 10, 10), (2, 10, 20, 10)]
    assert [r["speedup"] for r in report["runs"]] == [1.0, 2.0, 3.0]
    assert report["lossless"] is True and report["recommended_n_max"] == 2
    assert report["server_args"] == ["-ngl", "99"]
    started = [json.loads(line) for line in log.read_text().splitlines()]
    assert [a[a.index("--port") + 1] != "0" for a in started] == [True] * 3
    sidecar = ["--spec-draft-model", str(glm_converted3)]
    n = report["threads"][1]  # no thread count given: half the free cores for each pool, in every run
    assert report["threads"] == ["-t", n, "-td", n] and 1 <= int(n) <= max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"threads: -t {n} -td {n} in every run" in proc.stderr
    assert [a[6:] for a in started] == [  # after -m MODEL --host 127.0.0.1 --port N
        ["-t", n, "-ngl", "99"],
        ["--spec-type", "draft-mtp", "--spec-draft-n-max", "1", *sidecar, "-t", n, "-td", n, "-ngl", "99"],
        ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2", *sidecar, "-t", n, "-td", n, "-ngl", "99"],
    ]
    # a progress line per prompt, on stderr only (item 14)
    prompt_lines = [line for line in proc.stderr.splitlines() if ": prompt " in line]
    assert [line.split(": prompt ")[1].split(":")[0] for line in prompt_lines] == [
        "1/2 (prompt 1)", "2/2 (prompt 2)"] * 3
    assert prompt_lines[2].startswith("run 2/3: MTP n-max 1: prompt 1/2 (prompt 1): 5 tokens in 0.05 s (")
    assert prompt_lines[2].endswith("5/5 drafted tokens accepted")
    assert "prompt 1/2" not in proc.stdout
    assert all(a[:4] == ["-m", str(glm_trunk), "--host", "127.0.0.1"] for a in started)
    assert not any(pid_alive(int(pid)) for pid in re.findall(r"llama-server pid (\d+)", proc.stderr))


def test_threads_that_oversubscribe_the_free_cores_are_warned_of(fake_llama_server: tuple[Path, Path],
                                                                  glm_trunk: Path, glm_converted3: Path) -> None:
    """The user's own -t stands, with a warning when an MTP run's two pools hold more threads than free cores;
    -q silences progress, never the warning."""
    server, log = fake_llama_server
    many = str(4 * (os.cpu_count() or 1))
    proc = gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(server), "--n-max", "1",
                    "--tokens", "2", "-q", "--json", "--", "-t", many)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"gguf-mtp: warning: threads: an MTP run's two thread pools hold {many} + {many} threads for "
        f"{proc.stderr.split(' threads for ')[1].split(' free')[0]} free core(s): it may run many times slower than "
        "it would with fewer (give -t, and -td for a sidecar, after --)"]
    assert json.loads(proc.stdout)["threads"] == []
    assert all(a[6:][-2:] == ["-t", many] and "-td" not in a for a in map(json.loads, log.read_text().splitlines()))


def test_output_that_differs_with_mtp_exits_2(fake_llama_server: tuple[Path, Path], glm_trunk: Path,
                                              glm_converted3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = fake_llama_server
    monkeypatch.setenv("FAKE_DIFFER", "2")
    proc = gguf_mtp("bench", str(glm_trunk), "--draft", str(glm_converted3), "--server", str(server), "--n-max",
                    "1,2", "--tokens", "4", "-q")
    line = one_error_line(proc)
    assert line == (f"gguf-mtp: error: {glm_trunk}: not lossless: with MTP (n-max 2) prompt 1 differs from the run "
                    "without MTP at token 3; greedy output with MTP must equal the output without it")
    assert "NOT lossless: with MTP (n-max 2) prompt 1 differs from the run without MTP at token 3" in proc.stdout
    assert "recommended" not in proc.stdout


def test_the_plot_is_titled_with_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 19: the model's name, not the PNG's."""
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    from gguf_mtp.server.bench_plot import plot_title, write_plot

    titles: list[str] = []
    original = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title",
                        lambda self, label, *a, **k: titles.append(label) or original(self, label, *a, **k))
    base = run_of(0, answer(64, 500.0, None, [1, 2]))
    fast = run_of(1, answer(64, 400.0, (40, 30), [1, 2]))
    report = BenchReport("/models/Qwen3-MTP-Q4_K_M.gguf", None, "llama-server", 1, 64, (base, fast), (), 1.0)
    write_plot(report, tmp_path / "plot.png", force=False)
    assert titles == ["gguf-mtp bench: Qwen3-MTP-Q4_K_M.gguf"]
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    pair = BenchReport("/m/trunk.gguf", "/m/mtp.gguf", "llama-server", 1, 64, (base, fast), (), 1.0)
    assert plot_title(pair) == "gguf-mtp bench: trunk.gguf + mtp.gguf"
