"""``gguf-mtp graft --from SOURCE --into TARGET -o OUTDIR``."""

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
        "graft",
        help="move the NextN (MTP) block of one model into another (extract + compose + verify)",
        description="Take the NextN block(s) of SOURCE and splice them into TARGET, a trunk-only model of the same "
        "architecture, trunk, width and vocabulary (e.g. a community quant that dropped its MTP layers). Nothing "
        "is re-quantized; every byte is a kernel copy; the result is verified with llama.cpp.",
    )
    p.add_argument("--from", dest="source", required=True, metavar="SOURCE", help="the model that has the NextN block")
    p.add_argument("--into", dest="target", required=True, metavar="TARGET", help="the trunk-only model to extend")
    p.add_argument("-o", "--output-dir", required=True, metavar="OUTDIR", help="folder for the composite")
    p.add_argument("--basename", metavar="NAME", help="name outputs NAME-0000k-of-0000n.gguf")
    add_outtype_flag(p, "the NextN block's tensors (a quantized source is dequantized first, as llama-quantize "
                     "--allow-requantize does; the target's bytes are copied as they are)", imatrix=True)
    add_replace_head_flag(p, "SOURCE's")
    p.add_argument("--force", action="store_true", help="replace existing outputs (never inputs)")
    add_verify_flags(p, "the composite")
    add_llama_cpp_flag(p, "--outtype's quantizer and the verification")
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.jobs.graft import graft

    report = graft(
        args.source, args.target, args.output_dir, basename=args.basename, outtype=args.outtype,
        replace_head=args.replace_head, imatrix=args.imatrix,
        verify=verify_requested(args), llama=False if args.no_llama else None, **write_options(args),
    )
    print_outcome(args, report)
    return verification_status(report.output_paths, report.verification)
