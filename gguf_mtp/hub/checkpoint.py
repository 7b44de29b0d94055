"""Fetch just the MTP head of a checkpoint on the Hugging Face Hub.

A full model is hundreds of GB; its MTP head lives in one or a few safetensors shards, beside trunk
layers. ``config.json`` and the index (``model.safetensors.index.json``) are fetched first (through
huggingface_hub's download and cache), the shards holding head tensors are picked from its
``weight_map``, and then, by default, only the head tensors' byte ranges and those shards' headers are
read (:mod:`.head_ranges`, pinned to the commit ``config.json`` came from). With ``download=True``,
offline (``HF_HUB_OFFLINE=1``: the Hub cache answers) or for a repo without an index,
``huggingface_hub.snapshot_download`` gets ``config.json``, the index and those whole shards instead
(with the Hub's own progress bars and cache, so a second run downloads nothing).
A missing or refused token, a gated repo and a wrong revision each become one
:class:`~gguf_mtp.errors.HubError` line.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.format.safetensors_io import CONFIG_NAME, INDEX_NAME, NamePrefix, read_config, read_index

from .head_ranges import RangeFetch, fetch_head_ranges, head_files, head_shards, snapshot_commit

__all__ = ["HubCheckpoint", "download_head", "head_files", "is_repo_id"]

def is_repo_id(source: str) -> bool:
    """Whether ``source`` is a Hub repo id (``owner/name``, by huggingface_hub's own rules)."""
    from .client import is_repo_id as valid_repo_id

    return valid_repo_id(source)


@dataclass(frozen=True)
class HubCheckpoint:
    """Where a Hub checkpoint's head landed, and what was asked for."""

    repo_id: str
    revision: str | None
    folder: Path  # the snapshot folder in the Hub cache, or the folder the byte ranges were written to
    allow_patterns: tuple[str, ...]
    ranges: RangeFetch | None = None  # the head was fetched by byte ranges (None: whole files downloaded)


def _fetching(repo_id: str, revision: str | None, what: str) -> AbstractContextManager[None]:
    """huggingface_hub's failures while fetching ``what`` as one :class:`HubError` line (see :mod:`.client`)."""
    from .errors import hub_errors

    at = f"@{revision}" if revision else ""
    return hub_errors(f"download {what} from {repo_id}{at}", repo_id, revision=revision, file=what)


def download_head(
    repo_id: str,
    *,
    revision: str | None = None,
    prefix: NamePrefix = "mtp.",
    head_prefix: Callable[[dict[str, Any]], NamePrefix] | None = None,
    ranges_into: Path | None = None,
    tensor_data: bool = True,
) -> HubCheckpoint:
    """Fetch ``config.json``, the index and the MTP head of ``repo_id``: by byte ranges into the empty folder
    ``ranges_into`` when given (:func:`~.head_ranges.fetch_head_ranges`; ``tensor_data=False``: the shards'
    headers only, for a dry run), else the whole shards that hold it, into the Hub cache.

    The head is the tensors whose names start with ``prefix``, or with ``head_prefix(config)`` when given
    (``model.layers.{num_hidden_layers}.`` for GLM: it depends on the downloaded ``config.json``).

    Offline, the Hub cache answers (whole shards). A repo without an index (one ``model.safetensors``) is
    fetched whole: there is nothing to choose.

    Raises:
        HubError: offline without a cached copy, no access (token, gated repo), unknown revision.
        CheckpointError: the index lists no ``mtp.*`` tensor (the checkpoint has no MTP head).
    """
    import huggingface_hub

    from .access import check_token_env, is_offline
    from .client import check_repo_id

    check_repo_id(repo_id)
    check_token_env()  # huggingface_hub reads HF_TOKEN itself: a non-ASCII one would be a traceback there
    with _fetching(repo_id, revision, CONFIG_NAME):
        config_path = Path(huggingface_hub.hf_hub_download(repo_id, CONFIG_NAME, revision=revision))
    # The snapshot folder is named by the commit the Hub resolved: the index comes from that commit too.
    pinned = snapshot_commit(config_path) or revision
    if head_prefix is not None:
        prefix = head_prefix(read_config(config_path.parent))
    with _fetching(repo_id, revision, INDEX_NAME):
        index_path = _download_index(repo_id, pinned)
    if ranges_into is not None and index_path is not None and not is_offline():
        fetched = fetch_head_ranges(
            repo_id, ranges_into, config_path=config_path, index_path=Path(index_path), prefix=prefix,
            data=tensor_data,
        )
        return HubCheckpoint(repo_id, revision, ranges_into, (CONFIG_NAME, INDEX_NAME, *fetched.files), fetched)
    return _download_shards(repo_id, revision, prefix, index_path)


def _download_shards(repo_id: str, revision: str | None, prefix: NamePrefix, index_path: str | None) -> HubCheckpoint:
    """The whole shards that hold the head (every safetensors file of a repo without an index), into the Hub
    cache."""
    import huggingface_hub

    if index_path is not None:
        patterns: tuple[str, ...] = (CONFIG_NAME, INDEX_NAME, *head_shards(read_index(index_path), prefix, repo_id))
    else:
        patterns = (CONFIG_NAME, "*.safetensors")
    with _fetching(repo_id, revision, ", ".join(patterns[2:]) or "the safetensors files"):
        folder = huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=list(patterns))
    return HubCheckpoint(repo_id, revision, Path(folder), patterns)


def _download_index(repo_id: str, revision: str | None) -> str | None:
    """The index file, or ``None`` when the repo has none (a single-file checkpoint)."""
    import huggingface_hub
    from huggingface_hub import errors as hf_errors

    remote_missing = getattr(hf_errors, "RemoteEntryNotFoundError", hf_errors.EntryNotFoundError)  # < 1.0
    try:
        return huggingface_hub.hf_hub_download(repo_id, INDEX_NAME, revision=revision)
    except hf_errors.LocalEntryNotFoundError:  # before 1.0 a subclass of EntryNotFoundError: test it first
        # Offline, the Hub cache remembers the files it found missing (try_to_load_from_cache returns its
        # "cached as missing" marker, neither a path nor None); anything else is unknowable.
        cached = huggingface_hub.try_to_load_from_cache(repo_id, INDEX_NAME, revision=revision)
        if cached is not None and not isinstance(cached, str):
            return None
        raise
    except remote_missing:
        return None
