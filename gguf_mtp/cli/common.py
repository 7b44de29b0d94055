"""Helpers shared by the subcommand modules."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_output_flags(parser: argparse.ArgumentParser, *, dry_run: bool = True) -> None:
    """``--json``, ``--quiet`` and (optionally) ``--dry-run``."""
    parser.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    if dry_run:
        parser.add_argument("--dry-run", action="store_true", help="show the plan, write nothing")


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
