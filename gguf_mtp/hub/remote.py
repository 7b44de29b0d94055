"""Read GGUF headers on the Hugging Face Hub with HTTP range requests, never the tensor data.

A Hub file is named ``hf://OWNER/REPO/path/to/file.gguf``, optionally with a revision
(``...file.gguf@REV`` or ``hf://OWNER/REPO@REV/path``) and a repo type prefix (``hf://datasets/...``).
Its URL comes from :func:`huggingface_hub.hf_hub_url` (so ``HF_ENDPOINT`` is honoured) and each request
carries huggingface_hub's headers (:func:`huggingface_hub.utils.build_hf_headers`: the token of
``get_token()``, so ``HF_TOKEN`` or a stored login, and its user agent). Only public huggingface_hub API
is used: the requests themselves go over the standard library's ``http.client`` (environment proxies
honoured), because huggingface_hub's transport is requests, httpx or httpx2 depending on its release
line, and a deadline needs the socket. Redirects (to the CDN) are followed, at most ten, and the token
is not sent to another host. The first request asks for :data:`FIRST_READ` bytes and
learns the file size from ``Content-Range``; the header parser then asks for more only as it needs it,
doubling each time, and never more than :data:`MAX_REMOTE_HEADER_BYTES` in all.

Hub web addresses (``https://huggingface.co/OWNER/REPO/blob/REV/path``, ``.../resolve/REV/path``) name the
same file. Paths are normalised and refused when they would leave the repository (``..``, empty or
absolute segments): the token travels with every request. Each request has an overall deadline
(``GGUF_MTP_HUB_REQUEST_TIMEOUT`` seconds, first byte to last), and so has each file
(``GGUF_MTP_HUB_FILE_TIMEOUT``): a server that trickles bytes cannot hold a command forever.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from huggingface_hub import constants as hf_constants  # cheap; the HTTP stack is imported on first use

from gguf_mtp.constants import (
    DEFAULT_HUB_FILE_TIMEOUT,
    DEFAULT_HUB_REQUEST_TIMEOUT,
    ENV_HUB_FILE_TIMEOUT,
    ENV_HUB_REQUEST_TIMEOUT,
)
from gguf_mtp.errors import HubError, ParameterError
from gguf_mtp.formatting import printable

from .client import RemoteNotFoundError, transport_failure, unreachable_error

__all__ = [
    "FIRST_READ",
    "HF_SCHEME",
    "MAX_REMOTE_HEADER_BYTES",
    "HubFile",
    "RemoteFile",
    "RemoteNotFoundError",
    "is_hub_path",
]

HF_SCHEME = "hf://"

#: Bytes asked for by the first request to a file (shards 2..N of a split set carry only their tensor
#: table, a few dozen KiB; shard 1 of a big model needs a few more round trips for its tokenizer).
FIRST_READ = 64 * 1024

#: The most header bytes read from one remote file before it is called malformed.
MAX_REMOTE_HEADER_BYTES = 64 * 1024 * 1024

_REPO_TYPE_PREFIXES = {"datasets": "dataset", "spaces": "space", "models": "model"}
_WEB_HOSTS = {"huggingface.co", "www.huggingface.co", "hf.co"}
_USAGE = f"expected {HF_SCHEME}OWNER/REPO/path/to/file.gguf[@revision]"
_CONTENT_RANGE = re.compile(r"^bytes (?:(?P<start>\d+)-(?P<end>\d+)|\*)/(?P<size>\d+|\*)$")
_RETRY_STATUSES = {429, 500, 502, 503, 504}
_ATTEMPTS = 3
_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 10
_CHUNK = 64 * 1024


def is_hub_path(source: object) -> bool:
    """Whether ``source`` names a Hub file (``hf://...``, or any ``http(s)://`` address) rather than a local path.

    Every web address counts: :meth:`HubFile.parse` accepts Hub web URLs and explains the others, which
    is better than "no such file".
    """
    return isinstance(source, str) and source.startswith((HF_SCHEME, "https://", "http://"))


def timeout_setting(name: str, default: float) -> float:
    """Seconds from the environment variable ``name`` (a positive number), else ``default``.

    Raises:
        ParameterError: the variable is set to something else.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 86_400:  # also refuses nan and inf
        raise ParameterError(f"{name}={printable(text)}: expected a number of seconds between 0 and 86400")
    return value


def _path_in_repo(path: str, source: str) -> str:
    """``path`` as a normalised path inside a repository; refuse what would leave it."""
    segments = path.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        raise HubError(
            "a path in a repository has no empty, '.' or '..' parts (it must stay inside the repository)", source
        )
    if any(not segment.isprintable() or "\\" in segment for segment in segments):
        raise HubError("a path in a repository has no control characters or backslashes", source)
    return path


def _checked_revision(revision: str | None, source: str) -> str | None:
    if revision is not None and (not revision or not revision.isprintable() or revision != revision.strip()):
        raise HubError("the revision is empty or holds spaces or control characters", source)
    return revision


@dataclass(frozen=True)
class HubFile:
    """One file in a Hub repository, at an optional revision."""

    repo_id: str
    path_in_repo: str
    revision: str | None = None
    repo_type: str = "model"

    @classmethod
    def parse(cls, source: str) -> HubFile:
        """Parse ``hf://[datasets/|spaces/]OWNER/REPO[@REV]/path/to/file.gguf[@REV]``, or a Hub web address
        ``https://huggingface.co/[datasets/]OWNER/REPO/{blob,resolve}/REV/path/to/file.gguf``.

        Raises:
            HubError: the address does not name a file in a repository, its repo id is malformed, or
                its path would leave the repository.
        """
        if not isinstance(source, str) or not is_hub_path(source):
            raise HubError(f"not a Hub address ({_USAGE})", str(source))
        if not source.startswith(HF_SCHEME):
            return cls._parse_web(source)
        parts = source[len(HF_SCHEME) :].split("/")
        repo_type = "model"
        if parts and parts[0] in _REPO_TYPE_PREFIXES:
            repo_type = _REPO_TYPE_PREFIXES[parts.pop(0)]
        if len(parts) < 3 or not all(parts[:2]) or not parts[-1]:
            raise HubError(_USAGE, source)
        owner, repo, rest = parts[0], parts[1], "/".join(parts[2:])
        revision = None
        if "@" in repo:
            repo, revision = repo.split("@", 1)
        if "@" in rest:
            if revision is not None:
                raise HubError("two revisions given", source)
            rest, revision = rest.rsplit("@", 1)
        if not repo or not rest or revision == "":
            raise HubError(_USAGE, source)
        return cls._checked(f"{owner}/{repo}", rest, revision, repo_type, source)

    @classmethod
    def _parse_web(cls, source: str) -> HubFile:
        """``https://huggingface.co/OWNER/REPO/blob/REV/PATH`` (or ``/resolve/``; ``HF_ENDPOINT``'s host too)."""
        url = urlsplit(source)
        hosts = _WEB_HOSTS | {urlsplit(_endpoint()).netloc.lower()}
        web_usage = f"a Hub file's web address is https://huggingface.co/OWNER/REPO/blob/REV/PATH; or use {_USAGE}"
        if url.netloc.lower() not in hosts:
            raise HubError(f"only files on the Hugging Face Hub can be read remotely ({_USAGE})", source)
        parts = url.path.strip("/").split("/") if url.path.strip("/") else []
        repo_type = "model"
        if parts and parts[0] in ("datasets", "spaces"):
            repo_type = _REPO_TYPE_PREFIXES[parts.pop(0)]
        if len(parts) < 5 or parts[2] not in ("blob", "resolve"):
            raise HubError(web_usage, source)
        owner, repo, revision = parts[0], parts[1], unquote(parts[3])
        path = "/".join(unquote(p) for p in parts[4:])
        return cls._checked(f"{owner}/{repo}", path, revision, repo_type, source)

    @classmethod
    def _checked(cls, repo_id: str, path: str, revision: str | None, repo_type: str, source: str) -> HubFile:
        from .client import check_repo_id

        try:
            check_repo_id(repo_id)
        except HubError as e:
            raise HubError(e.message, source) from None
        return cls(repo_id, _path_in_repo(path, source), _checked_revision(revision, source), repo_type)

    @property
    def name(self) -> str:
        """The file name (last path component)."""
        return self.path_in_repo.rsplit("/", 1)[-1]

    def sibling(self, name: str) -> HubFile:
        """The file called ``name`` in the same folder, at the same revision."""
        folder = self.path_in_repo.rsplit("/", 1)[0] + "/" if "/" in self.path_in_repo else ""
        return replace(self, path_in_repo=folder + name)

    def url(self) -> str:
        """The ``resolve`` URL of the file on the current endpoint (``HF_ENDPOINT``, read at call time)."""
        from huggingface_hub import hf_hub_url

        return hf_hub_url(
            self.repo_id, self.path_in_repo, repo_type=self.repo_type, revision=self.revision, endpoint=_endpoint()
        )

    def __str__(self) -> str:
        prefix = {"dataset": "datasets/", "space": "spaces/"}.get(self.repo_type, "")
        suffix = f"@{self.revision}" if self.revision else ""
        return f"{HF_SCHEME}{prefix}{self.repo_id}/{self.path_in_repo}{suffix}"


def _endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or hf_constants.ENDPOINT).rstrip("/")


class RemoteFile:
    """A Hub file read by HTTP range requests, keeping what it read from the start of the file.

    Reads are served from the bytes already fetched when possible, so parsing a header twice costs
    no traffic, and never reach past ``limit`` bytes from the start of the file (a read there comes
    back short, which the header parser reports as a header over its limit). ``bytes_received``
    counts every body byte the server sent.

    Use :meth:`open`, which makes the first request and learns the size.
    """

    def __init__(
        self,
        hub_file: HubFile,
        url: str,
        size: int,
        prefix: bytes,
        bytes_received: int,
        limit: int,
        deadline: float | None = None,
    ) -> None:
        self.hub_file = hub_file
        self.url = url
        self.size = size
        self.limit = limit
        self._prefix = bytearray(prefix)
        self.bytes_received = bytes_received
        self.requests = 1
        self._deadline = deadline  # time.monotonic() by which every read of this file must be done

    @classmethod
    def open(
        cls, hub_file: HubFile, *, first_read: int = FIRST_READ, limit: int = MAX_REMOTE_HEADER_BYTES
    ) -> RemoteFile:
        """Fetch the first ``first_read`` bytes of ``hub_file`` and its size; read no more than
        ``limit`` bytes of it in all, within ``GGUF_MTP_HUB_FILE_TIMEOUT`` seconds.

        Raises:
            RemoteNotFoundError: no such file in the repository (at that revision).
            HubError: offline mode, no access, network failure, a deadline passed, a redirect loop, a
                body that is not what its headers say, or a server that ignores ranges.
        """
        file_timeout = timeout_setting(ENV_HUB_FILE_TIMEOUT, DEFAULT_HUB_FILE_TIMEOUT)
        deadline = time.monotonic() + file_timeout
        url = hub_file.url()
        body, size, received = _get_range(hub_file, url, 0, min(first_read, limit), deadline)
        return cls(hub_file, url, size, body, received, limit, deadline)

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer only at the end of the file or at ``limit``)."""
        end = min(offset + size, self.size, self.limit)
        if end <= offset:
            return b""
        have = len(self._prefix)
        if end > have:
            start = max(offset, have)
            body, _, received = _get_range(self.hub_file, self.url, start, end - start, self._deadline)
            self.bytes_received += received
            self.requests += 1
            if start == have:
                self._prefix += body
            elif offset >= start:
                return body
            else:  # pragma: no cover - parse_header reads contiguously from the start
                return bytes(self._prefix[offset:have]) + body
        return bytes(self._prefix[offset:end])


def _get_range(
    hub_file: HubFile, url: str, start: int, length: int, file_deadline: float | None = None
) -> tuple[bytes, int, int]:
    """GET ``length`` bytes at ``start``: (body, file size, bytes received).

    Transport failures are retried (:data:`_ATTEMPTS` in all) while the file's deadline allows; a
    request past its own deadline is not: a server that slow will not be faster the second time.
    """
    from .client import is_offline, resolve_token

    if is_offline():
        raise HubError(
            "HF_HUB_OFFLINE is set, so the Hub cannot be asked for this header; unset it, or inspect a local copy",
            str(hub_file),
        )
    headers = _headers(resolve_token())  # a token HTTP cannot send is one line here, not a traceback there
    headers["Range"] = f"bytes={start}-{start + length - 1}"
    headers["Accept-Encoding"] = "identity"  # byte ranges of the file, not of a compressed stream
    request_timeout = timeout_setting(ENV_HUB_REQUEST_TIMEOUT, DEFAULT_HUB_REQUEST_TIMEOUT)
    last_error: Exception | None = None
    host = _host(url)
    for _ in range(_ATTEMPTS):
        now = time.monotonic()
        if file_deadline is not None and now >= file_deadline:
            raise HubError(
                f"reading the header from {host} took longer than {_file_timeout():g} s ({ENV_HUB_FILE_TIMEOUT})",
                str(hub_file),
            )
        deadline = now + request_timeout
        per_file = file_deadline is not None and file_deadline < deadline
        if per_file:
            deadline = file_deadline  # type: ignore[assignment]
        try:
            return _request_with_deadline(hub_file, url, headers, start, length, deadline)
        except _DeadlinePassed:
            what = (
                f"reading the header took longer than {_file_timeout():g} s ({ENV_HUB_FILE_TIMEOUT})"
                if per_file
                else f"no complete answer within {request_timeout:g} s ({ENV_HUB_REQUEST_TIMEOUT})"
            )
            raise HubError(f"{host}: {what}", str(hub_file)) from None
        except _Retry as e:
            last_error = e.cause
    failure = transport_failure(last_error, host) if last_error is not None else None
    if failure is not None:  # the same line as for every other Hub call that cannot connect
        raise unreachable_error("read the header", failure, str(hub_file))
    raise HubError(f"cannot read from {host} after {_ATTEMPTS} attempts: {_one_line(last_error)}", str(hub_file))


def _headers(token: str | None) -> dict[str, str]:
    """huggingface_hub's request headers (user agent, ``authorization`` when there is a token)."""
    from huggingface_hub.utils import build_hf_headers

    from gguf_mtp._version import __version__

    return dict(build_hf_headers(token=token or False, library_name="gguf-mtp", library_version=__version__))


def _file_timeout() -> float:
    return timeout_setting(ENV_HUB_FILE_TIMEOUT, DEFAULT_HUB_FILE_TIMEOUT)


def _host(url: str) -> str:
    return url.split("/")[2] if "//" in url else url


class _Retry(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _DeadlinePassed(Exception):
    """The request was still running at its deadline (and was cut off)."""


class _Exchange:
    """One request run in a worker thread, so that the caller can walk away at a deadline.

    Per-read timeouts do not bound a server that sends one byte every few seconds; the caller waits
    for the worker until the deadline, then shuts the connection's socket down (which wakes the
    worker's blocked read) and gives up. The worker registers each socket as soon as it is connected.
    """

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.deadline = 0.0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.result: tuple[bytes, int, int] | None = None
        self.error: BaseException | None = None

    def remember(self, sock: object) -> None:
        """Keep ``sock`` to shut down at the deadline (at once if the deadline has passed)."""
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
        if self.cancelled.is_set():
            self.cut_off()

    def cut_off(self) -> None:
        self.cancelled.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

    def run(self, work: Callable[[_Exchange], tuple[bytes, int, int]]) -> None:
        try:
            self.result = work(self)
        except BaseException as e:  # handed to the waiting caller
            self.error = e


def _request_with_deadline(
    hub_file: HubFile, url: str, headers: dict[str, str], start: int, length: int, deadline: float
) -> tuple[bytes, int, int]:
    exchange = _Exchange()
    exchange.deadline = deadline
    worker = threading.Thread(
        target=exchange.run,
        args=(lambda ex: _request(hub_file, url, headers, start, length, ex),),
        name="gguf-mtp-hub-read",
        daemon=True,  # a worker stuck in a read must not keep the process alive
    )
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        exchange.cut_off()
        worker.join(1.0)  # usually returns at once: its read was woken by the shutdown
        raise _DeadlinePassed
    if exchange.error is not None:
        if isinstance(exchange.error, _DeadlinePassed) or exchange.cancelled.is_set():
            raise _DeadlinePassed
        raise exchange.error
    assert exchange.result is not None
    return exchange.result


def _connect(url: str, timeout: float, exchange: _Exchange) -> tuple[http.client.HTTPConnection, str]:
    """An open connection for ``url`` (through the environment's proxy, if any) and the request target.

    Plain ``http.client`` on purpose: huggingface_hub's own transport differs between its release lines
    (requests, httpx, httpx2), and only a connection whose socket is known can be cut off at a deadline.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"cannot follow the server's answer: unsupported address {printable(url)[:200]}")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = None if urllib.request.proxy_bypass(parts.hostname) else urllib.request.getproxies().get(parts.scheme)
    via = urlsplit(proxy if proxy and "://" in proxy else f"http://{proxy}") if proxy else None
    if via is not None and via.hostname:
        connection: http.client.HTTPConnection
        if secure:
            connection = http.client.HTTPSConnection(
                via.hostname, via.port or 80, timeout=timeout, context=ssl.create_default_context()
            )
            connection.set_tunnel(parts.hostname, port)
        else:
            connection = http.client.HTTPConnection(via.hostname, via.port or 80, timeout=timeout)
            target = url
    elif secure:
        connection = http.client.HTTPSConnection(
            parts.hostname, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    connection.connect()
    exchange.remember(connection.sock)
    return connection, target


def _request(
    hub_file: HubFile, url: str, headers: dict[str, str], start: int, length: int, exchange: _Exchange
) -> tuple[bytes, int, int]:
    name = str(hub_file)
    read_timeout = max(
        1.0, min(float(getattr(hf_constants, "HF_HUB_DOWNLOAD_TIMEOUT", 10)) * 3, exchange.deadline - time.monotonic())
    )
    origin = _origin(url)
    for _ in range(_MAX_REDIRECTS + 1):
        sent = headers if _origin(url) == origin else {k: v for k, v in headers.items() if k.lower() != "authorization"}
        try:
            connection, target = _connect(url, read_timeout, exchange)
            try:
                connection.request("GET", target, headers=sent)
                response = connection.getresponse()
                status = response.status
                if status in _REDIRECTS and response.getheader("Location"):
                    url = urljoin(url, response.getheader("Location", ""))
                    continue
                if status in _RETRY_STATUSES:
                    raise _Retry(HubError(f"HTTP {status}"))
                if status >= 400 and status != 416:
                    raise _status_error(hub_file, response)
                return _read_body(hub_file, response, start, length, exchange)
            finally:
                connection.close()
        except HubError:
            raise
        except (OSError, http.client.HTTPException) as e:
            if exchange.cancelled.is_set():
                raise _DeadlinePassed from None
            raise _Retry(e) from None
    raise HubError(f"too many redirects from {_host(url)} (a redirect loop?)", name)


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


def _read_body(
    hub_file: HubFile, response: Any, start: int, length: int, exchange: _Exchange | None = None
) -> tuple[bytes, int, int]:
    """The body of a range response, the file size it states, and the bytes received."""
    name = str(hub_file)
    encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("", "identity"):
        # We asked for identity: the bytes of a compressed stream are not the file's bytes at these offsets.
        raise HubError(
            f"the server compressed the body (Content-Encoding: {printable(encoding)[:40]}) "
            "although the file's own bytes were asked for",
            name,
        )
    content_range = response.getheader("Content-Range") or ""
    if response.status == 416:  # e.g. an empty file: "bytes */0"
        match = _CONTENT_RANGE.match(content_range)
        if match and match["size"] != "*":
            return b"", int(match["size"]), 0
        raise HubError("the server refused the byte range request (HTTP 416)", name)
    if response.status == 206:
        match = _CONTENT_RANGE.match(content_range)
        if not match or match["start"] is None or int(match["start"]) != start or match["size"] == "*":
            raise HubError(f"unexpected Content-Range {printable(repr(content_range))[:80]}", name)
        size = int(match["size"])
    elif response.status == 200:
        # The server ignores Range: read no further than asked, then hang up (never the whole file).
        if start:
            raise HubError("the server does not support HTTP range requests", name)
        size = _content_length(response)
        if size < 0:
            raise HubError("the server does not support HTTP range requests and sends no Content-Length", name)
    else:
        raise HubError(f"unexpected HTTP status {response.status}", name)
    chunks: list[bytes] = []
    received = 0
    while received < length:  # never more than asked for, whatever the server means to send
        chunk = response.read1(min(_CHUNK, length - received))
        if exchange is not None and exchange.cancelled.is_set():
            raise _DeadlinePassed
        if not chunk:
            break
        chunks.append(chunk)
        received += len(chunk)
    body = b"".join(chunks)[:length]
    expected = min(length, size - start)
    if len(body) < expected:
        raise HubError(f"connection closed after {len(body):,} of {expected:,} bytes at byte {start:,}", name)
    return body, size, received


def _content_length(response: Any) -> int:
    text = (response.getheader("Content-Length") or "").strip()
    return int(text) if text.isdigit() else -1


def _status_error(hub_file: HubFile, response: Any) -> HubError:
    """The Hub's error answer (status, ``X-Error-Code``, ``X-Error-Message``) as one line."""
    from .client import answer_error

    message = printable(response.getheader("X-Error-Message") or response.reason or "")[:200]
    return answer_error(
        response.status,
        response.getheader("X-Error-Code"),
        "read the header",
        hub_file.repo_id,
        revision=hub_file.revision,
        file=hub_file.path_in_repo,
        detail=message,
        path=str(hub_file),
    )


def _one_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
