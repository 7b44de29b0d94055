"""A loopback stand-in for the Hub's file server (``/{owner}/{repo}/resolve/{revision}/{path}``).

It serves files published into it per revision, keeps every commit's files (``resolve/<commit>/...``
answers what that commit held, as the Hub does), sends ``X-Repo-Commit`` and an ``ETag`` with every
file answer, honours ``Range``, answers 404 like the Hub, can redirect to a CDN path first, and counts
every body byte it sends. ``HF_ENDPOINT`` points at it; nothing leaves the machine. Hooks let a test
push a new version between two requests, or make it a mirror that serves the newest bytes whatever
commit is asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote

import pytest

from support.helpers import LoopbackServer

REPO = "tiny-org/Tiny-Nemotron-GGUF"
FOLDER = "UD-Q4_K_XL"


@dataclass
class Served:
    """One request the loopback Hub answered, and the body bytes it sent for it."""

    method: str
    path: str
    byte_range: str | None
    authorization: str | None
    headers: dict[str, str] = field(default_factory=dict)  # every header, by its lower-case name
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event, repr=False)  # set once the reply is over


@dataclass
class HubStandIn:
    """What the loopback Hub serves and what it saw."""

    root: Path  # files live at root/{owner}/{repo}/{revision}/{path}
    url: str = ""
    redirect: bool = False
    redirect_base: str = ""  # where a redirect points: "" (the same host) or another origin, e.g. http://localhost:PORT
    ignore_range: bool = False
    misbehave: str | None = None  # "trickle", "trickle-headers", "redirect-loop", "fake-gzip", "huge-403" or "huge-503"
    send_commit: bool = True  # X-Repo-Commit on file answers, as the Hub sends it
    serve_newest: bool = False  # a mirror: resolve/<commit> answers the branch's newest bytes
    before_get: Callable[[int], None] | None = None  # called with the number of GETs of a file so far, before each
    commits: dict[tuple[str, str], str] = field(default_factory=dict)  # (repo, branch) -> its newest commit
    log: list[Served] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, files: list[Path], folder: str = FOLDER, revision: str = "main", repo: str = REPO) -> str:
        """Commit ``files`` into ``folder`` of ``repo`` on branch ``revision``; returns the new commit id."""
        dest = self.root / repo / revision / folder if folder else self.root / repo / revision
        dest.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy(f, dest / f.name)
        commit = hashlib.sha1(f"{repo}/{revision}/{len(self.commits)}/{time.time_ns()}".encode()).hexdigest()
        self.commits[(repo, revision)] = commit
        shutil.copytree(self.root / repo / revision, self.root / repo / commit)  # every commit stays readable
        return commit

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """(method, path, Range header) of every request since the last reset."""
        return [(r.method, r.path, r.byte_range) for r in self.log]

    @property
    def authorization(self) -> list[str | None]:
        return [r.authorization for r in self.log]

    def _finished(self) -> list[Served]:
        """Every record, once its handler thread is done: the client may have its bytes before the
        server thread has counted them."""
        log = list(self.log)
        for record in log:
            record.done.wait(5)
        return log

    @property
    def total_sent(self) -> int:
        return sum(r.sent for r in self._finished())

    def sent(self, name: str) -> int:
        """Body bytes sent for the file called ``name`` since the last reset."""
        return sum(r.sent for r in self._finished() if r.path.endswith("/" + name))

    def reset(self) -> None:
        # A new list: a late writer of an earlier test updates its own, now forgotten, record.
        with self.lock:
            self.log = []


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn/(?P<repo>[^/]+/[^/]+)/(?P<rev>[^/]+)/(?P<path>.+)$")


def handler_for(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def _file(self) -> Path | None:
            match = _RESOLVE.match(self.path) or _CDN.match(self.path)
            if not match:
                return None
            if hub.redirect and self.path.startswith("/") and not self.path.startswith("/cdn/"):
                return Path("redirect")
            repo, rev, path = match["repo"], unquote(match["rev"]), unquote(match["path"])
            if not (hub.root / repo).is_dir():
                self._error(404, "RepoNotFound")
                return Path("answered")
            if hub.serve_newest and re.fullmatch(r"[0-9a-f]{40}", rev):
                rev = "main"  # a mirror of one branch: whatever commit is asked for, the newest bytes
            self.commit = hub.commits.get((repo, rev), rev if re.fullmatch(r"[0-9a-f]{40}", rev) else None)
            file = hub.root / repo / rev / path
            return file if file.is_file() else None

        def _error(self, status: int, code: str) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _serve(self, head: bool) -> None:
            headers = {name.lower(): value for name, value in self.headers.items()}
            record = Served(self.command, self.path, headers.get("range"), headers.get("authorization"), headers)
            with hub.lock:
                hub.log.append(record)
            try:
                self._reply(record, head)
            finally:
                record.done.set()

        def _misbehave(self, mode: str, record: Served) -> None:
            """The hostile servers of issue 11 item 7; a trickle ends after 30 s whatever happens."""
            if mode == "redirect-loop":
                self.send_response(302)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if mode.startswith("huge-"):  # a 1 GiB error page, sent until the client hangs up
                self.send_response(int(mode.removeprefix("huge-")))
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(1 << 30))
                self.end_headers()
                with contextlib.suppress(OSError):
                    while record.sent < 1 << 30:
                        self.wfile.write(bytes(64 * 1024))
                        record.sent += 64 * 1024
                return
            if mode == "fake-gzip":
                body = b"GGUF" + bytes(60)  # not gzip at all
                self.send_response(206)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Range", f"bytes 0-{len(body) - 1}/100000")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            try:
                if mode == "trickle-headers":
                    self.wfile.write(b"HTTP/1.1 206 Partial Content\r\n")
                    for _ in range(15):
                        self.wfile.write(b"X")
                        self.wfile.flush()
                        time.sleep(2)
                    return
                self.send_response(206)
                self.send_header("Content-Range", "bytes 0-65535/100000")
                self.send_header("Content-Length", "65536")
                self.end_headers()
                for _ in range(15):
                    self.wfile.write(b"G")
                    self.wfile.flush()
                    time.sleep(2)
            except OSError:
                pass  # the client gave up, as it should

        def _reply(self, record: Served, head: bool) -> None:
            if hub.misbehave:
                self._misbehave(hub.misbehave, record)
                return
            if not head and hub.before_get is not None:
                hub.before_get(sum(1 for r in hub.log if r.method == "GET") - 1)
            self.commit: str | None = None
            file = self._file()
            if file == Path("answered"):
                return
            if file == Path("redirect"):
                match = _RESOLVE.match(self.path)
                assert match
                self.send_response(302)
                self.send_header("Location", f"{hub.redirect_base}/cdn/{match['repo']}/{match['rev']}/{match['path']}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if file is None:
                self._error(404, "EntryNotFound")
                return
            size = file.stat().st_size
            start, end = 0, size - 1
            status = 200
            ranged = re.match(r"^bytes=(\d+)-(\d*)$", self.headers.get("Range") or "")
            if ranged and not hub.ignore_range:
                start = int(ranged[1])
                end = min(int(ranged[2]) if ranged[2] else size - 1, size - 1)
                status = 206
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            self.send_response(status)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{hashlib.sha256(file.read_bytes()).hexdigest()}"')
            if hub.send_commit and self.commit:
                self.send_header("X-Repo-Commit", self.commit)
            self.send_header("Content-Length", str(end - start + 1))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if head:
                return
            with open(file, "rb") as f:
                f.seek(start)
                try:
                    while record.sent < end - start + 1:
                        chunk = f.read(min(64 * 1024, end - start + 1 - record.sent))
                        self.wfile.write(chunk)
                        record.sent += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up once it had enough

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

    return Handler


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandIn]:
    hub = HubStandIn(tmp_path_factory.mktemp("hub"))
    httpd = LoopbackServer(("127.0.0.1", 0), handler_for(hub))
    hub.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield hub
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def hub(server: HubStandIn, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> HubStandIn:
    """The loopback Hub, with HF_ENDPOINT pointing at it, online, no stored token, counters reset."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    server.redirect = False
    server.redirect_base = ""
    server.ignore_range = False
    server.misbehave = None
    server.send_commit = True
    server.serve_newest = False
    server.before_get = None
    server.reset()
    return server


