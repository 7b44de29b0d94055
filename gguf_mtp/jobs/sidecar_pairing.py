"""``sidecars --pair``: for each trunk quant of a folder or Hub repo, the ``mtp-`` sidecar llama.cpp's ``-hf`` picks.

Only names are read (the folder's listing, or the repo's through :func:`gguf_mtp.hub.list_repo_files`); the rule is
:func:`gguf_mtp.model.sidecar_names.find_best_sibling`, as read from llama.cpp :data:`LLAMA_CPP_BUILD`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.errors import InputReadError, ParameterError
from gguf_mtp.hub import access as hub_access
from gguf_mtp.hub import client as hub
from gguf_mtp.hub.hub_api import HubApi
from gguf_mtp.model.sidecar_names import (
    LLAMA_CPP_BUILD,
    SIDECAR_KEYWORD,
    find_best_sibling,
    is_model_file,
    quant_bits,
    split_info,
)

__all__ = ["MAX_LISTED_FILES", "PairingReport", "TrunkPairing", "pair_listing", "sidecar_pairing"]

#: A folder with more files than this is refused (a repo of GGUF quants holds hundreds at most).
MAX_LISTED_FILES = 100_000


@dataclass(frozen=True)
class TrunkPairing:
    """One trunk quant (its first file), the tag ``-hf REPO:TAG`` names it by, and the sidecar llama.cpp picks
    (``None``: none; ``failure``: what llama.cpp fails on instead)."""

    trunk: str
    shards: int
    tag: str
    sidecar: str | None
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"trunk": self.trunk, "shards": self.shards, "tag": self.tag, "sidecar": self.sidecar,
                "failure": self.failure}


def pair_listing(files: Sequence[str]) -> list[TrunkPairing]:
    """Every trunk of ``files`` (repo paths in listing order) with the sidecar llama.cpp pairs it with when run as
    ``llama-server -hf REPO:TAG --spec-type draft-mtp``, TAG being the trunk's own tag. A trunk is a model file
    (not ``mtp-``, ``mmproj``...) that is a single file or the first shard of a set."""
    pairings = []
    for path in files:
        info = split_info(path)
        if not is_model_file(path) or info.index != 1:
            continue
        try:
            quant_bits(path)
            sidecar, failure = find_best_sibling(files, path, SIDECAR_KEYWORD, info.tag), None
        except ValueError as e:
            sidecar, failure = None, str(e)
        pairings.append(TrunkPairing(path, info.count, info.tag, sidecar, failure))
    return pairings


@dataclass(frozen=True)
class PairingReport:
    """The pairing of every trunk of a folder or repo, and the llama.cpp build whose rule decided it."""

    source: str
    on_hub: bool
    sidecars: tuple[str, ...]
    pairings: tuple[TrunkPairing, ...]
    build: str = LLAMA_CPP_BUILD

    def describe(self) -> list[str]:
        """One line per trunk: ``TRUNK (TAG, N shards) -> SIDECAR``."""
        where = f"Hub repo {self.source}" if self.on_hub else f"folder {self.source}"
        lines = [f"{where}: {len(self.pairings)} trunk(s), {len(self.sidecars)} {SIDECAR_KEYWORD} file(s); "
                 f"pairing by llama.cpp {self.build}'s rule (common/download.cpp, find_best_sibling)"]
        lines.extend(_pairing_line(p) for p in self.pairings)
        unused = [s for s in self.sidecars if all(p.sidecar != s for p in self.pairings)]
        lines.extend(f"  unused: {s} (no trunk here picks it)" for s in unused)
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"command": "sidecars", "pair": self.source, "on_hub": self.on_hub, "llama_cpp_build": self.build,
                "sidecars": list(self.sidecars), "trunks": [p.to_dict() for p in self.pairings]}


def _pairing_line(pairing: TrunkPairing) -> str:
    """``  TRUNK (TAG, N shards) -> SIDECAR`` (or what llama.cpp does instead)."""
    shards = f", {pairing.shards} shards" if pairing.shards > 1 else ""
    picked = pairing.sidecar or f"no {SIDECAR_KEYWORD} file in its folder or above"
    outcome = f"llama.cpp fails: {pairing.failure}" if pairing.failure else picked
    return f"  {pairing.trunk} ({pairing.tag or 'no tag'}{shards}) -> {outcome}"


def _folder_listing(folder: Path) -> list[str]:
    """The files under ``folder`` (links not followed into), as ``/``-separated relative paths in name order.

    Raises:
        ParameterError: more than :data:`MAX_LISTED_FILES` files.
    """
    found: list[str] = []
    def refuse(error: OSError) -> None:  # os.walk would skip an unreadable folder silently
        raise error

    for root, dirs, names in os.walk(folder, onerror=refuse):
        dirs.sort()
        rel = Path(root).relative_to(folder)
        found.extend((rel / n).as_posix() for n in names)
        if len(found) > MAX_LISTED_FILES:
            raise ParameterError(f"more than {MAX_LISTED_FILES:,} files: not a folder of GGUF quants",
                                 folder, parameter="pair")
    return sorted(found)


def _listing(source: str, api: HubApi | None, revision: str | None) -> tuple[list[str], bool]:
    """(the file list, whether it is a Hub repo's)."""
    if os.path.isdir(source):
        return _folder_listing(Path(source)), False
    if not hub.is_repo_id(source) or source.startswith((".", "/", "~")):
        raise ParameterError("neither a folder nor a Hub repo id (OWNER/NAME)", source, parameter="pair")
    token = hub_access.resolve_token()
    files = hub.list_repo_files(hub.make_api(api, token=token), source, token=token, revision=revision)
    return files, True


def _sidecars(files: Sequence[str]) -> Iterator[str]:
    return (f for f in files if f.endswith(".gguf") and SIDECAR_KEYWORD in f)


def sidecar_pairing(source: str, *, revision: str | None = None, api: HubApi | None = None) -> PairingReport:
    """Which ``mtp-`` sidecar llama.cpp's ``-hf`` picks for each trunk quant of a folder or a Hub repo.

    Args:
        source: a local folder laid out like the repo, or a Hub repo id (``OWNER/NAME``).
        revision: the repo's branch, tag or commit (Hub only).
        api: the Hub client (tests pass a stand-in).

    Returns:
        A :class:`PairingReport`.

    Raises:
        ParameterError: ``source`` is neither a folder nor a repo id.
        HubError: the Hub cannot be asked (offline, no access).

    Example:
        >>> sidecar_pairing("ggml-org/Qwen3.6-27B-GGUF").describe()  # doctest: +SKIP
    """
    try:
        files, on_hub = _listing(source, api, revision)
    except OSError as e:
        raise InputReadError(f"cannot list it: {e.strerror or e}", e.filename or source) from None
    return PairingReport(source, on_hub, tuple(_sidecars(files)), tuple(pair_listing(files)))
