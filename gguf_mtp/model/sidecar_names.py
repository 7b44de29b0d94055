"""Sidecar file names: how llama.cpp's ``-hf`` pairs an ``mtp-`` sidecar with a trunk, and how its converter names one.

Pure: names in, names out (no I/O). ``llama-server -hf REPO[:TAG] --spec-type draft-mtp`` finds the sidecar by
file name alone: among the ``.gguf`` files whose path holds ``mtp-``, in the trunk's folder or an ancestor, the
deepest folder wins, then a name holding ``-TAG.``, then the "quantization bits" (the first number of the name's
last ``-``/``.`` word: Q4_K_M -> 4, BF16 -> 16) closest to the trunk's (or the tag's); a tie keeps the file listed
first. The rules are read from llama.cpp build :data:`LLAMA_CPP_BUILD`; :data:`SOURCES` cites each one, and
``tests/test_citations.py`` checks the cited lines in that build's sources.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LLAMA_CPP_BUILD",
    "SIDECAR_KEYWORD",
    "SOURCES",
    "SplitInfo",
    "find_best_sibling",
    "is_model_file",
    "quant_bits",
    "sidecar_file_name",
    "split_info",
]

#: The llama.cpp build whose sources these rules were read from.
LLAMA_CPP_BUILD = "b11434"

#: What a sidecar's path must hold for ``-hf --spec-type draft-mtp`` to consider it (``find_best_mtp``).
SIDECAR_KEYWORD = "mtp-"

#: Words that make a ``.gguf`` file name something other than a model (``gguf_filename_is_model``).
NOT_MODEL_WORDS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")

#: Where each rule comes from, in llama.cpp :data:`LLAMA_CPP_BUILD` (path:lines, then what the lines hold).
SOURCES: dict[str, str] = {
    "split_info": "common/download.cpp:464-499 (get_gguf_split_info: re_split, re_tag, string_remove_suffix, "
                  '"-of-", toupper)',
    "quant_bits": "common/download.cpp:501-511 (extract_quant_bits: find_first_of, stoi)",
    "find_best_sibling": "common/download.cpp:531-595 (find_best_sibling: model_bits, best_depth, best_exact, "
                         "best_diff, string_ends_with, mismatch)",
    "keyword": 'common/download.cpp:602-606 (find_best_mtp: "mtp-")',
    "is_model_file": 'common/download.cpp:626-642 (gguf_filename_is_model: "mmproj", "imatrix", "eagle3-", '
                     '"dflash-", "dspark-")',
    "sidecar_file_name": "conversion/glm.py:185-196 (prepare_metadata: mtp_only, naming_convention, size_label, "
                         "output_type, fname_default)",
}

#: ``^(.+)-([0-9]{5})-of-([0-9]{5})$``, case-insensitive, on the path without ``.gguf``. ASCII only: Python's
#: IGNORECASE would otherwise let the Kelvin sign match ``k`` where std::regex does not.
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE | re.ASCII | re.DOTALL)
#: ``[-.]([A-Z0-9_]+)$``, case-insensitive: the last ``-``/``.`` word of the prefix.
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE | re.ASCII)
_LEADING_DIGITS = re.compile(r"[0-9]+", re.ASCII)
#: std::stoi's range (a 32-bit int): a longer number makes llama.cpp throw out_of_range.
_INT_MAX = 2**31 - 1


def _ascii_upper(text: str) -> str:
    """``std::toupper`` byte by byte in the C locale: ASCII letters only (``str.upper`` turns ``ß`` into ``SS``)."""
    return text.translate(_UPPER)


_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True)
class SplitInfo:
    """A ``.gguf`` path as llama.cpp reads it: ``prefix`` (the path without ``.gguf`` and without a
    ``-NNNNN-of-NNNNN`` suffix), its quant ``tag`` (upper case, ``""`` if none), the shard ``index`` and ``count``."""

    prefix: str
    tag: str
    index: int
    count: int


def split_info(path: str) -> SplitInfo:
    """``get_gguf_split_info``: a path not ending in ``.gguf`` (case-sensitive) has no prefix and no tag."""
    if not path.endswith(".gguf"):
        return SplitInfo("", "", 0, 0)
    prefix, index, count = path[: -len(".gguf")], 1, 1
    split = _SPLIT.match(prefix)
    if split:
        prefix, index, count = split[1], int(split[2]), int(split[3])
    tag = _TAG.search(prefix)
    return SplitInfo(prefix, _ascii_upper(tag[1]) if tag else "", index, count)


def _leading_number(text: str, where: str) -> int:
    """``std::stoi`` of ``text`` from its first digit (0 without one).

    Raises:
        ValueError: the number is out of a 32-bit int's range (llama.cpp throws ``std::out_of_range`` there).
    """
    digits = _LEADING_DIGITS.search(text)
    if digits is None:
        return 0
    value = int(digits[0])
    if value > _INT_MAX:
        raise ValueError(f"{where}: {digits[0]} is beyond a 32-bit int: llama.cpp's std::stoi throws on it")
    return value


def quant_bits(path: str) -> int:
    """``extract_quant_bits``: the first number of the name's tag (``Q4_K_M`` -> 4, ``BF16`` -> 16, ``IQ2_XXS`` -> 2,
    ``MXFP4_MOE`` -> 4), 0 when the tag has none.

    Raises:
        ValueError: the number is beyond a 32-bit int (llama.cpp throws there).
    """
    return _leading_number(split_info(path).tag, path)


def is_model_file(path: str) -> bool:
    """``gguf_filename_is_model``: a ``.gguf`` whose file name (not folder) holds none of :data:`NOT_MODEL_WORDS`."""
    name = path.rpartition("/")[2]
    return path.endswith(".gguf") and not any(word in name for word in NOT_MODEL_WORDS)


def find_best_sibling(files: Sequence[str], model: str, keyword: str = SIDECAR_KEYWORD, tag: str = "") -> str | None:
    """``find_best_sibling``: the file of ``files`` (repo paths, ``/``-separated, in listing order) that
    llama.cpp pairs with ``model`` for ``keyword``, or ``None``.

    Args:
        files: every file of the repo, as the Hub lists them (the order breaks ties).
        model: the trunk's path (its first shard).
        keyword: what a candidate's path must hold (``mtp-`` for MTP sidecars).
        tag: the ``:TAG`` of ``-hf REPO:TAG`` (``""``: none; the bits then come from ``model``'s name).

    Raises:
        ValueError: a name's number is beyond a 32-bit int (llama.cpp throws there).
    """
    tag_upper = _ascii_upper(tag)
    model_bits = _leading_number(tag_upper, tag) if tag_upper else quant_bits(model)
    model_dir = model.split("/")[:-1]
    best: str | None = None
    best_key = (0, False, 0)  # (depth, exact, -diff): larger is better
    for path in files:
        if not path.endswith(".gguf") or keyword not in path:
            continue
        sibling_dir = path.split("/")[:-1]
        # the candidate's folder must be the model's or an ancestor of it
        if model_dir[: len(sibling_dir)] != sibling_dir:
            continue
        exact = bool(tag_upper) and f"-{tag_upper}." in _ascii_upper(path)
        key = (len(sibling_dir), exact, -abs(quant_bits(path) - model_bits))
        if best is None or key > best_key:  # strictly better only: a tie keeps the file listed first
            best, best_key = path, key
    return best


def sidecar_file_name(
    *, name: str | None, basename: str | None, finetune: str | None, version: str | None, type_label: str
) -> str:
    """``mtp-<Name>-<TYPE>.gguf`` as llama.cpp's converter names an MTP-only file (``--mtp`` into a folder): gguf-py's
    ``naming_convention`` of ``general.basename`` (else ``general.name``), ``general.finetune`` and
    ``general.version``, without the size label, with ``type_label`` (``BF16``, ``Q8_0``, ``Q4_K_M``: the file type's
    name after its ``MOSTLY_``) as the encoding."""
    from gguf.utility import naming_convention

    stem = naming_convention(name, basename, finetune, version, size_label=None, output_type=type_label,
                             model_type=None)
    return f"{SIDECAR_KEYWORD}{stem}.gguf"
