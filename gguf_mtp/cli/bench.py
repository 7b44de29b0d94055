"""``gguf-mtp bench MODEL --server llama-server [-- SERVER ARGS]``."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from gguf_mtp.check.accept import AcceptReport, SampledReport
    from gguf_mtp.server.bench_rules import BenchReport


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gguf_mtp.constants import DEFAULT_HEALTH_TIMEOUT

    p = subparsers.add_parser(
        "bench",
        usage="gguf-mtp bench MODEL [--draft SIDECAR] [--server PATH] [--n-max K,K...] [--tokens N] "
        "[--prompts FILE] [--plot FILE.png] [--with-accept] [--spec-draft-sampling probabilistic --temp T "
        "[--seed S]] [--json] [-- SERVER ARGS...]",
        help="measure MTP with your own llama-server: acceptance, tokens/s, speed-up, the best n-max, lossless",
        description="Run your llama-server on 127.0.0.1 once without speculative decoding and once per n-max with "
        "--spec-type draft-mtp, send the same prompts greedily, and report acceptance (draft_n_accepted / draft_n), "
        "tokens/s, the speed-up and the recommended n-max. The greedy text with MTP must equal the text without "
        "it (exit status 2 when not). Arguments after -- go to every llama-server run (-ngl 99, -c 8192, -t 8...); "
        "without -t, the trunk's and the MTP head's thread pools get half the free cores each. "
        "The server is always stopped; its log is kept when something fails.",
    )
    add_prompt_flags(p, draft_help="given to llama-server as --spec-draft-model", tokens_help="",
                     n_max_help="measure")
    p.add_argument("--server", metavar="PATH",
                   help="your llama-server binary (default: --llama-cpp's, else llama-server on PATH)")
    p.add_argument("--health-timeout", dest="health_timeout", type=float, default=DEFAULT_HEALTH_TIMEOUT,
                   metavar="SECONDS",
                   help=f"how long one server may take to load the model and answer /health, in seconds "
                        f"(default: {DEFAULT_HEALTH_TIMEOUT:g})")
    p.add_argument("--plot", metavar="FILE.png", help="draw tokens/s and acceptance against n-max (needs the "
                   "bench extra: matplotlib)")
    p.add_argument("--force", action="store_true", help="replace an existing --plot file")
    p.add_argument("--with-accept", dest="with_accept", action="store_true",
                   help="also predict the counts with gguf-mtp accept (llama-cpp-python, no server) and show the "
                   "prediction beside the measurement")
    add_sampling_flags(p, "probabilistic sends sampled requests and compares --with-accept's interval")
    add_llama_cpp_flag(p, "llama-server (its bin/llama-server, unless --server names one) and --with-accept")
    p.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines (warnings and errors still)")
    p.set_defaults(run=run, server_args=[])  # what follows -- (see gguf_mtp.cli._parse)


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.errors import LlamaServerError
    from gguf_mtp.model.prompts import load_prompts
    from gguf_mtp.server.bench import bench
    from gguf_mtp.server.bench_rules import parse_n_max_list
    from gguf_mtp.text import printable
    from gguf_mtp.write import signals_as_interrupt

    server = _server(args.server)
    n_max = parse_n_max_list(args.n_max)
    prompts = load_prompts(args.prompts) if args.prompts else None
    if args.plot:
        from gguf_mtp.server.bench_plot import check_plot_target

        check_plot_target(args.plot, force=args.force)

    sampling = request_sampling(args)
    predicted: AcceptReport | SampledReport | None = None
    if args.with_accept:  # first: seconds, and a missing llama-cpp-python is said before any server runs
        from gguf_mtp.check.accept import accept, accept_sampled
        from gguf_mtp.check.accept_sampling import Sampling

        if not args.quiet:
            say("predicting the counts with gguf-mtp accept (llama-cpp-python, no server)")
        same = {"draft": args.draft, "prompts": prompts, "tokens": args.tokens, "n_max": n_max,
                "ctx_size": _server_value(args.server_args, ("-c", "--ctx-size")),
                "threads": _server_value(args.server_args, ("-t", "--threads"))}
        with signals_as_interrupt():
            predicted = accept(args.model, **same) if sampling is None else \
                accept_sampled(args.model, Sampling(**dataclasses.asdict(sampling)), **same)
    try:
        with signals_as_interrupt():  # SIGTERM stops the server too, as Ctrl-C does
            report = bench(
                args.model, server, draft=args.draft, n_max=n_max, tokens=args.tokens, prompts=prompts,
                server_args=args.server_args, health_timeout=args.health_timeout,
                progress=None if args.quiet else say, warn=warn, sampling=sampling,
            )
    except LlamaServerError as e:
        if e.log_tail:
            print("llama-server log (last lines):", file=sys.stderr)
            print("\n".join("  " + printable(line) for line in e.log_tail), file=sys.stderr)
        raise
    if args.plot:
        from gguf_mtp.server.bench_plot import write_plot

        write_plot(report, args.plot, force=args.force)
    if args.json:
        print_json(report.to_dict() | ({"accept": predicted.to_dict()} if predicted is not None else {}))
    else:
        print_report(report.describe() + (_beside(report, predicted) if predicted is not None else []))
    if not report.lossless:
        first = report.differences[0]
        print(f"gguf-mtp: error: {printable(report.model)}: not lossless: {printable(first.describe())}; greedy "
              "output with MTP must equal the output without it", file=sys.stderr)
        return 2
    return 0


def _server(given: str | None) -> str:
    """The llama-server bench runs: ``--server``, else the chosen llama.cpp build's, else the one on PATH.

    Raises:
        ParameterError: none of them (one line saying how to get one).
    """
    from gguf_mtp.errors import ParameterError
    from gguf_mtp.llama_build import chosen
    from gguf_mtp.llama_server import BUILD_HINT

    if given:
        return given
    build = chosen()
    if build is not None:
        if build.server is None:
            raise ParameterError(f"llama_cpp: no llama-server in its bin or build/bin; give --server ({BUILD_HINT})",
                                 build.folder, "llama_cpp")
        return str(build.server)
    found = shutil.which("llama-server")
    if found is None:
        raise ParameterError(f"server: no llama-server on PATH; give your build's binary ({BUILD_HINT})",
                             parameter="server")
    return found


def _server_value(server_args: list[str], flags: tuple[str, ...]) -> int | None:
    """The positive number given to llama-server with one of ``flags`` (``-c 1024``, ``-t=4``), if any: accept
    then predicts for the same slot context and runs on as many threads. Given twice, the last one counts, as
    llama.cpp's parser keeps the last value."""
    from gguf_mtp.server.options import option_name

    found: int | None = None
    for i, arg in enumerate(server_args):
        _, _, value = arg.partition("=")
        if option_name(arg) in flags:
            value = value or (server_args[i + 1] if i + 1 < len(server_args) else "")
            found = int(value) if value.isdigit() and int(value) > 0 else None
    return found


def _beside(report: BenchReport, predicted: AcceptReport | SampledReport) -> list[str]:
    """accept's prediction beside bench's measurement, per n-max: the counts (greedy), or the measured acceptance
    against the predicted interval (probabilistic)."""
    from gguf_mtp.check.accept import SampledReport

    if isinstance(predicted, SampledReport):
        return _beside_sampled(report, predicted)
    lines = ["measured by llama-server vs predicted by gguf-mtp accept (draft_n_accepted/draft_n):"]
    for run, guess in zip((r for r in report.runs if r.n_max), predicted.runs, strict=True):
        same = (run.draft_n, run.draft_n_accepted) == (guess.draft_n, guess.draft_n_accepted)
        lines.append(f"  n-max {run.n_max}: measured {run.draft_n_accepted}/{run.draft_n}, predicted "
                     f"{guess.draft_n_accepted}/{guess.draft_n}" + (" (equal)" if same else ""))
    return lines


def _beside_sampled(report: BenchReport, predicted: SampledReport) -> list[str]:
    from gguf_mtp.check.accept_sampling import CONFIDENCE

    lines = ["measured by llama-server vs predicted by gguf-mtp accept (acceptance, sampled requests; the interval "
             f"holds one run with {CONFIDENCE:.1%} confidence):"]
    for run, guess in zip((r for r in report.runs if r.n_max), predicted.runs, strict=True):
        if run.acceptance is None or guess.interval is None or guess.acceptance_mean is None:
            lines.append(f"  n-max {run.n_max}: nothing drafted")
            continue
        verdict = "inside" if guess.holds(run.acceptance) else "OUTSIDE"
        lines.append(f"  n-max {run.n_max}: measured {run.acceptance:.3f} ({run.draft_n_accepted}/{run.draft_n}), "
                     f"predicted {guess.acceptance_mean:.3f} in [{guess.interval[0]:.3f}, {guess.interval[1]:.3f}]: "
                     f"{verdict}")
    return lines
