"""The layers are a fact: every import of gguf_mtp goes down the one declared order (gguf_mtp/_layers.py), a
partial one: the layers of a tier sit side by side and do not import each other.

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
from collections.abc import Iterable
from pathlib import Path

import pytest

from gguf_mtp._layers import LAYERS, TIERS, layer_of, tier_of

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gguf_mtp"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(module: str, source: str, is_package: bool, known: set[str],
                     import_time_only: bool = False) -> list[tuple[str, int]]:
    """The gguf_mtp modules ``source`` (the text of ``module``) imports, with line numbers, at any level (or,
    with ``import_time_only``, those it imports when it is imported: :func:`import_time_nodes`)."""
    found = []
    tree = ast.parse(source)
    for node in import_time_nodes(tree) if import_time_only else ast.walk(tree):
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


def import_time_nodes(tree: ast.Module) -> list[ast.stmt]:
    """The import statements that run when the module is imported: at module level, in ``if``/``try``/``with``/
    loop and class bodies, not in a function nor under ``if TYPE_CHECKING:``."""
    found: list[ast.stmt] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            test = node.test
            type_checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
            pending += node.orelse if type_checking else [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending += [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
        elif isinstance(node, (ast.With, ast.For, ast.While, ast.ClassDef)):
            pending += node.body
            pending += getattr(node, "orelse", [])
    return found


def import_graph(import_time_only: bool = False) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import between gguf_mtp modules (only those run at import time with
    ``import_time_only``)."""
    modules = package_modules()
    edges = []
    for name, path in modules.items():
        source = path.read_text()
        for target, line in imported_modules(name, source, path.name == "__init__.py", set(modules), import_time_only):
            if target != name:
                edges.append((name, target, line))
    return edges


def upward_imports(edges: list[tuple[str, str, int]]) -> list[str]:
    """The imports that do not go down: into a layer of a higher tier, or of the same tier (side by side)."""
    offenders = []
    for importer, imported, line in edges:
        low, high = layer_of(importer), layer_of(imported)
        if low is None or high is None or low == high:
            continue
        low_tier, high_tier = tier_of(importer), tier_of(imported)
        assert low_tier is not None and high_tier is not None
        if high_tier >= low_tier:
            where = "beside" if high_tier == low_tier else "above"
            offenders.append(f"{importer} -> {imported} (line {line}: layer {LAYERS[high][0]} {where} "
                             f"{LAYERS[low][0]})")
    return offenders


def top_package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def strongly_connected(pairs: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected sets of more than one node of the graph ``pairs`` (its edges), Tarjan's algorithm."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in pairs:
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


def package_cycles(edges: list[tuple[str, str, int]]) -> list[list[str]]:
    """The sets of top-level packages (gguf_mtp.x) that import each other."""
    pairs = [(top_package(a), top_package(b)) for a, b, _ in edges]
    # the package itself holds only the lazy names
    return strongly_connected((a, b) for a, b in pairs if a != b and "gguf_mtp" not in (a, b))


def module_cycles(edges: list[tuple[str, str, int]]) -> list[list[str]]:
    """The sets of modules that import each other (give it the import-time edges: see :func:`import_time_nodes`)."""
    return strongly_connected((a, b) for a, b, _ in edges)


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


def test_no_module_cycles() -> None:
    """No two modules need each other to be imported (a package and its own submodules included): the order in
    which a cycle's modules are first imported would decide which of them sees the other half-made."""
    cycles = module_cycles(import_graph(import_time_only=True))
    assert not cycles, "modules that import each other at import time: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_every_layer_sits_on_the_tier_below() -> None:
    """The declared order is the real partial order: a layer that imports nothing from the tier just below its
    own could sit lower, and is declared too high."""
    needs: dict[str, set[int]] = defaultdict(set)
    for importer, imported, _ in import_graph():
        low, high = layer_of(importer), layer_of(imported)
        tier = tier_of(imported)
        if low is not None and high is not None and low != high and tier is not None:
            needs[LAYERS[low][0]].add(tier)
    too_high = [f"{name} (tier {t}: imports tiers {sorted(needs[name])})"
                for t, tier in enumerate(TIERS) if t for name, _ in tier if t - 1 not in needs[name]]
    assert not too_high, "layers declared above the tier their imports put them on: " + ", ".join(too_high)


@pytest.mark.parametrize(
    ("module", "source", "offending"),
    [
        ("gguf_mtp.format.header", "from gguf_mtp.write import write_outputs\n", "gguf_mtp.write"),
        ("gguf_mtp.files.digests", "def f():\n    from ..release import publish\n", "gguf_mtp.release.publish"),
        ("gguf_mtp.hub.client", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gguf_mtp.cli\n",
         "gguf_mtp.cli"),
        ("gguf_mtp.model.shards", "from .. import check\n", "gguf_mtp.check"),
        ("gguf_mtp.conversion.base", "from gguf_mtp.server.bench import bench\n", "gguf_mtp.server.bench"),
    ],
)
def test_the_checker_sees_every_kind_of_upward_import(module: str, source: str, offending: str) -> None:
    known = set(package_modules())
    edges = [(module, target, line) for target, line in imported_modules(module, source, False, known)]
    [offender] = upward_imports(edges)
    assert offender.startswith(f"{module} -> {offending} (line ")


def test_the_checker_sees_a_module_cycle_only_at_import_time() -> None:
    known = {"gguf_mtp.hub.a", "gguf_mtp.hub.b", "gguf_mtp.hub.c"}
    sources = {
        "gguf_mtp.hub.a": "from . import b\n",
        "gguf_mtp.hub.b": "try:\n    from .a import x\nexcept ImportError:\n    pass\n",
        "gguf_mtp.hub.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n"
                          "def f():\n    from .b import y\n",
    }
    edges = [(m, t, line) for m, src in sources.items() for t, line in imported_modules(m, src, False, known, True)]
    assert module_cycles(edges) == [["gguf_mtp.hub.a", "gguf_mtp.hub.b"]]
    assert ("gguf_mtp.hub.c", "gguf_mtp.hub.a", 3) not in edges and ("gguf_mtp.hub.c", "gguf_mtp.hub.b", 5) not in edges


def test_the_checker_sees_a_package_cycle() -> None:
    edges = [("gguf_mtp.files.a", "gguf_mtp.write", 1), ("gguf_mtp.write", "gguf_mtp.files.b", 1)]
    assert package_cycles(edges) == [["gguf_mtp.files", "gguf_mtp.write"]]


#: The page that describes the layers and every module (the README's "How it is built" moved there, issue 40 item 5).
DESIGN = ROOT / "docs" / "design.md"


def design_section(title: str) -> str:
    """The ``## title`` section of docs/design.md, up to the next ``##`` heading."""
    return DESIGN.read_text(encoding="utf-8").split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def table_rows(section: str) -> list[list[str]]:
    """The body rows of the markdown tables in ``section``, each as its stripped cells (header and rule left out)."""
    rows = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: ") or cells[0] in ("tier", "layer"):
            continue
        rows.append(cells)
    return rows


def design_layer_table() -> list[tuple[int, str, list[str]]]:
    """(tier, layer, [module names]) of docs/design.md's layer table, in its order."""
    rows = []
    for cells in table_rows(design_section("The layers")):
        paths = re.findall(r"`([^`]+)`", cells[2])
        folder = paths[0].rpartition("/")[0] if paths else ""
        modules = []
        for path in paths:
            full = path if path.startswith("gguf_mtp") else f"{folder}/{path}"
            modules.append(full.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", "."))
        rows.append((int(cells[0]), cells[1], modules))
    return rows


def design_module_table() -> list[tuple[str, str, str]]:
    """(layer, module path, description) of docs/design.md's table of every module, in its order."""
    rows = []
    for cells in table_rows(design_section("Every module")):
        assert len(cells) == 3, cells
        path = re.fullmatch(r"`(gguf_mtp/[^`]+\.py)`", cells[1])
        assert path is not None, f"not a module path: {cells[1]!r}"
        rows.append((cells[0], path[1], cells[2]))
    return rows


def test_design_layer_table_is_the_declared_order() -> None:
    table = design_layer_table()
    assert [(tier, layer) for tier, layer, _ in table] == [(t, name) for t, tier in enumerate(TIERS)
                                                            for name, _ in tier]

    def public(member: str) -> bool:
        last = member.rpartition(".")[2]
        return not last.startswith("_") or last.startswith("__")

    for (_, layer, listed), (_, members) in zip(table, LAYERS):
        assert set(listed) == {m for m in members if public(m)}, f"docs/design.md row {layer!r}"


def test_every_module_of_the_package_is_described_once() -> None:
    described = [path for _, path, _ in design_module_table()]
    missing = sorted({p.relative_to(ROOT).as_posix() for p in package_modules().values()} - set(described))
    assert missing == [], f"modules without a row in docs/design.md's module table: {missing}"
    assert len(described) == len(set(described)), "a module described twice"


def test_every_described_module_exists_in_the_layer_the_declaration_puts_it() -> None:
    for layer, path, description in design_module_table():
        assert (ROOT / path).is_file(), f"docs/design.md describes {path}, which does not exist"
        index = layer_of(module_name(ROOT / path))
        assert index is not None and LAYERS[index][0] == layer, (path, layer)
        assert description, f"{path}: no description"


def test_the_module_table_follows_the_layer_table() -> None:
    order = [name for name, _ in LAYERS]
    layers = [order.index(layer) for layer, _, _ in design_module_table()]
    assert layers == sorted(layers)
