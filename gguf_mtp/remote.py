"""Read GGUF headers on the Hugging Face Hub with HTTP range requests, never the tensor data.

A Hub file is named ``hf://OWNER/REPO/path/to/file.gguf``, optionally with a revision
(``...file.gguf@REV`` or ``hf://OWNER/REPO@REV/path``) and a repo type prefix (``hf://datasets/...``).
Its URL comes from :func:`huggingface_hub.hf_hub_url` (so ``HF_ENDPOINT`` is honoured) and requests go
through huggingface_hub's shared HTTP session with its headers (so ``HF_TOKEN`` or a stored login is
sent, and redirects to the CDN are followed). The first request asks for :data:`FIRST_READ` bytes and
learns the file size from ``Content-Range``; the header parser then asks for more only as it needs it,
doubling each time, and never more than :data:`MAX_REMOTE_HEADER_BYTES` in all.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

from huggingface_hub import constants as hf_constants  # cheap; the HTTP stack is imported on first use

from .errors import HubError

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
_CONTENT_RANGE = re.compile(r"^bytes (?:(?P<start>\d+)-(?P<end>\d+)|\*)/(?P<size>\d+|\*)$")
_RETRY_STATUSES = {429, 500, 502, 503, 504}
_ATTEMPTS = 3


class RemoteNotFoundError(HubError):
    """The repository exists, but not this file (at this revision)."""


def is_hub_path(source: object) -> bool:
    """Whether ``source`` names a Hub file (``hf://...``) rather than a local path."""
    return isinstance(source, str) and source.startswith(HF_SCHEME)


@dataclass(frozen=True)
class HubFile:
    """One file in a Hub repository, at an optional revision."""

    repo_id: str
    path_in_repo: str
    revision: str | None = None
    repo_type: str = "model"

    @classmethod
    def parse(cls, source: str) -> HubFile:
        """Parse ``hf://[datasets/|spaces/]OWNER/REPO[@REV]/path/to/file.gguf[@REV]``.

        Raises:
            HubError: the address does not name a file in a repository.
        """
        if not is_hub_path(source):
            raise HubError(f"not a Hub address (expected {HF_SCHEME}OWNER/REPO/path/to/file.gguf)", source)
        parts = source[len(HF_SCHEME) :].split("/")
        repo_type = "model"
        if parts and parts[0] in _REPO_TYPE_PREFIXES:
            repo_type = _REPO_TYPE_PREFIXES[parts.pop(0)]
        if len(parts) < 3 or not all(parts[:2]) or not parts[-1]:
            raise HubError(f"expected {HF_SCHEME}OWNER/REPO/path/to/file.gguf[@revision]", source)
        owner, repo, rest = parts[0], parts[1], "/".join(parts[2:])
        revision = None
        if "@" in repo:
            repo, revision = repo.split("@", 1)
        if "@" in rest:
            if revision is not None:
                raise HubError("two revisions given", source)
            rest, revision = rest.rsplit("@", 1)
        if not repo or not rest or revision == "":
            raise HubError(f"expected {HF_SCHEME}OWNER/REPO/path/to/file.gguf[@revision]", source)
        return cls(f"{owner}/{repo}", rest, revision, repo_type)

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


def _offline() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return hf_constants.is_offline_mode() or flag.strip().upper() in ("1", "ON", "YES", "TRUE")


class RemoteFile:
    """A Hub file read by HTTP range requests, keeping what it read from the start of the file.

    Reads are served from the bytes already fetched when possible, so parsing a header twice costs
    no traffic, and never reach past ``limit`` bytes from the start of the file (a read there comes
    back short, which the header parser reports as a header over its limit). ``bytes_received``
    counts every body byte the server sent.

    Use :meth:`open`, which makes the first request and learns the size.
    """

    def __init__(
        self, hub_file: HubFile, url: str, size: int, prefix: bytes, bytes_received: int, limit: int
    ) -> None:
        self.hub_file = hub_file
        self.url = url
        self.size = size
        self.limit = limit
        self._prefix = bytearray(prefix)
        self.bytes_received = bytes_received
        self.requests = 1

    @classmethod
    def open(
        cls, hub_file: HubFile, *, first_read: int = FIRST_READ, limit: int = MAX_REMOTE_HEADER_BYTES
    ) -> RemoteFile:
        """Fetch the first ``first_read`` bytes of ``hub_file`` and its size; read no more than
        ``limit`` bytes of it in all.

        Raises:
            RemoteNotFoundError: no such file in the repository (at that revision).
            HubError: offline mode, no access, network failure, or a server that ignores ranges.
        """
        url = hub_file.url()
        body, size, received = _get_range(hub_file, url, 0, min(first_read, limit))
        return cls(hub_file, url, size, body, received, limit)

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer only at the end of the file or at ``limit``)."""
        end = min(offset + size, self.size, self.limit)
        if end <= offset:
            return b""
        have = len(self._prefix)
        if end > have:
            start = max(offset, have)
            body, _, received = _get_range(self.hub_file, self.url, start, end - start)
            self.bytes_received += received
            self.requests += 1
            if start == have:
                self._prefix += body
            elif offset >= start:
                return body
            else:  # pragma: no cover - parse_header reads contiguously from the start
                return bytes(self._prefix[offset:have]) + body
        return bytes(self._prefix[offset:end])


def _get_range(hub_file: HubFile, url: str, start: int, length: int) -> tuple[bytes, int, int]:
    """GET ``length`` bytes at ``start``: (body, file size, bytes received)."""
    if _offline():
        raise HubError(
            "HF_HUB_OFFLINE is set, so the Hub cannot be asked for this header; unset it, or inspect a local copy",
            str(hub_file),
        )
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers()
    headers["Range"] = f"bytes={start}-{start + length - 1}"
    headers["Accept-Encoding"] = "identity"  # byte ranges of the file, not of a compressed stream
    last_error: Exception | None = None
    for _ in range(_ATTEMPTS):
        try:
            return _request(hub_file, url, headers, start, length)
        except _Retry as e:
            last_error = e.cause
    host = url.split("/")[2] if "//" in url else url
    raise HubError(f"cannot read from {host} after {_ATTEMPTS} attempts: {_one_line(last_error)}", str(hub_file))


class _Retry(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _request(hub_file: HubFile, url: str, headers: dict[str, str], start: int, length: int) -> tuple[bytes, int, int]:
    import httpx2
    from huggingface_hub import get_session
    from huggingface_hub.errors import OfflineModeIsEnabled

    timeout = httpx2.Timeout(float(hf_constants.HF_HUB_DOWNLOAD_TIMEOUT) * 3)
    try:
        with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as response:
            status = response.status_code
            if status in _RETRY_STATUSES:
                response.read()
                raise _Retry(HubError(f"HTTP {status}"))
            if status >= 400 and status != 416:
                response.read()
                _raise_for_status(hub_file, response)
            return _read_body(hub_file, response, start, length)
    except OfflineModeIsEnabled:
        raise HubError("HF_HUB_OFFLINE is set, so the Hub cannot be asked for this header", str(hub_file)) from None
    except httpx2.TransportError as e:
        raise _Retry(e) from None


def _read_body(hub_file: HubFile, response: Any, start: int, length: int) -> tuple[bytes, int, int]:
    """The body of a range response, the file size it states, and the bytes received."""
    name = str(hub_file)
    if response.status_code == 416:  # e.g. an empty file: "bytes */0"
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        response.read()
        if match and match["size"] != "*":
            return b"", int(match["size"]), 0
        raise HubError("the server refused the byte range request (HTTP 416)", name)
    if response.status_code == 206:
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
        if not match or match["start"] is None or int(match["start"]) != start or match["size"] == "*":
            raise HubError(f"unexpected Content-Range {response.headers.get('Content-Range')!r}", name)
        size = int(match["size"])
    elif response.status_code == 200:
        # The server ignores Range: read no further than asked, then hang up (never the whole file).
        if start:
            raise HubError("the server does not support HTTP range requests", name)
        size = int(response.headers.get("Content-Length", -1))
        if size < 0:
            raise HubError("the server does not support HTTP range requests and sends no Content-Length", name)
    else:
        raise HubError(f"unexpected HTTP status {response.status_code}", name)
    chunks: list[bytes] = []
    received = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        received += len(chunk)
        if received >= length:
            break
    body = b"".join(chunks)[:length]
    expected = min(length, size - start)
    if len(body) < expected:
        raise HubError(f"connection closed after {len(body):,} of {expected:,} bytes at byte {start:,}", name)
    return body, size, received


def _raise_for_status(hub_file: HubFile, response: Any) -> None:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import hf_raise_for_status

    name = str(hub_file)
    try:
        hf_raise_for_status(response)
    except GatedRepoError:
        raise HubError(
            f"{hub_file.repo_id} is gated: accept its terms on the Hub and set HF_TOKEN (or run `hf auth login`)",
            name,
        ) from None
    except RepositoryNotFoundError:
        raise HubError(
            f"repository {hub_file.repo_id} not found (or private: set HF_TOKEN to a token that can read it)", name
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"revision {hub_file.revision!r} not found in {hub_file.repo_id}", name) from None
    except RemoteEntryNotFoundError:
        raise RemoteNotFoundError(_not_found(hub_file), name) from None
    except HfHubHTTPError as e:
        if response.status_code == 404:
            raise RemoteNotFoundError(_not_found(hub_file), name) from None
        if response.status_code in (401, 403):
            raise HubError(
                f"HTTP {response.status_code}: no access (set HF_TOKEN to a token that can read it)", name
            ) from None
        raise HubError(f"HTTP {response.status_code}: {_one_line(e)}", name) from None
    raise HubError(f"HTTP {response.status_code}", name)


def _not_found(hub_file: HubFile) -> str:
    at = f" at revision {hub_file.revision}" if hub_file.revision else ""
    return f"no file {hub_file.path_in_repo} in {hub_file.repo_id}{at}"


def _one_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
