"""gguf-py's tables without gguf-py's numpy: ``gguf.constants`` alone, the rest of gguf-py on first use.

gguf-mtp builds on gguf-py's tables (:class:`gguf.constants.GGUFValueType`, ``GGMLQuantizationType``,
``GGML_QUANT_SIZES``, ``Keys``), which are plain Python in ``gguf/constants.py``. But ``gguf/__init__.py``
imports the whole of gguf-py (its reader, writer, quantizers, metadata), and with it numpy and yaml: about
0.1 s before a command that only copies bytes can start. :func:`defer_gguf_package` registers the ``gguf``
package without running its ``__init__``; ``from gguf.constants import X`` then loads just that module, and
the first lookup of any other name on the package (``from gguf import GGUFWriter``, ``gguf.quants``) runs
``__init__`` in place, as ``import gguf`` would have done. The package object is the real one (the one
``import gguf`` would make, from its own spec), and ``gguf.constants`` is the module ``__init__`` then
imports, so every class has one identity however it was reached.

It also holds, as plain strings, the few names of llama.cpp's newer gguf-py that PyPI's gguf (0.19.0) lacks and
gguf-mtp writes (:data:`NEWER_ARCH_NAMES`, :data:`NEWER_TENSOR_NAMES`, :data:`NEWER_KEYS`): the one place they are
spelt, checked against build b11434's ``gguf-py/gguf/constants.py`` by ``tests/test_gguf_tables.py``.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["NEWER_ARCH_NAMES", "NEWER_KEYS", "NEWER_TENSOR_NAMES", "defer_gguf_package"]

PACKAGE = "gguf"

#: ``MODEL_ARCH`` member -> GGUF architecture name, for architectures llama.cpp b11434 has and PyPI gguf lacks.
NEWER_ARCH_NAMES: Mapping[str, str] = {
    "QWEN4EXP": "qwen4exp",
}

#: ``MODEL_TENSOR`` member -> name template (``TENSOR_NAMES``), for tensors of llama.cpp b11434 that PyPI gguf lacks
#: and a head gguf-mtp makes carries (qwen4exp's MTP block: its hyper-connections, QSA indexer and mixer head).
NEWER_TENSOR_NAMES: Mapping[str, str] = {
    "HC_ATTN_NORM": "blk.{bid}.hc_attn_norm",
    "HC_ATTN_DOWN": "blk.{bid}.hc_attn_down",
    "HC_ATTN_UP": "blk.{bid}.hc_attn_up",
    "HC_ATTN_INJECT": "blk.{bid}.hc_attn_inject",
    "HC_FFN_NORM": "blk.{bid}.hc_ffn_norm",
    "HC_FFN_DOWN": "blk.{bid}.hc_ffn_down",
    "HC_FFN_UP": "blk.{bid}.hc_ffn_up",
    "HC_FFN_INJECT": "blk.{bid}.hc_ffn_inject",
    "INDEXER_Q_PROJ": "blk.{bid}.indexer.q_proj",
    "INDEXER_K_PROJ": "blk.{bid}.indexer.k_proj",
    "INDEXER_Q_NORM": "blk.{bid}.indexer.q_norm",
    "NEXTN_HC_HEAD_NORM": "blk.{bid}.nextn.hc_head_norm",
    "NEXTN_HC_HEAD_DOWN": "blk.{bid}.nextn.hc_head_down",
    "NEXTN_HC_HEAD_UP": "blk.{bid}.nextn.hc_head_up",
}

#: ``Keys`` attribute path -> key template, for the keys of llama.cpp b11434 that PyPI gguf lacks and gguf-mtp writes.
NEWER_KEYS: Mapping[str, str] = {
    "HyperConnection.COUNT": "{arch}.hyper_connection.count",
    "HyperConnection.LOW_RANK": "{arch}.hyper_connection.low_rank",
    "Attention.COMPRESS_RATIOS": "{arch}.attention.compress_ratios",
}


def defer_gguf_package() -> None:
    """Register gguf-py's package so that its submodules load alone and its ``__init__`` runs on first use.

    Does nothing when ``gguf`` is already imported (or being imported), or is not an importable package
    (the import that needs it then fails as it would have).
    """
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    deferred = _DeferredInit(package, spec.loader)
    package.__dict__.update(__getattr__=deferred.getattr, __dir__=deferred.dir)  # PEP 562: a name it lacks
    sys.modules[PACKAGE] = package


class _DeferredInit:
    """A package's ``__init__``, run once, by the first lookup of a name the package does not hold yet."""

    def __init__(self, package: ModuleType, loader: Loader) -> None:
        self._package = package
        self._loader = loader
        self._lock = threading.RLock()  # another thread that looks a name up meanwhile waits for it
        self._started = False

    def getattr(self, name: str) -> Any:
        self.run()
        try:  # not the module's own lookup: that would ask this hook again while ``__init__`` runs
            return object.__getattribute__(self._package, name)
        except AttributeError:
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None

    def dir(self) -> list[str]:
        self.run()
        return sorted(self._package.__dict__)

    def run(self) -> None:
        with self._lock:
            if self._started:  # done, or under way in this thread (``__init__`` looking up a name not bound yet)
                return
            self._started = True
            try:
                self._loader.exec_module(self._package)
            except BaseException:
                if sys.modules.get(PACKAGE) is self._package:  # as a failed import does: the next one tries again
                    del sys.modules[PACKAGE]
                raise
            finally:
                for hook in ("__getattr__", "__dir__"):
                    if getattr(self._package.__dict__.get(hook), "__self__", None) is self:
                        del self._package.__dict__[hook]
