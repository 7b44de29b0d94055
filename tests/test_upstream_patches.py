"""The patches in upstream/ apply to the llama.cpp vendored in llama-cpp-python 0.3.36 and change its behaviour.

The vendored tree comes from tests/support/upstream.py (the sdist, unpacked once into .cache/upstream/).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.upstream import ROOT, llama_cpp_tree


@pytest.fixture
def fresh_tree(tmp_path: Path) -> Path:
    dst = tmp_path / "llama.cpp"
    shutil.copytree(llama_cpp_tree(), dst, ignore=shutil.ignore_patterns(".complete"))
    return dst


def _apply(tree: Path, patch: Path) -> None:
    subprocess.run(["git", "apply", "--check", str(patch)], cwd=tree, check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)


def _read(tree: Path, path: Path) -> subprocess.CompletedProcess[str]:
    """GGUFReader from the tree's own gguf-py on PATH, in a child with a time limit."""
    code = "import sys; from gguf.gguf_reader import GGUFReader; GGUFReader(sys.argv[1]); print('read')"
    try:
        return subprocess.run([sys.executable, "-c", code, str(path)], env={"PYTHONPATH": str(tree / "gguf-py")},
                              capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", "timeout")


def _hostile(tmp: Path) -> dict[str, Path]:
    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    files = {
        "meta": b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + s(b"t") + struct.pack("<IQIQ", 1, 4, 0, 0) + b"\0" * 11,
        "huge": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + s(b"k") + struct.pack("<IIQ", 9, 0, 2**30) + b"\1" * 8,
    }
    out = {}
    for name, data in files.items():
        out[name] = tmp / f"{name}.gguf"
        out[name].write_bytes(data)
    return out


@pytest.mark.slow
def test_reader_patch_before_after(fresh_tree: Path, tmp_path: Path) -> None:
    files = _hostile(tmp_path)
    before = {k: _read(fresh_tree, p) for k, p in files.items()}
    assert "cannot reshape array" in before["meta"].stderr
    assert before["huge"].returncode == 124  # loops over empty reads past the end of the file
    _apply(fresh_tree, ROOT / "upstream/02-gguf-reader-bounded-errors/gguf-reader-bounded-errors.patch")
    after = {k: _read(fresh_tree, p) for k, p in files.items()}
    assert "Tensor 't': 16 bytes of data at offset 64 end past the file size 68" in after["meta"].stderr
    assert "does not fit in the remaining 8 bytes" in after["huge"].stderr
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                           cwd=fresh_tree / "gguf-py", env={"PYTHONPATH": "."}, capture_output=True, text=True,
                           timeout=60)
    assert tests.returncode == 0, tests.stdout[-2000:]


def test_router_patch_applies(fresh_tree: Path) -> None:
    _apply(fresh_tree, ROOT / "upstream/01-nemotronh-mtp-router-f32/nemotronh-mtp-router-f32.patch")
    src = (fresh_tree / "conversion/base.py").read_text()
    assert "self.match_model_tensor_name(new_name, key, new_bid)" in src
    assert "self.match_model_tensor_name(new_name, key, bid)" not in src


def test_deepseek_v3_mtp_export_patch_applies(fresh_tree: Path) -> None:
    _apply(fresh_tree, ROOT / "upstream/06-deepseek-v3-mtp-export/deepseek-v3-mtp-export.patch")
    deepseek = (fresh_tree / "conversion/deepseek.py").read_text()
    glm = (fresh_tree / "conversion/glm.py").read_text()
    assert deepseek.count('"DeepseekV3ForCausalLM"') == 1  # registered once, on the new class
    assert '@ModelBase.register("DeepseekV3ForCausalLM")\n@ModelBase.example("deepseek-ai/DeepSeek-V3")\n' \
           "class DeepseekV3Model(DeepseekV2Model):" in deepseek
    assert "class Glm4MoeLiteModel(DeepseekV3Model):" in glm and "supports_mtp_export" not in glm.split(
        "class Glm4MoeLiteModel")[1].split("@ModelBase.register")[0]
