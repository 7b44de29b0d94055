"""``gguf-mtp inspect PATH``."""

from __future__ import annotations

import argparse
import sys

from .common import print_json, print_report


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="show what a GGUF holds and whether it has an MTP head (local, or hf:// without downloading)",
        description="Summarise a GGUF model from its headers: architecture, trunk and NextN blocks, shards, "
        "split consistency, tensor types, per-layer kinds of hybrid models, and a one-line MTP verdict. "
        "A Hub file (hf://OWNER/REPO/path/to/file.gguf[@revision]) is read with HTTP range requests: "
        "only header bytes are fetched. Exit status 2 when the set has consistency problems.",
    )
    p.add_argument("path", help="a GGUF file, any shard of a <prefix>-NNNNN-of-NNNNN.gguf set, or hf://OWNER/REPO/...")
    p.add_argument("--tensors", action="store_true", help="list every tensor (name, type, shape, size, shard)")
    p.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.check.inspect import inspect

    summary = inspect(args.path, tensors=args.tensors)
    if args.json:
        print_json(summary.to_dict())
    else:
        print_report(summary.describe())
    if not summary.problems:
        return 0
    # The summary is printed either way; a set llama.cpp would refuse must not pass `inspect x && upload`.
    more = f" (+{len(summary.problems) - 1} more)" if len(summary.problems) > 1 else ""
    print(f"gguf-mtp: error: {args.path}: inconsistent: {summary.problems[0]}{more}", file=sys.stderr)
    return 2
