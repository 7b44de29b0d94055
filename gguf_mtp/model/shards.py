"""Find and check a GGUF model on disk: a single file or a llama.cpp split set.

A split set is ``<prefix>-00001-of-0000N.gguf`` .. ``<prefix>-0000N-of-0000N.gguf``. Siblings are
found by that exact pattern (never by globbing the prefix, which also catches earlier composites and
mmproj files), and checked the way llama.cpp's loader checks them: ``split.no`` of every shard,
one ``split.count``, one ``split.tensors.count`` equal to the number of tensors found, no tensor
name twice.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from gguf_mtp.constants import (
    BLOCK_TENSOR,
    KEY_ARCHITECTURE,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
    KEY_TOKENS,
    KEY_VOCAB_SIZE,
    SPLIT_NAME,
    split_file_name,
)
from gguf_mtp.errors import BadGGUFError, GGUFNotFoundError, ShardSetError
from gguf_mtp.format.header import TYPE_BY_NAME, GGUFHeader, KeyValue, TensorInfo, read_header

from .blocks import block_index, read_block_layout

__all__ = [
    "SPLIT_KEYS",
    "ShardSet",
    "declared_tensor_count",
    "find_shard_paths",
    "is_single_file_count",
    "open_model",
    "split_rules",
]


def find_shard_paths(path: str | os.PathLike[str]) -> tuple[list[Path], str | None]:
    """The files of the model that ``path`` belongs to, and the split prefix (``None`` for one file).

    Raises:
        ShardSetError: a sibling named by the pattern is missing.
        GGUFNotFoundError: ``path`` itself does not exist (a BadGGUFError and a FileNotFoundError).
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise GGUFNotFoundError("no such file", path) from None
    except OSError as e:  # a name too long, a symlink loop, a folder we may not enter
        raise BadGGUFError(f"cannot open: {e.strerror or e}", path) from None
    if stat.S_ISDIR(mode):
        raise BadGGUFError("is a directory, not a GGUF file", path)
    match = SPLIT_NAME.match(path.name)
    if not match:
        return [path], None
    prefix, count = match["prefix"], int(match["count"])
    number = int(match["no"])
    if count < 1 or not 1 <= number <= count:
        raise ShardSetError(f"shard number {number} is not within 1..{count}", path)
    paths = [path.with_name(split_file_name(prefix, i, count)) for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ShardSetError(f"incomplete split set: missing {', '.join(missing)} (of {count} shards)", path.parent)
    return paths, prefix


@dataclass(frozen=True)
class ShardSet:
    """The headers of a model's files, in shard order, checked for consistency."""

    headers: tuple[GGUFHeader, ...]
    prefix: str | None

    @property
    def paths(self) -> list[Path]:
        return [Path(h.path) for h in self.headers]

    @property
    def is_split(self) -> bool:
        return self.prefix is not None

    @property
    def first(self) -> GGUFHeader:
        """Shard 1: where a split model keeps its model KVs."""
        return self.headers[0]

    @property
    def name(self) -> str:
        """The first file's path, for messages."""
        return self.first.path

    @property
    def arch(self) -> str:
        arch = self.first.get(KEY_ARCHITECTURE)
        if not isinstance(arch, str) or not arch:
            raise BadGGUFError(f"no {KEY_ARCHITECTURE} key", self.first.path)
        return arch

    def arch_key(self, template: str) -> str:
        """A gguf-py key template (``"{arch}.block_count"``) for this model's architecture."""
        return template.format(arch=self.arch)

    def kv(self, key: str) -> KeyValue | None:
        """A model KV (they live in shard 1)."""
        return self.first.kvs.get(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.first.get(key, default)

    @property
    def block_count(self) -> int:
        """``{arch}.block_count``: trunk blocks plus NextN blocks."""
        # The one bounded reading of the block layout (blocks.MAX_BLOCK_COUNT), shared by every command.
        return read_block_layout(self.first).block_count

    @property
    def nextn_predict_layers(self) -> int:
        return read_block_layout(self.first).nextn

    @property
    def trunk_block_count(self) -> int:
        """Blocks that are not NextN blocks: ``block_count - nextn_predict_layers``."""
        return self.block_count - self.nextn_predict_layers

    def iter_tensors(self) -> Iterator[tuple[int, TensorInfo]]:
        """(shard index, tensor) for every tensor, in file order."""
        for index, header in enumerate(self.headers):
            for tensor in header.tensors:
                yield index, tensor

    @cached_property
    def tensor_locations(self) -> dict[str, tuple[int, TensorInfo]]:
        return {t.name: (i, t) for i, t in self.iter_tensors()}

    @property
    def tensor_count(self) -> int:
        return sum(len(h.tensors) for h in self.headers)

    @property
    def total_size(self) -> int:
        return sum(h.file_size for h in self.headers)

    def block_indices(self) -> set[int]:
        """Block numbers that have at least one tensor."""
        blocks = set()
        for _, tensor in self.iter_tensors():
            match = BLOCK_TENSOR.match(tensor.name)
            if match:
                blocks.add(int(match["block"]))
        return blocks

    def head_tensors(self) -> Iterator[tuple[int, TensorInfo]]:
        """(shard index, tensor) for every tensor of the NextN (MTP) blocks, in file order: ``blk.N.*`` with N from
        :attr:`trunk_block_count` to ``block_count - 1``. A name whose number is past the declared blocks (or has
        more digits than any block: :func:`~gguf_mtp.model.blocks.block_index`) is no tensor of the head."""
        head = range(self.trunk_block_count, self.block_count)
        for index, tensor in self.iter_tensors():
            if block_index(tensor.name) in head:
                yield index, tensor


#: The ``split.*`` keys llama.cpp's loader reads (gguf-split writes u16, u16, i32).
SPLIT_KEYS = (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT)
_INTEGER_TYPES = frozenset(TYPE_BY_NAME[t] for t in ("u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64"))


def is_single_file_count(value: object) -> bool:
    """Whether a ``split.count`` value means one file: llama.cpp loads ``n_split <= 1`` as a single file,
    and ``llama-gguf-split --merge`` writes ``split.count = 0`` into the merged file."""
    return value in (0, 1) and not isinstance(value, bool)


def split_rules(header: GGUFHeader, position: int, count: int | None) -> list[str]:
    """Problems of one file's ``split.*`` keys, checked as llama.cpp's loader checks them.

    The one rule set for both :func:`open_model` (which refuses at the first problem) and
    :mod:`gguf_mtp.model.shard_scan` (which lists them all).

    Args:
        header: the file's header.
        position: its 0-based place in the set (0 for a single file).
        count: the number of files the names promise, ``None`` for a file not named as a shard.
    """
    present = {key: header.kvs[key] for key in SPLIT_KEYS if key in header.kvs}
    # the type first (an array or a string must never be compared, printed or added to)
    wrong = [
        f"{key} must be an integer, not {kv.type_name}" for key, kv in present.items() if kv.vtype not in _INTEGER_TYPES
    ]
    if wrong:
        return wrong
    n = present[KEY_SPLIT_COUNT].value if KEY_SPLIT_COUNT in present else None
    if count is None:
        if n is not None and not is_single_file_count(n):
            return [
                f"{KEY_SPLIT_COUNT} = {n}, but the name does not follow <prefix>-NNNNN-of-NNNNN.gguf, "
                "so its siblings cannot be found"
            ]
        return []
    missing = [key for key in SPLIT_KEYS if key not in present]
    if missing:
        if count == 1:  # a set of one named like a shard: the keys are optional, as for any single file
            return []
        what = "split.* keys" if len(missing) == len(SPLIT_KEYS) else ", ".join(missing)
        return [f"shard {position + 1} of {count} has no {what}"]
    problems = []
    if n != count and not (count == 1 and is_single_file_count(n)):
        problems.append(f"{KEY_SPLIT_COUNT} = {n}, but the file name says {count} shards")
    no = present[KEY_SPLIT_NO].value
    if no != position:
        problems.append(f"{KEY_SPLIT_NO} = {no}, expected {position} (shard {position + 1} of {count})")
    return problems


def declared_tensor_count(header: GGUFHeader) -> int | None:
    """``split.tensors.count`` when it is present and an integer, else ``None``."""
    kv = header.kvs.get(KEY_SPLIT_TENSORS_COUNT)
    return kv.value if kv is not None and kv.vtype in _INTEGER_TYPES else None


def _check_split_keys(headers: list[GGUFHeader], prefix: str | None) -> None:
    count = None if prefix is None else len(headers)
    for position, header in enumerate(headers):
        problems = split_rules(header, position, count)
        if problems:
            raise ShardSetError(problems[0], header.path)
    if prefix is None:
        return
    totals = {t for t in (declared_tensor_count(h) for h in headers) if t is not None}
    if len(totals) > 1:
        raise ShardSetError(f"shards disagree on split.tensors.count ({sorted(totals)})", headers[0].path)
    found = sum(len(h.tensors) for h in headers)
    if totals and found != next(iter(totals)):
        raise ShardSetError(
            f"split.tensors.count = {next(iter(totals))}, but the {len(headers)} shards of {prefix!r} hold "
            f"{found} tensors",
            headers[0].path,
        )


def open_model(path: str | os.PathLike[str]) -> ShardSet:
    """Read and check the headers of a model: one GGUF file or any shard of a split set.

    Raises:
        BadGGUFError: a file is malformed.
        ShardSetError: the split set is incomplete or inconsistent.
    """
    paths, prefix = find_shard_paths(path)
    headers = [read_header(p) for p in paths]
    _check_split_keys(headers, prefix)
    arch = headers[0].get(KEY_ARCHITECTURE)
    for header in headers[1:]:
        other = header.get(KEY_ARCHITECTURE)
        if other is not None and other != arch:
            raise ShardSetError(
                f"shard is from another model ({KEY_ARCHITECTURE} {other!r}, not {arch!r})", header.path
            )
    seen: dict[str, str] = {}
    for header in headers:
        for tensor in header.tensors:
            if tensor.name in seen:
                raise ShardSetError(f"tensor {tensor.name!r} is also in {seen[tensor.name]}", header.path)
            seen[tensor.name] = header.path
    return ShardSet(tuple(headers), prefix)


def vocab_size(model: ShardSet | GGUFHeader) -> int | None:
    """The vocabulary size a model states (``{arch}.vocab_size`` or its token list), if any."""
    header = model.first if isinstance(model, ShardSet) else model
    arch = header.get(KEY_ARCHITECTURE)
    value = header.get(KEY_VOCAB_SIZE.format(arch=arch))
    if isinstance(value, int):
        return value
    tokens = header.kvs.get(KEY_TOKENS)
    return tokens.array_length if tokens is not None else None
