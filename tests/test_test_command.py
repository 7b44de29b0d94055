"""The test command itself (issue 21, items 19-21): ``make test`` runs every step and names every failure,
the markers select what the quick suite leaves out (``tools``: a native llama.cpp build; ``bench``: the
``bench`` extra), a missing extra is a skip except under CI=true, and pytest leaves only what failed in
``$TMPDIR/pytest-of-$USER``.

Each check runs a small pytest session (or make) of its own in a subprocess, with the project's pyproject.toml
and conftest.py, on tests written here: fast, and nothing is built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.session import IN_CI

pytestmark = pytest.mark.slow  # nested pytest sessions and make runs: seconds each

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def _pytest(tmp_path: Path, source: str, *args: str, env: dict[str, str] | None = None,
            prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Run pytest on ``source`` (a test file written into ``tmp_path``) with the project's pyproject.toml and
    tests/conftest.py (as a plugin); pytest's temporary folders go to ``tmp_path/temproot``."""
    test_file = tmp_path / "test_sample.py"
    test_file.write_text(textwrap.dedent(source))
    (tmp_path / "temproot").mkdir(exist_ok=True)
    code = f"{prelude}\nimport pytest, sys; sys.exit(pytest.main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
            "-p", "conftest", "-p", "no:cacheprovider", "-q", str(test_file), *args]
    environment = {k: v for k, v in os.environ.items() if k != "CI"}
    environment |= {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
                    "PYTEST_DEBUG_TEMPROOT": str(tmp_path / "temproot"), **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environment)


def _make() -> str:
    make = shutil.which("make")
    if make is None:
        if IN_CI:
            pytest.fail("CI=true: make is needed (`make test` is the test command)")
        pytest.skip("make is not installed")
    return make


def _make_env() -> dict[str, str]:
    """This environment without what an enclosing `make test` passes down (its flags, level, jobserver)."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES")}


# --------------------------------------------------------------------------------------- item 19


def test_make_test_runs_every_step_after_a_failure_and_names_each_failed_one(tmp_path: Path) -> None:
    makefile = tmp_path / "steps.mk"
    makefile.write_text(f"include {ROOT / 'Makefile'}\n"
                        "bad1: ; @exit 3\n"
                        "ok: ; @touch $(CURDIR)/ran-ok\n"
                        "bad2: ; @false\n")
    make = _make()

    def run(steps: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([make, "-C", str(tmp_path), "-f", str(makefile), "run-steps", f"STEPS={steps}"],
                              capture_output=True, text=True, timeout=60, env=_make_env())

    failed = run("bad1 ok bad2")
    assert failed.returncode != 0
    assert (tmp_path / "ran-ok").exists()  # the step after a failure ran
    assert "gguf-mtp: FAILED: bad1 bad2 (ran: bad1 ok bad2)" in failed.stderr
    (tmp_path / "ran-ok").unlink()
    passed = run("ok")
    assert passed.returncode == 0 and (tmp_path / "ran-ok").exists()
    assert "gguf-mtp: passed: ok" in passed.stdout


def test_make_test_reaches_lint_types_suite_upstream_proof_and_floor_suite() -> None:
    # -n prints the commands; only the recursive makes of run-steps run, and they print too
    done = subprocess.run([_make(), "-n", "--no-print-directory", "test"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=_make_env())
    assert done.returncode == 0, done.stderr
    steps = [line.removeprefix("gguf-mtp: make ") for line in done.stdout.splitlines()
             if line.startswith("gguf-mtp: make ")]
    assert steps == ["lint", "typecheck", "tools", "test-pytest", "test-upstream", "test-floor"]
    for command in ("-m ruff check .", "-m mypy", "-m pytest -q -n 2 --dist loadscope\n",
                    "reproduce.py --upstream-python",
                    '-m pytest -q -m "not llama and not upstream" -p no:cacheprovider -n 2 --dist loadscope'):
        assert command in done.stdout + "\n", command


def test_make_test_builds_llama_cpps_tools_in_a_step_before_pytest_which_never_builds_them() -> None:
    # issue 29 item 11: the first build (10-30 minutes) never starts inside a test's timed subprocess
    done = subprocess.run([_make(), "-n", "--no-print-directory", "test"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=_make_env())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    tools_step, pytest_step = lines.index("gguf-mtp: make tools"), lines.index("gguf-mtp: make test-pytest")
    assert tools_step < pytest_step
    assert any(line.endswith("/python scripts/build_llama_tools.py -j 2") for line in lines[tools_step:pytest_step])
    [suite] = [line for line in lines[pytest_step:] if line.endswith("-m pytest -q -n 2 --dist loadscope")]
    assert suite.startswith("GGUF_MTP_TOOLS_NO_BUILD=1 ")


# --------------------------------------------------------------------------------------- issue 37 item 18


def _make_dry(tmp_path: Path, *targets: str) -> list[str]:
    """What ``make -n TARGETS`` would run, for venvs in ``tmp_path`` (none made yet: every install step is due)."""
    venvs = [f"VENV={tmp_path / 'venv'}", f"UPSTREAM_VENV={tmp_path / 'upstream'}", f"FLOOR_VENV={tmp_path / 'floor'}"]
    done = subprocess.run([_make(), "-n", "--no-print-directory", *venvs, *targets], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=_make_env())
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_install_and_upstream_venv_announce_themselves_as_steps(tmp_path: Path) -> None:
    lines = _make_dry(tmp_path, "install", "upstream-venv")
    announced = [line for line in lines if line.startswith('echo "gguf-mtp: make ')]
    assert [line.split(":")[1] for line in announced] == [" make install", " make upstream-venv"]


def test_no_editable_install_prints_setuptools_editable_installation_note(tmp_path: Path) -> None:
    venv, floor = tmp_path / "venv", tmp_path / "floor"
    stamps = [venv / ".gguf-mtp-installed-llama", venv / ".gguf-mtp-installed-llama-test-bench",
              floor / ".gguf-mtp-installed"]
    editable = [line for line in _make_dry(tmp_path, *map(str, stamps)) if " install " in line and " -e " in line]
    assert len(editable) == 3
    assert all(line.startswith('PYTHONWARNINGS="ignore:Editable installation" ') for line in editable), editable


STAND_IN_PYTHON = """#!/bin/sh
# the venv's python as the build notice asks it: llama_cpp is not installed; pip's wheel cache holds $CACHED_WHEEL
case "$1 $2 $3 $4" in
  "-c import llama_cpp"*) exit 1 ;;
  "-m pip cache list") echo "$CACHED_WHEEL"; exit 0 ;;
esac
exit 3
"""


def _build_notice(tmp_path: Path, cached_wheel: str) -> str:
    """What the install steps say before pip starts, with llama-cpp-python not installed."""
    python = tmp_path / "python"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    makefile = tmp_path / "notice.mk"
    makefile.write_text(f"include {ROOT / 'Makefile'}\nnotice:\n\t$(BUILD_NOTICE)\n")
    done = subprocess.run([_make(), "-s", "-C", str(tmp_path), "-f", str(makefile), "notice", f"PY={python}"],
                          capture_output=True, text=True, timeout=60, env=_make_env() | {"CACHED_WHEEL": cached_wheel})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_build_notice_is_shown_when_pip_will_compile_llama_cpp_python(tmp_path: Path) -> None:
    said = _build_notice(tmp_path, cached_wheel="")
    assert said.startswith("gguf-mtp: llama-cpp-python 0.3.36 is built from source") and said.count("\n") == 3


def test_the_build_notice_is_not_shown_when_pips_wheel_cache_holds_llama_cpp_python(tmp_path: Path) -> None:
    assert _build_notice(tmp_path, cached_wheel="/cache/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl") == ""


NO_BUILD_SAMPLE = """
    def test_quantizes(llama_quantize_tool):
        pass
"""


def test_a_tool_test_that_may_not_build_fails_saying_to_run_make_tools(tmp_path: Path) -> None:
    # what a test needing llama.cpp's tools does under `make test` when they are missing: one clear failure
    missing = {"GGUF_MTP_TOOLS_NO_BUILD": "1", "GGUF_MTP_TOOLS_CACHE": str(tmp_path / "empty-cache"),
               "GGUF_MTP_UPSTREAM_SDIST": "", "GGUF_MTP_LLAMA_QUANTIZE": ""}
    done = _pytest(tmp_path, NO_BUILD_SAMPLE, env=missing)
    assert done.returncode == 1, done.stdout
    assert "1 error" in done.stdout  # the fixture failed: an error of the test, with the reason
    assert "forbids building them here: run `make tools` (scripts/build_llama_tools.py) first" in done.stdout
    assert not (tmp_path / "empty-cache").exists()  # nothing fetched, nothing built


# --------------------------------------------------------------------------------------- item 20

TOOLS_SAMPLE = """
    import pytest

    @pytest.fixture
    def merged(gguf_split_tool):
        return gguf_split_tool

    def test_direct(llama_quantize_tool):
        pass

    def test_through_a_fixture(merged):
        pass

    def test_server(llama_server_tool):
        pass

    def test_plain():
        pass
"""


def _collected(done: subprocess.CompletedProcess[str]) -> list[str]:
    return sorted(line.split("::")[-1] for line in done.stdout.splitlines() if "::" in line)


def test_tests_that_need_a_native_llama_cpp_tool_are_marked_tools(tmp_path: Path) -> None:
    quick = _pytest(tmp_path, TOOLS_SAMPLE, "--collect-only", "-m", "not llama and not tools and not upstream")
    tools = _pytest(tmp_path, TOOLS_SAMPLE, "--collect-only", "-m", "tools")
    assert quick.returncode == tools.returncode == 0, quick.stdout + tools.stdout
    assert _collected(quick) == ["test_plain"]
    assert _collected(tools) == ["test_direct", "test_server", "test_through_a_fixture"]


SLOW_SAMPLE = """
    import pytest

    def test_tool(llama_quantize_tool):
        pass

    @pytest.mark.upstream
    def test_converter():
        pass

    @pytest.mark.slow
    def test_marked():
        pass

    def test_plain():
        pass
"""


def test_the_quick_loop_leaves_out_the_tools_the_converter_and_what_is_marked_slow(tmp_path: Path) -> None:
    quick = _pytest(tmp_path, SLOW_SAMPLE, "--collect-only", "-m", "not slow")
    slow = _pytest(tmp_path, SLOW_SAMPLE, "--collect-only", "-m", "slow")
    assert quick.returncode == slow.returncode == 0, quick.stdout + slow.stdout
    assert _collected(quick) == ["test_plain"]
    assert _collected(slow) == ["test_converter", "test_marked", "test_tool"]


BENCH_SAMPLE = """
    import pytest

    @pytest.mark.bench
    def test_plots():
        import matplotlib  # noqa: F401

    def test_other():
        pass
"""
WITHOUT_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None"  # what `import` and find_spec see when absent


def test_a_missing_bench_extra_skips_its_tests_cleanly(tmp_path: Path) -> None:
    done = _pytest(tmp_path, BENCH_SAMPLE, "-rs", prelude=WITHOUT_MATPLOTLIB)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout
    assert "matplotlib is not installed (pip install '.[bench]')" in done.stdout


def test_a_missing_bench_extra_fails_the_run_under_ci(tmp_path: Path) -> None:
    done = _pytest(tmp_path, BENCH_SAMPLE, prelude=WITHOUT_MATPLOTLIB, env={"CI": "true"})
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout
    assert "CI=true but matplotlib is not installed (pip install '.[bench]'): the 1 bench test(s) cannot run" \
        in done.stderr


def test_the_benchmark_tests_skip_without_matplotlib_instead_of_erroring() -> None:
    code = (f"{WITHOUT_MATPLOTLIB}; import pytest, sys; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'bench', '-rs', 'tests/test_perf.py']))")
    environment = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=environment)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " skipped" in done.stdout and "passed" not in done.stdout and "error" not in done.stdout.lower()
    # The benchmark tests also need llama-cpp-python (the quick run quantizes a head): without it (the floor suite)
    # that is the first reason given.
    from gguf_mtp.check.llama_check import llama_cpp_available

    missing = "matplotlib is not installed" if llama_cpp_available() else "llama-cpp-python is not installed"
    assert missing in done.stdout


# --------------------------------------------------------------------------------------- item 21

RETENTION_SAMPLE = f"""
    import pytest
    from support.session import shared_tmp_dir

    @pytest.fixture(scope="module")
    def shared(request):
        folder = shared_tmp_dir(request, "shared")
        (folder / "model.bin").write_bytes(bytes({4 * MiB}))
        return folder

    def test_passes(tmp_path, shared):
        (tmp_path / "out.bin").write_bytes(bytes({4 * MiB}))

    def test_fails(tmp_path, shared):
        (tmp_path / "out.bin").write_bytes(bytes({4 * MiB}))
        assert FAIL
"""


def _left(tmp_path: Path) -> dict[str, int]:
    """What pytest's sessions left under the temporary root: top-level folder -> bytes in it."""
    sessions = sorted((tmp_path / "temproot").glob("pytest-of-*/pytest-[0-9]*"))
    return {f"{session.name}/{entry.name}": sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
            for session in sessions for entry in session.iterdir() if not entry.is_symlink()}


def test_a_passing_session_leaves_nothing_in_the_temporary_folder(tmp_path: Path) -> None:
    done = _pytest(tmp_path, RETENTION_SAMPLE.replace("FAIL", "True"))
    assert done.returncode == 0, done.stdout
    assert _left(tmp_path) == {}


def test_a_failing_session_leaves_only_what_failed(tmp_path: Path) -> None:
    done = _pytest(tmp_path, RETENTION_SAMPLE.replace("FAIL", "False"))
    assert done.returncode == 1, done.stdout
    # the failed test's folder, and the module's shared folder a failed test used; not the passed test's
    assert _left(tmp_path) == {"pytest-0/shared0": 4 * MiB, "pytest-0/test_fails0": 4 * MiB}


# --------------------------------------------------------------------------------------- issue 29 item 13

README = ROOT / "README.md"
#: The suite's own page: ``make test`` step by step, the markers, the quick loop.
TESTS_PAGE = ROOT / "docs" / "development" / "tests.md"
#: How far the docs' rounded test counts may drift while tests are added, before this test asks for new ones.
COUNT_TOLERANCE = 0.15
COUNTER = """
import json

def pytest_collection_finish(session):
    floor = [i for i in session.items if not i.get_closest_marker("llama") and not i.get_closest_marker("upstream")]
    quick = [i for i in session.items if not i.get_closest_marker("slow")]
    print("COUNTS " + json.dumps({"all": len(session.items), "floor": len(floor), "quick": len(quick)}))
"""


def _section(title: str, page: Path = README) -> str:
    """The ``## title`` section of ``page``, up to the next ``##`` heading."""
    text = page.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _collected_counts(tmp_path: Path) -> dict[str, int]:
    """What pytest collects: the whole suite (``make test``'s pytest step), its non-llama part (the floor step) and
    the quick loop (``-m "not slow"``)."""
    (tmp_path / "count_plugin.py").write_text(COUNTER)
    environment = {k: v for k, v in os.environ.items() if k != "CI"}
    environment["PYTHONPATH"] = os.pathsep.join([str(tmp_path), environment.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "count_plugin", "-p",
                           "no:cacheprovider"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=environment)
    assert done.returncode == 0, done.stdout[-3000:]
    import json

    [line] = [line for line in done.stdout.splitlines() if line.startswith("COUNTS ")]
    return dict(json.loads(line.removeprefix("COUNTS ")))


def _about(text: str, what: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(rf"about ([\d,]+) {what}", text)]


#: The title of the tests page's table of ``make test``'s steps.
STEPS = "`make test`, step by step"


def _row(step: str) -> str:
    """The steps table's row of ``make test``'s step ``step``."""
    return next(line for line in _section(STEPS, TESTS_PAGE).splitlines() if line.startswith(f"| `{step}`"))


def _make_test_line() -> str:
    """The README's Quick start line that gives the test command, ``make test``."""
    return next(line for line in _section("Quick start").splitlines() if line.startswith("make test "))


def test_the_docs_test_counts_are_what_pytest_collects(tmp_path: Path) -> None:
    counts = _collected_counts(tmp_path)
    runs, quick = _section("What `make test` runs", TESTS_PAGE), _section("The quick loop", TESTS_PAGE)
    stated = {"all": _about(_make_test_line(), "tests") + _about(_row("test-pytest"), "tests") + _about(runs, "tests"),
              "floor": _about(_row("test-floor"), "tests"), "quick": _about(quick, "quick tests")}
    assert [len(stated["all"]), len(stated["floor"]), len(stated["quick"])] == [3, 1, 1], stated
    for part, figures in stated.items():
        for figure in figures:
            assert abs(figure - counts[part]) <= COUNT_TOLERANCE * counts[part], (part, figure, counts)


def test_the_steps_table_names_every_step_of_make_test_and_the_prerequisites_what_they_need() -> None:
    done = subprocess.run([_make(), "-n", "--no-print-directory", "test"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=_make_env())
    steps = [line.removeprefix("gguf-mtp: make ") for line in done.stdout.splitlines()
             if line.startswith("gguf-mtp: make ")]
    rows = {name.strip("` ") for line in _section(STEPS, TESTS_PAGE).splitlines() if line.startswith("| `")
            for name in line.split("|")[1].split(",")}
    assert set(steps) <= rows, set(steps) - rows
    prerequisites = _section("Prerequisites")
    # what the tools step (cmake), the reflink test (mkfs.xfs, .ci/run installs xfsprogs) and pip's build need
    for program in ("`cmake`", "`xfsprogs` (`mkfs.xfs`)", "C/C++ compiler and `make`"):
        assert program in prerequisites, program
    assert "apt-get install -y xfsprogs" in (ROOT / ".ci" / "run").read_text()


# ------------------------------------------------------------------------------- the suite's xdist workers


def test_a_work_unit_is_a_module_or_every_test_of_one_parity_set() -> None:
    from support.parity_sets import work_unit
    from support.scheduling import ModuleOrParitySetScheduling

    units = {"tests/test_upstream_parity.py::test_convert_equals_upstream_mtp_blocks[glm5]": "parity:glm5",
             "tests/test_family_dsa.py::test_verify_accepts_the_glm_dsa_composite[glm5]": "parity:glm5",
             "tests/test_family_dsa.py::test_target_checks[glm5-blk.0.attn_k_b.weight-6]": "tests/test_family_dsa.py",
             "tests/test_perf.py::test_parse_size_reads_binary_units": "tests/test_perf.py",
             "tests/test_x.py::TestY::test_z[not-a-set]": "tests/test_x.py"}
    assert {nodeid: work_unit(nodeid) for nodeid in units} == units
    assert ModuleOrParitySetScheduling._split_scope(object(), "tests/a.py::t[step35]") == "parity:step35"  # type: ignore[arg-type]


PARITY_IDS_SAMPLE = """
    import pytest

    @pytest.mark.parity("glm5")
    def test_marked_itself(parity):
        pass

    @pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.parity("step35"))])
    def test_marked_through_a_param_without_the_sets_id(x, parity):
        pass
"""


def test_a_parity_tests_id_names_its_set_or_the_collection_is_refused(tmp_path: Path) -> None:
    # the scheduler sees node ids only: a test of a set it cannot see would make that set again on another worker
    done = _pytest(tmp_path, PARITY_IDS_SAMPLE, "--collect-only")
    assert done.returncode != 0
    assert ("test_marked_through_a_param_without_the_sets_id[1] uses ParitySet 'step35': its id must be [step35]"
            in done.stdout + done.stderr)
    fine = _pytest(tmp_path, PARITY_IDS_SAMPLE.split("@pytest.mark.parametrize")[0], "--collect-only")
    assert fine.returncode == 0 and "test_sample.py::test_marked_itself[glm5]" in fine.stdout
