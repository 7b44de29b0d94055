"""Fetch just the MTP head of a checkpoint on the Hugging Face Hub.

A full model is hundreds of GB; its MTP head lives in one or two safetensors shards. So the index
(``model.safetensors.index.json``) is fetched first, the shards holding ``mtp.*`` tensors are picked
from its ``weight_map``, and ``huggingface_hub.snapshot_download`` gets ``config.json``, the index and
those shards only (with the Hub's own progress bars and cache, so a second run downloads nothing).
``HF_HUB_OFFLINE=1``, a missing or refused token, a gated repo and a wrong revision each become one
:class:`~gguf_mtp.errors.HubError` line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants as hf_constants  # cheap; the download stack is imported on first use

from gguf_mtp.conversion.safetensors_io import CONFIG_NAME, INDEX_NAME, natural_key, read_index
from gguf_mtp.errors import CheckpointError, HubError

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
    folder: Path  # the snapshot folder in the Hub cache
    allow_patterns: tuple[str, ...]


def _offline() -> bool:
    return bool(hf_constants.HF_HUB_OFFLINE)


@contextmanager
def _hub_errors(repo_id: str, revision: str | None, what: str) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one clear HubError line."""
    import huggingface_hub
    from huggingface_hub import errors as hf_errors

    at = f"@{revision}" if revision else ""
    try:
        yield
    except hf_errors.GatedRepoError:
        raise HubError(
            f"{repo_id} is gated: accept its terms on https://huggingface.co/{repo_id}, then set HF_TOKEN "
            "(or run `hf auth login`) with that account"
        ) from None
    except hf_errors.RepositoryNotFoundError:
        token = "the token was refused" if huggingface_hub.get_token() else "no token is set (set HF_TOKEN)"
        raise HubError(f"{repo_id}: repository not found, or private and {token}") from None
    except hf_errors.RevisionNotFoundError:
        raise HubError(f"{repo_id}: revision {revision!r} not found") from None
    except hf_errors.LocalEntryNotFoundError as e:
        if _offline():
            raise HubError(
                f"{repo_id}{at}: HF_HUB_OFFLINE is set and {what} is not in the Hub cache "
                f"({hf_constants.HF_HUB_CACHE}); run once online or unset HF_HUB_OFFLINE"
            ) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HubError(f"{repo_id}{at}: cannot reach the Hub and {what} is not cached ({first})") from None
    except hf_errors.RemoteEntryNotFoundError:
        raise HubError(f"{repo_id}{at} has no {what}") from None
    except hf_errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        if status in (401, 403):
            raise HubError(f"{repo_id}: the Hub refused access (HTTP {status}); check HF_TOKEN") from None
        raise HubError(f"{repo_id}: the Hub answered HTTP {status} while fetching {what}") from None
    except hf_errors.HFValidationError as e:
        raise HubError(f"{repo_id!r} is not a valid Hub repo id ({e})") from None
    except hf_errors.OfflineModeIsEnabled:
        raise HubError(f"{repo_id}{at}: HF_HUB_OFFLINE is set and {what} is not in the Hub cache") from None
    except OSError as e:
        raise HubError(f"{repo_id}{at}: downloading {what} failed: {e}") from None


def head_files(weight_map: dict[str, str], prefix: str = "mtp.") -> list[str]:
    """The files of an index's ``weight_map`` that hold tensors starting with ``prefix``."""
    return sorted({file for name, file in weight_map.items() if name.startswith(prefix)}, key=natural_key)


def download_head(repo_id: str, *, revision: str | None = None, prefix: str = "mtp.") -> HubCheckpoint:
    """Download ``config.json``, the index and only the shards that hold the MTP head of ``repo_id``.

    A repo without an index (one ``model.safetensors``) is fetched whole: there is nothing to choose.

    Raises:
        HubError: offline without a cached copy, no access (token, gated repo), unknown revision.
        CheckpointError: the index lists no ``mtp.*`` tensor (the checkpoint has no MTP head).
    """
    import huggingface_hub

    from .client import check_repo_id, check_token_env

    check_repo_id(repo_id)
    check_token_env()  # huggingface_hub reads HF_TOKEN itself: a non-ASCII one would be a traceback there
    with _hub_errors(repo_id, revision, CONFIG_NAME):
        huggingface_hub.hf_hub_download(repo_id, CONFIG_NAME, revision=revision)
    with _hub_errors(repo_id, revision, INDEX_NAME):
        index_path = _download_index(repo_id, revision)
    if index_path is not None:
        files = head_files(read_index(index_path), prefix)
        if not files:
            raise CheckpointError(
                f"{INDEX_NAME} lists no {prefix}* tensor: this checkpoint has no MTP head", f"hf://{repo_id}"
            )
        patterns = (CONFIG_NAME, INDEX_NAME, *files)
    else:
        patterns = (CONFIG_NAME, "*.safetensors")
    with _hub_errors(repo_id, revision, ", ".join(patterns[2:]) or "the safetensors files"):
        folder = huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=list(patterns))
    return HubCheckpoint(repo_id, revision, Path(folder), patterns)


def _download_index(repo_id: str, revision: str | None) -> str | None:
    """The index file, or ``None`` when the repo has none (a single-file checkpoint)."""
    import huggingface_hub
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.file_download import _CACHED_NO_EXIST

    try:
        return huggingface_hub.hf_hub_download(repo_id, INDEX_NAME, revision=revision)
    except hf_errors.RemoteEntryNotFoundError:
        return None
    except hf_errors.LocalEntryNotFoundError:
        # Offline, the Hub cache remembers the files it found missing; anything else is unknowable.
        if huggingface_hub.try_to_load_from_cache(repo_id, INDEX_NAME, revision=revision) is _CACHED_NO_EXIST:
            return None
        raise
