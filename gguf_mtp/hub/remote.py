"""Read GGUF headers on the Hugging Face Hub with HTTP range requests, never the tensor data.

A Hub file is named ``hf://OWNER/REPO/path/to/file.gguf``, optionally with a revision
(``...file.gguf@REV`` or ``hf://OWNER/REPO@REV/path``) and a repo type prefix (``hf://datasets/...``).
Its URL comes from :func:`huggingface_hub.hf_hub_url` (so ``HF_ENDPOINT`` is honoured) and each request
carries huggingface_hub's headers (:func:`huggingface_hub.utils.build_hf_headers`: the token of
``get_token()``, so ``HF_TOKEN`` or a stored login, and its user agent). Only public huggingface_hub API
is used, and the requests go over huggingface_hub's own session and back-off
(:func:`_range_response`: httpx2, httpx or requests depending on its release line), so its proxy
settings (credentials included), CA bundle and client factory apply. Redirects (to the CDN) are
followed, and the token is not sent to another host. The first request asks for :data:`FIRST_READ` bytes and
learns the file size from ``Content-Range``; the header parser then asks for more only as it needs it,
doubling each time, and never more than :data:`MAX_REMOTE_HEADER_BYTES` in all.

One version only: a push between two range requests must not give a header neither version has. The
first answer names the commit it came from (``X-Repo-Commit``), and every later range of the file is asked
of ``resolve/<that commit>``, which no push changes; each answer's commit, ETag (the Hub's
``X-Linked-Etag`` when it sends one) and total size (``Content-Range``) must still equal the first's, or
the read stops with one line naming the file (a server that sends no commit, a mirror that serves the
newest bytes whatever the commit asked for).

Retries: huggingface_hub's back-off retries a timeout and a busy answer (429, 5xx); a host name that
does not resolve and a refused connection fail at the first attempt.

Hub web addresses (``https://huggingface.co/OWNER/REPO/blob/REV/path``, ``.../resolve/REV/path``) name the
same file. Paths are normalised and refused when they would leave the repository (``..``, empty or
absolute segments): the token travels with every request. Each request has an overall deadline
(``GGUF_MTP_HUB_REQUEST_TIMEOUT`` seconds, retries included, first byte to last), and so has each file
(``GGUF_MTP_HUB_FILE_TIMEOUT``): a server that trickles bytes cannot hold a command forever.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlsplit

from huggingface_hub import constants as hf_constants  # cheap; the HTTP stack is imported on first use

from gguf_mtp.constants import (
    DEFAULT_HUB_FILE_TIMEOUT,
    DEFAULT_HUB_REQUEST_TIMEOUT,
    ENV_HUB_FILE_TIMEOUT,
    ENV_HUB_REQUEST_TIMEOUT,
)
from gguf_mtp.errors import HubError, ParameterError
from gguf_mtp.text import printable

from .errors import RemoteNotFoundError

__all__ = [
    "DATA_CHUNK",
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

#: The most bytes one range request of tensor data asks for (:meth:`RemoteFile.copy_range`): a retry
#: fetches again no more than this.
DATA_CHUNK = 32 * 1024 * 1024

_REPO_TYPE_PREFIXES = {"datasets": "dataset", "spaces": "space", "models": "model"}
_WEB_HOSTS = {"huggingface.co", "www.huggingface.co", "hf.co"}
_USAGE = f"expected {HF_SCHEME}OWNER/REPO/path/to/file.gguf[@revision]"
_CONTENT_RANGE = re.compile(r"^bytes (?:(?P<start>\d+)-(?P<end>\d+)|\*)/(?P<size>\d+|\*)$")
_RETRY_STATUSES = (429, 500, 502, 503, 504)
_ATTEMPTS = 3
_BACKOFF_WAIT = 1.0  # seconds before the first retry; doubled each time
_ERROR_BODY_LIMIT = 64 * 1024  # the most bytes of an error answer read for its message
_CHUNK = 64 * 1024
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class _Answer:
    """One range answer: its body, the file size it states, the bytes received, and the version it is of."""

    body: bytes
    size: int
    received: int
    commit: str | None = None  # X-Repo-Commit of the Hub's answer
    etag: str | None = None  # X-Linked-Etag of the Hub's answer, else the final answer's ETag


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


def _pop_repo_type(parts: list[str], prefixes: Collection[str]) -> str:
    """The repo type a leading folder of ``prefixes`` names (``datasets``, ``spaces``), taken off ``parts``;
    without one, a model."""
    if parts and parts[0] in prefixes:
        return _REPO_TYPE_PREFIXES[parts.pop(0)]
    return "model"


def _split_revision(repo: str, rest: str, source: str) -> tuple[str, str, str | None]:
    """``REPO@REV`` or ``path@REV``: the repo, the path and the one revision an ``hf://`` address may give.

    Raises:
        HubError: two revisions, an empty one, or nothing left of the repo or the path.
    """
    revision = None
    if "@" in repo:
        repo, revision = repo.split("@", 1)
    if "@" in rest:
        if revision is not None:
            raise HubError("two revisions given", source)
        rest, revision = rest.rsplit("@", 1)
    if not repo or not rest or revision == "":
        raise HubError(_USAGE, source)
    return repo, rest, revision


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
        repo_type = _pop_repo_type(parts, _REPO_TYPE_PREFIXES)
        if len(parts) < 3 or not all(parts[:2]) or not parts[-1]:
            raise HubError(_USAGE, source)
        repo, rest, revision = _split_revision(parts[1], "/".join(parts[2:]), source)
        return cls._checked(f"{parts[0]}/{repo}", rest, revision, repo_type, source)

    @classmethod
    def _parse_web(cls, source: str) -> HubFile:
        """``https://huggingface.co/OWNER/REPO/blob/REV/PATH`` (or ``/resolve/``; ``HF_ENDPOINT``'s host too)."""
        url = urlsplit(source)
        hosts = _WEB_HOSTS | {urlsplit(_endpoint()).netloc.lower()}
        web_usage = f"a Hub file's web address is https://huggingface.co/OWNER/REPO/blob/REV/PATH; or use {_USAGE}"
        if url.netloc.lower() not in hosts:
            raise HubError(f"only files on the Hugging Face Hub can be read remotely ({_USAGE})", source)
        parts = url.path.strip("/").split("/") if url.path.strip("/") else []
        repo_type = _pop_repo_type(parts, ("datasets", "spaces"))
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

    Every read after the first asks for the commit the first answer came from, and each answer must be of
    the same version as the first (commit, ETag, size), or the read is refused (:meth:`_same_version`).

    Use :meth:`open`, which makes the first request and learns the size.
    """

    def __init__(
        self,
        hub_file: HubFile,
        url: str,
        first: _Answer,
        limit: int,
        deadline: float | None = None,
    ) -> None:
        self.hub_file = hub_file
        self.url = url
        self.size = first.size
        self.limit = limit
        self.commit = first.commit  # the commit every read of this file is pinned to (None: the server named none)
        self._first = first
        self._prefix = bytearray(first.body)
        self.bytes_received = first.received
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
        first = _get_range(hub_file, url, 0, min(first_read, limit), deadline)
        if first.commit and hub_file.revision != first.commit:
            url = replace(hub_file, revision=first.commit).url()  # a commit's files never change
        return cls(hub_file, url, first, limit, deadline)

    def _range(self, start: int, length: int, deadline: float | None, *, allow_short: bool = False) -> bytes:
        """``length`` bytes at ``start`` of the version the first answer came from (fewer: see :func:`_get_range`)."""
        try:
            answer = _get_range(self.hub_file, self.url, start, length, deadline, allow_short=allow_short)
        except RemoteNotFoundError:
            if self.commit is None:
                raise
            raise self._changed(f"commit {self.commit[:12]} no longer serves it") from None
        self.bytes_received += answer.received
        self.requests += 1
        self._same_version(answer)
        return answer.body

    def _same_version(self, answer: _Answer) -> None:
        """Refuse an answer of another version of the file than the first answer's."""
        first = self._first
        if answer.size != first.size:
            raise self._changed(f"{first.size:,} bytes at the first request, {answer.size:,} later")
        if first.commit and answer.commit and answer.commit != first.commit:
            raise self._changed(f"commit {first.commit[:12]} at the first request, {answer.commit[:12]} later")
        if first.etag and answer.etag and answer.etag != first.etag:
            raise self._changed(
                f"ETag {printable(first.etag)[:70]} at the first request, {printable(answer.etag)[:70]} later"
            )

    def _changed(self, what: str) -> HubError:
        return HubError(
            f"the file changed on the Hub while it was read ({what}); nothing read is used: run again",
            str(self.hub_file),
        )

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer only at the end of the file or at ``limit``)."""
        end = min(offset + size, self.size, self.limit)
        if end <= offset:
            return b""
        have = len(self._prefix)
        if end > have:
            start = max(offset, have)
            body = self._range(start, end - start, self._deadline)
            if start == have:
                self._prefix += body
            elif offset >= start:
                return body
            else:  # pragma: no cover - parse_header reads contiguously from the start
                return bytes(self._prefix[offset:have]) + body
        return bytes(self._prefix[offset:end])

    def copy_range(self, start: int, length: int, write: Callable[[int, bytes], None]) -> None:
        """Fetch bytes ``start .. start+length`` of the file (tensor data, past any header ``limit``) and hand
        them to ``write(position within the range, bytes)`` in order, :data:`DATA_CHUNK` bytes a request.

        Each request has its own deadline (``GGUF_MTP_HUB_REQUEST_TIMEOUT``), not the file's: a large
        tensor takes as long as the network needs, but no request can stall. An answer cut short is
        resumed from its last byte (at most :data:`_ATTEMPTS` times in a row without a complete answer).

        Raises:
            HubError: as :meth:`open`; the file changed on the Hub; the range is outside the file.
        """
        if start < 0 or length < 0 or start + length > self.size:
            raise HubError(f"bytes {start:,}..{start + length:,} are outside the file ({self.size:,} bytes)",
                           str(self.hub_file))
        done = cut_short = 0
        while done < length:
            want = min(DATA_CHUNK, length - done)
            body = self._range(start + done, want, None, allow_short=True)
            if len(body) < want:
                cut_short += 1
                if cut_short > _ATTEMPTS:
                    raise HubError(
                        f"the connection closed early {cut_short} times in a row at byte {start + done + len(body):,}",
                        str(self.hub_file),
                    )
            else:
                cut_short = 0
            write(done, body)
            done += len(body)


def _get_range(
    hub_file: HubFile,
    url: str,
    start: int,
    length: int,
    file_deadline: float | None = None,
    *,
    allow_short: bool = False,
) -> _Answer:
    """GET ``length`` bytes at ``start``.

    huggingface_hub's back-off retries timeouts and busy answers (:data:`_ATTEMPTS` attempts in all), all
    within one deadline: the request's own, or the file's when that comes first. With ``allow_short``, a
    body cut off after some bytes comes back short (the caller resumes) instead of being an error.
    """
    from .access import is_offline, resolve_token

    name = str(hub_file)
    if is_offline():
        raise HubError(
            "HF_HUB_OFFLINE is set, so the Hub cannot be asked for this header; unset it, or inspect a local copy", name
        )
    headers = _headers(resolve_token())  # a token HTTP cannot send is one line here, not a traceback there
    headers["Range"] = f"bytes={start}-{start + length - 1}"
    headers["Accept-Encoding"] = "identity"  # byte ranges of the file, not of a compressed stream
    request_timeout = timeout_setting(ENV_HUB_REQUEST_TIMEOUT, DEFAULT_HUB_REQUEST_TIMEOUT)
    host = _host(url)
    deadline, per_file = _request_deadline(file_deadline, request_timeout, host, name)
    watchdog = _Watchdog(deadline)
    try:
        return watchdog.run(lambda: _fetch(hub_file, url, headers, start, length, watchdog, allow_short))
    except _DeadlinePassed:
        what = (
            f"reading the header took longer than {_file_timeout():g} s ({ENV_HUB_FILE_TIMEOUT})"
            if per_file
            else f"no complete answer within {request_timeout:g} s ({ENV_HUB_REQUEST_TIMEOUT})"
        )
        raise HubError(f"{host}: {what}", name) from None
    except HubError:
        raise
    except Exception as error:
        if _is_redirect_loop(error):
            raise HubError(f"too many redirects from {host} (a redirect loop?)", name) from None
        translated = _read_error(error, hub_file)
        if translated is None:
            raise
        raise translated from error


def _request_deadline(
    file_deadline: float | None, request_timeout: float, host: str, name: str
) -> tuple[float, bool]:
    """When a range request must be answered, and whether that is the file's deadline: the request's own
    deadline, or the file's when that comes first.

    Raises:
        HubError: the file's deadline has passed already.
    """
    now = time.monotonic()
    if file_deadline is not None and now >= file_deadline:
        raise HubError(
            f"reading the header from {host} took longer than {_file_timeout():g} s ({ENV_HUB_FILE_TIMEOUT})", name
        )
    deadline = now + request_timeout
    if file_deadline is not None and file_deadline < deadline:
        return file_deadline, True
    return deadline, False


def _read_error(error: BaseException, hub_file: HubFile) -> HubError | None:
    """The one line for a failed range read (:func:`~.errors.hub_error`), or ``None`` for a bug."""
    from .errors import hub_error

    return hub_error(
        error,
        "read the header",
        hub_file.repo_id,
        revision=hub_file.revision,
        file=hub_file.path_in_repo,
        path=str(hub_file),
    )


def _headers(token: str | None) -> dict[str, str]:
    """huggingface_hub's request headers (user agent, ``authorization`` when there is a token)."""
    from huggingface_hub.utils import build_hf_headers

    from gguf_mtp._version import __version__

    return dict(build_hf_headers(token=token or False, library_name="gguf-mtp", library_version=__version__))


def _file_timeout() -> float:
    return timeout_setting(ENV_HUB_FILE_TIMEOUT, DEFAULT_HUB_FILE_TIMEOUT)


def _host(url: str) -> str:
    return url.split("/")[2] if "//" in url else url


def _is_redirect_loop(error: BaseException) -> bool:
    """Whether ``error`` is the HTTP library's "too many redirects" (requests, httpx or httpx2)."""
    kind = type(error)
    return kind.__name__ == "TooManyRedirects" and kind.__module__.split(".")[0] in ("requests", "httpx", "httpx2")


class _DeadlinePassed(Exception):
    """The range read was still running at its deadline (and was cut off)."""


class _Watchdog:
    """Runs one range read in a worker thread, so that the caller can walk away at the deadline.

    A per-read timeout does not bound a server that sends one byte every few seconds. At the deadline
    the caller gives up and has the response the worker is reading closed (its next read fails);
    :meth:`guard` (the request's ``auth`` hook, which both HTTP stacks call before each attempt of
    huggingface_hub's back-off) keeps a cut-off worker from sending another request.
    """

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.cancelled = threading.Event()
        self.response: Any = None  # the response being read, once there is one
        self.commit: str | None = None  # the first X-Repo-Commit among the answers (redirects included)
        self.linked_etag: str | None = None  # the first X-Linked-Etag among them (the Hub's, before its CDN)
        self._result: _Answer | None = None
        self._error: BaseException | None = None

    def guard(self, request: Any) -> Any:
        """Let an attempt go out unchanged, unless the deadline has passed."""
        if self.cancelled.is_set():
            raise _DeadlinePassed
        return request

    def answered(self, response: Any, *args: object, **kwargs: object) -> None:
        """See each response as it arrives, its body unread (redirects and answers retried too): keep it for
        the cut-off, and close an error answer that does not say it is small, so that nobody reads a large
        error body (neither we, nor ``hf_raise_for_status`` for the server's message, nor the back-off when
        it gives up)."""
        self.response = response
        headers = response.headers
        commit = (headers.get("X-Repo-Commit") or "").strip().lower()
        if self.commit is None and _COMMIT.match(commit):
            self.commit = commit
        self.linked_etag = self.linked_etag or (headers.get("X-Linked-Etag") or "").strip() or None
        if response.status_code >= 400 and not 0 <= _content_length(response) <= _ERROR_BODY_LIMIT:
            response.close()

    def _close_response(self) -> None:
        with contextlib.suppress(Exception):  # whatever state the read is in, it is abandoned
            if self.response is not None:
                self.response.close()

    def run(self, work: Callable[[], _Answer]) -> _Answer:
        """``work()``, or :class:`_DeadlinePassed` when it is not done by the deadline."""

        def worker() -> None:
            try:
                self._result = work()
            except BaseException as e:  # handed to the waiting caller
                self._error = e

        thread = threading.Thread(target=worker, name="gguf-mtp-hub-read", daemon=True)  # a stuck read must not
        thread.start()  # keep the process alive
        thread.join(max(0.0, self.deadline - time.monotonic()))
        if thread.is_alive():
            self.cancelled.set()
            # Closed from yet another thread: closing a requests response waits for the read it ends.
            threading.Thread(target=self._close_response, name="gguf-mtp-hub-cutoff", daemon=True).start()
            raise _DeadlinePassed
        if self._error is not None:
            raise _DeadlinePassed if isinstance(self._error, _DeadlinePassed) else self._error
        assert self._result is not None
        return self._result


@contextlib.contextmanager
def _range_response(url: str, headers: dict[str, str], timeout: float, watchdog: _Watchdog) -> Iterator[Any]:
    """The streamed answer to a GET of ``url`` on huggingface_hub's own session, redirects followed.

    huggingface_hub 1.x and 2.x: ``http_stream_backoff`` on its httpx / httpx2 client; 0.x:
    ``http_backoff`` on its requests session. Either way the session's settings apply (proxies with
    their credentials, CA bundle, a client factory of the user's), and the token is not sent to another
    host when the Hub redirects to its CDN (both libraries drop ``Authorization`` across origins).
    """
    from huggingface_hub import utils as hf_utils

    backoff: dict[str, Any] = {
        "max_retries": _ATTEMPTS - 1,
        "base_wait_time": _BACKOFF_WAIT,
        "max_wait_time": 4 * _BACKOFF_WAIT,
        "retry_on_status_codes": _RETRY_STATUSES,
    }
    stream = getattr(hf_utils, "http_stream_backoff", None)
    if stream is not None:
        session = hf_utils.get_session()
        library = _httpx_library(session)
        auth = _httpx_hooks(library, watchdog)
        # Timeouts only: a host name that does not resolve or a refused connection does not get better by waiting.
        backoff["retry_on_exceptions"] = (library.TimeoutException,) if library is not None else ()
        with stream(
            "GET", url, headers=headers, timeout=timeout, follow_redirects=True, auth=auth, **backoff
        ) as response:
            yield response
        return
    import requests

    hooks = {"response": [watchdog.answered]}
    backoff["retry_on_exceptions"] = (requests.Timeout,)
    response = hf_utils.http_backoff(
        "GET",
        url,
        headers=headers,
        timeout=timeout,
        stream=True,
        allow_redirects=True,
        auth=watchdog.guard,
        hooks=hooks,
        **backoff,
    )
    try:
        yield response
    finally:
        response.close()


def _httpx_library(session: object) -> Any:
    """The module (httpx2 or httpx) whose ``Client`` ``session`` is, or ``None``."""
    for name in ("httpx2", "httpx"):
        library = sys.modules.get(name)
        if library is not None and isinstance(session, library.Client):
            return library
    return None


def _httpx_hooks(library: Any, watchdog: _Watchdog) -> Any:
    """The watchdog's :meth:`~_Watchdog.guard` and :meth:`~_Watchdog.answered` as an httpx / httpx2 ``Auth``
    (the one per-request hook that sees each response before the back-off does); a client of another
    kind (``library`` is ``None``) gets the guard alone."""
    if library is None:
        return watchdog.guard

    def auth_flow(self: object, request: Any) -> Iterator[Any]:
        response = yield watchdog.guard(request)
        watchdog.answered(response)

    return type("WatchdogHooks", (library.Auth,), {"auth_flow": auth_flow})()


def _fetch(
    hub_file: HubFile,
    url: str,
    headers: dict[str, str],
    start: int,
    length: int,
    watchdog: _Watchdog,
    allow_short: bool = False,
) -> _Answer:
    read_timeout = max(
        1.0, min(float(getattr(hf_constants, "HF_HUB_DOWNLOAD_TIMEOUT", 10)) * 3, watchdog.deadline - time.monotonic())
    )
    with _range_response(url, headers, read_timeout, watchdog) as response:
        if response.status_code >= 400 and response.status_code != 416:
            _raise_for_status(hub_file, response)
        body, size, received = _read_body(hub_file, response, start, length, watchdog, allow_short)
        commit = watchdog.commit
        if commit is None:
            stated = (response.headers.get("X-Repo-Commit") or "").strip().lower()
            commit = stated if _COMMIT.match(stated) else None
        etag = watchdog.linked_etag or (response.headers.get("ETag") or "").strip() or None
        return _Answer(body, size, received, commit, etag)


def _raise_for_status(hub_file: HubFile, response: Any) -> None:
    """huggingface_hub's typed error for an error answer (from its status and ``X-Error-Code``).

    ``hf_raise_for_status`` reads the body for the server's message: only a small one that says its
    length is still open (:meth:`_Watchdog.answered`), so that an error answer cannot be a large download.
    """
    from huggingface_hub.utils import hf_raise_for_status

    hf_raise_for_status(response)
    raise HubError(f"unexpected HTTP status {response.status_code}", str(hub_file))


def _body_chunks(response: Any, size: int) -> Iterator[bytes]:
    """The body as it arrives, undecoded, in pieces of about ``size`` bytes (httpx / httpx2, or requests)."""
    iter_raw = getattr(response, "iter_raw", None)
    chunks: Iterator[bytes] = iter_raw(size) if iter_raw is not None else response.iter_content(size)
    return chunks


def _read_body(
    hub_file: HubFile, response: Any, start: int, length: int, watchdog: _Watchdog, allow_short: bool = False
) -> tuple[bytes, int, int]:
    """The body of a range response, the file size it states, and the bytes received (with ``allow_short``,
    a body cut off after its first bytes, by the server or the network, comes back short)."""
    name = str(hub_file)
    size = _stated_size(response, start, name)
    if response.status_code == 416:  # nothing to read: the range starts at or past the end
        return b"", size, 0
    body, received = _stream_body(response, length, watchdog, allow_short)
    expected = min(length, size - start)
    if len(body) < expected and not (allow_short and body):
        raise HubError(f"connection closed after {len(body):,} of {expected:,} bytes at byte {start:,}", name)
    return body, size, received


def _stated_size(response: Any, start: int, name: str) -> int:
    """The file size a range response states (Content-Range, or Content-Length when the server ignores
    Range), checked against the range asked for at ``start``; its body unread.

    Raises:
        HubError: a compressed body, a Content-Range of another range, no size, an unexpected status.
    """
    encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding not in ("", "identity"):
        # We asked for identity: the bytes of a compressed stream are not the file's bytes at these offsets.
        raise HubError(
            f"the server compressed the body (Content-Encoding: {printable(encoding)[:40]}) "
            "although the file's own bytes were asked for",
            name,
        )
    status = response.status_code
    if status == 416:
        return _refused_range_size(response, name)
    if status == 206:
        return _partial_content_size(response, start, name)
    if status == 200:
        return _whole_content_size(response, start, name)
    raise HubError(f"unexpected HTTP status {status}", name)


def _refused_range_size(response: Any, name: str) -> int:
    """The size a 416 answer states (an empty file answers ``bytes */0``); a refusal without one is an error."""
    match = _CONTENT_RANGE.match(response.headers.get("Content-Range") or "")
    if match and match["size"] != "*":
        return int(match["size"])
    raise HubError("the server refused the byte range request (HTTP 416)", name)


def _partial_content_size(response: Any, start: int, name: str) -> int:
    """The size a 206 answer's Content-Range states, when the range it holds starts at ``start``."""
    content_range = response.headers.get("Content-Range") or ""
    match = _CONTENT_RANGE.match(content_range)
    if not match or match["start"] is None or int(match["start"]) != start or match["size"] == "*":
        raise HubError(f"unexpected Content-Range {printable(repr(content_range))[:80]}", name)
    return int(match["size"])


def _whole_content_size(response: Any, start: int, name: str) -> int:
    """The size a 200 answer states: the server ignored Range, so only a read from byte 0 can use it
    (read no further than asked, then hang up: never the whole file)."""
    if start:
        raise HubError("the server does not support HTTP range requests", name)
    size = _content_length(response)
    if size < 0:
        raise HubError("the server does not support HTTP range requests and sends no Content-Length", name)
    return size


def _stream_body(response: Any, length: int, watchdog: _Watchdog, allow_short: bool) -> tuple[bytes, int]:
    """The first ``length`` bytes of the body and the bytes received, stopped at the watchdog's cut-off (with
    ``allow_short``, a transport failure after the first bytes ends the body instead of failing the read)."""
    chunks: list[bytes] = []
    received = 0
    try:
        for chunk in _body_chunks(response, min(_CHUNK, length)):
            if watchdog.cancelled.is_set():
                raise _DeadlinePassed
            chunks.append(chunk[: length - received])  # never more than asked for, whatever the server means to send
            received += len(chunk)
            if received >= length:
                break
    except Exception as error:
        from .errors import transport_failure

        if not (allow_short and received and transport_failure(error) is not None):
            raise
    return b"".join(chunks), received


def _content_length(response: Any) -> int:
    text = (response.headers.get("Content-Length") or "").strip()
    return int(text) if text.isdigit() else -1
