"""``gguf-mtp extract SOURCE [-o DRAFT.gguf] [--standalone]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import (
    add_embd_type_flag,
    add_llama_cpp_flag,
    add_output_flags,
    add_outtype_flag,
    print_outcome,
    write_options,
)


def default_output(source: str, standalone: bool) -> Path:
    """``mtp-<model name>.gguf`` in the current folder (the shard suffix of a split source left out)."""
    from gguf_mtp.constants import SPLIT_NAME

    name = Path(source).name
    match = SPLIT_NAME.match(name)
    stem = match["prefix"] if match else Path(name).stem
    return Path(f"mtp-{stem}.gguf" if standalone else f"mtp-draft-{stem}.gguf")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "extract",
        help="copy the NextN (MTP) block(s) of a model into a draft GGUF that compose accepts",
        description="Copy the NextN block(s) of SOURCE (the last {arch}.nextn_predict_layers blocks) byte for byte "
        "into a draft GGUF, with the metadata compose needs. With --standalone the file also carries the source's "
        "token_embd/output_norm/output and tokenizer: an MTP-only model for llama-server --spec-draft-model.",
    )
    p.add_argument("source", help="a GGUF with NextN blocks, or any shard of a <prefix>-NNNNN-of-NNNNN.gguf set")
    p.add_argument(
        "-o", "--output", metavar="DRAFT.gguf",
        help="the file (or folder) to write to (default name: mtp-draft-<name>.gguf, or mtp-<name>.gguf with "
        "--standalone, in the current folder)",
    )
    p.add_argument("--standalone", action="store_true", help="write an MTP-only model llama.cpp loads on its own")
    p.add_argument(
        "--target", metavar="TRUNK.gguf",
        help="with --standalone: the model the sidecar serves, refused unless of SOURCE's model; a shared sidecar "
        "(nextn_shared_target_tensors) gets its token_embd/output_norm/output and tokenizer, so upstream "
        "llama.cpp loads it",
    )
    add_outtype_flag(p, imatrix=True)
    add_embd_type_flag(p)
    p.add_argument("--force", action="store_true", help="replace an existing output (never an input)")
    add_llama_cpp_flag(p, "--outtype's and --embd-type's quantizer")
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.jobs.extract import extract

    output = Path(args.output) if args.output else default_output(args.source, args.standalone)
    if output.is_dir():
        output = output / default_output(args.source, args.standalone)
    report = extract(args.source, output, standalone=args.standalone, outtype=args.outtype,
                     embd_type=args.embd_type, target=args.target, imatrix=args.imatrix, **write_options(args))
    print_outcome(args, report)
    return 0
