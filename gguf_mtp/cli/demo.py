"""``gguf-mtp demo``."""

from __future__ import annotations

import argparse

from .common import print_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the whole flow on an embedded tiny model (offline, seconds)",
        description="Write a tiny 3-shard nemotron_h_moe target and an MTPv2-style head checkpoint, then convert, "
        "compose, verify (llama.cpp loads the composite and runs its NextN block, when installed), inspect, "
        "show the model card a publish would upload, and predict the acceptance of a designed head with accept "
        "(cycle.gguf, a tiny model with a tokenizer). Nothing is downloaded.",
    )
    p.add_argument(
        "--dir",
        dest="work_dir",
        help="work folder: new, empty, or an earlier demo's (default: a temporary folder, removed at the end)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary folder's files and say where they are")
    p.add_argument(
        "--force",
        action="store_true",
        help="use a non-empty --dir that no demo made (its files of the demo's names are replaced)",
    )
    p.add_argument("--no-llama", action="store_true", help="skip the llama.cpp load")
    p.add_argument("--json", action="store_true", help="print the steps as one JSON report instead of lines")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.demo import run_demo  # imports the whole toolchain: only when the demo runs

    lines: list[str] = []
    say = lines.append if args.json else print
    ok = run_demo(args.work_dir, llama=False if args.no_llama else None, keep=args.keep, force=args.force, say=say)
    if args.json:
        print_json({"command": "demo", "ok": ok, "steps": lines})
    return 0 if ok else 2
