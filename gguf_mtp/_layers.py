"""The package's layers, bottom up, in tiers: the one declared order (``tests/test_layers.py`` enforces it).

The order is partial, as the imports are: the layers of one tier sit side by side (none imports another), each
on the tier just below it (it imports at least one layer there: no layer is declared higher than its imports
put it). A module may import only from its own layer or from a layer of a lower tier, at any level (module,
function or ``TYPE_CHECKING`` block): a type-only import still couples the two layers. docs/design.md's layer table
lists the same tiers and layers in the same order, its module table puts every module in its layer, and the test
checks that they do.
"""

from __future__ import annotations

__all__ = ["LAYERS", "TIERS", "layer_of", "tier_of"]

#: A layer: its name, and the modules and packages it holds.
Layer = tuple[str, tuple[str, ...]]

#: The tiers, bottom up; each a tuple of layers that may not import each other. Every module of gguf_mtp belongs
#: to exactly one layer.
TIERS: tuple[tuple[Layer, ...], ...] = (
    (("base", ("gguf_mtp._gguf_tables", "gguf_mtp._layers", "gguf_mtp._version", "gguf_mtp.constants",
               "gguf_mtp.errors", "gguf_mtp.llama_build", "gguf_mtp.llama_server", "gguf_mtp.text")),),
    (("files", ("gguf_mtp.files",)),),
    (("format", ("gguf_mtp.format",)), ("write", ("gguf_mtp.write",))),
    (("hub", ("gguf_mtp.hub",)), ("testing", ("gguf_mtp.testing",))),
    (("model", ("gguf_mtp.model",)),),
    (("conversion", ("gguf_mtp.conversion",)), ("server", ("gguf_mtp.server",)), ("check", ("gguf_mtp.check",))),
    (("jobs", ("gguf_mtp.jobs",)),),
    (("release", ("gguf_mtp.release",)),),
    (("demo", ("gguf_mtp.demo",)), ("api", ("gguf_mtp",))),  # api: the package itself, the lazy public names
    (("cli", ("gguf_mtp.cli", "gguf_mtp.__main__")),),
)

#: Every layer, bottom up, tier by tier (the order of docs/design.md's layer table).
LAYERS: tuple[Layer, ...] = tuple(layer for tier in TIERS for layer in tier)


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the layer holding ``module`` (a dotted name), or ``None``."""
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            # a member holds itself and, unless it is the package itself, everything under it
            if module == member or (member != __package__ and module.startswith(member + ".")):
                return index
    return None


def tier_of(module: str) -> int | None:
    """The index in :data:`TIERS` of the tier whose layer holds ``module``, or ``None``."""
    index = layer_of(module)
    if index is None:
        return None
    name = LAYERS[index][0]
    return next(t for t, tier in enumerate(TIERS) if any(layer == name for layer, _ in tier))
