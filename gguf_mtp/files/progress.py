"""The one progress bar of every long read or write."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from gguf_mtp.constants import progress_disabled
from gguf_mtp.text import human_bytes

__all__ = ["progress_bar"]

#: tqdm's default layout, with byte counts and speed in binary units (tqdm's own unit_scale prints the speed in
#: decimal units whatever unit_divisor says).
_BYTES_FORMAT = "{l_bar}{bar}| {done}/{size} [{elapsed}<{remaining}, {speed}]"


class _ByteBar(tqdm):  # type: ignore[misc]  # tqdm is untyped
    """A tqdm bar over bytes that prints them as the reports do: ``1.5 GiB/3.0 GiB [..., 120.0 MiB/s]``."""

    @property
    def format_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = super().format_dict
        done = values["n"] - values.get("initial", 0)
        rate = values["rate"] or (done / values["elapsed"] if values["elapsed"] else None)
        values.update(done=human_bytes(values["n"]),
                      size=human_bytes(values["total"]) if values["total"] is not None else "?",
                      speed=f"{human_bytes(rate)}/s" if rate else "? B/s")
        return values


def progress_bar(total: int, desc: str, *, enabled: bool = True, unit: str = "B") -> tqdm:
    """A tqdm bar on stderr, off when disabled, when stderr is not a terminal, or globally off; bytes (``unit``
    ``"B"``) in binary units (KiB, MiB, GiB), as every report prints sizes."""
    disable = not enabled or progress_disabled() or not sys.stderr.isatty()
    if unit == "B":
        return _ByteBar(total=total, desc=desc, unit=unit, disable=disable, leave=False, bar_format=_BYTES_FORMAT)
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=disable, leave=False)
