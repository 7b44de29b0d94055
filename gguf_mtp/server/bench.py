"""``gguf-mtp bench``: does the MTP head make generation faster with the user's own llama-server, and at
which n-max? The model's metadata is checked first (a NextN block or an MTP-only ``draft``, a tokenizer, room
in the context); then llama-server runs once without speculative decoding and once per n-max with
``--spec-type draft-mtp``, answering the same prompts greedily; the rules that read its answers are in
:mod:`gguf_mtp.server.bench_rules`, the process handling in :mod:`gguf_mtp.server.process`.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gguf_mtp.constants import free_cores
from gguf_mtp.errors import LlamaServerError, NoNextNBlockError, ParameterError
from gguf_mtp.files.json_io import load_json_file
from gguf_mtp.files.regular_file import NotARegularFileError, open_regular
from gguf_mtp.format.header import GGUFHeader
from gguf_mtp.model.blocks import is_mtp_only, read_block_layout
from gguf_mtp.model.shards import ShardSet, open_model

from .bench_rules import (
    DEFAULT_HEALTH_TIMEOUT,
    DEFAULT_N_MAX,
    DEFAULT_TOKENS,
    SPEC_DRAFT_SAMPLING,
    BenchReport,
    BenchRun,
    Completion,
    PositionCounts,
    RequestSampling,
    check_count_options,
    check_float_options,
    check_n_max,
    completion_request,
    first_difference,
    parse_completion,
    parse_metrics,
    server_arguments,
)
from .options import ServerOptions, check_extra_arguments, choose_threads
from .process import ServerHandle, free_port, probe_server, running_server, server_build

__all__ = ["DEFAULT_N_MAX", "DEFAULT_TOKENS", "BenchModel", "bench", "builtin_prompts", "check_model", "check_prompts",
           "load_prompts", "tokenizer_refusal"]

#: The most prompts a run sends.
MAX_PROMPTS = 64
#: The largest ``--prompts`` file read.
MAX_PROMPTS_BYTES = 4 * 1024 * 1024
#: Seconds one whole ``/completion`` answer may take (a big model on CPU is slow; a dead server is noticed sooner).
REQUEST_TIMEOUT = 3600.0
#: Seconds one whole answer of ``/props``, ``/tokenize`` or ``/metrics`` may take.
SMALL_REQUEST_TIMEOUT = 60.0
_NO_TOKENIZER = ("no_vocab", "none")


@dataclass(frozen=True)
class Prompt:
    """One prompt bench sends, and the name its report gives it (``prompt 2``, or the name in a JSON file)."""

    name: str
    text: str


def builtin_prompts() -> tuple[Prompt, ...]:
    """The prompts shipped with gguf-mtp: code, prose and a chat, a few hundred tokens each."""
    text = importlib.resources.files("gguf_mtp").joinpath("data/bench_prompts.json").read_text("utf-8")
    return _prompts_from_json(json.loads(text), "built-in prompts")


def _prompts_from_json(document: Any, where: str) -> tuple[Prompt, ...]:
    items = document.get("prompts") if isinstance(document, dict) else document
    if not isinstance(items, list):
        raise ParameterError("prompts: a JSON prompts file is a list of strings (or {\"prompts\": [...]})", where,
                             "prompts")
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            name, text = item.get("name", f"prompt {i + 1}"), item.get("text")
        else:
            name, text = f"prompt {i + 1}", item
        if not isinstance(text, str) or not text.strip() or not isinstance(name, str):
            raise ParameterError(f"prompts: prompt {i + 1} is not a non-empty string", where, "prompts")
        prompts.append(Prompt(name, text))
    return check_prompts(prompts, where)


def check_prompts(prompts: Sequence[Prompt], where: str) -> tuple[Prompt, ...]:
    """``prompts``, if llama.cpp can be given them: one at least, at most :data:`MAX_PROMPTS`, each UTF-8 text
    (a JSON string may hold a lone surrogate, which no UTF-8 encoder takes).

    Raises:
        ParameterError: one line naming ``where`` (the file) and, for a bad text, the prompt and the character.
    """
    if not prompts:
        raise ParameterError("prompts: no prompt in the file", where, "prompts")
    if len(prompts) > MAX_PROMPTS:
        raise ParameterError(f"prompts: {len(prompts)} prompts, more than the {MAX_PROMPTS} bench sends", where,
                             "prompts")
    for prompt in prompts:
        try:
            prompt.text.encode("utf-8")  # as the server's client and accept's child encode it
        except UnicodeEncodeError as e:
            raise ParameterError(f"prompts: {prompt.name}: character {e.start + 1} (U+{ord(prompt.text[e.start]):04X}) "
                                 f"cannot be encoded as UTF-8 ({e.reason})", where, "prompts") from None
    return tuple(prompts)


def load_prompts(path: str | os.PathLike[str]) -> tuple[Prompt, ...]:
    """Prompts from a file: ``.json`` (a list of strings, or ``{"prompts": [{"name", "text"}...]}``), else
    UTF-8 text with prompts separated by lines holding only ``---``.

    Raises:
        ParameterError: missing, unreadable, too large, or no prompt in it (one line naming the file).
    """
    where = os.fspath(path)
    if where.lower().endswith(".json"):
        return _prompts_from_json(load_json_file(path, max_bytes=MAX_PROMPTS_BYTES, error=ParameterError), where)
    try:
        fd, info = open_regular(path)
    except FileNotFoundError:
        raise ParameterError("prompts: no such file", where, "prompts") from None
    except (IsADirectoryError, NotARegularFileError):
        raise ParameterError("prompts: not a regular file", where, "prompts") from None
    except OSError as e:
        raise ParameterError(f"prompts: cannot open: {e.strerror}", where, "prompts") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_PROMPTS_BYTES + 1)
    if len(data) > MAX_PROMPTS_BYTES or info.st_size > MAX_PROMPTS_BYTES:
        raise ParameterError(f"prompts: larger than the {MAX_PROMPTS_BYTES:,} bytes bench reads", where, "prompts")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParameterError("prompts: not UTF-8 text", where, "prompts") from None
    chunks: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.strip() == "---":
            chunks.append("".join(current))
            current = []
        else:
            current.append(line)
    chunks.append("".join(current))
    parts = [c.strip("\n") for c in chunks if c.strip()]
    return check_prompts([Prompt(f"prompt {i + 1}", t) for i, t in enumerate(parts)], where)


@dataclass(frozen=True)
class BenchModel:
    """What bench needs to know of the model before starting anything."""

    path: str
    draft: str | None
    nextn: int  # NextN blocks of the model, or of the draft when one is given
    context_length: int | None  # the training context ({arch}.context_length)


def tokenizer_refusal(model: ShardSet | GGUFHeader) -> str | None:
    """Why bench cannot measure ``model`` (llama-server cannot tokenize its prompts), or None when it can; a
    header is enough (its first shard's)."""
    tokenizer = model.get("tokenizer.ggml.model")
    if tokenizer is None or tokenizer in _NO_TOKENIZER:
        return f"model has no tokenizer (tokenizer.ggml.model = {tokenizer!r}): llama-server cannot tokenize prompts"
    return None


def check_model(model: str | os.PathLike[str], draft: str | os.PathLike[str] | None) -> BenchModel:
    """Read the model (and draft) headers: MTP must be there to measure, and llama-server must be able to
    tokenize.

    Raises:
        BadGGUFError, ShardSetError: a file is not a readable GGUF model.
        NoNextNBlockError: no NextN block in the model and no ``draft``, or a ``draft`` without one.
        ParameterError: the model has no tokenizer, or is an MTP-only sidecar (to give as ``draft``).
    """
    target = open_model(model)
    if is_mtp_only(read_block_layout(target.first), target.block_indices()):
        raise ParameterError("an MTP-only sidecar, not a model: give the model it drafts for, and this file as draft",
                             target.name, "draft")
    refusal = tokenizer_refusal(target)
    if refusal is not None:
        raise ParameterError(refusal, target.name)
    if draft is None:
        nextn = target.nextn_predict_layers
        if nextn == 0:
            raise NoNextNBlockError(
                "no NextN (MTP) block (nextn_predict_layers = 0) and no draft: compose one in, or give the "
                "MTP-only sidecar as draft",
                target.name,
                "draft",
            )
    else:
        sidecar = open_model(draft)
        nextn = sidecar.nextn_predict_layers
        if nextn == 0:
            raise NoNextNBlockError("draft has no NextN (MTP) block", sidecar.name, "draft")
    context = target.get(target.arch_key("{arch}.context_length"))
    return BenchModel(
        path=target.name,
        draft=None if draft is None else os.fspath(draft),
        nextn=nextn,
        context_length=context if isinstance(context, int) and context > 0 else None,
    )


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
    check_count_options(tokens=tokens)
    check_n_max(n_max)
    check_float_options(health_timeout=health_timeout)
    info = check_model(model, draft)
    if info.context_length is not None and tokens + max(n_max) + 1 > info.context_length:
        raise ParameterError(
            f"tokens {tokens} + n-max {max(n_max)} do not fit the model's context of {info.context_length} tokens",
            info.path, "tokens",
        )
    prompts = tuple(prompts) if prompts is not None else builtin_prompts()
    if sampling is not None:
        sampling.check()
    options = ServerOptions.from_help(probe_server(server))
    if sampling is not None and not options.probabilistic:
        raise LlamaServerError(f"its --help has no '{SPEC_DRAFT_SAMPLING} probabilistic' (llama.cpp b11434 or later "
                               "has it)", server, "server")
    check_extra_arguments(server_args, options)  # before any server starts
    environment = options.server_environment(os.environ)
    say = progress or (lambda line: None)
    threads = choose_threads(server_args, options, free_cores(), draft=info.draft is not None)
    say(threads.describe(f"-t{' and -td' if info.draft is not None else ''} after --"))
    warning = threads.warning("give -t, and -td for a sidecar, after --")
    if warning is not None and warn is not None:
        warn(warning)
    configurations = (0, *n_max)
    runs: list[BenchRun] = []
    for i, k in enumerate(configurations, 1):
        what = "without MTP" if k == 0 else f"MTP n-max {k}"
        step = f"run {i}/{len(configurations)}: {what}"
        port = free_port()
        extra = [*threads.arguments, *(threads.draft_arguments if k else ()), *server_args]
        args = server_arguments(info.path, port, k, info.draft, extra, metrics=options.metrics,
                                probabilistic=sampling is not None)

        def started(handle: ServerHandle, step: str = step) -> None:
            say(f"{step}: llama-server pid {handle.pid} on 127.0.0.1:{handle.port}, loading the model")

        with running_server(
            server, args, port=port, health_timeout=health_timeout, label=f"llama-server ({what})",
            on_start=started, env=environment,
        ) as handle:
            _check_context(handle, prompts, tokens, max(n_max), info.path)
            completions = _measure(handle, prompts, tokens, say, step, sampling)
            positions = _positions(handle) if k and options.metrics else None
            run = BenchRun(k, completions, positions)
        runs.append(run)
        acceptance = "" if run.acceptance is None else f", acceptance {run.acceptance:.2f}"
        say(f"{step}: {run.predicted_n} tokens, {run.predicted_per_second:.1f} tokens/s{acceptance}")
    baseline = runs[0]
    differences = () if sampling is not None else \
        tuple(d for run in runs[1:] if (d := first_difference(baseline, run)) is not None)
    return BenchReport(
        model=info.path, draft=info.draft, server=server, prompts=len(prompts), tokens=tokens, runs=tuple(runs),
        differences=differences, seconds=time.monotonic() - began, server_args=tuple(server_args),
        threads=threads.arguments + threads.draft_arguments, llama_cpp_build=server_build(server), sampling=sampling,
    )
