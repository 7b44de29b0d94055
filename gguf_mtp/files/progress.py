"""The one progress bar of every long read or write."""

from __future__ import annotations

import functools
import sys
from typing import Any, Protocol

from gguf_mtp.constants import progress_disabled
from gguf_mtp.text import human_bytes

__all__ = ["ProgressBar", "progress_bar"]

#: tqdm's default layout, with byte counts and speed in binary units (tqdm's own unit_scale prints the speed in
#: decimal units whatever unit_divisor says).
_BYTES_FORMAT = "{l_bar}{bar}| {done}/{size} [{elapsed}<{remaining}, {speed}]"


class ProgressBar(Protocol):
    """What :func:`progress_bar` gives: a tqdm bar, or one that is not shown."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...

    def __enter__(self) -> ProgressBar: ...

    def __exit__(self, *exc_info: object) -> object: ...


class _HiddenBar:
    """A bar that is not shown. Not tqdm's disabled bar: importing tqdm and making its first bar (which sets
    up a multiprocessing lock) costs a command that prints no bar some 30 ms of its start."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _HiddenBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


@functools.cache
def _byte_bar() -> Any:
    from tqdm import tqdm

    class ByteBar(tqdm):  # type: ignore[misc]  # tqdm is untyped
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

    return ByteBar


def progress_bar(total: int, desc: str, *, enabled: bool = True, unit: str = "B") -> ProgressBar:
    """A tqdm bar on stderr, off when disabled, when stderr is not a terminal, or globally off; bytes (``unit``
    ``"B"``) in binary units (KiB, MiB, GiB), as every report prints sizes."""
    if not enabled or progress_disabled() or not sys.stderr.isatty():
        return _HiddenBar()
    if unit == "B":
        bar: ProgressBar = _byte_bar()(total=total, desc=desc, unit=unit, leave=False, bar_format=_BYTES_FORMAT)
        return bar
    from tqdm import tqdm

    plain: ProgressBar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False)
    return plain
