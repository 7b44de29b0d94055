"""The Hugging Face Hub boundary: every call gguf-mtp makes to the Hub to publish or to download.

Everything else works on local paths and plain data, and takes an ``api`` argument: an
:class:`huggingface_hub.HfApi`, or in tests a stand-in object with the same methods that records the
calls. Hub failures come out as one-line :class:`~gguf_mtp.errors.HubError` messages (offline, no
token, token refused, no write access, repository or revision missing, network down).

Failures are translated in :mod:`gguf_mtp.hub.errors` (every call here runs under its :func:`hub_errors`); the
offline switch and the token are read in :mod:`gguf_mtp.hub.access`.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from gguf_mtp.errors import HubError
from gguf_mtp.text import printable

from .access import LOGIN_HINT, require_online
from .errors import hub_errors
from .hub_api import HubApi

__all__ = [
    "SERVER_COPY_SINCE",
    "RemoteFile",
    "cached_file",
    "cached_repo_files",
    "check_path_in_repo",
    "check_repo_id",
    "check_write_access",
    "commit_with_copies",
    "delete_remote_file",
    "download_files",
    "is_commit",
    "is_repo_id",
    "list_repo_files",
    "make_api",
    "read_remote_text",
    "remote_files",
    "resolve_commit",
    "server_copy_supported",
    "upload_one_commit",
    "upload_resumable",
]

T = TypeVar("T")

#: A full git commit id: what a revision is pinned to.
_COMMIT = re.compile(r"[0-9a-f]{40}")


def make_api(api: HubApi | None = None, *, token: str | None = None) -> HubApi:
    """``api`` when given (a stand-in in tests), else a real :class:`huggingface_hub.HfApi` holding ``token``."""
    if api is not None:
        return api
    from huggingface_hub import HfApi

    from gguf_mtp._version import __version__

    return HfApi(token=token, library_name="gguf-mtp", library_version=__version__)


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
        raise HubError(f"cannot publish to {repo}: no Hugging Face token ({LOGIN_HINT})")
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
    xet_hash: str | None = None  # stored in Xet (what a copy between repos needs); None: unknown or not Xet


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
        found[info.path] = RemoteFile(
            info.path, int(size), sha256, getattr(info, "blob_id", None), getattr(info, "xet_hash", None)
        )
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


def is_commit(revision: str | None) -> bool:
    """Whether ``revision`` is a full commit id (a pinned revision, not a branch or tag that can move)."""
    return revision is not None and _COMMIT.fullmatch(revision) is not None


def resolve_commit(api: HubApi, repo: str, *, token: str | None, revision: str | None) -> str:
    """The commit ``revision`` (default: the main branch) of ``repo`` points at now; a commit id is its own answer.

    Raises:
        HubError: offline, or the Hub cannot be asked (no such repo or revision, no access, network down).
    """
    if is_commit(revision):
        assert revision is not None
        return revision
    require_online(f"look up the commit of {repo}")
    info = _call(f"look up the commit of {repo}", repo, api.model_info, repo, revision=revision, token=token)
    sha = getattr(info, "sha", None)
    if not is_commit(sha):
        raise HubError(f"the Hub named no commit for revision {revision or 'main'}", repo)
    return str(sha)


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


#: The first huggingface_hub release whose ``CommitOperationCopy`` copies a file from another repo
#: (``src_repo_id``, ``src_repo_type``; huggingface_hub#4203): the Hub duplicates the Xet-stored file, nothing
#: is downloaded or uploaded. Only Xet files (``RepoFile.xet_hash``) in the same storage region can be copied.
SERVER_COPY_SINCE = "1.17.0"


def server_copy_supported() -> bool:
    """Whether the installed huggingface_hub copies files between repos on the Hub's side (1.17.0 and later)."""
    from huggingface_hub import CommitOperationCopy

    return "src_repo_id" in {f.name for f in dataclasses.fields(CommitOperationCopy)}


def commit_with_copies(
    api: HubApi,
    repo: str,
    *,
    source: str,
    source_commit: str,
    copies: Sequence[tuple[str, str]],
    uploads: Sequence[tuple[str, Path]] = (),
    token: str | None,
    revision: str | None,
    message: str,
) -> str | None:
    """One commit to ``repo``: each ``(source path, path in repo)`` of ``copies`` copied on the Hub's side from
    ``source`` at ``source_commit`` (pinned: never the branch's later state), and each ``(path in repo, local file)``
    of ``uploads`` uploaded. Needs :func:`server_copy_supported`. Returns the commit URL when the Hub gives one.

    Raises:
        HubError: the Hub refused the copy or the upload (nothing is committed then).
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationCopy

    operations: list[Any] = [
        CommitOperationCopy(  # type: ignore[call-arg,unused-ignore]  # src_repo_* only in huggingface_hub 1.17+
            src_path_in_repo=src, path_in_repo=dest, src_revision=source_commit, src_repo_id=source,
            src_repo_type="model",
        )
        for src, dest in copies
    ]
    operations += [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(local)) for name, local in uploads]
    info = _write(
        f"copy files from {source}@{source_commit[:12]} to {repo}",
        repo,
        api.create_commit,
        repo,
        operations,
        commit_message=message,
        token=token,
        repo_type="model",
        revision=revision,
    )
    return getattr(info, "commit_url", None) or (str(info) if info is not None else None)
