"""A stand-in for ``huggingface_hub.HfApi`` that records every call and keeps what was "uploaded".

It answers like the Hub where publish and the pipeline look at the answers: ``get_paths_info`` reports
the size of each stored file, an LFS sha256 for ``.gguf`` files and a git blob id for the others;
``hf_hub_download`` returns the bytes a stored text file holds (:meth:`RecordingHub.put` stores one);
``snapshot_download`` copies from a local folder laid out like the repo into a Hub-cache-shaped folder named by
the commit ``model_info`` reports for the repo (:attr:`RecordingHub.repo_commits`, else ``commit``);
``create_commit`` uploads ``CommitOperationAdd`` files and copies ``CommitOperationCopy`` files from another repo
held in ``repos`` (:meth:`RecordingHub.put_source`). ``uploaded_bytes`` counts the bytes every upload sent;
a copy sends none, and ``copies`` records each with the source revision it named.
"""

from __future__ import annotations

import fnmatch
import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from huggingface_hub.errors import HfHubHTTPError

from gguf_mtp.files.digests import git_blob_sha1
from gguf_mtp.hub.hub_api import HubApi

#: The commit every repo of a :class:`RecordingHub` is at until a test moves it (``repo_commits``).
FIRST_COMMIT = "c0ffee" + "0" * 34


def http_error(status: int, message: str = "") -> HfHubHTTPError:
    """An HfHubHTTPError as huggingface_hub raises it for an HTTP ``status``."""
    # the response of requests (huggingface_hub 0.x) or httpx (1.x, 2.x): only these fields are read
    response: Any = SimpleNamespace(status_code=status, headers={}, request=None)
    return HfHubHTTPError(message or f"{status} Client Error", response=response)


class RecordingHub:
    """Records ``(method, args, kwargs)`` in ``calls``; stored files live in ``files``."""

    def __init__(self, *, user: str = "me", role: str = "write", fail: dict[str, BaseException] | None = None,
                 tamper: dict[str, dict[str, Any]] | None = None, source: Path | None = None,
                 commit: str = FIRST_COMMIT) -> None:
        self.user = user
        self.role = role
        self.fail = fail or {}
        self.tamper = tamper or {}  # name -> fields the "Hub" reports wrongly (size / sha256)
        self.source = source  # local folder laid out as the repo, for snapshot_download / list_repo_files
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.files: dict[str, dict[str, Any]] = {}
        self.commits: list[list[str]] = []
        self.commit = commit  # what model_info reports as the head of every repo
        self.repos: dict[str, dict[str, dict[str, Any]]] = {}  # other repos (copy sources): path -> entry
        self.copies: list[dict[str, Any]] = []  # every CommitOperationCopy received, as its fields
        self.uploaded_bytes = 0
        self.repo_commits: dict[str, str] = {}  # repo id -> the commit its main branch is at (moved by tests)

    # ------------------------------------------------------------------ bookkeeping
    def _record(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((method, args, kwargs))
        if method in self.fail:
            raise self.fail[method]

    @property
    def methods(self) -> list[str]:
        return [c[0] for c in self.calls]

    def _store(self, folder: Path, patterns: list[str]) -> list[str]:
        names = []
        for path in sorted(Path(folder).rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if not path.is_file() or rel.startswith(".cache/"):
                continue
            if not any(fnmatch.fnmatch(rel, p) for p in patterns):
                continue
            self._store_file(rel, path.read_bytes())
            names.append(rel)
        return names

    def _store_file(self, rel: str, data: bytes) -> None:
        """Store ``data`` uploaded at ``rel`` (an LFS file when it is a ``.gguf``), counting its bytes."""
        self.uploaded_bytes += len(data)
        self.files[rel] = self._entry(rel, data) | self.tamper.get(rel, {})

    @staticmethod
    def _entry(rel: str, data: bytes) -> dict[str, Any]:
        entry: dict[str, Any] = {"size": len(data)}
        if rel.endswith(".gguf"):
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            entry["blob_id"] = hashlib.sha1(rel.encode()).hexdigest()  # an LFS pointer's id: unrelated
            entry["xet_hash"] = hashlib.sha256(b"xet" + data).hexdigest()
        else:
            entry["sha256"] = None
            entry["blob_id"] = git_blob_sha1(data)
            entry["data"] = data
        return entry

    def put_source(self, repo_id: str, name: str, data: bytes, *, xet: bool = True) -> None:
        """Store a file in another repo (a copy source); ``xet=False``: an LFS file not stored in Xet."""
        entry = self._entry(name, data)
        if not xet:
            entry.pop("xet_hash", None)
        self.repos.setdefault(repo_id, {})[name] = entry

    def put(self, name: str, data: bytes) -> None:
        """Store a (non-LFS) file as if someone had committed it to the repo."""
        self.files[name] = {"size": len(data), "sha256": None, "blob_id": git_blob_sha1(data), "data": data}

    # ------------------------------------------------------------------ HfApi methods
    def whoami(self, token: Any = None) -> dict[str, Any]:
        self._record("whoami", token=token)
        return {"name": self.user, "auth": {"accessToken": {"role": self.role}}}

    def create_repo(self, repo_id: str, **kwargs: Any) -> str:
        self._record("create_repo", repo_id, **kwargs)
        return f"https://huggingface.co/{repo_id}"

    def create_branch(self, repo_id: str, **kwargs: Any) -> None:
        self._record("create_branch", repo_id, **kwargs)

    def auth_check(self, repo_id: str, *, repo_type: str | None = None, token: Any = None, write: bool = False) -> None:
        self._record("auth_check", repo_id, repo_type=repo_type, token=token, write=write)

    def upload_folder(self, *, repo_id: str, folder_path: str, allow_patterns: list[str], **kwargs: Any) -> Any:
        self._record("upload_folder", repo_id=repo_id, folder_path=folder_path, allow_patterns=allow_patterns, **kwargs)
        self.commits.append(self._store(Path(folder_path), allow_patterns))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/{len(self.commits):040x}")

    def create_commit(self, repo_id: str, operations: Any, **kwargs: Any) -> Any:
        operations = list(operations)
        self._record("create_commit", repo_id, operations, **kwargs)
        names = []
        for op in operations:
            if hasattr(op, "src_path_in_repo"):  # CommitOperationCopy
                fields = {k: getattr(op, k, None) for k in
                          ("src_repo_id", "src_repo_type", "src_revision", "src_path_in_repo", "path_in_repo")}
                self.copies.append(fields)
                source = self.repos[op.src_repo_id][op.src_path_in_repo]
                assert "xet_hash" in source, "the Hub copies only Xet files between repos"
                self.files[op.path_in_repo] = dict(source) | self.tamper.get(op.path_in_repo, {})
            else:  # CommitOperationAdd
                self._store_file(op.path_in_repo, Path(op.path_or_fileobj).read_bytes())
            names.append(op.path_in_repo)
        self.commits.append(names)
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/{len(self.commits):040x}")

    def model_info(self, repo_id: str, *, revision: str | None = None, token: Any = None) -> Any:
        self._record("model_info", repo_id, revision=revision, token=token)
        return SimpleNamespace(id=repo_id, sha=self.repo_commits.get(repo_id, self.commit))

    def delete_file(self, path_in_repo: str, repo_id: str, **kwargs: Any) -> None:
        self._record("delete_file", path_in_repo, repo_id, **kwargs)
        self.files.pop(path_in_repo, None)
        self.commits.append([f"-{path_in_repo}"])

    def get_paths_info(self, repo_id: str, paths: list[str], **kwargs: Any) -> list[Any]:
        self._record("get_paths_info", repo_id, list(paths), **kwargs)
        files = self.repos.get(repo_id, self.files)
        out = []
        for p in paths:
            if p in files:
                f = files[p]
                lfs = SimpleNamespace(sha256=f["sha256"], size=f["size"]) if f["sha256"] else None
                out.append(SimpleNamespace(path=p, size=f["size"], lfs=lfs, blob_id=f["blob_id"],
                                           xet_hash=f.get("xet_hash")))
        return out

    def hf_hub_download(self, repo_id: str, filename: str, *, cache_dir: str | None = None, **kwargs: Any) -> str:
        self._record("hf_hub_download", repo_id, filename, cache_dir=cache_dir, **kwargs)
        assert cache_dir is not None and "data" in self.files[filename]
        local = Path(cache_dir) / "snapshot" / filename
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(self.files[filename]["data"])
        return str(local)

    def list_repo_files(self, repo_id: str, **kwargs: Any) -> list[str]:
        self._record("list_repo_files", repo_id, **kwargs)
        if repo_id in self.repos:
            return sorted(self.repos[repo_id])
        assert self.source is not None
        return sorted(p.relative_to(self.source).as_posix() for p in self.source.rglob("*") if p.is_file())

    def snapshot_download(self, repo_id: str, *, allow_patterns: list[str], cache_dir: str | None = None,
                          **kwargs: Any) -> str:
        self._record("snapshot_download", repo_id, allow_patterns=allow_patterns, cache_dir=cache_dir, **kwargs)
        assert self.source is not None and cache_dir is not None
        commit = self.repo_commits.get(repo_id, self.commit)
        snapshot = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
        for p in sorted(self.source.rglob("*")):
            rel = p.relative_to(self.source).as_posix()
            if p.is_file() and any(fnmatch.fnmatch(rel, pat) for pat in allow_patterns):
                dest = snapshot / rel
                if kwargs.get("force_download") or not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(p, dest)
        return str(snapshot)


class LargeFolderHub(RecordingHub):
    """A stand-in for a huggingface_hub that still has ``upload_large_folder`` (before 1.0)."""

    def upload_large_folder(self, *, repo_id: str, folder_path: str, allow_patterns: list[str], **kwargs: Any) -> None:
        self._record("upload_large_folder", repo_id=repo_id, folder_path=folder_path, allow_patterns=allow_patterns,
                     **kwargs)
        names = self._store(Path(folder_path), allow_patterns)
        # Resumable uploads commit in pieces: one commit per file here.
        self.commits.extend([n] for n in names)


class JobsHub(RecordingHub):
    """A Hub that runs Jobs (``run_uv_job`` with ``volumes``, as huggingface_hub 1.8 and later) and holds the
    target repo in ``source`` (its ``.gguf`` files stored, so ``get_paths_info`` reports their sizes and sha256; the
    one repo a stand-in keeps also receives the upload, so the target's README.md is left out)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.source is not None:
            self._store(self.source, ["*.gguf"])
            self.uploaded_bytes = 0  # the target was there before: not an upload

    def run_uv_job(self, script: str, **kwargs: Any) -> Any:
        self._record("run_uv_job", script, **kwargs)
        return SimpleNamespace(id="job-123", url="https://huggingface.co/jobs/me/job-123")


class NoVolumesJobsHub(JobsHub):
    """A Hub whose ``run_uv_job`` takes no ``volumes`` (huggingface_hub before 1.8)."""

    def run_uv_job(  # type: ignore[override]
        self, script: str, *, script_args: list[str] | None = None, dependencies: list[str] | None = None,
        flavor: str | None = None, timeout: str | None = None, namespace: str | None = None,
        env: dict[str, str] | None = None, secrets: dict[str, str] | None = None, token: Any = None,
    ) -> Any:
        self._record("run_uv_job", script, script_args=script_args, dependencies=dependencies, flavor=flavor,
                     timeout=timeout, namespace=namespace, env=env, secrets=secrets, token=token)
        return SimpleNamespace(id="job-456", url=None)


# mypy (pyproject's [tool.mypy] files) checks both stand-ins against the Protocol the Hub code is typed with.
STAND_INS: tuple[type[HubApi], ...] = (RecordingHub, LargeFolderHub)
