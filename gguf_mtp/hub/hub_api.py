"""What gguf-mtp needs of a Hub client: the :class:`huggingface_hub.HfApi` methods it calls, as a Protocol.

A real ``HfApi`` satisfies it (mypy checks that where :func:`gguf_mtp.hub.client.make_api` builds one), and so
must a stand-in that tests pass as ``api=`` (mypy checks ``tests/support/hub_standin.py`` too). Each method lists only
the parameters gguf-mtp passes; positional ones are positional-only here, as gguf-mtp passes them.

Two methods are optional, so they are looked up with ``getattr`` rather than listed: ``auth_check`` (missing
from older huggingface_hub releases, or without ``write=``) and ``upload_large_folder`` (folded into
``upload_folder`` by huggingface_hub 1.0).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


class HubApi(Protocol):
    """The part of :class:`huggingface_hub.HfApi` gguf-mtp uses (repo type is always ``"model"``)."""

    def whoami(self, token: str | None = ...) -> Any:
        """The token's owner: a dict with ``name`` and ``auth.accessToken.role``."""

    def create_repo(
        self, repo_id: str, /, *, token: str | None = ..., private: bool = ..., repo_type: str | None = ...,
        exist_ok: bool = ...,
    ) -> Any:
        """Create ``repo_id`` (``exist_ok``: an existing one is fine)."""

    def create_branch(
        self, repo_id: str, /, *, branch: str, token: str | None = ..., repo_type: str | None = ...,
        exist_ok: bool = ...,
    ) -> None:
        """Create ``branch`` in ``repo_id`` (``exist_ok``: an existing one is fine)."""

    def upload_folder(
        self, *, repo_id: str, folder_path: str, repo_type: str | None = ..., revision: str | None = ...,
        token: str | None = ..., allow_patterns: list[str], commit_message: str | None = ...,
    ) -> Any:
        """Upload the files of ``folder_path`` that match ``allow_patterns``; returns the commit (``commit_url``)."""

    def create_commit(
        self, repo_id: str, operations: Iterable[Any], /, *, commit_message: str, token: str | None = ...,
        repo_type: str | None = ..., revision: str | None = ...,
    ) -> Any:
        """One commit of ``operations`` (``CommitOperationAdd`` / ``CommitOperationCopy``); returns the commit."""

    def model_info(self, repo_id: str, /, *, revision: str | None = ..., token: str | None = ...) -> Any:
        """The repo at ``revision``: its commit is ``sha``."""

    def delete_file(
        self, path_in_repo: str, repo_id: str, /, *, token: str | None = ..., repo_type: str | None = ...,
        revision: str | None = ..., commit_message: str | None = ...,
    ) -> Any:
        """Delete one file (one commit)."""

    def get_paths_info(
        self, repo_id: str, paths: list[str], /, *, revision: str | None = ..., repo_type: str | None = ...,
        token: str | None = ...,
    ) -> Iterable[Any]:
        """One entry (``path``, ``size``, ``lfs.sha256``, ``blob_id``) per path that exists; folders have no size."""

    def hf_hub_download(
        self, *, repo_id: str, filename: str, repo_type: str | None = ..., revision: str | None = ...,
        cache_dir: str | None = ..., token: str | None = ...,
    ) -> str:
        """Download one file into ``cache_dir``; returns its local path."""

    def list_repo_files(
        self, repo_id: str, /, *, revision: str | None = ..., repo_type: str | None = ..., token: str | None = ...
    ) -> Iterable[str]:
        """Every file path in the repo at ``revision``."""

    def snapshot_download(
        self, repo_id: str, /, *, repo_type: str | None = ..., revision: str | None = ...,
        allow_patterns: list[str], cache_dir: str | None = ..., token: str | None = ...,
        force_download: bool = ...,
    ) -> str:
        """Download the files matching ``allow_patterns`` into the Hub cache; returns the snapshot folder."""
