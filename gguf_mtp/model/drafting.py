"""What every measure of how well a head drafts shares: ``bench`` (llama-server, :mod:`gguf_mtp.server`), ``accept``
and ``verify --acceptance`` (llama.cpp's graphs, :mod:`gguf_mtp.check`) ask the same of the same model, under the
same bounds, with the same thread pools; so the rules live here, once, below both.

* the model check (:func:`check_model`): an MTP head to measure (a NextN block, or a sidecar given as the draft), a
  tokenizer llama-server can use (:func:`tokenizer_refusal`), the training context;
* the request bounds: every count option with its range (:data:`COUNT_OPTIONS`, :func:`check_count_options`), the
  draft lengths (:data:`MAX_N_MAX`, :func:`check_n_max`), the counts read back (:data:`MAX_COUNT`), and the sampled
  requests (:class:`RequestSampling`);
* the thread pools of an MTP run, the trunk's and the head's (:class:`Threads`, :func:`pool_share`,
  :func:`shared_threads`).

The prompts they send are :mod:`gguf_mtp.model.prompts`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gguf_mtp.errors import NoNextNBlockError, ParameterError
from gguf_mtp.format.header import GGUFHeader

from .blocks import is_mtp_only, read_block_layout
from .shards import ShardSet, open_model

__all__ = [
    "COUNT_OPTIONS",
    "MAX_COUNT",
    "MAX_N_MAX",
    "MAX_TOKENS",
    "SEED",
    "BenchModel",
    "RequestSampling",
    "Threads",
    "check_count_options",
    "check_model",
    "check_n_max",
    "pool_share",
    "shared_threads",
    "tokenizer_refusal",
]

#: The fixed sampling seed of every request (greedy decoding does not use it; it keeps runs comparable anyway).
SEED = 42

#: The largest n-max measured: llama.cpp takes any, but drafting more than this is never faster.
MAX_N_MAX = 16

#: The most tokens one request may ask for (bench's and accept's --tokens).
MAX_TOKENS = 1 << 16
#: The most threads llama.cpp runs: ggml.h's GGML_MAX_N_THREADS (more crash it; thousands only crawl).
MAX_THREADS = 512
#: The most layers offloaded: far above any model's (llama.cpp offloads every layer for any larger value).
MAX_GPU_LAYERS = 1 << 16
#: The largest slot context asked for: far above any model's training context (which caps it anyway).
MAX_CONTEXT = 1 << 24

#: Every count option of bench and accept, with its range (lowest, highest); checked by
#: :func:`check_count_options` and nowhere else.
COUNT_OPTIONS: dict[str, tuple[int, int]] = {
    "tokens": (1, MAX_TOKENS),
    "threads": (1, MAX_THREADS),
    "n_gpu_layers": (0, MAX_GPU_LAYERS),
    "ctx_size": (8, MAX_CONTEXT),
}

#: The most any count read from llama-server may be (tokens, drafts): far above any run, and exact as a float.
MAX_COUNT = 2**48

_NO_TOKENIZER = ("no_vocab", "none")


def check_count_options(**values: int | None) -> None:
    """Refuse a count option outside its :data:`COUNT_OPTIONS` range (``None``: not given, nothing to check).

    Raises:
        ParameterError: one line naming the option and its range.
    """
    for name, value in values.items():
        low, high = COUNT_OPTIONS[name]
        if value is not None and not low <= value <= high:
            raise ParameterError(f"{name} {value}: give {low} to {high}", parameter=name)


def check_n_max(n_max: Sequence[int]) -> None:
    """Refuse an empty list of draft lengths, or one outside 1 to :data:`MAX_N_MAX`.

    Raises:
        ParameterError: one line.
    """
    if not n_max or any(not 1 <= n <= MAX_N_MAX for n in n_max):
        raise ParameterError(f"n_max: draft lengths from 1 to {MAX_N_MAX}", parameter="n_max")


@dataclass(frozen=True)
class RequestSampling:
    """Sampled requests, as llama-server's ``/completion`` takes them (its defaults but the temperature), for
    ``--spec-draft-sampling probabilistic``: above temperature 0 the server samples the draft and verifies it by
    rejection (b11434 ``server-context.cpp``, ``use_spec_rejection``)."""

    temp: float
    seed: int = SEED
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05

    def check(self) -> None:
        """Raises :class:`ParameterError` for a value that does not sample by rejection."""
        if not (math.isfinite(self.temp) and 0 < self.temp <= 100):
            raise ParameterError("temp: probabilistic drafting needs a temperature above 0 (at 0 llama-server "
                                 "verifies greedily: leave --spec-draft-sampling greedy), at most 100",
                                 parameter="temp")
        if not (0 < self.top_p <= 1 and 0 <= self.min_p < 1 and 0 <= self.top_k <= MAX_COUNT):
            raise ParameterError(f"top-p must be in (0, 1], min-p in [0, 1), top-k in [0, {MAX_COUNT}]",
                                 parameter="top_p")
        if not 0 <= self.seed < 1 << 32:
            raise ParameterError("seed must be 0..2^32-1", parameter="seed")

    def fields(self) -> dict[str, Any]:
        """The ``/completion`` fields that sample."""
        return {"temperature": self.temp, "seed": self.seed, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p}


@dataclass(frozen=True)
class BenchModel:
    """What a measure of the head needs to know of the model before starting anything."""

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


def _nextn_blocks(target: ShardSet, draft: str | os.PathLike[str] | None) -> int:
    """The NextN blocks that will draft: the model's own, or the sidecar's when one is given.

    Raises:
        NoNextNBlockError: none there.
    """
    if draft is None:
        if target.nextn_predict_layers == 0:
            raise NoNextNBlockError(
                "no NextN (MTP) block (nextn_predict_layers = 0) and no draft: compose one in, or give the "
                "MTP-only sidecar as draft",
                target.name,
                "draft",
            )
        return target.nextn_predict_layers
    sidecar = open_model(draft)
    if sidecar.nextn_predict_layers == 0:
        raise NoNextNBlockError("draft has no NextN (MTP) block", sidecar.name, "draft")
    return sidecar.nextn_predict_layers


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
    nextn = _nextn_blocks(target, draft)
    context = target.get(target.arch_key("{arch}.context_length"))
    return BenchModel(
        path=target.name,
        draft=None if draft is None else os.fspath(draft),
        nextn=nextn,
        context_length=context if isinstance(context, int) and context > 0 else None,
    )


@dataclass(frozen=True)
class Threads:
    """The thread counts of a bench: ``arguments`` bench adds (empty when the user chose), the threads the trunk's
    and the head's pools use in an MTP run, and the free cores they were sized to."""

    arguments: tuple[str, ...]
    draft_arguments: tuple[str, ...]
    trunk: int | None
    head: int | None
    free: int

    @property
    def oversubscribed(self) -> bool:
        """The user's thread counts give the two pools of an MTP run more threads than there are free cores
        (one thread each, the least there is, never counts as too many)."""
        return not self.arguments and self.trunk is not None and self.head is not None \
            and self.trunk + self.head > max(2, self.free)

    def warning(self, remedy: str) -> str | None:
        """The warning for :attr:`oversubscribed` counts (``None`` when they fit); ``remedy`` says how to give
        fewer."""
        if not self.oversubscribed:
            return None
        return (f"threads: an MTP run's two thread pools hold {self.trunk} + {self.head} threads for {self.free} "
                f"free core(s): it may run many times slower than it would with fewer ({remedy})")

    def describe(self, flags: str) -> str:
        """The progress line saying the counts: chosen (``flags`` is how the user gives their own) or given."""
        if not self.arguments:
            return f"threads: as given ({self.free} free core(s))"
        return (f"threads: {' '.join((*self.arguments, *self.draft_arguments))} in every run (an MTP run's two "
                f"thread pools, the trunk's and the head's, get half of the {self.free} free core(s) each, at least "
                f"1; give {flags} to choose)")


def pool_share(free: int) -> int:
    """The threads each of an MTP run's two pools gets of ``free`` cores when the user chose none: half, at
    least 1 (with every core in both, each pool waits on the other)."""
    return max(1, free // 2)


def shared_threads(given: int | None, free: int, flag: str) -> Threads:
    """The threads of a process whose trunk and MTP head pools take one count (``gguf-mtp accept``'s llama.cpp
    child, ``flag`` its option): ``given`` as the user chose it, else :func:`pool_share` of ``free``."""
    if given is not None:
        return Threads((), (), given, given, free)
    each = pool_share(free)
    return Threads((flag, str(each)), (), each, each, free)
