"""What a model's blocks are: the per-layer kinds of hybrid models and the tensors a NextN block needs.

Small tables of llama.cpp knowledge (from its ``src/models/*.cpp`` loaders), looked up by
``general.architecture``, in the spirit of gguf-py's own tables. Everything else is derived from the
metadata: ``{arch}.block_count``, ``{arch}.nextn_predict_layers`` and the per-layer arrays.
"""

from __future__ import annotations

from collections.abc import Collection

from .constants import NOT_PER_LAYER_ARRAYS
from .gguf_header import GGUFHeader

__all__ = [
    "NEXTN_CORE_TENSORS",
    "layer_kinds",
    "missing_nextn_tensors",
    "nextn_kind_problems",
    "nextn_required_tensors",
    "unextended_arrays",
]

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
    missing = [suffix for suffix in nextn_required_tensors(arch) if suffix not in have]
    if _FUSED_QKV in have:
        missing = [suffix for suffix in missing if suffix not in _SEPARATE_QKV]
    return [prefix + suffix for suffix in missing]


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


def unextended_arrays(header: GGUFHeader, arch: str, block_count: int, trunk_blocks: int) -> list[str]:
    """Per-layer arrays still as long as the trunk when NextN blocks were added (llama.cpp: "key has
    wrong array length"). Non-per-layer arrays (:data:`NOT_PER_LAYER_ARRAYS`) are not counted."""
    if trunk_blocks == block_count:
        return []
    prefix = f"{arch}."
    return [
        f"{key} has {kv.array_length} entries, but block_count is {block_count} (not extended for the NextN block)"
        for key, kv in header.kvs.items()
        if key.startswith(prefix)
        and kv.is_array
        and kv.array_length == trunk_blocks
        and key[len(prefix) :] not in NOT_PER_LAYER_ARRAYS
    ]


def nextn_kind_problems(header: GGUFHeader, arch: str, block_count: int, trunk_blocks: int) -> list[str]:
    """NextN blocks of a hybrid model whose per-layer entries do not make them attention *and*
    feed-forward (the mark of a copied trunk entry: trunk layers are one or the other)."""
    letter = _HYBRID_FFN_LETTER.get(arch)
    kinds = layer_kinds(header, arch, block_count) if letter is not None else None
    if kinds is None:
        return []
    return [
        f"blk.{i}: attention.head_count_kv and feed_forward_length make it {kinds[i]!r}, but a NextN block is "
        f"both attention and feed-forward ('*{letter}': both entries > 0)"
        for i in range(trunk_blocks, min(block_count, len(kinds)))
        if kinds[i] != "*" + letter
    ]
