"""``gguf-mtp strip SOURCE -o OUTDIR``."""

from __future__ import annotations

import argparse

from .common import add_output_flags, print_outcome, write_options


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "strip",
        help="write a trunk-only copy of a model: its NextN (MTP) blocks removed",
        description="Copy SOURCE without its NextN block(s): their tensors leave every shard, block_count drops to "
        "the trunk, nextn_predict_layers is removed, per-layer arrays and split.tensors.count are restored. Every "
        "other tensor and KV is kept byte for byte.",
    )
    p.add_argument("source", help="a GGUF with NextN blocks, or any shard of a <prefix>-NNNNN-of-NNNNN.gguf set")
    p.add_argument("-o", "--output-dir", required=True, metavar="OUTDIR", help="folder for the trunk-only copy")
    p.add_argument("--force", action="store_true", help="replace existing outputs (never inputs)")
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.jobs.strip import strip

    report = strip(args.source, args.output_dir, **write_options(args))
    print_outcome(args, report)
    return 0
