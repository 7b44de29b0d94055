"""MTP head converters, one module per model family, in the shape of llama.cpp's ``conversion/``.

:data:`FAMILY_MODULES` says which module handles which Hugging Face architecture (the
``architectures`` entry of ``config.json``); importing a module registers its :class:`HeadModel`
subclass through ``@HeadModel.register(...)``. Adding a family is one new module and one line here; the
rest it touches (its rules, its tests, its docs) is listed in docs/development/adding-a-family.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gguf_mtp.errors import CheckpointError

if TYPE_CHECKING:
    from .base import HeadModel
    from .segments import tensor_segments
    from .tensors import MappedTensor, TensorSource
    from .writer import HeadGGUFWriter

__all__ = [
    "FAMILY_MODULES",
    "HeadGGUFWriter",
    "HeadModel",
    "MappedTensor",
    "TensorSource",
    "get_model_class",
    "model_class_for_arch",
    "model_class_for_config",
    "supported_architectures",
    "tensor_segments",
]

#: What :func:`__getattr__` imports on first use, and from which module (keeps ``--help`` free of numpy).
_LAZY = {"HeadGGUFWriter": "writer", "HeadModel": "base", "MappedTensor": "tensors", "TensorSource": "tensors",
         "tensor_segments": "segments"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


#: HF architecture name -> module of this package that converts its MTP head.
FAMILY_MODULES: dict[str, str] = {
    "NemotronHForCausalLM": "nemotron",
    "Glm4MoeForCausalLM": "glm4moe",
    "Glm4MoeLiteForCausalLM": "deepseek2",
    "DeepseekV3ForCausalLM": "deepseek2",
    "BailingMoeV3ForCausalLM": "bailingmoe3",
    "HYV3ForCausalLM": "hy_v3",
    "DeepseekV32ForCausalLM": "deepseek32",
    "GlmMoeDsaForCausalLM": "glm_dsa",
    "Qwen3_5MoeForCausalLM": "qwen35",
    "Qwen3_5MoeForConditionalGeneration": "qwen35",
    "Qwen3_5ForCausalLM": "qwen35",
    "Qwen3_5ForConditionalGeneration": "qwen35",
    "Qwen3NextForCausalLM": "qwen35",
    "Qwen4ExpForCausalLM": "qwen4exp",
    "Qwen4ExpForConditionalGeneration": "qwen4exp",
    "Step3p5ForCausalLM": "step35",
    "Step3p7ForConditionalGeneration": "step35",
    "MiMoV2FlashForCausalLM": "mimo2",
    "MiMoV2ForCausalLM": "mimo2",
}


def supported_architectures() -> list[str]:
    """The HF architecture names an MTP head can be converted from."""
    return sorted(FAMILY_MODULES)


def get_model_class(hf_arch: str) -> type[HeadModel]:
    """The converter class for an HF architecture name (imports its family module).

    Raises:
        CheckpointError: no converter handles ``hf_arch``; the message lists the supported ones.
    """
    module = FAMILY_MODULES.get(hf_arch)
    if module is None:
        raise CheckpointError(
            f"architecture {hf_arch!r} is not supported; supported: {', '.join(supported_architectures())}"
        )
    importlib.import_module(f"{__name__}.{module}")
    from .base import HeadModel

    return HeadModel._classes[hf_arch]


def model_class_for_config(config: dict[str, Any], where: str | None = None) -> type[HeadModel]:
    """The converter class for a checkpoint's ``config.json`` (its first ``architectures`` entry).

    Raises:
        CheckpointError: no ``architectures`` entry, or none is supported.
    """
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(
            "config.json has no \"architectures\" list; supported: " + ", ".join(supported_architectures()), where
        )
    for arch in archs:
        if arch in FAMILY_MODULES:
            return get_model_class(arch)
    from gguf_mtp.model.arch_rules import refusal_for_hf

    refused = refusal_for_hf(archs[0])
    if refused is not None:
        gguf_arch, refusal = refused
        raise CheckpointError(f"{archs[0]} ({gguf_arch}): gguf-mtp makes no MTP head for it: {refusal.reason}", where)
    raise CheckpointError(
        f"architecture {archs[0]!r} is not supported; supported: {', '.join(supported_architectures())}", where
    )


def model_class_for_arch(arch: str) -> type[HeadModel]:
    """The converter class whose heads become GGUF architecture ``arch`` (``nemotron_h_moe``).

    Raises:
        CheckpointError: no converter writes ``arch``.
    """
    for hf_arch in FAMILY_MODULES:
        get_model_class(hf_arch)
    from .base import HeadModel

    model_class = HeadModel._classes_by_arch.get(arch)
    if model_class is None:
        known = ", ".join(sorted(HeadModel._classes_by_arch))
        raise CheckpointError(f"no MTP head converter writes architecture {arch!r}; known: {known}")
    return model_class
