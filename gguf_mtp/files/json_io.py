"""Bounded reading of the JSON files users hand us: ``config.json``, ``model.safetensors.index.json``,
safetensors headers, and of gguf-mtp's own small JSON files (the commit journal, the work-folder marker,
the pipeline's state file), which :func:`write_json_file` writes, all alike: atomically and durably.

Python's :func:`json.loads` trusts its input: it recurses once per nesting level (arrays nested
100,000 deep raise ``RecursionError``), accepts ``NaN``/``Infinity`` and turns ``1e400`` into ``inf``
(which later crashes ``int()`` with ``OverflowError``), and reads whatever size it is given. Here a
document is refused with one line naming the file (and the key, for a bad number) when it is larger
than a cap, nested deeper than a cap (measured by a flat scan before the parser recurses), or holds
a non-finite or absurdly large number. Files are opened without blocking and refused unless they are
regular files, so a named pipe given as ``config.json`` cannot hang a command.

gguf-mtp's own files are read back the same way (bounded, and never through a link): anything else
under their names was not written by gguf-mtp.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gguf_mtp.errors import GGUFMTPError

from .create import write_then_rename
from .regular_file import NotARegularFileError, open_regular

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT",
    "encode_json",
    "load_json_file",
    "nesting_depth",
    "parse_json",
    "write_json_file",
]

#: Deepest nesting accepted. Real files nest 3 (safetensors header) to about 6 (a config's
#: ``quantization_config``) levels; the cap keeps the parser's recursion far from Python's limit.
MAX_JSON_DEPTH = 64

#: Integers beyond 64 bits are never a count, shape, offset or id in these files.
MAX_JSON_INT = 2**64 - 1

#: Integer literals longer than this are refused before Python converts them (conversion is quadratic).
_MAX_INT_DIGITS = 40

#: A complete JSON string literal (the unrolled form: no backtracking over escapes).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SCAN_CHUNK = 1 << 20


def nesting_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text, found without recursion (brackets inside strings
    are not counted); stops early and returns a value above ``limit`` once the limit is passed."""
    import numpy as np  # here, not at the top: writing gguf-mtp's own small files (a copy's journal) needs no numpy

    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for start in range(0, len(brackets), _SCAN_CHUNK):
        chunk = np.frombuffer(brackets, np.uint8, min(_SCAN_CHUNK, len(brackets) - start), start)
        steps = np.where((chunk == ord("[")) | (chunk == ord("{")), 1, -1).astype(np.int64)
        running = np.cumsum(steps) + depth
        deepest = max(deepest, int(running.max()))
        if deepest > limit:
            return deepest
        depth = int(running[-1])
    return deepest


class _BadNumber:
    """A number the parser met that no file of ours can mean: kept in place so its key can be named."""

    def __init__(self, text: str) -> None:
        self.text = text


def _parse_float(text: str) -> float | _BadNumber:
    value = float(text)
    return value if math.isfinite(value) else _BadNumber(text)


def _parse_int(text: str) -> int | _BadNumber:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        return _BadNumber(text[:24] + "...")
    value = int(text)
    return value if abs(value) <= MAX_JSON_INT else _BadNumber(text)


def _key_path(where: str, key: str) -> str:
    """``where.key``, or ``where['key.with.dots']`` when the key is not a plain word (tensor names)."""
    if re.fullmatch(r"\w+", key):
        return f"{where}.{key}" if where else key
    return f"{where}[{key!r}]"


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(key path, value) of every leaf; iterative, though the depth is already bounded."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((_key_path(where, k), v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(item))))
        else:
            yield where, item


def parse_json(
    data: bytes,
    path: str | os.PathLike[str],
    *,
    error: type[GGUFMTPError] = GGUFMTPError,
    what: str | None = None,
    max_depth: int = MAX_JSON_DEPTH,
    unique_keys: bool = False,
) -> Any:
    """Parse a JSON document strictly: UTF-8, nested at most ``max_depth`` deep, finite numbers only
    (no ``NaN``/``Infinity``, nothing that overflows a float, no integer beyond 64 bits).

    Args:
        data: the document's bytes (a UTF-8 byte order mark is allowed).
        path: the file, for the message.
        error: the error class to raise.
        what: starts every message (``"corrupt safetensors header"``), when given.
        unique_keys: refuse an object that holds a key twice (JSON would keep the last silently).

    Raises:
        error: one line naming ``path`` and, for a bad number, its key path (``shape[1] of 'x.weight'``).
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    prefix = f"{what}: " if what else ""
    depth = nesting_depth(data, max_depth)
    if depth > max_depth:
        raise error(f"{prefix}JSON nested more than {max_depth} levels deep (real files nest a few)", path)
    found_bad = False

    def bad_constant(text: str) -> _BadNumber:
        nonlocal found_bad
        found_bad = True
        return _BadNumber(text)

    def bad_aware(parse: Any) -> Any:
        def hook(text: str) -> Any:
            nonlocal found_bad
            value = parse(text)
            found_bad = found_bad or isinstance(value, _BadNumber)
            return value

        return hook

    def distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise error(f"{prefix}key {repr(key)[:60]} appears twice in one object", path)
            found[key] = value
        return found

    try:
        text = data.decode("utf-8")
        document = json.loads(text, parse_constant=bad_constant, parse_float=bad_aware(_parse_float),
                              parse_int=bad_aware(_parse_int), object_pairs_hook=distinct_keys if unique_keys else None)
    except UnicodeDecodeError as e:
        raise error(f"{prefix}not UTF-8 text (byte {e.start})", path) from None
    except json.JSONDecodeError as e:
        raise error(f"{prefix}not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", path) from None
    except RecursionError:  # not reachable below the depth cap; kept so no traceback can escape
        raise error(f"{prefix}JSON nested too deep", path) from None
    if found_bad:
        key, number = next((k, v) for k, v in _walk(document) if isinstance(v, _BadNumber))
        raise error(
            f"{prefix}{key or 'the document'} = {number.text} is not a finite number gguf-mtp accepts "
            "(NaN, Infinity, a float overflow or an integer beyond 64 bits)",
            path,
        )
    return document


def load_json_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    error: type[GGUFMTPError] = GGUFMTPError,
    what: str | None = None,
    max_depth: int = MAX_JSON_DEPTH,
    unique_keys: bool = False,
    follow_links: bool = True,
) -> Any:
    """Read and :func:`parse_json` a JSON file of at most ``max_bytes`` bytes (a regular file only).

    Args:
        follow_links: ``False`` refuses a symbolic link at ``path`` (gguf-mtp's own files are never links).

    Raises:
        error: missing, a directory, a pipe or device, a link (without ``follow_links``), unreadable, too
            large, or not acceptable JSON; one line naming ``path``. (A missing file raises ``error`` too;
            callers that have a better message for it check first.)
    """
    try:
        fd, info = open_regular(path, follow_links=follow_links)
    except FileNotFoundError:
        raise error("no such file", path) from None
    except IsADirectoryError:
        raise error("is a directory, not a file", path) from None
    except NotARegularFileError:
        raise error("is not a regular file (a pipe, socket or device)", path) from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise error("is a symbolic link, not a file gguf-mtp wrote", path) from None
        raise error(f"cannot open: {e.strerror}", path) from None
    try:
        if info.st_size > max_bytes:
            raise error(f"{info.st_size:,} bytes, more than the {max_bytes:,} gguf-mtp reads for this file", path)
        chunks = []
        remaining = max_bytes + 1  # one byte more than allowed tells a file that grew while read
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as e:
        raise error(f"cannot read: {e.strerror}", path) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise error(f"more than the {max_bytes:,} bytes gguf-mtp reads for this file (it grew while read)", path)
    return parse_json(data, path, error=error, what=what, max_depth=max_depth, unique_keys=unique_keys)


def encode_json(document: Any) -> bytes:
    """The bytes of one of gguf-mtp's own JSON files: indented, keys sorted, finite numbers only, a final newline."""
    return (json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def write_json_file(path: Path, document: Any, *, rename: Callable[[Path, Path], object] = os.replace) -> None:
    """Write one of gguf-mtp's own small JSON files (the commit journal, the work-folder marker, the pipeline's
    state): :func:`encode_json` into a temporary file created exclusively beside ``path`` (never through a
    planted link), fsynced, renamed to ``path``, the folder fsynced
    (:func:`~gguf_mtp.files.create.write_then_rename`): ``path`` then holds the whole document, on disk, or
    is untouched. Read it back with :func:`load_json_file` (``follow_links=False``).

    Args:
        rename: ``os.replace`` (the default) replaces the old file, for the files of a folder gguf-mtp owns;
            a no-replace rename (the journal: :func:`gguf_mtp.files.commit.rename_noreplace`) refuses an
            existing name instead.

    Raises:
        UnsafeOutputError: the temporary name is taken (see :func:`~gguf_mtp.files.create.create_exclusive`).
        OSError: writing or renaming failed (the temporary file is removed).
    """
    write_then_rename(path, encode_json(document), rename)
