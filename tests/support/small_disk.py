"""A filesystem of a known size for the free-space tests: a tmpfs mounted on a folder (the tests run as root)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PAGE = 4096  # tmpfs sizes and files take whole pages


@contextmanager
def small_disk(folder: Path, nbytes: int) -> Iterator[Path]:
    """``folder`` (made here) as a tmpfs of ``nbytes`` (rounded up to a page), unmounted afterwards."""
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={nbytes},mode=0755", "tmpfs", str(folder)], check=True,
                   capture_output=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free
