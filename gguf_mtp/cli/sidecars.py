"""``gguf-mtp sidecars MODEL -o DIR [--types T,T] [--name NAME]`` and ``gguf-mtp sidecars --pair FOLDER_OR_REPO``."""

from __future__ import annotations

import argparse

from .common import add_llama_cpp_flag, add_output_flags, print_json, print_outcome, print_report, write_options


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sidecars",
        help="write a head as the set of mtp-<Name>-<TYPE>.gguf sidecars llama-server -hf pairs with each trunk, "
        "or show which sidecar each trunk of a folder or Hub repo gets",
        description="Write the NextN block(s) of MODEL as MTP-only sidecars named as llama.cpp's converter names "
        "them (mtp-<Name>-<TYPE>.gguf, <Name> from general.basename/name, finetune and version), one per type, each "
        "as llama-quantize --pure TYPE writes it; by default ggml-org's set: the head's own float type, Q8_0 and "
        "Q4_0. With --pair, write nothing: for each trunk quant of a folder or Hub repo, show the mtp- file "
        "llama-server -hf REPO:TAG --spec-type draft-mtp picks (llama.cpp b11434's find_best_sibling).",
    )
    p.add_argument("source", nargs="?", metavar="MODEL",
                   help="a GGUF carrying NextN block(s) (a composite, a quant with a head, a sidecar), any shard")
    p.add_argument("-o", "--output", metavar="DIR", help="the folder to write into (default: here)")
    p.add_argument("--types", metavar="T,T...",
                   help="the members' types, comma-separated (e.g. bf16,q8_0,q4_0; any --outtype type). "
                   "Default: the head's own float type (if it has one), q8_0 and q4_0")
    p.add_argument("--name", metavar="NAME", help="the <Name> of mtp-<Name>-<TYPE>.gguf (default: from the model)")
    p.add_argument("--pair", metavar="FOLDER_OR_REPO",
                   help="show, for each trunk quant of this folder or Hub repo, the sidecar llama.cpp pairs it with")
    p.add_argument("--revision", metavar="REV", help="with --pair: the repo's branch, tag or commit")
    p.add_argument("--force", action="store_true", help="replace existing files of those names (never an input)")
    add_llama_cpp_flag(p, "the quantizer of the members' types")
    add_output_flags(p)
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace) -> int:
    if (args.source is None) == (args.pair is None):
        args.parser.error("give either MODEL (write a set) or --pair FOLDER_OR_REPO (show the pairing)")
    if args.pair is not None:
        if args.output or args.types or args.name or args.force or args.dry_run:
            args.parser.error("--pair writes nothing: -o, --types, --name, --force and --dry-run go with MODEL")
        return _pair(args)
    if args.revision:
        args.parser.error("--revision goes with --pair (a Hub repo's revision)")
    from gguf_mtp.jobs.sidecar_set import write_sidecar_set

    report = write_sidecar_set(args.source, args.output or ".", types=args.types, name=args.name,
                               **write_options(args))
    print_outcome(args, report)
    return 0


def _pair(args: argparse.Namespace) -> int:
    from gguf_mtp.jobs.sidecar_pairing import sidecar_pairing

    report = sidecar_pairing(args.pair, revision=args.revision)
    if args.json:
        print_json(report.to_dict())
    else:
        print_report(report.describe())
    return 0
