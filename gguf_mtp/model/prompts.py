"""The prompts a measure of the head sends (``bench``, ``accept``, ``verify --acceptance``): the built-in ones
(``gguf_mtp/data/bench_prompts.json``: code, prose and a chat) or the user's file, checked once, here.
"""

from __future__ import annotations

import importlib.resources
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gguf_mtp.errors import ParameterError
from gguf_mtp.files.json_io import load_json_file
from gguf_mtp.files.regular_file import NotARegularFileError, open_regular

__all__ = ["MAX_PROMPTS", "MAX_PROMPTS_BYTES", "Prompt", "builtin_prompts", "check_prompts", "load_prompts"]

#: The most prompts a run sends.
MAX_PROMPTS = 64
#: The largest ``--prompts`` file read.
MAX_PROMPTS_BYTES = 4 * 1024 * 1024
#: A line holding only this separates two prompts of a text file.
_SEPARATOR = "---"


@dataclass(frozen=True)
class Prompt:
    """One prompt bench sends, and the name its report gives it (``prompt 2``, or the name in a JSON file)."""

    name: str
    text: str


def builtin_prompts() -> tuple[Prompt, ...]:
    """The prompts shipped with gguf-mtp: code, prose and a chat, a few hundred tokens each."""
    text = importlib.resources.files("gguf_mtp").joinpath("data/bench_prompts.json").read_text("utf-8")
    return _prompts_from_json(json.loads(text), "built-in prompts")


def _json_prompt(i: int, item: Any, where: str) -> Prompt:
    """Item ``i`` of a JSON prompts file: a string, or ``{"name", "text"}``."""
    if isinstance(item, dict):
        name, text = item.get("name", f"prompt {i + 1}"), item.get("text")
    else:
        name, text = f"prompt {i + 1}", item
    if not isinstance(text, str) or not text.strip() or not isinstance(name, str):
        raise ParameterError(f"prompts: prompt {i + 1} is not a non-empty string", where, "prompts")
    return Prompt(name, text)


def _prompts_from_json(document: Any, where: str) -> tuple[Prompt, ...]:
    items = document.get("prompts") if isinstance(document, dict) else document
    if not isinstance(items, list):
        raise ParameterError("prompts: a JSON prompts file is a list of strings (or {\"prompts\": [...]})", where,
                             "prompts")
    return check_prompts([_json_prompt(i, item, where) for i, item in enumerate(items)], where)


def check_prompts(prompts: Sequence[Prompt], where: str) -> tuple[Prompt, ...]:
    """``prompts``, if llama.cpp can be given them: one at least, at most :data:`MAX_PROMPTS`, each UTF-8 text
    (a JSON string may hold a lone surrogate, which no UTF-8 encoder takes).

    Raises:
        ParameterError: one line naming ``where`` (the file) and, for a bad text, the prompt and the character.
    """
    if not prompts:
        raise ParameterError("prompts: no prompt in the file", where, "prompts")
    if len(prompts) > MAX_PROMPTS:
        raise ParameterError(f"prompts: {len(prompts)} prompts, more than the {MAX_PROMPTS} bench sends", where,
                             "prompts")
    for prompt in prompts:
        try:
            prompt.text.encode("utf-8")  # as the server's client and accept's child encode it
        except UnicodeEncodeError as e:
            raise ParameterError(f"prompts: {prompt.name}: character {e.start + 1} (U+{ord(prompt.text[e.start]):04X}) "
                                 f"cannot be encoded as UTF-8 ({e.reason})", where, "prompts") from None
    return tuple(prompts)


def _read_text_file(path: str | os.PathLike[str], where: str) -> str:
    """A prompts text file's UTF-8 text, at most :data:`MAX_PROMPTS_BYTES` of it.

    Raises:
        ParameterError: missing, not a regular file, unreadable, too large or not UTF-8 (one line naming it).
    """
    try:
        fd, info = open_regular(path)
    except FileNotFoundError:
        raise ParameterError("prompts: no such file", where, "prompts") from None
    except (IsADirectoryError, NotARegularFileError):
        raise ParameterError("prompts: not a regular file", where, "prompts") from None
    except OSError as e:
        raise ParameterError(f"prompts: cannot open: {e.strerror}", where, "prompts") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_PROMPTS_BYTES + 1)
    if len(data) > MAX_PROMPTS_BYTES or info.st_size > MAX_PROMPTS_BYTES:
        raise ParameterError(f"prompts: larger than the {MAX_PROMPTS_BYTES:,} bytes bench reads", where, "prompts")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParameterError("prompts: not UTF-8 text", where, "prompts") from None


def _split_prompts(text: str) -> list[str]:
    """The prompts of a text file: the parts between lines holding only :data:`_SEPARATOR`, blank parts left out."""
    chunks: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.strip() == _SEPARATOR:
            chunks.append("".join(current))
            current = []
        else:
            current.append(line)
    chunks.append("".join(current))
    return [c.strip("\n") for c in chunks if c.strip()]


def load_prompts(path: str | os.PathLike[str]) -> tuple[Prompt, ...]:
    """Prompts from a file: ``.json`` (a list of strings, or ``{"prompts": [{"name", "text"}...]}``), else
    UTF-8 text with prompts separated by lines holding only ``---``.

    Raises:
        ParameterError: missing, unreadable, too large, or no prompt in it (one line naming the file).
    """
    where = os.fspath(path)
    if where.lower().endswith(".json"):
        return _prompts_from_json(load_json_file(path, max_bytes=MAX_PROMPTS_BYTES, error=ParameterError), where)
    parts = _split_prompts(_read_text_file(path, where))
    return check_prompts([Prompt(f"prompt {i + 1}", t) for i, t in enumerate(parts)], where)
