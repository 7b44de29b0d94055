"""The user's own ``llama-server``, started and always stopped: for ``gguf-mtp bench``.

:func:`running_server` starts it on 127.0.0.1 at a free port, in its own process group, with
its output in a log file; waits for ``/health`` up to a deadline; and stops it however the block ends
(success, error, Ctrl-C, SIGTERM): SIGTERM to the group, SIGKILL after a grace period, waited for, so no
process is left and the port is free again. On Linux the server also dies with us if we are killed outright
(``PR_SET_PDEATHSIG``). The log is kept only when the server failed (its last lines and its path travel with
the :class:`~gguf_mtp.errors.LlamaServerError`); otherwise it is removed. HTTP goes through the standard
library: the server is our own, on the loopback. Every wait has a deadline for the whole answer, not for each
read (a server trickling a byte a second still ends by it), and every answer is read with the project's bounded
JSON reader (:func:`gguf_mtp.files.json_io.parse_json`: no recursion, no overflowing number).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.errors import GGUFMTPError, LlamaServerError
from gguf_mtp.files.json_io import parse_json
from gguf_mtp.llama_build import die_with_parent, last_lines, read_log_end
from gguf_mtp.llama_server import MAX_ANSWER_BYTES

__all__ = ["ServerHandle", "running_server"]

#: Seconds llama-server gets to exit after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 15.0
#: The longest one ``/health`` probe may take (the whole wait has its own deadline).
HEALTH_PROBE_SECONDS = 5.0
_POLL_SECONDS = 0.2


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

    def request(self, method: str, path: str, body: Any = None, *, timeout: float) -> tuple[int, bytes]:
        """(status, body) of one request, all of it within ``timeout`` seconds however the server answers (a
        byte a second included); a transport failure or the deadline raises ``OSError``."""
        deadline = time.monotonic() + timeout
        conn = _DeadlineConnection(self.port, deadline)
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
        return response.status, data

    def decode(self, path: str, data: bytes) -> Any:
        """An answer's JSON (``None`` when empty), read with the project's bounded reader.

        Raises:
            LlamaServerError: not JSON, nested too deep, a number no server sends (one line, with the log tail).
        """
        if not data:
            return None
        try:
            return parse_json(data, self.binary, what=f"{path} answered")
        except GGUFMTPError as e:
            raise self.failure(e.message) from None

    def post_json(self, path: str, body: Any, *, timeout: float) -> Any:
        """POST ``body`` to ``path``; the JSON answer of a 200, else :class:`LlamaServerError` with the log tail."""
        return self._answer("POST", path, body, timeout=timeout)

    def get_json(self, path: str, *, timeout: float) -> Any:
        """GET ``path``; the JSON answer of a 200, else :class:`LlamaServerError` with the log tail."""
        return self._answer("GET", path, None, timeout=timeout)

    def get_text(self, path: str, *, timeout: float) -> bytes | None:
        """GET ``path``; the body of a 200, ``None`` for any other status (an endpoint the server does not offer).

        Raises:
            LlamaServerError: no answer within ``timeout`` (with the log tail).
        """
        try:
            status, data = self.request("GET", path, timeout=timeout)
        except TimeoutError:
            raise self.failure(f"{path}: no complete answer within {timeout:g} s") from None
        except OSError as e:
            raise self.failure(f"{path} failed: {e}") from None
        return data if status == 200 else None

    def _answer(self, method: str, path: str, body: Any, *, timeout: float) -> Any:
        try:
            status, data = self.request(method, path, body, timeout=timeout)
        except TimeoutError:
            raise self.failure(f"{path}: no complete answer within {timeout:g} s") from None
        except OSError as e:
            raise self.failure(f"{path} failed: {e}") from None
        if status != 200:
            raise self.failure(f"{path} answered HTTP {status}: {_error_text(_lenient(data))}")
        return self.decode(path, data)

    def failure(self, message: str, parameter: str | None = None) -> LlamaServerError:
        """An error about this server, with the last lines of its log (which is then kept)."""
        exited = self.process.poll()
        if exited is not None:
            how = f"killed by signal {-exited}" if exited < 0 else f"exited with status {exited}"
            message = f"{message} (llama-server {how})"
        return LlamaServerError(
            f"{message}; log: {self.log}", self.binary, parameter, log_tail=log_tail(self.log), log=str(self.log)
        )


def _lenient(data: bytes) -> Any:
    """The JSON of an error answer, for its message only (bounded; anything unreadable is no message)."""
    try:
        return parse_json(data, "answer") if data else None
    except GGUFMTPError:
        return None


def _error_text(answer: Any) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message", "no message"))[:300]
    return "no message"


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each given only the time left before the deadline: a whole answer ends by then."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)  # holds the socket open until this reader is closed
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete answer before the deadline")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """The part of a socket ``http.client`` uses, with one deadline for the whole exchange (sending included)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete answer before the deadline")
        self._sock.settimeout(left)  # since Python 3.5 the total time of sendall
        self._sock.sendall(data)

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        self._sock.close()


class _DeadlineConnection(http.client.HTTPConnection):
    """HTTP to 127.0.0.1:``port`` that gives up at ``deadline`` (``time.monotonic()``), not per read."""

    def __init__(self, port: int, deadline: float) -> None:
        super().__init__("127.0.0.1", port, timeout=max(0.001, deadline - time.monotonic()))
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self._deadline)


def log_tail(log: Path) -> tuple[str, ...]:
    """The last non-empty lines of a server's log (:func:`gguf_mtp.llama_build.last_lines`)."""
    try:
        with open(log, "rb") as f:
            return last_lines(read_log_end(f))
    except OSError:
        return ()


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
    env: dict[str, str] | None = None,
) -> Iterator[ServerHandle]:
    """Start ``binary args`` (which must listen on 127.0.0.1:``port``), wait until ``/health`` answers ok, yield
    the handle; stop the server when the block ends, however it ends. ``on_start`` is told of the process
    as soon as it runs (before it is ready). ``env``: the server's environment (default: ours).

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
                start_new_session=True, preexec_fn=die_with_parent(), env=env,
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
    """Poll ``/health`` until it answers ok; every probe, and so the whole wait, ends by the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if handle.process.poll() is not None:
            raise handle.failure(f"{label} stopped before it was ready")
        left = deadline - time.monotonic()
        if left > 0:
            try:
                status, data = handle.request("GET", "/health", timeout=min(left, HEALTH_PROBE_SECONDS))
            except OSError:  # not listening yet, or no whole answer in time
                status, data = 0, b""
            answer = handle.decode("/health", data)  # a malformed answer is no llama-server: one line at once
            if status == 200 and isinstance(answer, dict) and answer.get("status") == "ok":
                return
        if time.monotonic() >= deadline:
            raise handle.failure(
                f"{label} did not become healthy on 127.0.0.1:{handle.port} within {timeout:g} s (health_timeout)",
                "health_timeout",
            )
        time.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
