"""The llama.cpp side of ``gguf-mtp accept``: a child process that runs the trunk and the MTP head as llama.cpp's
draft-mtp does (``common/speculative.cpp``, ``common_speculative_impl_draft_mtp``) and prints what it drafted.

Run as ``python -m gguf_mtp.check.accept_child`` with a JSON request on stdin (see :func:`main`); it prints JSON
lines on stdout (:func:`gguf_mtp.check.llama_check.emit_report`), the last one with ``"stage": "done"``. It runs
in a child because a failed GGML assert aborts the whole process (the parent, :mod:`gguf_mtp.check.accept`, then
names the stage and shows llama.cpp's last log lines).

Per prompt, in greedy mode:

1. the trunk's greedy continuation of ``tokens`` tokens, one decode per token (as llama-server without MTP);
2. one batched trunk pass over prompt + continuation with ``llama_set_embeddings_nextn(ctx, true, false)``: the
   hidden row ``h_p`` the MTP graph takes, for every position (and the trunk's batched argmax, which must equal the
   one-token greedy choice: a difference is a near tie, reported);
3. one batched pass of the MTP context over the pairs (token ``p``, row ``p - 1``), the first token paired with a
   zero row (draft-mtp's initial ``pending_h``): its argmax at position ``p`` is the first draft token when token
   ``p`` is the last accepted one; for chained heads (more than one NextN block) each block decodes the pairs in
   turn (``llama_set_nextn_layer_offset``), as ``process()`` does;
4. for ``k_max > 1``, the rest of each chain in a second sequence that shares the first's cache up to the start:
   a single head is re-fed its own output row with the token it drafted; a chain of heads decodes the whole draft
   prefix again under head ``i`` for draft token ``i + 1``.

In text mode the text is scored as it is (teacher forcing): steps 2 and 3 only, with the trunk's argmax at every
position as the reference.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .accept_schedule import draft_length, draft_room, fitted_prompt_length
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

    def open_contexts(self, cells: int) -> None:
        """The trunk and MTP contexts, ``cells`` tokens long (plus room for the chains)."""
        llama = self.llama
        self.tgt = self._context(llama.LLAMA_CONTEXT_TYPE_DEFAULT, self.model, seqs=1, cells=cells)
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

    def _context(self, ctx_type: int, model: Any, *, seqs: int, cells: int) -> Any:
        llama = self.llama
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = cells + CHAIN_ROOM
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

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """The trunk's greedy continuation: the prompt in chunks, then one decode per token."""
        self._clear(self.tgt)
        out: list[int] = []
        for start in range(0, len(prompt), CHUNK):
            part = prompt[start : start + CHUNK]
            last = start + len(part) == len(prompt)
            self.tgt_batch.fill(part, start, 0, [last and i == len(part) - 1 for i in range(len(part))])
            self._decode(self.tgt, self.tgt_batch, "the prompt's decode")
        out.append(self._argmax(self.tgt, len(part) - 1))
        while len(out) < n:
            self.tgt_batch.fill([out[-1]], len(prompt) + len(out) - 1, 0, [True])
            self._decode(self.tgt, self.tgt_batch, "the greedy generation")
            out.append(self._argmax(self.tgt, 0))
        return out

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

    def mtp_pass(self, tokens: list[int], rows: np.ndarray, score_from: int) -> tuple[list[int], np.ndarray]:
        """The MTP context over (token p, row p - 1): the first draft token from each position ``score_from`` and
        later, and the head's own output row there (what a single head is re-fed)."""
        llama = self.llama
        self._clear(self.dft)
        mem = llama.llama_get_memory(self.dft)
        shifted = np.vstack([np.zeros((1, self.n_embd), dtype=np.float32), rows])[: len(tokens)]
        firsts: list[int] = []
        head_rows = np.empty((max(len(tokens) - score_from, 0), self.n_embd), dtype=np.float32)
        for start in range(0, len(tokens), CHUNK):
            part = tokens[start : start + CHUNK]
            wanted = [start + i >= score_from for i in range(len(part))]
            # every token an output: in masked mode llama.cpp copies the first n_outputs rows of the graph's
            # h_nextn, which holds one row per token (so rows match outputs only when every token is one)
            self.dft_batch.fill(part, start, 0, [True] * len(part), shifted[start : start + len(part)])
            for head in range(self.heads if self.chained else 1):
                if self.chained:
                    llama.llama_memory_seq_rm(mem, 0, start, -1)
                    self.ext.llama_set_nextn_layer_offset(self.dft, head)
                self._decode(self.dft, self.dft_batch, f"the batched MTP pass (NextN block {head})")
                if head == 0:
                    for i in range(len(part)):
                        if wanted[i]:
                            firsts.append(self._argmax(self.dft, i))
                            head_rows[start + i - score_from] = self._row(i)
        if self.chained:
            self.ext.llama_set_nextn_layer_offset(self.dft, 0)
        return firsts, head_rows

    def chain(self, tokens: list[int], rows: np.ndarray, p0: int, first: int, first_row: np.ndarray,
              length: int) -> list[int]:
        """The draft chain from position ``p0`` (``tokens[p0]`` the last accepted token): ``first`` (from the batched
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


def _score_greedy(runner: _Runner, name: str, prompt: list[int], n: int, n_predict: int, k_max: int
                  ) -> dict[str, Any]:
    """Generate ``n`` tokens (``n_predict``, or what fits the context) and the draft chains a step may need."""
    clock = time.perf_counter()
    seconds: dict[str, float] = {}

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[phase] = round(now - clock, 4)
        clock = now

    greedy = runner.greedy(prompt, n)
    lap("greedy")
    text_tokens = prompt + greedy
    rows, batched = runner.trunk_pass(text_tokens[:-1], len(prompt) - 1)
    disagreements = sum(1 for a, b in zip(batched, greedy, strict=True) if a != b)
    lap("trunk_pass")
    start = len(prompt)  # greedy[0] sits at this position
    firsts, head_rows = runner.mtp_pass(text_tokens, rows, start)
    lap("mtp_pass")
    chains: list[list[int]] = []
    for j in range(n):
        # greedy[j] is the last accepted token: at position start + j, with j + 1 tokens generated
        length = min(k_max, draft_room(runner.n_ctx, start + j, n_predict - (j + 1)))
        if length <= 0:
            chains.append([])
        elif length == 1:
            chains.append([firsts[j]])
        else:
            chains.append(runner.chain(text_tokens, rows, start + j, firsts[j], head_rows[j], length))
    lap("chains")
    return {"name": name, "prompt_tokens": len(prompt), "greedy": greedy, "chains": chains,
            "eog_at": runner.first_eog(greedy), "batched_disagreements": disagreements, "seconds": seconds}


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


class _Prompt(NamedTuple):
    """A prompt as the child scores it: its tokens (cut to fit, with ``fit``), the tokens to generate, and its length
    before the cut, if it was cut."""

    name: str
    tokens: list[int]
    generate: int
    cut_from: int | None


def _fitted(runner: _Runner, request: dict[str, Any], name: str, text: str, k_max: int) -> _Prompt:
    """``text`` tokenized, cut to fit the context when the request says ``fit``, with what to generate after it.

    Raises:
        Refusal: too few tokens to score, or more than the context holds (llama-server refuses such a request).
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


def _score(runner: Any, request: dict[str, Any], prompt: _Prompt, k_max: int) -> dict[str, Any]:
    """One prompt scored in the request's mode (greedy, text or sampled), with its cut; ``runner`` is
    :func:`_runner`'s (a sampling runner in sampled mode)."""
    if request["mode"] == "text":
        scored = _score_text(runner, prompt.name, prompt.tokens)
    elif request["mode"] == "sampled":
        scored = runner.score(prompt.name, prompt.tokens, prompt.generate, request["tokens"], k_max)
    else:
        scored = _score_greedy(runner, prompt.name, prompt.tokens, prompt.generate, request["tokens"], k_max)
    return scored | {"cut_from": prompt.cut_from}


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Score every prompt of ``request``; the report the parent reads (see :mod:`gguf_mtp.check.accept`)."""
    report: dict[str, Any] = {"prompts": []}
    emit_report({}, "load")
    try:
        runner = _runner(request)
    except (Refusal, BindingError) as e:
        return report | {"refused": str(e)}
    report |= {"heads": runner.heads, "chained": runner.chained, "n_vocab": runner.n_vocab,
               "llama_cpp_build": build_of(runner.llama), "llama_cpp_library": library_of(runner.llama)}
    k_max = draft_length(request["k_max"], runner.heads)  # a longer chain would ask for a block that is not there
    try:
        prompts = [_fitted(runner, request, name, text, k_max) for name, text in request["prompts"]]
    except Refusal as e:
        return report | {"refused": str(e)}
    runner.open_contexts(max(len(p.tokens) + p.generate + 1 for p in prompts))
    for prompt in prompts:
        emit_report({"prompt": prompt.name}, "score")
        report["prompts"].append(_score(runner, request, prompt, k_max))
    return report


def main() -> int:
    """The child: a JSON request on stdin (``model``, ``draft``, ``prompts`` as ``[name, text]`` pairs, ``mode``
    ``greedy``, ``text`` or ``sampled`` (with ``sampling``, :mod:`gguf_mtp.check.accept_sampling_child`),
    ``tokens``, ``k_max``, ``n_ctx``, ``threads``, ``n_gpu_layers``, ``fit``: cut a prompt to what fits the
    context); JSON lines out."""
    request = json.loads(sys.stdin.read())
    report = run(request)
    sys.stdout.write(json.dumps(report | {"stage": "done"}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
