"""``gguf-mtp demo``."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the whole flow on an embedded tiny model (offline, seconds)",
        description="Write a tiny 3-shard nemotron_h_moe target and an MTPv2-style head checkpoint, then convert, "
        "compose, verify (llama.cpp loads the composite and runs its NextN block, when installed), inspect, and "
        "show the model card a publish would upload. Nothing is downloaded.",
    )
    p.add_argument("--dir", help="work folder (default: a new temporary folder)")
    p.add_argument("--no-llama", action="store_true", help="skip the llama.cpp load")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo  # imports the whole toolchain: only when the demo runs

    return 0 if run_demo(args.dir, llama=False if args.no_llama else None) else 2
