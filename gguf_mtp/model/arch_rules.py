"""Per-architecture rules for the ``{arch}.*`` per-layer arrays when NextN (MTP) blocks are appended.

One flat table, in the spirit of gguf-py's ``MODEL_TENSORS``: for each GGUF architecture llama.cpp
runs a NextN draft graph for, which per-layer keys get which value for each appended NextN block.
The facts come from llama.cpp 0c1e570's loaders and converters (``src/models/*.cpp``,
``conversion/*.py``; see ``shared/reference/mtp-families.md``):

* :attr:`NextNValue.FROM_DRAFT`: the array is read with the length ``n_layer_all`` (``block_count``,
  NextN blocks included) and its NextN entries differ per model, so they come from the draft (a draft
  at ``blk.N`` carries ``N+k`` entries, one at ``blk.0`` carries ``k``: either way its tail).
* :attr:`NextNValue.CONSTANT`: the NextN entry is fixed by llama.cpp (``qwen35*``/``qwen3next``
  ``attention.recurrent_layers``: a NextN block is never recurrent, so ``false``).
* :attr:`NextNValue.TRUNK`: the array is read with the trunk's length ``n_layer()`` and must never be
  extended (``glm-dsa.attention.indexer.types``: extending it makes llama.cpp refuse the file with
  "key ... has wrong array length").

An array as long as the trunk that the table does not know is never extended on a guess: ``compose``
takes the draft's entries when the draft carries the key, and refuses otherwise, naming the keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from gguf_mtp.constants import NOT_PER_LAYER_ARRAYS
from gguf_mtp.format.header import GGUFHeader, KeyValue

__all__ = [
    "ARCH_RULES",
    "COMMON_RULES",
    "GRAPH_NEXTN_BLOCKS",
    "SPLICE_REFUSED",
    "LayerKeyRule",
    "NextNValue",
    "exact_length_arrays",
    "extended_arrays",
    "is_known_arch",
    "layer_rules",
    "rule_for",
    "trunk_only_arrays",
    "unrun_nextn_note",
]


class NextNValue(Enum):
    """Where the entries of a per-layer array for appended NextN blocks come from."""

    FROM_DRAFT = "from the draft"
    CONSTANT = "a constant"
    TRUNK = "trunk-length, never extended"


@dataclass(frozen=True)
class LayerKeyRule:
    """The rule of one ``{arch}.`` per-layer key: what an appended NextN block's entry is."""

    kind: NextNValue
    value: bool | int | float | None = None  # the entry, for CONSTANT
    source: str = ""  # where llama.cpp says so
    #: llama.cpp requires exactly ``block_count`` entries (``get_key_or_arr``); ``get_arr`` arrays
    #: (``sliding_window_pattern``, ``compress_ratios``) accept other lengths.
    exact: bool = True

    def describe(self) -> str:
        """``from the draft``, ``false (constant)`` or ``trunk-length, never extended``."""
        if self.kind is NextNValue.CONSTANT:
            return f"{str(self.value).lower() if isinstance(self.value, bool) else self.value} (constant)"
        return self.kind.value


def _draft(source: str, *, exact: bool = True) -> LayerKeyRule:
    return LayerKeyRule(NextNValue.FROM_DRAFT, source=source, exact=exact)


_STANDARD = "src/llama-model.cpp:1333-1404 (get_key_or_arr, length n_layer_all)"
_SWIGLU = "swiglu_clamp_* (length n_layer_all; the converters pad MTP entries)"

#: Arrays llama.cpp's generic loader reads for every architecture with the length ``n_layer_all``
#: (``get_key_or_arr``, exact length): the NextN blocks' entries are the draft's.
COMMON_RULES: Mapping[str, LayerKeyRule] = {
    "attention.head_count": _draft(_STANDARD),
    "attention.head_count_kv": _draft(_STANDARD),
    "feed_forward_length": _draft(_STANDARD),
    "expert_used_count": _draft(_STANDARD),
}

_RECURRENT_FALSE = LayerKeyRule(
    NextNValue.CONSTANT, False, "qwen35moe.cpp:20 (exact length n_layer_all); conversion/qwen.py:386-388 pads False"
)
_INDEXER_TRUNK = LayerKeyRule(NextNValue.TRUNK, source="src/models/glm-dsa.cpp:66 (read with length n_layer())")

#: The per-architecture keys (suffixes after ``{arch}.``) beyond :data:`COMMON_RULES`, for every
#: architecture with a NextN draft graph in llama.cpp 0c1e570 (and the two that read indexer.types).
ARCH_RULES: Mapping[str, Mapping[str, LayerKeyRule]] = {
    # Nemotron 3 Nano / 3.5 Lightning / 3 Super: head_count_kv and feed_forward_length (common) mark the
    # layer kinds; a NextN block is both attention and MoE (conversion/nemotron.py:339-358).
    "nemotron_h_moe": {},
    # GLM-4.5/4.6/4.7: only scalars (conversion/glm.py:150-183).
    "glm4moe": {},
    # GLM-4.7-Flash, DeepSeek V3/R1: only scalars (conversion/deepseek.py:319-386). The MTP graph also needs an
    # MLA trunk and Q-LoRA (src/models/deepseek2.cpp:174 is_mla(), :193 n_lora_q > 0): conversion/deepseek2.py.
    "deepseek2": {},
    # DeepSeek V3.2: the indexer head_count/key_length/top_k are scalars (conversion/deepseek.py:519-522,
    # src/models/deepseek32.cpp:26-28); MLA required (deepseek32.cpp:61): conversion/deepseek32.py.
    "deepseek32": {},
    # GLM-5/5.1/5.2: the indexer pattern is the trunk's (conversion/glm.py:380-382 writes len(indexer_types),
    # src/models/glm-dsa.cpp:66 reads n_layer() entries); MLA required (glm-dsa.cpp:94): conversion/glm_dsa.py.
    "glm-dsa": {"attention.indexer.types": _INDEXER_TRUNK},
    # Qwen3.5/3.6 dense and MoE, Qwen3-Next: the NextN block is a full-attention block.
    "qwen35": {"attention.recurrent_layers": _RECURRENT_FALSE},
    "qwen35moe": {"attention.recurrent_layers": _RECURRENT_FALSE},
    "qwen3next": {"attention.recurrent_layers": _RECURRENT_FALSE},
    # Step-3.5/3.7-Flash (3 blocks): per-layer heads, SWA flags and clamps cover the MTP blocks
    # (conversion/step3.py:161-223, from HF layer_types; clamps 0.0 unless given).
    "step35": {
        "attention.sliding_window_pattern": _draft("step35.cpp:26 (get_arr); conversion/step3.py", exact=False),
        "swiglu_clamp_exp": _draft(_SWIGLU),
        "swiglu_clamp_shexp": _draft(_SWIGLU),
    },
    # MiMo-V2 (3 blocks): the MTP blocks are SWA (conversion/mimo.py:151-160 appends [1] * 3).
    "mimo2": {
        "attention.sliding_window_pattern": _draft("mimo2.cpp:12 (get_arr); conversion/mimo.py:155", exact=False)
    },
    # Tencent Hy3: only scalars (conversion/hunyuan.py).
    "hy_v3": {},
    # Cohere2 MoE: the SWA pattern comes from HF layer_types (conversion/command_r.py:103).
    "cohere2moe": {
        "attention.sliding_window_pattern": _draft("conversion/command_r.py:103 (HF layer_types)", exact=False)
    },
    # Ling-3.0: head_count_kv (common) is 1 for the MTP block; clamps padded (conversion/bailingmoe3.py:57-94).
    "bailingmoe3": {"swiglu_clamp_exp": _draft(_SWIGLU), "swiglu_clamp_shexp": _draft(_SWIGLU)},
    # DeepSeek-V4: compress_ratios is read with get_arr, at least block_count long (deepseek4.cpp:57-61).
    "deepseek4": {
        "attention.compress_ratios": _draft("src/models/deepseek4.cpp:57-61 (at least block_count)", exact=False),
        "swiglu_clamp_exp": _draft(_SWIGLU),
        "swiglu_clamp_shexp": _draft(_SWIGLU),
    },
    # No MTP graph in this llama.cpp, but they read indexer.types with the trunk's length too.
    "glm5-next": {"attention.indexer.types": _INDEXER_TRUNK},
    "hy_v4": {"attention.indexer.types": _INDEXER_TRUNK},
}

#: How many NextN blocks each architecture's MTP graph runs (llama.cpp 0c1e570), with the source line: a file
#: with more loads them but never runs the rest (or, for deepseek2, fails the graph's assert). Architectures that
#: chain every block (``llama_set_nextn_layer_offset``: step35, mimo2, hy_v3) are not listed.
GRAPH_NEXTN_BLOCKS: Mapping[str, tuple[int, str]] = {
    "nemotron_h_moe": (1, "src/models/nemotron-h-moe.cpp graph_mtp (one folded block)"),
    "glm4moe": (1, "src/models/glm4-moe.cpp:135 (single block)"),
    "deepseek2": (1, "src/models/deepseek2.cpp:173 (asserts n_layer_nextn == 1)"),
    "deepseek32": (1, "src/models/deepseek32.cpp:498 (single block)"),
    "glm-dsa": (1, "src/models/glm-dsa.cpp:542 (single block)"),
    "qwen35": (1, "src/models/qwen35.cpp:485-489 (single block)"),
    "qwen35moe": (1, "src/models/qwen35moe.cpp:550-554 (single block)"),
    "qwen3next": (1, "src/models/qwen3next.cpp:627-631 (single block)"),
    "cohere2moe": (1, "src/models/cohere2moe.cpp:146 (single block)"),
    "bailingmoe3": (1, "src/models/bailingmoe3.cpp:163 (single block)"),
    "deepseek4": (1, "src/models/deepseek4.cpp:1362-1480 (single block)"),
}


def unrun_nextn_note(arch: str, nextn_blocks: int) -> str | None:
    """What to say when a file declares more NextN blocks than ``arch``'s MTP graph runs (``None``: it runs all)."""
    runs = GRAPH_NEXTN_BLOCKS.get(arch)
    if runs is None or nextn_blocks <= runs[0]:
        return None
    return (f"{nextn_blocks} NextN blocks, but llama.cpp's {arch} MTP graph runs {runs[0]} ({runs[1]}): "
            f"the other {nextn_blocks - runs[0]} are loaded and never run")


#: Architectures whose NextN head cannot be spliced into a trunk at all, and why.
SPLICE_REFUSED: Mapping[str, str] = {
    "deepseek4": (
        "a DeepSeek-V4 MTP head carries its own hyper-connection head (hc_head_*) and runs only as a sidecar "
        "(llama.cpp's --mtp export): use it with llama-server --spec-draft-model instead of composing it"
    ),
}


def is_known_arch(arch: str) -> bool:
    """Whether the table has rules for ``arch`` (an architecture with a NextN graph in llama.cpp)."""
    return arch in ARCH_RULES


def layer_rules(arch: str) -> dict[str, LayerKeyRule]:
    """Every rule of ``arch``: :data:`COMMON_RULES` plus its own (only the common ones for an unknown arch)."""
    return {**COMMON_RULES, **ARCH_RULES.get(arch, {})}


def rule_for(arch: str, key: str) -> LayerKeyRule | None:
    """The rule of ``key`` (a full ``{arch}.`` key or its suffix), ``None`` when the table does not know it."""
    prefix = f"{arch}."
    suffix = key[len(prefix) :] if key.startswith(prefix) else key
    return layer_rules(arch).get(suffix)


def _arch_arrays(header: GGUFHeader, arch: str) -> list[tuple[KeyValue, str]]:
    """``{arch}.*`` arrays of ``header`` that may be per layer, with their suffixes."""
    prefix = f"{arch}."
    return [
        (kv, key[len(prefix) :])
        for key, kv in header.kvs.items()
        if key.startswith(prefix) and kv.is_array and key[len(prefix) :] not in NOT_PER_LAYER_ARRAYS
    ]


def extended_arrays(header: GGUFHeader, arch: str, length: int) -> list[tuple[KeyValue, LayerKeyRule | None]]:
    """The arrays that get (or, in a model with NextN blocks, got) entries for the NextN blocks.

    Every ``{arch}.*`` array exactly ``length`` entries long (the trunk's block count for a target, the
    whole ``block_count`` for a composite) except the known arrays that are not per layer and the
    trunk-length ones (:attr:`NextNValue.TRUNK`), with its rule; ``None`` for an array the table does not
    know (extended only with values the draft carries).
    """
    rules = layer_rules(arch)
    result: list[tuple[KeyValue, LayerKeyRule | None]] = []
    for kv, suffix in _arch_arrays(header, arch):
        rule = rules.get(suffix)
        if kv.array_length == length and (rule is None or rule.kind is not NextNValue.TRUNK):
            result.append((kv, rule))
    return result


def exact_length_arrays(header: GGUFHeader, arch: str) -> list[KeyValue]:
    """The ``{arch}.*`` arrays of ``header`` that llama.cpp reads with exactly ``block_count`` entries
    (:attr:`LayerKeyRule.exact`, NextN blocks included)."""
    rules = layer_rules(arch)
    return [
        kv
        for kv, suffix in _arch_arrays(header, arch)
        if (r := rules.get(suffix)) and r.kind is not NextNValue.TRUNK and r.exact
    ]


def trunk_only_arrays(header: GGUFHeader, arch: str) -> list[KeyValue]:
    """The ``{arch}.*`` arrays of ``header`` that llama.cpp reads with the trunk's length (never extended)."""
    rules = layer_rules(arch)
    return [
        kv for kv, suffix in _arch_arrays(header, arch) if (r := rules.get(suffix)) and r.kind is NextNValue.TRUNK
    ]
