"""The ggml types an MTP head is usually dead or crippled in: the one table every command reads.

A NextN head drafts tokens for the trunk to accept; quantized too far it still loads and runs, it just
stops being accepted, and nothing but a measurement says so. Published quants carry such heads because
llama.cpp ignored the layer while they were made (no importance matrix for it, the lowest type to save
space). ``inspect`` flags them, compose/graft/extract/convert warn when asked to write one, and the
acceptance measurement (``verify --acceptance``) names them; all through :func:`weak_head_types`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gguf.constants import GGMLQuantizationType

__all__ = ["WEAK_HEAD_TYPES", "weak_head_types"]

Q = GGMLQuantizationType

_IQ1_IQ2 = ("the 1- and 2-bit importance-matrix types: what quantizers pick for a layer they mean to discard "
            "(ik_llama.cpp#814: \"convert layer 92 to IQ1_S\" for GLM's NextN layer)")
_IQ3 = ("3-bit importance-matrix types: an IQ3_S head accepted 0 of 3,595 drafts (GSQ #11), where the "
        "same model's IQ3_XXS head still worked: a lottery")
_BELOW_Q4_K = ("below Q4_K a drafter loses acceptance: a Qwen3.6-27B drafter accepted 66.6 % at Q4_K_M, "
               "66.4 % at Q8_0, 63.5 % at Q3_K_M and 55.3 % at Q2_K")

#: Head types that usually break MTP acceptance, with why. The IQ1, IQ2 and IQ3 families and every type below
#: Q4_K (Q3_K, Q2_K, the ternary TQ types).
#:
#: Sources (docs/commands.md, "Head types that break acceptance"): GSQ #11, a dead IQ3_S head; the Qwen3.6-27B
#: drafter acceptance by head type that gguf-mtp's ``--outtype`` warning has quoted since it was written;
#: ikawrakow/ik_llama.cpp#814, quantizers shrinking GLM's layer 92 to IQ1_S, and recipes with no importance matrix
#: for the NextN layer. Q4_0 and IQ4_* are not listed: ggml-org's own sidecars ship Q4_0 parts.
WEAK_HEAD_TYPES: Mapping[GGMLQuantizationType, str] = {
    Q.IQ1_S: _IQ1_IQ2,
    Q.IQ1_M: _IQ1_IQ2,
    Q.IQ2_XXS: _IQ1_IQ2,
    Q.IQ2_XS: _IQ1_IQ2,
    Q.IQ2_S: _IQ1_IQ2,
    Q.IQ3_XXS: _IQ3,
    Q.IQ3_S: _IQ3,
    Q.Q3_K: _BELOW_Q4_K,
    Q.Q2_K: _BELOW_Q4_K,
    Q.TQ1_0: _BELOW_Q4_K,
    Q.TQ2_0: _BELOW_Q4_K,
}

_BY_NAME = {t.name: t for t in WEAK_HEAD_TYPES}


def weak_head_types(types: Iterable[int | str | GGMLQuantizationType]) -> tuple[GGMLQuantizationType, ...]:
    """Those of ``types`` (ggml type numbers, members, or names such as ``"Q2_K"``) that usually break
    acceptance, each once, in :data:`WEAK_HEAD_TYPES`' order; empty when none does."""
    found: set[GGMLQuantizationType] = set()
    for t in types:
        if isinstance(t, str):
            member = _BY_NAME.get(t.upper())
        else:
            try:
                member = GGMLQuantizationType(t)
            except ValueError:
                member = None
        if member is not None and member in WEAK_HEAD_TYPES:
            found.add(member)
    return tuple(t for t in WEAK_HEAD_TYPES if t in found)
