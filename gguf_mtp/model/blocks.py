"""What a model's blocks are: the per-layer kinds of hybrid models and the tensors a NextN block needs.

Small tables of llama.cpp knowledge (from its ``src/models/*.cpp`` loaders), looked up by
``general.architecture``, in the spirit of gguf-py's own tables. Everything else is derived from the
metadata: ``{arch}.block_count``, ``{arch}.nextn_predict_layers`` and the per-layer arrays.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gguf.constants import GGUFValueType

from gguf_mtp.constants import (
    BLOCK_TENSOR,
    KEY_ARCHITECTURE,
    KEY_BLOCK_COUNT,
    KEY_NEXTN_PREDICT_LAYERS,
)
from gguf_mtp.errors import BadGGUFError
from gguf_mtp.format.header import GGUFHeader, KeyValue
from gguf_mtp.format.kv_edit import INT_RANGES

from .arch_rules import NextNValue, exact_length_arrays, extended_arrays, trunk_only_arrays

__all__ = [
    "LAYER_ARRAY_TYPES",
    "MAX_BLOCK_COUNT",
    "NEXTN_CORE_TENSORS",
    "BlockLayout",
    "block_index",
    "block_indices",
    "block_layout_problem",
    "block_tensor_problems",
    "constant_entry_problems",
    "is_mtp_only",
    "layer_array",
    "layer_kinds",
    "missing_nextn_by_block",
    "missing_nextn_tensors",
    "nextn_kind_problems",
    "nextn_required_tensors",
    "per_layer_keys",
    "per_layer_problems",
    "read_block_layout",
    "trunk_array_problems",
    "unextended_arrays",
]

#: The most blocks (``{arch}.block_count``) gguf-mtp accepts. llama.cpp itself reads per-layer values
#: for at most ``LLAMA_MAX_LAYERS`` = 512 layers, and the largest released models have under 200; the cap
#: is far above both (a future model is not refused for its size) and small enough that every loop over
#: blocks, and every per-layer list, stays cheap. A hostile ``2**32 - 1`` is refused before anything loops.
#: It is not bounded by the number of tensors: a vocab-only file has none, and an MTP-only draft
#: (llama.cpp's ``--mtp`` export) declares 88 trunk blocks without carrying a tensor of any of them.
MAX_BLOCK_COUNT = 65_536

#: Digits of the block number in ``blk.N.`` beyond which a name cannot be one of a real block (the int
#: conversion of a hostile 5,000-digit number would fail; anything of 10 digits is past the cap anyway).
_MAX_BLOCK_DIGITS = 10

#: Tensors every NextN graph in llama.cpp asserts (``eh_proj``, ``enorm``, ``hnorm``). Without
#: ``eh_proj`` some loaders silently treat the file as trunk-only, so a load alone proves nothing.
NEXTN_CORE_TENSORS = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")

_ATTENTION = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
#: ``attn_qkv.weight`` (fused) stands in for these three.
_SEPARATE_QKV = frozenset({"attn_q.weight", "attn_k.weight", "attn_v.weight"})
_FUSED_QKV = "attn_qkv.weight"

#: The other tensors an architecture's loader requires in each NextN block (optional ones left out).
_NEXTN_BLOCK_TENSORS: dict[str, tuple[str, ...]] = {
    # src/models/nemotron-h.cpp: one block folds an attention and a latent-MoE sub-layer.
    "nemotron_h_moe": (
        *_ATTENTION,
        "post_attention_norm.weight",
        "ffn_gate_inp.weight",
        "exp_probs_b.bias",
        "ffn_up_exps.weight",
        "ffn_down_exps.weight",
        "ffn_up_shexp.weight",
        "ffn_down_shexp.weight",
        "nextn.shared_head_norm.weight",
    ),
    # src/models/glm4-moe.cpp: a NextN block is an ordinary MoE block plus the NextN tensors.
    "glm4moe": (
        *_ATTENTION,
        "post_attention_norm.weight",
        "ffn_gate_inp.weight",
        "exp_probs_b.bias",
        "ffn_gate_exps.weight",
        "ffn_up_exps.weight",
        "ffn_down_exps.weight",
    ),
}

#: Hybrid architectures whose layer kinds follow from the per-layer arrays, and the pattern letter of
#: their feed-forward layers (``hybrid_override_pattern``: M = Mamba-2, * = attention, - = MLP, E = MoE).
_HYBRID_FFN_LETTER = {"nemotron_h": "-", "nemotron_h_moe": "E"}


def nextn_required_tensors(arch: str | None) -> tuple[str, ...]:
    """Name suffixes (after ``blk.N.``) a NextN block of ``arch`` must carry."""
    return NEXTN_CORE_TENSORS + _NEXTN_BLOCK_TENSORS.get(arch or "", ())


def missing_nextn_tensors(names: Collection[str], arch: str | None, block: int) -> list[str]:
    """The required NextN tensors of block ``block`` that are not among ``names`` (full names)."""
    prefix = f"blk.{block}."
    have = {name[len(prefix) :] for name in names if name.startswith(prefix)}
    return _missing(have, arch, prefix)


def _missing(have: Collection[str], arch: str | None, prefix: str) -> list[str]:
    missing = [suffix for suffix in nextn_required_tensors(arch) if suffix not in have]
    if _FUSED_QKV in have:
        missing = [suffix for suffix in missing if suffix not in _SEPARATE_QKV]
    return [prefix + suffix for suffix in missing]


def missing_nextn_by_block(names: Iterable[str], arch: str | None, blocks: Sequence[int]) -> dict[int, list[str]]:
    """:func:`missing_nextn_tensors` for every block of ``blocks`` at once, in one pass over ``names``
    (a model declaring thousands of NextN blocks costs one scan, not one per block)."""
    by_block: dict[int, set[str]] = {}
    for name in names:
        b = block_index(name)
        if b is not None and b in blocks:
            by_block.setdefault(b, set()).add(name.split(".", 2)[2])
    result = {}
    for b in blocks:
        missing = _missing(by_block.get(b, set()), arch, f"blk.{b}.")
        if missing:
            result[b] = missing
    return result


@dataclass(frozen=True)
class BlockLayout:
    """A model's blocks as its metadata states them, checked and bounded (:func:`read_block_layout`)."""

    arch: str
    block_count: int  # trunk + NextN blocks, at most MAX_BLOCK_COUNT
    nextn: int  # {arch}.nextn_predict_layers (0 when absent), at most block_count

    @property
    def trunk(self) -> int:
        """Blocks that are not NextN blocks: ``block_count - nextn``."""
        return self.block_count - self.nextn

    @property
    def nextn_blocks(self) -> range:
        """The NextN blocks: the last ``nextn`` of the ``block_count``."""
        return range(self.trunk, self.block_count)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def block_layout_problem(header: GGUFHeader) -> tuple[BlockLayout | None, str | None]:
    """(layout, None) when ``header`` states a usable block layout, else (None, what is wrong, one line).

    The one place where ``{arch}.block_count`` and ``{arch}.nextn_predict_layers`` are read: every
    command (inspect, verify, compose, extract, strip, graft) gets them bounded from here before any
    loop over blocks or any per-layer list is built.
    """
    arch = header.get(KEY_ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        return None, f"no {KEY_ARCHITECTURE} key"
    count_key, nextn_key = KEY_BLOCK_COUNT.format(arch=arch), KEY_NEXTN_PREDICT_LAYERS.format(arch=arch)
    count, nextn = header.get(count_key), header.get(nextn_key, 0)
    if not _is_int(count) or count < 0:
        return None, f"{count_key} is missing or not a non-negative integer ({count!r})"
    if count > MAX_BLOCK_COUNT:
        return None, (
            f"{count_key} = {count:,} is beyond any model (gguf-mtp accepts at most {MAX_BLOCK_COUNT:,} blocks; "
            "llama.cpp loads at most 512)"
        )
    if not _is_int(nextn) or not 0 <= nextn <= count:
        return None, f"{nextn_key} = {nextn!r} is not within 0..{count} (block_count)"
    return BlockLayout(arch, count, nextn), None


def read_block_layout(header: GGUFHeader) -> BlockLayout:
    """The block layout of ``header``, checked and bounded.

    Raises:
        BadGGUFError: no architecture, a ``block_count`` that is not an integer within
            0..:data:`MAX_BLOCK_COUNT`, or a ``nextn_predict_layers`` not within 0..block_count.
    """
    layout, problem = block_layout_problem(header)
    if layout is None:
        raise BadGGUFError(problem or "no block layout", header.path)
    return layout


def block_index(name: str) -> int | None:
    """The block number of a ``blk.N.*`` tensor name, else ``None`` (digits bounded: see above)."""
    match = BLOCK_TENSOR.match(name)
    if not match:
        return None
    digits = match["block"]
    return int(digits) if len(digits) <= _MAX_BLOCK_DIGITS else 10**_MAX_BLOCK_DIGITS


def block_indices(names: Iterable[str]) -> set[int]:
    """The block numbers that have at least one tensor among ``names``."""
    return {b for name in names if (b := block_index(name)) is not None}


def is_mtp_only(layout: BlockLayout, blocks: Collection[int]) -> bool:
    """Whether a model is an MTP-only file (a draft), not a model: it declares NextN blocks and carries
    block tensors, but none of a trunk block.

    That is the 18-tensor output of ``gguf-mtp convert`` (``blk.N`` after ``N`` empty trunk blocks, or
    ``blk.0`` of a one-block file), llama.cpp's own ``--mtp`` export, and a ``--standalone`` draft (which
    also carries ``token_embd``/``output``): llama.cpp loads such a file only as a speculative drafter
    (``--spec-draft-model``) beside its target, never as a model by itself.

    Args:
        layout: the file's block layout.
        blocks: the block numbers its tensors belong to (:func:`block_indices`).
    """
    return layout.nextn > 0 and bool(blocks) and min(blocks) >= layout.trunk


#: At most this many block numbers are spelled out in one message.
_SHOWN_BLOCKS = 3


def _blocks_text(blocks: list[int]) -> str:
    shown = ", ".join(f"blk.{b}" for b in blocks[:_SHOWN_BLOCKS])
    more = len(blocks) - _SHOWN_BLOCKS
    return shown + (f" and {more:,} more" if more > 0 else "")


def block_tensor_problems(layout: BlockLayout, blocks: Collection[int]) -> list[str]:
    """Where a model's tensors disagree with its ``block_count`` (what llama.cpp's loader refuses).

    Two kinds: tensors of blocks at or beyond ``block_count``; and trunk blocks without any tensor in a
    model that has trunk block tensors. A file without block tensors (vocab-only) and the trunk of an
    MTP-only file are empty by design; NextN blocks without tensors are reported by the NextN checks.

    Args:
        layout: the model's block layout (bounded, so the loop below is too).
        blocks: the block numbers its tensors belong to (:func:`block_indices`).
    """
    problems = [f"tensors of blk.{b}, beyond block_count {layout.block_count}" for b in sorted(blocks)
                if b >= layout.block_count]
    if blocks and min(blocks) < layout.trunk:
        empty = [b for b in range(layout.trunk) if b not in blocks]
        if empty:
            problems.append(
                f"{layout.arch}.block_count = {layout.block_count} declares {layout.trunk} trunk block(s), but "
                f"{_blocks_text(empty)} {'has' if len(empty) == 1 else 'have'} no tensors"
            )
    return problems


def _int_list(header: GGUFHeader, key: str) -> list[int] | None:
    value = header.get(key)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value
    return None


def layer_kinds(header: GGUFHeader, arch: str, n_layers: int) -> tuple[str, ...] | None:
    """Per-layer kinds of a hybrid model, from ``attention.head_count_kv`` and ``feed_forward_length``.

    For ``nemotron_h``/``nemotron_h_moe``: a layer is recurrent (``M``) iff both are 0, attention
    (``*``) iff head_count_kv > 0, feed-forward (``E`` for MoE, ``-`` for MLP) iff feed_forward_length
    > 0; a NextN block is both (``*E``). For other models whose head_count_kv array mixes zeros and
    non-zeros: ``M`` (recurrent) or ``*``. ``None`` when the model is not a hybrid or has no arrays.

    Args:
        header: shard 1's header (the model KVs).
        arch: ``general.architecture``.
        n_layers: how many layers to classify (``block_count``); fewer come back when an array is
            shorter (a composite whose arrays were not extended).
    """
    kv = _int_list(header, f"{arch}.attention.head_count_kv")
    if kv is None:
        return None
    letter = _HYBRID_FFN_LETTER.get(arch)
    if letter is None:
        kv = kv[:n_layers]
        if all(v > 0 for v in kv) or all(v == 0 for v in kv):
            return None
        return tuple("*" if v > 0 else "M" for v in kv)
    ff_value = header.get(f"{arch}.feed_forward_length")
    ff = _int_list(header, f"{arch}.feed_forward_length")
    if ff is None:
        ff = [ff_value if isinstance(ff_value, int) else 0] * n_layers
    n = min(n_layers, len(kv), len(ff))
    kinds = [("*" if kv[i] > 0 else "") + (letter if ff[i] > 0 else "") for i in range(n)]
    return tuple(kind or "M" for kind in kinds)


#: The element types a per-layer array may hold: numbers and flags (llama.cpp reads nothing else per layer).
LAYER_ARRAY_TYPES = frozenset({*INT_RANGES, GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, GGUFValueType.BOOL})


def layer_array(kv: KeyValue, where: str | None) -> tuple[GGUFValueType, list[Any]]:
    """The element type and entries of a per-layer array read from a model (the one reading of them that
    checks what they hold: every caller that extends or compares per-layer entries goes through it).

    Raises:
        BadGGUFError: ``kv`` is not an array of integers, floats or booleans (``where`` is the file named).
    """
    etype = kv.element_type
    if not kv.is_array or etype not in LAYER_ARRAY_TYPES:
        what = f"{etype.name} items" if kv.is_array and etype is not None else f"type {kv.type_name}"
        raise BadGGUFError(f"per-layer array {kv.key} has {what}, not integers, floats or booleans", where)
    return etype, list(kv.value)


def per_layer_keys(header: GGUFHeader, arch: str, block_count: int) -> list[KeyValue]:
    """The per-layer arrays of a model that get entries for NextN blocks: ``{arch}.*`` arrays exactly
    ``block_count`` long, except the known arrays that are not per layer (:data:`NOT_PER_LAYER_ARRAYS`)
    and those llama.cpp reads with the trunk's length (:mod:`gguf_mtp.model.arch_rules`)."""
    return [kv for kv, _ in extended_arrays(header, arch, block_count)]


def unextended_arrays(header: GGUFHeader, arch: str, block_count: int, trunk_blocks: int) -> list[str]:
    """Per-layer arrays still as long as the trunk when NextN blocks were added, and arrays llama.cpp reads
    with exactly ``block_count`` entries that have another length (llama.cpp: "key has wrong array
    length"); arrays llama.cpp reads with the trunk's length are left out."""
    if trunk_blocks == block_count:
        return []
    problems = [
        f"{kv.key} has {kv.array_length} entries, but block_count is {block_count} (not extended for the NextN block)"
        for kv in per_layer_keys(header, arch, trunk_blocks)
    ]
    return problems + [
        f"{kv.key} has {kv.array_length} entries, but block_count is {block_count} (llama.cpp requires one per block)"
        for kv in exact_length_arrays(header, arch)
        if kv.array_length not in (block_count, trunk_blocks)
    ]


def trunk_array_problems(header: GGUFHeader, arch: str, trunk_blocks: int) -> list[str]:
    """Arrays llama.cpp reads with the trunk's length (``glm-dsa.attention.indexer.types``) that are not
    that long: extending them for a NextN block makes llama.cpp refuse the file."""
    return [
        f"{kv.key} has {kv.array_length} entries, but llama.cpp reads it with the trunk's {trunk_blocks} "
        "(it must not be extended for the NextN block)"
        for kv in trunk_only_arrays(header, arch)
        if kv.array_length != trunk_blocks
    ]


def constant_entry_problems(header: GGUFHeader, arch: str, block_count: int, trunk_blocks: int) -> list[str]:
    """NextN entries of arrays whose NextN value llama.cpp fixes (``qwen35moe.attention.recurrent_layers``:
    false) that hold another value."""
    problems = []
    for kv, rule in extended_arrays(header, arch, block_count):
        if rule is None or rule.kind is not NextNValue.CONSTANT or trunk_blocks == block_count:
            continue
        values = kv.value
        for i in range(trunk_blocks, block_count):
            value = values[i]
            if value != rule.value or isinstance(value, bool) != isinstance(rule.value, bool):
                problems.append(f"blk.{i}: {kv.key}[{i}] is {value!r}, but a NextN block's entry is {rule.describe()}")
    return problems


def per_layer_problems(header: GGUFHeader, arch: str, block_count: int, trunk_blocks: int) -> list[str]:
    """Every per-layer metadata problem of a model with NextN blocks that llama.cpp would refuse or
    misread: arrays not extended, trunk-length arrays extended, wrong constant NextN entries, and NextN
    blocks of a hybrid model that are not attention and feed-forward."""
    if trunk_blocks == block_count:
        return trunk_array_problems(header, arch, trunk_blocks)
    return (
        unextended_arrays(header, arch, block_count, trunk_blocks)
        + trunk_array_problems(header, arch, trunk_blocks)
        + constant_entry_problems(header, arch, block_count, trunk_blocks)
        + nextn_kind_problems(header, arch, block_count, trunk_blocks)
    )


def nextn_kind_problems(header: GGUFHeader, arch: str, block_count: int, trunk_blocks: int) -> list[str]:
    """NextN blocks of a hybrid model whose per-layer entries do not make them attention *and*
    feed-forward (the mark of a copied trunk entry: trunk layers are one or the other)."""
    letter = _HYBRID_FFN_LETTER.get(arch)
    kinds = layer_kinds(header, arch, block_count) if letter is not None else None
    if kinds is None or letter is None:
        return []
    return [
        f"blk.{i}: attention.head_count_kv and feed_forward_length make it {kinds[i]!r}, but a NextN block is "
        f"both attention and feed-forward ('*{letter}': both entries > 0)"
        for i in range(trunk_blocks, min(block_count, len(kinds)))
        if kinds[i] != "*" + letter
    ]
