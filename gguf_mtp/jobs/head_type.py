"""The head type choice (``outtype``) shared by compose, graft, extract and convert.

The NextN block's tensors are re-typed as ``llama-quantize --pure`` (``--allow-requantize``) would write
them (:mod:`gguf_mtp.format.quant_rules` picks each type, :mod:`gguf_mtp.format.quantize` makes the bytes);
every other tensor is untouched. With an importance matrix (``imatrix``, :mod:`gguf_mtp.format.imatrix`)
each tensor is quantized with its statistics as ``llama-quantize --imatrix`` does, and the types that need one
are taken. Here: the parameters' parsing and their one-line refusals, the per-tensor plan step, the head's
size summary, and the two advisory lines (a low-bit head, a BF16 head in a quantized target).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gguf.constants import GGMLQuantizationType

from gguf_mtp.errors import BadGGUFError, ParameterError
from gguf_mtp.files.plan import Segment
from gguf_mtp.format.header import TensorInfo, tensor_nbytes
from gguf_mtp.format.imatrix import KEY_N_LAYER_NEXTN, NEXTN_HINT, ImportanceMatrix, read_imatrix
from gguf_mtp.format.quant_rules import (
    embedding_tensor_type,
    embedding_type,
    head_tensor_type,
    head_type,
    is_quantized,
    needs_imatrix,
)
from gguf_mtp.format.quantize import (
    INSTALL_HINT,
    NUMPY_TYPES,
    QuantizerUnavailableError,
    ggml_available,
    retyped_tensor,
)
from gguf_mtp.model.head_types import weak_head_types
from gguf_mtp.model.shards import ShardSet
from gguf_mtp.text import human_bytes

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "HeadSummary",
    "HeadTensor",
    "bf16_head_hint",
    "head_importance",
    "head_notes",
    "low_bit_warning",
    "parse_imatrix",
    "parse_outtype",
    "retype_embedding_tensor",
    "retype_head_tensor",
    "summarize_head",
]


def parse_outtype(
    outtype: str | GGMLQuantizationType | None, parameter: str = "outtype", *, imatrix: bool | None = None
) -> GGMLQuantizationType | None:
    """The head type ``outtype`` names (``None``: keep the source's types); ``parameter``: the parameter it was
    given as, for the refusals (``outtype``, ``embd_type``); ``imatrix``: whether an importance matrix is given,
    so the types that need one are taken too (``None``: none can be, as for ``embd_type``).

    Raises:
        ParameterError: an unknown type, an importance-matrix type without ``imatrix``, or a type only
            llama.cpp's quantizer writes when llama-cpp-python is not installed (one line saying what to install).
    """
    if isinstance(outtype, GGMLQuantizationType):
        outtype = outtype.name
    if outtype is None:
        wanted = None
    else:
        try:
            wanted = embedding_type(outtype) if parameter == "embd_type" else head_type(outtype, imatrix=imatrix)
        except ValueError as e:
            raise ParameterError(f"{parameter} {e}", parameter=parameter) from None
    if wanted is not None and wanted not in NUMPY_TYPES and not ggml_available():
        raise ParameterError(f"{parameter} {wanted.name.lower()} needs llama.cpp's quantizer: {INSTALL_HINT}",
                             parameter=parameter)
    return wanted


def parse_imatrix(
    imatrix: str | os.PathLike[str] | ImportanceMatrix | None, outtype: GGMLQuantizationType | None
) -> ImportanceMatrix | None:
    """The importance matrix file ``imatrix`` names, for a head written in ``outtype``.

    Raises:
        BadGGUFError: the file is not a GGUF imatrix, or ``outtype`` needs one and it has no NextN statistics
            (no ``imatrix.n_layer_nextn``: llama-imatrix ran without ``--nextn`` / ``--model-draft``).
        ParameterError: no ``outtype`` (the head's bytes are copied: nothing is quantized), or llama.cpp's
            quantizer (llama-cpp-python) is not installed.
    """
    if imatrix is None:
        return None
    if outtype is None:
        raise ParameterError("imatrix needs outtype: without it the head's bytes are copied, not quantized",
                             parameter=("imatrix", "outtype"))
    if not ggml_available():
        raise ParameterError(f"imatrix needs llama.cpp's quantizer: {INSTALL_HINT}", parameter="imatrix")
    matrix = imatrix if isinstance(imatrix, ImportanceMatrix) else read_imatrix(imatrix)
    if needs_imatrix(outtype) and matrix.n_layer_nextn < 1:
        raise BadGGUFError(f"has no NextN statistics (no {KEY_N_LAYER_NEXTN}), which a {outtype.name} head needs: "
                           f"{NEXTN_HINT}", matrix.path)
    return matrix


def head_importance(
    imatrix: ImportanceMatrix | None, name: str, shape: tuple[int, ...], wanted: int
) -> np.ndarray | None:
    """The imatrix rows (one per expert) tensor ``name`` (its ``shape`` in ggml order) is quantized to ``wanted``
    with, as llama-quantize looks them up: by the name the tensor has in the file written. ``None`` without an
    imatrix, or for a tensor it does not cover (llama-quantize quantizes it without, unless its type needs one).

    Raises:
        BadGGUFError: ``wanted`` needs an imatrix and it has no entry for ``name``, or the entry is unusable.
    """
    if imatrix is None:
        return None
    importance = imatrix.importance(name, shape)
    if importance is None and needs_imatrix(wanted):
        raise BadGGUFError(f"has no statistics for {name!r}, which {GGMLQuantizationType(wanted).name} needs "
                           f"(llama-quantize refuses it too): {NEXTN_HINT}", imatrix.path)
    return importance


def retype_embedding_tensor(
    tensor: TensorInfo, path: str | os.PathLike[str], offset: int, embd_type: GGMLQuantizationType | None
) -> tuple[TensorInfo, tuple[Segment, ...]] | None:
    """A sidecar's ``token_embd`` / ``output`` (its bytes at absolute ``offset`` of ``path``) in ``embd_type``, as
    ``llama-quantize --token-embedding-type --output-tensor-type`` writes it (:func:`embedding_tensor_type`);
    ``None`` for any other tensor, or without ``embd_type``.

    Raises:
        ParameterError: the rows do not fit the type's blocks, or the quantizer is missing.
        BadGGUFError: the tensor cannot be converted (an integer type).
    """
    if embd_type is None:
        return None
    try:
        wanted = embedding_tensor_type(tensor.name, tensor.shape, embd_type)
    except ValueError as e:
        raise ParameterError(f"embd_type {embd_type.name.lower()}: {e}", parameter="embd_type") from None
    if wanted is None:
        return None
    return _retyped(tensor, path, offset, wanted, "embd_type")


def retype_head_tensor(
    tensor: TensorInfo, path: str | os.PathLike[str], offset: int, outtype: GGMLQuantizationType | None,
    arch: str | None, imatrix: ImportanceMatrix | None = None, written_as: str | None = None,
) -> tuple[TensorInfo, tuple[Segment, ...]]:
    """One NextN tensor (its bytes at absolute ``offset`` of ``path``) in the type llama-quantize --pure
    gives it for ``outtype``: its table entry and segments (a kernel copy when the type stays). With
    ``imatrix``, quantized with the statistics of the name it is ``written_as`` (default: its own)."""
    wanted = tensor.ggml_type if outtype is None else head_tensor_type(
        tensor.name, tensor.shape, tensor.ggml_type, outtype, arch)
    copied = wanted == tensor.ggml_type  # llama-quantize copies such a tensor: no imatrix look-up
    importance = None if copied else head_importance(imatrix, written_as or tensor.name, tensor.shape, wanted)
    return _retyped(tensor, path, offset, wanted, "outtype", importance)


def _retyped(
    tensor: TensorInfo, path: str | os.PathLike[str], offset: int, wanted: int, parameter: str,
    importance: np.ndarray | None = None,
) -> tuple[TensorInfo, tuple[Segment, ...]]:
    """:func:`retyped_tensor`, its refusals in one line: a tensor that cannot be converted is the file's
    (:class:`BadGGUFError`), a missing quantizer the option's (:class:`ParameterError` naming ``parameter``)."""
    try:
        return retyped_tensor(tensor, path, offset, wanted, importance=importance)
    except ValueError as e:
        raise BadGGUFError(str(e), path) from None
    except QuantizerUnavailableError as e:
        raise ParameterError(str(e), parameter=parameter) from None


@dataclass(frozen=True)
class HeadSummary:
    """The NextN block's tensor types and size (what reports, ``--json`` and the model card show)."""

    types: dict[str, int]  # type name -> tensor count, largest share first
    nbytes: int
    main_type: str  # the type holding most of the bytes

    def describe(self) -> str:
        """``Q8_0 head, 3.1 MiB (12 Q8_0, 4 F32)``: the main type, the size and the tensors of each type."""
        kinds = ", ".join(f"{n} {t}" for t, n in self.types.items())
        return f"{self.main_type} head, {human_bytes(self.nbytes)} ({kinds})"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.main_type, "bytes": self.nbytes, "tensor_types": dict(self.types)}


class HeadTensor(Protocol):
    """What the summary and the hint read of a planned tensor (:class:`TensorInfo` or a convert plan's)."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def type_name(self) -> str: ...
    @property
    def nbytes(self) -> int: ...


def summarize_head(tensors: Iterable[HeadTensor]) -> HeadSummary:
    """Types and size of a NextN block's tensors."""
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for t in tensors:
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
        sizes[t.type_name] = sizes.get(t.type_name, 0) + t.nbytes
    order = sorted(counts, key=lambda k: -sizes[k])
    return HeadSummary({k: counts[k] for k in order}, sum(sizes.values()), order[0] if order else "none")


def low_bit_warning(outtype: GGMLQuantizationType | None) -> str | None:
    """One line when ``outtype`` usually breaks acceptance (:data:`gguf_mtp.model.head_types.WEAK_HEAD_TYPES`:
    of the head types, those below Q4_K)."""
    if outtype is None or not weak_head_types([outtype]):
        return None
    return (f"a {outtype.name} head drafts worse: acceptance measured on a Qwen3.6-27B drafter is flat from Q4_K_M "
            "(66.6 %) to Q8_0 (66.4 %) and drops below (Q3_K_M 63.5 %, Q2_K 55.3 %); q4_k or above keeps it")


def bf16_head_hint(head: Iterable[HeadTensor], trunk_types: Iterable[int], arch: str | None) -> str | None:
    """One line when a BF16/F16 head goes into a quantized target: the size a Q8_0 head would have."""
    tensors = list(head)
    summary = summarize_head(tensors)
    if summary.main_type not in ("BF16", "F16") or not any(is_quantized(t) for t in trunk_types):
        return None
    q8 = GGMLQuantizationType.Q8_0
    size = sum(
        tensor_nbytes(t.shape, head_tensor_type(t.name, t.shape, GGMLQuantizationType[t.type_name], q8, arch))
        for t in tensors
    )
    return (f"the head is {human_bytes(summary.nbytes)} in {summary.main_type} in a quantized target; "
            f"--outtype q8_0 would make it {human_bytes(size)}")


def head_notes(
    head: Iterable[HeadTensor], outtype: GGMLQuantizationType | None, target: ShardSet | None, arch: str | None
) -> list[str]:
    """The advisory lines about the head's type (compose and convert show them with the plan): the low-bit
    warning for an ``outtype`` below Q4_K, or, when the head keeps its type (``outtype`` ``None``) and goes
    into a quantized ``target``, the size a Q8_0 head would have (:func:`bf16_head_hint`)."""
    warning = low_bit_warning(outtype)
    if warning:
        return [warning]
    if outtype is None and target is not None:
        hint = bf16_head_hint(head, (t.ggml_type for _, t in target.iter_tensors()), arch)
        return [hint] if hint else []
    return []
