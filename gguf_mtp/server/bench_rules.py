"""The pure part of ``gguf-mtp bench``: what is asked of llama-server, how its answers are read, and what
they mean (acceptance, speed-up, the recommended n-max, the lossless decision). No process, no socket:
:mod:`gguf_mtp.server.process` talks to the server, :mod:`gguf_mtp.server.bench` runs the whole thing.

llama-server's ``/completion`` answer (llama.cpp b11025 and later) carries ``timings``: ``predicted_n`` tokens
generated in ``predicted_ms`` (``predicted_per_second``), and, only when speculative decoding drafted at least
one token, ``draft_n`` (tokens the MTP head proposed) and ``draft_n_accepted`` (of those, the ones the trunk
kept). With ``return_tokens`` it also returns the generated token ids, which the lossless check compares. With
``--metrics`` its ``/metrics`` (Prometheus text) also counts the verification steps
(``llamacpp:spec_decode_num_drafts_total``) and the drafted tokens accepted at each draft position
(``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}``, from 0).

Nothing read from the server is trusted: every count is bounded (:data:`gguf_mtp.model.drafting.MAX_COUNT`), every
duration finite and bounded, and every float option of bench is checked in one place (:func:`check_float_options`);
the count options and draft lengths bench shares with ``accept`` are :mod:`gguf_mtp.model.drafting`'s.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gguf_mtp.constants import DEFAULT_HEALTH_TIMEOUT, DEFAULT_N_MAX, DEFAULT_TOKENS
from gguf_mtp.errors import LlamaServerError, ParameterError
from gguf_mtp.llama_server import SPEC_DRAFT_SAMPLING
from gguf_mtp.model.drafting import MAX_COUNT, MAX_N_MAX, SEED, RequestSampling

__all__ = [
    "DEFAULT_HEALTH_TIMEOUT",
    "DEFAULT_N_MAX",
    "DEFAULT_TOKENS",
    "FLOAT_OPTIONS",
    "WORTHWHILE_SPEEDUP",
    "BenchReport",
    "BenchRow",
    "BenchRun",
    "BenchSummary",
    "Completion",
    "Difference",
    "PositionCounts",
    "acceptance_rate",
    "check_float_options",
    "completion_request",
    "first_difference",
    "parse_bench_json",
    "parse_completion",
    "parse_metrics",
    "parse_n_max_list",
    "recommend_n_max",
    "server_arguments",
    "speedup",
]

#: MTP is recommended only when its best run is at least this much faster than the run without it
#: (a smaller gain is within the noise of one short run, and costs the head's memory for nothing).
WORTHWHILE_SPEEDUP = 1.03

#: The longest duration (milliseconds) a ``/completion`` timing may report: a year.
MAX_MILLISECONDS = 365 * 86400 * 1000.0

#: Every float option of bench, with its range (low, high, whether low itself is allowed); checked, with
#: finiteness, by :func:`check_float_options` and nowhere else.
FLOAT_OPTIONS: dict[str, tuple[float, float, bool]] = {
    "health_timeout": (0.0, 7 * 86400.0, False),  # seconds: > 0, at most a week
}


def check_float_options(**values: float) -> None:
    """Refuse a float option that is not a finite number within its :data:`FLOAT_OPTIONS` range.

    Raises:
        ParameterError: one line naming the option (``nan``, ``inf`` and out-of-range values alike).
    """
    for name, value in values.items():
        low, high, low_included = FLOAT_OPTIONS[name]
        try:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        except OverflowError:  # an int beyond any float
            number = math.inf
        above = number >= low if low_included else number > low
        if not (math.isfinite(number) and above and number <= high):
            bound = "at least" if low_included else "more than"
            raise ParameterError(f"{name} {value!r}: give a finite number {bound} {low:g} and at most {high:g}",
                                 parameter=name)


def parse_n_max_list(text: str) -> tuple[int, ...]:
    """``"1,2,3"`` -> ``(1, 2, 3)``: distinct values from 1 to :data:`MAX_N_MAX`, in increasing order.

    Raises:
        ParameterError: not a comma-separated list of such numbers.
    """
    values = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_N_MAX:
            raise ParameterError(
                f"n_max {text!r}: give draft lengths from 1 to {MAX_N_MAX}, separated by commas (e.g. 1,2,3)",
                parameter="n_max",
            )
        values.add(int(part))
    return tuple(sorted(values))


def server_arguments(model: str, port: int, n_max: int, draft: str | None, extra: Sequence[str], *,
                     metrics: bool = False, probabilistic: bool = False) -> list[str]:
    """llama-server's arguments for one run: ``n_max`` 0 is the run without speculative decoding, any other
    value an MTP run drafting up to ``n_max`` tokens (from ``draft``, an MTP-only sidecar, when given);
    ``metrics`` adds ``--metrics`` (the per-position counts), ``probabilistic`` ``--spec-draft-sampling
    probabilistic``. ``extra`` must already be checked (:func:`gguf_mtp.server.options.check_extra_arguments`).
    """
    args = ["-m", model, "--host", "127.0.0.1", "--port", str(port)]
    if n_max:
        args += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max)]
        if draft is not None:
            args += ["--spec-draft-model", draft]
        if metrics:
            args.append("--metrics")
        if probabilistic:
            args += [SPEC_DRAFT_SAMPLING, "probabilistic"]
    return args + list(extra)


def completion_request(prompt: str, tokens: int, sampling: RequestSampling | None = None) -> dict[str, Any]:
    """The ``/completion`` body: ``tokens`` tokens, greedily (temperature 0, fixed seed) or as ``sampling`` says,
    the prompt processed afresh (no cache from an earlier request), the generated token ids returned."""
    return {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": 0.0,
        "seed": SEED,
        "cache_prompt": False,
        "return_tokens": True,
        "stream": False,
    } | (sampling.fields() if sampling is not None else {})


@dataclass(frozen=True)
class Completion:
    """One ``/completion`` answer: the counts of its ``timings`` and what it generated."""

    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int
    content: str
    tokens: tuple[int, ...] | None  # None when the server did not return them


def _count(timings: Mapping[str, Any], key: str, *, required: bool) -> int:
    value = timings.get(key)
    if value is None and not required:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise LlamaServerError(f"/completion answered timings.{key} = {_short(value)}, not a count")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:24] + f"... ({len(text)} characters)"


def _duration(timings: Mapping[str, Any]) -> float:
    """``timings.predicted_ms``: 0, or a finite duration from a microsecond to :data:`MAX_MILLISECONDS`.

    Raises:
        LlamaServerError: anything else.
    """
    predicted_ms = timings.get("predicted_ms")
    if (
        not isinstance(predicted_ms, (int, float))
        or isinstance(predicted_ms, bool)
        or not math.isfinite(predicted_ms)
        or not (predicted_ms == 0 or 1e-3 <= predicted_ms <= MAX_MILLISECONDS)
    ):
        raise LlamaServerError(f"/completion answered timings.predicted_ms = {_short(predicted_ms)}, not a duration")
    return float(predicted_ms)


def _token_ids(answer: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The generated token ids (``return_tokens``), or ``None`` when the answer has no list of them."""
    tokens = answer.get("tokens")
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        return tuple(tokens)
    return None


def parse_completion(answer: object) -> Completion:
    """Read llama-server's ``/completion`` answer (JSON already decoded).

    A run without speculative decoding has no ``draft_*`` fields: they count as 0.

    Raises:
        LlamaServerError: the answer is not what llama-server returns.
    """
    if not isinstance(answer, Mapping) or not isinstance(answer.get("timings"), Mapping):
        raise LlamaServerError("/completion answered without timings: is this llama-server?")
    timings = answer["timings"]
    predicted_ms = _duration(timings)
    draft_n = _count(timings, "draft_n", required=False)
    accepted = _count(timings, "draft_n_accepted", required=False)
    if accepted > draft_n:
        raise LlamaServerError(f"/completion answered {accepted} accepted of {draft_n} drafted tokens")
    content = answer.get("content")
    if not isinstance(content, str):
        raise LlamaServerError("/completion answered without content")
    return Completion(
        predicted_n=_count(timings, "predicted_n", required=True),
        predicted_ms=predicted_ms,
        draft_n=draft_n,
        draft_n_accepted=accepted,
        content=content,
        tokens=_token_ids(answer),
    )


#: The counters bench reads from llama-server's ``/metrics``.
_DRAFTS = "llamacpp:spec_decode_num_drafts_total"
_PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r'([a-zA-Z_:][\w:]*)(?:\{position="(\d{1,3})"\})?[ \t]+(\S{1,40})')
#: The most ``/metrics`` lines read (llama-server writes about 50).
_MAX_METRICS_LINES = 4096


@dataclass(frozen=True)
class PositionCounts:
    """Acceptance by draft position, as llama-server counts it: ``drafts`` verification steps, and of those, how
    many accepted the drafted token at position 0, 1, ... (a step that accepts k tokens counts at 0..k-1)."""

    drafts: int
    accepted: tuple[int, ...]

    @property
    def rates(self) -> tuple[float, ...]:
        """The share of verification steps that accepted the token at each position (llama-server's own
        "acc per pos"); empty when nothing was drafted."""
        return tuple(a / self.drafts for a in self.accepted) if self.drafts else ()

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` fields: ``drafts``, ``accepted_by_position`` and ``by_position`` (the rates)."""
        return {"drafts": self.drafts, "accepted_by_position": list(self.accepted),
                "by_position": [round(r, 4) for r in self.rates]}


def _metric_count(name: str, text: str) -> int:
    """A counter's value: llama-server prints integers, or doubles in C++'s default format (``1.23457e+06``)."""
    try:
        value = float(text) if not text.isdigit() else int(text)
    except ValueError:
        value = math.nan
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= MAX_COUNT:
        raise LlamaServerError(f"/metrics answered {name} = {_short(text)}, not a count")
    return round(value)


def _sample(line: str) -> tuple[str, str | None, str] | None:
    """(name, position, value) of a ``/metrics`` line of a counter bench reads; ``None`` for any other line.

    Raises:
        LlamaServerError: such a counter's line that is not a sample.
    """
    if not line.startswith((_DRAFTS, _PER_POSITION)):
        return None
    match = _SAMPLE.fullmatch(line)
    if match is None:
        raise LlamaServerError(f"/metrics answered {_short(line)}, not a count")
    name, position, value = match.groups()
    return name, position, value


def _counters(data: bytes) -> tuple[int | None, dict[int, int]]:
    """The verification steps and the accepted tokens by position that ``/metrics`` counts (bounded, each once).

    Raises:
        LlamaServerError: too many lines, a counter that is not a bounded count, or a position given twice.
    """
    drafts: int | None = None
    positions: dict[int, int] = {}
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines()):
        if number >= _MAX_METRICS_LINES:
            raise LlamaServerError(f"/metrics answered more than {_MAX_METRICS_LINES} lines")
        sample = _sample(line.strip())
        if sample is None:
            continue
        name, position, value = sample
        if name == _DRAFTS and position is None:
            drafts = _metric_count(name, value)
        elif name == _PER_POSITION and position is not None:
            if int(position) in positions:
                raise LlamaServerError(f"/metrics answered {name} for position {position} twice")
            positions[int(position)] = _metric_count(name, value)
    return drafts, positions


def _position_counts(drafts: int, positions: Mapping[int, int]) -> PositionCounts:
    """The counts, if they can be: positions 0, 1, ..., each accepted at most as often as the one before it.

    Raises:
        LlamaServerError: one line.
    """
    if sorted(positions) != list(range(len(positions))):
        raise LlamaServerError(f"/metrics answered {_PER_POSITION} for positions {sorted(positions)}, not 0, 1, ...")
    accepted = tuple(positions[i] for i in range(len(positions)))
    if any(a > drafts for a in accepted) or any(b > a for a, b in itertools.pairwise(accepted)):
        raise LlamaServerError(f"/metrics answered {accepted} accepted by position of {drafts} drafts: impossible")
    return PositionCounts(drafts, accepted)


def parse_metrics(data: bytes) -> PositionCounts | None:
    """The per-position acceptance in llama-server's ``/metrics`` answer (Prometheus text); ``None`` when the
    server does not count it (an older llama-server, or nothing drafted yet).

    Raises:
        LlamaServerError: a counter that is not a bounded count, or positions that are not 0, 1, ... (one line).
    """
    drafts, positions = _counters(data)
    if drafts is None or not positions:
        return None
    return _position_counts(drafts, positions)


def acceptance_rate(accepted: int, drafted: int) -> float | None:
    """The share of drafted tokens the trunk accepted; ``None`` when nothing was drafted (the run without MTP)."""
    return accepted / drafted if drafted else None


def speedup(tokens_per_second: float, baseline: float) -> float | None:
    """How many times faster than the run without MTP (``baseline`` tokens/s); ``None`` without a baseline."""
    return tokens_per_second / baseline if baseline > 0 else None


@dataclass(frozen=True)
class BenchRun:
    """One server configuration (``n_max`` 0: without MTP) and its answers to every prompt, summed."""

    n_max: int
    completions: tuple[Completion, ...]
    positions: PositionCounts | None = None  # from llama-server's /metrics, when it counts them

    @property
    def predicted_n(self) -> int:
        return sum(c.predicted_n for c in self.completions)

    @property
    def predicted_ms(self) -> float:
        return sum(c.predicted_ms for c in self.completions)

    @property
    def draft_n(self) -> int:
        return sum(c.draft_n for c in self.completions)

    @property
    def draft_n_accepted(self) -> int:
        return sum(c.draft_n_accepted for c in self.completions)

    @property
    def predicted_per_second(self) -> float:
        """Generated tokens over generation time, all prompts together (not a mean of per-prompt rates)."""
        return self.predicted_n * 1000.0 / self.predicted_ms if self.predicted_ms > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        """:func:`acceptance_rate` of the run."""
        return acceptance_rate(self.draft_n_accepted, self.draft_n)

    @property
    def text_sha256(self) -> str:
        """sha256 of the generated texts (a JSON list, one per prompt): equal runs have equal hashes."""
        texts = json.dumps([c.content for c in self.completions], ensure_ascii=False)
        return hashlib.sha256(texts.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Difference:
    """Where an MTP run's greedy output first differs from the run without MTP."""

    n_max: int
    prompt: int  # index into the prompts
    position: int  # the first differing generated token (or character, when the server gave no token ids)
    unit: str  # "token" or "character"

    def describe(self) -> str:
        """One line: which run, which prompt, and where."""
        return (
            f"with MTP (n-max {self.n_max}) prompt {self.prompt + 1} differs from the run without MTP "
            f"at {self.unit} {self.position}"
        )


def _first_mismatch(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def first_difference(baseline: BenchRun, run: BenchRun) -> Difference | None:
    """The first place ``run``'s output differs from ``baseline``'s, prompt by prompt; ``None`` when equal.

    Greedy decoding with a draft head must give exactly the tokens greedy decoding gives without it: the trunk
    verifies every drafted token and keeps only those it would have produced itself.
    """
    for index, (want, got) in enumerate(zip(baseline.completions, run.completions)):
        if want.tokens is not None and got.tokens is not None:
            position = _first_mismatch(want.tokens, got.tokens)
            unit = "token"
        else:
            position = None
            unit = "character"
        if position is None:
            char = _first_mismatch(want.content, got.content)
            if char is not None:
                position, unit = char, "character"
        if position is not None:
            return Difference(run.n_max, index, position, unit)
    return None


def recommend_n_max(runs: Sequence[BenchRun]) -> int:
    """The n-max to run with: the fastest MTP run, if it beats the run without MTP by at least
    :data:`WORTHWHILE_SPEEDUP` (ties go to the smaller n-max); otherwise 0, MTP off."""
    baseline = next((r for r in runs if r.n_max == 0), None)
    candidates = [r for r in runs if r.n_max > 0]
    if baseline is None or not candidates or baseline.predicted_per_second <= 0:
        return 0
    best = max(candidates, key=lambda r: (r.predicted_per_second, -r.n_max))
    return best.n_max if best.predicted_per_second >= baseline.predicted_per_second * WORTHWHILE_SPEEDUP else 0


@dataclass(frozen=True)
class BenchReport:
    """What ``bench`` measured: one run per configuration, the lossless verdict, the recommendation."""

    model: str
    draft: str | None
    server: str
    prompts: int
    tokens: int
    runs: tuple[BenchRun, ...]
    differences: tuple[Difference, ...]
    seconds: float
    server_args: tuple[str, ...] = ()
    threads: tuple[str, ...] = ()  # the thread flags bench chose (empty when the user gave them)
    llama_cpp_build: str | None = None  # what the server's --version says it is
    sampling: RequestSampling | None = None  # sampled requests, drafts verified by rejection; None: greedy

    @property
    def baseline(self) -> BenchRun:
        """The run without MTP (``n_max`` 0)."""
        return next(r for r in self.runs if r.n_max == 0)

    @property
    def lossless(self) -> bool:
        """Every MTP run generated exactly the text (and tokens) of the run without MTP."""
        return not self.differences

    @property
    def recommended_n_max(self) -> int | None:
        """:func:`recommend_n_max`, or ``None`` when the output was not lossless (nothing to recommend)."""
        return recommend_n_max(self.runs) if self.lossless else None

    def speedup(self, run: BenchRun) -> float | None:
        """:func:`speedup` of ``run`` over the run without MTP."""
        return speedup(run.predicted_per_second, self.baseline.predicted_per_second)

    def run_dict(self, r: BenchRun) -> dict[str, Any]:
        """One run of the ``--json`` report: the server's counts, its speed, its text's hash and, when the server
        counts them, acceptance by draft position (``drafts``, ``accepted_by_position``, ``by_position``; all
        ``None`` otherwise). A prediction of the same counts would sit next to these, under its own key."""
        positions = r.positions.to_dict() if r.positions is not None else \
            {"drafts": None, "accepted_by_position": None, "by_position": None}
        return {
            "n_max": r.n_max,
            "draft_n": r.draft_n,
            "draft_n_accepted": r.draft_n_accepted,
            "acceptance": None if r.acceptance is None else round(r.acceptance, 4),
            **positions,
            "predicted_n": r.predicted_n,
            "predicted_ms": round(r.predicted_ms, 3),
            "predicted_per_second": round(r.predicted_per_second, 3),
            "speedup": None if (s := self.speedup(r)) is None else round(s, 4),
            "text_sha256": r.text_sha256,
        }

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report (``n_max`` 0 is the run without MTP)."""
        return {
            "command": "bench",
            "model": self.model,
            "draft": self.draft,
            "server": self.server,
            "llama_cpp_build": self.llama_cpp_build,
            "server_args": list(self.server_args),
            "threads": list(self.threads),
            "prompts": self.prompts,
            "tokens": self.tokens,
            "runs": [self.run_dict(r) for r in self.runs],
            "sampling": self.sampling.fields() if self.sampling is not None else None,
            "lossless": None if self.sampling is not None else self.lossless,
            "differences": [d.describe() for d in self.differences],
            "recommended_n_max": self.recommended_n_max,
            "seconds": round(self.seconds, 3),
        }

    def table_row(self, r: BenchRun) -> tuple[str, str, str, str, str]:
        """``r``'s row of :meth:`table`: n-max, acceptance, tokens/s, speed-up, tokens."""
        acceptance = "-" if r.acceptance is None else f"{r.acceptance:.2f} ({r.draft_n_accepted}/{r.draft_n})"
        if r.n_max and r.acceptance is None:
            acceptance = "nothing drafted"
        speedup = self.speedup(r)
        return (
            "0 (no MTP)" if r.n_max == 0 else str(r.n_max),
            acceptance,
            f"{r.predicted_per_second:.1f}",
            "-" if speedup is None else f"{speedup:.2f}x",
            str(r.predicted_n),
        )

    def table(self) -> list[str]:
        """The measured table, one row per run."""
        rows = [("n-max", "acceptance", "tokens/s", "speed-up", "tokens"), *(self.table_row(r) for r in self.runs)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]

    def position_lines(self) -> list[str]:
        """Acceptance by draft position, one line per run whose server counted it."""
        lines = []
        for r in self.runs:
            if r.positions is not None and r.positions.drafts:
                rates = ", ".join(f"{rate:.2f}" for rate in r.positions.rates)
                lines.append(f"n-max {r.n_max}: acceptance by draft position {rates} (of {r.positions.drafts} "
                             "drafts, llama-server --metrics)")
        return lines

    def verdict_lines(self) -> list[str]:
        """The lossless verdict: sampled (not checked), lossless, or each difference."""
        if self.sampling is not None:
            return [f"sampled requests (temperature {self.sampling.temp:g}, seed {self.sampling.seed}), drafts "
                    f"verified by rejection ({SPEC_DRAFT_SAMPLING} probabilistic): the texts differ with and "
                    "without MTP, so losslessness is not checked token by token"]
        if self.lossless:
            return [f"lossless: every MTP run generated exactly the tokens of the run without MTP "
                    f"({self.prompts} prompts, up to {self.tokens} tokens each)"]
        return [f"NOT lossless: {d.describe()}" for d in self.differences]

    def recommendation_lines(self) -> list[str]:
        """The recommended n-max with its speed-up, MTP off, or nothing (not lossless)."""
        best = self.recommended_n_max
        if best:
            speedup = self.speedup(next(r for r in self.runs if r.n_max == best))
            return [f"recommended: --spec-type draft-mtp --spec-draft-n-max {best} ({speedup:.2f}x)"]
        if best == 0:
            return ["recommended: no MTP on this machine with these settings (no run was "
                    f"{(WORTHWHILE_SPEEDUP - 1) * 100:.0f}% faster)"]
        return []

    def describe(self) -> list[str]:
        """The table, the lossless verdict and the recommendation."""
        return [f"bench {self.model}" + (f" + {self.draft}" if self.draft else "")
                + f", measured with {self.llama_cpp_build or self.server}", *self.table(), *self.position_lines(),
                *self.verdict_lines(), *self.recommendation_lines()]


@dataclass(frozen=True)
class BenchRow:
    """One run of a ``bench --json`` report, as the model card shows it."""

    n_max: int
    draft_n: int
    draft_n_accepted: int
    predicted_n: int
    predicted_per_second: float

    @property
    def acceptance(self) -> float | None:
        """:func:`acceptance_rate` of the run."""
        return acceptance_rate(self.draft_n_accepted, self.draft_n)


@dataclass(frozen=True)
class BenchSummary:
    """A ``bench --json`` report read back (for ``publish --bench-json``): the table and its verdicts."""

    model: str
    draft: str | None
    rows: tuple[BenchRow, ...]
    lossless: bool
    recommended_n_max: int | None
    tokens: int
    prompts: int
    server_args: tuple[str, ...]

    def speedup(self, row: BenchRow) -> float | None:
        """:func:`speedup` of ``row`` over the run without MTP."""
        return speedup(row.predicted_per_second, next((r.predicted_per_second for r in self.rows if r.n_max == 0), 0.0))


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ParameterError(f"{key} = {value!r} is not what gguf-mtp bench --json writes", where)
    return value


def _bench_row(run: Any, where: str) -> BenchRow:
    """One run of a ``bench --json`` report, with counts that can be.

    Raises:
        ParameterError: not such a run (one line naming ``where``).
    """
    if not isinstance(run, Mapping):
        raise ParameterError("a run is not an object", where)
    rate = _field(run, "predicted_per_second", (int, float), where)
    row = BenchRow(
        n_max=_field(run, "n_max", int, where),
        draft_n=_field(run, "draft_n", int, where),
        draft_n_accepted=_field(run, "draft_n_accepted", int, where),
        predicted_n=_field(run, "predicted_n", int, where),
        predicted_per_second=float(rate),
    )
    if not 0 <= row.n_max <= MAX_N_MAX or not 0 <= row.draft_n_accepted <= row.draft_n or row.predicted_n < 0 \
            or not math.isfinite(row.predicted_per_second) or row.predicted_per_second < 0:
        raise ParameterError(f"the run with n_max {row.n_max} has impossible counts", where)
    return row


def _bench_rows(document: Mapping[str, Any], where: str) -> tuple[BenchRow, ...]:
    """The runs of a ``bench --json`` report: 2 to 1 + :data:`MAX_N_MAX`, n-max 0 first, then increasing.

    Raises:
        ParameterError: one line naming ``where``.
    """
    runs = _field(document, "runs", list, where)
    if not 2 <= len(runs) <= 1 + MAX_N_MAX:
        raise ParameterError(f"{len(runs)} runs, not 2 to {1 + MAX_N_MAX}", where)
    rows = tuple(_bench_row(run, where) for run in runs)
    if [r.n_max for r in rows] != sorted({r.n_max for r in rows}) or rows[0].n_max != 0:
        raise ParameterError("runs are not n_max 0 (without MTP) then increasing n-max", where)
    return rows


def _recommended_n_max(document: Mapping[str, Any], rows: Sequence[BenchRow], where: str) -> int | None:
    """The report's ``recommended_n_max``: none, or one of the measured n-max.

    Raises:
        ParameterError: one line naming ``where``.
    """
    recommended = document.get("recommended_n_max")
    if recommended is not None and (not isinstance(recommended, int) or isinstance(recommended, bool)
                                    or recommended not in {r.n_max for r in rows}):
        raise ParameterError(f"recommended_n_max = {recommended!r} is not a measured n-max", where)
    return recommended


def _server_args(document: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The report's ``server_args``: at most 256 strings.

    Raises:
        ParameterError: one line naming ``where``.
    """
    server_args = document.get("server_args", [])
    if not isinstance(server_args, list) or not all(isinstance(a, str) for a in server_args) \
            or len(server_args) > 256:
        raise ParameterError("server_args is not a list of strings", where)
    return tuple(server_args)


def parse_bench_json(document: Any, where: str) -> BenchSummary:
    """Check and read a ``gguf-mtp bench --json`` report (bounded: at most 1 + :data:`MAX_N_MAX` runs).

    Raises:
        ParameterError: not such a report (one line naming ``where``).
    """
    if not isinstance(document, Mapping) or document.get("command") != "bench":
        raise ParameterError("not a gguf-mtp bench --json report", where)
    rows = _bench_rows(document, where)
    recommended = _recommended_n_max(document, rows, where)
    model = _field(document, "model", str, where)
    draft = document.get("draft")
    server_args = _server_args(document, where)
    return BenchSummary(
        model=model,
        draft=draft if isinstance(draft, str) else None,
        rows=rows,
        lossless=_field(document, "lossless", bool, where),
        recommended_n_max=recommended,
        tokens=_field(document, "tokens", int, where),
        prompts=_field(document, "prompts", int, where),
        server_args=server_args,
    )
