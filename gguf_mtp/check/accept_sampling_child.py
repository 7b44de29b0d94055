"""The llama.cpp side of ``accept --spec-draft-sampling probabilistic`` (see :mod:`gguf_mtp.check.accept_sampling`):
per prompt, ``draws`` texts sampled from the target's own sampler chain, and along each the chance that every draft
position is kept.

Per text: the continuation is sampled one decode per token (as llama-server samples without MTP; rejection sampling
keeps that distribution); one batched trunk pass gives the rows the MTP graph takes; one batched MTP pass gives the
head's first-draft distribution at every position; for deeper draft positions the head's chain is run with the
text's own tokens as the drafted ones (the only drafts whose keep matters: a position is judged only when the ones
before it were kept, and a kept token is the text's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .accept_child import _Runner
from .accept_sampling import Distribution, Sampling, draft_distribution, keep_probability, target_distribution
from .accept_schedule import draft_room

__all__ = ["SamplingRunner"]


class SamplingRunner(_Runner):
    """The greedy child's runner, sampling: it keeps the head's distributions of its batched MTP pass."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__(request)
        self.sampling = Sampling(**request["sampling"])
        self.head_q: list[Distribution] = []

    def _logits(self, ctx: Any, i: int) -> np.ndarray:
        return np.array(np.ctypeslib.as_array(self.llama.llama_get_logits_ith(ctx, i), shape=(self.n_vocab,)))

    def _argmax(self, ctx: Any, i: int) -> int:
        logits = self._logits(ctx, i)
        if ctx is self.dft:  # the batched MTP pass asks for every scored position in order
            self.head_q.append(draft_distribution(logits, self.sampling.temp))
        return int(np.argmax(logits))

    def sample_text(self, prompt: list[int], n: int, rng: np.random.Generator) -> tuple[list[int], list[Distribution]]:
        """``n`` tokens sampled from the target's chain after ``prompt``, and the distribution of each."""
        dists = [target_distribution(self._logits(self.tgt, self._decode_prompt(prompt)), self.sampling)]
        out = [dists[-1].sample(rng)]
        while len(out) < n:
            self.tgt_batch.fill([out[-1]], len(prompt) + len(out) - 1, 0, [True])
            self._decode(self.tgt, self.tgt_batch, "the sampled generation")
            dists.append(target_distribution(self._logits(self.tgt, 0), self.sampling))
            out.append(dists[-1].sample(rng))
        return out, dists

    def forced_chain(self, tokens: list[int], rows: np.ndarray, p0: int, first_row: np.ndarray,
                     length: int) -> list[Distribution]:
        """The head's distributions for draft positions 2..``length`` from position ``p0`` when the drafted tokens
        are the text's own (``tokens[p0 + 1]``...): :meth:`chain` with the drafted tokens given."""
        llama, ext = self.llama, self.ext
        mem = llama.llama_get_memory(self.dft)
        temp = self.sampling.temp
        found: list[Distribution] = []
        llama.llama_memory_seq_rm(mem, 1, -1, -1)
        if self.chained:
            chain_rows = [rows[p0 - 1] if p0 > 0 else np.zeros(self.n_embd, dtype=np.float32), first_row]
            llama.llama_memory_seq_cp(mem, 0, 1, 0, p0)
            for head in range(1, length):
                llama.llama_memory_seq_rm(mem, 1, p0, -1)
                ext.llama_set_nextn_layer_offset(self.dft, head)
                prefix = tokens[p0 : p0 + head + 1]
                self.dft_batch.fill(prefix, p0, 1, [i == head for i in range(head + 1)], np.stack(chain_rows))
                self._decode(self.dft, self.dft_batch, f"a draft chain (NextN block {head})")
                found.append(draft_distribution(self._logits(self.dft, head), temp))
                chain_rows.append(self._row(head))
            ext.llama_set_nextn_layer_offset(self.dft, 0)
        else:
            llama.llama_memory_seq_cp(mem, 0, 1, 0, p0 + 1)
            row = first_row
            for step in range(1, length):
                self.dft_batch.fill([tokens[p0 + step]], p0 + step, 1, [True], row[None, :])
                self._decode(self.dft, self.dft_batch, "a draft chain")
                found.append(draft_distribution(self._logits(self.dft, 0), temp))
                row = self._row(0)
        llama.llama_memory_seq_rm(mem, 1, -1, -1)
        return found

    def score(self, name: str, prompt: list[int], n: int, n_predict: int, k_max: int) -> dict[str, Any]:
        """The prompt's ``draws`` sampled texts with their keep probabilities (the parent's ``SampledText``)."""
        start = len(prompt)
        draws = []
        for draw in range(self.sampling.draws):
            rng = np.random.default_rng([self.sampling.seed, draw])
            text, dists = self.sample_text(prompt, n, rng)
            tokens = prompt + text
            rows, _ = self.trunk_pass(tokens[:-1], start - 1)
            self.head_q.clear()
            _, head_rows = self.mtp_pass(tokens, rows, start)
            keeps = []
            for j in range(n):
                # as the greedy child: the longest draft a step from text[j] may make
                length = min(k_max, draft_room(self.n_ctx, start + j, n_predict - (j + 1)))
                qs = [self.head_q[j]][:length]
                if length > 1:
                    qs += self.forced_chain(tokens, rows, start + j, head_rows[j], length)
                keeps.append([keep_probability(dists[j + 1 + i], q, text[j + 1 + i]) for i, q in enumerate(qs)])
            draws.append({"tokens": text, "keeps": keeps, "eog_at": self.first_eog(text)})
        return {"name": name, "prompt_tokens": len(prompt), "draws": draws}
