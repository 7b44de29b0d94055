"""Small text helpers shared by the reports, and the escaping of every name a file or a user supplies.

Names come from files (``general.name``, tensor names, decoded with ``surrogateescape`` so that any
byte survives) and from the file system (``os.fsdecode``). Before one reaches a terminal, a JSON report
or a model card it goes through one of the functions here:

- :func:`printable` for terminals and plain text: undecodable bytes become ``\\xNN``, control and
  bidirectional-override characters become ``\\xNN`` / ``\\uNNNN`` (a name can neither break a line
  nor repaint the terminal);
- :func:`json_safe` for ``--json``: every string valid Unicode, so the report is valid UTF-8 JSON;
- :func:`markdown_text` / :func:`markdown_code` for the model card: no Markdown or HTML of its own.

:data:`ESCAPE_ERRORS` is a codec error handler doing the same as :func:`printable` for the surrogates,
installed on stdout/stderr by the command line as the last line of defence.
"""

from __future__ import annotations

import codecs
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "ESCAPE_ERRORS",
    "Change",
    "change_line",
    "human_bytes",
    "json_safe",
    "markdown_code",
    "markdown_text",
    "printable",
    "short",
    "short_change",
]

#: Name of the codec error handler that writes an unencodable character as ``\xNN`` (a byte kept by
#: ``surrogateescape``) or ``\uNNNN`` (anything else).
ESCAPE_ERRORS = "gguf_mtp.escape"

# C0/C1 controls, DEL, lone surrogates, line/paragraph separators and the bidirectional controls
# (a right-to-left override can make a name read differently from what it is: "trojan source").
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_char(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: object) -> str:
    """``text`` (``str()`` of anything, a path's ``os.fspath``) safe to print on one terminal line.

    >>> printable("Bad\\udcffName\\nMTP: yes")
    'Bad\\\\xffName\\\\x0aMTP: yes'
    """
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    text = str(text)
    return _UNPRINTABLE.sub(lambda m: _escape_char(m.group()), text)


def _json_str(text: str) -> str:
    return _SURROGATE.sub(lambda m: _escape_char(m.group()), text)


def json_safe(data: Any) -> Any:
    """``data`` with every string (keys included) valid Unicode and every value JSON can hold.

    Paths become strings, non-finite floats become ``"inf"``/``"nan"`` strings (JSON has no such
    numbers), other objects their ``str()``; undecodable bytes in names become ``\\xNN`` text.
    """
    if data is None or isinstance(data, (bool, int)):
        return data
    if isinstance(data, float):
        return data if math.isfinite(data) else str(data)
    if isinstance(data, str):
        return _json_str(data)
    if isinstance(data, os.PathLike):
        return _json_str(os.fspath(data))
    if isinstance(data, Mapping):
        return {_json_str(str(k)) if not isinstance(k, str) else _json_str(k): json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in data]
    return _json_str(str(data))


# Every ASCII punctuation character can be backslash-escaped in CommonMark; < > & become entities so
# that no renderer (GitHub's, the Hub's) sees a tag.
_MARKDOWN_SPECIAL = re.compile(r"[\\`*_{}\[\]()#+\-.!|~$]")
_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def markdown_text(text: object) -> str:
    """``text`` as literal Markdown text: no heading, table cell, link, emphasis or HTML of its own.

    >>> markdown_text("# Fake | row <script>")
    '\\\\# Fake \\\\| row &lt;script&gt;'
    """
    safe = printable(text)
    safe = re.sub(r"[<>&]", lambda m: _HTML[m.group()], safe)
    return _MARKDOWN_SPECIAL.sub(lambda m: "\\" + m.group(), safe)


def markdown_code(text: object) -> str:
    """``text`` as an inline code span when that is safe (no backtick, no ``|``), else as :func:`markdown_text`.

    A code span shows its content literally (HTML included), but a backtick would end it and a ``|``
    still splits a table cell.
    """
    safe = printable(text)
    if "`" in safe or "|" in safe or not safe.strip():
        return markdown_text(text)
    return f"`{safe}`"


def _escape_errors(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start : error.end]
    return "".join(_escape_char(c) for c in bad), error.end


try:
    codecs.lookup_error(ESCAPE_ERRORS)
except LookupError:
    codecs.register_error(ESCAPE_ERRORS, _escape_errors)


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'`` (binary units, as tools that size GGUF files print them)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (long per-layer arrays in KV change lines)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: Items of a long array shown before the first difference in :func:`short_change`.
_CONTEXT_ITEMS = 2


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_change(old: Any, new: Any, limit: int = 60) -> str:
    """``old -> new`` with each side cut to ``limit`` characters, keeping the part where they differ.

    Two long per-layer arrays usually share a long head; cutting both to the same prefix would hide the
    change, so the shared head is replaced by ``…`` and a little context is kept before the first
    difference:

    >>> short_change([0] * 40 + [2], [0] * 40 + [2, 2])
    '… 0, 2] -> … 0, 2, 2]'
    """
    a, b = repr(old), repr(new)
    if len(a) <= limit and len(b) <= limit:
        return f"{a} -> {b}"
    same = 0
    for x, y in zip(a, b):
        if x != y:
            break
        same += 1
    if same < limit // 2:  # the difference is near the start: a plain cut shows it
        return f"{_cut(a, limit)} -> {_cut(b, limit)}"
    start = same
    for _ in range(_CONTEXT_ITEMS):  # back to the start of the item(s) before the difference
        found = a.rfind(", ", 0, start)
        if found < 0:
            break
        start = found
    start = start + 2 if a.startswith(", ", start) else max(0, same - 10)
    if start == 0:
        return f"{_cut(a, limit)} -> {_cut(b, limit)}"
    return f"{_cut('… ' + a[start:], limit)} -> {_cut('… ' + b[start:], limit)}"


class Change(Protocol):
    """A metadata change as the plans hold it (:class:`gguf_mtp.format.kv_edit.KVChange`)."""

    @property
    def key(self) -> str: ...
    @property
    def type_name(self) -> str: ...
    @property
    def old(self) -> Any: ...
    @property
    def new(self) -> Any: ...  # None: the key is removed


def change_line(change: Change) -> str:
    """The one rendering of a metadata change in a plan: ``KEY (TYPE): OLD -> NEW`` (:func:`short_change`, so
    that two long arrays show where they differ), ``NEW`` being ``(removed)`` for a removed key.

    >>> from types import SimpleNamespace as C
    >>> change_line(C(key="a.block_count", type_name="u32", old=4, new=None))
    'a.block_count (u32): 4 -> (removed)'
    """
    if change.new is None:
        return f"{change.key} ({change.type_name}): {short(change.old)} -> (removed)"
    return f"{change.key} ({change.type_name}): {short_change(change.old, change.new)}"
