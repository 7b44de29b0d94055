"""Which ggml type each tensor gets when a head is quantized: ``llama-quantize --pure``'s rules, exactly.

Pure: a tensor's name, shape (ggml order) and source type plus the wanted head type give the type it is
written in; no data is touched (:mod:`gguf_mtp.format.quantize` moves the bytes). Every rule is one row
of a flat table below, with the line of llama.cpp's ``src/llama-quant.cpp`` (the copy vendored by
llama-cpp-python 0.3.36) it comes from, so a llama.cpp update is checked line by line:

- a tensor llama-quantize never quantizes (``tensor_allows_quantization``: 1-D tensors, names not ending
  in ``weight``, norms, routers, conv1d...) keeps its source type and its bytes;
- every other tensor gets the head type, unless its rows (``ne[0]``) do not split into that type's
  blocks: then ``tensor_type_fallback``'s type, and F16 where even that does not fit;
- a tensor already in the resulting type is copied unchanged (llama-quantize's ``cur_type != new_type``).

The ``--outtype`` names are llama-quantize's uniform types; the types that need an importance matrix
(:data:`IMATRIX_TYPES`) are taken only with one (``--imatrix``), and refused by name without.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from gguf_mtp.constants import OUTTYPE_NAMES

__all__ = [
    "EMBEDDING_TENSORS",
    "FALLBACKS",
    "HEAD_TYPES",
    "HEAD_TYPE_FILE_TYPES",
    "IMATRIX_TYPES",
    "NEVER_QUANTIZED",
    "KeepRule",
    "embedding_tensor_type",
    "embedding_type",
    "head_tensor_type",
    "head_type",
    "is_quantized",
    "kept_by",
    "n_dims",
    "needs_imatrix",
]

Q = GGMLQuantizationType

#: ``--outtype`` names (llama-quantize's uniform types, any case) -> the ggml type of a head's matrices.
HEAD_TYPES: dict[str, GGMLQuantizationType] = {name: GGMLQuantizationType[name.upper()] for name in OUTTYPE_NAMES}

#: Types llama-quantize will not write without an importance matrix (``tensor_requires_imatrix``,
#: llama-quant.cpp lines 861-867; ``ggml_quantize_requires_imatrix`` in ggml.c): head types only with one.
IMATRIX_TYPES: frozenset[str] = frozenset({"iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs"})

#: ``general.file_type`` llama-quantize writes for each head type (``tools/quantize/quantize.cpp``'s names:
#: ``Q4_K`` is its alias of Q4_K_M, ``Q5_K`` of Q5_K_M, ``Q3_K`` of Q3_K_M).
HEAD_TYPE_FILE_TYPES: dict[GGMLQuantizationType, LlamaFileType] = {
    Q.F32: LlamaFileType.ALL_F32,
    Q.F16: LlamaFileType.MOSTLY_F16,
    Q.BF16: LlamaFileType.MOSTLY_BF16,
    Q.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    Q.Q6_K: LlamaFileType.MOSTLY_Q6_K,
    Q.Q5_K: LlamaFileType.MOSTLY_Q5_K_M,
    Q.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    Q.Q3_K: LlamaFileType.MOSTLY_Q3_K_M,
    Q.Q2_K: LlamaFileType.MOSTLY_Q2_K,
    Q.Q5_1: LlamaFileType.MOSTLY_Q5_1,
    Q.Q5_0: LlamaFileType.MOSTLY_Q5_0,
    Q.Q4_1: LlamaFileType.MOSTLY_Q4_1,
    Q.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    Q.IQ4_XS: LlamaFileType.MOSTLY_IQ4_XS,
    Q.IQ4_NL: LlamaFileType.MOSTLY_IQ4_NL,
    Q.IQ3_XXS: LlamaFileType.MOSTLY_IQ3_XXS,
    Q.IQ2_S: LlamaFileType.MOSTLY_IQ2_S,
    Q.IQ2_XS: LlamaFileType.MOSTLY_IQ2_XS,
    Q.IQ2_XXS: LlamaFileType.MOSTLY_IQ2_XXS,
    Q.IQ1_M: LlamaFileType.MOSTLY_IQ1_M,
    Q.IQ1_S: LlamaFileType.MOSTLY_IQ1_S,
}


@dataclass(frozen=True)
class KeepRule:
    """One reason llama-quantize keeps a tensor in its source type: ``how`` the name is matched
    (``"contains"``, ``"equals"``, ``"not_suffix"``), the text, the llama-quant.cpp line, and the only
    architecture it applies to (``None``: all)."""

    how: str
    text: str
    line: int
    arch: str | None = None

    def matches(self, name: str, arch: str | None) -> bool:
        """Whether the rule applies to tensor ``name`` of a model of architecture ``arch``."""
        if self.arch is not None and self.arch != arch:
            return False
        if self.how == "contains":
            return self.text in name
        if self.how == "equals":
            return name == self.text
        return not name.endswith(self.text)  # "not_suffix"


def _contains(line: int, *texts: str, arch: str | None = None) -> list[KeepRule]:
    return [KeepRule("contains", text, line + i, arch) for i, text in enumerate(texts)]


#: ``tensor_allows_quantization`` (llama-quant.cpp 287-383) as data, besides its 1-D rule (line 292, see
#: :func:`n_dims`) and its ``output.weight`` rule (line 302: only with ``--leave-output-tensor``, never
#: with ``--pure`` alone).
NEVER_QUANTIZED: tuple[KeepRule, ...] = (
    KeepRule("not_suffix", "weight", 297),
    *_contains(300, "_norm.weight"),
    *_contains(306, "ffn_gate_inp.weight"),
    *_contains(309, "ffn_gate_tid2eid.weight"),
    *_contains(312, "altup", "laurel"),
    *_contains(316, "per_layer_model_proj"),
    KeepRule("equals", "position_embd.weight", 319),
    KeepRule("equals", "token_types.weight", 320),
    *_contains(324, "ssm_conv1d", "shortconv.conv.weight"),
    *_contains(328, "indexer.k_proj.weight", "indexer.q_proj.weight"),
    *_contains(333, "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
               "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
               "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight", arch="glm5-next"),
    *_contains(350, *(f"time_mix_{s}.weight" for s in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1",
                                                       "a2", "g1", "g2", "decay_w1", "decay_w2", "lerp_fused"))),
    *_contains(367, "attn_rel_b.weight"),
    *_contains(370, ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
               ".patch_merger"),
    *_contains(379, "a.rvq.codebook", "mm.a.code_embd"),
)

#: ``tensor_type_fallback`` (llama-quant.cpp 390-441): a head type -> the type used where a row does not
#: split into its blocks (lines 403-418). Types with blocks of 32 or less have none (line 420: they stay,
#: and the F16 check below takes them); every type here falls back to F16 where the fallback's blocks do
#: not fit either (line 438).
FALLBACKS: dict[GGMLQuantizationType, GGMLQuantizationType] = {
    **{GGMLQuantizationType[name.upper()]: Q.IQ4_NL for name in IMATRIX_TYPES},  # lines 403-408
    Q.IQ4_XS: Q.IQ4_NL,  # line 410
    Q.Q2_K: Q.Q4_0,  # line 415
    Q.Q3_K: Q.Q4_0,  # line 415
    Q.Q4_K: Q.Q5_0,  # line 416
    Q.Q5_K: Q.Q5_1,  # line 417
    Q.Q6_K: Q.Q8_0,  # line 418
}

#: Where even a fallback's blocks do not fit a row (llama-quant.cpp line 438).
LAST_RESORT = Q.F16

_UNQUANTIZED = frozenset({Q.F32, Q.F16, Q.BF16, Q.F64, Q.I8, Q.I16, Q.I32, Q.I64})


def is_quantized(qtype: int) -> bool:
    """ggml's ``ggml_is_quantized``: a block type (not a plain float or integer type)."""
    return GGMLQuantizationType(qtype) not in _UNQUANTIZED


def needs_imatrix(qtype: int) -> bool:
    """Whether llama-quantize writes a head tensor in ``qtype`` only with an importance matrix
    (:data:`IMATRIX_TYPES`)."""
    return GGMLQuantizationType(qtype).name.lower() in IMATRIX_TYPES


def n_dims(shape: Sequence[int]) -> int:
    """ggml's ``ggml_n_dims``: dimensions up to the last one above 1 (at least 1); llama-quant.cpp line 292
    quantizes only tensors with 2 or more."""
    dims = 1
    for i, extent in enumerate(shape):
        if extent > 1:
            dims = i + 1
    return dims


def head_type(name: str, *, imatrix: bool | None = None) -> GGMLQuantizationType:
    """The ggml type of an ``--outtype`` name (any case); with ``imatrix`` (an importance matrix is given) the
    :data:`IMATRIX_TYPES` too. ``imatrix`` False: none was given where one may be; ``None``: the command takes
    none, which the refusal says with the commands that do.

    Raises:
        ValueError: one line: an importance-matrix type without one, with its reason, or an unknown name with
            the choices.
    """
    key = name.strip().lower()
    if key in HEAD_TYPES:
        return HEAD_TYPES[key]
    if key in IMATRIX_TYPES:
        if imatrix:
            return GGMLQuantizationType[key.upper()]
        needs = f"{key}: llama.cpp only writes it with an importance matrix (llama-quantize --imatrix)"
        how = ("with --imatrix FILE (llama-imatrix --nextn makes one)" if imatrix is False else
               "(convert, compose, extract and graft take --imatrix FILE; llama-imatrix --nextn makes one)")
        raise ValueError(f"{needs}; give one {how}, or choose iq4_xs, q4_k or above")
    raise ValueError(f"{name!r}: choose one of {', '.join(HEAD_TYPES)}")


def embedding_type(name: str) -> GGMLQuantizationType:
    """The ggml type of an ``--embd-type`` name (any case): a head type; never one that needs an importance
    matrix, since the sidecar's ``token_embd``/``output`` are never quantized with one.

    Raises:
        ValueError: one line, as :func:`head_type`'s.
    """
    key = name.strip().lower()
    if key in IMATRIX_TYPES:
        raise ValueError(f"{key}: llama.cpp only writes it with an importance matrix (llama-quantize --imatrix), "
                         "which a sidecar's token_embd and output are not quantized with; choose iq4_xs, q4_k or above")
    return head_type(name)


def kept_by(name: str, shape: Sequence[int], arch: str | None = None) -> str | None:
    """Why llama-quantize keeps ``name`` in its source type (``"llama-quant.cpp:LINE ..."``), or None."""
    if n_dims(shape) < 2:
        return "llama-quant.cpp:292 (fewer than 2 dimensions)"
    for rule in NEVER_QUANTIZED:
        if rule.matches(name, arch):
            what = "name does not end in" if rule.how == "not_suffix" else f"name {rule.how}"
            return f"llama-quant.cpp:{rule.line} ({what} {rule.text!r})"
    return None


def _fallback(row: int, wanted: GGMLQuantizationType) -> GGMLQuantizationType:
    block, _ = GGML_QUANT_SIZES[wanted]
    if row % block == 0:
        return wanted
    chosen = FALLBACKS.get(wanted, wanted)
    if row % GGML_QUANT_SIZES[chosen][0]:
        chosen = LAST_RESORT
    return chosen


def head_tensor_type(
    name: str, shape: Sequence[int], source_type: int, wanted: GGMLQuantizationType, arch: str | None = None
) -> GGMLQuantizationType:
    """The type ``llama-quantize --pure`` writes a tensor in when it quantizes a model to ``wanted``.

    Args:
        name: the tensor's GGUF name (``blk.40.nextn.eh_proj.weight``).
        shape: its shape in ggml order (``ne[0]``, the row, first).
        source_type: its ggml type in the source.
        wanted: the head type (one of :data:`HEAD_TYPES`).
        arch: the model's architecture (a few rules apply to one only).
    """
    if kept_by(name, shape, arch) is not None:
        return GGMLQuantizationType(source_type)
    if not is_quantized(wanted):  # llama-quant.cpp line 745: float targets take no fallback
        return wanted
    return _fallback(shape[0], wanted)


#: The tensors ``llama-quantize --token-embedding-type T --output-tensor-type T`` writes in ``T``
#: (``tensor_name_match_token_embd`` / ``tensor_name_match_output_weight``, llama-quant.cpp 104-111).
EMBEDDING_TENSORS: frozenset[str] = frozenset({"token_embd.weight", "per_layer_token_embd.weight", "output.weight"})


def embedding_tensor_type(name: str, shape: Sequence[int], wanted: GGMLQuantizationType) -> GGMLQuantizationType | None:
    """The type ``llama-quantize --token-embedding-type wanted --output-tensor-type wanted`` writes tensor ``name``
    in: ``wanted`` for the embedding and output matrices (llama-quant.cpp 721-740 return it as given, with no
    fallback), ``None`` for every other tensor (not this option's to decide).

    Raises:
        ValueError: the rows do not split into ``wanted``'s blocks (llama-quantize fails on such a tensor too).
    """
    if name not in EMBEDDING_TENSORS or kept_by(name, shape) is not None:
        return None
    block = GGML_QUANT_SIZES[wanted][0]
    if shape[0] % block:
        raise ValueError(f"{name}: rows of {shape[0]} do not split into {wanted.name}'s blocks of {block} "
                         "(llama-quantize fails on it too); choose a type with blocks that fit")
    return wanted
