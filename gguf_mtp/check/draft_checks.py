"""The checks ``verify`` runs on an MTP-only file (a draft) instead of a composite's byte comparisons.

A draft is one of two things (:func:`gguf_mtp.model.blocks.is_mtp_only`): a *bare* draft (NextN block
tensors only, what ``convert`` writes for ``compose``), which takes its token embedding and output head
from its target inside the composite; or a *sidecar* (``convert --standalone``, ``extract --standalone``,
llama.cpp's own ``--mtp`` export), which also carries ``token_embd``/``output_norm`` (and ``output``,
unless the head is tied to the embedding) and which llama.cpp loads beside its target as the drafter
(``llama-server -m TARGET --spec-draft-model SIDECAR``).

:func:`draft_globals_check` says which one a file is and whether those tensors fit its own metadata
(``{arch}.embedding_length``, the vocabulary size); :func:`target_fit_check` says whether the draft
fits a given target: architecture, embedding width, the same shapes of ``token_embd``/``output`` and
the same vocabulary (token count, and the token list itself by its sha256 where both carry one).
Both return the problems found (each one line) and what a passing check reports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from gguf_mtp.constants import DRAFT_GLOBAL_TENSORS, KEY_ARCHITECTURE, KEY_EMBEDDING_LENGTH, KEY_TOKENS
from gguf_mtp.format.header import GGUFHeader, TensorInfo
from gguf_mtp.model.arch_rules import sidecar_needs
from gguf_mtp.model.shards import ShardSet, vocab_size

__all__ = ["DraftGlobals", "draft_globals_check", "target_fit_check", "tokens_digest"]

TOKEN_EMBD, OUTPUT_NORM, OUTPUT = DRAFT_GLOBAL_TENSORS
_TOKENIZER_MODEL = "tokenizer.ggml.model"


@dataclass(frozen=True)
class DraftGlobals:
    """What :func:`draft_globals_check` found: its verdict, and whether llama.cpp can load the file alone."""

    problems: tuple[str, ...]
    detail: str
    sidecar: bool  # carries token_embd and output_norm: llama.cpp loads it as a drafter


def _tensors(headers: Sequence[GGUFHeader]) -> dict[str, TensorInfo]:
    return {t.name: t for h in headers for t in h.tensors}


def _describe(tensor: TensorInfo) -> str:
    return f"{tensor.name} {tensor.type_name} {list(tensor.shape)}"


def _dims(shape: Sequence[int]) -> list[int]:
    """A shape without trailing dimensions of 1 (ggml drops them: ``[n, 1]`` is ``[n]``)."""
    dims = list(shape)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return dims


def draft_globals_check(first: GGUFHeader, headers: Sequence[GGUFHeader]) -> DraftGlobals:
    """Whether a draft's global tensors make it a sidecar llama.cpp can load, and fit its own metadata.

    A draft without any of them is a bare draft (fine, for ``compose``). Otherwise ``token_embd`` and
    ``output_norm`` must both be there (``token_embd`` alone where the architecture has no ``output_norm``:
    :func:`~gguf_mtp.model.arch_rules.sidecar_needs`); ``output`` may be left out (the head is then tied to the
    embedding, as llama.cpp loads it); ``token_embd`` and ``output`` are ``[embedding_length, vocabulary]``
    and ``output_norm`` is ``[embedding_length]``.
    """
    tensors = _tensors(headers)
    present = [name for name in DRAFT_GLOBAL_TENSORS if name in tensors]
    if not present:
        return DraftGlobals(
            (),
            "none: a draft for compose, which takes its target's token_embd/output_norm/output "
            "(gguf-mtp compose TARGET DRAFT -o OUTDIR)",
            sidecar=False,
        )
    arch = first.get(KEY_ARCHITECTURE)
    width_key = KEY_EMBEDDING_LENGTH.format(arch=arch)
    width, vocab = first.get(width_key), vocab_size(first)
    needed = sidecar_needs(arch if isinstance(arch, str) else None)
    problems = [
        f"carries {', '.join(present)} but no {name}: llama.cpp cannot load it as a drafter"
        for name in needed
        if name not in tensors
    ]
    if isinstance(width, int) and vocab is not None:
        problems += _global_shape_problems(tensors, present, width, vocab, width_key)
    else:
        problems += _unstated_size_problems(arch, width_key, width, vocab)
    detail = _globals_detail(tensors, present) + f"; {width_key} {width}, {vocab} tokens: loadable beside its " \
        "target as the drafter"
    return DraftGlobals(tuple(problems), detail, sidecar=all(name in tensors for name in needed))


def _globals_detail(tensors: dict[str, TensorInfo], present: Sequence[str]) -> str:
    """The global tensors a sidecar carries, and ``output``'s absence (tied to the embedding)."""
    shown = [_describe(tensors[name]) for name in present]
    if OUTPUT not in tensors:
        shown.append(f"no {OUTPUT} (tied to {TOKEN_EMBD})")
    return "; ".join(shown)


def _unstated_size_problems(arch: object, width_key: str, width: object, vocab: int | None) -> list[str]:
    """The sizes the global tensors' shapes are checked against, where the file does not state them."""
    problems = []
    if not isinstance(width, int):
        problems.append(f"states no {width_key}")
    if vocab is None:
        problems.append(f"states no vocabulary size ({arch}.vocab_size or {KEY_TOKENS})")
    return problems


def _global_shape_problems(
    tensors: dict[str, TensorInfo], present: Sequence[str], width: int, vocab: int, width_key: str
) -> list[str]:
    """The global tensors whose shapes the stated width and vocabulary do not make."""
    expected = {TOKEN_EMBD: [width, vocab], OUTPUT: [width, vocab], OUTPUT_NORM: [width]}
    problems = []
    for name in present:
        shape = _dims(tensors[name].shape)
        if shape != expected[name]:
            problems.append(f"{name} is {shape}, but {width_key} and the vocabulary make it {expected[name]}")
    return problems


def tokens_digest(header: GGUFHeader) -> str | None:
    """sha256 of the token list (``tokenizer.ggml.tokens``, each token's UTF-8 bytes then a NUL), or ``None``."""
    tokens = header.get(KEY_TOKENS)
    if not isinstance(tokens, list):
        return None
    digest = hashlib.sha256()
    for token in tokens:
        digest.update(str(token).encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def target_fit_check(target: ShardSet, first: GGUFHeader, headers: Sequence[GGUFHeader]) -> tuple[list[str], str]:
    """(problems, what matched) of a draft beside ``target``: the same architecture and embedding width,
    ``token_embd``/``output`` of the target's shapes (their types may differ: each model computes with its
    own), the same vocabulary size and, where both carry one, the same token list and tokenizer model."""
    arch, draft_arch = target.arch, first.get(KEY_ARCHITECTURE)
    if draft_arch != arch:
        return [f"the draft is for architecture {draft_arch!r}, the target is {arch!r}"], ""
    problems: list[str] = []
    matched: list[str] = []
    for fit in (_size_fit(target, first), _tokenizer_fit(target, first), _global_tensors_fit(target, headers)):
        problems += fit[0]
        matched += fit[1]
    return problems, "beside the target: " + ", ".join(matched)


def _size_fit(target: ShardSet, first: GGUFHeader) -> tuple[list[str], list[str]]:
    """(problems, matched): the embedding width and the vocabulary size."""
    problems: list[str] = []
    matched: list[str] = []
    width_key = KEY_EMBEDDING_LENGTH.format(arch=target.arch)
    width, draft_width = target.get(width_key), first.get(width_key)
    if width != draft_width:
        problems.append(f"{width_key} is {draft_width!r} in the draft, {width!r} in the target")
    else:
        matched.append(f"{width_key} {width}")
    target_vocab, draft_vocab = vocab_size(target), vocab_size(first)
    if target_vocab != draft_vocab:
        problems.append(f"the draft's vocabulary has {draft_vocab} tokens, the target's {target_vocab}")
    else:
        matched.append(f"{draft_vocab} tokens")
    return problems, matched


def _tokenizer_fit(target: ShardSet, first: GGUFHeader) -> tuple[list[str], list[str]]:
    """(problems, matched): the token list (by its sha256) and the tokenizer model, where both carry them."""
    problems: list[str] = []
    matched: list[str] = []
    ours, theirs = tokens_digest(first), tokens_digest(target.first)
    if ours is not None and theirs is not None:
        if ours != theirs:
            problems.append(f"{KEY_TOKENS} differ (sha256 {ours[:12]}… in the draft, {theirs[:12]}… in the target)")
        else:
            matched.append(f"the same token list (sha256 {ours[:12]}…)")
    model, target_model = first.get(_TOKENIZER_MODEL), target.get(_TOKENIZER_MODEL)
    if model is not None and target_model is not None and model != target_model:
        problems.append(f"{_TOKENIZER_MODEL} is {model!r} in the draft, {target_model!r} in the target")
    return problems, matched


def _global_tensors_fit(target: ShardSet, headers: Sequence[GGUFHeader]) -> tuple[list[str], list[str]]:
    """(problems, matched): ``token_embd``/``output`` of the target's shapes, where both carry them (their types
    may differ)."""
    problems: list[str] = []
    matched: list[str] = []
    draft_tensors = _tensors(headers)
    target_tensors = {name: tensor for name, (_, tensor) in target.tensor_locations.items()}
    for name in (TOKEN_EMBD, OUTPUT):
        ours_t, theirs_t = draft_tensors.get(name), target_tensors.get(name)
        if ours_t is None or theirs_t is None:
            continue
        if _dims(ours_t.shape) != _dims(theirs_t.shape):
            problems.append(f"{name} is {list(ours_t.shape)} in the draft, {list(theirs_t.shape)} in the target")
        elif ours_t.ggml_type != theirs_t.ggml_type:
            matched.append(f"{name} {list(ours_t.shape)} ({ours_t.type_name}; the target's is {theirs_t.type_name})")
        else:
            matched.append(f"{name} {list(ours_t.shape)} {ours_t.type_name}")
    return problems, matched
