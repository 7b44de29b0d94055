"""``gguf-mtp accept``: what llama-server will report for an MTP head (``draft_n``, ``draft_n_accepted``), predicted
with llama.cpp's own graphs in seconds, without a server.

The model's headers are checked first (a NextN block or a sidecar that fits, a tokenizer); then a child process
(:mod:`gguf_mtp.check.accept_child`, through llama-cpp-python) runs the trunk and the head on every prompt and prints
the trunk's greedy continuation and the head's draft chain from every position of it; the schedule llama-server
follows over those is replayed in :mod:`gguf_mtp.check.accept_schedule`. The child is the process that may abort
(a GGML assert): the parent turns that into one line with llama.cpp's last log lines; Ctrl-C (or SIGTERM, which the
command line turns into Ctrl-C) kills it, and no child is left.

What the prediction assumes: llama-server's greedy text equals the trunk's greedy continuation computed here
(generated as the server generates it at the largest n-max asked: drafted by the head, verified in batches), and
the trunk's and the head's argmax at every position are what the server computes in its (at other n-max,
differently batched) decodes. On a model with near-ties the last bits of a batched decode can change a choice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gguf_mtp.constants import DEFAULT_N_MAX, DEFAULT_TOKENS, free_cores
from gguf_mtp.errors import LlamaCppError, ParameterError
from gguf_mtp.llama_build import child_environment, chosen, die_with_parent, last_lines, read_log_end
from gguf_mtp.model.drafting import (
    BenchModel,
    Threads,
    check_count_options,
    check_model,
    check_n_max,
    pool_share,
    shared_threads,
)
from gguf_mtp.model.prompts import Prompt, builtin_prompts, check_prompts
from gguf_mtp.model.shards import ShardSet, open_model

from .accept_schedule import Limits, Replay, draft_length, first_draft_agreement, replay, total
from .draft_checks import target_fit_check
from .llama_check import INSTALL_HINT, last_report, llama_cpp_available, llama_reason, signal_name

if TYPE_CHECKING:  # the sampled mode's module, and numpy with it, load only in that mode: greedy's parent needs neither
    from .accept_sampling import SampledRun, Sampling

__all__ = ["AcceptReport", "PromptScore", "SampledReport", "accept", "accept_sampled", "draft_cost", "slot_context"]

_STAGES = {"load": "loading the model", "score": "scoring", None: "starting"}


@dataclass(frozen=True)
class PromptScore:
    """One prompt: its size, and the replayed counts per n-max (greedy mode) or the agreement (text mode)."""

    name: str
    prompt_tokens: int
    tokens: int  #: tokens generated (greedy mode) or scored (text mode)
    runs: tuple[Replay, ...]
    agreement: tuple[int, int] | None = None  #: text mode: (agreeing, scored) first drafts
    #: positions where a batched trunk pass and the greedy decode differed (0 since the greedy text is generated
    #: in the server's verification batches: the child makes no second, differently batched pass)
    batched_disagreements: int = 0
    greedy: tuple[int, ...] = ()  #: greedy mode: the trunk's greedy continuation (token ids)
    seconds: dict[str, float] = field(default_factory=dict)  #: the child's time per phase (greedy, chains)
    cut_from: int | None = None  #: the prompt's tokens before it was cut to fit the context (``fit_context``)

    def to_dict(self) -> dict[str, Any]:
        runs = [{"n_max": r.n_max, "draft_n": r.draft_n, "draft_n_accepted": r.draft_n_accepted} for r in self.runs]
        return {"name": self.name, "tokens": self.tokens, "runs": runs}


@dataclass(frozen=True)
class AcceptReport:
    """What ``accept`` predicted, per prompt and in total, and the estimate built on it."""

    model: str
    draft: str | None
    mode: str  #: "greedy" (a server prediction) or "text" (teacher forcing: an estimate)
    tokens: int
    n_ctx: int
    heads: int
    chained: bool
    draft_cost: float  #: c: one draft step's cost in trunk steps (see :func:`draft_cost`)
    prompts: tuple[PromptScore, ...]
    seconds: float
    llama_cpp_build: str | None = None  #: the llama.cpp that predicted (the child's ``build_of``)
    llama_cpp_library: str | None = None  #: the libllama file it ran from (the child's ``library_of``)
    runs: tuple[Replay, ...] = field(init=False)

    def __post_init__(self) -> None:
        n_maxes = [r.n_max for r in self.prompts[0].runs] if self.prompts else []
        object.__setattr__(self, "runs", tuple(total([p.runs[i] for p in self.prompts]) for i in range(len(n_maxes))))

    def speedup(self, run: Replay) -> float | None:
        """The estimated speed-up of ``run``: tokens per trunk step / (1 + n_max x c), assuming a verify batch of
        n_max + 1 tokens costs one trunk step and a draft step costs c of one."""
        tps = run.tokens_per_step
        return None if tps is None else tps / (1 + run.n_max * self.draft_cost)

    @property
    def recommended_n_max(self) -> int | None:
        """The n-max with the best estimated speed-up, or ``None`` when no run drafted anything (or text mode)."""
        scored = [(s, -r.n_max, r.n_max) for r in self.runs if r.draft_n and (s := self.speedup(r)) is not None]
        return max(scored)[2] if scored and self.mode == "greedy" else None

    def phase_seconds(self) -> dict[str, float]:
        """Seconds the child spent per phase, over every prompt (the greedy generation is sequential, one decode
        per token; the passes are batched)."""
        phases: dict[str, float] = {}
        for p in self.prompts:
            for phase, value in p.seconds.items():
                phases[phase] = round(phases.get(phase, 0.0) + value, 4)
        return phases

    @property
    def batched_disagreements(self) -> int:
        return sum(p.batched_disagreements for p in self.prompts)

    def drafted_n_max(self, run: Replay) -> int:
        """The draft length llama.cpp uses for ``run``'s n-max (clipped to the blocks of a chain of heads)."""
        return draft_length(run.n_max, self.heads)

    def notes(self) -> list[str]:
        """What the prediction changed from what was asked: n-max clipped, prompts cut to fit the context."""
        lines = [f"n-max {r.n_max} drafts at most {self.drafted_n_max(r)} token(s), as llama-server does: a chain of "
                 f"{self.heads} NextN blocks drafts one token per block" for r in self.runs
                 if self.drafted_n_max(r) != r.n_max]
        cut = [p for p in self.prompts if p.cut_from is not None]
        if cut:
            lines.append(f"prompts cut to fit the context of {self.n_ctx} with room to generate: "
                         + ", ".join(f"{p.name} {p.cut_from} -> {p.prompt_tokens} tokens" for p in cut))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report."""
        runs = []
        for r in self.runs:
            by_position = [
                {"position": i + 1, "drafted": d, "accepted": a, "acceptance": a / d if d else None}
                for i, (d, a) in enumerate(zip(r.drafted_per_pos, r.accepted_per_pos, strict=True))
            ]
            runs.append({"n_max": r.n_max, "drafted_n_max": self.drafted_n_max(r), "draft_n": r.draft_n,
                         "draft_n_accepted": r.draft_n_accepted, "acceptance": r.acceptance,
                         "by_position": by_position, "steps": r.steps,
                         "generated": r.generated, "tokens_per_step": r.tokens_per_step,
                         "speedup_estimate": self.speedup(r)})
        return {
            "command": "accept",
            "model": self.model,
            "draft": self.draft,
            "llama_cpp_build": self.llama_cpp_build,
            "llama_cpp_library": self.llama_cpp_library,
            "mode": self.mode,
            "tokens": self.tokens,
            "prompts": [p.to_dict() for p in self.prompts],
            "runs": runs,
            "recommended_n_max": self.recommended_n_max,
            "draft_cost": self.draft_cost,
            "batched_disagreements": self.batched_disagreements,
            "seconds": self.seconds,
            "phase_seconds": self.phase_seconds(),
            "notes": self.notes(),
        }

    def describe(self) -> list[str]:
        """The human-readable report, one line per item: what was measured with which llama.cpp, then the text
        mode's agreement (teacher forcing) or the greedy mode's predicted llama-server counts."""
        render = self._text_lines if self.mode == "text" else self._greedy_lines
        return self._heading_lines() + render()

    def _heading_lines(self) -> list[str]:
        return _heading_lines(self.model, self.draft, self.heads, self.llama_cpp_build, chained=self.chained)

    def _note_lines(self) -> list[str]:
        return [f"note: {line}" for line in self.notes()]

    def _text_lines(self) -> list[str]:
        """Teacher forcing on the given text: how often the head's first draft agrees with the trunk, per prompt
        and over all of them."""
        agree = [p.agreement or (0, 0) for p in self.prompts]
        lines = [f"  {p.name}: the head agrees with the trunk on {a} of {n} tokens ({a / n:.2f})" if n
                 else f"  {p.name}: nothing scored" for p, (a, n) in zip(self.prompts, agree, strict=True)]
        a, n = sum(x for x, _ in agree), sum(y for _, y in agree)
        lines.append(f"teacher forcing on the given text: the head's first draft agrees with the trunk's own "
                     f"next token on {a} of {n} positions ({a / n:.2f}) — an estimate of acceptance at n-max 1, "
                     "not a server prediction" if n else "nothing scored")
        return lines + self._note_lines()

    def _greedy_lines(self) -> list[str]:
        """The predicted llama-server counts per prompt and per n-max, the speed-up estimate and the n-max it
        recommends."""
        lines = [f"predicted llama-server counts (greedy, {self.tokens} tokens per prompt, context {self.n_ctx}):"]
        lines += [f"  {p.name}: " + ", ".join(f"n-max {r.n_max}: {r.draft_n_accepted}/{r.draft_n}"
                                              + _acceptance_suffix(r, " ({:.2f})") for r in p.runs)
                  for p in self.prompts]
        lines += [self._run_line(r) for r in self.runs]
        lines.append(f"speed-up estimate = tokens per trunk step / (1 + n-max x c), c = {self.draft_cost:.3f} (the "
                     "head's weights read per draft step over the trunk's per token); it assumes a verify batch costs "
                     "one trunk step: an estimate, measure tokens/s with gguf-mtp bench")
        lines += self._note_lines()
        if self.batched_disagreements:
            lines.append(f"note: at {self.batched_disagreements} positions the batched trunk pass chose another token "
                         "than the one-token greedy decode (near ties): the server's counts may differ there")
        rec = self.recommended_n_max
        lines.append(f"recommended n-max (estimate): {rec}" if rec is not None else "nothing was drafted")
        return lines

    def _run_line(self, run: Replay) -> str:
        """One n-max over every prompt: its counts, acceptance by draft position and speed-up estimate."""
        positions = " ".join(f"{x:.2f}" if x is not None else "-" for x in run.by_position())
        speed = self.speedup(run)
        return (
            f"n-max {run.n_max}: draft_n {run.draft_n}, draft_n_accepted {run.draft_n_accepted}"
            + _acceptance_suffix(run, ", acceptance {:.2f}")
            + f", by position {positions}, {run.tokens_per_step or 0:.2f} tokens per trunk step"
            + (f", speed-up estimate {speed:.2f}x" if speed is not None else "")
        )


def _heading_lines(model: str, draft: str | None, heads: int, build: str | None, *, chained: bool = False) -> list[str]:
    """Every accept report's first lines: what was measured (the model, its sidecar, its NextN blocks) and with
    which llama.cpp."""
    what = model if draft is None else f"{model} with the sidecar {draft}"
    return [f"accept: {what}: {heads} NextN block{'s' * (heads > 1)}"
            + (" (chained: block k drafts token k)" if chained else ""),
            f"predicted with {build or 'a llama.cpp that does not say its build'}"]


def _acceptance_suffix(run: Replay, template: str) -> str:
    """``template`` filled with ``run``'s acceptance; nothing when it drafted nothing."""
    return template.format(run.acceptance) if run.acceptance is not None else ""


def draft_cost(target: ShardSet, mtp: ShardSet) -> float:
    """c, the cost of one draft step in trunk steps, from the bytes each reads per token: the NextN block(s) and
    the output matrix for the head; every trunk tensor but the NextN blocks and the token embedding (a lookup of one
    row) for the trunk. A rough figure for MoE models, where a token reads only some experts of either."""
    nextn = sum(t.nbytes for _, t in mtp.head_tensors())
    heads = max(mtp.nextn_predict_layers, 1)
    sizes = {t.name: t.nbytes for _, t in target.iter_tensors()}
    output = sizes.get("output.weight", sizes.get("token_embd.weight", 0))  # tied to the embedding without one
    target_head = {t.name for _, t in target.head_tensors()}
    trunk = sum(size for name, size in sizes.items() if name != "token_embd.weight" and name not in target_head)
    return (nextn / heads + output) / trunk if trunk else 1.0


def slot_context(ctx_size: int | None, trained: int | None) -> int:
    """The context of llama-server's slot for ``-c ctx_size`` (``None``: the training context), with one slot or a
    unified cache: llama.cpp rounds it up to a multiple of 256 and the server caps it at the training context."""
    n_ctx = ctx_size or trained or 4096
    n_ctx = -(-n_ctx // 256) * 256
    return min(n_ctx, trained) if trained else n_ctx


def _check_inputs(model: str | os.PathLike[str], draft: str | os.PathLike[str] | None) -> tuple[BenchModel, ShardSet,
                                                                                                  ShardSet]:
    info = check_model(model, draft)  # a tokenizer; a NextN block or a draft with one
    target = open_model(model)
    if draft is None:
        return info, target, target
    sidecar = open_model(draft)
    problems, _ = target_fit_check(target, sidecar.first, sidecar.headers)
    if problems:
        raise ParameterError(f"this sidecar does not fit the model: {problems[0]}", sidecar.name, "draft")
    return info, target, sidecar


def _child_command() -> list[str]:
    """The child's command line (a seam for tests)."""
    return [sys.executable, "-m", "gguf_mtp.check.accept_child"]


def _run_child(request: dict[str, Any], model: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Run the child on ``request``, saying each stage it reaches; its report, or :class:`LlamaCppError` with
    llama.cpp's last log lines. The child dies with us, even when we are killed outright (as bench's server)."""
    env = child_environment(OMP_NUM_THREADS=str(request["threads"]))
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: llama.cpp's log cannot block the child
        proc = subprocess.Popen(_child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                text=True, errors="replace", preexec_fn=die_with_parent())
        try:
            stdout = _talk(proc, json.dumps(request), len(request["prompts"]), say)
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.wait()
        stderr = read_log_end(log)
    return _child_report(proc.returncode, stdout, stderr, model)


def _talk(proc: subprocess.Popen[str], request: str, prompts: int, say: Callable[[str], None]) -> str:
    """Send ``request``, read the child's report lines as they come (a progress line per stage); all of them."""
    assert proc.stdin is not None and proc.stdout is not None
    with contextlib.suppress(BrokenPipeError):  # a child that died at once: its exit status says why
        proc.stdin.write(request)
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()
    say(f"llama.cpp: pid {proc.pid}, loading the model")
    lines = []
    scored = 0
    for line in proc.stdout:
        lines.append(line)
        stage = last_report(line)
        if stage is not None and stage.get("stage") == "score":
            scored += 1
            say(f"prompt {scored}/{prompts} ({stage.get('prompt')}): predicting")
    return "".join(lines)


def _child_report(returncode: int, stdout: str, stderr: str, model: str) -> dict[str, Any]:
    """The child's report, or the error its exit status and log say."""
    report = last_report(stdout)
    if returncode == 0 and report is not None and report.get("stage") == "done":
        if report.get("refused"):
            raise _refusal(str(report["refused"]), stderr, model)
        return report
    raise _failure(returncode, report, stderr, model)


def _refusal(refused: str, stderr: str, model: str) -> ParameterError:
    """The child's refusal of the input, with llama.cpp's reason when llama.cpp refused."""
    reason = llama_reason(stderr) if refused.startswith("llama.cpp") else None
    return ParameterError(f"{refused}: {reason}" if reason else refused, model)


def _failure(returncode: int, report: dict[str, Any] | None, stderr: str, model: str) -> LlamaCppError:
    """The child's failure: the stage it reached, how it ended, llama.cpp's reason and last log lines."""
    stage = (report or {}).get("stage")
    where = _STAGES.get(stage, str(stage))
    if stage == "score" and report is not None:
        where = f"scoring {report.get('prompt')}"
    if returncode < 0:
        how = f"llama.cpp died ({signal_name(-returncode)}) while {where}"
    else:
        how = f"llama.cpp failed (exit status {returncode}) while {where}"
    reason = llama_reason(stderr)
    return LlamaCppError(f"{how}: {reason}" if reason else how, model, log_tail=last_lines(stderr))


@dataclass(frozen=True)
class _Asked:
    """What :func:`accept` and :func:`accept_sampled` are asked in common (their keyword arguments, n-max sorted and
    each once), before anything is checked."""

    model: str | os.PathLike[str]
    draft: str | os.PathLike[str] | None
    prompts: Sequence[Prompt] | None
    tokens: int
    n_max: tuple[int, ...]
    ctx_size: int | None
    threads: int | None
    n_gpu_layers: int

    def check_sizes(self) -> None:
        """Refuse a count outside :data:`~gguf_mtp.model.drafting.COUNT_OPTIONS` or a bad n-max (one line)."""
        check_count_options(tokens=self.tokens, threads=self.threads, n_gpu_layers=self.n_gpu_layers,
                            ctx_size=self.ctx_size)
        check_n_max(self.n_max)


def _threads(given: int | None, warn: Callable[[str], None] | None) -> Threads:
    """The child's thread count by bench's rule (:func:`gguf_mtp.model.drafting.shared_threads`), warned of when
    its two pools (the trunk's and the head's contexts) oversubscribe the free cores."""
    threads = shared_threads(given, free_cores(), "--threads")
    warning = threads.warning(f"give --threads {pool_share(threads.free)}, or leave it out")
    if warning is not None and warn is not None:
        warn(warning)
    return threads


def _prepare(asked: _Asked, warn: Callable[[str], None] | None, say: Callable[[str], None]
             ) -> tuple[BenchModel, ShardSet, ShardSet, dict[str, Any]]:
    """Every check before llama.cpp starts, and the child's request without its mode."""
    asked.check_sizes()
    info, target, mtp = _check_inputs(asked.model, asked.draft)
    n_ctx = slot_context(asked.ctx_size, info.context_length)
    prompts = check_prompts(asked.prompts, "prompts") if asked.prompts is not None else builtin_prompts()
    if not llama_cpp_available():
        raise RuntimeError(f"llama-cpp-python is not installed: {INSTALL_HINT}")
    pools = _threads(asked.threads, warn)
    say(pools.describe("--threads"))
    request = {
        "model": info.path, "draft": info.draft, "prompts": [[p.name, p.text] for p in prompts],
        "tokens": asked.tokens, "k_max": max(asked.n_max), "n_max": list(asked.n_max), "n_ctx": n_ctx,
        "threads": pools.trunk, "n_gpu_layers": asked.n_gpu_layers, "fit": False,
    }
    return info, target, mtp, request


def accept(
    model: str | os.PathLike[str],
    *,
    draft: str | os.PathLike[str] | None = None,
    prompts: Sequence[Prompt] | None = None,
    tokens: int = DEFAULT_TOKENS,
    n_max: Sequence[int] = DEFAULT_N_MAX,
    text: bool = False,
    ctx_size: int | None = None,
    threads: int | None = None,
    n_gpu_layers: int = 0,
    fit_context: bool = False,
    progress: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> AcceptReport:
    """Predict llama-server's draft-mtp counts for ``model`` (see the module docstring).

    Args:
        model: the composite (any shard), or the trunk when ``draft`` is given.
        draft: an MTP-only sidecar, as given to llama-server with ``--spec-draft-model``.
        prompts: the prompts (default: the built-in code, prose and chat prompts ``bench`` sends).
        tokens: tokens generated per prompt (llama-server's ``n_predict``).
        n_max: the draft lengths to predict (``--spec-draft-n-max``).
        text: score the prompts themselves as text (teacher forcing: an estimate, not a server prediction).
        ctx_size: llama-server's ``-c`` (default: the model's training context); see :func:`slot_context`.
        threads: CPU threads of each of llama.cpp's two pools, the trunk's and the head's (default: half the free
            cores each, at least 1, as bench gives llama-server: :func:`gguf_mtp.model.drafting.shared_threads`).
        n_gpu_layers: layers to offload (``-ngl``), with a GPU build of llama-cpp-python.
        fit_context: cut a prompt to what fits the context with room to generate, rather than refuse it (a
            measure of the head, not a prediction for those prompts); the report says so.
        progress: called with one line per stage (the threads, the child started, each prompt).
        warn: called with a warning (``threads`` oversubscribe the free cores).

    Raises:
        BadGGUFError, ShardSetError: a file is not a readable GGUF model.
        NoNextNBlockError: no NextN block and no ``draft``, or a ``draft`` without one.
        ParameterError: no tokenizer, an MTP-only sidecar as ``model``, a draft that does not fit, bad sizes, a
            prompt that is not UTF-8 text or is longer than the context.
        LlamaCppError: llama.cpp failed in the child (its last log lines attached).
        RuntimeError: llama-cpp-python is not installed.
    """
    began = time.monotonic()
    say = progress or (lambda line: None)
    n_max = tuple(sorted(set(n_max)))
    info, target, mtp, request = _prepare(_Asked(model, draft, prompts, tokens, n_max, ctx_size, threads,
                                                 n_gpu_layers), warn, say)
    n_ctx = int(request["n_ctx"])
    request |= {"mode": "text" if text else "greedy", "fit": fit_context}
    report = _run_child(request, info.path, say)
    heads, chained = int(report["heads"]), bool(report["chained"])
    scores = []
    for item in report["prompts"]:
        if text:
            agreement = first_draft_agreement(item["reference"], item["firsts"])
            scores.append(PromptScore(item["name"], 0, item["tokens"], (), agreement, cut_from=item.get("cut_from")))
            continue
        limits = Limits(item["prompt_tokens"], tokens, n_ctx, item["eog_at"])
        # the run keeps the asked n-max; the report says where llama.cpp drafts fewer (AcceptReport.notes)
        runs = tuple(dataclasses.replace(replay(item["greedy"], item["chains"], draft_length(k, heads), limits),
                                         n_max=k) for k in n_max)
        scores.append(PromptScore(item["name"], item["prompt_tokens"], len(item["greedy"]), runs,
                                  batched_disagreements=int(item["batched_disagreements"]),
                                  greedy=tuple(item["greedy"]), seconds=dict(item.get("seconds", {})),
                                  cut_from=item.get("cut_from")))
    return AcceptReport(
        model=info.path, draft=info.draft, mode="text" if text else "greedy", tokens=tokens, n_ctx=n_ctx,
        heads=heads, chained=chained, draft_cost=draft_cost(target, mtp), prompts=tuple(scores),
        seconds=time.monotonic() - began, llama_cpp_build=report.get("llama_cpp_build"),
        llama_cpp_library=report.get("llama_cpp_library"),
    )



@dataclass(frozen=True)
class SampledReport:
    """What ``accept --spec-draft-sampling probabilistic`` predicted: per n-max, the expected counts over the
    prompts and the interval one llama-server run's acceptance falls in (see :mod:`gguf_mtp.check.accept_sampling`)."""

    model: str
    draft: str | None
    tokens: int
    n_ctx: int
    heads: int
    sampling: Sampling
    runs: tuple[SampledRun, ...]
    seconds: float
    llama_cpp_build: str | None = None
    llama_cpp_library: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report."""
        return {"command": "accept", "model": self.model, "draft": self.draft, "llama_cpp_build": self.llama_cpp_build,
                "llama_cpp_library": self.llama_cpp_library, "mode": "probabilistic", "tokens": self.tokens,
                "sampling": self.sampling.to_dict(), "runs": [r.to_dict() for r in self.runs],
                "seconds": self.seconds}

    def describe(self) -> list[str]:
        """The human-readable report."""
        from .accept_sampling import CONFIDENCE

        s = self.sampling
        lines = _heading_lines(self.model, self.draft, self.heads, self.llama_cpp_build)
        lines.append(f"predicted llama-server acceptance (--spec-draft-sampling probabilistic, temperature {s.temp:g}, "
                     f"top-k {s.top_k}, top-p {s.top_p:g}, min-p {s.min_p:g}; {self.tokens} tokens per prompt, "
                     f"context {self.n_ctx}), over {s.draws} sampled texts per prompt x {s.replicates} replays, "
                     f"seed {s.seed}:")
        for r in self.runs:
            if r.interval is None or r.acceptance_mean is None:
                lines.append(f"  n-max {r.n_max}: nothing drafted")
                continue
            lines.append(f"  n-max {r.n_max}: expected draft_n_accepted/draft_n {r.draft_n_accepted:.1f}/"
                         f"{r.draft_n:.1f}, acceptance {r.acceptance_mean:.3f} (sd {r.acceptance_sd:.3f}); one run "
                         f"falls in [{r.interval[0]:.3f}, {r.interval[1]:.3f}] with {CONFIDENCE:.1%} confidence")
        return lines


def accept_sampled(
    model: str | os.PathLike[str],
    sampling: Sampling,
    *,
    draft: str | os.PathLike[str] | None = None,
    prompts: Sequence[Prompt] | None = None,
    tokens: int = DEFAULT_TOKENS,
    n_max: Sequence[int] = DEFAULT_N_MAX,
    ctx_size: int | None = None,
    threads: int | None = None,
    n_gpu_layers: int = 0,
    progress: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> SampledReport:
    """Predict llama-server's acceptance under ``--spec-draft-sampling probabilistic`` at ``sampling``'s request
    settings: the expected ``draft_n`` / ``draft_n_accepted`` and an interval (:mod:`gguf_mtp.check.accept_sampling`).

    The arguments are :func:`accept`'s. Raises what :func:`accept` raises, and :class:`ParameterError` where the
    chosen llama.cpp (``--llama-cpp`` / ``GGUF_MTP_LLAMA_CPP``) has no probabilistic drafting or ``sampling`` has a
    value llama-server would not take.
    """
    from .accept_sampling import SampledText, check_probabilistic_support, simulate

    began = time.monotonic()
    say = progress or (lambda line: None)
    n_max = tuple(sorted(set(n_max)))
    sampling.check()
    check_probabilistic_support(chosen())
    info, _, _, request = _prepare(_Asked(model, draft, prompts, tokens, n_max, ctx_size, threads, n_gpu_layers),
                                   warn, say)
    request |= {"mode": "sampled", "sampling": sampling.to_dict()}
    report = _run_child(request, info.path, say)
    heads = int(report["heads"])
    texts = [[SampledText(tuple(d["tokens"]), tuple(tuple(k) for k in d["keeps"]), d["eog_at"])
              for d in item["draws"]] for item in report["prompts"]]
    limits = [Limits(item["prompt_tokens"], tokens, int(request["n_ctx"])) for item in report["prompts"]]
    runs = tuple(simulate(texts, limits, k, draft_length(k, heads), sampling) for k in n_max)
    return SampledReport(model=info.path, draft=info.draft, tokens=tokens, n_ctx=int(request["n_ctx"]), heads=heads,
                         sampling=sampling, runs=runs, seconds=time.monotonic() - began,
                         llama_cpp_build=report.get("llama_cpp_build"),
                         llama_cpp_library=report.get("llama_cpp_library"))
