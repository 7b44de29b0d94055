"""``gguf-mtp convert SOURCE -o DRAFT.gguf``."""

from __future__ import annotations

import argparse
import re

from gguf_mtp.conversion import supported_architectures
from gguf_mtp.errors import GGUFMTPError, IncompatibleDraftError, ParameterError

from .common import (
    CONVERT_HOW,
    add_embd_type_flag,
    add_llama_cpp_flag,
    add_output_flags,
    add_outtype_flag,
    print_outcome,
    write_options,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert an MTP head checkpoint (safetensors) into a GGUF draft",
        description="Convert the MTP (NextN) head of a Hugging Face checkpoint into a GGUF draft that "
        "`gguf-mtp compose` splices into the target, or with --standalone into an MTP-only model llama.cpp "
        f"loads by itself. Supported: {', '.join(supported_architectures())}.",
    )
    p.add_argument("source", metavar="SOURCE",
                   help="checkpoint folder (config.json + *.safetensors) or Hub repo id; from the Hub only "
                        "config.json, the index, and the headers and head tensors' byte ranges of the shards "
                        "holding the head are fetched")
    p.add_argument("-o", "--output", required=True, metavar="DRAFT.gguf", help="the GGUF file to write")
    p.add_argument("--target", metavar="TARGET.gguf",
                   help="the model the head belongs to (any shard of a split set): gives the block index and is "
                        "checked against the head")
    p.add_argument("--block", type=int, metavar="N", help="NextN block index when there is no --target")
    add_outtype_flag(p, "the head's matrices", CONVERT_HOW, "the source's type (FP8 as llama.cpp's --outtype auto: "
                     "BF16 for the FP8 releases)", imatrix=True)
    p.add_argument("--standalone", action="store_true",
                   help="write an MTP-only model (for llama-server --spec-draft-model): adds token_embd, output_norm, "
                        "output and the metadata of --target")
    add_embd_type_flag(p)
    p.add_argument("--drop-nextn-copies", action="store_true",
                   help="GLM-4.5: leave out the NextN layer's own embed_tokens/shared_head.head copies (about 1.5 GB "
                        "each); llama.cpp uses the trunk's")
    p.add_argument("--nextn-blocks", type=int, metavar="K",
                   help="convert only the first K NextN blocks of a checkpoint with several (default: all; "
                        "llama.cpp's glm4moe and deepseek2 MTP graphs run a file of one)")
    p.add_argument("--revision", metavar="REV", help="Hub revision (branch, tag or commit) of a repo-id SOURCE")
    p.add_argument("--download", action="store_true",
                   help="repo-id SOURCE: download the whole shards holding the head into the Hub cache (reused by "
                        "later runs) instead of fetching the head's byte ranges")
    p.add_argument("--force", action="store_true", help="replace an existing output (never an input)")
    add_llama_cpp_flag(p, "--outtype's quantizer")
    add_output_flags(p)
    p.set_defaults(run=run)


#: How the library's parameter names read on this command line (the library never names flags).
_AS_FLAGS = (
    (re.compile(r"^(block|outtype|revision) '?([^':]*)'?:"), lambda m: f"--{m[1]} {m[2]}:"),
    (re.compile(r"^embd_type needs standalone:"), lambda m: "--embd-type needs --standalone:"),
    (re.compile(r"^embd_type "), lambda m: "--embd-type "),
    (re.compile(r"^standalone needs target:"), lambda m: "--standalone needs --target:"),
    (re.compile(r"^drop_nextn_copies:"), lambda m: "--drop-nextn-copies:"),
    (re.compile(r"^nextn_blocks "), lambda m: "--nextn-blocks "),
    (re.compile(r"give target \((.*)\) or block$"), lambda m: f"give --target TARGET.gguf ({m[1]}) or --block N"),
    (re.compile(r"convert with block (\d+) instead of target"),
     lambda m: f"convert with --block {m[1]} instead of --target"),
    (re.compile(r"as target \(gguf-mtp strip\)$"), lambda m: "as --target (gguf-mtp strip)"),
)


def _in_flags(error: GGUFMTPError) -> GGUFMTPError:
    """``error`` with the parameters its message names spelled as this command's flags."""
    message = error.message
    for pattern, flag in _AS_FLAGS:
        message = pattern.sub(flag, message)
    return error if message == error.message else type(error)(message, error.path)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.jobs.convert import convert

    try:
        report = convert(
            args.source, args.output, target=args.target, block=args.block, outtype=args.outtype,
            standalone=args.standalone, embd_type=args.embd_type, drop_nextn_copies=args.drop_nextn_copies,
            nextn_blocks=args.nextn_blocks, imatrix=args.imatrix, revision=args.revision, download=args.download,
            **write_options(args),
        )
    except (ParameterError, IncompatibleDraftError) as e:
        raise _in_flags(e) from None
    print_outcome(args, report)
    return 0
