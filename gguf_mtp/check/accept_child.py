"""The llama.cpp side of ``gguf-mtp accept``: a child process that runs the trunk and the MTP head as llama.cpp's
draft-mtp does (``common/speculative.cpp``, ``common_speculative_impl_draft_mtp``) and prints what it drafted.

Run as ``python -m gguf_mtp.check.accept_child`` with a JSON request on stdin (see :func:`main`); it prints JSON
lines on stdout (:func:`gguf_mtp.check.llama_check.emit_report`), the last one with ``"stage": "done"``. It runs
in a child because a failed GGML assert aborts the whole process (the parent, :mod:`gguf_mtp.check.accept`, then
names the stage and shows llama.cpp's last log lines).

Per prompt, in greedy mode, the trunk's greedy continuation of ``tokens`` tokens is generated as llama-server
generates it with draft-mtp at the largest n-max asked (:meth:`_Runner.speculative_greedy`):

1. the prompt in chunks, the trunk's hidden row ``h_p`` of every position kept
   (``llama_set_embeddings_nextn(ctx, true, false)``) and its argmax the first token;
2. per step, the MTP context decodes the pairs (token ``p``, row ``p - 1``) not yet decoded, the first token paired
   with a zero row (draft-mtp's initial ``pending_h``), as ``process()`` does; its argmax at the last accepted
   token's position is the first draft token; for chained heads (more than one NextN block) each block decodes
   the pairs in turn (``llama_set_nextn_layer_offset``);
3. the rest of the draft chain in a second sequence that shares the first's cache up to the start: a single head
   is re-fed its own output row with the token it drafted; a chain of heads decodes the whole draft prefix again
   under head ``i`` for draft token ``i + 1``;
4. the trunk verifies [last token, drafts...] in one batch and keeps the longest prefix equal to its own argmax,
   plus its own next token, and the rows of the kept positions; the rejected ones leave its cache.

Greedy verification is lossless: the text is the trunk's greedy text, made of the batches the server makes at
that n-max (not of one-token decodes, which may differ in the last bits), with one trunk decode per step rather
than per token. The replays at every n-max asked then draft chains only where one of their steps starts, and
reuse a longer chain drafted there (a shorter one is its prefix).

In text mode the text is scored as it is (teacher forcing): one batched trunk pass over it (the rows, and the
trunk's argmax at every position as the reference) and one batched MTP pass over its pairs (the first drafts).
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .accept_schedule import Limits, draft_length, draft_room, fitted_prompt_length, matching_prefix, replay
from .llama_check import (
    CONTEXT_PARAMS,
    MODEL_PARAMS,
    BindingError,
    build_of,
    emit_report,
    import_bindings,
    library_of,
    set_params,
)

__all__ = ["CHUNK", "main"]

#: Tokens per batch of the batched passes (with logits for each: CHUNK x n_vocab floats at a time).
CHUNK = 64
#: Context cells kept free beyond prompt + continuation for the draft chains.
CHAIN_ROOM = 32


class Refusal(Exception):
    """Bad input found in the child (a prompt longer than the context): reported, not a crash."""


@dataclass
class Generation:
    """One prompt's speculative greedy generation (:meth:`_Runner.speculative_greedy`): the text, and what its trunk
    and MTP decodes computed on the way, which the replays reuse."""

    prompt_tokens: int
    rows: np.ndarray  #: per position, the trunk's hidden row (from the batch that kept the token)
    tokens: list[int] = field(default_factory=list)  #: prompt + continuation
    #: per continuation index j, the first draft when token j is the last kept, and the head's output row there
    firsts: list[int] = field(default_factory=list)
    head_rows: list[np.ndarray] = field(default_factory=list)
    chains: dict[int, list[int]] = field(default_factory=dict)  #: per continuation index, the longest chain drafted
    fed: int = 0  #: the positions the MTP context has decoded

    @property
    def continuation(self) -> list[int]:
        """The generated tokens."""
        return self.tokens[self.prompt_tokens :]

    def drafted_from(self, j: int) -> list[int]:
        """The longest chain drafted from continuation index ``j``, or the first draft alone."""
        return self.chains.get(j, [self.firsts[j]])


def _previous_rows(rows: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The row of position p - 1 for each position p from ``start`` to ``stop``: what draft-mtp pairs token p with,
    a zero row for the first token (its initial ``pending_h``)."""
    if start > 0:
        return rows[start - 1 : stop - 1]
    return np.vstack([np.zeros((1, rows.shape[1]), dtype=np.float32), rows[: stop - 1]])


class _Batch:
    """A llama_batch of up to ``n`` tokens, optionally with one hidden row per token (the MTP graph's input)."""

    def __init__(self, llama: Any, n: int, n_embd: int | None) -> None:
        self.llama = llama
        self.n = n
        self.batch = llama.llama_batch_init(n, 0, 1)
        self.rows = (ctypes.c_float * (n * n_embd))() if n_embd else None
        self.n_embd = n_embd or 0

    def fill(self, tokens: Sequence[int], first_pos: int, seq: int, logits: Sequence[bool],
             rows: np.ndarray | None = None) -> None:
        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i] = int(token)
            batch.pos[i] = first_pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if logits[i] else 0
        if rows is not None and self.rows is not None:
            flat = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1)
            ctypes.memmove(self.rows, flat.ctypes.data, flat.nbytes)
            batch.embd = ctypes.cast(self.rows, ctypes.POINTER(ctypes.c_float))
        else:
            batch.embd = None

    def free(self) -> None:
        self.batch.embd = None  # ours, not llama_batch_init's
        self.llama.llama_batch_free(self.batch)


class _Runner:
    """The loaded model(s), the trunk and MTP contexts, and the passes of the module docstring."""

    def __init__(self, request: dict[str, Any]) -> None:
        llama = import_bindings()
        self.llama, self.ext = llama, llama.llama_cpp_ext
        llama.llama_backend_init()
        self.model = self._load(request["model"], mtp=request.get("draft") is None, ngl=request["n_gpu_layers"])
        self.mtp_model = self.model if request.get("draft") is None else self._load(
            request["draft"], mtp=True, ngl=request["n_gpu_layers"])
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.n_embd = llama.llama_model_n_embd_out(self.model)
        self.heads = llama.llama_model_n_layer_nextn(self.mtp_model)
        if self.heads < 1:
            raise Refusal("the model has no NextN block llama.cpp loads")
        if llama.llama_model_n_embd_out(self.mtp_model) != self.n_embd:
            raise Refusal("the draft's row width differs from the model's")
        self.chained = self.heads > 1  # draft-mtp: chain_heads = n_mtp_layers > 1 (no memory-shared head here)
        self.n_ctx = int(request["n_ctx"])  # the server slot's context: the limit of a prompt + continuation
        self.threads = int(request["threads"])
        self.offload = int(request["n_gpu_layers"])

    def open_contexts(self, cells: int, *, drafts: int = 0) -> None:
        """The trunk and MTP contexts, ``cells`` tokens long (plus room for the chains); the trunk's rolls back
        up to ``drafts`` rejected tokens of a recurrent state in place, as llama-server asks for draft-mtp
        (``n_rs_seq = n_max``)."""
        llama = self.llama
        self.tgt = self._context(llama.LLAMA_CONTEXT_TYPE_DEFAULT, self.model, seqs=1, cells=cells, rollback=drafts)
        self.dft = self._context(llama.LLAMA_CONTEXT_TYPE_MTP, self.mtp_model, seqs=2, cells=cells)
        self._want_nextn_rows(self.tgt, masked=False)
        self._want_nextn_rows(self.dft, masked=True)
        self.tgt_batch = _Batch(llama, CHUNK, None)
        self.dft_batch = _Batch(llama, max(CHUNK, CHAIN_ROOM), self.n_embd)

    def _want_nextn_rows(self, ctx: Any, *, masked: bool) -> None:
        """Have ``ctx`` hand out the hidden rows the MTP graph takes (``masked``: only the output tokens' rows), as
        draft-mtp's constructor does, and re-plan its compute graph for that."""
        self.ext.llama_set_embeddings_nextn(ctx, True, masked)
        # llama.cpp plans a context's graph memory when it creates it, with these rows off, and switching them on
        # asks for no new plan. Where that changes which tensors are outputs but not how many nodes the graph has
        # (qwen4exp's MTP graph: h_nextn is either every row or the out_ids rows, both computed anyway), ggml's
        # allocator keeps the stale plan and b11434 dies in ggml_gallocr_alloc_graph. llama-server escapes it because
        # draft-mtp's constructor also installs a backend sampler (llama_set_sampler), which asks for a new plan,
        # made at the first decode. Clearing the control vector, which none of these contexts has, asks for one and
        # changes nothing else.
        if self.llama.llama_set_adapter_cvec(ctx, None, 0, 0, -1, -1) != 0:
            raise RuntimeError("llama.cpp refused to re-plan a context's graph (llama_set_adapter_cvec)")

    def _load(self, path: str, *, mtp: bool, ngl: int) -> Any:
        llama = self.llama
        params = llama.llama_model_default_params()
        set_params(llama, params, MODEL_PARAMS | {"check_tensors": False})
        if ngl:
            params.n_gpu_layers = ngl
            params.split_mode = llama.LLAMA_SPLIT_MODE_LAYER
        params.load_mtp = mtp
        model = llama.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise Refusal(f"llama.cpp could not load {path}")
        return model

    def _context(self, ctx_type: int, model: Any, *, seqs: int, cells: int, rollback: int = 0) -> Any:
        llama = self.llama
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = cells + CHAIN_ROOM
        cparams.n_rs_seq = rollback
        cparams.n_batch = cparams.n_ubatch = max(CHUNK, CHAIN_ROOM)
        cparams.n_seq_max = seqs
        cparams.kv_unified = True  # the chains' sequence shares the cells of the text's
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.ctx_type = ctx_type
        set_params(llama, cparams, CONTEXT_PARAMS)
        if self.offload:
            cparams.offload_kqv = True
        ctx = llama.llama_init_from_model(model, cparams)
        if not ctx:
            raise Refusal("llama.cpp could not create a context")
        return ctx

    # ------------------------------------------------------------------------------------------- helpers

    def tokenize(self, text: str) -> list[int]:
        llama = self.llama
        data = text.encode("utf-8")
        room = len(data) + 16
        buf = (llama.llama_token * room)()
        n = llama.llama_tokenize(self.vocab, data, len(data), buf, room, True, True)  # as llama-server does
        if n < 0:
            room = -n
            buf = (llama.llama_token * room)()
            n = llama.llama_tokenize(self.vocab, data, len(data), buf, room, True, True)
        return [int(buf[i]) for i in range(n)]

    def _decode(self, ctx: Any, batch: _Batch, what: str) -> None:
        rc = self.llama.llama_decode(ctx, batch.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}) during {what}")

    def _argmax(self, ctx: Any, i: int) -> int:
        logits = np.ctypeslib.as_array(self.llama.llama_get_logits_ith(ctx, i), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def _row(self, i: int) -> np.ndarray:
        """A copy of the MTP context's output row for batch entry ``i`` (what draft-mtp re-feeds)."""
        pointer = self.ext.llama_get_embeddings_nextn_ith(self.dft, i)
        return np.array(np.ctypeslib.as_array(pointer, shape=(self.n_embd,)), dtype=np.float32)

    def _clear(self, ctx: Any) -> None:
        self.llama.llama_memory_clear(self.llama.llama_get_memory(ctx), True)

    # ------------------------------------------------------------------------------------------- passes

    def _decode_prompt(self, prompt: list[int], rows: np.ndarray | None = None) -> int:
        """Decode ``prompt`` in the trunk context, in chunks, logits at its last token (the batch entry to read);
        ``rows``: keep each position's hidden row there."""
        self._clear(self.tgt)
        for start in range(0, len(prompt), CHUNK):
            part = prompt[start : start + CHUNK]
            last = start + len(part) == len(prompt)
            self.tgt_batch.fill(part, start, 0, [last and i == len(part) - 1 for i in range(len(part))])
            self._decode(self.tgt, self.tgt_batch, "the prompt's decode")
            if rows is not None:
                rows[start : start + len(part)] = self._trunk_rows(len(part))
        return len(part) - 1

    def _trunk_rows(self, n: int) -> np.ndarray:
        """The trunk context's hidden rows of its last batch's first ``n`` tokens (every token's: unmasked)."""
        return np.ctypeslib.as_array(self.ext.llama_get_embeddings_nextn(self.tgt), shape=(n, self.n_embd))

    def speculative_greedy(self, prompt: list[int], n: int, k: int) -> Generation:
        """The trunk's greedy continuation, ``n`` tokens, drafted by the head ``k`` tokens a step and verified in one
        trunk batch per step, as llama-server generates with draft-mtp at n-max ``k`` (greedy verification keeps
        the text: the drafts only save trunk decodes); and what it computed on the way (see :class:`Generation`)."""
        made = Generation(len(prompt), np.zeros((len(prompt) + n + k + 1, self.n_embd), dtype=np.float32), [*prompt])
        self._clear(self.dft)
        made.tokens.append(self._argmax(self.tgt, self._decode_prompt(prompt, made.rows)))
        while len(made.continuation) < n:
            p = len(made.tokens) - 1  # the last accepted token's position: not yet decoded by the trunk
            self._feed_mtp(made, p + 1)
            draft = self._draft(made, p, min(k, draft_room(self.n_ctx, p, n - len(made.continuation))))
            made.tokens += self._verify(made.tokens[p], draft, p, made.rows)
        self._feed_mtp(made, len(made.tokens))
        return made

    def _feed_mtp(self, made: Generation, end: int) -> None:
        """Decode the MTP context's pairs (token p, row p - 1) up to position ``end``, as draft-mtp's ``process()``
        does after each trunk batch; keep each position's first draft and the head's row."""
        for start in range(made.fed, end, CHUNK):
            stop = min(start + CHUNK, end)
            drafts, outputs = self._mtp_decode(made.tokens[start:stop], start, _previous_rows(made.rows, start, stop),
                                               keep_from=made.prompt_tokens)  # no step starts inside the prompt
            made.firsts += drafts
            made.head_rows += outputs
        made.fed = max(made.fed, end)

    def _draft(self, made: Generation, p: int, length: int) -> list[int]:
        """The head's draft of ``length`` tokens from position ``p`` (kept for the replays)."""
        if length <= 0:
            return []
        j = p - made.prompt_tokens
        first = made.firsts[j]
        draft = [first] if length == 1 else self.chain(made.tokens, made.rows, p, first, made.head_rows[j], length)
        made.chains[j] = draft
        return draft

    def _verify(self, last: int, draft: list[int], p: int, rows: np.ndarray) -> list[int]:
        """One trunk batch [``last``, draft...] at position ``p``: the accepted drafts and the trunk's own next
        token (``common_sampler_sample_and_accept_n``); the rejected positions leave the trunk's cache."""
        batch = [last, *draft]
        self.tgt_batch.fill(batch, p, 0, [True] * len(batch))
        self._decode(self.tgt, self.tgt_batch, "the greedy generation")
        choices = [self._argmax(self.tgt, i) for i in range(len(batch))]
        kept = matching_prefix(draft, choices)
        rows[p : p + kept + 1] = self._trunk_rows(kept + 1)
        if not self.llama.llama_memory_seq_rm(self.llama.llama_get_memory(self.tgt), 0, p + kept + 1, -1):
            raise RuntimeError("llama.cpp could not roll the rejected drafts back (llama_memory_seq_rm)")
        return [*draft[:kept], choices[kept]]

    def trunk_pass(self, tokens: list[int], score_from: int) -> tuple[np.ndarray, list[int]]:
        """Rows ``h_p`` for every position, and the trunk's argmax at positions ``score_from`` and later."""
        self._clear(self.tgt)
        rows = np.empty((len(tokens), self.n_embd), dtype=np.float32)
        choices: list[int] = []
        for start in range(0, len(tokens), CHUNK):
            part = tokens[start : start + CHUNK]
            wanted = [start + i >= score_from for i in range(len(part))]
            self.tgt_batch.fill(part, start, 0, wanted)
            self._decode(self.tgt, self.tgt_batch, "the batched trunk pass")
            h = self.ext.llama_get_embeddings_nextn(self.tgt)
            rows[start : start + len(part)] = np.ctypeslib.as_array(h, shape=(len(part), self.n_embd))
            choices += [self._argmax(self.tgt, i) for i in range(len(part)) if wanted[i]]
        return rows, choices

    def mtp_pass(self, tokens: list[int], rows: np.ndarray, score_from: int) -> tuple[list[int], list[np.ndarray]]:
        """The MTP context over (token p, row p - 1): the first draft token from each position ``score_from`` and
        later, and the head's own output row there (what a single head is re-fed)."""
        self._clear(self.dft)
        firsts: list[int] = []
        head_rows: list[np.ndarray] = []
        for start in range(0, len(tokens), CHUNK):
            stop = min(start + CHUNK, len(tokens))
            drafts, outputs = self._mtp_decode(tokens[start:stop], start, _previous_rows(rows, start, stop),
                                               keep_from=score_from)
            firsts += drafts
            head_rows += outputs
        return firsts, head_rows

    def _mtp_decode(self, part: list[int], start: int, part_rows: np.ndarray, *, keep_from: int
                    ) -> tuple[list[int], list[np.ndarray]]:
        """Decode the pairs (``part``, ``part_rows``) at positions ``start``... in the MTP context's sequence 0, each
        NextN block of a chain in turn as ``process()`` does; the first block's draft token and output row at each
        position from ``keep_from`` on."""
        llama = self.llama
        mem = llama.llama_get_memory(self.dft)
        # every token an output: in masked mode llama.cpp copies the first n_outputs rows of the graph's
        # h_nextn, which holds one row per token (so rows match outputs only when every token is one)
        self.dft_batch.fill(part, start, 0, [True] * len(part), part_rows)
        kept = range(max(keep_from - start, 0), len(part))
        drafts: list[int] = []
        outputs: list[np.ndarray] = []
        for head in range(self.heads if self.chained else 1):
            if self.chained:
                llama.llama_memory_seq_rm(mem, 0, start, -1)
                self.ext.llama_set_nextn_layer_offset(self.dft, head)
            self._decode(self.dft, self.dft_batch, f"the batched MTP pass (NextN block {head})")
            if head == 0:
                drafts = [self._argmax(self.dft, i) for i in kept]
                outputs = [self._row(i) for i in kept]
        if self.chained:
            self.ext.llama_set_nextn_layer_offset(self.dft, 0)
        return drafts, outputs

    def chain(self, tokens: list[int], rows: np.ndarray, p0: int, first: int, first_row: np.ndarray,
              length: int) -> list[int]:
        """The draft chain from position ``p0`` (``tokens[p0]`` the last accepted token): ``first`` (from the MTP
        pass) and ``length - 1`` more, in sequence 1, which shares sequence 0's cache below ``p0``."""
        llama, ext = self.llama, self.ext
        mem = llama.llama_get_memory(self.dft)
        drafted = [first]
        chain_rows = [rows[p0 - 1] if p0 > 0 else np.zeros(self.n_embd, dtype=np.float32), first_row]
        llama.llama_memory_seq_rm(mem, 1, -1, -1)
        if self.chained:
            llama.llama_memory_seq_cp(mem, 0, 1, 0, p0)
            for head in range(1, length):
                llama.llama_memory_seq_rm(mem, 1, p0, -1)
                ext.llama_set_nextn_layer_offset(self.dft, head)
                prefix = [tokens[p0], *drafted]
                self.dft_batch.fill(prefix, p0, 1, [i == len(prefix) - 1 for i in range(len(prefix))],
                                    np.stack(chain_rows))
                self._decode(self.dft, self.dft_batch, f"a draft chain (NextN block {head})")
                drafted.append(self._argmax(self.dft, len(prefix) - 1))
                chain_rows.append(self._row(len(prefix) - 1))
            ext.llama_set_nextn_layer_offset(self.dft, 0)
        else:
            llama.llama_memory_seq_cp(mem, 0, 1, 0, p0 + 1)
            row = first_row
            for step in range(1, length):
                self.dft_batch.fill([drafted[-1]], p0 + step, 1, [True], row[None, :])
                self._decode(self.dft, self.dft_batch, "a draft chain")
                drafted.append(self._argmax(self.dft, 0))
                row = self._row(0)
        llama.llama_memory_seq_rm(mem, 1, -1, -1)
        return drafted

    def first_eog(self, tokens: Sequence[int]) -> int | None:
        return next((i for i, t in enumerate(tokens) if self.llama.llama_vocab_is_eog(self.vocab, t)), None)


class _Chains:
    """The draft chains of a replay at one n-max (``chains[j]``: from continuation index ``j``), each computed on
    first use, or taken from a longer one already drafted there: only the steps' starting points cost decodes."""

    def __init__(self, runner: _Runner, made: Generation, n_max: int) -> None:
        self.runner, self.made, self.n_max = runner, made, n_max

    def __len__(self) -> int:
        return len(self.made.continuation)

    def __getitem__(self, j: int) -> list[int]:
        made = self.made
        chain = made.drafted_from(j)
        if len(chain) < self.n_max:
            chain = self.runner.chain(made.tokens, made.rows, made.prompt_tokens + j, made.firsts[j],
                                      made.head_rows[j], self.n_max)
            made.chains[j] = chain
        return chain[: self.n_max]


def _score_greedy(runner: _Runner, name: str, prompt: list[int], n: int, n_predict: int, n_maxes: Sequence[int]
                  ) -> dict[str, Any]:
    """Generate ``n`` tokens (``n_predict``, or what fits the context) and the draft chains the replays at
    ``n_maxes`` (already clipped to the blocks) start a step from: the parent replays them again over the same."""
    clock = time.perf_counter()
    seconds: dict[str, float] = {}

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[phase] = round(now - clock, 4)
        clock = now

    made = runner.speculative_greedy(prompt, n, max(n_maxes))
    greedy = made.continuation
    lap("greedy")
    limits = Limits(len(prompt), n_predict, runner.n_ctx, runner.first_eog(greedy))
    for k in sorted(set(n_maxes), reverse=True):  # the longest first: a shorter chain is its prefix
        replay(greedy, _Chains(runner, made, k), k, limits)
    chains = [made.drafted_from(j) for j in range(len(greedy))]
    lap("chains")
    return {"name": name, "prompt_tokens": len(prompt), "greedy": greedy, "chains": chains,
            "eog_at": limits.eog_at, "batched_disagreements": 0, "seconds": seconds}


def _score_text(runner: _Runner, name: str, tokens: list[int]) -> dict[str, Any]:
    rows, choices = runner.trunk_pass(tokens, 1)  # the trunk's own next token after each position from 1
    firsts, _ = runner.mtp_pass(tokens, rows, 1)
    return {"name": name, "tokens": len(tokens), "reference": choices, "firsts": firsts}


def _runner(request: dict[str, Any]) -> Any:
    """The runner of ``request``'s mode: :class:`_Runner`, or for ``sampled`` (``--spec-draft-sampling
    probabilistic``) :class:`gguf_mtp.check.accept_sampling_child.SamplingRunner`."""
    if request["mode"] == "sampled":
        from .accept_sampling_child import SamplingRunner  # it extends _Runner: imported here, not at the top

        return SamplingRunner(request)
    return _Runner(request)


@dataclass(frozen=True)
class _Prompt:
    """One prompt of the request, tokenized and fitted: what the child scores."""

    name: str
    tokens: list[int]
    generate: int  #: tokens to generate (none in text mode): no more than the context holds
    cut_from: int | None  #: its length before it was cut to fit, if it was


def _prompt(runner: Any, request: dict[str, Any], name: str, text: str, k_max: int) -> _Prompt:
    """``text`` tokenized as llama-server does, cut to fit when the request says so.

    Raises:
        Refusal: too few tokens to score, or more than the context takes.
    """
    text_mode = request["mode"] == "text"
    tokens = runner.tokenize(text)
    keep = fitted_prompt_length(len(tokens), runner.n_ctx, request["tokens"], k_max) if request.get("fit") \
        else len(tokens)
    cut_from = len(tokens) if keep < len(tokens) else None
    tokens = tokens[:keep]
    if len(tokens) < (3 if text_mode else 1):
        raise Refusal(f"{name}: too few tokens ({len(tokens)}) to score")
    if len(tokens) + 1 >= runner.n_ctx:  # llama-server refuses such a request
        raise Refusal(f"{name}: {len(tokens)} prompt tokens do not fit the context of {runner.n_ctx} (and leave room "
                      "for one more)")
    # the server stops at a full context: no more is generated than fits
    generate = 0 if text_mode else min(request["tokens"], runner.n_ctx - len(tokens))
    return _Prompt(name, tokens, generate, cut_from)


def _score(runner: Any, request: dict[str, Any], prompt: _Prompt, k_max: int, n_maxes: Sequence[int]
           ) -> dict[str, Any]:
    """One prompt's report in the request's mode."""
    if request["mode"] == "text":
        return _score_text(runner, prompt.name, prompt.tokens)
    if request["mode"] == "sampled":
        report: dict[str, Any] = runner.score(prompt.name, prompt.tokens, prompt.generate, request["tokens"], k_max)
        return report
    return _score_greedy(runner, prompt.name, prompt.tokens, prompt.generate, request["tokens"], n_maxes)


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Score every prompt of ``request``; the report the parent reads (see :mod:`gguf_mtp.check.accept`)."""
    report: dict[str, Any] = {"prompts": []}
    emit_report({}, "load")
    try:
        runner = _runner(request)
        report |= {"heads": runner.heads, "chained": runner.chained, "n_vocab": runner.n_vocab,
                   "llama_cpp_build": build_of(runner.llama), "llama_cpp_library": library_of(runner.llama)}
        k_max = draft_length(request["k_max"], runner.heads)  # a longer chain would ask for a block not there
        n_maxes = [draft_length(k, runner.heads) for k in request.get("n_max", [request["k_max"]])]
        prompts = [_prompt(runner, request, name, text, k_max) for name, text in request["prompts"]]
    except (Refusal, BindingError) as e:
        return report | {"refused": str(e)}
    runner.open_contexts(max(len(p.tokens) + p.generate + 1 for p in prompts),
                         drafts=max(n_maxes) if request["mode"] == "greedy" else 0)
    for prompt in prompts:
        emit_report({"prompt": prompt.name}, "score")
        report["prompts"].append(_score(runner, request, prompt, k_max, n_maxes) | {"cut_from": prompt.cut_from})
    return report


def main() -> int:
    """The child: a JSON request on stdin (``model``, ``draft``, ``prompts`` as ``[name, text]`` pairs, ``mode``
    ``greedy``, ``text`` or ``sampled`` (with ``sampling``, :mod:`gguf_mtp.check.accept_sampling_child`),
    ``tokens``, ``k_max``, ``n_max``: the draft lengths replayed (greedy mode; default ``[k_max]``), ``n_ctx``,
    ``threads``, ``n_gpu_layers``, ``fit``: cut a prompt to what fits the context); JSON lines out."""
    request = json.loads(sys.stdin.read())
    report = run(request)
    sys.stdout.write(json.dumps(report | {"stage": "done"}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
