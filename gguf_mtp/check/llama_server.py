"""The user's own ``llama-server``, started and always stopped: for ``gguf-mtp bench``.

:func:`probe_server` tells llama-server (recent enough for ``--spec-type draft-mtp``) from anything else by
its ``--help``. :func:`running_server` starts it on 127.0.0.1 at a free port, in its own process group, with
its output in a log file; waits for ``/health`` up to a deadline; and stops it however the block ends
(success, error, Ctrl-C, SIGTERM): SIGTERM to the group, SIGKILL after a grace period, waited for, so no
process is left and the port is free again. On Linux the server also dies with us if we are killed outright
(``PR_SET_PDEATHSIG``). The log is kept only when the server failed (its last lines and its path travel with
the :class:`~gguf_mtp.errors.LlamaServerError`); otherwise it is removed. HTTP goes through the standard
library: the server is our own, on the loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.errors import LlamaServerError

__all__ = ["LOG_TAIL_LINES", "ServerHandle", "probe_server", "running_server"]

#: Lines of the server's log shown with an error.
LOG_TAIL_LINES = 12
#: Seconds llama-server gets to exit after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 15.0
#: Seconds ``--help`` may take.
PROBE_TIMEOUT_SECONDS = 60.0
#: The most bytes read from ``--help`` or from one HTTP answer.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_POLL_SECONDS = 0.2


def probe_server(binary: str) -> None:
    """Check that ``binary`` is llama-server and knows ``--spec-type draft-mtp``, from its ``--help``.

    Raises:
        LlamaServerError: not an executable file, not llama-server, or too old for MTP (one line).
    """
    path = Path(binary)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise LlamaServerError("server: not an executable file", binary, "server")
    try:
        proc = subprocess.run(
            [binary, "--help"], stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise LlamaServerError(
            f"'--help' did not finish in {PROBE_TIMEOUT_SECONDS:.0f} s: not llama-server?", binary, "server"
        ) from None
    except OSError as e:
        raise LlamaServerError(f"cannot run: {e.strerror}", binary, "server") from None
    text = (proc.stdout[:MAX_ANSWER_BYTES] + proc.stderr[:MAX_ANSWER_BYTES]).decode("utf-8", "replace")
    if not all(flag in text for flag in ("--port", "--host", "--model")):
        raise LlamaServerError("not llama-server: its --help lists no --model, --host and --port", binary, "server")
    if "--spec-type" not in text or "draft-mtp" not in text:
        raise LlamaServerError(
            "llama-server too old for MTP: its --help has no '--spec-type draft-mtp' (llama.cpp b11025 or later "
            "needed)",
            binary,
            "server",
        )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerHandle:
    """A running llama-server: its process, its port, its log, and JSON over HTTP to it."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    binary: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(self, method: str, path: str, body: Any = None, *, timeout: float) -> tuple[int, Any]:
        """(status, decoded JSON answer or ``None``) of one request; transport failures raise ``OSError``."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            payload = None if body is None else json.dumps(body).encode("utf-8")
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read(MAX_ANSWER_BYTES + 1)
        except (http.client.HTTPException, ValueError) as e:
            raise ConnectionError(str(e) or type(e).__name__) from None
        finally:
            conn.close()
        if len(data) > MAX_ANSWER_BYTES:
            raise ConnectionError(f"answer to {path} larger than {MAX_ANSWER_BYTES:,} bytes")
        try:
            return response.status, json.loads(data) if data else None
        except ValueError:
            return response.status, None

    def post_json(self, path: str, body: Any, *, timeout: float) -> Any:
        """POST ``body`` to ``path``; the JSON answer of a 200, else :class:`LlamaServerError` with the log tail."""
        return self._answer("POST", path, body, timeout=timeout)

    def get_json(self, path: str, *, timeout: float) -> Any:
        """GET ``path``; the JSON answer of a 200, else :class:`LlamaServerError` with the log tail."""
        return self._answer("GET", path, None, timeout=timeout)

    def _answer(self, method: str, path: str, body: Any, *, timeout: float) -> Any:
        try:
            status, answer = self.request(method, path, body, timeout=timeout)
        except OSError as e:
            raise self.failure(f"{path} failed: {e}") from None
        if status != 200:
            raise self.failure(f"{path} answered HTTP {status}: {_error_text(answer)}")
        return answer

    def failure(self, message: str, parameter: str | None = None) -> LlamaServerError:
        """An error about this server, with the last lines of its log (which is then kept)."""
        exited = self.process.poll()
        if exited is not None:
            how = f"killed by signal {-exited}" if exited < 0 else f"exited with status {exited}"
            message = f"{message} (llama-server {how})"
        return LlamaServerError(
            f"{message}; log: {self.log}", self.binary, parameter, log_tail=log_tail(self.log), log=str(self.log)
        )


def _error_text(answer: Any) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message", "no message"))[:300]
    return "no message"


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` non-empty lines of a log (read from its last 64 KiB)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ()
    return tuple(line for line in text.splitlines() if line.strip())[-lines:]


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when we die (no orphan even after SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl = libc.prctl

    def set_pdeathsig() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    return set_pdeathsig


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL after the grace period (or a second Ctrl-C); waited for."""
    try:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_GRACE_SECONDS)
    except KeyboardInterrupt:  # a second Ctrl-C while waiting: kill at once
        pass
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything left in the group, the server included
        process.wait()


@contextlib.contextmanager
def running_server(
    binary: str,
    args: list[str],
    *,
    port: int,
    health_timeout: float,
    label: str = "llama-server",
    on_start: Callable[[ServerHandle], None] | None = None,
) -> Iterator[ServerHandle]:
    """Start ``binary args`` (which must listen on 127.0.0.1:``port``), wait until ``/health`` answers ok, yield
    the handle; stop the server when the block ends, however it ends. ``on_start`` is told of the process
    as soon as it runs (before it is ready).

    Raises:
        LlamaServerError: it exited, or did not become healthy within ``health_timeout`` seconds (with the
            log's last lines; the log is kept).
    """
    fd, log_name = tempfile.mkstemp(prefix="gguf-mtp-bench-", suffix=".log")
    log = Path(log_name)
    keep_log = True
    try:
        with os.fdopen(fd, "wb") as log_file:
            process = subprocess.Popen(
                [binary, *args], stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent(),
            )
    except OSError as e:
        raise LlamaServerError(f"cannot start: {e.strerror}", binary, "server") from None
    handle = ServerHandle(process, port, log, binary)
    try:
        if on_start is not None:
            on_start(handle)
        _wait_healthy(handle, health_timeout, label)
        yield handle
        keep_log = False
    except LlamaServerError:  # the server failed: its log is named in the error and kept
        raise
    except BaseException:  # anything else (a refusal of ours, Ctrl-C) is not the server's: nothing to keep
        keep_log = False
        raise
    finally:
        _stop(process)
        if not keep_log:
            with contextlib.suppress(OSError):
                log.unlink()


def _wait_healthy(handle: ServerHandle, timeout: float, label: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if handle.process.poll() is not None:
            raise handle.failure(f"{label} stopped before it was ready")
        with contextlib.suppress(OSError):
            status, answer = handle.request("GET", "/health", timeout=5.0)
            if status == 200 and isinstance(answer, dict) and answer.get("status") == "ok":
                return
        if time.monotonic() >= deadline:
            raise handle.failure(
                f"{label} did not become healthy on 127.0.0.1:{handle.port} within {timeout:g} s (health_timeout)",
                "health_timeout",
            )
        time.sleep(_POLL_SECONDS)
