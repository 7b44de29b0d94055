"""The pipeline's disk need, and its check before the first byte.

A run adds to the disks what it downloads into the Hub cache and the composite it writes into the work folder
(about the target's size: the target's tensor data, new headers and the NextN block). A target read from a
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
from gguf_mtp.text import human_bytes

__all__ = ["DiskNeed", "check_disk", "disk_need", "free_space"]


def free_space(folder: Path) -> int:
    """Bytes free for an unprivileged writer on the filesystem of ``folder`` (its nearest existing parent)."""
    return shutil.disk_usage(_existing(folder)).free


def _existing(folder: Path) -> Path:
    probe = folder.absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


@dataclass(frozen=True)
class DiskNeed:
    """What a run adds to the disks, at least (the head's files and the draft come on top)."""

    download: int  # bytes downloaded into the Hub cache (0 for a target read from a folder)
    composite: int  # bytes of the composite written into the work folder, before reflink sharing
    shared: int  # of ``composite``, bytes a reflink filesystem shares with the target (take no new blocks)
    cache: Path | None  # the Hub cache the downloads go to (None: nothing is downloaded)
    work: Path

    @property
    def total(self) -> int:
        return self.download + self.composite - self.shared

    def describe(self) -> str:
        """``378.0 GiB (190.0 GiB into the Hub cache, a composite of 189.0 GiB in WORK)``, one line."""
        parts = []
        if self.download:
            parts.append(f"{human_bytes(self.download)} into the Hub cache")
        composite = f"a composite of {human_bytes(self.composite)} in {self.work}"
        if self.shared:
            composite += f", {human_bytes(self.shared)} of it shared with the target (reflink)"
        parts.append(composite)
        return f"{human_bytes(self.total)} ({', '.join(parts)})"


def disk_need(
    sizes: Sequence[int], *, local: Sequence[Path], download: int, cache: Path | None, work: Path,
    composite_done: bool = False,
) -> DiskNeed:
    """The disk a run needs for a target of ``sizes`` bytes per file.

    Args:
        sizes: each target file's size.
        local: the target files already on this machine (cached, or in a target folder): one of them proves
            whether the work folder's filesystem can share their extents (reflink).
        download: the bytes still to download into ``cache``.
        cache: the Hub cache folder (``None`` when nothing is downloaded).
        work: the work folder (it may not exist yet).
        composite_done: the state file records a composite (a re-run checks and reuses it: no new bytes).
    """
    composite = 0 if composite_done else sum(sizes)
    shared = composite if composite and local and can_share(local[0], _existing(work)) else 0
    return DiskNeed(download, composite, shared, cache if download else None, work)


def check_disk(need: DiskNeed) -> None:
    """Refuse a run whose downloads and composite do not fit, before its first byte.

    Raises:
        UnsafeOutputError: one line naming the bytes needed and the bytes free (per filesystem).
    """
    landing: dict[int, tuple[Path, int]] = {}  # st_dev -> (a folder on it, bytes landing there)
    for folder, nbytes in ((need.cache, need.download), (need.work, need.composite - need.shared)):
        if folder is None or nbytes <= 0:
            continue
        device = os.stat(_existing(folder)).st_dev
        first, before = landing.get(device, (folder, 0))
        landing[device] = (first, before + nbytes)
    for folder, nbytes in landing.values():
        free = free_space(folder)
        if nbytes > free:
            raise UnsafeOutputError(
                f"not enough free space for the pipeline: {human_bytes(nbytes)} needed ({nbytes:,} bytes: "
                f"{need.describe()}), {human_bytes(free)} free ({free:,} bytes)",
                _existing(folder),
            )
