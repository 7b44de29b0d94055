"""A tiny glm4moe model whose MTP head agrees with its trunk on a known share of tokens: the test model of
``gguf-mtp accept`` (random weights accept ~0 % of drafts and prove nothing).

The model is a tiny glm4moe composite (:func:`gguf_mtp.testing.tiny_models.write_target`, F16 matrices, llama.cpp's
``test`` tokenizer) whose random tensors are then overwritten in place with three designed ones:

* ``token_embd``: token ``t`` is ``4 e_t`` (at width 256), a unit vector scaled well above the random blocks' noise
  (the vocabulary is as wide as the model);
* ``output``: ``output[cycle[t], t] = 1``: after token ``t`` the trunk's greedy choice is ``cycle[t]``, one cycle
  through the whole vocabulary, with a logit margin of about ``sqrt(n_embd)`` (the trunk's random blocks add only
  small noise to the residual ``e_t``, which ``output_norm`` scales to ``sqrt(n_embd)``);
* the NextN block's ``eh_proj``: it reads only the trunk's hidden row (the second half of its input), which after
  token ``t`` is about ``sqrt(n_embd) e_t``. For a *good* token ``t`` it maps ``e_t`` to ``e_cycle[t]``, so the head,
  which llama.cpp pairs with the row of the token before the one it predicts from, drafts ``cycle[cycle[t]]``: the
  trunk's own next choice. For a *bad* token it maps ``e_t`` to itself and drafts ``cycle[t]``, one step behind:
  always rejected. A share ``good_share`` of the tokens is good.

So along any greedy text the first draft token is accepted where the token two back is good; a second draft (the
head re-fed its own output row, as llama.cpp's draft-mtp does for a single head) where the next one is good too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from .server_models import with_test_tokenizer
from .tiny_models import GLM4MOE, TinyHparams, write_target

__all__ = ["CycleModel", "damage_head", "write_cycle_model"]

#: The designed model's dimensions: the vocabulary is as wide as the model (one unit vector per token).
HPARAMS = TinyHparams(n_embd=256, n_vocab=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=4, n_ff_exp=256,
                      n_ff_shexp=256, n_ff_dense=256)

#: The embedding of token ``t`` is this times ``e_t`` at width 256: the residual stream stays dominated by it. The
#: random blocks' noise per dimension grows with the width (two fan-ins), so wider models scale it, and ``eh_proj``,
#: by ``(n_embd / 256) ** 1.5``.
EMBEDDING_SCALE = 4.0


@dataclass(frozen=True)
class CycleModel:
    """The designed composite, the trunk's greedy cycle and the tokens the head gets right."""

    path: Path
    cycle: tuple[int, ...]  #: ``cycle[t]``: the trunk's greedy token after ``t``
    good: frozenset[int]  #: tokens after which the head drafts right (see the module docstring)


def _tensor(reader: GGUFReader, name: str) -> np.ndarray:
    for tensor in reader.tensors:
        if tensor.name == name:
            return tensor.data
    raise KeyError(name)


def write_cycle_model(
    out_dir: str | os.PathLike[str], *, good_share: float = 0.7, seed: int = 0, name: str = "cycle",
    hparams: TinyHparams = HPARAMS,
) -> CycleModel:
    """Write the designed glm4moe composite (with the ``test`` tokenizer) into ``out_dir``; see the module docstring.

    Args:
        out_dir: folder to write into (created if missing).
        good_share: the share of tokens after which the head drafts right.
        seed: the cycle's order, the good tokens and the random rest.
        name: the file stem.
        hparams: the dimensions (the vocabulary as wide as the model; larger ones make a benchmark model).
    """
    if hparams.n_vocab != hparams.n_embd:
        raise ValueError("the designed model needs a vocabulary as wide as the model (n_vocab == n_embd)")
    out = Path(out_dir)
    raw = write_target(out / f".{name}-raw", family=GLM4MOE, name=name, with_nextn=True, quant="F16",
                       hparams=hparams, seed=seed)
    path = with_test_tokenizer(raw, out / f"{name}.gguf")
    raw.unlink()
    raw.parent.rmdir()
    n = hparams.n_vocab
    scale = (n / 256) ** 1.5
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    cycle = np.empty(n, dtype=np.int64)
    cycle[order] = np.roll(order, -1)  # one cycle through every token
    good = rng.permutation(n)[: round(good_share * n)]
    reader = GGUFReader(path, "r+")
    embd = _tensor(reader, "token_embd.weight")  # numpy (n_vocab, n_embd)
    embd[:] = 0
    embd[np.arange(n), np.arange(n)] = EMBEDDING_SCALE * scale
    output = _tensor(reader, "output.weight")
    output[:] = 0
    output[cycle, np.arange(n)] = 1
    head = _tensor(reader, f"blk.{len(GLM4MOE.default_pattern)}.nextn.eh_proj.weight")  # (n_embd, 2 n_embd)
    head[:] = 0
    targets = np.arange(n)
    targets[good] = cycle[good]
    head[targets, n + np.arange(n)] = scale
    reader.data.flush()
    return CycleModel(path, tuple(int(t) for t in cycle), frozenset(int(t) for t in good))


def damage_head(path: str | os.PathLike[str], block: int | None = None) -> None:
    """Zero the NextN block's ``eh_proj`` in place (a dead head: it drafts the same token whatever it is shown)."""
    reader = GGUFReader(path, "r+")
    names = [t.name for t in reader.tensors if t.name.endswith("nextn.eh_proj.weight")]
    if block is not None:
        names = [f"blk.{block}.nextn.eh_proj.weight"]
    for tensor_name in names:
        _tensor(reader, tensor_name)[:] = 0
    reader.data.flush()
