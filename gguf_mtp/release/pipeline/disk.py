"""The pipeline's disk need, and its check before the first byte.

A run adds to the disks what it downloads into the Hub cache and what it writes into the work folder: the head
fetched by byte ranges (a scratch folder, while the draft is converted), the draft, and the composite (the
target's bytes, the NextN block, which is at most the draft, and each shard's header growth). The draft's size
is an upper bound (:func:`gguf_mtp.jobs.convert.draft_size_bound`), so the check never passes a run that compose
refuses at the end. A target read from a
folder (a Hub repo mounted read-only in a Job, or any local copy) is not downloaded: only the composite is
written. On a reflink filesystem (XFS, btrfs, ZFS block cloning) holding both the target and the work folder,
the composite shares the target's data and adds only its headers and the NextN block: that share is counted as
free, as compose's own check counts it (:func:`gguf_mtp.files.kernel_copy.shareable_bytes`), when a target file
is already there to prove it. The Hub cache and the work folder may lie on different filesystems: each
filesystem is checked for what lands on it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf_mtp.errors import UnsafeOutputError
from gguf_mtp.files.kernel_copy import can_share
from gguf_mtp.files.scratch import existing_ancestor
from gguf_mtp.text import human_bytes

__all__ = ["SHARD_HEADER_GROWTH", "DiskNeed", "HeadNeed", "check_disk", "disk_need", "free_space"]

#: What compose adds to one shard's header at most besides the NextN tensors' entries (those are in the draft's
#: header too): its set id KV, one more entry in each per-layer array, and the alignment and share-block padding.
SHARD_HEADER_GROWTH = 16 * 1024


@dataclass(frozen=True)
class HeadNeed:
    """What the head adds to the work folder: the draft (an upper bound) and the byte ranges fetched for it."""

    draft: int
    scratch: int = 0  # the head's byte ranges, in a scratch folder while the draft is converted (0: a local head)
    done: bool = False  # the draft is in the work folder already (a re-run reuses it): only compose adds bytes


def free_space(folder: Path) -> int:
    """Bytes free for an unprivileged writer on the filesystem of ``folder`` (its nearest existing parent)."""
    return shutil.disk_usage(existing_ancestor(folder)).free


@dataclass(frozen=True)
class DiskNeed:
    """What a run adds to the disks, at most."""

    download: int  # bytes downloaded into the Hub cache (0 for a target read from a folder)
    composite: int  # bytes of the composite written into the work folder, before reflink sharing
    shared: int  # of ``composite``, bytes a reflink filesystem shares with the target (take no new blocks)
    cache: Path | None  # the Hub cache the downloads go to (None: nothing is downloaded)
    work: Path
    draft: int = 0  # the draft written into the work folder (an upper bound)
    scratch: int = 0  # the head's byte ranges, fetched into the work folder while the draft is converted

    @property
    def in_work(self) -> int:
        """Bytes landing in the work folder."""
        return self.composite - self.shared + self.draft + self.scratch

    @property
    def total(self) -> int:
        return self.download + self.in_work

    def describe(self) -> str:
        """``378.0 GiB (190.0 GiB into the Hub cache, a composite of 189.0 GiB in WORK)``, one line."""
        parts = []
        if self.download:
            parts.append(f"{human_bytes(self.download)} into the Hub cache")
        composite = f"a composite of {human_bytes(self.composite)} in {self.work}"
        if self.shared:
            composite += f", {human_bytes(self.shared)} of it shared with the target (reflink)"
        parts.append(composite)
        if self.draft:
            parts.append(f"a draft of at most {human_bytes(self.draft)}")
        if self.scratch:
            parts.append(f"the head's byte ranges, {human_bytes(self.scratch)}")
        return f"{human_bytes(self.total)} ({', '.join(parts)})"


def disk_need(
    sizes: Sequence[int], *, local: Sequence[Path], download: int, cache: Path | None, work: Path,
    head: HeadNeed | None = None, composite_done: bool = False,
) -> DiskNeed:
    """The disk a run needs for a target of ``sizes`` bytes per file.

    Args:
        sizes: each target file's size.
        local: the target files already on this machine (cached, or in a target folder): one of them proves
            whether the work folder's filesystem can share their extents (reflink).
        download: the bytes still to download into ``cache``.
        cache: the Hub cache folder (``None`` when nothing is downloaded).
        work: the work folder (it may not exist yet).
        head: the draft and the head's bytes to fetch for it (``None``: unknown, counted as nothing).
        composite_done: the state file records a composite (a re-run checks and reuses it: no new bytes).
    """
    draft = head.draft if head is not None else 0
    composite = 0 if composite_done else sum(sizes) + draft + len(sizes) * SHARD_HEADER_GROWTH
    # Only the target's data can be shared: the headers and the NextN block are new bytes.
    shared = sum(sizes) if composite and local and can_share(local[0], existing_ancestor(work)) else 0
    new_draft, scratch = (0, 0) if head is None or head.done else (head.draft, head.scratch)
    return DiskNeed(download, composite, shared, cache if download else None, work, new_draft, scratch)


def check_disk(need: DiskNeed) -> None:
    """Refuse a run whose downloads and composite do not fit, before its first byte.

    Raises:
        UnsafeOutputError: one line naming the bytes needed and the bytes free (per filesystem).
    """
    landing: dict[int, tuple[Path, int]] = {}  # st_dev -> (a folder on it, bytes landing there)
    for folder, nbytes in ((need.cache, need.download), (need.work, need.in_work)):
        if folder is None or nbytes <= 0:
            continue
        device = os.stat(existing_ancestor(folder)).st_dev
        first, before = landing.get(device, (folder, 0))
        landing[device] = (first, before + nbytes)
    for folder, nbytes in landing.values():
        free = free_space(folder)
        if nbytes > free:
            raise UnsafeOutputError(
                f"not enough free space for the pipeline: {human_bytes(nbytes)} needed ({nbytes:,} bytes: "
                f"{need.describe()}), {human_bytes(free)} free ({free:,} bytes)",
                existing_ancestor(folder),
            )
