"""The build of llama.cpp's tools (scripts/build_llama_tools.py; issue 29 items 11-12): never started by a command
the suite runs, one build at a time under a lock, its compilers in a process group that a signal or the death of
the process that asked for the build ends, and no folder left behind by a dead build.

The llama.cpp built here is a stand-in: a real cmake project (``project(... NONE)``: no compiler to detect) in a
real sdist-shaped tarball, whose three tool targets are shell scripts that log their pid and wait for a go file.
So each test takes seconds, and the processes it checks for are the build's own.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.helpers import build_llama_tools

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
"""


def _sdist(path: Path) -> Path:
    """A tarball shaped like llama-cpp-python's sdist, with the stand-in project as its vendor/llama.cpp."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (("CMakeLists.txt", CMAKE_LISTS), ("make-tool.sh", MAKE_TOOL)):
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{TOOLS.LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/{name}")
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
        self.sdist = _sdist(root / TOOLS.SDIST_NAME)

    def env(self, *, allowed: bool = True) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith("GGUF_MTP_") or k == "GGUF_MTP_DISABLE_PROGRESS"}
        environment |= {"GGUF_MTP_TOOLS_CACHE": str(self.cache), "GGUF_MTP_LLAMA_SDIST": str(self.sdist),
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
