"""A corpus of hostile checkpoints for ``convert``: valid-but-hostile JSON, non-regular files, config
values of the wrong type or range, and counts that would drive huge allocations (issue 11, items 5,
7, 8 and 9).

Same shape as :mod:`malformed` (and built from its :class:`~malformed.Sources`): every entry breaks a
copy of the valid MTPv2 checkpoint, says what is broken and which phrase the one-line error must
contain, and returns the command line plus the file the error must name. Kept apart from
:data:`malformed.CORPUS` so that corpus's own invariants stay as they are.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from support.malformed import (
    Inputs,
    Malformed,
    Sources,
    _checkpoint,
    _convert_case,
    _rewrite_safetensors,
    _safetensors_header,
    _weight_files,
    u64,
)

__all__ = ["DEEP", "HOSTILE", "hostile"]

#: Nesting depth of the deep-JSON cases: Python's parser raises RecursionError far below it.
DEEP = 100_000

HOSTILE: list[Malformed] = []

INDEX = "model.safetensors.index.json"
EH_PROJ = "mtp.layers.0.eh_proj.weight"


def hostile(broken: str, expect: str) -> Callable[[Callable[[Sources, Path], Inputs]], Callable]:
    """Register a builder in :data:`HOSTILE`."""

    def register(build: Callable[[Sources, Path], Inputs]) -> Callable[[Sources, Path], Inputs]:
        HOSTILE.append(Malformed(build.__name__, "checkpoint", broken, expect, build))
        return build

    return register


def _deep() -> str:
    return "[" * DEEP + "]" * DEEP


def _with_member(text: str, member: str) -> str:
    """A JSON object's text with one more member appended (for values json.dumps cannot write)."""
    body = text.rstrip()
    assert body.endswith("}")
    return body[:-1] + ", " + member + "}"


def _edit_config(folder: Path, **values: object) -> Path:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(values)
    path.write_text(json.dumps(config))
    return path


def _raw_safetensors_header(path: Path, text: bytes) -> None:
    """Give a safetensors file the header ``text`` as is; the data after it is kept."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        f.seek(8 + length)
        data = f.read()
    text += b" " * (-len(text) % 8)
    path.write_bytes(u64(len(text)) + text + data)


def _file_holding(folder: Path, tensor: str) -> Path:
    return folder / json.loads((folder / INDEX).read_text())["weight_map"][tensor]


# ------------------------------------------------------------------------------- item 8: hostile JSON


@hostile("config.json holds arrays nested 100,000 deep", "nested more than 64 levels deep")
def config_nested_100000_deep(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    config = folder / "config.json"
    config.write_text(_with_member(config.read_text(), f'"deep": {_deep()}'))
    return _convert_case(src, folder, config)


@hostile("a safetensors header holds arrays nested 100,000 deep", "corrupt safetensors header: JSON nested more")
def safetensors_header_nested_100000_deep(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _file_holding(folder, EH_PROJ)
    text = json.dumps(_safetensors_header(weights), separators=(",", ":"))
    _raw_safetensors_header(weights, _with_member(text, f'"x":{{"deep":{_deep()}}}').encode())
    return _convert_case(src, folder, weights)


@hostile("the index holds arrays nested 100,000 deep", "not a valid index: JSON nested more than 64 levels")
def index_nested_100000_deep(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    index = folder / INDEX
    index.write_text(_with_member(index.read_text(), f'"deep": {_deep()}'))
    return _convert_case(src, folder, index)


@hostile("a tensor's shape holds Infinity", f"['{EH_PROJ}'].shape[0] = Infinity is not a finite number")
def shape_holds_infinity(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _file_holding(folder, EH_PROJ)
    header = _safetensors_header(weights)
    header[EH_PROJ]["shape"][0] = float("inf")  # json.dumps writes it as Infinity
    _rewrite_safetensors(weights, header)
    return _convert_case(src, folder, weights)


@hostile("a tensor's data_offsets hold 1e400", f"['{EH_PROJ}'].data_offsets[1] = 1e400 is not a finite number")
def offset_holds_1e400(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _file_holding(folder, EH_PROJ)
    header = _safetensors_header(weights)
    header[EH_PROJ]["data_offsets"][1] = "@BIG@"
    text = json.dumps(header, separators=(",", ":")).replace('"@BIG@"', "1e400")
    _raw_safetensors_header(weights, text.encode())
    return _convert_case(src, folder, weights)


@hostile("a tensor's shape holds a 30-digit integer", "shape[1] = 123456789012345678901234567890 is not a finite")
def shape_holds_huge_integer(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _file_holding(folder, EH_PROJ)
    header = _safetensors_header(weights)
    header[EH_PROJ]["shape"][1] = 123456789012345678901234567890
    _rewrite_safetensors(weights, header)
    return _convert_case(src, folder, weights)


@hostile("a tensor's shape holds a fraction", f"'{EH_PROJ}' shape[0] = 256.5 is not a dimension")
def shape_holds_fraction(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _file_holding(folder, EH_PROJ)
    header = _safetensors_header(weights)
    header[EH_PROJ]["shape"][0] = 256.5
    _rewrite_safetensors(weights, header)
    return _convert_case(src, folder, weights)


@hostile("config.json says hidden_size: NaN", "hidden_size = NaN is not a finite number")
def config_hidden_size_nan(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    return _convert_case(src, folder, _edit_config(folder, hidden_size=float("nan")))


@hostile("the index's weight_map is a list", "no weight_map {tensor name: file name}")
def index_weight_map_is_a_list(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    index = folder / INDEX
    index.write_text(json.dumps({"weight_map": [EH_PROJ]}))
    return _convert_case(src, folder, index)


# ------------------------------------------------------------------------ item 7: non-regular files


@hostile("config.json is a named pipe (reading it would wait forever)", "is not a regular file")
def config_is_fifo(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    config = folder / "config.json"
    config.unlink()
    os.mkfifo(config)
    return _convert_case(src, folder, config)


@hostile("config.json is a directory", "is a directory")
def config_is_directory(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    config = folder / "config.json"
    config.unlink()
    config.mkdir()
    return _convert_case(src, folder, config)


@hostile("a safetensors file the index names is a named pipe", "is not a regular file")
def safetensors_is_fifo(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _file_holding(folder, EH_PROJ)
    weights.unlink()
    os.mkfifo(weights)
    return _convert_case(src, folder, weights)


@hostile("model.safetensors.index.json is a named pipe", "is not a regular file")
def index_is_fifo(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    index = folder / INDEX
    index.unlink()
    os.mkfifo(index)
    return _convert_case(src, folder, index)


@hostile("model.safetensors.index.json is a directory", "is a directory")
def index_is_directory(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    index = folder / INDEX
    index.unlink()
    index.mkdir()
    return _convert_case(src, folder, index)


@hostile("a single-file checkpoint's model.safetensors is a named pipe", "is not a regular file")
def single_safetensors_is_fifo(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    for weights in _weight_files(folder):
        weights.unlink()
    (folder / INDEX).unlink()
    weights = folder / "model.safetensors"
    os.mkfifo(weights)
    return _convert_case(src, folder, weights)


# ------------------------------------------------------------------- item 9: config values, type/range


def _config_case(broken: str, expect: str, **values: object) -> None:
    def build(src: Sources, work: Path) -> Inputs:
        folder = _checkpoint(src, work)
        return _convert_case(src, folder, _edit_config(folder, **values))

    build.__name__ = "config_" + "_".join(f"{k}_{re.sub(r'[^0-9a-z]+', '_', repr(v).lower())}"
                                          for k, v in values.items()).strip("_")
    hostile(broken, expect)(build)


_config_case("hidden_size is 256.0 (a float)", "hidden_size = 256.0 is not an integer", hidden_size=256.0)
_config_case('hidden_size is "4k" (a string)', 'hidden_size = "4k" is not an integer', hidden_size="4k")
_config_case("hidden_size is -1", "hidden_size = -1 is out of range (expected 1..", hidden_size=-1)
_config_case("hidden_size is 1e30", "hidden_size = 1e+30 is not an integer", hidden_size=1e30)
_config_case('n_routed_experts is "8" (a string)', 'n_routed_experts = "8" is not an integer', n_routed_experts="8")
_config_case("num_experts_per_tok is true (a bool)", "num_experts_per_tok = true is not an integer",
             num_experts_per_tok=True)
_config_case("num_key_value_heads exceeds num_attention_heads", "num_key_value_heads = 64 is out of range",
             num_key_value_heads=64)
_config_case('layer_norm_epsilon is "1e-5" (a string)', 'layer_norm_epsilon = "1e-5" is not a number',
             layer_norm_epsilon="1e-5")
_config_case("routed_scaling_factor is -2.5", "routed_scaling_factor = -2.5 is out of range",
             routed_scaling_factor=-2.5)
_config_case('norm_topk_prob is "yes"', 'norm_topk_prob = "yes" is not true or false', norm_topk_prob="yes")
_config_case("max_position_embeddings is 2^40 (beyond GGUF's u32)", "max_position_embeddings = 1,099,511,627,776 is "
             "out of range", max_position_embeddings=2**40)
_config_case("num_nextn_predict_layers is [1]", "num_nextn_predict_layers = [1] is not an integer",
             num_nextn_predict_layers=[1])


# ----------------------------------------------------------------------- item 5: counts from the config


@hostile("n_routed_experts: 1e9 (OOM-killed at 24 GB before the fix)", "n_routed_experts = 1000000000.0 is not an "
         "integer")
def experts_1e9_float(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    return _convert_case(src, folder, _edit_config(folder, n_routed_experts=1e9))


@hostile("n_routed_experts: 1000000000", "n_routed_experts = 1,000,000,000 is out of range (expected 1..1,024): "
         "llama.cpp loads at most 1024 experts")
def experts_10_to_the_9(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    return _convert_case(src, folder, _edit_config(folder, n_routed_experts=10**9))


@hostile("n_routed_experts: 1000 while the head holds 4 experts", "n_routed_experts = 1,000, but the MTP head has "
         "tensors for 4 experts (none for experts 4, 5, 6, 7, 8, ...)")
def experts_more_than_the_checkpoint_holds(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    return _convert_case(src, folder, _edit_config(folder, n_routed_experts=1000))
