"""``gguf-mtp demo``."""

from __future__ import annotations

import argparse

from ..demo import run_demo


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run the whole job on an embedded tiny model (offline, seconds)")
    p.add_argument("--dir", help="work folder (default: a new temporary folder)")
    p.add_argument("--no-llama", action="store_true", help="skip the llama.cpp load")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return 0 if run_demo(args.dir, llama=False if args.no_llama else None) else 2
