"""Fetch the MTP head of a Hub checkpoint by byte ranges: its tensors, not the shards that hold them.

The head of a large model shares its shards with trunk layers (DeepSeek V3's layer 61 sits in the last
shards of 163, beside layers 58-60), so downloading "the shards that hold the head" moves tens of GB
for a few. Here only these cross the network:

* ``config.json`` and the index (``model.safetensors.index.json``), through huggingface_hub's
  download and cache, as before; the snapshot folder they land in names the commit they came from;
* of each shard the index places a head tensor in: its safetensors header (8 bytes of length, then
  the JSON), and then the byte ranges of the head's tensors (FP8 scales included: they carry the
  weights' names), neighbouring ranges joined when less than :data:`JOIN_GAP` bytes lie between them.

Every range is read with :class:`~gguf_mtp.hub.remote.RemoteFile`: huggingface_hub's own session and
back-off, the same deadlines and bounds as remote ``inspect``, an answer cut short resumed from its
last byte, and every read pinned to the commit ``config.json`` came from (a file that changes between
two ranges is refused, never stitched).

What was fetched is written as a small safetensors file per shard, under the shard's own name, in a
scratch folder: the head's tensors only, packed back to back, with a header that places them there. The
converter reads that folder exactly as it reads a full local copy (it keeps the head's tensors only), so
the draft is byte for byte the one a full copy gives.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.errors import CheckpointError, HubError
from gguf_mtp.files.create import create_exclusive, write_all
from gguf_mtp.format.safetensors_io import (
    CONFIG_NAME,
    INDEX_NAME,
    MAX_HEADER_BYTES,
    NamePrefix,
    SafetensorsFile,
    SafetensorsTensor,
    natural_key,
    read_index,
)
from gguf_mtp.text import human_bytes

from .remote import HubFile, RemoteFile

__all__ = ["JOIN_GAP", "RangeFetch", "fetch_head_ranges", "joined_ranges"]

logger = logging.getLogger(__name__)

#: Two head tensors' byte ranges closer than this are fetched as one range (the bytes between come along).
JOIN_GAP = 64 * 1024

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class RangeFetch:
    """What a byte-range fetch of a head read, and where it put it."""

    folder: Path  # config.json, the index and one small safetensors file per head shard
    commit: str | None  # the commit every read was pinned to (None: the Hub named none)
    files: tuple[str, ...]  # the shards that hold head tensors
    shard_bytes: int  # their sizes on the Hub, together: what a download of them would move
    head_bytes: int  # the head tensors' bytes
    bytes_fetched: int  # body bytes received for the shards (headers + ranges)
    requests: int  # range requests made
    data: bool  # whether the tensor bytes were fetched (not in a dry run: headers only)

    def describe(self) -> str:
        """One line: what crossed the network, against what a download of the shards would move."""
        at = f" at commit {self.commit[:12]}" if self.commit else ""
        what = "headers and head tensors" if self.data else "headers only (dry run)"
        return (
            f"fetched by byte ranges{at}: {human_bytes(self.bytes_fetched)} ({what}) of the "
            f"{human_bytes(self.shard_bytes)} of {len(self.files)} shard(s) {', '.join(self.files)}, "
            f"in {self.requests} request(s)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "ranges",
            "commit": self.commit,
            "shards": list(self.files),
            "shard_bytes": self.shard_bytes,
            "head_bytes": self.head_bytes,
            "bytes_fetched": self.bytes_fetched,
            "http_requests": self.requests,
            "tensor_data_fetched": self.data,
        }


def joined_ranges(tensors: Sequence[SafetensorsTensor], gap: int = JOIN_GAP) -> list[tuple[int, int]]:
    """``(start, end)`` byte ranges covering ``tensors``, in file order, joining ranges less than ``gap`` apart."""
    ranges: list[tuple[int, int]] = []
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.nbytes == 0:
            continue
        start, end = t.offset, t.offset + t.nbytes
        if ranges and start - ranges[-1][1] < gap:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], end))
        else:
            ranges.append((start, end))
    return ranges


def _remote_header(remote: RemoteFile) -> SafetensorsFile:
    """The checked safetensors header of a remote shard (the same checks as a local file's).

    Raises:
        CheckpointError: not a safetensors header, or one over :data:`MAX_HEADER_BYTES`.
    """
    name = str(remote.hub_file)
    head = remote.read_at(0, 8)
    if len(head) < 8:
        raise CheckpointError(f"not a safetensors file ({remote.size} bytes, too short for a header)", name)
    length = int.from_bytes(head, "little")
    if length > min(remote.size - 8, MAX_HEADER_BYTES):
        raise CheckpointError(
            f"corrupt safetensors header: it claims {length:,} bytes, the file has {remote.size:,}", name
        )
    raw = remote.read_at(8, length)
    if len(raw) != length:
        raise CheckpointError(f"corrupt safetensors header: only {8 + len(raw):,} bytes could be read", name)
    return SafetensorsFile(name, header=(remote.size, raw))


def _wanted(header: SafetensorsFile, prefix: NamePrefix) -> list[SafetensorsTensor]:
    return [t for t in header.tensors.values() if t.name.startswith(prefix)]


def _write_head_shard(
    path: Path, header: SafetensorsFile, tensors: list[SafetensorsTensor], remote: RemoteFile | None
) -> None:
    """``path``: a safetensors file of ``tensors`` alone, their bytes fetched from ``remote`` (``None``: left
    as a hole, for a dry run that reads no tensor data)."""
    ranges = joined_ranges(tensors)
    placed: dict[int, int] = {}  # the start of each range in the source -> its data offset here
    position = 0
    for start, end in ranges:
        placed[start] = position
        position += end - start
    entries: dict[str, Any] = {"__metadata__": header.metadata} if header.metadata else {}
    for t in sorted(tensors, key=lambda t: t.offset):
        base = 0
        if t.nbytes:
            start = next(s for s, e in ranges if s <= t.offset < e)
            base = placed[start] + t.offset - start
        entries[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [base, base + t.nbytes]}
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    data_start = 8 + len(raw)
    fd = create_exclusive(path)
    try:
        write_all(fd, len(raw).to_bytes(8, "little") + raw)
        if remote is not None:
            for start, end in ranges:
                remote.copy_range(start, end - start, _writer(fd, data_start + placed[start]))
        os.ftruncate(fd, data_start + position)
    finally:
        os.close(fd)


def _writer(fd: int, at: int) -> Callable[[int, bytes], None]:
    """Writes the bytes of one fetched range, ``done`` bytes into it, at ``at + done`` of ``fd``."""

    def write(done: int, data: bytes) -> None:
        view, offset = memoryview(data), at + done
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

    return write


def fetch_head_ranges(
    repo_id: str,
    folder: Path,
    *,
    config_path: Path,
    index_path: Path,
    prefix: NamePrefix,
    data: bool = True,
) -> RangeFetch:
    """Fetch the head of ``repo_id`` (the tensors whose names start with ``prefix``) into ``folder`` (empty,
    ours) by byte ranges, pinned to the commit of the snapshot ``config_path`` was downloaded into;
    ``data=False``: the shards' headers only (the tensors' bytes are left as holes, for a dry run).

    Raises:
        CheckpointError: the index lists no head tensor, or a shard's header is not safetensors.
        HubError: the Hub cannot be read, a shard is missing, or one changed while it was read.
    """
    weight_map = read_index(index_path)
    files = sorted({f for name, f in weight_map.items() if name.startswith(prefix)}, key=natural_key)
    if not files:
        wanted = " or ".join(p + "*" for p in ((prefix,) if isinstance(prefix, str) else prefix))
        raise CheckpointError(f"{INDEX_NAME} lists no {wanted} tensor: this checkpoint has no MTP head",
                              f"hf://{repo_id}")
    snapshot = config_path.parent.name
    commit = snapshot if _COMMIT.match(snapshot) else None
    shutil.copyfile(config_path, folder / CONFIG_NAME)
    shutil.copyfile(index_path, folder / INDEX_NAME)
    shard_bytes = head_bytes = fetched = requests = 0
    for name in files:
        remote = RemoteFile.open(HubFile(repo_id, name, commit), limit=8 + MAX_HEADER_BYTES)
        if commit is not None and remote.commit not in (None, commit):
            raise HubError(f"the Hub answered for commit {remote.commit[:12]}, not {commit[:12]}", str(remote.hub_file))
        header = _remote_header(remote)
        tensors = _wanted(header, prefix)
        _write_head_shard(folder / name, header, tensors, remote if data else None)
        shard_bytes += remote.size
        head_bytes += sum(t.nbytes for t in tensors)
        fetched += remote.bytes_received
        requests += remote.requests
        logger.info("fetched %s of %s: %d head tensors (%s), %s received in %d request(s)", name, repo_id,
                    len(tensors), human_bytes(sum(t.nbytes for t in tensors)), human_bytes(remote.bytes_received),
                    remote.requests)
    return RangeFetch(folder, commit, tuple(files), shard_bytes, head_bytes, fetched, requests, data)
