"""Per-architecture rules for the ``{arch}.*`` per-layer arrays when NextN (MTP) blocks are appended.

One flat table, in the spirit of gguf-py's ``MODEL_TENSORS``: for each GGUF architecture llama.cpp
runs a NextN draft graph for, which per-layer keys get which value for each appended NextN block.
The facts come from llama.cpp 0c1e570's loaders and converters (``src/models/*.cpp``,
``conversion/*.py``; each rule names its source line, which ``tests/test_citations.py`` finds in that tree; the
architectures, by llama.cpp build: docs/families.md):

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

from gguf_mtp.constants import DRAFT_GLOBAL_TENSORS, NOT_PER_LAYER_ARRAYS
from gguf_mtp.format.header import GGUFHeader, KeyValue
from gguf_mtp.model.mtp_builds import LIBRARY_BUILD, MTP_BUILDS, SOURCE_BUILD

__all__ = [
    "ARCH_RULES",
    "COMMON_RULES",
    "HEADS_REFUSED",
    "MTP_GRAPH_BLOCKS",
    "NAMED_ONLY",
    "NO_OUTPUT_NORM",
    "TRUNK_ONLY_KEYS",
    "HeadRefusal",
    "LayerKeyRule",
    "NextNValue",
    "exact_length_arrays",
    "extended_arrays",
    "is_known_arch",
    "is_trunk_only_key",
    "layer_rules",
    "nextn_graph_note",
    "refusal_for_hf",
    "rule_for",
    "sidecar_globals",
    "sidecar_needs",
    "splice_refusal",
    "trunk_only_arrays",
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
        return str(self.kind.value)


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
    NextNValue.CONSTANT,
    False,
    "qwen35moe.cpp:20 (exact length n_layer_all); conversion/qwen.py:386-388 (layer_types, padded with False)",
)
_INDEXER_TRUNK = LayerKeyRule(NextNValue.TRUNK, source="src/models/glm-dsa.cpp:66 (read with length n_layer())")

#: The per-architecture keys (suffixes after ``{arch}.``) beyond :data:`COMMON_RULES`, for every
#: architecture with a NextN draft graph in llama.cpp 0c1e570 (and the two that read indexer.types).
ARCH_RULES: Mapping[str, Mapping[str, LayerKeyRule]] = {
    # Nemotron 3 Nano / 3.5 Lightning / 3 Super: head_count_kv and feed_forward_length (common) mark the
    # layer kinds; a NextN block is both attention and MoE (conversion/nemotron.py).
    "nemotron_h_moe": {},
    # GLM-4.5/4.6/4.7: only scalars (conversion/glm.py).
    "glm4moe": {},
    # GLM-4.7-Flash, DeepSeek V3/R1: only scalars (conversion/deepseek.py). The MTP graph also needs an
    # MLA trunk and Q-LoRA (src/models/deepseek2.cpp is_mla(), n_lora_q > 0): conversion/deepseek2.py.
    "deepseek2": {},
    # DeepSeek V3.2: the indexer head_count/key_length/top_k are scalars (conversion/deepseek.py,
    # src/models/deepseek32.cpp); MLA required (deepseek32.cpp): conversion/deepseek32.py.
    "deepseek32": {},
    # GLM-5/5.1/5.2: the indexer pattern is the trunk's (conversion/glm.py writes len(indexer_types),
    # src/models/glm-dsa.cpp reads n_layer() entries); MLA required (glm-dsa.cpp): conversion/glm_dsa.py.
    "glm-dsa": {"attention.indexer.types": _INDEXER_TRUNK},
    # Qwen3.5/3.6 dense and MoE, Qwen3-Next: the NextN block is a full-attention block.
    "qwen35": {"attention.recurrent_layers": _RECURRENT_FALSE},
    "qwen35moe": {"attention.recurrent_layers": _RECURRENT_FALSE},
    "qwen3next": {"attention.recurrent_layers": _RECURRENT_FALSE},
    # Step-3.5/3.7-Flash (3 blocks): per-layer heads, SWA flags and clamps cover the MTP blocks
    # (conversion/step3.py, from HF layer_types; clamps 0.0 unless given).
    "step35": {
        "attention.sliding_window_pattern": _draft("step35.cpp:26 (get_arr); conversion/step3.py", exact=False),
        "swiglu_clamp_exp": _draft(_SWIGLU),
        "swiglu_clamp_shexp": _draft(_SWIGLU),
    },
    # MiMo-V2 (3 blocks): the MTP blocks are SWA (conversion/mimo.py appends [1] * 3).
    "mimo2": {
        "attention.sliding_window_pattern": _draft(
            "mimo2.cpp:12 (get_arr); conversion/mimo.py:155 (hybrid_layer_pattern + [1] per block)", exact=False
        )
    },
    # Tencent Hy3: the converter writes scalars (conversion/hunyuan.py); the loader also takes the expert
    # width per layer (src/models/hy-v3.cpp, get_key_or_arr with length n_layer_all).
    "hy_v3": {"expert_feed_forward_length": _draft("src/models/hy-v3.cpp:5 (get_key_or_arr, length n_layer_all)")},
    # Cohere2 MoE: the SWA pattern comes from HF layer_types (conversion/command_r.py).
    "cohere2moe": {
        "attention.sliding_window_pattern": _draft("conversion/command_r.py:103 (HF layer_types)", exact=False)
    },
    # Ling-3.0: head_count_kv (common) is 1 for the MTP block, 0 marking a KDA layer (conversion/bailingmoe3.py,
    # src/models/bailingmoe3.cpp); clamps padded with 0.0 (conversion/bailingmoe3.py).
    "bailingmoe3": {
        "swiglu_clamp_exp": _draft("src/models/bailingmoe3.cpp:26 (get_key_or_arr, length n_layer_all)"),
        "swiglu_clamp_shexp": _draft("src/models/bailingmoe3.cpp:27 (get_key_or_arr, length n_layer_all)"),
        "expert_feed_forward_length": _draft("src/models/bailingmoe3.cpp:19 (get_key_or_arr, length n_layer_all)"),
    },
    # DeepSeek-V4: compress_ratios is read with get_arr, at least block_count long (deepseek4.cpp).
    "deepseek4": {
        "attention.compress_ratios": _draft("src/models/deepseek4.cpp:57-61 (at least block_count)", exact=False),
        "swiglu_clamp_exp": _draft(_SWIGLU),
        "swiglu_clamp_shexp": _draft(_SWIGLU),
    },
    # Qwen3.8-Flash-Next (llama.cpp b11434): the NextN block is a full-attention QSA layer, never recurrent, with the
    # model's one compress ratio (conversion/qwen4exp.py pads both; src/models/qwen4exp.cpp reads them with
    # get_key_or_arr, length n_layer_all). Its ple.* arrays are as long as the PLE hash heads: see NAMED_ONLY.
    "qwen4exp": {
        "attention.recurrent_layers": LayerKeyRule(
            NextNValue.CONSTANT, False, "b11434 src/models/qwen4exp.cpp (get_key_or_arr, length n_layer_all)"),
        "attention.compress_ratios": _draft("b11434 src/models/qwen4exp.cpp (get_key_or_arr, length n_layer_all)"),
    },
    # No MTP graph in this llama.cpp, but they read indexer.types with the trunk's length too.
    "glm5-next": {"attention.indexer.types": _INDEXER_TRUNK},
    "hy_v4": {"attention.indexer.types": _INDEXER_TRUNK},
}

#: Architectures whose per-layer arrays are exactly those :data:`ARCH_RULES` and :data:`COMMON_RULES` name: any other
#: ``{arch}.*`` array is not per layer, whatever its length. qwen4exp's ``ple.head_offsets`` / ``ple.head_vocab_sizes``
#: hold one entry per PLE hash head (``(ngram_size - 1) * heads_per_ngram``), which may equal ``block_count``: a
#: rule by length would extend them when a head block is appended (b11434 src/models/qwen4exp.cpp reads them with
#: that exact length).
NAMED_ONLY: frozenset[str] = frozenset({"qwen4exp"})


#: Architectures that have no ``output_norm``: an MTP-only file (a sidecar) carries ``token_embd`` and ``output``
#: alone. qwen4exp's final hyper-connection mixer carries the norm (b11434 src/models/qwen4exp.cpp: "there is no
#: output_norm"; its --mtp export writes token_embd and output only).
NO_OUTPUT_NORM: frozenset[str] = frozenset({"qwen4exp"})

#: ``{arch}.`` key prefixes of the trunk alone, which an MTP-only file leaves out as llama.cpp's ``--mtp`` export
#: does: qwen4exp's per-layer-embedding keys (b11434 conversion/qwen4exp.py writes none when mtp_only: "the MTP head
#: never reads PLE").
TRUNK_ONLY_KEYS: Mapping[str, tuple[str, ...]] = {
    "qwen4exp": ("ple.", "embedding_length_per_layer_input"),
}


def sidecar_globals(arch: str | None) -> tuple[str, ...]:
    """The global tensors an MTP-only model of ``arch`` carries (llama.cpp's ``--mtp`` export): ``token_embd``,
    ``output_norm`` (none where the architecture has none: :data:`NO_OUTPUT_NORM`) and ``output``."""
    return tuple(n for n in DRAFT_GLOBAL_TENSORS if n != "output_norm.weight" or arch not in NO_OUTPUT_NORM)


def sidecar_needs(arch: str | None) -> tuple[str, ...]:
    """Those of :func:`sidecar_globals` llama.cpp cannot load an MTP-only model without: all but ``output`` (a tied
    head falls back to ``token_embd``)."""
    return tuple(n for n in sidecar_globals(arch) if n != "output.weight")


def is_trunk_only_key(arch: str, key: str) -> bool:
    """Whether ``key`` belongs to the trunk of ``arch`` alone (:data:`TRUNK_ONLY_KEYS`): an MTP-only file leaves it
    out."""
    prefixes = TRUNK_ONLY_KEYS.get(arch, ())
    return bool(prefixes) and key.startswith(tuple(f"{arch}.{p}" for p in prefixes))


@dataclass(frozen=True)
class HeadRefusal:
    """Why gguf-mtp makes no MTP head for an architecture llama.cpp knows."""

    #: The Hugging Face ``architectures`` names of its checkpoints (what ``convert`` sees).
    hf_architectures: tuple[str, ...]
    #: One clause, with the llama.cpp source that says so.
    reason: str
    #: ``compose`` / ``graft`` refuse a draft of it too (its head cannot sit in a trunk at all).
    splice: bool = False


def _no_graph(loader: str, *hf_architectures: str) -> HeadRefusal:
    return HeadRefusal(hf_architectures, f"no llama.cpp build up to {LIBRARY_BUILD} has an MTP graph for it (its "
                       f"loader only reads the NextN tensors: {loader})")


#: Architectures whose MTP head gguf-mtp does not make (``convert``) or splice (``compose``/``graft``, where
#: :attr:`HeadRefusal.splice`), and why, each naming the llama.cpp build that adds what is missing (from
#: :data:`gguf_mtp.model.mtp_builds.MTP_BUILDS`): the one place these reasons are written.
HEADS_REFUSED: Mapping[str, HeadRefusal] = {
    "cohere2moe": HeadRefusal(
        ("Cohere2MoeForCausalLM",),
        "no official MTP weights exist, and llama.cpp's converter has no --mtp for it "
        "(conversion/command_r.py:65, Cohere2MoeModel, keeps conversion/base.py:120, "
        f"supports_mtp_export = False), still so at {SOURCE_BUILD}",
    ),
    "glm5-next": HeadRefusal(
        ("Glm5NextForConditionalGeneration",),
        f"llama.cpp's MTP graph for it lands in {MTP_BUILDS['glm5-next'].first_graph} (#29928); the builds gguf-mtp "
        f"proves heads against have none (src/models/glm5-next.cpp:188-190: \"not implemented yet\", also at "
        f"{SOURCE_BUILD}), and {LIBRARY_BUILD}, whose libllama has it, ships no sources to prove a converter against",
    ),
    "deepseek4": HeadRefusal(
        ("DeepseekV4ForCausalLM",),
        "a DeepSeek-V4 MTP head carries its own hyper-connection head (conversion/deepseek.py:599-606, hc_head_fn, "
        "hc_head_base, hc_head_scale) and runs only as a sidecar: make it with llama.cpp's convert_hf_to_gguf.py "
        f"--mtp and use it with llama-server --spec-draft-model, never spliced into a trunk (still so at "
        f"{SOURCE_BUILD})",
        splice=True,
    ),
    "mellum": HeadRefusal(
        ("MellumForCausalLM",),
        f"llama.cpp's MTP graph for it is newer than {SOURCE_BUILD}: {MTP_BUILDS['mellum'].first_graph}'s libllama "
        f"has one (a single MTP block), but that build ships no sources to prove a converter against, and "
        f"{SOURCE_BUILD}'s converter exports no head (conversion/mellum.py has no supports_mtp_export)",
    ),
    "dots3note": HeadRefusal(
        ("Dots3NoteForCausalLM", "Dots3NoteForConditionalGeneration", "Dots3NoteTextForCausalLM"),
        f"no llama.cpp build up to {LIBRARY_BUILD} has an MTP graph for it: its loader reads the NextN tensors "
        "(src/models/dots3note.cpp) and llama.cpp's converter exports them (conversion/dots3.py), but nothing "
        "runs them",
    ),
    "glm4": _no_graph("src/models/glm4.cpp", "Glm4ForCausalLM", "Glm4vForConditionalGeneration"),
    "bailingmoe2": _no_graph("src/models/bailingmoe2.cpp", "BailingMoeV2ForCausalLM"),
    "exaone4": _no_graph("src/models/exaone4.cpp", "Exaone4ForCausalLM"),
    "exaone-moe": _no_graph("src/models/exaone-moe.cpp", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM"),
    # NemotronHForCausalLM is also Nemotron 3's (nemotron_h_moe), whose head gguf-mtp converts: no HF name here.
    "nemotron_h": _no_graph("src/models/nemotron-h.cpp"),
}


#: How many NextN blocks llama.cpp 0c1e570's MTP draft graph of each architecture runs (qwen4exp: b11434's, the first
#: build with its graph here), and where it says so:
#: ``None`` for every block the file has (the speculative driver chains them, block k at
#: ``llama_set_nextn_layer_offset(ctx, k)``, common/speculative.cpp), else the one count its graph
#: accepts (``GGML_ASSERT(hparams.n_layer_nextn == 1 ...)`` in the graph's constructor: any other count aborts the
#: MTP decode).
MTP_GRAPH_BLOCKS: Mapping[str, tuple[int | None, str]] = {
    "glm4moe": (1, "src/models/glm4-moe.cpp:135"),
    "deepseek2": (1, "src/models/deepseek2.cpp:173"),
    "deepseek32": (1, "src/models/deepseek32.cpp:498"),
    "glm-dsa": (1, "src/models/glm-dsa.cpp:542"),
    "qwen35": (1, "src/models/qwen35.cpp:489"),
    "qwen35moe": (1, "src/models/qwen35moe.cpp:554"),
    "qwen3next": (1, "src/models/qwen3next.cpp:631"),
    "nemotron_h_moe": (1, "src/models/nemotron-h-moe.cpp:13"),
    "bailingmoe3": (1, "src/models/bailingmoe3.cpp:426"),
    "cohere2moe": (1, "src/models/cohere2moe.cpp:293"),
    "deepseek4": (1, "src/models/deepseek4.cpp:1365"),
    "step35": (None, "src/models/step35.cpp:174-179, 376-379 (block nextn_layer_offset)"),
    "mimo2": (None, "src/models/mimo2.cpp:276-279 (block nextn_layer_offset)"),
    "hy_v3": (None, "src/models/hy-v3.cpp:247-250 (block nextn_layer_offset)"),
    "qwen4exp": (1, "src/models/qwen4exp.cpp of b11434 (graph_mtp: \"qwen4exp MTP has a single block\")"),
}


def nextn_graph_note(arch: str | None, nextn: int) -> str | None:
    """One line when a file has more NextN blocks than llama.cpp's MTP graph of ``arch`` runs (the graph then
    refuses the file's MTP decode), ``None`` otherwise (also for an architecture without an MTP graph)."""
    graph = MTP_GRAPH_BLOCKS.get(arch or "")
    if graph is None or graph[0] is None or nextn <= graph[0]:
        return None
    runs, source = graph
    return (f"{nextn} NextN blocks, but llama.cpp's {arch} MTP graph runs exactly {runs} ({source}: "
            f"GGML_ASSERT n_layer_nextn == {runs}): its MTP decode aborts on this file")


def refusal_for_hf(hf_architecture: str) -> tuple[str, HeadRefusal] | None:
    """(GGUF architecture, refusal) of a Hugging Face architecture name whose head gguf-mtp does not make."""
    return next(((arch, r) for arch, r in HEADS_REFUSED.items() if hf_architecture in r.hf_architectures), None)


def splice_refusal(arch: str) -> str | None:
    """Why a NextN head of GGUF architecture ``arch`` cannot be spliced into a trunk; ``None`` when it can."""
    refusal = HEADS_REFUSED.get(arch)
    return refusal.reason if refusal is not None and refusal.splice else None


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
    """``{arch}.*`` arrays of ``header`` that may be per layer, with their suffixes (for :data:`NAMED_ONLY`
    architectures, only those the table names)."""
    prefix = f"{arch}."
    named = layer_rules(arch) if arch in NAMED_ONLY else None
    return [
        (kv, suffix)
        for key, kv in header.kvs.items()
        if key.startswith(prefix) and kv.is_array and (suffix := key[len(prefix) :]) not in NOT_PER_LAYER_ARRAYS
        and (named is None or suffix in named)
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
