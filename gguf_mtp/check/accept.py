"""``gguf-mtp accept``: what llama-server will report for an MTP head (``draft_n``, ``draft_n_accepted``), predicted
with llama.cpp's own graphs in seconds, without a server.

The model's headers are checked first (a NextN block or a sidecar that fits, a tokenizer); then a child process
(:mod:`gguf_mtp.check.accept_child`, through llama-cpp-python) runs the trunk and the head on every prompt and prints
the trunk's greedy continuation and the head's draft chain from every position of it; the schedule llama-server
follows over those is replayed in :mod:`gguf_mtp.check.accept_schedule`. The child is the process that may abort
(a GGML assert): the parent turns that into one line with llama.cpp's last log lines; Ctrl-C (or SIGTERM, which the
command line turns into Ctrl-C) kills it, and no child is left.

What the prediction assumes: llama-server's greedy text equals the trunk's greedy continuation computed here, and
the trunk's and the head's argmax at every position are what the server computes in its (differently batched)
decodes. On a model with near-ties the last bits of a batched decode can change a choice: the report counts the
positions where the batched trunk pass disagrees with the one-token greedy decode, the visible sign of that.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gguf_mtp.constants import DEFAULT_N_MAX, DEFAULT_TOKENS, free_cores
from gguf_mtp.errors import LlamaCppError, ParameterError
from gguf_mtp.model.blocks import block_index
from gguf_mtp.model.shards import ShardSet, open_model
from gguf_mtp.server.bench import BenchModel, Prompt, builtin_prompts, check_model
from gguf_mtp.server.bench_rules import MAX_N_MAX

from .accept_schedule import Limits, Replay, first_draft_agreement, replay, total
from .draft_checks import target_fit_check
from .llama_check import INSTALL_HINT, last_report, llama_cpp_available, llama_reason, signal_name

__all__ = ["AcceptReport", "PromptScore", "accept", "draft_cost", "slot_context"]

#: The most tokens generated per prompt.
MAX_TOKENS = 1 << 14
#: Lines of llama.cpp's log shown when the child fails.
LOG_TAIL_LINES = 12
_STAGES = {"load": "loading the model", "score": "scoring", None: "starting"}


@dataclass(frozen=True)
class PromptScore:
    """One prompt: its size, and the replayed counts per n-max (greedy mode) or the agreement (text mode)."""

    name: str
    prompt_tokens: int
    tokens: int  #: tokens generated (greedy mode) or scored (text mode)
    runs: tuple[Replay, ...]
    agreement: tuple[int, int] | None = None  #: text mode: (agreeing, scored) first drafts
    batched_disagreements: int = 0  #: positions where the batched trunk pass and the greedy decode differ
    greedy: tuple[int, ...] = ()  #: greedy mode: the trunk's greedy continuation (token ids)
    seconds: dict[str, float] = field(default_factory=dict)  #: the child's time per phase (greedy, passes, chains)

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

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report."""
        runs = []
        for r in self.runs:
            by_position = [
                {"position": i + 1, "drafted": d, "accepted": a, "acceptance": a / d if d else None}
                for i, (d, a) in enumerate(zip(r.drafted_per_pos, r.accepted_per_pos, strict=True))
            ]
            runs.append({"n_max": r.n_max, "draft_n": r.draft_n, "draft_n_accepted": r.draft_n_accepted,
                         "acceptance": r.acceptance, "by_position": by_position, "steps": r.steps,
                         "generated": r.generated, "tokens_per_step": r.tokens_per_step,
                         "speedup_estimate": self.speedup(r)})
        return {
            "command": "accept",
            "model": self.model,
            "draft": self.draft,
            "mode": self.mode,
            "tokens": self.tokens,
            "prompts": [p.to_dict() for p in self.prompts],
            "runs": runs,
            "recommended_n_max": self.recommended_n_max,
            "draft_cost": self.draft_cost,
            "batched_disagreements": self.batched_disagreements,
            "seconds": self.seconds,
            "phase_seconds": self.phase_seconds(),
        }

    def describe(self) -> list[str]:
        """The human-readable report, one line per item."""
        what = self.model if self.draft is None else f"{self.model} with the sidecar {self.draft}"
        lines = [f"accept: {what}: {self.heads} NextN block{'s' * (self.heads > 1)}"
                 + (" (chained: block k drafts token k)" if self.chained else "")]
        if self.mode == "text":
            agree = [p.agreement or (0, 0) for p in self.prompts]
            for p, (a, n) in zip(self.prompts, agree, strict=True):
                lines.append(f"  {p.name}: the head agrees with the trunk on {a} of {n} tokens "
                             f"({a / n:.2f})" if n else f"  {p.name}: nothing scored")
            a, n = sum(x for x, _ in agree), sum(y for _, y in agree)
            lines.append(f"teacher forcing on the given text: the head's first draft agrees with the trunk's own "
                         f"next token on {a} of {n} positions ({a / n:.2f}) — an estimate of acceptance at n-max 1, "
                         "not a server prediction" if n else "nothing scored")
            return lines
        lines.append(f"predicted llama-server counts (greedy, {self.tokens} tokens per prompt, context {self.n_ctx}):")
        for p in self.prompts:
            parts = [f"n-max {r.n_max}: {r.draft_n_accepted}/{r.draft_n}"
                     + (f" ({r.acceptance:.2f})" if r.acceptance is not None else "") for r in p.runs]
            lines.append(f"  {p.name}: " + ", ".join(parts))
        for r in self.runs:
            positions = " ".join(f"{x:.2f}" if x is not None else "-" for x in r.by_position())
            speed = self.speedup(r)
            lines.append(
                f"n-max {r.n_max}: draft_n {r.draft_n}, draft_n_accepted {r.draft_n_accepted}"
                + (f", acceptance {r.acceptance:.2f}" if r.acceptance is not None else "")
                + f", by position {positions}, {r.tokens_per_step or 0:.2f} tokens per trunk step"
                + (f", speed-up estimate {speed:.2f}x" if speed is not None else "")
            )
        lines.append(f"speed-up estimate = tokens per trunk step / (1 + n-max x c), c = {self.draft_cost:.3f} (the "
                     "head's weights read per draft step over the trunk's per token); it assumes a verify batch costs "
                     "one trunk step: an estimate, measure tokens/s with gguf-mtp bench")
        if self.batched_disagreements:
            lines.append(f"note: at {self.batched_disagreements} positions the batched trunk pass chose another token "
                         "than the one-token greedy decode (near ties): the server's counts may differ there")
        rec = self.recommended_n_max
        lines.append(f"recommended n-max (estimate): {rec}" if rec is not None else "nothing was drafted")
        return lines


def draft_cost(target: ShardSet, mtp: ShardSet) -> float:
    """c, the cost of one draft step in trunk steps, from the bytes each reads per token: the NextN block(s) and
    the output matrix for the head; every trunk tensor but the NextN blocks and the token embedding (a lookup of one
    row) for the trunk. A rough figure for MoE models, where a token reads only some experts of either."""
    def in_head(name: str, model: ShardSet) -> bool:
        block = block_index(name)
        return block is not None and block >= model.trunk_block_count

    nextn = sum(t.nbytes for _, t in mtp.iter_tensors() if in_head(t.name, mtp))
    heads = max(mtp.nextn_predict_layers, 1)
    sizes = {t.name: t.nbytes for _, t in target.iter_tensors()}
    output = sizes.get("output.weight", sizes.get("token_embd.weight", 0))  # tied to the embedding without one
    trunk = sum(size for name, size in sizes.items() if name != "token_embd.weight" and not in_head(name, target))
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


def _run_child(request: dict[str, Any], model: str) -> dict[str, Any]:
    """Run the child on ``request``; its report, or :class:`LlamaCppError` with llama.cpp's last log lines."""
    env = dict(os.environ, OMP_NUM_THREADS=str(request["threads"]))
    proc = subprocess.run(_child_command(), input=json.dumps(request), capture_output=True, text=True, env=env,
                          errors="replace")
    report = last_report(proc.stdout)
    tail = tuple(line for line in proc.stderr.splitlines() if line.strip())[-LOG_TAIL_LINES:]
    stage = (report or {}).get("stage")
    if proc.returncode == 0 and report is not None and stage == "done":
        if report.get("refused"):
            refused = str(report["refused"])
            reason = llama_reason(proc.stderr) if refused.startswith("llama.cpp") else None
            raise ParameterError(f"{refused}: {reason}" if reason else refused, model)
        return report
    where = _STAGES.get(stage, str(stage))
    if stage == "score" and report is not None:
        where = f"scoring {report.get('prompt')}"
    if proc.returncode < 0:
        how = f"llama.cpp died ({signal_name(-proc.returncode)}) while {where}"
    else:
        how = f"llama.cpp failed (exit status {proc.returncode}) while {where}"
    reason = llama_reason(proc.stderr)
    raise LlamaCppError(f"{how}: {reason}" if reason else how, model, log_tail=tail)


def _check_sizes(tokens: int, n_max: Sequence[int], threads: int, n_gpu_layers: int, n_ctx: int | None) -> None:
    if not 1 <= tokens <= MAX_TOKENS:
        raise ParameterError(f"tokens {tokens}: generate from 1 to {MAX_TOKENS} tokens per prompt", parameter="tokens")
    if not n_max or any(not 1 <= n <= MAX_N_MAX for n in n_max):
        raise ParameterError(f"n_max: draft lengths from 1 to {MAX_N_MAX}", parameter="n_max")
    if threads < 1:
        raise ParameterError(f"threads {threads}: give 1 or more", parameter="threads")
    if n_gpu_layers < 0:
        raise ParameterError(f"n_gpu_layers {n_gpu_layers}: give 0 or more", parameter="n_gpu_layers")
    if n_ctx is not None and n_ctx < 8:
        raise ParameterError(f"ctx_size {n_ctx}: give 8 or more", parameter="ctx_size")


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
        threads: CPU threads for llama.cpp (default: the free cores, :func:`~gguf_mtp.constants.free_cores`:
            more on a busy machine only slow llama.cpp's pool down).
        n_gpu_layers: layers to offload (``-ngl``), with a GPU build of llama-cpp-python.

    Raises:
        BadGGUFError, ShardSetError: a file is not a readable GGUF model.
        NoNextNBlockError: no NextN block and no ``draft``, or a ``draft`` without one.
        ParameterError: no tokenizer, a draft that does not fit, bad sizes, a prompt longer than the context.
        LlamaCppError: llama.cpp failed in the child (its last log lines attached).
        RuntimeError: llama-cpp-python is not installed.
    """
    began = time.monotonic()
    threads = threads if threads is not None else free_cores()
    n_max = tuple(sorted(set(n_max)))
    _check_sizes(tokens, n_max, threads, n_gpu_layers, ctx_size)
    info, target, mtp = _check_inputs(model, draft)
    n_ctx = slot_context(ctx_size, info.context_length)
    prompts = tuple(prompts) if prompts is not None else builtin_prompts()
    if not llama_cpp_available():
        raise RuntimeError(f"llama-cpp-python is not installed: {INSTALL_HINT}")
    request = {
        "model": info.path, "draft": info.draft, "prompts": [[p.name, p.text] for p in prompts],
        "mode": "text" if text else "greedy", "tokens": tokens, "k_max": max(n_max), "n_ctx": n_ctx,
        "threads": threads, "n_gpu_layers": n_gpu_layers,
    }
    report = _run_child(request, info.path)
    heads, chained = int(report["heads"]), bool(report["chained"])
    scores = []
    for item in report["prompts"]:
        if text:
            agreement = first_draft_agreement(item["reference"], item["firsts"])
            scores.append(PromptScore(item["name"], 0, item["tokens"], (), agreement))
            continue
        limits = Limits(item["prompt_tokens"], tokens, n_ctx, item["eog_at"])
        # chained heads draft at most one token per head (draft-mtp clips n_max); the run keeps the asked n-max
        runs = tuple(dataclasses.replace(replay(item["greedy"], item["chains"], min(k, heads) if chained else k,
                                                limits), n_max=k) for k in n_max)
        scores.append(PromptScore(item["name"], item["prompt_tokens"], len(item["greedy"]), runs,
                                  batched_disagreements=int(item["batched_disagreements"]),
                                  greedy=tuple(item["greedy"]), seconds=dict(item.get("seconds", {}))))
    return AcceptReport(
        model=info.path, draft=info.draft, mode="text" if text else "greedy", tokens=tokens, n_ctx=n_ctx,
        heads=heads, chained=chained, draft_cost=draft_cost(target, mtp), prompts=tuple(scores),
        seconds=time.monotonic() - began,
    )

