"""Reproduce the NemotronH MTP router dtype bug of convert_hf_to_gguf.py, before and after the patch.

Run with the project venv (it needs gguf_mtp for the tiny checkpoint) and point ``--upstream-python`` at a venv that
can run llama.cpp's converter (torch, transformers, tokenizers, safetensors, sentencepiece, protobuf<5)::

    .venv/bin/python upstream/01-nemotronh-mtp-router-f32/reproduce.py --upstream-python /tmp/venv-up/bin/python

It unpacks llama.cpp from the llama-cpp-python 0.3.36 sdist (``.cache/upstream/``, pip-downloaded when missing) into
two scratch trees, applies ``nemotronh-mtp-router-f32.patch`` to one, writes a tiny BF16 NemotronH checkpoint with an
MTPv2 head (trunk ``M*E``: a Mamba-2, an attention and a MoE layer; the MTP block becomes ``blk.3``) and a real GPT-2
tokenizer rebuilt from ``models/ggml-vocab-gpt-2.gguf``, converts it with ``--outtype bf16`` in each tree and prints
the ggml type of the trunk router ``blk.2.ffn_gate_inp.weight`` and the MTP router ``blk.3.ffn_gate_inp.weight``.
Exit 0 when the unpatched output has the MTP router BF16 and the patched one F32 (trunk router F32 in both).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from gguf_mtp.testing.tiny_checkpoints import write_full_nemotron_checkpoint  # noqa: E402
from gguf_mtp.testing.tiny_models import TinyHparams  # noqa: E402

CACHE = ROOT / ".cache" / "upstream"
SDIST = "llama-cpp-python==0.3.36"
PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
NEEDED = ("gguf-py/", "conversion/", "convert_hf_to_gguf.py", "models/ggml-vocab-gpt-2.gguf")
PATCH = HERE / "nemotronh-mtp-router-f32.patch"
TRUNK_ROUTER = "blk.2.ffn_gate_inp.weight"
MTP_ROUTER = "blk.3.ffn_gate_inp.weight"

TOKENIZER_CODE = r"""
import json, sys
from gguf.gguf_reader import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
r = GGUFReader(sys.argv[1])
def strings(key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges])
tok = Tokenizer(bpe)
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.save(sys.argv[2] + "/tokenizer.json")
cfg = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "bos_token": "<|endoftext|>",
       "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
open(sys.argv[2] + "/tokenizer_config.json", "w").write(json.dumps(cfg))
print(len(tokens))
"""

TYPES_CODE = r"""
import json, sys
from gguf.gguf_reader import GGUFReader
r = GGUFReader(sys.argv[1])
print(json.dumps({t.name: t.tensor_type.name for t in r.tensors}))
"""

SAME_CODE = r"""
import sys
import numpy as np
from gguf.gguf_reader import GGUFReader
def f32(path):
    t = next(t for t in GGUFReader(path).tensors if t.name == sys.argv[3])
    a = np.asarray(t.data)
    if t.tensor_type.name == "BF16":
        a = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.reshape(-1)
print(np.array_equal(f32(sys.argv[1]), f32(sys.argv[2])))
"""


def unpack(dst: Path) -> Path:
    """Unpack the parts of the vendored llama.cpp the conversion needs into ``dst``."""
    sdists = list(CACHE.glob("llama_cpp_python-0.3.36.tar.gz"))
    if not sdists:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SDIST,
                        "-d", str(CACHE)], check=True, timeout=600)
        sdists = list(CACHE.glob("llama_cpp_python-0.3.36.tar.gz"))
    with tarfile.open(sdists[0]) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(PREFIX) and m.name[len(PREFIX):].startswith(NEEDED)]
        for m in members:
            m.name = m.name[len(PREFIX):]
        tar.extractall(dst, members=members, filter="data")
    return dst


def run(what: str, cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; on failure print its output tail and a one-line error naming ``what``, and exit 2."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        sys.stderr.write((proc.stdout + proc.stderr)[-4000:])
        print(f"reproduce.py: {what} failed (rc {proc.returncode}, {cmd[0]})", file=sys.stderr)
        sys.exit(2)
    return proc


def main() -> int:
    """Build both trees and the checkpoint, convert, print the router types; 0 when before/after is as expected."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--upstream-python", default="/tmp/venv-up/bin/python",
                    help="python of a venv that can run convert_hf_to_gguf.py")
    ap.add_argument("--keep", type=Path, help="work in this folder (kept) instead of a temporary one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        before, after = unpack(work / "before"), unpack(work / "after")
        run("git apply --check of the patch", ["git", "apply", "--check", str(PATCH)], cwd=after)
        run("git apply of the patch", ["git", "apply", str(PATCH)], cwd=after)
        hp = TinyHparams(n_embd=256, n_vocab=50264, n_head=4, n_head_kv=2, head_dim=64, n_expert=4,
                         n_ff_exp=256, n_ff_shexp=256, moe_latent=256)
        ckpt = work / "hf"
        write_full_nemotron_checkpoint(ckpt, hp)
        env = {"PYTHONPATH": str(before / "gguf-py"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
        py = args.upstream_python
        vocab = before / "models" / "ggml-vocab-gpt-2.gguf"
        n_tok = run("tokenizer build", [py, "-c", TOKENIZER_CODE, str(vocab), str(ckpt)], env=env).stdout.strip()
        print(f"checkpoint: {ckpt.name}/ NemotronHForCausalLM, trunk 'M*E', MTPv2 head, BF16, GPT-2 tokenizer "
              f"({n_tok} tokens)")
        types: dict[str, dict[str, str]] = {}
        for label, tree in (("before", before), ("after", after)):
            out = work / f"{label}.gguf"
            tree_env = {**env, "PYTHONPATH": str(tree / "gguf-py")}
            convert = [py, str(tree / "convert_hf_to_gguf.py"), str(ckpt), "--outtype", "bf16", "--outfile", str(out)]
            run(f"{label} conversion", convert, env=tree_env, cwd=tree)
            listing = run(f"reading {label}.gguf", [py, "-c", TYPES_CODE, str(out)], env=tree_env).stdout
            types[label] = json.loads(listing)
            t = types[label]
            print(f"{label:6} (convert_hf_to_gguf.py --outtype bf16, {'patched' if label == 'after' else 'unpatched'})"
                  f": trunk {TRUNK_ROUTER} = {t.get(TRUNK_ROUTER)}, MTP {MTP_ROUTER} = {t.get(MTP_ROUTER)}")
        compare = [py, "-c", SAME_CODE, str(work / "before.gguf"), str(work / "after.gguf"), MTP_ROUTER]
        same = run("router value comparison", compare, env=env).stdout.strip()
        print(f"MTP router values after == BF16 values before, widened to F32: {same}")
        changed = sorted(n for n in types["after"] if types["before"].get(n) != types["after"][n])
        print(f"tensors whose type changed: {changed}")
        ok = (types["before"].get(MTP_ROUTER) == "BF16" and types["after"].get(MTP_ROUTER) == "F32"
              and types["before"].get(TRUNK_ROUTER) == types["after"].get(TRUNK_ROUTER) == "F32" and same == "True")
        print("result: " + ("as expected (MTP router BF16 before, F32 after)" if ok else "NOT as expected"))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
