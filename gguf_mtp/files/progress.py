"""The one progress bar of every long read or write."""

from __future__ import annotations

import sys

from tqdm import tqdm

from gguf_mtp.constants import progress_disabled

__all__ = ["progress_bar"]


def progress_bar(total: int, desc: str, *, enabled: bool = True, unit: str = "B") -> tqdm:
    """A tqdm bar on stderr, off when disabled, when stderr is not a terminal, or globally off."""
    disable = not enabled or progress_disabled() or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1024, disable=disable, leave=False)
