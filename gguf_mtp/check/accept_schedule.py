"""The pure part of ``gguf-mtp accept``: llama-server's speculative schedule, replayed over a known greedy text.

No llama.cpp here. Given the trunk's greedy continuation of a prompt and, for every position of it, the chain of
tokens the MTP head drafts from there (computed by :mod:`gguf_mtp.check.accept_child`), :func:`replay` walks the
generation as llama-server (``tools/server/server-context.cpp`` of the reference llama.cpp) does with
``--spec-type draft-mtp``:

* the first token comes from the prompt's own decode (no draft);
* every later step drafts ``min(n_max, n_draft_max)`` tokens from the last accepted token, where
  ``n_draft_max`` is :func:`draft_room` (``server_slot::get_n_draft_max``: fewer drafts near the end of
  ``n_predict`` and of the slot's context; none when it is not positive);
* the trunk verifies the draft in one batch and keeps the longest prefix equal to its own greedy choices, plus one
  token of its own (``common_sampler_sample_and_accept_n``); ``draft_n`` grows by the drafted tokens,
  ``draft_n_accepted`` by the kept ones, and the per-position counter by one for each kept position;
* generation stops at an end-of-generation token, when ``n_predict`` tokens are out, or when the slot's context is
  full (``n_prompt_tokens + 1 >= n_ctx``), checked after every emitted token (``process_token``).

llama.cpp's draft-mtp asks for ``n_rs_seq = n_max`` on every context, so a rejected draft is rolled back in place
and the server never replays a step from a checkpoint: this module has no replay mode to model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["DraftChains", "Limits", "Replay", "draft_length", "draft_room", "first_draft_agreement",
           "fitted_prompt_length", "matching_prefix", "replay", "total"]


def draft_room(n_ctx: int, prompt_tokens: int, remaining: int) -> int:
    """The most tokens llama-server drafts in one step (``server_slot::get_n_draft_max``): ``min(n_ctx -
    prompt_tokens - 2, remaining - 1)``, with ``prompt_tokens`` the slot's tokens before the last accepted one and
    ``remaining`` the tokens ``n_predict`` still allows (the last accepted one included); none when not positive.
    The greedy and the sampling children size their draft chains by it, the replay its drafts."""
    return max(0, min(n_ctx - prompt_tokens - 2, remaining - 1))


class DraftChains(Protocol):
    """What :func:`replay` reads of the draft chains: a list of them, or chains drafted when first asked for."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Sequence[int]: ...


def draft_length(n_max: int, heads: int) -> int:
    """The most tokens llama.cpp's draft-mtp drafts per step for ``--spec-draft-n-max n_max`` with ``heads`` NextN
    blocks: a chain of heads (more than one block, as Step-3.5, MiMo-V2 and Hy3 ship) drafts token k with block k,
    so its n-max is clipped to the block count; a single head drafts ``n_max``. Source: ``common/speculative.cpp``,
    ``common_speculative_impl_draft_mtp``'s constructor (``chain_heads = n_mtp_layers > 1 && !is_mem_shared``, then
    ``n_max = std::min(n_max, n_mtp_layers)``; no family here shares the trunk's memory)."""
    return min(n_max, heads) if heads > 1 else n_max


def fitted_prompt_length(prompt_tokens: int, n_ctx: int, tokens: int, n_max: int) -> int:
    """How many of a prompt's first tokens to keep so that ``tokens`` more and a draft of ``n_max`` fit a slot of
    ``n_ctx`` (at least half the context stays the prompt's): for a check that needs a measure, not a given
    request (``verify --acceptance`` on a model with a small context)."""
    room = tokens + n_max + 2  # the server refuses a prompt that fills the slot and drafts less near its end
    return max(1, min(prompt_tokens, max(n_ctx - room, n_ctx // 2)))


@dataclass(frozen=True)
class Limits:
    """What bounds one request: the prompt's tokens, ``n_predict``, the slot's context, the first end-of-generation
    token of the greedy text (its index in the continuation), if any."""

    prompt_tokens: int
    n_predict: int
    n_ctx: int
    eog_at: int | None = None


@dataclass(frozen=True)
class Replay:
    """What llama-server would report for one request at one ``n_max`` (or the sum over several requests)."""

    n_max: int
    draft_n: int
    draft_n_accepted: int
    steps: int  #: verification steps (steps that drafted at least one token)
    generated: int  #: tokens generated (``predicted_n``)
    target_decodes: int  #: trunk decodes for the generated tokens: the prompt's, then one per step
    drafted_per_pos: tuple[int, ...]  #: drafts that reached position i (1st, 2nd... draft token)
    accepted_per_pos: tuple[int, ...]  #: of those, the accepted ones (the server's per-position counter)

    @property
    def acceptance(self) -> float | None:
        """``draft_n_accepted / draft_n``, or ``None`` when nothing was drafted."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @property
    def tokens_per_step(self) -> float | None:
        """Generated tokens per trunk decode (1.0 without speculative decoding)."""
        return self.generated / self.target_decodes if self.target_decodes else None

    def by_position(self) -> tuple[float | None, ...]:
        """Per draft position, the share of drafted tokens accepted (``None`` where none was drafted)."""
        return tuple(a / d if d else None for a, d in zip(self.accepted_per_pos, self.drafted_per_pos, strict=True))


def matching_prefix(draft: Sequence[int], truth: Sequence[int]) -> int:
    """How many of ``draft``'s first tokens equal ``truth``'s: what a greedy verification keeps."""
    n = 0
    for drafted, actual in zip(draft, truth, strict=False):
        if drafted != actual:
            break
        n += 1
    return n


def replay(greedy: Sequence[int], chains: DraftChains, n_max: int, limits: Limits) -> Replay:
    """Replay llama-server's draft-mtp schedule over ``greedy`` (the trunk's greedy continuation).

    Args:
        greedy: the continuation's tokens; ``greedy[0]`` is the token sampled from the prompt's decode.
        chains: ``chains[j]`` is what the head drafts when ``greedy[j]`` is the last accepted token: its i-th
            token guesses ``greedy[j + 1 + i]``. It needs at least ``n_max`` tokens where a step may start.
        n_max: the draft length (``--spec-draft-n-max``, already clipped to the head count for chained heads).
        limits: the request's bounds.

    Raises:
        ValueError: ``n_max`` below 1, a continuation shorter than the request needs, or a chain too short.
    """
    if n_max < 1:
        raise ValueError("n_max must be at least 1")
    if limits.n_predict < 1 or limits.prompt_tokens < 1:
        raise ValueError("a request generates at least one token from a prompt of at least one token")
    drafted = [0] * n_max
    accepted = [0] * n_max
    draft_n = draft_accepted = steps = 0
    decodes = 1  # the prompt's decode samples the first token
    generated = 0

    def emit(count: int, prompt_tokens: int) -> bool:
        """Emit ``count`` tokens (``process_token`` for each); False once generation stops."""
        nonlocal generated
        for _ in range(count):
            if generated >= len(greedy):
                raise ValueError(f"the greedy continuation has {len(greedy)} tokens; the request needs more")
            index = generated
            generated += 1
            if limits.eog_at is not None and index >= limits.eog_at:
                return False
            if prompt_tokens + 1 >= limits.n_ctx:
                return False
            if generated >= limits.n_predict:
                return False
        return True

    going = emit(1, limits.prompt_tokens)
    while going:
        last = generated - 1  # the last accepted token, not yet in the slot's prompt
        prompt_tokens = limits.prompt_tokens + last
        k = min(n_max, draft_room(limits.n_ctx, prompt_tokens, limits.n_predict - generated))
        a = 0
        if k:
            chain = chains[last] if last < len(chains) else ()
            if len(chain) < k:
                raise ValueError(f"the draft chain at position {last} has {len(chain)} tokens; the step needs {k}")
            a = matching_prefix(chain[:k], greedy[last + 1 : last + 1 + k])
            steps += 1
            draft_n += k
            draft_accepted += a
            for i in range(k):
                drafted[i] += 1
                accepted[i] += i < a
        decodes += 1
        going = emit(a + 1, prompt_tokens + 1 + a)
    return Replay(
        n_max=n_max,
        draft_n=draft_n,
        draft_n_accepted=draft_accepted,
        steps=steps,
        generated=generated,
        target_decodes=decodes,
        drafted_per_pos=tuple(drafted),
        accepted_per_pos=tuple(accepted),
    )


def _common_n_max(replays: Sequence[Replay]) -> int:
    """The ``n_max`` all of ``replays`` were made at.

    Raises:
        ValueError: no replays, or replays at different ``n_max``.
    """
    if not replays:
        raise ValueError("nothing to add up")
    n_max = replays[0].n_max
    if any(r.n_max != n_max for r in replays):
        raise ValueError("replays of different n_max")
    return n_max


def total(replays: Sequence[Replay]) -> Replay:
    """The sum of several requests' replays at the same ``n_max``."""
    draft_n, draft_n_accepted, steps, generated, target_decodes = column_sums(
        (r.draft_n, r.draft_n_accepted, r.steps, r.generated, r.target_decodes) for r in replays
    )
    return Replay(
        n_max=_common_n_max(replays),
        draft_n=draft_n,
        draft_n_accepted=draft_n_accepted,
        steps=steps,
        generated=generated,
        target_decodes=target_decodes,
        drafted_per_pos=column_sums(r.drafted_per_pos for r in replays),
        accepted_per_pos=column_sums(r.accepted_per_pos for r in replays),
    )


def column_sums(rows: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """Equally long rows of counts added up position by position (per draft position, per simulated run)."""
    return tuple(map(sum, zip(*rows, strict=True)))


def first_draft_agreement(reference: Sequence[int], drafts: Sequence[int]) -> tuple[int, int]:
    """(agreeing, scored): at how many positions the head's first draft equals ``reference`` (the trunk's own
    next-token choice at the same position, teacher-forced on a given text); no schedule."""
    scored = min(len(reference), len(drafts))
    return sum(1 for r, d in zip(reference, drafts, strict=False) if r == d), scored
