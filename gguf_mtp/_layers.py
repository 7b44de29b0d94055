"""The package's layers, bottom up: the one declared order (``tests/test_layers.py`` enforces it).

A module may import only from its own layer or from the layers below it, at any level (module, function or
``TYPE_CHECKING`` block): a type-only import still couples the two layers. The README's "How it is built"
table lists the same layers in the same order, and the test checks that it does.
"""

from __future__ import annotations

__all__ = ["LAYERS", "layer_of"]

#: (layer, the modules and packages it holds), bottom up. Every module of gguf_mtp belongs to exactly one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("gguf_mtp._gguf_tables", "gguf_mtp._layers", "gguf_mtp._version", "gguf_mtp.constants",
              "gguf_mtp.errors", "gguf_mtp.formatting")),
    ("files", ("gguf_mtp.files",)),
    ("format", ("gguf_mtp.format",)),
    ("hub", ("gguf_mtp.hub",)),
    ("model", ("gguf_mtp.model",)),
    ("conversion", ("gguf_mtp.conversion",)),
    ("write", ("gguf_mtp.write",)),
    ("check", ("gguf_mtp.check",)),
    ("jobs", ("gguf_mtp.jobs",)),
    ("testing", ("gguf_mtp.testing",)),
    ("release", ("gguf_mtp.release",)),
    ("cli", ("gguf_mtp.cli", "gguf_mtp.__main__")),
    ("api", ("gguf_mtp",)),  # the package itself: the lazy public names of every layer
)


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the layer holding ``module`` (a dotted name), or ``None``."""
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            # a member holds itself and, unless it is the package itself, everything under it
            if module == member or (member != __package__ and module.startswith(member + ".")):
                return index
    return None
