"""``gguf-mtp accept --spec-draft-sampling probabilistic``: llama-server's acceptance when it samples the draft and
verifies it by rejection (llama.cpp b11434 and later), predicted as an expectation with an interval.

What the server does (b11434: ``common/speculative.cpp`` ``spec_retune`` and ``draft()``, ``common/sampling.cpp``
``common_sampler_sample_and_accept_n_rejection``, ``tools/server/server-context.cpp`` ``use_spec_rejection``):

* at a request temperature above 0 the head's draft token i is sampled from ``q_i``: the head's logits cut to their
  top 10, divided by the request's temperature, softmaxed (the draft sampler is top-k 10 then temperature);
* the target's ``p`` is its own sampler chain's distribution: top-k, top-p, min-p on the logits, then the
  temperature (llama-server's defaults 40, 0.95, 0.05);
* draft token ``x`` is kept with probability ``min(1, p(x) / q(x))``; on a rejection the target draws from
  ``max(0, p - q)`` renormalised and the step ends; when every drafted token is kept it draws one more from ``p``.
  ``draft_n`` / ``draft_n_accepted`` count as in greedy mode.

Rejection sampling keeps the text distributed as the target's own sampling, whatever the head does. So the
prediction samples texts from ``p`` (:func:`target_distribution`) and, along each, computes the chance that each
draft position is kept given the text token there and the earlier positions kept: ``P(keep | y) = min(p(y),
q(y)) / p(y)`` (:func:`keep_probability`; summed over ``y ~ p`` it is ``sum_x min(p(x), q(x))``), with ``q`` the head's
distribution when the earlier drafted tokens were the text's. A seeded Monte-Carlo then replays llama-server's
schedule (:func:`gguf_mtp.check.accept_schedule.replay`) with those keeps drawn, over every prompt at once: the mean
is the predicted acceptance, and ``mean ± z sd`` at :data:`CONFIDENCE` the interval one server run falls in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist, fmean, pstdev

import numpy as np

from gguf_mtp.errors import ParameterError
from gguf_mtp.llama_build import LlamaCppBuild
from gguf_mtp.llama_server import SPEC_DRAFT_SAMPLING, offers_probabilistic, parse_help, probe_server
from gguf_mtp.model.drafting import RequestSampling

from .accept_schedule import Limits, column_sums, replay

__all__ = [
    "CONFIDENCE", "DRAFT_TOP_K", "Distribution", "SampledRun", "SampledText", "Sampling", "check_probabilistic_support",
    "draft_distribution", "keep_probability", "simulate", "target_distribution",
]

#: The draft sampler's top-k in probabilistic mode (b11434 ``spec_retune``: top-k 10, then the temperature).
DRAFT_TOP_K = 10
#: The share of one server run's outcomes the reported interval holds.
CONFIDENCE = 0.999


@dataclass(frozen=True)
class Sampling(RequestSampling):
    """The requests' sampling, and the prediction's own Monte-Carlo, seeded by the requests' seed: ``draws`` texts
    sampled per prompt, each replayed ``replicates`` times."""

    draws: int = 8
    replicates: int = 400

    def check(self) -> None:
        """Raises :class:`ParameterError` for a value llama-server would not sample with, or a Monte-Carlo too small
        or too large to run."""
        super().check()
        if not (1 <= self.draws <= 1000 and 1 <= self.replicates <= 100_000):
            raise ParameterError("draws must be 1..1000 and replicates 1..100000", parameter="draws")

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Distribution:
    """A sampler's output: the candidate tokens and their probabilities (summing to 1)."""

    ids: np.ndarray
    probs: np.ndarray

    def of(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.ids[min(int(np.searchsorted(np.cumsum(self.probs), rng.random() * self.probs.sum())),
                                self.ids.size - 1)])


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return np.asarray(e / e.sum(), dtype=np.float64)


def target_distribution(logits: np.ndarray, sampling: RequestSampling) -> Distribution:
    """llama-server's default chain on ``logits``: top-k, top-p, min-p (on the untempered logits), temperature."""
    ids = np.argsort(-logits, kind="stable")
    if sampling.top_k > 0:
        ids = ids[: sampling.top_k]
    kept = logits[ids].astype(np.float64)
    if sampling.top_p < 1:
        cut = int(np.searchsorted(np.cumsum(_softmax(kept)), sampling.top_p)) + 1  # the first sum >= top_p
        ids, kept = ids[:cut], kept[:cut]
    if sampling.min_p > 0:
        keep = kept >= kept.max() + math.log(sampling.min_p)
        ids, kept = ids[keep], kept[keep]
    return Distribution(ids, _softmax(kept / sampling.temp))


def draft_distribution(logits: np.ndarray, temp: float) -> Distribution:
    """The head's ``q`` in probabilistic mode: its top :data:`DRAFT_TOP_K` logits at the request's temperature."""
    ids = np.argsort(-logits, kind="stable")[:DRAFT_TOP_K]
    return Distribution(ids, _softmax(logits[ids].astype(np.float64) / temp))


def keep_probability(p: Distribution, q: Distribution, token: int) -> float:
    """The chance a draft position is kept given that the text's token there is ``token`` (drawn from ``p``):
    ``min(p, q)(token) / p(token)``. The server keeps draft ``x ~ q`` with ``min(1, p(x)/q(x))``, so it emits
    ``token`` through a keep with probability ``min(p, q)(token)`` and through the residual with ``(p - q)+``."""
    p_y = p.of(token)
    return min(1.0, q.of(token) / p_y) if p_y > 0 else 0.0


@dataclass(frozen=True)
class SampledText:
    """One text sampled from the target for one prompt, and the keep probabilities along it: ``keeps[j][i]`` for
    draft position ``i + 1`` of the step whose last accepted token is ``tokens[j]``."""

    tokens: tuple[int, ...]
    keeps: tuple[tuple[float, ...], ...]
    eog_at: int | None


@dataclass(frozen=True)
class SampledRun:
    """The simulated server runs at one n-max, summed over the prompts: means and the spread."""

    n_max: int
    draft_n: float  #: expected drafted tokens
    draft_n_accepted: float  #: expected accepted tokens
    acceptance_mean: float | None  #: mean of accepted / drafted over the simulated runs
    acceptance_sd: float
    interval: tuple[float, float] | None  #: where one run's accepted / drafted falls, at :data:`CONFIDENCE`

    def holds(self, acceptance: float) -> bool:
        """Whether a measured ``draft_n_accepted / draft_n`` lies in the interval."""
        return self.interval is not None and self.interval[0] <= acceptance <= self.interval[1]

    def to_dict(self) -> dict[str, object]:
        return {"n_max": self.n_max, "draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted,
                "acceptance": self.acceptance_mean, "acceptance_sd": self.acceptance_sd,
                "interval": list(self.interval) if self.interval else None, "confidence": CONFIDENCE}


def _drawn_chains(text: SampledText, rng: np.random.Generator) -> list[list[int]]:
    """Draft chains whose matching prefix with the text is the number of positions kept, drawn from ``keeps``."""
    chains = []
    for j, keeps in enumerate(text.keeps):
        kept = 0
        while kept < len(keeps) and rng.random() < keeps[kept]:
            kept += 1
        chains.append([*text.tokens[j + 1 : j + 1 + kept], *([-1] * (len(keeps) - kept))])  # -1 is no token
    return chains


def _prompt_runs(texts: Sequence[SampledText], limit: Limits, drafted_max: int, runs: int,
                 rng: np.random.Generator) -> list[tuple[int, int]]:
    """``runs`` simulated requests of one prompt, ``(draft_n_accepted, draft_n)`` each: text ``r mod draws``, the
    keeps drawn, llama-server's schedule replayed."""
    out = []
    for r in range(runs):
        text = texts[r % len(texts)]
        run = replay(text.tokens, _drawn_chains(text, rng), drafted_max,
                     Limits(limit.prompt_tokens, limit.n_predict, limit.n_ctx, text.eog_at))
        out.append((run.draft_n_accepted, run.draft_n))
    return out


def _ratio(accepted: int, drafted: int) -> float:
    return accepted / drafted if drafted else 0.0


def _summed_over_prompts(per_prompt: Sequence[Sequence[tuple[int, int]]]) -> list[tuple[int, ...]]:
    """Run i of every prompt summed into run i of the whole set: ``(draft_n_accepted, draft_n)`` each."""
    return [column_sums(column) for column in zip(*per_prompt, strict=True)]


def simulate(texts: Sequence[Sequence[SampledText]], limits: Sequence[Limits], n_max: int, drafted_max: int,
             sampling: Sampling) -> SampledRun:
    """Simulate ``draws x replicates`` server requests of every prompt (:func:`_prompt_runs`) and sum them over the
    prompts into runs.

    The mean comes from prompts drawn independently. The spread does not: one server run sends every prompt with
    the same seed, so its prompts' outcomes can move together (they do on a head whose keep chances are alike
    everywhere). The spread is taken where they move together completely: each prompt's simulated requests sorted
    by acceptance and summed rank by rank (the comonotone coupling, the widest a sum of given marginals can be).

    Args:
        texts: per prompt, its sampled texts.
        limits: per prompt, its bounds (``eog_at`` is taken from each text).
        n_max: the n-max reported; ``drafted_max`` the draft length llama.cpp uses for it.
        sampling: the seed, the draws and the replicates.
    """
    runs = sampling.replicates * sampling.draws
    per_prompt = [_prompt_runs(prompt_texts, limit, drafted_max, runs, np.random.default_rng([sampling.seed, n_max, i]))
                  for i, (prompt_texts, limit) in enumerate(zip(texts, limits, strict=True))]
    independent = _summed_over_prompts(per_prompt)
    together = _summed_over_prompts([sorted(p, key=lambda ad: _ratio(*ad)) for p in per_prompt])
    if not any(d for _, d in independent):
        return SampledRun(n_max, 0.0, 0.0, None, 0.0, None)
    mean = fmean(_ratio(a, d) for a, d in independent)
    sd = pstdev([_ratio(a, d) for a, d in together])
    z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
    return SampledRun(n_max, fmean(d for _, d in independent), fmean(a for a, _ in independent), mean, sd,
                      (max(0.0, mean - z * sd), min(1.0, mean + z * sd)))


def check_probabilistic_support(build: LlamaCppBuild | None) -> None:
    """Refuse probabilistic drafting where the chosen llama.cpp lacks it: the embedded 0c1e570 (its
    ``common/arg.cpp`` has no ``--spec-draft-sampling``), or a build whose llama-server's ``--help`` does not list
    ``--spec-draft-sampling probabilistic`` (the mode lives in llama.cpp's ``common``, not in ``libllama``).

    Raises:
        ParameterError: one line naming the llama.cpp and what it lacks.
        LlamaServerError: the build's llama-server does not run.
    """
    if build is None:
        raise ParameterError(f"spec-draft-sampling probabilistic: the llama.cpp llama-cpp-python ships (0c1e570) has "
                             f"no probabilistic drafting (no {SPEC_DRAFT_SAMPLING}); name a newer build (b11434 or "
                             "later) with --llama-cpp PATH", parameter="spec_draft_sampling")
    if build.server is None:
        raise ParameterError(f"spec-draft-sampling probabilistic: this build has no llama-server, whose --help would "
                             f"say whether it has {SPEC_DRAFT_SAMPLING}", build.folder, "spec_draft_sampling")
    if not offers_probabilistic(parse_help(probe_server(str(build.server)))):
        raise ParameterError(f"spec-draft-sampling probabilistic: this llama-server's --help has no "
                             f"'{SPEC_DRAFT_SAMPLING} probabilistic' (b11434 or later has it)", build.server,
                             "spec_draft_sampling")
