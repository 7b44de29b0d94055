"""Helpers shared by the subcommand modules."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..formatting import human_bytes, short

__all__ = ["add_output_flags", "human_bytes", "print_json", "short"]


def add_output_flags(parser: argparse.ArgumentParser, *, dry_run: bool = True) -> None:
    """``--json``, ``--quiet`` and (optionally) ``--dry-run``."""
    parser.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    if dry_run:
        parser.add_argument("--dry-run", action="store_true", help="show the plan, write nothing")


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")

