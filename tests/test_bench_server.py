"""``gguf-mtp bench`` end to end with llama.cpp's own llama-server (built from the llama.cpp the loader vendors):
on a tiny glm4moe composite and on its trunk + MTP-only sidecar, the reported counts are what the server returns
for the same requests (asked here directly), the lossless check passes, no server process is left after a run or
after Ctrl-C / SIGTERM mid-run; on a tiny hybrid nemotron_h_moe model this llama.cpp's draft-mtp output differs
from its output without MTP, and bench says so and exits 2.

Speeds on tiny models mean nothing: nothing here looks at tokens/s. The tiny models carry llama.cpp's ``test``
tokenizer (llama-server aborts on the no_vocab models the other tests use).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.helpers import pid_alive

from gguf_mtp import compose, extract
from gguf_mtp.format.header import read_header
from gguf_mtp.model.prompts import builtin_prompts
from gguf_mtp.testing.server_models import with_test_tokenizer
from gguf_mtp.testing.tiny_models import GLM4MOE, NEMOTRON_H_MOE, write_draft, write_target

pytestmark = pytest.mark.llama

REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["def fibonacci(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n",
           "The lighthouse keeper climbed the stairs at dusk, as he had done every evening for thirty years, and"]
#: One thread: with two, the trunk's and the MTP context's thread pools wait on each other on a busy 2-core machine
#: (2-4 tokens/s with MTP instead of hundreds).
SERVER_FLAGS = ["-t", "1", "-c", "1024", "-np", "1"]


def gguf_mtp_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gguf_mtp", *args]


def run_bench(*args: str, timeout: float = 600, tmpdir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if tmpdir is not None:  # where the server logs go
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(gguf_mtp_cmd("bench", *args), capture_output=True, text=True, env=env, timeout=timeout)


def server_pids(stderr: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"llama-server pid (\d+) on 127\.0\.0\.1", stderr)]


def servers_running(binary: Path) -> list[int]:
    """Every live process running ``binary`` (psutil-free: /proc; other users of the binary may be among them)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "exe") == str(binary.resolve()) and pid_alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """glm4moe: trunk (test tokenizer), composite, MTP-only sidecar; a nemotron_h_moe composite; a prompts file."""
    root = tmp_path_factory.mktemp("bench-server")
    trunk = with_test_tokenizer(write_target(root / "raw", family=GLM4MOE, name="glm"), root / "glm-trunk.gguf")
    draft = write_draft(root / "glm-draft.gguf", family=GLM4MOE, block="N", quant="Q8_0")
    composite = compose(trunk, draft, root / "composite", progress=False).output_paths[0]
    sidecar = root / "mtp-glm.gguf"
    extract(composite, sidecar, standalone=True, progress=False)
    nemotron = with_test_tokenizer(write_target(root / "raw-nem", family=NEMOTRON_H_MOE, pattern="M*E", name="nem"),
                                   root / "nem-trunk.gguf")
    nem_draft = write_draft(root / "nem-draft.gguf", block="N", trunk_pattern="M*E")
    nem_composite = compose(nemotron, nem_draft, root / "nem-composite", progress=False).output_paths[0]
    prompts = root / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    return {"trunk": trunk, "composite": Path(composite), "sidecar": sidecar, "nemotron": Path(nem_composite),
            "prompts": prompts}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics_counts(text: str) -> dict[str, object]:
    """The verification steps and the accepted tokens by position in llama-server's /metrics (read here by a
    regular expression of the test's own, not bench's parser)."""
    drafts = re.search(r"^llamacpp:spec_decode_num_drafts_total (\d+)$", text, re.MULTILINE)
    positions = re.findall(r'^llamacpp:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\} (\d+)$',
                           text, re.MULTILINE)
    return {"drafts": int(drafts.group(1)) if drafts else None,
            "accepted_by_position": [int(v) for _, v in sorted(positions, key=lambda p: int(p[0]))] or None}


def ask_server_directly(server: Path, model: Path, spec: list[str], tokens: int) -> dict[str, object]:
    """Start llama-server by hand, send every prompt as bench does, and sum what its timings say (and, for an MTP
    run, what its /metrics count by draft position)."""
    port = free_port()
    proc = subprocess.Popen([str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *spec,
                             *SERVER_FLAGS, "--metrics"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if json.load(r).get("status") == "ok":
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.2)
        totals = {"predicted_n": 0, "draft_n": 0, "draft_n_accepted": 0}
        texts = []
        for prompt in PROMPTS:
            body = {"prompt": prompt, "n_predict": tokens, "temperature": 0.0, "seed": 42, "cache_prompt": False,
                    "return_tokens": True}
            request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as r:
                answer = json.load(r)
            for key in totals:
                totals[key] += answer["timings"].get(key, 0)
            texts.append(answer["content"])
        totals["text_sha256"] = hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()
        if spec:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=300) as r:
                totals.update(metrics_counts(r.read().decode()))
        return totals
    finally:
        proc.terminate()
        proc.wait(timeout=30)


COUNTS = ("predicted_n", "draft_n", "draft_n_accepted", "text_sha256")
POSITIONS = ("drafts", "accepted_by_position")


def test_counts_are_what_llama_server_returns(llama_server_tool: Path, tiny: dict[str, Path], tmp_path: Path) -> None:
    plot = tmp_path / "bench.png"
    logs = tmp_path / "logs"
    logs.mkdir()
    proc = run_bench(str(tiny["composite"]), "--server", str(llama_server_tool), "--n-max", "1,2", "--tokens", "8",
                     "--prompts", str(tiny["prompts"]), "--json", "--plot", str(plot), "--", *SERVER_FLAGS,
                     tmpdir=logs)
    assert proc.returncode == 0, proc.stderr
    assert list(logs.iterdir()) == []  # the logs of clean runs are removed
    report = json.loads(proc.stdout)
    assert report["lossless"] is True and report["recommended_n_max"] in (0, 1, 2)
    runs = {r["n_max"]: r for r in report["runs"]}
    assert sorted(runs) == [0, 1, 2]
    assert runs[0]["draft_n"] == 0 and runs[0]["acceptance"] is None  # no draft_* fields without MTP
    assert runs[1]["draft_n"] > 0 and runs[2]["draft_n"] > 0  # the head drafted
    assert all(r["predicted_n"] == 2 * 8 for r in runs.values())
    assert len({r["text_sha256"] for r in runs.values()}) == 1
    for n_max, spec in ((0, []), (2, ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"])):
        direct = ask_server_directly(llama_server_tool, tiny["composite"], spec, tokens=8)
        keys = COUNTS + (POSITIONS if n_max else ())
        assert {k: runs[n_max][k] for k in keys} == direct
    # per-position acceptance (llama-server --metrics): one count per draft position, summing to the accepted tokens
    assert runs[0]["accepted_by_position"] is None and runs[0]["by_position"] is None
    for n_max in (1, 2):
        by_position = runs[n_max]["accepted_by_position"]
        assert len(by_position) == n_max and sum(by_position) == runs[n_max]["draft_n_accepted"]
        assert runs[n_max]["drafts"] > 0 and runs[n_max]["by_position"] == [
            round(a / runs[n_max]["drafts"], 4) for a in by_position]
    pids = server_pids(proc.stderr)
    assert len(pids) == 3 and not any(pid_alive(pid) for pid in pids)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = tmp_path / "bench.json"
    saved.write_text(proc.stdout)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    card = subprocess.run(gguf_mtp_cmd("publish", str(tiny["composite"].parent), "--repo", "me/tiny-glm", "--dry-run",
                                       "--bench-json", str(saved)), capture_output=True, text=True, env=env)
    assert card.returncode == 0, card.stderr
    row = runs[1]
    assert f"| 1 | {row['acceptance']:.2f} ({row['draft_n_accepted']}/{row['draft_n']}) | " in card.stdout


def test_trunk_and_sidecar(llama_server_tool: Path, tiny: dict[str, Path]) -> None:
    """The trunk with the MTP-only sidecar (--spec-draft-model) drafts exactly as the composite does."""
    common = ["--server", str(llama_server_tool), "--n-max", "1", "--tokens", "8", "--prompts", str(tiny["prompts"]),
              "--json", "-q", "--", *SERVER_FLAGS]
    pair = run_bench(str(tiny["trunk"]), "--draft", str(tiny["sidecar"]), *common)
    assert pair.returncode == 0, pair.stderr
    whole = run_bench(str(tiny["composite"]), *common)
    assert whole.returncode == 0, whole.stderr
    pair_runs, whole_runs = json.loads(pair.stdout)["runs"], json.loads(whole.stdout)["runs"]
    assert json.loads(pair.stdout)["lossless"] is True and pair_runs[1]["draft_n"] > 0
    assert [{k: r[k] for k in COUNTS} for r in pair_runs] == [{k: r[k] for k in COUNTS} for r in whole_runs]


def test_text_report(llama_server_tool: Path, tiny: dict[str, Path]) -> None:
    proc = run_bench(str(tiny["composite"]), "--server", str(llama_server_tool), "--n-max", "1", "--tokens", "4",
                     "--prompts", str(tiny["prompts"]), "--", *SERVER_FLAGS)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["n-max", "acceptance", "tokens/s", "speed-up", "tokens"]
    assert lines[2].startswith("0 (no MTP)") and lines[3].startswith("1 ")
    assert re.fullmatch(r"n-max 1: acceptance by draft position \d\.\d\d \(of \d+ drafts, llama-server --metrics\)",
                        lines[4]), lines[4]
    assert lines[5].startswith("lossless: every MTP run generated exactly the tokens of the run without MTP")
    assert lines[6].startswith("recommended: ")
    # the user's -t stands; one line per server started, per prompt answered, per run
    steps = [line.split(":")[0] for line in proc.stderr.splitlines()]
    assert steps == ["threads"] + ["run 1/2"] * 4 + ["run 2/2"] * 4, proc.stderr
    assert re.search(r"^run 2/2: MTP n-max 1: prompt 2/2 \(prompt 2\): 4 tokens in \d+\.\d\d s \(\d+\.\d tokens/s\), "
                     r"\d+/\d+ drafted tokens accepted$", proc.stderr, re.MULTILINE), proc.stderr


def test_mtp_output_that_differs_fails(llama_server_tool: Path, tiny: dict[str, Path], tmp_path: Path) -> None:
    """The tiny hybrid (Mamba-2 + attention + MoE) nemotron_h_moe composite: with this llama.cpp's draft-mtp on 2
    threads the greedy tokens leave those of the run without MTP after a long prompt (not on 1 thread, not after
    the short prompts above: batched verification computes a little differently, and a random model's recurrent
    state carries the difference to a near tie): exit 2, one line."""
    prose = tmp_path / "prose.json"  # the built-in prose prompt (~400 tokens): the short ones stay identical
    prose.write_text(json.dumps([builtin_prompts()[1].text]))
    proc = run_bench(str(tiny["nemotron"]), "--server", str(llama_server_tool), "--n-max", "1", "--tokens", "16",
                     "--prompts", str(prose), "--json", "--", "-t", "2", "-c", "1024", "-np", "1")
    assert proc.returncode == 2, proc.stderr
    report = json.loads(proc.stdout)
    assert report["lossless"] is False and report["recommended_n_max"] is None
    runs = report["runs"]
    assert runs[0]["text_sha256"] != runs[1]["text_sha256"]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"gguf-mtp: error: .*nem-trunk\.gguf: not lossless: with MTP \(n-max 1\) prompt 1 differs "
                        r"from the run without MTP at token \d+; greedy output with MTP must equal the output "
                        r"without it", last), last
    assert "Traceback" not in proc.stderr


def test_a_damaged_head_cannot_change_the_output(llama_server_tool: Path, tiny: dict[str, Path],
                                                 tmp_path: Path) -> None:
    """A wrong eh_proj (every Q8_0 scale negated) in a copy: llama.cpp's trunk verifies every drafted token, so
    greedy output stays that of the run without MTP; a broken head can only lose acceptance, never tokens."""
    damaged = tmp_path / "damaged.gguf"
    shutil.copyfile(tiny["composite"], damaged)
    header = read_header(damaged)
    tensor = next(t for t in header.tensors if t.name.endswith("nextn.eh_proj.weight"))
    with open(damaged, "r+b") as f:
        f.seek(header.data_offset + tensor.offset)
        data = bytearray(f.read(34 * (tensor.shape[0] * tensor.shape[1] // 32)))
        for block in range(0, len(data), 34):
            data[block + 1] ^= 0x80  # the fp16 scale's sign bit
        f.seek(header.data_offset + tensor.offset)
        f.write(data)
    proc = run_bench(str(damaged), "--server", str(llama_server_tool), "--n-max", "1", "--tokens", "8",
                     "--prompts", str(tiny["prompts"]), "--json", "-q", "--", *SERVER_FLAGS)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["lossless"] is True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_server_left_after_an_interrupt(llama_server_tool: Path, tiny: dict[str, Path], signum: int,
                                           tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    cmd = gguf_mtp_cmd("bench", str(tiny["composite"]), "--server", str(llama_server_tool), "--n-max", "1,2",
                       "--tokens", "256", "--prompts", str(tiny["prompts"]), "--", *SERVER_FLAGS)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen = ""
    try:
        deadline = time.monotonic() + 300
        assert proc.stderr is not None
        while "run 2/3: MTP n-max 1: llama-server pid" not in seen:  # run 1 finished, run 2's server started
            assert time.monotonic() < deadline and proc.poll() is None, seen
            if select.select([proc.stderr], [], [], 1.0)[0]:
                seen += proc.stderr.readline()
        pids = server_pids(seen)
        proc.send_signal(signum)  # run 2's server is loading: mid-run (a finished run would exit 0 and fail here)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if signum == signal.SIGKILL:  # no clean-up can run: the kernel kills the server with us (PR_SET_PDEATHSIG)
        assert proc.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while pid_alive(pids[1]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids)
        return
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "gguf-mtp: interrupted; no output was left behind"
    assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids)
    assert not set(pids) & set(servers_running(llama_server_tool))
    assert list(tmp_path.glob("gguf-mtp-bench-*.log")) == []  # interrupted is not failed: no log kept


def test_prompt_and_tokens_must_fit_the_servers_context(llama_server_tool: Path, tiny: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """-c 64 (llama.cpp pads it to 256) is below the model's 4096: llama-server's own n_ctx per slot (/props) and
    its token count (/tokenize) decide, before any request that would stop short."""
    proc = run_bench(str(tiny["composite"]), "--server", str(llama_server_tool), "--n-max", "2", "--tokens", "300",
                     "--prompts", str(tiny["prompts"]), "--", "-t", "1", "-c", "64", "-np", "1", tmpdir=tmp_path)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert re.search(r": --tokens 300 \+ n-max 2 \+ prompt 1 \(\d+ prompt tokens\) need a context of \d+, the server "
                     r"has (64|256) per slot: generate fewer, or raise -c after --$", last), last
    assert len(server_pids(proc.stderr)) == 1  # refused in the first run, before any generation
    assert list(tmp_path.iterdir()) == []  # not the server's failure: its log is not kept
    assert not any(pid_alive(pid) for pid in server_pids(proc.stderr))


def test_bench_chooses_the_threads_when_none_are_given(llama_server_tool: Path, tiny: dict[str, Path]) -> None:
    """Issue 29 item 14: without -t, each pool gets half the free cores (on a busy 2-core machine, 1 each), the
    server takes the flags and the run stays lossless."""
    proc = run_bench(str(tiny["trunk"]), "--draft", str(tiny["sidecar"]), "--server", str(llama_server_tool),
                     "--n-max", "1", "--tokens", "4", "--prompts", str(tiny["prompts"]), "--json", "--", "-c", "1024",
                     "-np", "1")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    n = report["threads"][1]
    assert report["threads"] == ["-t", n, "-td", n] and 1 <= int(n) <= max(1, len(os.sched_getaffinity(0)) // 2)
    assert report["lossless"] is True and "warning" not in proc.stderr


#: Every spelling llama-server's --help gives of an option bench sets itself (issue 29 item 7).
OWNED = ["-m", "--model", "-mu", "--model-url", "-dr", "--docker-repo", "-hf", "-hfr", "--hf-repo", "-hff",
         "--hf-file", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf", "--host", "--port", "--api-prefix",
         "--spec-type", "--spec-draft-n-max", "--spec-draft-model", "-md", "--model-draft", "--fim-qwen-7b-spec"]


def test_reserved_flags_from_the_real_help(llama_server_tool: Path) -> None:
    from gguf_mtp.llama_server import probe_server
    from gguf_mtp.server.options import ServerOptions

    text = probe_server(str(llama_server_tool))
    recorded = (REPO / "tests" / "support" / "llama_server_help.txt").read_text()
    entries = re.split(r"\n(?=-)", recorded.strip("\n"))
    assert len(entries) == 17 and all(entry + "\n" in text for entry in entries)  # the unit tests' help is real
    options = ServerOptions.from_help(text)
    assert set(OWNED) <= options.reserved
    assert {"-t", "--threads"} <= options.trunk_threads and {"-td", "--threads-draft"} <= options.draft_threads
    assert options.metrics and {"LLAMA_ARG_MODEL_URL", "LLAMA_ARG_HF_REPO"} <= options.reserved_env
    assert not {"-ngl", "-c", "-np", "-t", "--spec-draft-p-min"} & options.reserved


@pytest.mark.parametrize("flag", ["-hfr", "-mu", "--model-url=http://127.0.0.1:9/x.gguf", "-dr", "--docker-repo",
                                  "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf", "-m"])
def test_every_spelling_is_refused_before_a_server_starts(llama_server_tool: Path, tiny: dict[str, Path],
                                                          flag: str) -> None:
    proc = run_bench(str(tiny["composite"]), "--server", str(llama_server_tool), "--n-max", "1", "--tokens", "4",
                     "--", "-t", "1", flag, "me/model")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"gguf-mtp: error: server_args: {flag.split('=')[0]} is set by bench itself (the model and where it comes "
        "from, the loopback address, the MTP settings)"]
