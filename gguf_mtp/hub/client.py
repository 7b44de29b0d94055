"""The Hugging Face Hub boundary: every call gguf-mtp makes to the Hub to publish or to download.

Everything else works on local paths and plain data, and takes an ``api`` argument: an
:class:`huggingface_hub.HfApi`, or in tests a stand-in object with the same methods that records the
calls. Hub failures come out as one-line :class:`~gguf_mtp.errors.HubError` messages (offline, no
token, token refused, no write access, repository or revision missing, network down).

Network failures: huggingface_hub's transport is requests (0.x), httpx (1.x) or httpx2 (2.x), each
with its own exception tree. :func:`transport_failure` recognises all three by their libraries' base
classes (and the socket errors beneath them), so every Hub call made through :func:`hub_errors` turns
a refused connection, an unknown host or a timeout into one :class:`~gguf_mtp.errors.HubUnreachableError`
naming the host and the cause. huggingface_hub retries timeouts and busy answers (429, 5xx) with
back-off, and one line says so (:func:`retry_notice`); a host name that does not resolve and a refused
connection fail at once (:func:`fails_at_once`): no wait makes them succeed.

Token rule (the Hub's own): ``HF_TOKEN`` in the environment overrides the stored login
(``hf auth login``).
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import ssl
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from gguf_mtp.errors import HubError, HubUnreachableError
from gguf_mtp.text import printable

from .hub_api import HubApi

__all__ = [
    "RemoteFile",
    "RemoteNotFoundError",
    "answer_error",
    "cached_file",
    "cached_repo_files",
    "check_path_in_repo",
    "check_repo_id",
    "check_token_env",
    "check_token_text",
    "check_write_access",
    "delete_remote_file",
    "download_files",
    "fails_at_once",
    "hub_error",
    "hub_errors",
    "is_offline",
    "is_repo_id",
    "list_repo_files",
    "make_api",
    "read_remote_text",
    "remote_files",
    "require_online",
    "resolve_token",
    "retry_notice",
    "transport_failure",
    "unreachable_error",
    "upload_one_commit",
    "upload_resumable",
]

T = TypeVar("T")

_LOGIN_HINT = "set HF_TOKEN or run `hf auth login`"


def is_offline() -> bool:
    """Whether Hub access is switched off, exactly as the installed huggingface_hub decides it.

    ``huggingface_hub.constants.is_offline_mode()`` where the release has it, else its ``HF_HUB_OFFLINE``
    constant (both read ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` when huggingface_hub is imported).
    """
    from huggingface_hub import constants

    check = getattr(constants, "is_offline_mode", None)
    return bool(check()) if callable(check) else bool(constants.HF_HUB_OFFLINE)


def require_online(what: str) -> None:
    """Raise a :class:`HubError` when the Hub cannot be reached by configuration.

    Raises:
        HubError: ``HF_HUB_OFFLINE`` is set.
    """
    if is_offline():
        raise HubError(f"cannot {what}: HF_HUB_OFFLINE is set (unset it, or use dry_run)", parameter="dry_run")


def resolve_token() -> str | None:
    """The token huggingface_hub would send: ``HF_TOKEN`` when set, else the stored login, else ``None``.

    Raises:
        HubError: the token holds characters an HTTP header cannot carry (a token is ASCII).
    """
    from huggingface_hub import get_token

    source = "HF_TOKEN" if os.environ.get("HF_TOKEN", "").strip() else "the stored Hugging Face token"
    try:
        token = get_token()
    except (OSError, UnicodeError):  # an unreadable stored-token file is the same as no token for our purpose
        return None
    if token:
        check_token_text(token, source)
    return token or None


def check_token_text(token: str, source: str = "HF_TOKEN") -> None:
    """Refuse a token that is not printable ASCII, before the HTTP layer fails on it with a traceback.

    Raises:
        HubError: ``token`` has a non-ASCII or a control character.
    """
    if not token.isascii():
        raise HubError(f"{source} contains non-ASCII characters; a Hugging Face token is ASCII (hf_...): set it again")
    if not token.isprintable():
        raise HubError(f"{source} contains control characters; a Hugging Face token is one printable word")


def check_token_env() -> None:
    """Check the token huggingface_hub will read (see :func:`resolve_token`), for code that lets it read it.

    Raises:
        HubError: see :func:`check_token_text`.
    """
    resolve_token()


def make_api(api: HubApi | None = None, *, token: str | None = None) -> HubApi:
    """``api`` when given (a stand-in in tests), else a real :class:`huggingface_hub.HfApi` holding ``token``."""
    if api is not None:
        return api
    from huggingface_hub import HfApi

    from gguf_mtp._version import __version__

    return HfApi(token=token, library_name="gguf-mtp", library_version=__version__)


# ----------------------------------------------------------------------------------------------- errors


class RemoteNotFoundError(HubError):
    """The repository exists, but not this file (at this revision)."""


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _token_state() -> str:
    try:
        return "the token was refused" if resolve_token() else "no token is set (set HF_TOKEN)"
    except HubError:
        return "the token was refused"


def answer_error(
    status: int,
    error_code: str | None,
    what: str,
    repo: str,
    *,
    revision: str | None = None,
    file: str | None = None,
    detail: str = "",
    write: bool = False,
    path: str | None = None,
) -> HubError:
    """The one-line :class:`HubError` for an HTTP answer of the Hub: ``status`` and its ``X-Error-Code``.

    This is the one place where the Hub's answers become messages; :func:`hub_error` turns
    huggingface_hub's typed exceptions into the same answers first.
    """
    at = f" at revision {revision}" if revision else ""
    code = (error_code or "").strip()
    if code == "GatedRepo":
        text = (
            f"{repo} is gated: accept its terms on https://huggingface.co/{repo}, then set HF_TOKEN "
            "(or run `hf auth login`) with that account"
        )
    elif code == "RevisionNotFound":
        text = f"revision {revision!r} not found in {repo}"
    elif code == "RepoNotFound" or (status == 404 and not file and code != "EntryNotFound"):
        text = f"repository {repo} not found, or private and {_token_state()}"
    elif code == "EntryNotFound" or status == 404:
        missing = f"no file {file}" if file else "a file asked for is not"
        return RemoteNotFoundError(f"cannot {what}: {missing} in {repo}{at}", path)
    elif status == 407:
        text = "the proxy asks for credentials (407): give them in its address (HTTPS_PROXY=http://USER:PASSWORD@HOST:PORT)"
    elif status == 401:
        text = f"the Hub refused the token (401); {_LOGIN_HINT} with a valid token"
    elif status == 403 and write:
        text = f"no write access to {repo} (403); use a token with write permission for it"
    elif status == 403:
        text = f"no access to {repo} (403); set HF_TOKEN to a token that can read it"
    else:
        text = f"the Hub answered {status}" + (f": {detail}" if detail else "")
    return HubError(f"cannot {what}: {text}", path)


#: The base class of a transport failure in each HTTP library a huggingface_hub release line uses:
#: requests (0.x), httpx (1.x), httpx2 (2.x). Looked up in ``sys.modules`` only: an exception of a
#: library that was never imported cannot be in flight.
_TRANSPORT_BASES = (("requests", "RequestException"), ("httpx", "TransportError"), ("httpx2", "TransportError"))
#: Kinds of these that are an answer, not a transport failure (huggingface_hub's 0.x HTTP errors derive from them).
_ANSWER_KINDS = (("requests", "HTTPError"),)
_SOCKET_FAILURES = (ConnectionError, TimeoutError, socket.gaierror, socket.herror, ssl.SSLError)
_MAX_CHAIN = 32


def _classes(names: tuple[tuple[str, str], ...]) -> tuple[type[BaseException], ...]:
    found = []
    for module_name, attribute in names:
        module = sys.modules.get(module_name)
        kind = getattr(module, attribute, None) if module is not None else None
        if isinstance(kind, type) and issubclass(kind, BaseException):
            found.append(kind)
    return tuple(found)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or while handling (bounded, cycles cut)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(chain) < _MAX_CHAIN and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _is_transport(error: BaseException) -> bool:
    if isinstance(error, _classes(_ANSWER_KINDS)):
        return False
    return isinstance(error, (*_classes(_TRANSPORT_BASES), *_SOCKET_FAILURES))


def _request_host(error: BaseException) -> str | None:
    """The host (and port) of the request a transport error carries (httpx, httpx2, requests)."""
    try:
        request = getattr(error, "request", None)  # httpx raises RuntimeError when the error has none
    except RuntimeError:
        return None
    url = getattr(request, "url", None)
    if url is None:
        return None
    from urllib.parse import urlsplit

    return urlsplit(str(url)).netloc.rpartition("@")[2] or None


def _endpoint_host() -> str:
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    return urlsplit(str(constants.ENDPOINT)).netloc or str(constants.ENDPOINT)


def _cause(chain: Sequence[BaseException], host: str) -> str:
    """What went wrong, naming ``host``, from the deepest socket-level error of the chain."""
    for error in reversed(chain):
        if isinstance(error, socket.gaierror):
            return f"cannot resolve the host name {host} ({printable(error.strerror or error)})"
        if isinstance(error, ConnectionRefusedError):
            return f"connection refused by {host}"
        if isinstance(error, ConnectionResetError):
            return f"connection reset by {host}"
        if isinstance(error, (TimeoutError, socket.timeout)):
            return f"timed out talking to {host}"
        if isinstance(error, ssl.SSLError):
            return f"TLS with {host} failed ({printable(_first_line(error))[:120]})"
    deepest = next((e for e in reversed(chain) if _is_transport(e)), chain[0])
    text = printable(_first_line(deepest))[:160]
    name = type(deepest).__name__
    return (f"{name}: {text}" if text != name else name) + f" (host {host})"


def transport_failure(error: BaseException, host: str | None = None) -> tuple[str, str] | None:
    """``(host, what went wrong)`` when ``error`` is, or was raised from, a network failure; else ``None``.

    Recognised by the transport libraries' base classes (``requests.RequestException`` but not its
    ``HTTPError``, ``httpx.TransportError``, ``httpx2.TransportError``) and by the socket errors beneath
    them (``ConnectionError``, ``TimeoutError``, ``socket.gaierror``, ``ssl.SSLError``); never by message.
    ``host`` is the request's (or, when the error does not carry it, this one, else ``HF_ENDPOINT``'s).
    """
    chain = _chain(error)
    if not any(_is_transport(e) for e in chain):
        return None
    found = next((h for e in chain if (h := _request_host(e))), None) or host or _endpoint_host()
    return printable(found), _cause(chain, printable(found))


def fails_at_once(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from, a failure that waiting cannot cure: the host name does not
    resolve, or the host refuses the connection. Only timeouts and busy answers (429, 5xx) are worth a retry."""
    return any(isinstance(e, (socket.gaierror, ConnectionRefusedError)) for e in _chain(error))


def unreachable_error(what: str, failure: tuple[str, str], path: str | None = None) -> HubUnreachableError:
    """The one line for a Hub that cannot be reached."""
    return HubUnreachableError(f"cannot {what}: {failure[1]}; check the network, a proxy, or HF_ENDPOINT", path)


# ----------------------------------------------------------------------------------------------- retries

#: huggingface_hub's back-off logs each wait on this logger ("Retrying in 2s [Retry 1/5].").
_BACKOFF_LOGGER = "huggingface_hub.utils._http"
_notice_lock = threading.Lock()
_notice_depth = 0
_notice_filter: _RetryNotice | None = None
_retry_log = logging.getLogger("gguf_mtp.hub")


class _RetryNotice(logging.Filter):
    """Says once per Hub call (on ``gguf_mtp.hub``'s logger) that huggingface_hub is retrying, and lets its
    own lines through only where its logger's level shows them (``-v``)."""

    def __init__(self, what: str, shown: bool, saved_level: int) -> None:
        super().__init__()
        self.what = what
        self.shown = shown
        self.saved_level = saved_level  # the back-off logger's own level, restored afterwards
        self.said = False
        self.last_failure = ""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if " thrown while requesting " in text:
            # The back-off logs this while it handles the failure, before it waits: a failure no wait can
            # cure (see fails_at_once) leaves the back-off here, as it would once its retries ran out.
            handled = sys.exc_info()[1]
            if handled is not None and fails_at_once(handled):
                raise handled
            failure, _, request = text.partition(" thrown while requesting ")
            url = request.rpartition(" ")[2]
            from urllib.parse import urlsplit

            host = urlsplit(url).netloc.rpartition("@")[2] or _endpoint_host()
            self.last_failure = f"{printable(host)}: {printable(failure.strip(chr(39)))[:120]}"
        elif text.startswith("Retrying in ") and not self.said:
            self.said = True
            failure = f" ({self.last_failure})" if self.last_failure else ""
            _retry_log.warning(
                "the Hub did not answer%s; huggingface_hub is retrying with back-off (%s)", failure, self.what
            )
        return self.shown


@contextmanager
def retry_notice(what: str) -> Iterator[None]:
    """While the block runs, huggingface_hub's first "Retrying in ..." becomes one line on ``gguf_mtp.hub``.

    Without it a Hub call that backs off (up to about half a minute) is silent unless ``-v`` is given. A host
    name that does not resolve or a refused connection is not retried at all (:func:`fails_at_once`): the call
    fails at its first attempt, as it would after its last.
    Nested and concurrent blocks share one filter: the outermost one installs and removes it.
    """
    global _notice_depth, _notice_filter
    backoff = logging.getLogger(_BACKOFF_LOGGER)
    with _notice_lock:
        _notice_depth += 1
        if _notice_depth == 1:
            shown = backoff.isEnabledFor(logging.WARNING)
            _notice_filter = _RetryNotice(what, shown, backoff.level)
            backoff.addFilter(_notice_filter)
            if not shown:
                backoff.setLevel(logging.WARNING)  # the records must exist for the filter to see them
    try:
        yield
    finally:
        with _notice_lock:
            _notice_depth -= 1
            if _notice_depth == 0 and _notice_filter is not None:
                backoff.removeFilter(_notice_filter)
                backoff.setLevel(_notice_filter.saved_level)
                _notice_filter = None



def hub_error(
    error: BaseException,
    what: str,
    repo: str,
    *,
    revision: str | None = None,
    file: str | None = None,
    write: bool = False,
    path: str | None = None,
) -> HubError | None:
    """The one-line :class:`HubError` for a failed huggingface_hub call, or ``None`` when ``error`` is a bug.

    Matches huggingface_hub's typed exceptions (``huggingface_hub.errors``); network failures of any
    release line (:func:`transport_failure`, also when huggingface_hub wrapped one) become a
    :class:`~gguf_mtp.errors.HubUnreachableError`.
    """
    from huggingface_hub import errors as e

    remote_missing = getattr(e, "RemoteEntryNotFoundError", e.EntryNotFoundError)  # before 1.0: EntryNotFoundError
    cached = f"{file} is" if file else "the files are"
    if isinstance(error, HubError):
        return error
    if isinstance(error, e.OfflineModeIsEnabled) or (isinstance(error, e.LocalEntryNotFoundError) and is_offline()):
        return HubError(
            f"cannot {what}: HF_HUB_OFFLINE is set and {cached} not in the Hub cache "
            "(run once online, or unset HF_HUB_OFFLINE)",
            path,
        )
    failure = transport_failure(error)
    if failure is not None:  # whichever HTTP library raised it, or huggingface_hub wrapped it
        return unreachable_error(what, failure, path)
    if isinstance(error, e.LocalTokenNotFoundError):
        return HubError(f"cannot {what}: no Hugging Face token ({_LOGIN_HINT})", path)
    if isinstance(error, e.HFValidationError):
        return HubError(f"cannot {what}: {printable(_first_line(error))}", path)
    if isinstance(error, e.LocalEntryNotFoundError):
        return HubError(
            f"cannot {what}: the Hub cannot be reached and {cached} not cached ({printable(_first_line(error))})", path
        )
    codes = (
        (e.GatedRepoError, "GatedRepo"),
        (e.RevisionNotFoundError, "RevisionNotFound"),
        (e.RepositoryNotFoundError, "RepoNotFound"),
        (remote_missing, "EntryNotFound"),
    )
    for kind, code in codes:
        if isinstance(error, kind):
            return answer_error(404, code, what, repo, revision=revision, file=file, write=write, path=path)
    if isinstance(error, e.HfHubHTTPError):
        status = _status(error)
        return answer_error(
            status or 0,
            None,
            what,
            repo,
            revision=revision,
            file=file,
            write=write,
            path=path,
            detail=printable(_first_line(error)),
        )
    if isinstance(error, (OSError, ConnectionError, TimeoutError)):  # network and file-system failures
        return HubError(f"cannot {what}: {type(error).__name__}: {printable(_first_line(error))}", path)
    return None


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


@contextmanager
def hub_errors(
    what: str, repo: str, *, revision: str | None = None, file: str | None = None, write: bool = False
) -> Iterator[None]:
    """Run a block of huggingface_hub calls; Hub failures leave it as one :func:`hub_error` line, and
    huggingface_hub's retries are announced (:func:`retry_notice`)."""
    try:
        with retry_notice(what):
            yield
    except Exception as error:
        translated = hub_error(error, what, repo, revision=revision, file=file, write=write)
        if translated is None:
            raise
        if translated is error:
            raise
        raise translated from error


def _call(what: str, repo: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a call that reads from the Hub."""
    with hub_errors(what, repo):
        return fn(*args, **kwargs)


def _write(what: str, repo: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a call that writes to ``repo`` (a 403 means no write access)."""
    with hub_errors(what, repo, write=True):
        return fn(*args, **kwargs)


def check_repo_id(repo: str, what: str | None = None) -> None:
    """Refuse what is not an ``OWNER/NAME`` repo id, before any Hub call.

    huggingface_hub's own rules apply (:func:`huggingface_hub.utils.validate_repo_id`: letters, digits,
    ``-_.``, no ``--`` or ``..``, at most 96 characters), plus an owner (every id gguf-mtp takes names a
    repo of someone's) and no control character (older releases let a trailing newline through).

    Raises:
        HubError: ``repo`` is malformed.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    shown = printable(repr(repo)) if isinstance(repo, str) else type(repo).__name__
    if what:
        shown = f"{what} {shown}"
    if not isinstance(repo, str) or repo.count("/") != 1:
        raise HubError(f"{shown} is not a Hub repo id (OWNER/NAME)", parameter=what)
    if not repo.isprintable():  # validate_repo_id before 2.0 lets a trailing newline through
        raise HubError(f"{shown} is not a Hub repo id (OWNER/NAME): it holds a control character", parameter=what)
    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        reason = str(e).split(": '", 1)[0].strip().rstrip(".").replace("Repo id", "a repo id")
        raise HubError(f"{shown} is not a Hub repo id (OWNER/NAME): {printable(reason)}", parameter=what) from None


def check_path_in_repo(path: str, what: str = "path_in_repo") -> str:
    """``path`` as a folder path inside a repository (``a/b``; slashes at the ends dropped).

    Raises:
        HubError: an empty, ``.`` or ``..`` part, a backslash or a control character: the path would not
            stay inside the repository, or would not be one folder path.
    """
    text = path.strip("/") if isinstance(path, str) else ""
    parts = text.split("/")
    if not text or any(part in ("", ".", "..") for part in parts):
        raise HubError(
            f"{what} {printable(repr(path))}: a folder path in the repo has no empty, '.' or '..' parts "
            "(it must stay inside the repository)",
            parameter=what,
        )
    if any(not part.isprintable() or "\\" in part for part in parts):
        raise HubError(
            f"{what} {printable(repr(path))}: a folder path in the repo has no control characters or backslashes",
            parameter=what,
        )
    return text


def is_repo_id(text: str) -> bool:
    """Whether ``text`` is an ``OWNER/NAME`` repo id by :func:`check_repo_id`'s rules."""
    try:
        check_repo_id(text)
    except HubError:
        return False
    return True


def check_write_access(
    api: HubApi, repo: str, *, token: str | None, private: bool = False, revision: str | None = None
) -> str:
    """Make sure ``repo`` can be written with ``token``, creating it (and branch ``revision``) if missing.

    Cheap calls only: ``whoami``, ``create_repo(exist_ok=True)``, ``create_branch(exist_ok=True)`` and the
    Hub's write-access check; run it before hashing or uploading anything.

    Returns:
        The user name the token belongs to.

    Raises:
        HubError: offline, no token, the token is refused or read-only, or the repo cannot be written.
    """
    check_repo_id(repo)
    require_online(f"publish to {repo}")
    if not token:
        raise HubError(f"cannot publish to {repo}: no Hugging Face token ({_LOGIN_HINT})")
    who = _call("check the token", repo, api.whoami, token=token)
    user = str(who.get("name", "?")) if isinstance(who, dict) else "?"
    role = None
    if isinstance(who, dict):
        role = ((who.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubError(f"cannot publish to {repo}: the token of {user} is read-only; use a token with write access")
    _write(
        f"create {repo}", repo, api.create_repo, repo, token=token, private=private, repo_type="model", exist_ok=True
    )
    if revision and revision != "main":
        _write(
            f"create branch {revision} in {repo}",
            repo,
            api.create_branch,
            repo,
            branch=revision,
            token=token,
            repo_type="model",
            exist_ok=True,
        )
    auth_check = getattr(api, "auth_check", None)  # not in every huggingface_hub release (see HubApi)
    if _accepts(auth_check, "write"):
        _write(f"write to {repo}", repo, auth_check, repo, repo_type="model", token=token, write=True)
    return user


def _accepts(method: object, parameter: str) -> TypeGuard[Callable[..., Any]]:
    """Whether ``method`` exists and takes ``parameter`` (older huggingface_hub releases lack some)."""
    if not callable(method):
        return False
    try:
        return parameter in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def upload_one_commit(
    api: HubApi, repo: str, folder: Path, names: Sequence[str], *, token: str | None, revision: str | None, message: str
) -> str | None:
    """Upload exactly ``names`` from ``folder`` as one commit. Returns the commit URL when the Hub gives one.

    Raises:
        HubError: the upload failed.
    """
    info = _write(
        f"upload to {repo}",
        repo,
        api.upload_folder,
        repo_id=repo,
        folder_path=str(folder),
        repo_type="model",
        revision=revision,
        token=token,
        allow_patterns=list(names),
        commit_message=message,
    )
    return getattr(info, "commit_url", None) or (str(info) if info is not None else None)


def upload_resumable(
    api: HubApi,
    repo: str,
    folder: Path,
    names: Sequence[str],
    *,
    token: str | None,
    revision: str | None,
    private: bool,
    message: str,
) -> str:
    """Upload ``names`` from ``folder`` resumably (re-running resumes; may take several commits).

    Uses ``upload_large_folder`` where the installed huggingface_hub has it; later releases folded that
    behaviour into ``upload_folder`` (streamed, multi-commit, resumable), which is used otherwise.

    Returns:
        The method used: ``"upload_large_folder"`` or ``"upload_folder"``.

    Raises:
        HubError: the upload failed (re-run to resume).
    """
    upload_large_folder = getattr(api, "upload_large_folder", None)  # before huggingface_hub 1.0 (see HubApi)
    if upload_large_folder is not None:
        _write(
            f"upload to {repo}",
            repo,
            upload_large_folder,
            repo_id=repo,
            folder_path=str(folder),
            repo_type="model",
            revision=revision,
            private=private,
            allow_patterns=list(names),
        )
        return "upload_large_folder"
    upload_one_commit(api, repo, folder, names, token=token, revision=revision, message=message)
    return "upload_folder"


@dataclass(frozen=True)
class RemoteFile:
    """What the Hub says about one file: its size, sha256 (LFS / Xet files) and git blob id."""

    path: str
    size: int
    sha256: str | None
    blob_id: str | None


def remote_files(
    api: HubApi, repo: str, paths: Sequence[str], *, token: str | None, revision: str | None
) -> dict[str, RemoteFile]:
    """The Hub's record of ``paths`` in ``repo`` (missing files are left out of the result).

    Raises:
        HubError: the Hub cannot be asked.
    """
    infos = _call(
        f"read the file list of {repo}",
        repo,
        api.get_paths_info,
        repo,
        list(paths),
        revision=revision,
        repo_type="model",
        token=token,
    )
    found: dict[str, RemoteFile] = {}
    for info in infos:
        size = getattr(info, "size", None)
        if size is None:  # a folder
            continue
        lfs = getattr(info, "lfs", None)
        sha256 = getattr(lfs, "sha256", None) if lfs is not None else None
        found[info.path] = RemoteFile(info.path, int(size), sha256, getattr(info, "blob_id", None))
    return found


def delete_remote_file(
    api: HubApi, repo: str, path: str, *, token: str | None, revision: str | None, message: str
) -> None:
    """Delete one file from ``repo`` (one commit).

    Raises:
        HubError: the Hub refused.
    """
    _write(
        f"delete {path} from {repo}",
        repo,
        api.delete_file,
        path,
        repo,
        token=token,
        repo_type="model",
        revision=revision,
        commit_message=message,
    )


def read_remote_text(api: HubApi, repo: str, path: str, *, token: str | None, revision: str | None) -> str:
    """The text of one small file of ``repo`` (downloaded into a temporary folder, removed afterwards;
    bytes that are not UTF-8 are replaced). Check its size with :func:`remote_files` first.

    Raises:
        HubError: the Hub cannot be asked, or the file cannot be downloaded.
    """
    with tempfile.TemporaryDirectory(prefix="gguf-mtp-hub-") as folder:
        local = _call(
            f"read {path} of {repo}",
            repo,
            api.hf_hub_download,
            repo_id=repo,
            filename=path,
            repo_type="model",
            revision=revision,
            cache_dir=folder,
            token=token,
        )
        return Path(local).read_bytes().decode("utf-8", errors="replace")


def list_repo_files(api: HubApi, repo: str, *, token: str | None, revision: str | None) -> list[str]:
    """Every file path in ``repo`` at ``revision``.

    Raises:
        HubError: offline, or the Hub cannot be asked.
    """
    require_online(f"list the files of {repo}")
    return list(
        _call(
            f"list the files of {repo}",
            repo,
            api.list_repo_files,
            repo,
            revision=revision,
            repo_type="model",
            token=token,
        )
    )


def cached_repo_files(
    repo: str, *, revision: str | None, cache_dir: str | os.PathLike[str] | None = None
) -> list[str] | None:
    """The repo's file list as the local Hub cache remembers it (no network), or ``None`` when unknown.

    huggingface_hub 1.x and later keep the listing a download saw; older releases keep none.
    """
    try:
        from huggingface_hub import get_cached_repo_tree
    except ImportError:
        return None
    try:
        folder = Path(cache_dir) if cache_dir is not None else None
        tree = get_cached_repo_tree(repo, revision=revision, cache_dir=folder)
    except Exception:  # no listing cached for this revision
        return None
    return [f.path for f in tree]


def cache_folder(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The Hub cache downloads go to: ``cache_dir``, else huggingface_hub's (``HF_HUB_CACHE`` / ``HF_HOME``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_file(
    repo: str, name: str, *, revision: str | None, cache_dir: str | os.PathLike[str] | None = None
) -> Path | None:
    """``name`` of ``repo`` in the local Hub cache (no network), or ``None`` when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(
            repo, name, revision=revision, cache_dir=os.fspath(cache_dir) if cache_dir is not None else None
        )
    except (OSError, ValueError):  # an unreadable cache, or a name huggingface_hub refuses
        return None
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def download_files(
    api: HubApi,
    repo: str,
    patterns: Sequence[str],
    *,
    token: str | None,
    revision: str | None,
    cache_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Download the files of ``repo`` that match ``patterns`` into the Hub cache; returns the snapshot folder.

    Offline (``HF_HUB_OFFLINE=1``), huggingface_hub answers from the cache alone.

    Raises:
        HubError: the files are neither reachable nor cached.
    """
    folder = _call(
        f"download from {repo}",
        repo,
        api.snapshot_download,
        repo,
        repo_type="model",
        revision=revision,
        allow_patterns=list(patterns),
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        token=token,
        force_download=force,
    )
    return Path(folder)
