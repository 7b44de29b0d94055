"""Print what the vendored gguf-py tables have that the installed (PyPI) gguf lacks.

Usage: python compare_tables.py VENDORED_GGUF_PY_DIR   (e.g. .../vendor/llama.cpp/gguf-py)
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def _load(path: str | None) -> ModuleType:
    """Import gguf afresh, from `path` if given, else the installed one."""
    for name in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        del sys.modules[name]
    if path:
        sys.path.insert(0, path)
    try:
        return importlib.import_module("gguf")
    finally:
        if path:
            sys.path.remove(path)


def main(vendored_dir: str) -> None:
    """Print the architectures, quant types and tensor kinds only the vendored tables have."""
    pypi = _load(None)
    archs = set(pypi.MODEL_ARCH_NAMES.values())
    qtypes = {t.name for t in pypi.GGMLQuantizationType}
    tensors = {t.name for t in pypi.MODEL_TENSOR}
    ven = _load(vendored_dir)
    print("archs only vendored:", sorted(set(ven.MODEL_ARCH_NAMES.values()) - archs))
    print("qtypes only vendored:", [f"{t.name}={t.value}" for t in ven.GGMLQuantizationType if t.name not in qtypes])
    print("tensor kinds only vendored:", len({t.name for t in ven.MODEL_TENSOR} - tensors))
    for arch in (ven.MODEL_ARCH.QWEN35MOE, ven.MODEL_ARCH.DEEPSEEK2):
        print(arch.name, "NextN:", sorted(t.name for t in ven.MODEL_TENSORS[arch] if "NEXTN" in t.name))


if __name__ == "__main__":
    main(sys.argv[1])
