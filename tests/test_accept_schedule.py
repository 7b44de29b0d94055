"""llama-server's draft-mtp schedule, replayed (``gguf_mtp.check.accept_schedule``): counts worked out by hand from
``server-context.cpp`` (``get_n_draft_max``, the verify step, ``process_token``'s stops)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gguf_mtp.check.accept_schedule import (
    Limits,
    Replay,
    draft_length,
    draft_room,
    first_draft_agreement,
    fitted_prompt_length,
    replay,
    total,
)

if TYPE_CHECKING:
    from gguf_mtp.check.accept_child import Generation

GREEDY = list(range(100, 200))


def perfect(k: int, n: int = 100) -> list[list[int]]:
    """Chains that draft exactly the greedy text."""
    return [GREEDY[j + 1 : j + 1 + k] for j in range(n)]


def wrong(k: int, n: int = 100) -> list[list[int]]:
    return [[0] * k for _ in range(n)]


def test_one_draft_token_always_accepted_drafts_until_one_token_is_left() -> None:
    # g=1 (from the prompt) -> 3 -> 5 -> 7 -> 9 (n_draft_max = n_remaining - 1 = 0) -> 10 without a draft
    run = replay(GREEDY, perfect(1), 1, Limits(prompt_tokens=5, n_predict=10, n_ctx=4096))
    assert (run.draft_n, run.draft_n_accepted, run.steps, run.generated, run.target_decodes) == (4, 4, 4, 10, 6)
    assert run.acceptance == 1.0 and run.accepted_per_pos == (4,) and run.drafted_per_pos == (4,)


def test_rejected_drafts_shrink_near_the_end_of_n_predict() -> None:
    # every step keeps no draft: 3 tokens drafted at g=1..6, then 2 (g=7), 1 (g=8), none (g=9)
    run = replay(GREEDY, wrong(3), 3, Limits(prompt_tokens=5, n_predict=10, n_ctx=4096))
    assert (run.draft_n, run.draft_n_accepted, run.steps, run.generated) == (21, 0, 8, 10)
    assert run.drafted_per_pos == (8, 7, 6) and run.accepted_per_pos == (0, 0, 0)


def test_full_acceptance_at_three_is_clipped_by_the_remaining_tokens() -> None:
    run = replay(GREEDY, perfect(3), 3, Limits(prompt_tokens=5, n_predict=10, n_ctx=4096))
    assert (run.draft_n, run.draft_n_accepted, run.steps, run.generated, run.target_decodes) == (6, 6, 2, 10, 4)
    assert run.tokens_per_step == 2.5


def test_the_context_bounds_the_draft_and_stops_generation() -> None:
    # prompt 5, context 12: step 1 drafts min(3, 12-5-2) = 3, all kept (g=5); step 2 may draft 12-9-2 = 1, kept,
    # and the first token it emits finds the slot full (9 + 1 + 1 + 1 >= 12): generation stops at 6 tokens
    run = replay(GREEDY, perfect(3), 3, Limits(prompt_tokens=5, n_predict=100, n_ctx=12))
    assert (run.draft_n, run.draft_n_accepted, run.generated) == (4, 4, 6)


def test_a_prompt_that_fills_the_context_gets_one_token() -> None:
    run = replay(GREEDY, perfect(3), 3, Limits(prompt_tokens=11, n_predict=100, n_ctx=12))
    assert (run.draft_n, run.generated, run.steps) == (0, 1, 0)


def test_an_end_of_generation_token_stops_after_the_step_that_emits_it() -> None:
    # the step from g=3 drafts 1 token, kept: it emits greedy[3], the EOG, and stops there
    run = replay(GREEDY, perfect(1), 1, Limits(prompt_tokens=5, n_predict=100, n_ctx=4096, eog_at=3))
    assert (run.draft_n, run.draft_n_accepted, run.generated) == (2, 2, 4)


def test_the_longest_matching_prefix_is_kept_and_counted_per_position() -> None:
    chains = perfect(3)
    chains[0] = [GREEDY[1], GREEDY[2], 0]  # two of three from g=1 -> g=4
    chains[3] = [GREEDY[4], 0, GREEDY[6]]  # a later match after a miss does not count -> g=6
    run = replay(GREEDY, chains, 3, Limits(prompt_tokens=5, n_predict=8, n_ctx=4096))
    # g=6: n_draft_max = 8-6-1 = 1: one draft, kept (g=8, done)
    assert (run.draft_n, run.draft_n_accepted, run.steps) == (7, 4, 3)
    assert run.drafted_per_pos == (3, 2, 2) and run.accepted_per_pos == (3, 1, 0)
    assert run.by_position() == (1.0, 0.5, 0.0)


def test_one_token_requests_draft_nothing() -> None:
    run = replay(GREEDY, perfect(3), 3, Limits(prompt_tokens=5, n_predict=1, n_ctx=4096))
    assert (run.draft_n, run.generated, run.acceptance, run.target_decodes) == (0, 1, None, 1)


def test_totals_add_up_per_position() -> None:
    a = replay(GREEDY, perfect(2), 2, Limits(5, 10, 4096))
    b = replay(GREEDY, wrong(2), 2, Limits(5, 10, 4096))
    both = total([a, b])
    assert both.draft_n == a.draft_n + b.draft_n and both.draft_n_accepted == a.draft_n_accepted
    assert both.drafted_per_pos == tuple(x + y for x, y in zip(a.drafted_per_pos, b.drafted_per_pos, strict=True))
    with pytest.raises(ValueError):
        total([a, replay(GREEDY, perfect(1), 1, Limits(5, 10, 4096))])


@pytest.mark.parametrize(
    ("greedy", "chains", "n_max", "limits", "message"),
    [
        (GREEDY, [[1]], 2, Limits(5, 10, 4096), "chain at position 0 has 1 tokens"),
        (GREEDY[:3], perfect(1), 1, Limits(5, 10, 4096), "greedy continuation has 3 tokens"),
        (GREEDY, perfect(1), 0, Limits(5, 10, 4096), "n_max"),
    ],
)
def test_inputs_that_cannot_be_replayed_are_refused(
    greedy: list[int], chains: list[list[int]], n_max: int, limits: Limits, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        replay(greedy, chains, n_max, limits)


def test_teacher_forced_agreement_counts_equal_positions() -> None:
    assert first_draft_agreement([1, 2, 3, 4], [1, 0, 3]) == (2, 3)
    assert Replay(1, 0, 0, 0, 1, 1, (0,), (0,)).by_position() == (None,)


def test_the_slot_context_is_rounded_up_to_256_and_capped_at_training() -> None:
    from gguf_mtp.check.accept import slot_context

    assert [slot_context(500, 4096), slot_context(512, 4096), slot_context(None, 4096), slot_context(9000, 4096),
            slot_context(300, None)] == [512, 512, 4096, 4096, 512]


@pytest.mark.parametrize(("n_max", "heads", "drafted"), [(1, 2, 1), (2, 2, 2), (3, 2, 2), (4, 3, 3), (16, 3, 3),
                                                         (3, 1, 3), (16, 1, 16)])
def test_a_chain_of_heads_drafts_at_most_one_token_per_block_and_a_single_head_n_max(n_max: int, heads: int,
                                                                                     drafted: int) -> None:
    assert draft_length(n_max, heads) == drafted


def test_a_prompt_that_fits_with_room_to_generate_is_kept_whole() -> None:
    assert fitted_prompt_length(100, 512, 64, 1) == 100
    assert fitted_prompt_length(445, 512, 64, 1) == 445  # 445 + 64 generated + 1 drafted + 2 = 512


def test_a_long_prompt_is_cut_to_leave_room_for_the_generation_and_a_draft() -> None:
    assert fitted_prompt_length(1050, 512, 64, 1) == 445
    assert fitted_prompt_length(1050, 512, 64, 3) == 443


def test_a_generation_longer_than_the_context_keeps_half_of_it_for_the_prompt() -> None:
    assert fitted_prompt_length(1050, 256, 512, 1) == 128
    assert fitted_prompt_length(5, 8, 512, 1) == 4


class FakeRunner:
    """The child's runner without llama.cpp: a 3-token prompt, a continuation of 4s, a head that drafts 4 (always
    right); it records the length of every draft chain it is asked for."""

    heads, chained, n_vocab, n_ctx = 1, False, 8, 512
    llama = None  # no llama-cpp-python module: the report names no build

    def __init__(self, request: dict[str, Any]) -> None:
        self.lengths: list[int] = []
        FakeRunner.last = self

    def tokenize(self, text: str) -> list[int]:
        return [1, 2, 3]

    def open_contexts(self, cells: int, *, drafts: int = 0) -> None:
        pass

    def speculative_greedy(self, prompt: list[int], n: int, k: int) -> Generation:
        import numpy as np

        from gguf_mtp.check.accept_child import Generation

        tokens = [*prompt, *[4] * n]
        return Generation(len(prompt), np.zeros((len(tokens), 1)), tokens, [4] * n, [np.zeros(1)] * n)

    def chain(self, tokens: list[int], rows: Any, p0: int, first: int, first_row: Any, length: int) -> list[int]:
        self.lengths.append(length)
        return [4] * length

    def first_eog(self, tokens: list[int]) -> None:
        return None


def run_child(monkeypatch: pytest.MonkeyPatch, runner: type[FakeRunner], **request: Any) -> dict[str, Any]:
    from gguf_mtp.check import accept_child

    monkeypatch.setattr(accept_child, "_Runner", runner)
    return accept_child.run({"prompts": [["p", "x"]], "mode": "greedy", "tokens": 16, "n_ctx": 512, "threads": 1,
                             "n_gpu_layers": 0} | request)


def test_the_child_builds_no_chain_longer_than_the_blocks_of_a_chain_of_heads(monkeypatch: pytest.MonkeyPatch,
                                                                              capsys: pytest.CaptureFixture[str]
                                                                              ) -> None:
    # llama.cpp aborts (nextn_layer_offset out of range) when asked for a block past the last one
    class TwoBlocks(FakeRunner):
        heads, chained = 2, True

    report = run_child(monkeypatch, TwoBlocks, k_max=3, n_max=[3])
    capsys.readouterr()
    lengths = FakeRunner.last.lengths
    assert max(lengths) == 2 and all(len(chain) <= 2 for chain in report["prompts"][0]["chains"])


def test_draft_room_near_the_end_of_n_predict_is_the_tokens_left_but_one() -> None:
    assert draft_room(n_ctx=4096, prompt_tokens=10, remaining=3) == 2


def test_draft_room_near_a_full_slot_keeps_two_cells() -> None:
    assert draft_room(n_ctx=100, prompt_tokens=90, remaining=50) == 8


def test_draft_room_is_none_rather_than_negative() -> None:
    assert (draft_room(n_ctx=100, prompt_tokens=99, remaining=50), draft_room(n_ctx=4096, prompt_tokens=1,
                                                                             remaining=0)) == (0, 0)


def test_the_child_drafts_chains_only_where_a_replayed_step_starts(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # an always-right head at n-max 3 over 16 tokens: steps start after tokens 0, 4, 8 and 12 (that one drafts 2,
    # the end of n_predict, from the same chain); n-max 1 needs first drafts only, which the MTP pass gives
    report = run_child(monkeypatch, FakeRunner, k_max=3, n_max=[1, 3])
    capsys.readouterr()
    assert FakeRunner.last.lengths == [3, 3, 3, 3]
    chains = report["prompts"][0]["chains"]
    assert [j for j, chain in enumerate(chains) if len(chain) == 3] == [0, 4, 8, 12]
    assert all(chain == [4] for j, chain in enumerate(chains) if j not in (0, 4, 8, 12))
