"""``gguf-mtp compose TARGET DRAFT -o OUTDIR``."""

from __future__ import annotations

import argparse

from .common import (
    add_llama_cpp_flag,
    add_output_flags,
    add_outtype_flag,
    add_replace_head_flag,
    print_outcome,
    write_options,
)
from .verifying import add_verify_flags, verification_status, verify_requested


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "compose",
        help="splice an MTP draft into a (sharded, quantized) target as its final block",
        description="Splice the NextN block of DRAFT into TARGET without re-quantizing: every target tensor "
        "is copied byte for byte, the draft block is appended to the last shard, metadata is patched.",
    )
    p.add_argument("target", help="the target GGUF, or any shard of a <prefix>-NNNNN-of-NNNNN.gguf set")
    p.add_argument("draft", help="the MTP draft GGUF (blk.0.* or blk.N.* tensors)")
    p.add_argument("-o", "--output-dir", required=True, metavar="OUTDIR", help="folder for the composite")
    p.add_argument("--block", type=int, help="NextN block index (default and only value: the target's block count)")
    p.add_argument(
        "--set-kv",
        action="append",
        default=[],
        metavar="KEY[:TYPE]=VALUE",
        help="set a metadata key (an existing key keeps its type; a new key needs TYPE; keys compose computes, "
        "like split.* and gguf_mtp.*, are refused); repeatable",
    )
    p.add_argument("--basename", metavar="NAME", help="name outputs NAME-0000k-of-0000n.gguf")
    add_outtype_flag(p, "the NextN block's tensors (the target's bytes are copied as they are)", imatrix=True)
    add_replace_head_flag(p, "DRAFT's")
    p.add_argument("--force", action="store_true", help="replace existing outputs (never inputs)")
    add_verify_flags(p, "the composite")
    add_llama_cpp_flag(p, "--outtype's quantizer and the verification")
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.jobs.compose import compose

    verify = verify_requested(args)
    report = compose(
        args.target,
        args.draft,
        args.output_dir,
        block=args.block,
        outtype=args.outtype,
        imatrix=args.imatrix,
        set_kv=args.set_kv,
        basename=args.basename,
        replace_head=args.replace_head,
        verify=verify,
        llama=False if args.no_llama else None,
        **write_options(args),
    )
    print_outcome(args, report)
    return verification_status(report.output_paths, report.verification)
