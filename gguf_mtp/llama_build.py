"""The llama.cpp a command proves against, named once: ``--llama-cpp PATH`` or ``$GGUF_MTP_LLAMA_CPP``.

PATH is a llama.cpp build folder: its ``libllama.so`` with the ``libggml*.so`` beside it (in PATH, PATH/lib,
PATH/bin or PATH/build/bin, where llama.cpp's cmake puts them) and its tools (``llama-server``,
``llama-quantize``, ``llama-gguf-split`` in PATH/bin or PATH/build/bin). :func:`resolve` turns it into a
:class:`LlamaCppBuild`; :func:`chosen` is the one the environment names (the command line's option sets the
variable, so the option wins and every child inherits it). Unset, nothing changes: llama-cpp-python's own
``libllama`` (0c1e570 in 0.3.36) runs every check, and ``bench`` finds its llama-server as before.

llama.cpp runs in child processes (``llama_check``, ``accept_child``), which import llama-cpp-python: its
``llama_cpp`` module loads ``libllama.so`` from the folder ``LLAMA_CPP_LIB_PATH`` names instead of its own
(:func:`child_environment`), and that library finds its ggml libraries beside itself (cmake's ``$ORIGIN``
run path). The quantizer loads ``libggml-base.so`` from :attr:`LlamaCppBuild.lib_dir` itself.

Before a chosen library is used, :func:`resolve` checks that it has every function gguf-mtp calls through
llama-cpp-python (:data:`LLAMA_FUNCTIONS`, :data:`GGML_FUNCTIONS`, and the MTP helpers of ``llama-ext.h``,
:data:`MTP_HELPERS`, which llama-cpp-python's ``llama_cpp_ext`` finds under their C or C++-mangled names), by
reading the dynamic symbol tables of ``libllama`` and the ``libggml*`` beside it (nothing of the library runs).
A missing one is one line naming the library and the functions.

That the functions are there is not enough: llama-cpp-python 0.3.36's ctypes mirror 0c1e570's declarations.
The evidence that they run build b11434 correctly is ``tests/test_llama_build.py::
test_every_declaration_the_bindings_mirror_is_unchanged_at_b11434``: every struct, enum and function
declaration of 0c1e570's ``include/llama.h``, ``src/llama-ext.h`` and ``ggml/include/ggml.h`` is the same,
token for token, in b11434's (b11434 only adds declarations, and a session-file version).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import signal
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .constants import ENV_LLAMA_CPP
from .errors import ParameterError

__all__ = [
    "GGML_FUNCTIONS",
    "LIB_SUBFOLDERS",
    "LLAMA_FUNCTIONS",
    "LOG_TAIL_BYTES",
    "LOG_TAIL_LINES",
    "MTP_HELPERS",
    "TOOL_SUBFOLDERS",
    "LlamaCppBuild",
    "child_environment",
    "chosen",
    "die_with_parent",
    "dynamic_symbols",
    "last_lines",
    "missing_functions",
    "read_log_end",
    "resolve",
]

#: Lines of a llama.cpp child's log shown when it fails (llama-server's, accept's child's).
LOG_TAIL_LINES = 12
#: The most bytes of a child's log read back for them.
LOG_TAIL_BYTES = 64 * 1024
#: The variable llama-cpp-python reads: the folder its ``libllama`` is loaded from.
LIB_PATH_VARIABLE = "LLAMA_CPP_LIB_PATH"
#: Where a build folder's libraries may be, in the order looked at (cmake: build/bin).
LIB_SUBFOLDERS = (".", "lib", "bin", "build/bin")
#: Where a build folder's tools may be.
TOOL_SUBFOLDERS = ("bin", "build/bin")
LIBLLAMA = "libllama.so"
#: What marks a llama.cpp source tree.
SOURCE_MARKERS = ("CMakeLists.txt", "src/llama.cpp")
BUILD_HINT = ("build it first (cmake -B build && cmake --build build --config Release -j, which puts libllama.so "
              "and the tools in build/bin), then name this folder or its build/bin")

#: The llama.h functions gguf-mtp's llama.cpp children call (``check/llama_check.py``, ``check/accept_child.py``).
LLAMA_FUNCTIONS = (
    "llama_backend_init", "llama_batch_free", "llama_batch_init", "llama_context_default_params", "llama_decode",
    "llama_free", "llama_get_logits_ith", "llama_get_memory", "llama_init_from_model", "llama_memory_clear",
    "llama_memory_seq_cp", "llama_memory_seq_rm", "llama_model_default_params", "llama_model_free",
    "llama_model_get_vocab", "llama_model_load_from_file", "llama_model_n_embd_out",
    "llama_model_n_layer", "llama_model_n_layer_nextn", "llama_set_adapter_cvec", "llama_tokenize",
    "llama_vocab_is_eog", "llama_vocab_n_tokens",
)
#: The ``llama-ext.h`` MTP helpers they call (C linkage, or C++-mangled where llama.cpp exports them so).
MTP_HELPERS = (
    "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith", "llama_set_embeddings_nextn",
    "llama_set_nextn_layer_offset",
)
#: The ggml functions: the build's identity (``llama_check.build_of``) and the quantizer (``format/quantize.py``).
GGML_FUNCTIONS = ("ggml_commit", "ggml_version", "ggml_get_type_traits", "ggml_quantize_chunk",
                  "ggml_quantize_requires_imatrix")

#: The most section headers and dynamic symbols read from one library (a large libllama has about 10,000).
MAX_SECTIONS = 1 << 16
MAX_SYMBOLS = 1 << 22
_SHT_DYNSYM = 11
_SHN_UNDEF = 0


@dataclass(frozen=True)
class LlamaCppBuild:
    """A llama.cpp build folder, resolved: where its libraries and tools are.

    Attributes:
        folder: the folder as named.
        lib_dir: the folder holding ``libllama.so`` (and the ``libggml*.so`` it loads).
        server, quantize, gguf_split: its ``llama-server``, ``llama-quantize``, ``llama-gguf-split``, or ``None``
            where the build has none.
    """

    folder: Path
    lib_dir: Path
    server: Path | None
    quantize: Path | None
    gguf_split: Path | None

    @property
    def libllama(self) -> Path:
        return self.lib_dir / LIBLLAMA


def _first_file(folder: Path, subfolders: Iterable[str], name: str) -> Path | None:
    return next((folder / sub / name for sub in subfolders if (folder / sub / name).is_file()), None)


def _tool(folder: Path, name: str) -> Path | None:
    found = _first_file(folder, TOOL_SUBFOLDERS, name)
    return found if found is not None and os.access(found, os.X_OK) else None


def resolve(folder: str | os.PathLike[str]) -> LlamaCppBuild:
    """The build in ``folder``, checked: its ``libllama`` has every function gguf-mtp calls.

    Raises:
        ParameterError: ``folder`` is no folder, a source tree that was not built, holds no ``libllama.so``, or
            its libraries lack a function gguf-mtp calls (one line naming the library and the functions).
    """
    root = Path(folder).expanduser().absolute()
    if not root.is_dir():
        raise ParameterError("not a folder (name a llama.cpp build folder)", root, "llama_cpp")
    libllama = _first_file(root, LIB_SUBFOLDERS, LIBLLAMA)
    if libllama is None:
        if all((root / marker).is_file() for marker in SOURCE_MARKERS):
            raise ParameterError(f"a llama.cpp source tree, not a build: {BUILD_HINT}", root, "llama_cpp")
        places = ", ".join(str(root / sub) for sub in LIB_SUBFOLDERS)
        raise ParameterError(f"no {LIBLLAMA} in {places}", root, "llama_cpp")
    missing = missing_functions(libllama.parent)
    if missing:
        raise ParameterError(f"{LIBLLAMA} and the libggml beside it lack {', '.join(missing)}, which "
                             "gguf-mtp calls: not a llama.cpp build it can run", libllama, "llama_cpp")
    return LlamaCppBuild(root, libllama.parent, _tool(root, "llama-server"), _tool(root, "llama-quantize"),
                         _tool(root, "llama-gguf-split"))


def chosen(environ: Mapping[str, str] | None = None) -> LlamaCppBuild | None:
    """The build ``$GGUF_MTP_LLAMA_CPP`` names (resolved and checked), or ``None`` where it is unset or empty.

    Raises:
        ParameterError: as :func:`resolve`.
    """
    folder = (os.environ if environ is None else environ).get(ENV_LLAMA_CPP)
    return _resolved(folder) if folder else None


@functools.cache
def _resolved(folder: str) -> LlamaCppBuild:
    """:func:`resolve`, once per folder and process: the quantizer asks for every slab of rows."""
    return resolve(folder)


def child_environment(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a llama.cpp child: ``base`` (default: ours) and ``extra``, with ``LLAMA_CPP_LIB_PATH``
    naming the chosen build's library folder, when one is chosen.

    Raises:
        ParameterError: as :func:`resolve`.
    """
    environ = dict(os.environ if base is None else base, **extra)
    build = chosen(environ)
    if build is not None:
        environ[LIB_PATH_VARIABLE] = str(build.lib_dir)
    return environ


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when we die (no orphan even after SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl = libc.prctl

    def set_pdeathsig() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    return set_pdeathsig


def read_log_end(log: IO[bytes]) -> str:
    """The last :data:`LOG_TAIL_BYTES` of a child's log file, as text (a log may be any size)."""
    log.seek(max(0, os.fstat(log.fileno()).st_size - LOG_TAIL_BYTES))
    return log.read().decode("utf-8", "replace")


def last_lines(text: str, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` non-empty lines of a child's log."""
    return tuple(line for line in text.splitlines() if line.strip())[-lines:]


# ------------------------------------------------------------------------------------------- symbols


def missing_functions(lib_dir: Path) -> list[str]:
    """The functions gguf-mtp calls that neither ``lib_dir/libllama.so`` nor a ``libggml*.so`` beside it defines.

    Raises:
        ParameterError: a library there is not a readable 64-bit little-endian ELF shared object.
    """
    defined: set[str] = set()
    for library in [lib_dir / LIBLLAMA, *sorted(lib_dir.glob("libggml*.so"))]:
        defined |= dynamic_symbols(library)
    missing = [name for name in (*LLAMA_FUNCTIONS, *GGML_FUNCTIONS) if name not in defined]
    # llama-ext.h has no extern "C": a C++ build exports the helper as _Z<length><name><parameters>
    missing += [name for name in MTP_HELPERS
                if name not in defined and not any(s.startswith(f"_Z{len(name)}{name}") for s in defined)]
    return missing


def dynamic_symbols(library: Path) -> set[str]:
    """The names ``library`` (an ELF64 little-endian shared object) defines in its dynamic symbol table.

    Raises:
        ParameterError: not such a file, or one whose tables do not fit inside it.
    """
    try:
        with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _defined_names(data, library)
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise ParameterError(f"cannot read it: {e}", library, "llama_cpp") from None


def _defined_names(data: mmap.mmap, library: Path) -> set[str]:
    def refuse(why: str) -> ParameterError:
        return ParameterError(f"not a shared library gguf-mtp can read ({why})", library, "llama_cpp")

    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise refuse("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shnum > MAX_SECTIONS or shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise refuse("its section table lies outside the file")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_DYNSYM:
            continue
        if entsize < 24 or link >= shnum or offset + size > len(data) or size // entsize > MAX_SYMBOLS:
            raise refuse("its dynamic symbol table lies outside the file")
        str_offset, str_size = sections[link][4], sections[link][5]
        if str_offset + str_size > len(data):
            raise refuse("its symbol names lie outside the file")
        for i in range(size // entsize):
            name_at, _, _, section = struct.unpack_from("<IBBH", data, offset + i * entsize)
            if section == _SHN_UNDEF or name_at >= str_size:
                continue
            start = str_offset + name_at
            end = data.find(b"\0", start, str_offset + str_size)
            names.add(data[start:end if end >= 0 else str_offset + str_size].decode("ascii", "replace"))
    return names
