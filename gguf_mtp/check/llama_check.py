"""Ask the real llama.cpp (through llama-cpp-python's low-level API) whether it accepts a GGUF.

A load alone proves little: llama.cpp quietly treats a file whose NextN block lacks e.g.
``nextn.eh_proj`` as trunk-only, and without ``load_mtp`` it never reads NextN data. So the probe
loads with ``load_mtp`` and ``check_tensors``, runs one trunk decode and one decode step of an
MTP-type context through each NextN block (``llama_set_nextn_layer_offset`` selects the block when there
are several), and checks the logits are finite. An MTP-only file (a draft) gets no trunk decode: it has
no trunk graph, and llama.cpp crashes trying one; given the target it serves (``beside``), a sidecar's MTP
steps take the hidden rows of that target's trunk decode, as llama-server pairs them. It runs in a subprocess
because a failed GGML assert aborts the whole process; llama.cpp's own messages (stderr) are kept.

The check is about the file, not about fast kernels, so its result must not depend on the CPU the build
was compiled for: the model is loaded without llama.cpp's "extra" buffer types (``use_extra_bufts =
False``: no AMX, no weight repacking, no KleidiAI), on the CPU only, memory-mapped, read eagerly, and the
contexts run without flash attention or operator offload (see :data:`MODEL_PARAMS`, :data:`CONTEXT_PARAMS`).
A default (native) build of llama-cpp-python on a CPU with AMX segfaults in ``ggml_backend_amx_mul_mat``
otherwise. If llama.cpp still dies by a signal, that is reported as llama.cpp crashing in its own compute
code (:attr:`LlamaCheck.crashed`), which is not a verdict on the file.

Run as a program it is the child: ``python -m gguf_mtp.check.llama_check PATH [--no-mtp] [--no-trunk]
[--beside TARGET]`` prints one JSON line; ``--build`` (no PATH) prints only the build it would check with.

Every report names that build (:func:`build_of`): ggml's own ``ggml_commit()`` and ``ggml_version()``, looked up
through the ``libllama`` llama-cpp-python loaded (its own, or the chosen build's: the child's ``LLAMA_CPP_LIB_PATH``
comes from :func:`gguf_mtp.llama_build.child_environment`), so the record is the library that ran, not the commit a
llama-cpp-python release is documented to vendor.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from gguf_mtp.constants import install_hint
from gguf_mtp.llama_build import child_environment
from gguf_mtp.text import printable

__all__ = [
    "CONTEXT_PARAMS",
    "INSTALL_HINT",
    "MODEL_PARAMS",
    "BindingError",
    "LlamaCheck",
    "build_of",
    "check_with_llama",
    "emit_report",
    "import_bindings",
    "last_report",
    "library_of",
    "llama_cpp_available",
    "llama_cpp_build",
    "llama_reason",
    "set_params",
    "signal_name",
]

INSTALL_HINT = install_hint("llama", "builds llama-cpp-python==0.3.36, a few minutes on 2 cores")
# llama_model_params fields the child sets (names of llama_cpp constants are resolved in the child). Together
# they keep the check off every CPU-feature-specific path a build may have: extra buffer types are how ggml
# reaches AMX tiles, repacked (aarch64/x86) layouts and KleidiAI; n_gpu_layers/split_mode keep any GPU out.
MODEL_PARAMS: dict[str, Any] = {
    "n_gpu_layers": 0,
    "split_mode": "LLAMA_SPLIT_MODE_NONE",
    "use_extra_bufts": False,
    "no_host": False,
    "load_mode": "LLAMA_LOAD_MODE_MMAP",
    "lazy_mode": "LLAMA_LAZY_MODE_OFF",
    "check_tensors": True,
}
# llama_context_params fields the child sets (besides sizes, threads and ctx_type).
CONTEXT_PARAMS: dict[str, Any] = {
    "flash_attn_type": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
    "offload_kqv": False,
    "op_offload": False,
    "no_perf": True,
}
logger = logging.getLogger(__name__)

_REASON = re.compile(r"(error|failed|GGML_ASSERT|corrupted|wrong|missing|invalid|exception)", re.IGNORECASE)


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python can be imported here."""
    return importlib.util.find_spec("llama_cpp") is not None


@dataclass
class LlamaCheck:
    """What llama.cpp said about one file."""

    path: str
    loaded: bool = False
    n_layer: int | None = None
    n_layer_nextn: int | None = None
    trunk_decode_ok: bool | None = None  # None: not attempted
    mtp_decode_ok: bool | None = None  # every NextN block's MTP decode step succeeded
    mtp_logits_finite: bool | None = None
    mtp_blocks_decoded: int | None = None  # NextN blocks an MTP decode step ran through
    error: str | None = None  # llama.cpp's reason, when it refused
    crashed: str | None = None  # signal name, when llama.cpp died by a signal (a llama.cpp/build problem)
    log_tail: str = ""
    #: sha256 of the last token's logits (float32) of the trunk and the MTP step (the first NextN block's):
    #: equal digests of two files mean llama.cpp computes bit-identical logits from them (same build, inputs).
    trunk_logits_sha256: str | None = None
    mtp_logits_sha256: str | None = None
    llama_cpp_build: str | None = None  # the llama.cpp that ran the check (:func:`build_of`)
    llama_cpp_library: str | None = None  # the libllama file it ran from (:func:`library_of`)
    #: the target a sidecar ran beside: its trunk decode gave the hidden rows the sidecar's MTP decode took
    beside: str | None = None

    @property
    def ok(self) -> bool:
        """Loaded, and every step that was attempted succeeded."""
        steps = (self.trunk_decode_ok, self.mtp_decode_ok, self.mtp_logits_finite)
        return self.loaded and self.error is None and all(s is not False for s in steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}

    def summary(self) -> str:
        """One line: what llama.cpp did with the file."""
        if self.crashed and self.error:
            return self.error
        if not self.loaded:
            return f"llama.cpp refused it: {self.error or 'load failed'}"
        parts = [f"n_layer={self.n_layer}", f"n_layer_nextn={self.n_layer_nextn}"]
        if self.trunk_decode_ok is not None:
            parts.append("trunk decode " + ("ok" if self.trunk_decode_ok else "FAILED"))
        if self.mtp_decode_ok is not None:
            parts.append(self._mtp_part())
        if self.error:
            parts.append(self.error)
        return "llama.cpp loaded it: " + ", ".join(parts)

    def _mtp_part(self) -> str:
        """``MTP decode ok`` or ``FAILED``, through how many blocks, on whose rows, with what logits."""
        finite = "" if self.mtp_logits_finite in (None, True) else " (non-finite logits)"
        blocks = f" through {self.mtp_blocks_decoded} NextN blocks" if (self.mtp_blocks_decoded or 0) > 1 else ""
        rows = " on the target's hidden rows" if self.beside else ""
        return "MTP decode " + ("ok" if self.mtp_decode_ok else "FAILED") + blocks + rows + finite


_INVALID_DATA = "found tensors with invalid data"
_INVALID_TENSOR = re.compile(r"tensor '(?P<name>[^']*)' has invalid data")
#: Tensor names shown after llama.cpp's "found tensors with invalid data" (the rest counted).
_NAMES_SHOWN = 3


def _named_tensors(reason: str, lines: list[str]) -> str:
    """``reason`` with the tensors named when it is llama.cpp's "found tensors with invalid data", which names none:
    its log names each one on a line of its own ("tensor '...' has invalid data": a NaN or an infinity, or a block
    scale that is one, found by ``check_tensors``)."""
    if reason != _INVALID_DATA:
        return reason
    names = list(dict.fromkeys(m["name"] for line in lines if (m := _INVALID_TENSOR.search(line))))
    if not names:
        return reason
    shown = ", ".join(printable(name) for name in names[:_NAMES_SHOWN])
    more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    return f"{reason} (NaN or infinity): {shown}{more}"


#: llama.cpp's lines that only say loading failed, wrapping a cause logged before them: the loader's "failed to load
#: model from PATH" (the main file's header did not parse) and "failed to load GGUF split from PATH" (a split's), the
#: loading function's closing "failed to load model", llama-server's "unable to load model". ggml's own "failed to load
#: model: <why>" is not one: it says why.
_WRAPPER = re.compile(r"(failed to load (model|GGUF split)( from .*|, .*| '.*')?|unable to load model.*)$")
_SPLIT_WRAPPER = re.compile(r"failed to load GGUF split from (?P<path>.+)$")
_LOADER_ERROR = "error loading model:"
#: The logging function's name llama.cpp puts before each message ("gguf_init_from_reader: ...").
_FUNCTION_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*: ")


def _is_complaint(line: str) -> bool:
    return _REASON.search(line) is not None and _WRAPPER.search(line) is None


def llama_reason(stderr: str) -> str | None:
    """llama.cpp's most specific complaint in its log ``stderr``.

    The loader's "error loading model: <why>" line says why (with the tensors named, for invalid data), unless its
    why is only a wrapper (:data:`_WRAPPER`: ggml's GGUF reader refused a file): then see :func:`_wrapped_cause`.
    Without a loader line (an abort) it is the last complaint: the one the process stopped at.
    """
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    loader = next((i for i in range(len(lines) - 1, -1, -1) if _LOADER_ERROR in lines[i]), None)
    if loader is None:
        return _last_complaint(lines)
    why = lines[loader].split(_LOADER_ERROR, 1)[1].strip()
    if _WRAPPER.search(why) is None:
        return _named_tensors(why, lines)
    return _wrapped_cause(lines[:loader], why)


def _last_complaint(lines: list[str]) -> str | None:
    """The last complaint in the log's ``lines``, else its last line (None for an empty log)."""
    complaints = [line for line in lines if _is_complaint(line)]
    return complaints[-1] if complaints else (lines[-1] if lines else None)


def _wrapped_cause(before: list[str], wrapper: str) -> str:
    """The cause behind the loader's ``wrapper``: the first complaint logged ``before`` it (ggml's GGUF reader names
    the key or tensor first, then sums up: "failed to read key-value pairs"), without its function-name prefix, with
    the file named when it is a split's; the wrapper itself when nothing was logged before it."""
    cause = next((line for line in before if _is_complaint(line)), None)
    if cause is None:
        return wrapper
    split = _SPLIT_WRAPPER.search(wrapper)
    return _FUNCTION_PREFIX.sub("", cause) + (f" (in {split['path']})" if split else "")


def llama_cpp_build(timeout: float = 300.0) -> str | None:
    """The llama.cpp build a check would run against here (:func:`build_of`, read in a child as every check is),
    or ``None`` without llama-cpp-python or when the child says nothing."""
    if not llama_cpp_available():
        return None
    result = LlamaCheck("")
    proc = _spawn(result, [sys.executable, "-m", "gguf_mtp.check.llama_check", "--build"], timeout)
    report = last_report(proc.stdout) if proc is not None and proc.returncode == 0 else None
    build = (report or {}).get("llama_cpp_build")
    return build if isinstance(build, str) else None


def build_of(llama: Any) -> str | None:
    """``llama.cpp <commit> (ggml <version>)`` of the libraries the imported ``llama_cpp`` module loaded, or
    ``None`` where it cannot say (its ggml is older than ``ggml_commit``, or it has no ctypes library handle)."""
    import ctypes

    # dlsym on libllama's handle also searches the libraries it links: the ggml that libllama really uses.
    library: Any = getattr(getattr(llama, "llama_cpp", None), "_lib", None)
    try:
        commit, version = library.ggml_commit, library.ggml_version
    except AttributeError:
        return None
    commit.restype = version.restype = ctypes.c_char_p
    commit.argtypes = version.argtypes = []
    name = commit().decode(errors="replace")
    if name == "unknown":  # ggml reads its commit from git alone: a build from a tarball (an sdist) has none
        name = _build_name(library_of(llama)) or name
    text = f"llama.cpp {name} (ggml {version().decode(errors='replace')})"
    return printable(text)[:200]


#: Beside a shared build's ``libllama``: llama.cpp's common library, which records the build's number and commit
#: (``common/build-info.cpp``: ``LLAMA_BUILD_NUMBER``, ``LLAMA_COMMIT``).
_COMMON_LIBRARY = "libllama-common.so"


def _build_name(library: str | None) -> str | None:
    """``b<number>`` (with its commit where that says more) recorded by the ``libllama-common`` beside
    ``library``, or ``None`` (none there, or it records no number: a build without ``LLAMA_BUILD_NUMBER``)."""
    import ctypes

    if library is None or not os.path.isfile(common := os.path.join(os.path.dirname(library), _COMMON_LIBRARY)):
        return None
    try:
        lib = ctypes.CDLL(common)
        number = ctypes.c_int.in_dll(lib, "LLAMA_BUILD_NUMBER").value
        commit = (ctypes.c_char_p.in_dll(lib, "LLAMA_COMMIT").value or b"").decode(errors="replace")
    except (OSError, ValueError):
        return None
    if number <= 0:
        return None
    build = f"b{number}"
    return build if commit in ("", "unknown", build) else f"{build} ({commit})"


def library_of(llama: Any) -> str | None:
    """The path of the ``libllama`` the imported ``llama_cpp`` module loaded (its own, or ``LLAMA_CPP_LIB_PATH``'s)."""
    name = getattr(getattr(getattr(llama, "llama_cpp", None), "_lib", None), "_name", None)
    return printable(name) if isinstance(name, str) else None


def _child_command(path: str, mtp: bool, trunk: bool) -> list[str]:
    """The child's command line (a seam for tests)."""
    flags = ["--no-mtp"] * (not mtp) + ["--no-trunk"] * (not trunk)
    return [sys.executable, "-m", "gguf_mtp.check.llama_check", path, *flags]


def check_with_llama(
    path: str | os.PathLike[str],
    *,
    mtp: bool = True,
    trunk: bool = True,
    beside: str | os.PathLike[str] | None = None,
    timeout: float = 300.0,
) -> LlamaCheck:
    """Load ``path`` with llama.cpp in a subprocess and run a decode step (see the module docstring).

    Args:
        path: the GGUF (first shard of a split set).
        mtp: load the NextN block (``load_mtp``) and run one MTP decode step.
        trunk: run one ordinary decode step (leave off for an MTP-only file).
        beside: the target a sidecar serves: loaded too, its trunk decode gives the hidden rows the MTP decode
            steps take (as ``llama-server --spec-draft-model`` pairs them); its width and vocabulary must be the
            sidecar's, else the MTP step fails.
        timeout: seconds before the child is killed.

    Raises:
        RuntimeError: llama-cpp-python is not installed (see :data:`INSTALL_HINT`).
    """
    if not llama_cpp_available():
        raise RuntimeError(f"llama-cpp-python is not installed: {INSTALL_HINT}")
    result = LlamaCheck(os.fspath(path))
    pairing = ["--beside", os.fspath(beside)] if beside is not None else []
    proc = _spawn(result, _child_command(result.path, mtp, trunk) + pairing, timeout)
    if proc is None:
        return result
    report = last_report(proc.stdout)
    if report is not None:
        _apply_report(result, report)
    _classify_exit(result, proc.returncode, proc.stderr, (report or {}).get("stage"))
    logger.info("llama.cpp check of %s: %s", result.path, result.summary())
    return result


def _spawn(result: LlamaCheck, cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run the child ``cmd`` and keep the tail of its stderr in ``result``; None when it ran past ``timeout``
    (killed; ``result.error`` says so)."""
    env = child_environment(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    logger.info("llama.cpp check: OMP_NUM_THREADS=%s %s", env["OMP_NUM_THREADS"], shlex.join(cmd))
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, errors="replace")
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        result.error = f"llama.cpp did not finish within {timeout:.0f} s"
        result.log_tail = stderr[-4000:]
        logger.info("llama.cpp check: killed after %.0f s", timeout)
        return None
    logger.info("llama.cpp check: exit status %d after %.1f s", proc.returncode, time.perf_counter() - started)
    logger.debug("llama.cpp stderr (last 4000 characters):\n%s", proc.stderr[-4000:])
    result.log_tail = proc.stderr[-4000:]
    return proc


def last_report(stdout: str) -> dict[str, Any] | None:
    """The child's last report: the last line of ``stdout`` that is a JSON object (see :func:`emit_report`)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                report: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                continue
            return report
    return None


def _apply_report(result: LlamaCheck, report: dict[str, Any]) -> None:
    """Copy the fields of the child's ``report`` into ``result`` (not the ones the parent owns)."""
    for key, value in report.items():
        if hasattr(result, key) and key not in ("path", "log_tail", "stage"):
            setattr(result, key, value)


def _classify_exit(result: LlamaCheck, returncode: int, stderr: str, stage: str | None) -> None:
    """Say in ``result`` what the child's exit means, unless the child already reported an error:
    killed by a signal, a failing exit status, or a load that failed without one."""
    if result.error is not None:
        return
    if returncode < 0:
        result.crashed, result.error = _signal_message(-returncode, stage, stderr)
        _fail_step(result, stage)
    elif returncode != 0:
        result.error = f"llama.cpp exited with status {returncode}: {llama_reason(stderr) or 'no message'}"
        _fail_step(result, stage)
    elif not result.loaded:
        result.error = llama_reason(stderr) or "load failed"


def _fail_step(result: LlamaCheck, stage: str | None) -> None:
    """The child reports before every step: a crash during a step is that step's failure."""
    if stage == "trunk" and result.trunk_decode_ok is None:
        result.trunk_decode_ok = False
    if stage in ("target", "mtp") and result.mtp_decode_ok is None:
        result.mtp_decode_ok = False


def signal_name(signum: int) -> str:
    """``SIGABRT`` for 6: the name of a signal that killed a child, or ``signal N`` for an unknown one."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_STAGES = {None: "while loading the file", "trunk": "during the trunk decode step", "mtp": "during the MTP decode step",
           "target": "during the target's decode step", "done": "after the check had finished"}


def _signal_message(signum: int, stage: str | None, stderr: str) -> tuple[str | None, str]:
    """(crashed, error) for a child killed by ``signum``.

    A SIGABRT after a GGML_ASSERT/"error" line is llama.cpp refusing the file the hard way; any other
    signal (and an abort with no such line) is llama.cpp crashing in its own code, which says nothing
    about the file.
    """
    name = signal_name(signum)
    reason = llama_reason(stderr)
    if signum == signal.SIGABRT and reason and _REASON.search(reason):
        return None, f"llama.cpp aborted ({name}) {_STAGES.get(stage, '')}: {reason}"
    where = _STAGES.get(stage, f"at step {stage!r}")
    return name, (
        f"llama.cpp crashed in its own compute code ({name}) {where}: this is a fault of the llama.cpp build, "
        "not a verdict on the file (llama.cpp did not refuse it)"
    )


# ----------------------------------------------------------------------------------------- the child


def set_params(llama: Any, params: Any, values: dict[str, Any]) -> None:
    """Set ``values`` on a ctypes params struct; a string value names a ``llama_cpp`` constant."""
    for field, value in values.items():
        setattr(params, field, getattr(llama, value) if isinstance(value, str) else value)


def _finite(values: Any, n: int) -> bool:
    return all(math.isfinite(values[i]) for i in range(n))


def _logits_digest(values: Any, n: int) -> str:
    """sha256 of the ``n`` logits as little-endian float32: equal digests, bit-identical logits."""
    import hashlib
    import struct

    return hashlib.sha256(struct.pack(f"<{n}f", *(values[i] for i in range(n)))).hexdigest()


def _decode(
    llama: Any, ctx: Any, tokens: list[int], embd_rows: list[list[float]] | None, n_vocab: int
) -> tuple[int, bool, str | None]:
    """Decode ``tokens`` (with the hidden states ``embd_rows`` for an MTP context); returns llama_decode's
    status, whether the last token's logits are finite, and their digest."""
    import ctypes

    n = len(tokens)
    batch = llama.llama_batch_init(n, 0, 1)
    try:
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if i == n - 1 else 0
        keep = None
        if embd_rows is not None:
            # The MTP graph takes both the token ids and the trunk's hidden state of each token.
            flat = [v for row in embd_rows for v in row]
            keep = (ctypes.c_float * len(flat))(*flat)
            batch.embd = ctypes.cast(keep, ctypes.POINTER(ctypes.c_float))
        rc = llama.llama_decode(ctx, batch)
        finite, digest = False, None
        if rc == 0:
            logits = llama.llama_get_logits_ith(ctx, n - 1)
            finite = bool(logits) and _finite(logits, n_vocab)
            digest = _logits_digest(logits, n_vocab) if logits else None
        if keep is not None:
            batch.embd = None  # ours, not llama_batch_init's: do not let llama_batch_free free it
        return rc, finite, digest
    finally:
        llama.llama_batch_free(batch)


def emit_report(report: dict[str, Any], stage: str) -> None:
    """Print the report so far: if the next step aborts the process, the parent still knows this much."""
    sys.stdout.write(json.dumps(report | {"stage": stage}) + "\n")
    sys.stdout.flush()


def _context(llama: Any, model: Any, ctx_type: int) -> Any:
    """A small context of ``ctx_type`` on ``model`` (its sizes fit the check's three tokens)."""
    cparams = llama.llama_context_default_params()
    cparams.n_ctx = 64
    cparams.n_batch = 8
    cparams.n_ubatch = 8
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = 2
    cparams.ctx_type = ctx_type
    set_params(llama, cparams, CONTEXT_PARAMS)
    return llama.llama_init_from_model(model, cparams)


def _target_rows(llama: Any, target: str, tokens: list[int], n_embd: int, n_vocab: int) -> tuple[Any, str | None]:
    """(rows, error): the hidden rows ``target``'s trunk decode of ``tokens`` hands an MTP head, what
    llama-server's draft-mtp feeds a sidecar (``llama_set_embeddings_nextn``). A target of another width or
    vocabulary cannot feed this sidecar: the error says which, and no rows."""
    from llama_cpp import llama_cpp_ext  # the MTP helpers (llama-ext.h)

    params = llama.llama_model_default_params()
    set_params(llama, params, MODEL_PARAMS)
    params.load_mtp = False
    model = llama.llama_model_load_from_file(target.encode(), params)
    if not model:
        return None, f"llama.cpp could not load the target {target}"
    try:
        width = llama.llama_model_n_embd_out(model)
        vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        if (width, vocab) != (n_embd, n_vocab):
            return None, (f"the target's rows are {width} wide over {vocab} tokens, the sidecar takes {n_embd} over "
                          f"{n_vocab}: it is not a sidecar of this target")
        ctx = _context(llama, model, llama.LLAMA_CONTEXT_TYPE_DEFAULT)
        if not ctx:
            return None, "could not create a context on the target"
        try:
            llama_cpp_ext.llama_set_embeddings_nextn(ctx, True, False)
            rc, _, _ = _decode(llama, ctx, tokens, None, vocab)
            if rc != 0:
                return None, f"the target's trunk decode failed (llama_decode: {rc})"
            flat = llama_cpp_ext.llama_get_embeddings_nextn(ctx)
            return [[flat[i * width + j] for j in range(width)] for i in range(len(tokens))], None
        finally:
            llama.llama_free(ctx)
    finally:
        llama.llama_model_free(model)


class BindingError(Exception):
    """llama-cpp-python cannot bind the library it loads (one line naming it, and the function it lacks)."""


def import_bindings() -> Any:
    """The ``llama_cpp`` module, its library bound (with the MTP helpers of ``llama_cpp_ext``).

    Raises:
        BindingError: the library is missing, or lacks a function llama-cpp-python binds at import (a
            ``LLAMA_CPP_LIB_PATH`` naming another llama.cpp than :mod:`gguf_mtp.llama_build` checked).
    """
    try:
        import llama_cpp
        from llama_cpp import llama_cpp_ext  # noqa: F401  (binds the MTP helpers now, not mid-check)
    except (AttributeError, OSError, RuntimeError) as e:  # ctypes' undefined symbol, a library it cannot load
        folder = os.environ.get("LLAMA_CPP_LIB_PATH") or "its own lib folder"
        raise BindingError(f"llama-cpp-python cannot use the libllama in {folder}: {printable(e)}") from None
    return llama_cpp


def _child(path: str, mtp: bool, trunk: bool, beside: str | None = None) -> dict[str, Any]:
    """The check itself, in the child: load ``path`` (with its NextN blocks when ``mtp``), then run the decode steps
    asked for (:func:`_decode_steps`); what llama.cpp did, as the report's fields."""
    llama = import_bindings()
    llama.llama_backend_init()
    ran = {"llama_cpp_build": build_of(llama), "llama_cpp_library": library_of(llama)}
    params = llama.llama_model_default_params()
    set_params(llama, params, MODEL_PARAMS)
    params.load_mtp = mtp
    model = llama.llama_model_load_from_file(path.encode(), params)
    if not model:
        return {"loaded": False, **ran}
    out: dict[str, Any] = {
        **ran,
        "loaded": True,
        "n_layer": llama.llama_model_n_layer(model),
        "n_layer_nextn": llama.llama_model_n_layer_nextn(model),
    }
    _decode_steps(llama, model, out, mtp=mtp, trunk=trunk, beside=beside)
    llama.llama_model_free(model)
    return out


def _decode_steps(llama: Any, model: Any, out: dict[str, Any], *, mtp: bool, trunk: bool, beside: str | None) -> None:
    """The trunk's decode step (``trunk``), then an MTP decode step through each NextN block (``mtp``): on the hidden
    rows of ``beside``'s trunk decode where given (a sidecar beside its target), else on synthetic rows."""
    # The rows an MTP step takes are the trunk's output rows: n_embd_out wide (qwen4exp's are its hc streams,
    # hc x n_embd; llama.cpp reads that many floats a token from the batch, so narrower rows would overrun it).
    n_embd = llama.llama_model_n_embd_out(model)
    n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
    tokens = [t % max(n_vocab, 1) for t in (1, 2, 3)]
    if trunk:
        _trunk_step(llama, model, tokens, n_vocab, out)
    if mtp and out["n_layer_nextn"] > 0:
        _mtp_steps(llama, model, tokens, n_embd, n_vocab, out, beside)
    elif mtp:
        out["mtp_decode_ok"] = None


def _mtp_steps(
    llama: Any, model: Any, tokens: list[int], n_embd: int, n_vocab: int, out: dict[str, Any], beside: str | None
) -> None:
    """An MTP decode step through each NextN block in turn, up to the first that fails."""
    hidden = [[0.01 * math.sin(0.1 * (i + 1) * (j + 1)) for j in range(n_embd)] for i in range(len(tokens))]
    if beside is not None:
        out["beside"] = beside
        emit_report(out, "target")
        rows, error = _target_rows(llama, beside, tokens, n_embd, n_vocab)
        if rows is None:
            out["mtp_decode_ok"] = False
            out["error"] = error
            return
        hidden = rows
    out["mtp_blocks_decoded"] = 0
    for offset in range(out["n_layer_nextn"]):  # one MTP decode step through each NextN block
        emit_report(out, "mtp")
        if not _mtp_step(llama, model, tokens, hidden, n_vocab, offset, out):
            break
        out["mtp_blocks_decoded"] += 1


def _trunk_step(llama: Any, model: Any, tokens: list[int], n_vocab: int, out: dict[str, Any]) -> None:
    emit_report(out, "trunk")
    ctx = _context(llama, model, llama.LLAMA_CONTEXT_TYPE_DEFAULT)
    if not ctx:
        out["trunk_decode_ok"] = False
        out["error"] = "could not create a context"
        return
    rc, finite, out["trunk_logits_sha256"] = _decode(llama, ctx, tokens, None, n_vocab)
    out["trunk_decode_ok"] = rc == 0 and finite
    llama.llama_free(ctx)


def _mtp_step(
    llama: Any, model: Any, tokens: list[int], hidden: Any, n_vocab: int, offset: int, out: dict[str, Any]
) -> bool:
    """One MTP decode step through the NextN block at ``offset``, recorded in ``out``; whether it succeeded."""
    ctx = _context(llama, model, llama.LLAMA_CONTEXT_TYPE_MTP)
    if not ctx:
        out["mtp_decode_ok"] = False
        out["error"] = "could not create an MTP context"
        return False
    if offset:
        from llama_cpp import llama_cpp_ext  # the selector of the NextN block (llama-ext.h)

        llama_cpp_ext.llama_set_nextn_layer_offset(ctx, offset)
    rc, finite, digest = _decode(llama, ctx, tokens, hidden, n_vocab)
    llama.llama_free(ctx)
    if offset == 0:
        out["mtp_logits_sha256"] = digest
    out["mtp_decode_ok"] = rc == 0 and out.get("mtp_decode_ok", True)
    out["mtp_logits_finite"] = finite and out.get("mtp_logits_finite", True)
    if rc != 0 and out["n_layer_nextn"] > 1:
        out["error"] = f"the MTP decode step through NextN block {offset} failed (llama_decode: {rc})"
    return rc == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguf_mtp.check.llama_check")
    parser.add_argument("path", nargs="?")
    parser.add_argument("--no-mtp", action="store_true")
    parser.add_argument("--no-trunk", action="store_true")
    parser.add_argument("--beside", metavar="TARGET")
    parser.add_argument("--build", action="store_true", help="print only the llama.cpp build")
    args = parser.parse_args(argv)
    try:
        if args.build or args.path is None:
            emit_report({"llama_cpp_build": build_of(import_bindings())}, "done")
            return 0
        emit_report(_child(args.path, not args.no_mtp, not args.no_trunk, args.beside), "done")
    except BindingError as e:
        emit_report({"loaded": False, "error": str(e)}, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
