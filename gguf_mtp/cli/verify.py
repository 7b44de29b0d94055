"""``gguf-mtp verify COMPOSITE``."""

from __future__ import annotations

import argparse

from .common import add_llama_cpp_flag, print_json, print_report


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "verify",
        help="prove a composite (or an MTP-only draft) is right: structure, bytes against target and draft, "
        "llama.cpp load + MTP step",
        description="Check a composite GGUF: every shard present and readable, split.* right in every shard, "
        "tensors sized and placed as llama.cpp requires, per-layer arrays as long as block_count, NextN "
        "tensors present; with --target every target tensor byte-identical and the metadata unchanged "
        "except what compose changes; with --draft every draft block tensor byte-identical; and llama.cpp "
        "loads the composite and runs an MTP decode step through each NextN block. An MTP-only file (a "
        "--standalone sidecar, or a draft for compose) is checked as a draft: structure, NextN blocks, its "
        "token_embd/output_norm/output, with --target its fit to that model (width, shapes, vocabulary), and "
        "llama.cpp loads a sidecar as a drafter and runs its MTP steps. Exit status 0 only when no check fails.",
    )
    p.add_argument("composite", help="the composite GGUF, or any shard of its split set, or an MTP-only draft")
    p.add_argument(
        "--target",
        help="the target it was composed from (compare every tensor and KV); for a draft, the model it runs beside",
    )
    p.add_argument("--draft", help="the MTP draft it was composed from (compare every block tensor)")
    llama = p.add_mutually_exclusive_group()
    llama.add_argument(
        "--llama", dest="llama", action="store_const", const=True, default=None,
        help="require the llama.cpp check (fail when llama-cpp-python is missing; default: run it when installed)",
    )
    llama.add_argument("--no-llama", dest="llama", action="store_const", const=False, help="skip the llama.cpp check")
    p.add_argument(
        "--allow-kv", action="append", default=[], metavar="KEY",
        help="a key the composite may change or add besides those compose manages (e.g. a --set-kv key); repeatable",
    )
    p.add_argument(
        "--acceptance", action="store_true",
        help="also predict the head's acceptance at n-max 1 on the built-in prompts (gguf-mtp accept) and fail "
        "below --floor: a head that loads but predicts nothing fails (a sidecar: give its model as --target)",
    )
    p.add_argument("--floor", type=float, default=None, metavar="F",
                   help="the lowest acceptance --acceptance passes, from 0 to 1 (default: 0.10)")
    add_llama_cpp_flag(p, "the llama.cpp check (its load and MTP decode steps)")
    p.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def _bench_command(args: argparse.Namespace, kind: str) -> str | None:
    """The ``gguf-mtp bench`` command for what was verified: the composite, or a sidecar beside its target; None
    when bench would refuse the model (no tokenizer: llama-server cannot tokenize prompts)."""
    import shlex

    from gguf_mtp.hub.remote import is_hub_path
    from gguf_mtp.llama_build import chosen
    from gguf_mtp.model.drafting import tokenizer_refusal
    from gguf_mtp.model.shards import open_model

    model_path = args.target if kind == "mtp-draft" else args.composite
    if model_path is not None and not is_hub_path(model_path) and tokenizer_refusal(open_model(model_path)):
        return None
    if kind == "mtp-draft":
        model = f"{shlex.quote(args.target) if args.target else 'TARGET.gguf'} --draft {shlex.quote(args.composite)}"
    else:
        model = shlex.quote(args.composite)
    build = chosen()
    server = f"--llama-cpp {shlex.quote(str(build.folder))}" if build is not None and build.server is not None \
        else "--server PATH/TO/llama-server"
    return f"gguf-mtp bench {model} {server}"


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.check.acceptance_floor import DEFAULT_FLOOR
    from gguf_mtp.check.verify import verify
    from gguf_mtp.errors import ParameterError

    if args.floor is not None and not args.acceptance:
        raise ParameterError("floor: give it with --acceptance", parameter="floor")
    report = verify(
        args.composite, target=args.target, draft=args.draft, llama=args.llama,
        progress=not (args.quiet or args.json), allow_kv=args.allow_kv, acceptance=args.acceptance,
        floor=DEFAULT_FLOOR if args.floor is None else args.floor,
    )
    if args.json:
        print_json(report.to_dict())
    else:
        lines = report.describe()
        command = _bench_command(args, report.kind) if report.ok else None
        if command and (report.kind != "mtp-draft" or report.sidecar):  # a bare draft runs only in a composite
            # before the verdict, which stays the last line
            lines.insert(-1, f"measure what MTP gains on your machine: {command}")
        print_report(lines)
    return 0 if report.ok else 2

