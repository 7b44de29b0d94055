"""``gguf-mtp accept`` with llama.cpp (llama-cpp-python) on the designed test model
(:mod:`gguf_mtp.testing.cycle_model`): the greedy text follows the model's cycle, the head drafts exactly what its
design says (first draft and the re-fed chain), a dead head fails ``verify --acceptance`` while plain ``verify``
passes, and bad input gets one line and exit status 2 (Ctrl-C leaves no child). The equality with the real
llama-server is in ``test_accept_server.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import pid_alive, rewrite_gguf

from gguf_mtp import extract, strip
from gguf_mtp.check import accept as accept_module
from gguf_mtp.check.accept import accept
from gguf_mtp.check.accept_child import CHUNK
from gguf_mtp.check.accept_schedule import Limits, replay
from gguf_mtp.errors import LlamaCppError, NoNextNBlockError, ParameterError
from gguf_mtp.format.header import encode_kv
from gguf_mtp.model.prompts import Prompt
from gguf_mtp.testing.cycle_model import CycleModel, damage_head, write_cycle_model
from gguf_mtp.testing.server_models import with_test_tokenizer
from gguf_mtp.testing.tiny_models import GLM4MOE, write_target

pytestmark = pytest.mark.llama

REPO = Path(__file__).resolve().parent.parent
PROMPTS = (Prompt("code", "def fibonacci(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"),
           Prompt("prose", "The lighthouse keeper climbed the stairs at dusk, as he had done every evening for"))
TOKENS = 40


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gguf_mtp", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def cycle(tmp_path_factory: pytest.TempPathFactory) -> CycleModel:
    return write_cycle_model(tmp_path_factory.mktemp("accept"))


@pytest.fixture(scope="module")
def split(cycle: CycleModel) -> tuple[Path, Path]:
    """The designed composite as trunk + MTP-only sidecar (gguf-mtp strip and extract --standalone)."""
    root = cycle.path.parent
    trunk = strip(cycle.path, root / "trunk", progress=False).output_paths[0]
    sidecar = root / "sidecar.gguf"
    extract(cycle.path, sidecar, standalone=True, progress=False)
    return Path(trunk), sidecar


def designed_chains(model: CycleModel, before: int, greedy: tuple[int, ...], k: int) -> list[list[int]]:
    """What the head drafts by design from each position: its row points at ``map(token before)``; each draft
    step drafts ``cycle[row]`` and re-feeds a row at ``map(row)``."""
    def step(t: int) -> int:
        return model.cycle[t] if t in model.good else t

    chains = []
    for j in range(len(greedy)):
        row, chain = step(greedy[j - 1] if j else before), []
        for _ in range(k):
            chain.append(model.cycle[row])
            row = step(row)
        chains.append(chain)
    return chains


def test_the_prediction_is_what_the_design_says(cycle: CycleModel) -> None:
    report = accept(cycle.path, prompts=PROMPTS, tokens=TOKENS, n_max=(1, 2, 3), threads=1, ctx_size=1024)
    assert report.heads == 1 and not report.chained and report.batched_disagreements == 0
    for score in report.prompts:
        greedy = score.greedy
        assert len(greedy) == TOKENS and all(cycle.cycle[a] == b for a, b in itertools.pairwise(greedy))
        before = cycle.cycle.index(greedy[0])  # the prompt's last token
        for run in score.runs:
            chains = designed_chains(cycle, before, greedy, run.n_max)
            assert run == replay(greedy, chains, run.n_max, Limits(score.prompt_tokens, TOKENS, 1024))
    first = report.runs[0]
    assert first.acceptance is not None and 0.45 < first.acceptance < 0.95  # the design: about 70 %
    assert report.recommended_n_max in (1, 2, 3)


def test_json_report_has_the_shape_of_the_issue(cycle: CycleModel) -> None:
    proc = cli("accept", str(cycle.path), "--tokens", "24", "--n-max", "1,2", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {"model", "draft", "prompts", "runs", "recommended_n_max"} <= set(data)
    assert [p["name"] for p in data["prompts"]] == ["code", "prose", "chat"]
    for prompt in data["prompts"]:
        assert set(prompt) == {"name", "tokens", "runs"} and prompt["tokens"] == 24
        assert [set(r) for r in prompt["runs"]] == [{"n_max", "draft_n", "draft_n_accepted"}] * 2
    totals = data["runs"]
    for i, run in enumerate(totals):
        assert run["draft_n"] == sum(p["runs"][i]["draft_n"] for p in data["prompts"])
        assert run["draft_n_accepted"] == sum(p["runs"][i]["draft_n_accepted"] for p in data["prompts"])
        assert run["acceptance"] == pytest.approx(run["draft_n_accepted"] / run["draft_n"])
        assert [p["position"] for p in run["by_position"]] == list(range(1, run["n_max"] + 1))
        assert run["by_position"][0]["drafted"] == run["steps"]  # every step drafts a first token


def test_trunk_and_sidecar_predict_what_the_composite_predicts(cycle: CycleModel, split: tuple[Path, Path]) -> None:
    trunk, sidecar = split
    together = accept(cycle.path, prompts=PROMPTS, tokens=TOKENS, n_max=(1, 2), threads=1, ctx_size=1024)
    apart = accept(trunk, draft=sidecar, prompts=PROMPTS, tokens=TOKENS, n_max=(1, 2), threads=1, ctx_size=1024)
    assert [p.runs for p in apart.prompts] == [p.runs for p in together.prompts]
    assert apart.draft == str(sidecar)


def test_the_greedy_text_costs_one_trunk_decode_per_server_step_not_one_per_token(
    cycle: CycleModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # generated as llama-server generates it at the largest n-max: each step drafts with the head and the trunk
    # verifies [last token + drafts] in one batch (one decode per token would be TOKENS - 1 after the prompt's)
    batches_file = tmp_path / "trunk-batches.json"
    script = ("import json\n"
              "from gguf_mtp.check import accept_child\n"
              "batches = []\n"
              "decode = accept_child._Runner._decode\n"
              "def counted(self, ctx, batch, what):\n"
              "    if ctx is self.tgt:\n"
              "        batches.append(batch.batch.n_tokens)\n"
              "    decode(self, ctx, batch, what)\n"
              "accept_child._Runner._decode = counted\n"
              "try:\n"
              "    accept_child.main()\n"
              "finally:\n"
              f"    open({str(batches_file)!r}, 'w').write(json.dumps(batches))\n")
    monkeypatch.setattr(accept_module, "_child_command", lambda: [sys.executable, "-c", script])
    report = accept(cycle.path, prompts=PROMPTS[:1], tokens=TOKENS, n_max=(1, 3), threads=1, ctx_size=1024)
    score, widest = report.prompts[0], report.prompts[0].runs[-1]
    steps = json.loads(batches_file.read_text())[-(-score.prompt_tokens // CHUNK) :]
    assert len(steps) == widest.target_decodes - 1 < TOKENS // 2
    assert sum(steps) == widest.draft_n + len(steps)  # every draft the server's step makes, and its last token


def test_the_command_itself_loads_no_numpy_in_greedy_mode(cycle: CycleModel) -> None:
    # numpy is about 15 MiB of the command's peak memory beside the llama.cpp child's: only the child and the
    # probabilistic mode use it
    script = ("import sys\n"
              "from gguf_mtp.cli import main\n"
              f"code = main(['accept', {str(cycle.path)!r}, '--tokens', '8', '--n-max', '1,2', '--threads', '1', "
              "'-q'])\n"
              "print('exit', code, 'numpy loaded' if 'numpy' in sys.modules else 'no numpy')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.splitlines()[-1] == "exit 0 no numpy", proc.stderr


@pytest.mark.parametrize(("load", "threads"), [(3.0, 1), (0.4, 2)])
def test_llama_cpp_runs_on_half_the_free_cores_unless_told(cycle: CycleModel, monkeypatch: pytest.MonkeyPatch,
                                                      load: float, threads: int) -> None:
    # as bench gives llama-server's two pools (the trunk's, the head's) half the free cores each
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    asked: list[int] = []

    def child(request: dict, model: str, say: object) -> dict:
        asked.append(request["threads"])
        raise LlamaCppError("stopped before llama.cpp runs", model)

    monkeypatch.setattr(accept_module, "_run_child", child)
    for given in (None, 3):
        with pytest.raises(LlamaCppError, match="stopped before"):
            accept(cycle.path, prompts=PROMPTS, tokens=TOKENS, threads=given)
    assert asked == [threads, 3]


def test_a_dead_head_fails_verify_acceptance_while_plain_verify_passes(cycle: CycleModel, tmp_path: Path) -> None:
    dead = tmp_path / "dead.gguf"
    shutil.copyfile(cycle.path, dead)
    damage_head(dead)
    plain = cli("verify", str(dead), "--llama")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    checked = cli("verify", str(dead), "--acceptance", "--json")
    assert checked.returncode == 2
    found = {c["name"]: c for c in json.loads(checked.stdout)["checks"]}
    assert found["llama.cpp"]["ok"] is True and found["acceptance"]["ok"] is False
    assert "below the floor 0.10" in found["acceptance"]["detail"]
    healthy = cli("verify", str(cycle.path), "--acceptance", "--json")
    assert healthy.returncode == 0, healthy.stdout
    assert "predicted acceptance 0." in {c["name"]: c for c in json.loads(healthy.stdout)["checks"]}["acceptance"][
        "detail"]


def test_a_sidecar_is_verified_for_acceptance_beside_its_model(split: tuple[Path, Path]) -> None:
    trunk, sidecar = split
    proc = cli("verify", str(sidecar), "--target", str(trunk), "--acceptance", "--floor", "0.3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "floor 0.30" in proc.stdout


# ------------------------------------------------------------------------------------------- refusals


def test_a_model_without_a_head_and_no_draft_is_refused(split: tuple[Path, Path]) -> None:
    trunk, _ = split
    with pytest.raises(NoNextNBlockError):
        accept(trunk, prompts=PROMPTS, tokens=8)
    proc = cli("accept", str(trunk))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no NextN (MTP) block" in proc.stderr


def test_a_sidecar_that_does_not_fit_the_trunk_is_refused(split: tuple[Path, Path], tmp_path: Path) -> None:
    _, sidecar = split
    other = with_test_tokenizer(write_target(tmp_path / "raw", family=GLM4MOE, name="wide"), tmp_path / "wide.gguf")
    proc = cli("accept", str(other), "--draft", str(sidecar))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "this sidecar does not fit the model" in proc.stderr and "embedding_length" in proc.stderr


@pytest.mark.parametrize(("content", "message"), [(b"", "no prompt"), (b"\xff\xfe\x00binary", "not UTF-8")])
def test_an_empty_or_binary_prompts_file_is_refused(cycle: CycleModel, tmp_path: Path, content: bytes,
                                                    message: str) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(content)
    proc = cli("accept", str(cycle.path), "--prompts", str(prompts))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr


def test_a_prompt_longer_than_the_context_is_refused(cycle: CycleModel) -> None:
    long = Prompt("long", "0123456789" * 200)  # 400 tokens of llama.cpp's test tokenizer (5 bytes each)
    with pytest.raises(ParameterError, match=r"long: 400 prompt tokens do not fit the context of 256"):
        accept(cycle.path, prompts=[long], tokens=TOKENS, ctx_size=200, threads=1)
    proc = cli("accept", str(cycle.path), "--ctx-size", "200", "--prompts", str(write_prompt(cycle, long.text)), "-q")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "do not fit the context of 256" in proc.stderr


def write_prompt(cycle: CycleModel, text: str) -> Path:
    path = cycle.path.parent / "long-prompt.txt"
    path.write_text(text)
    return path


def test_a_llama_cpp_abort_in_the_child_is_one_line_with_its_last_log_lines(
    cycle: CycleModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = ("import os, sys; print('{\"stage\": \"score\", \"prompt\": \"code\"}', flush=True); "
              "print('llama_model_load: loading', file=sys.stderr); "
              "print('ggml.c:123: GGML_ASSERT(n_tokens > 0) failed', file=sys.stderr, flush=True); os.abort()")
    monkeypatch.setattr(accept_module, "_child_command", lambda: [sys.executable, "-c", script])
    with pytest.raises(LlamaCppError) as caught:
        accept(cycle.path, prompts=PROMPTS, tokens=8)
    assert caught.value.message == ("llama.cpp died (SIGABRT) while scoring code: ggml.c:123: "
                                    "GGML_ASSERT(n_tokens > 0) failed")
    assert caught.value.log_tail[-1] == "ggml.c:123: GGML_ASSERT(n_tokens > 0) failed"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_ctrl_c_leaves_no_child(cycle: CycleModel) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "gguf_mtp", "accept", str(cycle.path), "--tokens", "2000",
                             "--ctx-size", "4096", "--threads", "1"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (children := _children(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "the llama.cpp child never started"
            time.sleep(0.05)
        time.sleep(1.0)  # the child is loading or generating
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in stderr
    assert not any(pid_alive(child) for child in children)


def test_the_head_type_sweep_measures_each_type_and_recommends_by_the_rule(cycle: CycleModel) -> None:
    proc = cli("accept", str(cycle.path), "--outtypes", "q8_0,q6_k,q4_k,q3_k", "--n-max", "1", "--tokens", "24",
               "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    rows = data["outtypes"]
    assert [r["outtype"] for r in rows] == ["as stored", "q8_0", "q6_k", "q4_k", "q3_k"]
    sizes = [r["head_bytes"] for r in rows]
    assert all(a > b for a, b in itertools.pairwise(sizes))  # F16 as stored, then smaller and smaller
    assert all(r["acceptance"] is not None and r["acceptance"] > 0.45 for r in rows)
    typed = rows[1:]
    best = max(r["acceptance"] for r in typed)
    assert data["recommended_outtype"] == min((r for r in typed if r["acceptance"] >= best - 0.01),
                                              key=lambda r: r["head_bytes"])["outtype"]
    assert list(Path(tempfile.gettempdir()).glob("gguf-mtp-accept-*")) == []  # the temporary sidecars are gone


def test_an_unknown_head_type_is_refused_before_anything_runs(cycle: CycleModel) -> None:
    proc = cli("accept", str(cycle.path), "--outtypes", "q8_0,q9_x")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "q9_x" in proc.stderr


def test_text_mode_scores_the_given_text_by_teacher_forcing(cycle: CycleModel) -> None:
    # A text of one repeated 5-byte chunk is one token t over and over (llama.cpp's test tokenizer). By design the
    # trunk's next token after t is cycle[t] everywhere; the head (shown t and the row after t) drafts cycle[t] when t
    # is a bad token and cycle[cycle[t]] when it is a good one: full agreement or none.
    chunks = [c * 5 for c in "abcdefgh"]
    greedy = accept(cycle.path, prompts=[Prompt(c, c * 4) for c in chunks], tokens=1, n_max=(1,), threads=1)
    token = {p.name: cycle.cycle.index(p.greedy[0]) for p in greedy.prompts}
    assert {t in cycle.good for t in token.values()} == {True, False}  # both kinds among the chunks
    report = accept(cycle.path, prompts=[Prompt(c, c * 20) for c in chunks], text=True, n_max=(1,), threads=1)
    assert report.mode == "text" and report.recommended_n_max is None
    for score in report.prompts:
        agreeing, scored = score.agreement or (0, 0)
        assert scored == 19 and agreeing == (0 if token[score.name] in cycle.good else 19), score.name
    assert "an estimate of acceptance at n-max 1, not a server prediction" in report.describe()[-1]


# ------------------------------------------------------------------------------------------- issue 37


def test_a_sigkilled_accept_takes_its_llama_cpp_child_with_it(cycle: CycleModel, tmp_path: Path) -> None:
    # the child here only sleeps: whatever it does, it must not outlive a parent killed outright
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import sys\nfrom gguf_mtp.check import accept\nfrom gguf_mtp.cli import main\n"
        "accept._child_command = lambda: [sys.executable, '-c', 'import time; time.sleep(3600)']\n"
        f"sys.exit(main(['accept', {str(cycle.path)!r}, '--threads', '1', '-q']))\n")
    proc = subprocess.Popen([sys.executable, str(parent)], env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (children := _children(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 120  # a bound, not a wait: the kernel kills it at once
        while any(pid_alive(child) for child in children):
            assert time.monotonic() < deadline, "the child outlived its SIGKILLed parent"
            time.sleep(0.05)
    finally:
        for child in children:
            if pid_alive(child):
                os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize(("flag", "value", "bound"), [("--threads", "0", "1 to 512"), ("--threads", "5000", "1 to 512"),
                                                      ("--threads", "100000", "1 to 512"),
                                                      ("--n-gpu-layers", "70000", "0 to 65536"),
                                                      ("--ctx-size", "99999999", "8 to 16777216"),
                                                      ("--tokens", "70000", "1 to 65536")])
def test_a_count_beyond_its_bound_is_refused_before_llama_cpp_starts(cycle: CycleModel, flag: str, value: str,
                                                                     bound: str) -> None:
    proc = cli("accept", str(cycle.path), flag, value)
    assert proc.returncode == 2
    assert proc.stderr == f"gguf-mtp: error: {flag} {value}: give {bound}\n"


def test_a_prompt_with_a_lone_surrogate_is_refused_naming_the_file_and_the_character(cycle: CycleModel,
                                                                                     tmp_path: Path) -> None:
    prompts = tmp_path / "mine.json"
    prompts.write_text('["a fine prompt", "ab\\ud800c"]')
    proc = cli("accept", str(cycle.path), "--prompts", str(prompts))
    assert proc.returncode == 2
    assert proc.stderr == (f"gguf-mtp: error: {prompts}: --prompts: prompt 2: character 3 (U+D800) cannot be encoded "
                           "as UTF-8 (surrogates not allowed)\n")


def test_an_mtp_only_sidecar_given_as_the_model_is_refused_naming_draft(split: tuple[Path, Path],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, sidecar = split

    def child(request: dict, model: str, say: object) -> dict:
        raise AssertionError("llama.cpp started")

    monkeypatch.setattr(accept_module, "_run_child", child)
    with pytest.raises(ParameterError, match=r"an MTP-only sidecar, not a model: .* and this file as draft$"):
        accept(sidecar, prompts=PROMPTS, tokens=8, threads=1)
    proc = cli("accept", str(sidecar))
    assert proc.returncode == 2
    assert proc.stderr == (f"gguf-mtp: error: {sidecar}: an MTP-only sidecar, not a model: give the model it drafts "
                           "for, and this file as --draft\n")


@pytest.mark.parametrize(("given", "free", "warned"), [(2, 1, True), (1, 1, False), (2, 4, False), (3, 4, True)])
def test_threads_that_oversubscribe_the_free_cores_are_warned_of_as_bench_does(
    cycle: CycleModel, monkeypatch: pytest.MonkeyPatch, given: int, free: int, warned: bool
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 - free,) * 3)

    def child(request: dict, model: str, say: object) -> dict:
        raise LlamaCppError("stopped before llama.cpp runs", model)

    monkeypatch.setattr(accept_module, "_run_child", child)
    warnings: list[str] = []
    with pytest.raises(LlamaCppError):
        accept(cycle.path, prompts=PROMPTS, tokens=8, threads=given, warn=warnings.append)
    expected = (f"threads: an MTP run's two thread pools hold {given} + {given} threads for {free} free core(s): it "
                f"may run many times slower than it would with fewer (give --threads {max(1, free // 2)}, or leave "
                "it out)")
    assert warnings == ([expected] if warned else [])


def test_progress_lines_say_the_threads_the_child_and_each_prompt_as_they_come(cycle: CycleModel) -> None:
    prompts = cycle.path.parent / "two-prompts.txt"
    prompts.write_text(f"{PROMPTS[0].text}\n---\n{PROMPTS[1].text}\n")
    proc = cli("accept", str(cycle.path), "--prompts", str(prompts), "--tokens", "8", "--n-max", "1", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("threads: as given (") and lines[0].endswith(" free core(s))")
    assert lines[1].startswith("llama.cpp: pid ") and lines[1].endswith(", loading the model")
    assert lines[2:] == ["prompt 1/2 (prompt 1): predicting", "prompt 2/2 (prompt 2): predicting"]
    quiet = cli("accept", str(cycle.path), "--prompts", str(prompts), "--tokens", "8", "--n-max", "1", "-q")
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.fixture(scope="module")
def small_context(cycle: CycleModel) -> Path:
    """The designed model with a 256-token training context: the built-in prompts do not fit it whole."""
    key = "glm4moe.context_length"
    return rewrite_gguf(cycle.path, cycle.path.parent / "context-256.gguf",
                        set_kvs={key: encode_kv(key, GGUFValueType.UINT32, 256)})


def test_verify_acceptance_cuts_the_built_in_prompts_to_a_small_context_and_says_so(small_context: Path) -> None:
    proc = cli("verify", str(small_context), "--acceptance", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    detail = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["acceptance"]["detail"]
    assert detail.startswith("predicted acceptance 0.") and "cut to fit the context of 256, 64 tokens each" in detail


def test_verify_acceptance_refuses_a_model_without_a_tokenizer_up_front(tmp_path: Path) -> None:
    bare = write_target(tmp_path / "bare", family=GLM4MOE, with_nextn=True, name="bare")
    proc = cli("verify", str(bare), "--acceptance")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"gguf-mtp: error: {bare}: --acceptance: model has no tokenizer (tokenizer.ggml.model = "
                           "'no_vocab'): llama-server cannot tokenize prompts, so its head cannot be measured: leave "
                           "--acceptance out\n")
