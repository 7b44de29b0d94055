"""``gguf-mtp bench`` against hostile stand-ins for llama-server on the loopback: a peer that trickles its answer a
byte at a time, nests its JSON 200,000 deep, or counts beyond any integer. Every wait ends at its deadline (for the
whole answer, not each read), every answer goes through the bounded JSON reader, every count is bounded: one line,
exit 2, never a traceback or a hang. Also the per-position acceptance read from ``/metrics``.

The deadline tests count bytes and clock readings, not wall time: the clock bench reads is replaced by one that
advances a second per reading, while the stand-in trickles as fast as the machine lets it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import pid_alive

from gguf_mtp.errors import LlamaServerError
from gguf_mtp.model.drafting import MAX_COUNT
from gguf_mtp.server import process as llama_server
from gguf_mtp.server.bench_rules import PositionCounts, parse_completion, parse_metrics
from gguf_mtp.server.process import ServerHandle

REPO = Path(__file__).resolve().parent.parent


# --- an in-process stand-in: a socket that answers one request in a chosen way ------------------------------------


class Trickle:
    """A loopback peer that reads a request, then sends ``answer`` one byte at a time (``pause`` s apart; all at once
    without a pause) until the client hangs up; ``sent`` counts the bytes that went out."""

    def __init__(self, answer: bytes, pause: float = 0.0) -> None:
        self.answer, self.pause, self.sent = answer, pause, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.recv(65536)
            try:
                if not self.pause:
                    conn.sendall(self.answer)
                    self.sent = len(self.answer)
                    return
                for byte in self.answer:
                    conn.sendall(bytes([byte]))
                    self.sent += 1
                    time.sleep(self.pause)
            except OSError:  # the client gave up: what we wanted
                return

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=30)


@pytest.fixture
def handle(tmp_path: Path) -> Iterator[ServerHandle]:
    """A ServerHandle whose "process" is a sleeper (the HTTP side is the stand-in's)."""
    process = subprocess.Popen(["sleep", "600"])
    log = tmp_path / "server.log"
    log.write_text("stand-in\n")
    try:
        yield ServerHandle(process, 0, log, "stand-in-server")
    finally:
        process.kill()
        process.wait()


class TickingClock:
    """``time.monotonic`` for llama_server only: one second passes per reading, whatever the machine does."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.readings = 0

    def monotonic(self) -> float:
        self.readings += 1
        self.now += 1.0
        return self.now


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> TickingClock:
    clock = TickingClock()
    fake_time = types.SimpleNamespace(monotonic=clock.monotonic, sleep=lambda s: None)
    monkeypatch.setattr(llama_server, "time", fake_time)
    return clock


#: A header that never ends: sent a byte a millisecond, it would take 100 s.
ENDLESS_HEADER = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 100_000
TRICKLE_PAUSE = 0.001


def test_a_trickled_answer_ends_at_its_deadline(handle: ServerHandle, ticking: TickingClock) -> None:
    """Item 5: each read gets only the time left, so a peer that keeps sending never extends the wait. With a
    second per clock reading and a 5-second deadline the client stops after a handful of reads (before: it read
    all 100,000 bytes, each read well within the socket timeout)."""
    peer = Trickle(ENDLESS_HEADER, TRICKLE_PAUSE)
    handle.port = peer.port
    try:
        with pytest.raises(TimeoutError):
            handle.request("GET", "/completion", timeout=5.0)
    finally:
        peer.close()
    assert ticking.readings < 12 and peer.sent < len(ENDLESS_HEADER) // 10


def test_the_health_wait_ends_at_its_deadline(handle: ServerHandle, ticking: TickingClock) -> None:
    """Item 5, the wait for /health: a probe is cut at the time left, and the wait at its deadline (each probe
    was 5 s of socket timeout per read before, the wait unbounded while the peer kept sending)."""
    peer = Trickle(ENDLESS_HEADER, TRICKLE_PAUSE)
    handle.port = peer.port
    try:
        with pytest.raises(LlamaServerError, match=r"^stand-in-server: test server did not become healthy on "
                                                   r"127\.0\.0\.1:\d+ within 10 s \(health_timeout\); log: "):
            llama_server._wait_healthy(handle, 10.0, "test server")
    finally:
        peer.close()
    assert ticking.readings < 40 and peer.sent < len(ENDLESS_HEADER) // 10


@pytest.mark.slow
def test_a_trickled_completion_fails_in_one_line(handle: ServerHandle, ticking: TickingClock) -> None:
    peer = Trickle(ENDLESS_HEADER, TRICKLE_PAUSE)
    handle.port = peer.port
    try:
        with pytest.raises(LlamaServerError,
                           match=r"^stand-in-server: /completion: no complete answer within 3600 s; log: "):
            handle.post_json("/completion", {"prompt": "x"}, timeout=3600.0)
    finally:
        peer.close()
    assert ticking.readings < 3610


def test_a_trickled_metrics_answer_ends_too(handle: ServerHandle, ticking: TickingClock) -> None:
    peer = Trickle(ENDLESS_HEADER, TRICKLE_PAUSE)
    handle.port = peer.port
    try:
        with pytest.raises(LlamaServerError, match=r"^stand-in-server: /metrics: no complete answer within 60 s"):
            handle.get_text("/metrics", timeout=60.0)
    finally:
        peer.close()
    assert ticking.readings < 70


def http_answer(body: bytes, status: str = "200 OK") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def test_a_whole_answer_within_the_deadline_is_read(handle: ServerHandle) -> None:
    peer = Trickle(http_answer(b'{"status": "ok"}'))
    handle.port = peer.port
    try:
        assert handle.get_json("/health", timeout=60.0) == {"status": "ok"}
    finally:
        peer.close()


DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("path", ["/props", "/completion"])
def test_deeply_nested_answers_are_one_line(handle: ServerHandle, path: str) -> None:
    """Item 9: the bounded reader, not json.loads (RecursionError)."""
    peer = Trickle(http_answer(DEEP))
    handle.port = peer.port
    try:
        with pytest.raises(LlamaServerError,
                           match=rf"^stand-in-server: {path} answered: JSON nested more than 64 levels deep"):
            handle.get_json(path, timeout=60.0)
    finally:
        peer.close()


def test_a_huge_number_in_an_answer_is_one_line(handle: ServerHandle) -> None:
    """Item 10, at the reader: 10**400 never becomes a Python int."""
    body = b'{"content": "x", "timings": {"predicted_n": 1' + b"0" * 400 + b', "predicted_ms": 1.0}}'
    peer = Trickle(http_answer(body))
    handle.port = peer.port
    try:
        with pytest.raises(LlamaServerError, match=r"timings\.predicted_n = 1000.*not a finite number"):
            handle.post_json("/completion", {}, timeout=60.0)
    finally:
        peer.close()


@pytest.mark.parametrize("key, value", [("predicted_n", 10**400), ("predicted_n", MAX_COUNT + 1),
                                        ("draft_n", 2**64), ("draft_n_accepted", 10**30)],
                         ids=["10**400", "MAX_COUNT+1", "2**64", "10**30"])
def test_every_count_is_bounded(key: str, value: int) -> None:
    """Item 10, in the rules: a count beyond any run is refused before any arithmetic (no OverflowError)."""
    timings = {"predicted_n": 4, "predicted_ms": 2.0, "draft_n": 4, "draft_n_accepted": 1, key: value}
    with pytest.raises(LlamaServerError, match=rf"timings\.{key} = .*not a count"):
        parse_completion({"content": "x", "timings": timings})


@pytest.mark.parametrize("ms", [1e-300, 1e300, 5e-324])
def test_durations_are_bounded(ms: float) -> None:
    """A duration that would make tokens/s infinite (or absurd) is refused."""
    with pytest.raises(LlamaServerError, match="predicted_ms"):
        parse_completion({"content": "x", "timings": {"predicted_n": 4, "predicted_ms": ms}})


# --- /metrics ------------------------------------------------------------------------------------------------------

#: The tail of llama-server's /metrics in server_task_result_metrics::to_metrics's format (doubles in C++'s default
#: stream format; the per-position counter as integers).
METRICS = """\
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 48
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 30
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 16
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 14
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 10
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 6
"""


def test_metrics_give_acceptance_by_position() -> None:
    counts = parse_metrics(METRICS.encode())
    assert counts == PositionCounts(16, (14, 10, 6))
    assert counts is not None and counts.rates == (14 / 16, 10 / 16, 6 / 16)
    assert counts.to_dict() == {"drafts": 16, "accepted_by_position": [14, 10, 6],
                                "by_position": [0.875, 0.625, 0.375]}
    big = METRICS.replace("verification steps\n# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
                          "llamacpp:spec_decode_num_drafts_total 16",
                          "verification steps\n# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
                          "llamacpp:spec_decode_num_drafts_total 1.23457e+06")
    assert parse_metrics(big.encode()) == PositionCounts(1234570, (14, 10, 6))
    without = "\n".join(line for line in METRICS.splitlines() if "per_pos" not in line)
    assert parse_metrics(without.encode()) is None  # an older server: no per-position counter


@pytest.mark.parametrize("change, match", [
    (("} 14", "} 1" + "0" * 400), "not a count"),
    (("drafts_total 16", "drafts_total 1e400"), "not a count"),
    (("drafts_total 16", "drafts_total nan"), "not a count"),
    (("drafts_total 16", "drafts_total -3"), "not a count"),
    (('position="1"', 'position="7"'), "not 0, 1"),
    (("} 10", "} 15"), "impossible"),
    (("drafts_total 16", "drafts_total 9"), "impossible"),
])
def test_metrics_refuse_what_llama_server_never_counts(change: tuple[str, str], match: str) -> None:
    with pytest.raises(LlamaServerError, match=match):
        parse_metrics(METRICS.replace(*change).encode())
    with pytest.raises(LlamaServerError, match="lines"):
        parse_metrics(b"x 1\n" * 5000)


# --- the whole command against hostile stand-in llama-servers ----------------------------------------------------

STANDIN = '''#!PYTHON
"""A stand-in llama-server (its --help in llama.cpp's layout); FAKE_MODE makes it hostile."""
import json, os, socket, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

argv = sys.argv[1:]
mode = os.environ.get("FAKE_MODE", "")
if argv == ["--help"]:
    print("-m,    --model FNAME                    model path to load")
    print("--host HOST                             ip address to listen")
    print("--port PORT                             port to listen (default: 8080)")
    print("--metrics                               enable prometheus compatible metrics endpoint")
    print("--spec-type none,draft-simple,draft-mtp")
    print("                                        the types of speculative decoding")
    sys.exit(0)
port = int(argv[argv.index("--port") + 1])
n_max = int(argv[argv.index("--spec-draft-n-max") + 1]) if "--spec-type" in argv else 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def trickle(self):
        self.wfile.write(b"HTTP/1.1 200 OK\\r\\n")
        self.wfile.flush()
        for _ in range(600):
            self.wfile.write(b"X")
            self.wfile.flush()
            time.sleep(0.5)

    def do_GET(self):
        if self.path == "/health":
            if mode == "trickle-health":
                self.trickle()
            elif mode == "deep-health":
                self.answer(b"[" * 200000 + b"]" * 200000)
            else:
                self.answer(b'{"status": "ok"}')
        elif self.path == "/metrics":
            drafts = 5 * n_max
            lines = [f"llamacpp:spec_decode_num_drafts_total {drafts}"]
            lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {drafts - i}'
                      for i in range(n_max)]
            self.answer("\\n".join(lines).encode())
        else:
            self.answer(json.dumps({"default_generation_settings": {"n_ctx": 4096}}).encode())

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self.answer(json.dumps({"tokens": [1, 2, 3]}).encode())
            return
        n = request["n_predict"]
        if mode == "huge-count":
            self.answer(b'{"content": "x", "tokens": [1], "timings": {"predicted_n": 1' + b"0" * 400
                        + b', "predicted_ms": 1.0}}')
            return
        timings = {"predicted_n": n, "predicted_ms": 100.0}
        if n_max:
            timings.update(draft_n=n * n_max, draft_n_accepted=n)
        self.answer(json.dumps({"content": "abc", "tokens": list(range(n)), "timings": timings}).encode())


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(STANDIN.replace("PYTHON", sys.executable))
    script.chmod(0o755)
    return script


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, glm_converted3: Path) -> tuple[Path, Path]:
    from gguf_mtp.testing.server_models import with_test_tokenizer
    from gguf_mtp.testing.tiny_models import GLM4MOE, write_target

    folder = tmp_path_factory.mktemp("bench-peer")
    trunk = with_test_tokenizer(write_target(folder / "raw", family=GLM4MOE, name="glm"), folder / "glm-trunk.gguf")
    return trunk, glm_converted3


def bench_cmd(pair: tuple[Path, Path], server: Path, mode: str, *args: str,
              timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], float]:
    env = dict(os.environ, PYTHONPATH=str(REPO), FAKE_MODE=mode)
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gguf_mtp", "bench", str(pair[0]), "--draft", str(pair[1]),
                           "--server", str(server), "--tokens", "4", "--n-max", "1", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)
    return proc, time.monotonic() - began


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_health_timeout_holds_against_a_trickling_server(pair: tuple[Path, Path], standin: Path) -> None:
    """Item 5 end to end: /health trickles a byte every 0.5 s for 5 minutes; --health-timeout 2 ends the wait
    (before: each probe lasted as long as the trickle). The bound leaves a busy machine a minute for Python's
    start-up and the model checks; the trickle alone would take five."""
    proc, seconds = bench_cmd(pair, standin, "trickle-health", "--health-timeout", "2")
    line = last_line(proc)
    assert "llama-server (without MTP) did not become healthy on 127.0.0.1:" in line
    assert "within 2 s (--health-timeout)" in line
    assert seconds < 2 + 60
    pids = [int(p) for p in __import__("re").findall(r"llama-server pid (\d+)", proc.stderr)]
    assert len(pids) == 1 and not pid_alive(pids[0])
    Path(line.rsplit("log: ", 1)[1]).unlink()


def test_a_deeply_nested_health_answer_is_one_line(pair: tuple[Path, Path], standin: Path) -> None:
    """Item 9 end to end."""
    line = last_line(bench_cmd(pair, standin, "deep-health")[0])
    assert "/health answered: JSON nested more than 64 levels deep" in line
    Path(line.rsplit("log: ", 1)[1]).unlink()


def test_a_count_beyond_any_integer_is_one_line(pair: tuple[Path, Path], standin: Path) -> None:
    """Item 10 end to end."""
    line = last_line(bench_cmd(pair, standin, "huge-count")[0])
    assert "/completion answered: timings.predicted_n = 1000" in line and "not a finite number" in line
    Path(line.rsplit("log: ", 1)[1]).unlink()


@pytest.mark.slow
def test_per_position_acceptance_from_metrics(pair: tuple[Path, Path], standin: Path) -> None:
    """Issue 30 item 5: the server's --help lists --metrics, so bench asks for it and reads the per-position
    counters after each MTP run; --json carries them, the text report shows them; the run without MTP has none."""
    proc, _ = bench_cmd(pair, standin, "", "--n-max", "1,2", "--json")
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout)["runs"]
    assert [(r["n_max"], r["drafts"], r["accepted_by_position"], r["by_position"]) for r in runs] == [
        (0, None, None, None), (1, 5, [5], [1.0]), (2, 10, [10, 9], [1.0, 0.9])]
    text, _ = bench_cmd(pair, standin, "", "--n-max", "2")
    assert text.returncode == 0, text.stderr
    assert "n-max 2: acceptance by draft position 1.00, 0.90 (of 10 drafts, llama-server --metrics)" in text.stdout


def test_a_servers_log_tail_and_accepts_are_the_last_non_empty_lines_of_the_last_64_kib(tmp_path: Path) -> None:
    import tempfile

    from gguf_mtp.llama_build import LOG_TAIL_BYTES, LOG_TAIL_LINES, last_lines, read_log_end
    from gguf_mtp.server.process import log_tail

    lines = [f"line {i}" for i in range(10_000)]
    text = "\n\n".join(lines) + "\n"  # blank lines between: never shown
    log = tmp_path / "llama-server.log"
    log.write_text(text)
    with tempfile.TemporaryFile() as child_log:  # accept's child writes its log to such a file
        child_log.write(text.encode())
        end = read_log_end(child_log)
    assert end == text[-LOG_TAIL_BYTES:]
    assert log_tail(log) == last_lines(end) == tuple(lines[-LOG_TAIL_LINES:]) and LOG_TAIL_LINES == 12
