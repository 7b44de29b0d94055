"""The llama.cpp sources the architecture rules rest on, checked against the copy vendored in the pinned
llama-cpp-python sdist (issue 33 item 4): every ``path:line`` a rule of :mod:`gguf_mtp.model.arch_rules` cites
exists there, and the cited lines say what the rule takes from them (as tests/test_quant_rules.py does for
llama-quantize's rules). Prose comments cite files and functions, not line numbers, so only the tables are
checked here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tarfile
from collections.abc import Callable
from functools import cache
from pathlib import Path, PurePosixPath
from types import ModuleType

import pytest

from gguf_mtp.model import sidecar_names
from gguf_mtp.model.arch_rules import ARCH_RULES, COMMON_RULES, HEADS_REFUSED, MTP_GRAPH_BLOCKS

#: ``path:12``, ``path:12-20`` and ``path:12-20, 30-33`` (path relative to llama.cpp's root, or a model file's name).
CITATION = re.compile(r"(?P<path>[\w./-]+\.(?:cpp|h|py)):(?P<spans>\d+(?:-\d+)?(?:, \d+(?:-\d+)?)*)")
#: Lines of slack around a cited span (a blank line or a brace moved by a reformat).
SLACK = 2


def _tools() -> ModuleType:
    script = Path(__file__).resolve().parent.parent / "scripts" / "build_llama_tools.py"
    spec = importlib.util.spec_from_file_location("build_llama_tools_for_citations", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _sources() -> dict[str, list[str]]:
    """Every .cpp/.h/.py file of the vendored llama.cpp: path relative to its root -> its lines."""
    return _tree("find_sdist", "/vendor/llama.cpp/")


@cache
def _upstream_sources() -> dict[str, list[str]]:
    """Every .cpp/.h/.py file of llama.cpp build b11434 (the sidecar rules' source): path -> its lines."""
    return _tree("find_upstream_sdist", "/llama.cpp/")


def _tree(finder: str, root: str) -> dict[str, list[str]]:
    """The .cpp/.h/.py files under ``root`` in the sdist the tools script's ``finder`` gives (downloaded under
    ``CI=true``, else skipped when not in the tools cache)."""
    tools = _tools()
    try:
        sdist = getattr(tools, finder)(tools.cache_dir(), download=os.environ.get("CI") == "true")
    except tools.BuildError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: the sdist is not available: {e}")
        pytest.skip(f"the sdist is not in the tools cache: {e}")
    files: dict[str, list[str]] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            _, sep, rel = member.name.partition(root)
            if sep and member.isfile() and rel.endswith((".cpp", ".h", ".py")):
                data = tar.extractfile(member)
                assert data is not None
                files[rel] = data.read().decode("utf-8", errors="replace").splitlines()
    return files


def _resolve(path: str) -> str:
    """The one vendored file ``path`` names (a bare model file name stands for ``src/models/NAME``)."""
    files = _sources()
    if path in files:
        return path
    matches = [rel for rel in files if PurePosixPath(rel).name == PurePosixPath(path).name
               and rel.endswith("/" + path)]
    assert len(matches) == 1, f"{path}: {len(matches)} vendored files by that name"
    return matches[0]


def _cited_lines(
    citation: re.Match[str], sources: dict[str, list[str]] | None = None
) -> tuple[str, str]:
    """(the file, the text of every cited span with SLACK lines around it); ``sources``: b11434's, not the vendored."""
    rel = _resolve(citation["path"]) if sources is None else citation["path"]
    lines = (_sources() if sources is None else sources)[rel]
    text = []
    for span in citation["spans"].split(", "):
        first, _, last = span.partition("-")
        start, end = int(first), int(last or first)
        assert 1 <= start <= end <= len(lines), f"{citation[0]}: {rel} has {len(lines)} lines"
        text.extend(lines[max(0, start - 1 - SLACK):end + SLACK])
    return rel, "\n".join(text)


def _terms(after: str) -> list[str]:
    """What a citation says the lines hold: the identifiers and quoted words after it, up to its closing
    parenthesis or the next citation."""
    words = re.findall(r'"([^"]+)"|\b([a-z][a-z0-9]*_[a-z0-9_]*)\b', after.split(")", 1)[0])
    return [quoted or ident for quoted, ident in words]


def _table_citations() -> list[tuple[str, str, list[str]]]:
    """(where in the tables, the citation, the terms its lines must hold)."""
    found = []
    texts = [(f"COMMON_RULES[{k}]", r.source, []) for k, r in COMMON_RULES.items()]
    texts += [(f"ARCH_RULES[{a}][{k}]", r.source, []) for a, rules in ARCH_RULES.items() for k, r in rules.items()]
    texts += [(f"HEADS_REFUSED[{a}]", r.reason, []) for a, r in HEADS_REFUSED.items()]
    texts += [(f"MTP_GRAPH_BLOCKS[{a}]", source, ["n_layer_nextn"] if count == 1 else ["nextn_layer_offset"])
              for a, (count, source) in MTP_GRAPH_BLOCKS.items()]
    for where, text, required in texts:
        citations = list(CITATION.finditer(text))
        for citation, following in zip(citations, [*citations[1:], None]):
            said = text[citation.end():following.start() if following else len(text)]
            found.append((where, citation[0], required or _terms(said.lstrip(" (:,"))))
    return found


CITED = _table_citations()


def test_the_tables_cite_llama_cpp() -> None:
    assert len(CITED) >= 30
    assert sum(1 for _, _, terms in CITED if terms) >= 25  # most citations name what the lines hold


@pytest.mark.parametrize(("where", "citation", "terms"), CITED, ids=[c[0] for c in CITED])
def test_every_cited_line_is_in_the_vendored_llama_cpp_and_says_what_the_rule_takes(
    where: str, citation: str, terms: list[str]
) -> None:
    match = CITATION.fullmatch(citation)
    assert match is not None
    rel, text = _cited_lines(match)
    missing = [t for t in terms if t not in text]
    assert not missing, f"{where}: {rel} lines {match['spans']} do not hold {missing}"


def test_a_wrong_line_is_caught() -> None:
    match = CITATION.fullmatch("src/models/glm4-moe.cpp:1")
    assert match is not None
    _, text = _cited_lines(match)
    assert "n_layer_nextn" not in text


@pytest.mark.parametrize("tree", [_sources, _upstream_sources], ids=["0c1e570", "b11434"])
def test_llama_cpp_reads_underscores_as_dashes_in_long_options_as_bench_does(
        tree: Callable[[], dict[str, list[str]]]) -> None:
    """gguf_mtp.server.options.option_name cites common/arg.cpp's ``common_params_parse_ex`` (issue 37 item 1):
    an argument starting with ``--`` has every ``_`` replaced by ``-`` before it is looked up, and no ``=`` is
    split off; in both llama.cpp builds the tests run llama-server from (issue 38 item 2)."""
    source = "\n".join(tree()["common/arg.cpp"])
    body = source[source.index("static bool common_params_parse_ex("):]
    body = body[:body.index("\n}\n")]
    assert 'const std::string arg_prefix = "--";' in body
    assert "if (arg.compare(0, arg_prefix.size(), arg_prefix) == 0) {" in body
    assert "std::replace(arg.begin(), arg.end(), '_', '-');" in body
    assert "'='" not in body


SIDECAR_CITED = [(rule, CITATION.match(text), _terms(text[text.index("(") + 1:]))
                 for rule, text in sidecar_names.SOURCES.items()]


def test_the_sidecar_rules_name_the_build_they_were_read_from() -> None:
    assert sidecar_names.LLAMA_CPP_BUILD == "b11434"
    assert set(sidecar_names.SOURCES) >= {"split_info", "quant_bits", "find_best_sibling", "keyword", "is_model_file",
                                           "sidecar_file_name"}
    assert all(match is not None and terms for _, match, terms in SIDECAR_CITED)


@pytest.mark.parametrize(("rule", "citation", "terms"), SIDECAR_CITED, ids=[c[0] for c in SIDECAR_CITED])
def test_every_sidecar_rule_cites_the_lines_of_llama_cpp_b11434_that_hold_it(
    rule: str, citation: re.Match[str], terms: list[str]
) -> None:
    """gguf_mtp.model.sidecar_names (issue 39 item 1): each rule's cited lines of b11434 hold what it names."""
    rel, text = _cited_lines(citation, _upstream_sources())
    missing = [t for t in terms if t not in text]
    assert not missing, f"{rule}: {rel} lines {citation['spans']} do not hold {missing}"


def test_the_sidecar_name_is_gguf_py_s_naming_convention_as_b11434_s_converter_calls_it() -> None:
    """The MTP-only file name: ``mtp-`` + naming_convention(name, basename, finetune, version, no size label, the
    type); gguf-mtp calls the installed gguf-py's function, which must be b11434's."""
    import inspect

    from gguf.utility import naming_convention

    source = "\n".join(_upstream_sources()["gguf-py/gguf/utility.py"])
    ours = inspect.getsource(naming_convention)
    body = ours[ours.index("    if base_name is not None:"):]
    assert body.strip() in source
    glm = "\n".join(_upstream_sources()["conversion/glm.py"])
    assert 'self.fname_out = self.fname_out.parent / f"mtp-{fname_default}.gguf"' in glm
    assert "self.metadata.version, size_label=None, output_type=output_type, model_type=None)" in glm


def test_a_wrong_line_of_b11434_is_caught() -> None:
    match = CITATION.fullmatch("common/download.cpp:1")
    assert match is not None
    _, text = _cited_lines(match, _upstream_sources())
    assert "find_best_sibling" not in text
