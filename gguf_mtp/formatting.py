"""Small text helpers shared by the human-readable reports."""

from __future__ import annotations

from typing import Any

__all__ = ["human_bytes", "short"]


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'`` (binary units, as tools that size GGUF files print them)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (long per-layer arrays in KV change lines)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
