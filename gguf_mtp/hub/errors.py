"""Hub failures as one line: every error of a huggingface_hub call becomes a :class:`~gguf_mtp.errors.HubError` naming
what failed and why (offline, no token, token refused, no write access, repository or revision missing, network down).

Network failures: huggingface_hub's transport is requests (0.x), httpx (1.x) or httpx2 (2.x), each
with its own exception tree. :func:`transport_failure` recognises all three by their libraries' base
classes (and the socket errors beneath them), so every Hub call made through :func:`hub_errors` turns
a refused connection, an unknown host or a timeout into one :class:`~gguf_mtp.errors.HubUnreachableError`
naming the host and the cause. huggingface_hub retries timeouts and busy answers (429, 5xx) with
back-off, and one line says so (:func:`retry_notice`); a host name that does not resolve and a refused
connection fail at once (:func:`fails_at_once`): no wait makes them succeed.
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from gguf_mtp.errors import HubError, HubUnreachableError
from gguf_mtp.text import printable

from .access import LOGIN_HINT, is_offline, resolve_token

__all__ = [
    "EGRESS_LIMIT_CODE",
    "HubCall",
    "RemoteNotFoundError",
    "answer_error",
    "fails_at_once",
    "hub_error",
    "hub_errors",
    "retry_notice",
    "transport_failure",
    "unreachable_error",
]


class RemoteNotFoundError(HubError):
    """The repository exists, but not this file (at this revision)."""


#: The Hub's ``X-Error-Code`` when the account's download (egress) allowance is spent; huggingface_hub 2.5 raises
#: it as ``EgressLimitError`` (HTTP 402).
EGRESS_LIMIT_CODE = "EgressLimitReached"


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _token_state() -> str:
    try:
        return "the token was refused" if resolve_token() else "no token is set (set HF_TOKEN)"
    except HubError:
        return "the token was refused"


@dataclass(frozen=True)
class HubCall:
    """The Hub call a failure is reported for: what the messages of :func:`answer_error` and :func:`hub_error` name."""

    what: str  # what was being done, after "cannot": "read the header", "publish to me/x"
    repo: str  # the repository asked for
    revision: str | None = None  # the revision asked for (None: the default branch)
    file: str | None = None  # the file asked for (None: the repository itself)
    write: bool = False  # the call writes to ``repo``: a 403 is a missing write permission
    path: str | None = None  # what the error names as its file (None: nothing)


def answer_error(status: int, error_code: str | None, call: HubCall, detail: str = "") -> HubError:
    """The one-line :class:`HubError` for an HTTP answer of the Hub to ``call``: ``status`` and its
    ``X-Error-Code``; ``detail`` ends the line of an answer no rule knows.

    This is the one place where the Hub's answers become messages; :func:`hub_error` turns
    huggingface_hub's typed exceptions into the same answers first.
    """
    code = (error_code or "").strip()
    if _is_missing_file(status, code, call.file):
        at = f" at revision {call.revision}" if call.revision else ""
        missing = f"no file {call.file}" if call.file else "a file asked for is not"
        return RemoteNotFoundError(f"cannot {call.what}: {missing} in {call.repo}{at}", call.path)
    text = _coded_answer(code, call) or _missing_repo_answer(status, code, call) or _status_answer(status, call, detail)
    return HubError(f"cannot {call.what}: {text}", call.path)


def _gated_answer(call: HubCall) -> str:
    return (
        f"{call.repo} is gated: accept its terms on https://huggingface.co/{call.repo}, then set HF_TOKEN "
        "(or run `hf auth login`) with that account"
    )


def _egress_answer(call: HubCall) -> str:
    return (
        f"the account's download allowance on the Hub is spent (402 {EGRESS_LIMIT_CODE}); the run is "
        "resumable: run the same command again once the allowance is renewed or raised (pipeline resumes "
        "from its finished stages, publish keeps the files already on the Hub)"
    )


def _revision_answer(call: HubCall) -> str:
    return f"revision {call.revision!r} not found in {call.repo}"


#: The ``X-Error-Code`` values whose message does not depend on the status, and that message.
_CODED_ANSWERS: dict[str, Callable[[HubCall], str]] = {
    "GatedRepo": _gated_answer,
    EGRESS_LIMIT_CODE: _egress_answer,
    "RevisionNotFound": _revision_answer,
}


def _coded_answer(code: str, call: HubCall) -> str | None:
    answer = _CODED_ANSWERS.get(code)
    return answer(call) if answer is not None else None


def _missing_repo_answer(status: int, code: str, call: HubCall) -> str | None:
    """A missing repository: said so by its code, or a 404 for no file in particular."""
    if code == "RepoNotFound" or (status == 404 and not call.file and code != "EntryNotFound"):
        return f"repository {call.repo} not found, or private and {_token_state()}"
    return None


def _is_missing_file(status: int, code: str, file: str | None) -> bool:
    """A missing file: said so by its code, or a 404 for a file whose code says nothing else."""
    if code in _CODED_ANSWERS or code == "RepoNotFound":
        return False
    return code == "EntryNotFound" or (status == 404 and bool(file))


def _status_answer(status: int, call: HubCall, detail: str) -> str:
    """The message of an answer that only its status explains."""
    if status == 407:
        return "the proxy asks for credentials (407): give them in its address (HTTPS_PROXY=http://USER:PASSWORD@HOST:PORT)"
    if status == 401:
        return f"the Hub refused the token (401); {LOGIN_HINT} with a valid token"
    if status == 403 and call.write:
        return f"no write access to {call.repo} (403); use a token with write permission for it"
    if status == 403:
        return f"no access to {call.repo} (403); set HF_TOKEN to a token that can read it"
    return f"the Hub answered {status}" + (f": {detail}" if detail else "")


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


def _socket_cause(error: BaseException, host: str) -> str | None:
    """What a socket-level ``error`` says went wrong with ``host`` (``None``: not one of these)."""
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
    return None


def _cause(chain: Sequence[BaseException], host: str) -> str:
    """What went wrong, naming ``host``, from the deepest socket-level error of the chain."""
    for error in reversed(chain):
        cause = _socket_cause(error, host)
        if cause is not None:
            return cause
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
    if isinstance(error, HubError):
        return error
    call = HubCall(what, repo, revision, file, write, path)
    offline = _offline_error(error, call)
    if offline is not None:
        return offline
    failure = transport_failure(error)
    if failure is not None:  # whichever HTTP library raised it, or huggingface_hub wrapped it
        return unreachable_error(what, failure, path)
    local = _local_error(error, call)
    if local is not None:
        return local
    answer = _typed_answer(error, call)
    if answer is not None:
        return answer
    if isinstance(error, (OSError, ConnectionError, TimeoutError)):  # network and file-system failures
        return HubError(f"cannot {what}: {type(error).__name__}: {printable(_first_line(error))}", path)
    return None


def _cached(call: HubCall) -> str:
    return f"{call.file} is" if call.file else "the files are"


def _offline_error(error: BaseException, call: HubCall) -> HubError | None:
    """HF_HUB_OFFLINE kept the call from the network, and the Hub cache has not what it asked for."""
    from huggingface_hub import errors as e

    if isinstance(error, e.OfflineModeIsEnabled) or (isinstance(error, e.LocalEntryNotFoundError) and is_offline()):
        return HubError(
            f"cannot {call.what}: HF_HUB_OFFLINE is set and {_cached(call)} not in the Hub cache "
            "(run once online, or unset HF_HUB_OFFLINE)",
            call.path,
        )
    return None


def _local_error(error: BaseException, call: HubCall) -> HubError | None:
    """A failure before any answer: no token, an id the Hub would refuse, a file neither reachable nor cached."""
    from huggingface_hub import errors as e

    if isinstance(error, e.LocalTokenNotFoundError):
        return HubError(f"cannot {call.what}: no Hugging Face token ({LOGIN_HINT})", call.path)
    if isinstance(error, e.HFValidationError):
        return HubError(f"cannot {call.what}: {printable(_first_line(error))}", call.path)
    if isinstance(error, e.LocalEntryNotFoundError):
        return HubError(
            f"cannot {call.what}: the Hub cannot be reached and {_cached(call)} not cached "
            f"({printable(_first_line(error))})",
            call.path,
        )
    return None


def _typed_answer(error: BaseException, call: HubCall) -> HubError | None:
    """An answer of the Hub that huggingface_hub raised as a typed error: :func:`answer_error`'s line for it."""
    from huggingface_hub import errors as e

    remote_missing = getattr(e, "RemoteEntryNotFoundError", e.EntryNotFoundError)  # before 1.0: EntryNotFoundError
    codes = (
        (e.GatedRepoError, "GatedRepo"),
        (e.RevisionNotFoundError, "RevisionNotFound"),
        (e.RepositoryNotFoundError, "RepoNotFound"),
        (remote_missing, "EntryNotFound"),
    )
    for kind, code in codes:
        if isinstance(error, kind):
            return answer_error(404, code, call)
    egress_limit = getattr(e, "EgressLimitError", None)  # huggingface_hub 2.5 and later
    if egress_limit is not None and isinstance(error, egress_limit):
        return answer_error(402, EGRESS_LIMIT_CODE, call)
    if isinstance(error, e.HfHubHTTPError):
        return answer_error(_status(error) or 0, None, call, detail=printable(_first_line(error)))
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
