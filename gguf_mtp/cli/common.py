"""Helpers shared by the subcommand modules: the flags every writer takes and the two ways out (text, JSON).

Everything a command prints goes through :func:`print_report` or :func:`print_json`, which escape the
names inside (see :mod:`gguf_mtp.text`): a name read from a file can hold any byte.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypedDict

from gguf_mtp.text import human_bytes, json_safe, printable, short

if TYPE_CHECKING:
    from gguf_mtp.jobs.runner import WriteReport
    from gguf_mtp.model.drafting import RequestSampling

__all__ = [
    "CONVERT_HOW",
    "QUANTIZE_HOW",
    "add_embd_type_flag",
    "add_llama_cpp_flag",
    "add_output_flags",
    "add_outtype_flag",
    "add_replace_head_flag",
    "add_sampling_flags",
    "error_object",
    "human_bytes",
    "plan_printer",
    "print_json",
    "print_outcome",
    "print_report",
    "request_sampling",
    "short",
    "write_options",
]


def add_output_flags(parser: argparse.ArgumentParser, *, dry_run: bool = True) -> None:
    """``--json``, ``--quiet`` and (optionally) ``--dry-run``."""
    parser.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    if dry_run:
        parser.add_argument("--dry-run", action="store_true", help="show the plan, write nothing")


def _outtype_name(value: str, imatrix: bool | None = None) -> str:
    """An ``--outtype`` value in lower case, or argparse's one-line refusal saying why (an importance-matrix type
    where the command takes no ``--imatrix``: where it does, the command says whether one was given)."""
    from gguf_mtp.constants import OUTTYPE_NAMES

    name = value.strip().lower()
    if name in OUTTYPE_NAMES:
        return name
    from gguf_mtp.format.quant_rules import head_type

    try:
        head_type(name, imatrix=imatrix)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


#: How ``--outtype`` writes a GGUF's tensors (compose, graft, extract).
QUANTIZE_HOW = ("exactly as llama-quantize --pure would (norms, routers and 1-D tensors keep their type; rows that "
                "do not fit TYPE's blocks take its fallback)")
#: How ``--outtype`` writes a checkpoint's tensors (convert, pipeline): the converter's types its way, the rest
#: llama-quantize's way from the converter's default output.
CONVERT_HOW = ("exactly as llama.cpp's converter writes f32, f16, bf16 and q8_0, and as llama-quantize --pure writes "
               "the converter's default output in the other types (norms, biases and the router stay F32; rows that "
               "do not fit TYPE's blocks take its fallback)")


def add_outtype_flag(parser: argparse.ArgumentParser, what: str = "the NextN block's tensors", how: str = QUANTIZE_HOW,
                     default: str = "unchanged, byte for byte", *, imatrix: bool = False) -> None:
    """``--outtype TYPE``: the head's type, any of llama-quantize's uniform types (any case); the help is one
    sentence: write ``what`` in TYPE, ``how``. With ``imatrix``, also ``--imatrix FILE`` (the importance matrix the
    head is quantized with), and TYPE may be one that needs it: the command says whether one was given."""
    from gguf_mtp.constants import OUTTYPE_NAMES

    parser.add_argument(
        "--outtype", type=functools.partial(_outtype_name, imatrix=True if imatrix else None), metavar="TYPE",
        help=f"write {what} in TYPE, {how}; one of {', '.join(OUTTYPE_NAMES)}. Below q4_k a head drafts worse. "
        f"Default: {default}",
    )
    if imatrix:
        from gguf_mtp.format.quant_rules import IMATRIX_TYPES

        parser.add_argument(
            "--imatrix", metavar="FILE",
            help="quantize the head with this importance matrix, as llama-quantize --imatrix FILE does: a GGUF "
            "imatrix with NextN statistics (llama-imatrix --nextn, or --model-draft DRAFT.gguf; llama.cpp b11434 or "
            f"later). It also lets --outtype be {', '.join(sorted(IMATRIX_TYPES))}",
        )


def _embd_type_name(value: str) -> str:
    """An ``--embd-type`` value in lower case, or argparse's one-line refusal saying why."""
    from gguf_mtp.format.quant_rules import embedding_type

    try:
        embedding_type(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value.strip().lower()


def add_embd_type_flag(parser: argparse.ArgumentParser) -> None:
    """``--embd-type TYPE``: a standalone sidecar's ``token_embd`` and ``output`` in TYPE."""
    from gguf_mtp.constants import OUTTYPE_NAMES

    parser.add_argument(
        "--embd-type", type=_embd_type_name, metavar="TYPE",
        help="with --standalone: write token_embd and output in TYPE, exactly as llama-quantize "
        "--token-embedding-type TYPE --output-tensor-type TYPE would (q4_0 is what llama.cpp's maintainers "
        f"recommend for a sidecar); one of {', '.join(OUTTYPE_NAMES)}. Default: unchanged, byte for byte",
    )


def add_replace_head_flag(parser: argparse.ArgumentParser, whose: str) -> None:
    """``--replace-head``: the target's own NextN block(s) give way to the new ones, in one pass."""
    parser.add_argument(
        "--replace-head", action="store_true",
        help=f"the target already has NextN block(s) (e.g. a low-type head a quantizer shipped): drop them and put "
        f"{whose} in their place, in one copy; the same files as gguf-mtp strip followed by this command",
    )


def add_llama_cpp_flag(parser: argparse.ArgumentParser, uses: str) -> None:
    """``--llama-cpp PATH``: the llama.cpp build the command ``uses`` (:mod:`gguf_mtp.llama_build`)."""
    from gguf_mtp.constants import ENV_LLAMA_CPP

    parser.add_argument(
        "--llama-cpp", dest="llama_cpp", metavar="PATH",
        help=f"the llama.cpp build folder to use for {uses}: its libllama.so with the libggml*.so beside it (in "
        f"PATH, PATH/lib, PATH/bin or PATH/build/bin) and its tools (default: ${ENV_LLAMA_CPP}, else the llama.cpp "
        "llama-cpp-python ships)",
    )


def add_prompt_flags(parser: argparse.ArgumentParser, *, draft_help: str, tokens_help: str, n_max_help: str) -> None:
    """MODEL, ``--draft``, ``--prompts``, ``--tokens`` and ``--n-max``: what ``bench`` measures with llama-server and
    ``accept`` predicts without one, with the same defaults (:data:`~gguf_mtp.constants.DEFAULT_TOKENS`,
    :data:`~gguf_mtp.constants.DEFAULT_N_MAX`)."""
    from gguf_mtp.constants import DEFAULT_N_MAX, DEFAULT_TOKENS

    parser.add_argument("model", help="the composite GGUF (any shard), or the trunk when --draft names an MTP-only "
                        "sidecar")
    parser.add_argument("--draft", metavar="SIDECAR",
                        help=f"an MTP-only GGUF (convert/extract --standalone), {draft_help}")
    parser.add_argument("--prompts", metavar="FILE", help="prompts: a JSON list of strings, or text with prompts "
                        "separated by '---' lines (default: the built-in code, prose and chat prompts)")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, metavar="N",
                        help=f"tokens generated per prompt{tokens_help} (default: {DEFAULT_TOKENS})")
    n_max = ",".join(str(k) for k in DEFAULT_N_MAX)
    parser.add_argument("--n-max", dest="n_max", default=n_max, metavar="K,K...",
                        help=f"draft lengths to {n_max_help}, llama-server's --spec-draft-n-max (default: {n_max})")


def add_sampling_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--spec-draft-sampling``, ``--temp``, ``--top-k``, ``--top-p``, ``--min-p``, ``--seed``: llama-server's own
    names for how the draft is sampled and how the requests sample (read back by :func:`request_sampling`)."""
    parser.add_argument("--spec-draft-sampling", dest="spec_draft_sampling", choices=("greedy", "probabilistic"),
                        default="greedy", help=f"as llama-server's: greedy requests, or probabilistic: sampled "
                        f"requests whose drafts the server samples and verifies by rejection (llama.cpp b11434 or "
                        f"later); {what}")
    parser.add_argument("--temp", type=float, metavar="T", help="probabilistic: the requests' temperature (above 0)")
    parser.add_argument("--top-k", dest="top_k", type=int, default=40, metavar="N",
                        help="probabilistic: the requests' top_k (default: llama-server's 40)")
    parser.add_argument("--top-p", dest="top_p", type=float, default=0.95, metavar="P",
                        help="probabilistic: the requests' top_p (default: llama-server's 0.95)")
    parser.add_argument("--min-p", dest="min_p", type=float, default=0.05, metavar="P",
                        help="probabilistic: the requests' min_p (default: llama-server's 0.05)")
    parser.add_argument("--seed", type=int, metavar="S", help="probabilistic: the requests' seed (default: 42)")


def request_sampling(args: argparse.Namespace) -> RequestSampling | None:
    """The requests' sampling :func:`add_sampling_flags` read, checked; ``None`` for greedy requests.

    Raises:
        ParameterError: ``--temp`` missing in probabilistic mode or given in greedy mode, or a bad value.
    """
    from gguf_mtp.errors import ParameterError
    from gguf_mtp.model.drafting import SEED, RequestSampling

    if args.spec_draft_sampling == "greedy":
        if args.temp is not None:
            raise ParameterError("temp: greedy drafting is measured with greedy requests; give "
                                 "--spec-draft-sampling probabilistic with --temp", parameter="temp")
        return None
    if args.temp is None:
        raise ParameterError("spec-draft-sampling probabilistic needs the requests' --temp", parameter="temp")
    sampling = RequestSampling(args.temp, seed=SEED if args.seed is None else args.seed, top_k=args.top_k,
                               top_p=args.top_p, min_p=args.min_p)
    sampling.check()
    return sampling


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout: valid UTF-8 JSON whatever bytes the names inside hold."""
    json.dump(json_safe(data), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")
    sys.stdout.flush()


def print_report(lines: Iterable[str]) -> None:
    """The human-readable report, one line per item, each item escaped to stay one printable line."""
    print("\n".join(printable(line) for line in lines))


def say(line: str) -> None:
    """One progress line on stderr, at once (a long run shows where it is)."""
    print(printable(line), file=sys.stderr, flush=True)


def warn(line: str) -> None:
    """One warning line on stderr (``-q`` silences progress, never this)."""
    print(f"gguf-mtp: warning: {printable(line)}", file=sys.stderr, flush=True)


def error_object(message: str, path: str | None, exit_status: int) -> dict[str, Any]:
    """The ``--json`` answer of a failed command: ``{"error": ..., "path": ..., "exit_status": ...}``."""
    return {"error": message, "path": path, "exit_status": exit_status}


def plan_printer(args: argparse.Namespace) -> Callable[[WriteReport], None] | None:
    """What a writing command passes as ``on_plan``: print the plan before the first byte is written (so a
    long run shows it at once, not after the copy), or nothing with ``--json`` (one document at the end)."""
    if args.json:
        return None

    def show(report: WriteReport) -> None:
        print_report(report.plan_lines())
        sys.stdout.flush()  # before the writing starts, also when stdout is a pipe or a file

    return show


class WriteOptions(TypedDict):
    """The library arguments every writing command (compose, convert, extract, strip, graft) takes from its flags."""

    dry_run: bool
    force: bool
    progress: bool
    on_plan: Callable[[WriteReport], None] | None


def write_options(args: argparse.Namespace) -> WriteOptions:
    """``--dry-run``, ``--force``, ``--quiet``/``--json`` (no progress bar) and the plan printed before writing,
    as the keyword arguments of a writing job (``compose(..., **write_options(args))``)."""
    return {
        "dry_run": args.dry_run,
        "force": args.force,
        "progress": not (args.quiet or args.json),
        "on_plan": plan_printer(args),
    }


def print_outcome(args: argparse.Namespace, report: WriteReport) -> None:
    """The end of a writing command's report: the ``--json`` document, or the lines after the plan."""
    if args.json:
        print_json(report.to_dict())
    else:
        print_report(report.outcome_lines())
