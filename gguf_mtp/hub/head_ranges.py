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

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.errors import CheckpointError, GGUFMTPError, HubError, OutputWriteError, UnsafeOutputError
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

__all__ = ["JOIN_GAP", "RangeFetch", "fetch_head_ranges", "head_files", "head_shards", "joined_ranges",
           "snapshot_commit"]

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
    scratch_bytes: int = 0  # the files written into ``folder`` take this much once their bytes are fetched

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


def snapshot_commit(path: Path) -> str | None:
    """The commit the Hub cache's snapshot folder holding ``path`` is named by (``None``: not a snapshot's)."""
    name = path.parent.name
    return name if _COMMIT.fullmatch(name) else None


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


def _wanted(header: SafetensorsFile, prefix: NamePrefix) -> list[SafetensorsTensor]:
    return [t for t in header.tensors.values() if t.name.startswith(prefix)]


@dataclass(frozen=True)
class _HeadShard:
    """One shard's head as it is written in the scratch folder: the header bytes and where each range goes."""

    name: str
    remote: RemoteFile
    tensors: list[SafetensorsTensor]
    header: bytes  # 8 bytes of length, then the JSON placing the tensors back to back
    ranges: list[tuple[int, int, int]]  # (start in the source, length, offset in the file written)

    @property
    def size(self) -> int:
        return len(self.header) + sum(length for _, length, _ in self.ranges)


def _head_shard(name: str, remote: RemoteFile, header: SafetensorsFile, tensors: list[SafetensorsTensor]) -> _HeadShard:
    """The layout of a safetensors file of ``tensors`` alone, their ranges packed back to back (pure)."""
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
    return _HeadShard(name, remote, tensors, len(raw).to_bytes(8, "little") + raw,
                      [(start, end - start, data_start + placed[start]) for start, end in ranges])


def _write_head_shard(path: Path, shard: _HeadShard, data: bool) -> None:
    """``path``: the shard's head, its bytes fetched (``data=False``: left as a hole, for a dry run)."""
    fd = create_exclusive(path)
    try:
        write_all(fd, shard.header)
        if data:
            for start, length, at in shard.ranges:
                shard.remote.copy_range(start, length, _writer(fd, at))
        os.ftruncate(fd, shard.size)
    finally:
        os.close(fd)


def _check_free_space(folder: Path, needed: int, repo_id: str) -> None:
    """Refuse a fetch whose bytes do not fit in ``folder``, before the first of them.

    Raises:
        UnsafeOutputError: one line naming the folder ``folder`` lies in, the bytes needed and the bytes free.
    """
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise UnsafeOutputError(_no_room(needed, free, repo_id), folder.parent)


def _no_room(needed: int, free: int, repo_id: str) -> str:
    return (f"not enough free space for the head of {repo_id}: {human_bytes(needed)} needed ({needed:,} bytes), "
            f"{human_bytes(free)} free ({free:,} bytes)")


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
    files = head_shards(read_index(index_path), prefix, repo_id)
    commit = snapshot_commit(config_path)
    shutil.copyfile(config_path, folder / CONFIG_NAME)
    shutil.copyfile(index_path, folder / INDEX_NAME)
    shards = [_read_head_shard(repo_id, name, commit, prefix) for name in files]
    needed = sum(shard.size for shard in shards) if data else 0
    _check_free_space(folder, needed, repo_id)
    for shard in shards:
        _write_or_no_room(folder, shard, data, needed, repo_id)
        _log_fetched(shard, repo_id)
    return _range_fetch(folder, commit, shards, data)


def _log_fetched(shard: _HeadShard, repo_id: str) -> None:
    logger.info("fetched %s of %s: %d head tensors (%s), %s received in %d request(s)", shard.name, repo_id,
                len(shard.tensors), human_bytes(sum(t.nbytes for t in shard.tensors)),
                human_bytes(shard.remote.bytes_received), shard.remote.requests)


def _range_fetch(folder: Path, commit: str | None, shards: Sequence[_HeadShard], data: bool) -> RangeFetch:
    """What the fetch of ``shards`` read (their sizes, tensors, bytes and requests together)."""
    return RangeFetch(
        folder, commit, tuple(s.name for s in shards), sum(s.remote.size for s in shards),
        sum(t.nbytes for s in shards for t in s.tensors), sum(s.remote.bytes_received for s in shards),
        sum(s.remote.requests for s in shards), data, sum(s.size for s in shards),
    )


def head_files(weight_map: dict[str, str], prefix: NamePrefix = "mtp.") -> list[str]:
    """The files of an index's ``weight_map`` that hold tensors starting with ``prefix``."""
    return sorted({file for name, file in weight_map.items() if name.startswith(prefix)}, key=natural_key)


def head_shards(weight_map: dict[str, str], prefix: NamePrefix, repo_id: str) -> list[str]:
    """:func:`head_files` of ``repo_id``'s index, which must list one.

    Raises:
        CheckpointError: the index lists no head tensor.
    """
    files = head_files(weight_map, prefix)
    if not files:
        wanted = " or ".join(p + "*" for p in ((prefix,) if isinstance(prefix, str) else prefix))
        raise CheckpointError(f"{INDEX_NAME} lists no {wanted} tensor: this checkpoint has no MTP head",
                              f"hf://{repo_id}")
    return files


def _write_or_no_room(folder: Path, shard: _HeadShard, data: bool, needed: int, repo_id: str) -> None:
    """:func:`_write_head_shard` into ``folder``; a full disk is one line naming the folder it lies in.

    Raises:
        OutputWriteError: no room (ENOSPC, EDQUOT, EFBIG) after the free-space check passed.
    """
    try:
        _write_head_shard(folder / shard.name, shard, data)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or isinstance(e, GGUFMTPError):
            raise
        free = shutil.disk_usage(folder).free
        # Named by the folder the scratch lies in (the output's), not by the scratch, which is removed.
        raise OutputWriteError(f"{_no_room(needed, free, repo_id)}: {e.strerror}", folder.parent) from None


def _read_head_shard(repo_id: str, name: str, commit: str | None, prefix: NamePrefix) -> _HeadShard:
    """A head shard's checked header and the layout of its head in the scratch folder (the header read only).

    Raises:
        HubError: the Hub answered for another commit than ``commit``.
        CheckpointError: not a safetensors header.
    """
    remote = RemoteFile.open(HubFile(repo_id, name, commit), limit=8 + MAX_HEADER_BYTES)
    if commit is not None and remote.commit not in (None, commit):
        raise HubError(f"the Hub answered for commit {remote.commit[:12]}, not {commit[:12]}", str(remote.hub_file))
    header = SafetensorsFile.from_reader(str(remote.hub_file), remote.size, remote.read_at)
    return _head_shard(name, remote, header, _wanted(header, prefix))
