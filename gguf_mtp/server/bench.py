"""``gguf-mtp bench``: does the MTP head make generation faster with the user's own llama-server, and at
which n-max? The model's metadata is checked first (a NextN block or an MTP-only ``draft``, a tokenizer, room
in the context); then llama-server runs once without speculative decoding and once per n-max with
``--spec-type draft-mtp``, answering the same prompts greedily; the rules that read its answers are in
:mod:`gguf_mtp.server.bench_rules`, the process handling in :mod:`gguf_mtp.server.process`; the model check, the
request bounds and the prompts it shares with ``accept`` in :mod:`gguf_mtp.model.drafting` and
:mod:`gguf_mtp.model.prompts`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gguf_mtp.constants import free_cores
from gguf_mtp.errors import LlamaServerError, ParameterError
from gguf_mtp.llama_server import SPEC_DRAFT_SAMPLING, probe_server, server_build
from gguf_mtp.model.drafting import (
    BenchModel,
    RequestSampling,
    Threads,
    check_count_options,
    check_model,
    check_n_max,
)
from gguf_mtp.model.prompts import Prompt, builtin_prompts

from .bench_rules import (
    DEFAULT_HEALTH_TIMEOUT,
    DEFAULT_N_MAX,
    DEFAULT_TOKENS,
    BenchReport,
    BenchRun,
    Completion,
    PositionCounts,
    check_float_options,
    completion_request,
    first_difference,
    parse_completion,
    parse_metrics,
    server_arguments,
)
from .options import ServerOptions, check_extra_arguments, choose_threads
from .process import ServerHandle, free_port, running_server

__all__ = ["DEFAULT_N_MAX", "DEFAULT_TOKENS", "bench"]

#: Seconds one whole ``/completion`` answer may take (a big model on CPU is slow; a dead server is noticed sooner).
REQUEST_TIMEOUT = 3600.0
#: Seconds one whole answer of ``/props``, ``/tokenize`` or ``/metrics`` may take.
SMALL_REQUEST_TIMEOUT = 60.0


def _check_context(handle: ServerHandle, prompts: Sequence[Prompt], tokens: int, n_max: int, model: str) -> None:
    """Prompt + tokens + n-max must fit the server's context per slot (capped by llama-server at the
    training context): near the end an MTP run stops a few tokens early, which would read as a difference."""
    props = handle.get_json("/props", timeout=SMALL_REQUEST_TIMEOUT)
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        return  # an older server without the field: the per-run token counts still show a short run
    for prompt in prompts:
        answer = handle.post_json("/tokenize", {"content": prompt.text, "add_special": True},
                                  timeout=SMALL_REQUEST_TIMEOUT)
        ids = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(ids, list):
            raise handle.failure("/tokenize answered without tokens")
        need = len(ids) + tokens + n_max + 1
        if need > n_ctx:
            raise ParameterError(
                f"tokens {tokens} + n-max {n_max} + {prompt.name} ({len(ids)} prompt tokens) need a context of "
                f"{need}, the server has {n_ctx} per slot: generate fewer, or raise -c after --",
                model,
                "tokens",
            )


def _measure(handle: ServerHandle, prompts: Sequence[Prompt], tokens: int,
             say: Callable[[str], None], step: str, sampling: RequestSampling | None) -> tuple[Completion, ...]:
    answers = []
    for j, prompt in enumerate(prompts, 1):
        answer = handle.post_json("/completion", completion_request(prompt.text, tokens, sampling),
                                  timeout=REQUEST_TIMEOUT)
        try:
            completion = parse_completion(answer)
        except LlamaServerError as e:
            raise handle.failure(e.message) from None
        answers.append(completion)
        run = BenchRun(0, (completion,))
        drafted = "" if not completion.draft_n else \
            f", {completion.draft_n_accepted}/{completion.draft_n} drafted tokens accepted"
        say(f"{step}: prompt {j}/{len(prompts)} ({prompt.name}): {completion.predicted_n} tokens in "
            f"{completion.predicted_ms / 1000:.2f} s ({run.predicted_per_second:.1f} tokens/s){drafted}")
    return tuple(answers)


def _positions(handle: ServerHandle) -> PositionCounts | None:
    """Acceptance by draft position from ``/metrics``, when the server serves it."""
    data = handle.get_text("/metrics", timeout=SMALL_REQUEST_TIMEOUT)
    if data is None:
        return None
    try:
        return parse_metrics(data)
    except LlamaServerError as e:
        raise handle.failure(e.message) from None


def bench(
    model: str | os.PathLike[str],
    server: str,
    *,
    draft: str | os.PathLike[str] | None = None,
    n_max: Sequence[int] = DEFAULT_N_MAX,
    tokens: int = DEFAULT_TOKENS,
    prompts: Sequence[Prompt] | None = None,
    server_args: Sequence[str] = (),
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT,
    progress: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    sampling: RequestSampling | None = None,
) -> BenchReport:
    """Measure ``model`` with ``server`` (the user's llama-server): once without MTP, once per ``n_max``.

    Args:
        model: the composite (any shard), or the trunk when ``draft`` is given.
        server: the llama-server binary.
        draft: an MTP-only sidecar (``convert/extract --standalone``), passed as ``--spec-draft-model``.
        n_max: the draft lengths to measure (``--spec-draft-n-max``).
        tokens: tokens generated per prompt.
        prompts: the prompts (default: :func:`builtin_prompts`).
        server_args: more llama-server arguments, for every run (``-ngl 99``, ``-c 8192``, ``-t 8``...).
        health_timeout: seconds a server may take to load the model and answer ``/health``.
        progress: called with one line per step (each server started, each prompt answered, each run).
        warn: called with a warning (the thread pools of an MTP run oversubscribe the free cores).
        sampling: sampled requests, the MTP runs with ``--spec-draft-sampling probabilistic`` (the server samples
            the draft and verifies it by rejection); ``None``: greedy requests. Sampled texts differ with and
            without MTP, so the lossless check is not made (the report says so).

    Raises:
        LlamaServerError: the server is not llama-server, too old, never ready, or failed (the log is kept).
        NoNextNBlockError, ParameterError, BadGGUFError: the inputs cannot be benchmarked (before any server
            starts; ``server_args`` may not set what bench sets, under any spelling the server's ``--help`` gives).

    Without a thread count in ``server_args``, each of the two thread pools of an MTP run (the trunk's, the
    head's) gets half the free cores, in every run (:func:`gguf_mtp.server.options.choose_threads`).
    """
    began = time.monotonic()
    info = _check_request(model, draft, n_max, tokens, health_timeout, sampling)
    prompts = tuple(prompts) if prompts is not None else builtin_prompts()
    options = _server_options(server, server_args, sampling)
    say = progress or (lambda line: None)
    threads = _threads(server_args, options, info, say, warn)
    session = _Session(server, info, options, threads, prompts, tokens, max(n_max), tuple(server_args),
                       health_timeout, options.server_environment(os.environ), say, sampling)
    configurations = (0, *n_max)
    runs = [_run(session, i, len(configurations), k) for i, k in enumerate(configurations, 1)]
    baseline = runs[0]
    differences = () if sampling is not None else \
        tuple(d for run in runs[1:] if (d := first_difference(baseline, run)) is not None)
    return BenchReport(
        model=info.path, draft=info.draft, server=server, prompts=len(prompts), tokens=tokens, runs=tuple(runs),
        differences=differences, seconds=time.monotonic() - began, server_args=tuple(server_args),
        threads=threads.arguments + threads.draft_arguments, llama_cpp_build=server_build(server), sampling=sampling,
    )


def _check_request(model: str | os.PathLike[str], draft: str | os.PathLike[str] | None, n_max: Sequence[int],
                   tokens: int, health_timeout: float, sampling: RequestSampling | None) -> BenchModel:
    """Every check of bench's own arguments and of the model, before any server starts."""
    check_count_options(tokens=tokens)
    check_n_max(n_max)
    check_float_options(health_timeout=health_timeout)
    info = check_model(model, draft)
    if info.context_length is not None and tokens + max(n_max) + 1 > info.context_length:
        raise ParameterError(
            f"tokens {tokens} + n-max {max(n_max)} do not fit the model's context of {info.context_length} tokens",
            info.path, "tokens",
        )
    if sampling is not None:
        sampling.check()
    return info


def _server_options(server: str, server_args: Sequence[str], sampling: RequestSampling | None) -> ServerOptions:
    """The server's options from its ``--help``, refusing one that cannot do what was asked and extra arguments
    that set what bench sets (before any server starts)."""
    options = ServerOptions.from_help(probe_server(server))
    if sampling is not None and not options.probabilistic:
        raise LlamaServerError(f"its --help has no '{SPEC_DRAFT_SAMPLING} probabilistic' (llama.cpp b11434 or later "
                               "has it)", server, "server")
    check_extra_arguments(server_args, options)
    return options


def _threads(server_args: Sequence[str], options: ServerOptions, info: BenchModel, say: Callable[[str], None],
             warn: Callable[[str], None] | None) -> Threads:
    """:func:`~gguf_mtp.server.options.choose_threads`, said, and warned of when the user's oversubscribe."""
    threads = choose_threads(server_args, options, free_cores(), draft=info.draft is not None)
    say(threads.describe(f"-t{' and -td' if info.draft is not None else ''} after --"))
    warning = threads.warning("give -t, and -td for a sidecar, after --")
    if warning is not None and warn is not None:
        warn(warning)
    return threads


@dataclass(frozen=True)
class _Session:
    """What every run of one bench shares: the server, the model, the requests, the threads."""

    server: str
    info: BenchModel
    options: ServerOptions
    threads: Threads
    prompts: tuple[Prompt, ...]
    tokens: int
    largest_n_max: int
    server_args: tuple[str, ...]
    health_timeout: float
    environment: dict[str, str]
    say: Callable[[str], None]
    sampling: RequestSampling | None


def _run(session: _Session, i: int, count: int, k: int) -> BenchRun:
    """Run ``i`` of ``count``: one server (``k`` 0: without MTP, else MTP at n-max ``k``), every prompt answered."""
    what = "without MTP" if k == 0 else f"MTP n-max {k}"
    step = f"run {i}/{count}: {what}"
    port = free_port()
    threads = session.threads
    extra = [*threads.arguments, *(threads.draft_arguments if k else ()), *session.server_args]
    args = server_arguments(session.info.path, port, k, session.info.draft, extra, metrics=session.options.metrics,
                            probabilistic=session.sampling is not None)

    def started(handle: ServerHandle) -> None:
        session.say(f"{step}: llama-server pid {handle.pid} on 127.0.0.1:{handle.port}, loading the model")

    with running_server(
        session.server, args, port=port, health_timeout=session.health_timeout, label=f"llama-server ({what})",
        on_start=started, env=session.environment,
    ) as handle:
        _check_context(handle, session.prompts, session.tokens, session.largest_n_max, session.info.path)
        completions = _measure(handle, session.prompts, session.tokens, session.say, step, session.sampling)
        positions = _positions(handle) if k and session.options.metrics else None
        run = BenchRun(k, completions, positions)
    acceptance = "" if run.acceptance is None else f", acceptance {run.acceptance:.2f}"
    session.say(f"{step}: {run.predicted_n} tokens, {run.predicted_per_second:.1f} tokens/s{acceptance}")
    return run
