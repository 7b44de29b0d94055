"""llama.cpp's converter kept warm: one process per llama.cpp tree imports torch, transformers and
``convert_hf_to_gguf`` once, then forks a fresh child for every job.

Importing torch and transformers is most of what a tiny conversion costs (seconds each time on a busy 2-core
machine); the suite runs dozens. A forked child starts from the imported modules but from nothing else: the
converter's class attributes it sets per run (``no_mtp``, ``mtp_only``), its logging set-up and its lazy
imports die with the child, so every job runs as a fresh ``python convert_hf_to_gguf.py ...`` would, reading its
arguments from ``sys.argv``, its output to files of its own. Nothing here knows a model; :mod:`support.upstream`
says what to convert.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The server, run by the converter venv's python with the tree as its working directory. Each job line is
#: ``{"argv": [...], "out": path, "err": path}`` and, for a snippet instead of the converter, ``"code": "..."``;
#: each answer line ``{"rc": n}``. It ends when its stdin closes (pytest ended or died).
_SERVER = r"""
import json, os, sys, traceback
import torch, transformers, sentencepiece, yaml  # what the converter and its tokenizer code import
import convert_hf_to_gguf
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pid = os.fork()
    if pid == 0:
        os.dup2(out, 1)
        os.dup2(err, 2)
        code = 0
        try:
            if "code" in job:
                sys.argv = ["-c", *job["argv"]]
                exec(compile(job["code"], "<job>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv = ["convert_hf_to_gguf.py", *job["argv"]]
                convert_hf_to_gguf.main()
        except SystemExit as e:
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(out)
    os.close(err)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


@dataclass(frozen=True)
class JobResult:
    """What one job left: its exit status and its standard output and error."""

    returncode: int
    stdout: str
    stderr: str


class ConverterError(Exception):
    """The warm converter could not start, or a job did not answer in time (the server is then stopped)."""


class WarmConverter:
    """One server for one llama.cpp ``tree`` run by ``python`` with ``env``; :meth:`run` one job at a time."""

    def __init__(self, python: str, tree: Path, env: Mapping[str, str], logs: Path, timeout_s: float) -> None:
        self.tree, self.logs, self.timeout_s = tree, logs, timeout_s
        self._jobs = 0
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / "server.err", "w") as server_err:
            self._proc = subprocess.Popen([python, "-c", _SERVER], cwd=tree, env=dict(env), text=True,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=server_err,
                                          start_new_session=True)
        if self._answer() != {"ready": True}:
            raise ConverterError(f"llama.cpp's converter did not start: {self._server_log()}")

    def run(self, argv: Sequence[str], code: str | None = None) -> JobResult:
        """``convert_hf_to_gguf.py argv`` (or the snippet ``code`` with ``argv``) in a fresh fork; its result."""
        self._jobs += 1
        out, err = self.logs / f"job{self._jobs}.out", self.logs / f"job{self._jobs}.err"
        job: dict[str, object] = {"argv": list(argv), "out": str(out), "err": str(err)}
        if code is not None:
            job["code"] = code
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(job) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise ConverterError(f"llama.cpp's converter has ended: {self._server_log()}") from None
        answer = self._answer()
        if not isinstance(answer, dict) or not isinstance(answer.get("rc"), int):
            raise ConverterError(f"llama.cpp's converter answered {answer!r}: {self._server_log()}")
        return JobResult(answer["rc"], out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        """End the server (its stdin closes; it is killed if it does not end within seconds)."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill()

    def _answer(self) -> object:
        """The server's next line, waiting at most ``timeout_s`` (then it is killed, its job with it)."""
        assert self._proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            if not selector.select(self.timeout_s):
                self._kill()
                raise ConverterError(f"llama.cpp's converter gave no answer in {self.timeout_s:.0f} s (stopped)")
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            raise ConverterError(f"llama.cpp's converter ended (exit {self._proc.returncode}): {self._server_log()}")
        return json.loads(line)

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)  # the server and the job it forked
        self._proc.wait()

    def _server_log(self) -> str:
        return (self.logs / "server.err").read_text(errors="replace")[-4000:]


_servers: dict[tuple[str, Path], WarmConverter] = {}  # least recently used first
#: Servers kept at once (about 300 MB each): the vendored tree's and one patched copy's.
KEEP = 2


def warm_converter(python: str, tree: Path, env: Mapping[str, str], logs: Path, timeout_s: float) -> WarmConverter:
    """The session's server for ``tree`` run by ``python``: started on first use, ended when :data:`KEEP` others
    have been used since, or by :func:`close_warm_converters`."""
    key = (python, tree)
    server = _servers.pop(key, None)
    if server is None or server._proc.poll() is not None:
        while len(_servers) >= KEEP:
            _servers.pop(next(iter(_servers))).close()
        server = WarmConverter(python, tree, env, logs, timeout_s)
    _servers[key] = server
    return server


def close_warm_converters() -> None:
    """End every server :func:`warm_converter` started."""
    while _servers:
        _servers.popitem()[1].close()
