"""A Hub that cannot be reached, with every supported huggingface_hub line (issue 21 item 8).

Real unreachable endpoints, never stand-ins: a loopback port that was bound and closed (connection
refused) and a name under ``.invalid`` (RFC 6761: it never resolves). Each command prints one error line
naming the host and the cause and exits 2 -- whether huggingface_hub's transport is requests (0.x),
httpx (1.x) or httpx2 (2.x). While huggingface_hub backs off and retries, one line says so.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import huggingface_hub.constants
import huggingface_hub.utils
import pytest
from support.helpers import LoopbackServer

from gguf_mtp.errors import HubError, HubUnreachableError
from gguf_mtp.hub import client
from gguf_mtp.hub import errors as hub_errors
from gguf_mtp.testing.tiny_models import write_draft

pytestmark = pytest.mark.slow  # the CLI in child processes against dead and refusing hosts

ROOT = Path(__file__).resolve().parent.parent
HF_JOB = ROOT / "scripts" / "hf_job.py"
UNRESOLVABLE_HOST = "gguf-mtp-test.invalid"
HUB_MAJOR = int(huggingface_hub.__version__.split(".")[0])
RETRY_LINE = "the Hub did not answer"


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["refused", "unresolvable"])
def unreachable(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    """(HF_ENDPOINT, the host the message names, the cause it gives)."""
    if request.param == "refused":
        port = closed_port()
        return f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", f"connection refused by 127.0.0.1:{port}"
    return f"http://{UNRESOLVABLE_HOST}", UNRESOLVABLE_HOST, f"cannot resolve the host name {UNRESOLVABLE_HOST} ("


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_draft(tmp_path_factory.mktemp("net") / "Tiny-draft.gguf", block="N", with_globals=True)


def run(endpoint: str, tmp_path: Path, *argv: str, script: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_TOKEN": "hf_test_token",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "GGUF_MTP_DISABLE_PROGRESS": "1",
        "GGUF_MTP_PACKAGE": "gguf-mtp[llama] @ git+https://example.com/o/gguf-mtp",
    }
    command = [sys.executable, str(script)] if script else [sys.executable, "-m", "gguf_mtp"]
    return subprocess.run([*command, *argv], capture_output=True, text=True, env=env, timeout=300)


def error_line(proc: subprocess.CompletedProcess[str], prefix: str = "gguf-mtp: error: ") -> str:
    """The one error line; the only other lines allowed are the pipeline's stage lines and one retry line."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if line.startswith(prefix)]
    assert len(errors) == 1, proc.stderr
    others = [line for line in lines if line not in errors and not line.startswith("[0/5]")]
    assert len(others) <= 1 and all(RETRY_LINE in line for line in others), proc.stderr
    return errors[0]


def assert_names(line: str, host: str, cause: str) -> None:
    assert f": {cause}" in line and host in cause, line
    assert line.endswith("; check the network, a proxy, or HF_ENDPOINT"), line


def test_publish_with_a_token(unreachable: tuple[str, str, str], sidecar: Path, tmp_path: Path) -> None:
    endpoint, host, cause = unreachable
    proc = run(endpoint, tmp_path, "publish", str(sidecar), "--standalone", "--repo", "me/Tiny-MTP")
    assert proc.stderr.count("\n") == 1  # exactly one line: whoami is not retried
    assert_names(error_line(proc), host, cause)


def test_pipeline_with_out_repo_leaves_no_work_folder(unreachable: tuple[str, str, str], tmp_path: Path) -> None:
    endpoint, host, cause = unreachable
    work = tmp_path / "new" / "parents" / "work"
    proc = run(endpoint, tmp_path, "pipeline", "--target-repo", "o/t", "--target-files", "t.gguf",
               "--head-repo", "o/h", "--out-repo", "me/out", "--work-dir", str(work))
    assert_names(error_line(proc), host, cause)
    assert not (tmp_path / "new").exists()  # issue 21 item 14: a failed start leaves nothing behind


def test_pipeline_pinning_the_target(tmp_path: Path) -> None:
    """No --out-repo: the first call pins the target repo's revision to its commit (issue 39's provenance), before
    any listing or byte (huggingface_hub 2.x retries it with back-off)."""
    port = closed_port()
    work = tmp_path / "work"
    proc = run(f"http://127.0.0.1:{port}", tmp_path, "pipeline", "--target-repo", "o/t", "--target-files",
               "t.gguf", "--head-repo", "o/h", "--work-dir", str(work))
    line = error_line(proc)
    assert_names(line, f"127.0.0.1:{port}", f"connection refused by 127.0.0.1:{port}")
    assert line.startswith("gguf-mtp: error: cannot look up the commit of o/t: ")
    assert not work.exists()


def test_inspect_a_hub_file(unreachable: tuple[str, str, str], tmp_path: Path) -> None:
    endpoint, host, cause = unreachable
    proc = run(endpoint, tmp_path, "inspect", "hf://o/t/t.gguf")
    assert proc.stderr.count("\n") == 1
    assert_names(error_line(proc), host, cause)


def test_convert_from_a_repo_id(unreachable: tuple[str, str, str], tmp_path: Path) -> None:
    endpoint, host, cause = unreachable
    proc = run(endpoint, tmp_path, "convert", "o/head", "-o", str(tmp_path / "draft.gguf"))
    line = error_line(proc)
    assert_names(line, host, cause)
    assert line.startswith("gguf-mtp: error: cannot download config.json from o/head: ")
    assert not (tmp_path / "draft.gguf").exists()


def test_hf_job_submit(unreachable: tuple[str, str, str], tmp_path: Path) -> None:
    endpoint, host, cause = unreachable
    argv = ["--", "--target-repo", "o/t", "--target-files", "t.gguf", "--head-repo", "o/h", "--out-repo", "me/o"]
    proc = run(endpoint, tmp_path, "--no-mount-target", *argv, script=HF_JOB)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    if hasattr(huggingface_hub.HfApi, "run_uv_job"):
        assert_names(proc.stderr.strip(), host, cause)
        assert proc.stderr.startswith("hf_job.py: error: cannot submit the Job: ")
    else:  # huggingface_hub before 0.34 has no Jobs API
        assert "cannot submit Jobs" in proc.stderr
    # Without a mount, a dry run asks nothing of the network
    dry = run(endpoint, tmp_path, "--dry-run", "--no-mount-target", *argv, script=HF_JOB)
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    assert "package: the Job installs 'gguf-mtp[llama] @ git+https://example.com/o/gguf-mtp'" in dry.stdout
    if hasattr(huggingface_hub, "Volume"):  # with one (the default), the commit to pin it to is looked up first
        for extra in ([], ["--dry-run"]):
            mounted = run(endpoint, tmp_path, *extra, *argv, script=HF_JOB)
            line = error_line(mounted, prefix="hf_job.py: error: ")
            assert_names(line, host, cause)
            assert line.startswith("hf_job.py: error: cannot look up the target's commit: ")


@pytest.fixture(autouse=True)
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Online mode whatever ran before (huggingface_hub reads HF_HUB_OFFLINE into its constants at import)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    # huggingface_hub < 1.0 mounts an offline adapter on the (cached) session it made while offline: drop it.
    reset = getattr(huggingface_hub.utils, "reset_sessions", None)
    if callable(reset):
        reset()


# ------------------------------------------------------------------------------------------- the boundary


def test_every_transport_failure_is_one_typed_error(unreachable: tuple[str, str, str]) -> None:
    """In process, on the installed release's own exceptions (requests, httpx or httpx2 underneath)."""
    endpoint, host, cause = unreachable
    api = huggingface_hub.HfApi(endpoint=endpoint)
    with pytest.raises(HubUnreachableError) as info:
        client.check_write_access(api, "me/x", token="hf_test_token")
    error = info.value
    assert isinstance(error, HubError) and isinstance(error, OSError)
    assert error.message.startswith(f"cannot check the token: {cause}")
    assert error.message.endswith("; check the network, a proxy, or HF_ENDPOINT")
    found = hub_errors.transport_failure(error.__cause__)  # what huggingface_hub raised, translated alone
    assert found is not None and found[0] == host and found[1].startswith(cause)


def test_answers_and_bugs_are_not_transport_failures() -> None:
    from huggingface_hub.errors import HfHubHTTPError

    assert hub_errors.transport_failure(ValueError("a bug")) is None
    assert hub_errors.transport_failure(FileNotFoundError("no such file")) is None  # the file system, not the network
    response = SimpleNamespace(status_code=404, headers={}, request=None)
    answer = HfHubHTTPError("404 Client Error", response=response)  # type: ignore[arg-type]
    assert hub_errors.transport_failure(answer) is None  # under 0.x a requests.HTTPError: an answer, not a failure


# ------------------------------------------------------------------------------------------- retries


class FlakyHub:
    """A loopback server that answers ``status`` to the first ``failures`` requests, then ``[]`` to a GET and
    "repository not found" to a HEAD (a file's metadata)."""

    def __init__(self, failures: int, status: int = 503) -> None:
        hub = self
        self.remaining = failures
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def answer(self, head: bool) -> None:
                hub.requests += 1
                code = None
                if hub.remaining > 0:
                    hub.remaining -= 1
                    body, answer = b'{"error": "busy"}', status
                elif head:
                    body, answer, code = b"", 404, "RepoNotFound"
                else:
                    body, answer = b"[]", 200
                self.send_response(answer)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if code:
                    self.send_header("X-Error-Code", code)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self.answer(head=False)

            def do_HEAD(self) -> None:
                self.answer(head=True)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FlakyHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def flaky() -> Iterator[FlakyHub]:
    with FlakyHub(failures=3) as hub:
        yield hub



def test_a_retried_call_says_so_once(flaky: FlakyHub, caplog: pytest.LogCaptureFixture) -> None:
    """huggingface_hub's own back-off (every release has ``http_backoff``), through the boundary."""
    from huggingface_hub.utils import http_backoff

    caplog.set_level(logging.WARNING, logger="gguf_mtp.hub")
    with hub_errors.hub_errors("ask the test Hub", "me/x"):
        response = http_backoff("GET", flaky.url + "/api/x", base_wait_time=0.05, max_wait_time=0.1,
                                retry_on_status_codes=(503,))
    assert response.status_code == 200 and flaky.requests == 4
    notices = [r.getMessage() for r in caplog.records if r.name == "gguf_mtp.hub"]
    port = flaky.server.server_address[1]
    assert notices == [f"the Hub did not answer (127.0.0.1:{port}: HTTP Error 503); huggingface_hub is retrying "
                       "with back-off (ask the test Hub)"]
    assert not logging.getLogger("huggingface_hub.utils._http").filters  # removed after the call


@pytest.mark.skipif(HUB_MAJOR < 1, reason="huggingface_hub 0.x retries only uploads, not downloads or listings")
def test_cli_says_once_that_it_retries(tmp_path: Path) -> None:
    """A download that huggingface_hub retries (429, twice) prints one line saying so, without -v."""
    with FlakyHub(failures=2, status=429) as flaky:
        proc = run(flaky.url, tmp_path, "convert", "o/head", "-o", str(tmp_path / "draft.gguf"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    port = flaky.server.server_address[1]
    assert lines[:-1] == [
        f"WARNING: the Hub did not answer (127.0.0.1:{port}: HTTP Error 429); huggingface_hub is retrying with "
        "back-off (download config.json from o/head)"
    ], proc.stderr
    assert lines[-1].startswith("gguf-mtp: error: cannot download config.json from o/head: repository o/head not found")
    assert flaky.requests == 3


# ------------------------------------------------- no back-off where waiting cannot help (issue 29 item 18)

#: Runs the command line with ``socket.getaddrinfo`` counted: every connection attempt, by requests (0.x) or
#: httpx / httpx2 (1.x, 2.x), resolves its host first, so the count of one host's look-ups is its attempts.
COUNTING = """
import atexit, os, socket, sys
looked_up = []
real = socket.getaddrinfo
def counting(host, *args, **kwargs):
    looked_up.append(host)
    return real(host, *args, **kwargs)
socket.getaddrinfo = counting
atexit.register(lambda: open(os.environ["ATTEMPTS_FILE"], "w").write("\\n".join(map(str, looked_up))))
from gguf_mtp.cli import main
sys.exit(main(sys.argv[1:]))
"""


def attempts(endpoint: str, tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the command line against ``endpoint``: its outcome, and how many times it tried to connect there."""
    record = tmp_path / "attempts.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_TOKEN": "hf_test_token",
            "HF_HUB_DISABLE_TELEMETRY": "1", "GGUF_MTP_DISABLE_PROGRESS": "1", "ATTEMPTS_FILE": str(record)}
    proc = subprocess.run([sys.executable, "-c", COUNTING, *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    host = endpoint.split("//", 1)[1].split(":", 1)[0]
    return proc, record.read_text().split("\n").count(host)


@pytest.mark.parametrize(
    ("argv", "most"),
    [
        # huggingface_hub's hf_hub_download asks once without retries, then (nothing cached) once more with them
        (["convert", "o/head", "-o", "{tmp}/draft.gguf"], 2),
        (["pipeline", "--dry-run", "--target-repo", "o/t", "--target-files", "t.gguf", "--head-repo", "o/h",
          "--work-dir", "{tmp}/work"], 1),
        (["inspect", "hf://o/t/t.gguf"], 1),
    ],
    ids=["convert", "pipeline-dry-run", "inspect"],
)
def test_an_unknown_host_or_a_refused_connection_is_not_retried(
    unreachable: tuple[str, str, str], tmp_path: Path, argv: list[str], most: int
) -> None:
    endpoint, host, cause = unreachable
    proc, tried = attempts(endpoint, tmp_path, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert_names(error_line(proc), host, cause)
    assert RETRY_LINE not in proc.stderr  # huggingface_hub never backed off
    assert 1 <= tried <= most, (tried, proc.stderr)


def test_fails_at_once_knows_the_causes() -> None:
    import socket as sockets

    refused = ConnectionRefusedError(111, "Connection refused")
    wrapped = OSError("wrapped")
    wrapped.__cause__ = sockets.gaierror(-2, "Name or service not known")
    assert hub_errors.fails_at_once(refused) and hub_errors.fails_at_once(wrapped)
    assert not hub_errors.fails_at_once(TimeoutError("timed out"))
    assert not hub_errors.fails_at_once(ConnectionResetError(104, "Connection reset by peer"))
