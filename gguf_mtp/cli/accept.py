"""``gguf-mtp accept MODEL [--draft SIDECAR]``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import (
    add_llama_cpp_flag,
    add_prompt_flags,
    add_sampling_flags,
    print_json,
    print_report,
    request_sampling,
    say,
    warn,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "accept",
        usage="gguf-mtp accept MODEL [--draft SIDECAR] [--prompts FILE] [--tokens N] [--n-max K,K...] [--text] "
        "[--ctx-size N] [--threads N] [--n-gpu-layers N] [--outtypes T,T...] "
        "[--spec-draft-sampling probabilistic --temp T [--seed S]] [--llama-cpp PATH] [--json] [-q]",
        help="predict llama-server's MTP acceptance (draft_n, draft_n_accepted) in seconds, without a server",
        description="Run the trunk and the MTP head with llama.cpp (llama-cpp-python, in a child process): the "
        "trunk's greedy continuation of each prompt, one batched trunk pass and one batched MTP pass over it, the "
        "head's draft chains as llama.cpp's draft-mtp makes them, and llama-server's schedule replayed over them. "
        "Prints the draft_n and draft_n_accepted llama-server would report for the same greedy requests, per prompt "
        "and n-max, the acceptance per draft position, a speed-up estimate and the recommended n-max. With --text "
        "the prompts are scored as they are (teacher forcing: an estimate, not a server prediction). "
        "gguf-mtp bench measures the real tokens/s with your llama-server.",
    )
    add_prompt_flags(p, draft_help="as given to llama-server with --spec-draft-model",
                     tokens_help=", llama-server's n_predict", n_max_help="predict")
    p.add_argument("--text", action="store_true", help="score the prompts as given text (teacher forcing: how often "
                   "the head's first draft equals the trunk's own next token; an estimate)")
    p.add_argument("--ctx-size", dest="ctx_size", type=int, metavar="N", help="the server slot's context, "
                   "llama-server's -c (default: the model's training context)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads of each of llama.cpp's two pools, the "
                   "trunk's and the head's (default: half the free cores each, at least 1, as bench gives "
                   "llama-server; more are warned of: on a busy machine they run many times slower)")
    p.add_argument("--n-gpu-layers", dest="n_gpu_layers", type=int, default=0, metavar="N",
                   help="layers to offload to a GPU (a GPU build of llama-cpp-python; default: 0)")
    p.add_argument("--outtypes", metavar="TYPE,TYPE...", help="re-type the head to each type (as --outtype does, "
                   "into a temporary sidecar) and report its bytes and predicted acceptance, recommending the "
                   "smallest type within 0.01 of the best (e.g. q8_0,q6_k,q4_k,q3_k)")
    add_sampling_flags(p, "probabilistic predicts an expectation and the interval one server run falls in")
    p.add_argument("--draws", type=int, default=8, metavar="N",
                   help="probabilistic: texts sampled per prompt (default: 8; the prediction's own sampling is seeded "
                   "by --seed)")
    add_llama_cpp_flag(p, "the prediction")
    p.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines (warnings and errors still)")
    p.set_defaults(run=run)


def _sampling(args: argparse.Namespace) -> Any:
    """The probabilistic mode's :class:`~gguf_mtp.check.accept_sampling.Sampling`, or ``None`` in greedy mode."""
    import dataclasses

    from gguf_mtp.errors import ParameterError

    requests = request_sampling(args)
    if requests is None:
        return None
    from gguf_mtp.check.accept_sampling import Sampling  # with numpy, which greedy's process does without

    if args.text or args.outtypes is not None:
        raise ParameterError("spec-draft-sampling probabilistic predicts server runs; it takes neither --text nor "
                             "--outtypes", parameter="spec_draft_sampling")
    sampling = Sampling(**dataclasses.asdict(requests), draws=args.draws)
    sampling.check()
    return sampling


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.check.accept import accept
    from gguf_mtp.errors import LlamaCppError, ParameterError
    from gguf_mtp.model.prompts import load_prompts
    from gguf_mtp.server.bench_rules import parse_n_max_list
    from gguf_mtp.text import printable
    from gguf_mtp.write import signals_as_interrupt

    n_max = parse_n_max_list(args.n_max)
    prompts = load_prompts(args.prompts) if args.prompts else None
    options = {"prompts": prompts, "tokens": args.tokens, "n_max": n_max, "ctx_size": args.ctx_size,
               "threads": args.threads, "n_gpu_layers": args.n_gpu_layers,
               "progress": None if args.quiet else say, "warn": warn}
    if args.outtypes is not None and args.text:
        raise ParameterError("outtypes: the type sweep predicts server counts; it does not take --text",
                             parameter="outtypes")
    sampling = _sampling(args)
    report: Any
    try:
        with signals_as_interrupt():  # SIGTERM stops the llama.cpp child too, as Ctrl-C does
            if sampling is not None:
                from gguf_mtp.check.accept import accept_sampled

                report = accept_sampled(args.model, sampling, draft=args.draft, **options)
            elif args.outtypes is not None:
                from gguf_mtp.jobs.accept_sweep import sweep_head_types

                outtypes = [t.strip() for t in args.outtypes.split(",") if t.strip()]
                report = sweep_head_types(args.model, outtypes, draft=args.draft, **options)
            else:
                report = accept(args.model, draft=args.draft, text=args.text, **options)
    except LlamaCppError as e:
        if e.log_tail:
            print("llama.cpp log (last lines):", file=sys.stderr)
            print("\n".join("  " + printable(line) for line in e.log_tail), file=sys.stderr)
        raise
    if args.json:
        print_json(report.to_dict())
    else:
        print_report(report.describe())
    return 0
