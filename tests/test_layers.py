"""The layers are a fact: every import of gguf_mtp goes down the one declared order (gguf_mtp/_layers.py).

Every ``import`` and ``from ... import`` statement counts, wherever it is: at module level, inside a
function (a lazy import is still a dependency) and under ``if TYPE_CHECKING:`` (a type-only import still
couples the two layers, and mypy follows it). Only ``importlib.import_module`` of a computed name is not
seen; the package uses it for its own submodules only (the lazy public names, the CLI's commands, the
converter families), each within its own layer or from the top one.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from gguf_mtp._layers import LAYERS, layer_of

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gguf_mtp"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(module: str, source: str, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """The gguf_mtp modules ``source`` (the text of ``module``) imports, with line numbers, at any level."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                submodule = f"{target}.{alias.name}"
                found.append((submodule if submodule in known else target, node.lineno))
    ours = [(name, line) for name, line in found if name == "gguf_mtp" or name.startswith("gguf_mtp.")]
    return list(dict.fromkeys(ours))  # one per statement and module, however many names it imports


def import_graph() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import between gguf_mtp modules."""
    modules = package_modules()
    edges = []
    for name, path in modules.items():
        for target, line in imported_modules(name, path.read_text(), path.name == "__init__.py", set(modules)):
            if target != name:
                edges.append((name, target, line))
    return edges


def upward_imports(edges: list[tuple[str, str, int]]) -> list[str]:
    offenders = []
    for importer, imported, line in edges:
        low, high = layer_of(importer), layer_of(imported)
        if low is not None and high is not None and high > low:
            offenders.append(f"{importer} -> {imported} (line {line}: layer {LAYERS[high][0]} above "
                             f"{LAYERS[low][0]})")
    return offenders


def top_package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_cycles(edges: list[tuple[str, str, int]]) -> list[list[str]]:
    """The strongly connected sets of more than one top-level package (gguf_mtp.x), Tarjan's algorithm."""
    graph: dict[str, set[str]] = defaultdict(set)
    for importer, imported, _ in edges:
        a, b = top_package(importer), top_package(imported)
        if a != b and a != "gguf_mtp" and b != "gguf_mtp":  # the package itself holds only the lazy names
            graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                cycles.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_every_module_is_in_one_declared_layer() -> None:
    members = [m for _, layer in LAYERS for m in layer]
    assert len(members) == len(set(members)), "a module or package is declared in two layers"
    unplaced = [m for m in package_modules() if layer_of(m) is None]
    assert not unplaced, "modules in no layer of gguf_mtp/_layers.py:\n" + "\n".join(unplaced)


def test_no_import_goes_up() -> None:
    offenders = upward_imports(import_graph())
    assert not offenders, f"{len(offenders)} imports go up the layers of gguf_mtp/_layers.py:\n" + "\n".join(offenders)


def test_no_package_cycles() -> None:
    cycles = package_cycles(import_graph())
    assert not cycles, "packages that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("module", "source", "offending"),
    [
        ("gguf_mtp.format.header", "from gguf_mtp.write import write_outputs\n", "gguf_mtp.write"),
        ("gguf_mtp.files.digests", "def f():\n    from ..release import publish\n", "gguf_mtp.release.publish"),
        ("gguf_mtp.hub.client", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gguf_mtp.cli\n",
         "gguf_mtp.cli"),
        ("gguf_mtp.model.shards", "from .. import check\n", "gguf_mtp.check"),
    ],
)
def test_the_checker_sees_every_kind_of_upward_import(module: str, source: str, offending: str) -> None:
    known = set(package_modules())
    edges = [(module, target, line) for target, line in imported_modules(module, source, False, known)]
    [offender] = upward_imports(edges)
    assert offender.startswith(f"{module} -> {offending} (line ")


def test_the_checker_sees_a_package_cycle() -> None:
    edges = [("gguf_mtp.files.a", "gguf_mtp.write", 1), ("gguf_mtp.write", "gguf_mtp.files.b", 1)]
    assert package_cycles(edges) == [["gguf_mtp.files", "gguf_mtp.write"]]


def readme_layer_table() -> list[tuple[str, list[str]]]:
    """(layer, [module names]) of the README's "How it is built" table, in its order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## How it is built", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= set("-:"):
            continue
        paths = re.findall(r"`([^`]+)`", cells[1])
        folder = paths[0].rpartition("/")[0] if paths else ""
        modules = []
        for path in paths:
            full = path if path.startswith("gguf_mtp") else f"{folder}/{path}"
            modules.append(full.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        rows.append((cells[0], modules))
    return rows


def test_readme_table_is_the_declared_order() -> None:
    table = readme_layer_table()
    assert [layer for layer, _ in table] == [layer for layer, _ in LAYERS]

    def public(member: str) -> bool:
        last = member.rpartition(".")[2]
        return not last.startswith("_") or last.startswith("__")

    for (layer, listed), (_, members) in zip(table, LAYERS):
        assert set(listed) == {m for m in members if public(m)}, f"README row {layer!r}"
