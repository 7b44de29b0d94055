"""llama.cpp's own tools as test peers: the vendored tree of llama-cpp-python 0.3.36 and its converter.

The sdist comes from pip (its cache after the first run) and the parts used here are unpacked once into
``.cache/upstream/llama.cpp`` (the tree the patches in ``upstream/`` are checked against, and the tree whose
``convert_hf_to_gguf.py`` the parity tests run). The converter needs torch: it runs in the separate venv
``make upstream-venv`` makes (``.venv-upstream``, or ``$GGUF_MTP_UPSTREAM_PYTHON``), never in the project's own.

Conversions are cached per checkpoint content and flags for the session, so a family's full / ``--no-mtp`` /
``--mtp`` files are made once however many tests compare against them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "upstream"
SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
#: The parts of the vendored llama.cpp the tests use (bump TREE_VERSION when this changes).
NEEDED = ("gguf-py/", "conversion/", "convert_hf_to_gguf.py", "models/ggml-vocab-gpt-2.gguf")
TREE_VERSION = "2"
UPSTREAM_VENV = ROOT / ".venv-upstream"
#: How long one conversion of a tiny checkpoint may take (torch's import alone is a few seconds).
CONVERT_TIMEOUT_S = 300

_converted: dict[tuple[str, tuple[str, ...]], Path] = {}


def llama_cpp_tree() -> Path:
    """The unpacked vendored llama.cpp (``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/``, the GPT-2 vocab)."""
    tree = CACHE / "llama.cpp"
    stamp = tree / ".complete"
    if stamp.exists() and stamp.read_text() == TREE_VERSION:
        return tree
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (CACHE / SDIST_FILE).exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SDIST,
                        "-d", str(CACHE)], check=True, timeout=600)
    with tarfile.open(CACHE / SDIST_FILE) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(PREFIX) and m.name[len(PREFIX):].startswith(NEEDED)]
        for m in members:
            m.name = m.name[len(PREFIX):]
        tar.extractall(tree, members=members, filter="data")
    stamp.write_text(TREE_VERSION)
    return tree


def upstream_python() -> str:
    """The python of the venv that runs llama.cpp's converter (torch, transformers, sentencepiece).

    Missing: the test fails under ``CI=true`` (CI must build it) and is skipped elsewhere, naming the fix.
    """
    # Absolute (not resolved: a venv's python is a symlink whose target is not the venv): the converter
    # runs with the llama.cpp tree as its working directory.
    python = os.path.abspath(os.environ.get("GGUF_MTP_UPSTREAM_PYTHON") or UPSTREAM_VENV / "bin" / "python")
    probe = [python, "-c", "import torch, transformers, sentencepiece, yaml"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        message = f"{python} cannot run llama.cpp's converter (torch, transformers): run `make upstream-venv`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


def _env(tree: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(tree / "gguf-py"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
            "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1"}


def _run(what: str, cmd: Sequence[str], tree: Path) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=_env(tree), cwd=tree,
                          timeout=CONVERT_TIMEOUT_S)
    assert proc.returncode == 0, f"{what} failed (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout


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


def write_gpt2_tokenizer(folder: Path, extra_special: Sequence[str] = ()) -> int:
    """Write GPT-2's real BPE tokenizer (rebuilt from llama.cpp's ``ggml-vocab-gpt-2.gguf``) into ``folder``.

    The converter refuses BPE tokenizers whose pre-tokenizer it does not know, so a toy one will not do.
    ``extra_special`` are appended as special tokens (GLM's converter needs ``[gMASK]``, ``<sop>``...).
    Returns the number of tokens (50,257 plus the extras).
    """
    import json

    tree = llama_cpp_tree()
    vocab = tree / "models" / "ggml-vocab-gpt-2.gguf"
    out = _run("tokenizer build", [upstream_python(), "-c", _TOKENIZER_CODE, str(vocab), str(folder),
                                   json.dumps(list(extra_special))], tree)
    return int(out.strip().splitlines()[-1])


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
    cmd = [upstream_python(), str(tree / "convert_hf_to_gguf.py"), str(checkpoint), "--outtype", outtype,
           "--outfile", str(out), *flags]
    _run(f"convert_hf_to_gguf.py {' '.join(flags)} of {checkpoint.name}", cmd, tree)
    _converted[key] = out
    return out
