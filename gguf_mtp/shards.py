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

from .constants import (
    BLOCK_TENSOR,
    KEY_ARCHITECTURE,
    KEY_BLOCK_COUNT,
    KEY_NEXTN_PREDICT_LAYERS,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
    SPLIT_NAME,
    split_file_name,
)
from .errors import BadGGUFError, ShardSetError
from .gguf_header import GGUFHeader, KeyValue, TensorInfo, read_header

__all__ = ["ShardSet", "find_shard_paths", "open_model"]


def find_shard_paths(path: str | os.PathLike[str]) -> tuple[list[Path], str | None]:
    """The files of the model that ``path`` belongs to, and the split prefix (``None`` for one file).

    Raises:
        ShardSetError: a sibling named by the pattern is missing.
        BadGGUFError: ``path`` itself does not exist.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise BadGGUFError("no such file", path) from None
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
        key = self.arch_key(KEY_BLOCK_COUNT)
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadGGUFError(f"{key} is missing or not a non-negative integer ({value!r})", self.name)
        return value

    @property
    def nextn_predict_layers(self) -> int:
        key = self.arch_key(KEY_NEXTN_PREDICT_LAYERS)
        value = self.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= self.block_count:
            raise BadGGUFError(f"{key} = {value!r} is not within 0..block_count", self.name)
        return value

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


def _check_split_keys(headers: list[GGUFHeader], prefix: str) -> None:
    count = len(headers)
    totals = set()
    for number, header in enumerate(headers):
        no, n, total = (header.get(k) for k in (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT))
        if no is None or n is None or total is None:
            if count == 1:
                continue
            raise ShardSetError(f"shard {number + 1} of {count} has no split.* keys", header.path)
        for key, value in ((KEY_SPLIT_NO, no), (KEY_SPLIT_COUNT, n), (KEY_SPLIT_TENSORS_COUNT, total)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ShardSetError(f"{key} must be an integer, not {value!r}", header.path)
        if n != count:
            raise ShardSetError(f"split.count = {n}, but the file name says {count} shards", header.path)
        if no != number:
            raise ShardSetError(f"split.no = {no}, expected {number} (shard {number + 1} of {count})", header.path)
        totals.add(total)
    if len(totals) > 1:
        raise ShardSetError(f"shards disagree on split.tensors.count ({sorted(totals)})", headers[0].path)
    found = sum(len(h.tensors) for h in headers)
    if totals and found != next(iter(totals)):
        raise ShardSetError(
            f"split.tensors.count = {next(iter(totals))}, but the {count} shards of {prefix!r} hold {found} tensors",
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
    if prefix is not None:
        _check_split_keys(headers, prefix)
    elif headers[0].get(KEY_SPLIT_COUNT, 1) != 1:
        raise ShardSetError(
            f"split.count = {headers[0].get(KEY_SPLIT_COUNT)}, but the name does not follow "
            "<prefix>-NNNNN-of-NNNNN.gguf, so its siblings cannot be found",
            headers[0].path,
        )
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
