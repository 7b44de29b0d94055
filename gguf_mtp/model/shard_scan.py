"""Read every file of a model, local or on the Hub, and say what is wrong with the set instead of stopping.

:func:`gguf_mtp.model.shards.open_model` is for tools that write: it refuses a model at its first
inconsistency. ``inspect`` and ``verify`` must instead describe a broken model: which shard is
missing, which shard's ``split.tensors.count`` is stale, which tensor runs past the end of a truncated
file. :func:`scan_model` reads each file on its own and keeps what it could read; the ``*_problems``
functions compare the files the way llama.cpp's loader does and return one message per problem.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gguf_mtp.constants import (
    KEY_ARCHITECTURE,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_TENSORS_COUNT,
    SPLIT_NAME,
    max_header_bytes,
    split_file_name,
)
from gguf_mtp.errors import BadGGUFError, ShardSetError
from gguf_mtp.files.regular_file import NotARegularFileError, open_regular
from gguf_mtp.format.header import GGUFHeader, parse_header
from gguf_mtp.hub.remote import (
    FIRST_READ,
    MAX_REMOTE_HEADER_BYTES,
    HubFile,
    RemoteFile,
    RemoteNotFoundError,
    is_hub_path,
)

from .shards import declared_tensor_count, split_rules

__all__ = [
    "ScannedModel",
    "ShardScan",
    "architecture_problems",
    "consistency_problems",
    "data_problems",
    "duplicate_tensor_problems",
    "missing_shard_problems",
    "scan_model",
    "split_key_problems",
    "tensor_count_problems",
    "unread_shard_problems",
]

#: Remote sets: after this many missing shards in a row (and no readable shard's ``split.count`` to go by),
#: the shards the name still promises are not asked for.
MISSING_RUN = 3

#: A size no real file has: reading the tables "as if the file were complete" lets a truncated file
#: still tell which tensors it should hold and which of them are cut off.
_UNBOUNDED_SIZE = 1 << 62


@dataclass(frozen=True)
class ShardScan:
    """What could be read of one file of a model."""

    number: int  # 1-based position in the set
    name: str  # local path or hf:// address
    size: int | None  # None: the file does not exist
    header: GGUFHeader | None  # None: missing, or its header is unreadable
    error: str | None = None  # why there is no header
    data_error: str | None = None  # the tables are readable, but a tensor is mis-sized or outside the file

    @property
    def missing(self) -> bool:
        return self.size is None

    @property
    def label(self) -> str:
        """``shard 2 (Name-00002-of-00003.gguf)`` or the file name of a single file."""
        base = self.name.rsplit("/", 1)[-1]
        return base if self.number == 0 else f"shard {self.number} ({base})"


@dataclass(frozen=True)
class ScannedModel:
    """Every file a model's name promises, read as far as possible."""

    source: str  # what the user named
    prefix: str | None  # split prefix, None for a single file
    shards: tuple[ShardScan, ...]
    remote: bool = False
    bytes_fetched: int = 0  # remote: body bytes received over HTTP
    http_requests: int = 0
    promised: int = 0  # files the name promises, when more than ``shards`` (the rest were not asked for)
    unread_reason: str = ""  # why they were not

    @property
    def count(self) -> int:
        """Files the name promises (1 for a single file)."""
        return max(self.promised, len(self.shards))

    @property
    def unread(self) -> int:
        """Files the name promises that were not asked for (remote sets whose own keys say they are fewer)."""
        return self.count - len(self.shards)

    @property
    def is_split(self) -> bool:
        return self.prefix is not None

    @property
    def headers(self) -> tuple[GGUFHeader, ...]:
        """The headers that could be read, in shard order."""
        return tuple(s.header for s in self.shards if s.header is not None)

    @property
    def first(self) -> GGUFHeader | None:
        """Shard 1's header (where the model KVs live), if it could be read."""
        return self.shards[0].header

    @property
    def complete(self) -> bool:
        """Every file is present and has a readable header and data."""
        return not self.unread and all(s.header is not None and s.data_error is None for s in self.shards)

    @property
    def total_size(self) -> int:
        return sum(s.size or 0 for s in self.shards)

    def require_readable_headers(self) -> None:
        """Refuse a model with a file that exists but whose header cannot be read (not a GGUF, cut short): nothing
        about such a model can be summarised or checked (inspect, verify). A missing file is a problem to report.

        Raises:
            BadGGUFError: one line naming the first such file and why.
        """
        for shard in self.shards:
            if shard.header is None and not shard.missing:
                raise BadGGUFError(shard.error or "unreadable header", shard.name)


# ------------------------------------------------------------------------------------------------ reading


def _read(
    number: int, name: str, size: int, read_at: Callable[[int, int], bytes], limit: int, min_read: int
) -> ShardScan:
    try:
        header = parse_header(read_at, size, name, limit=limit, min_read=min_read)
        return ShardScan(number, name, size, header)
    except BadGGUFError as strict:
        try:
            header = parse_header(read_at, _UNBOUNDED_SIZE, name, limit=limit, min_read=min_read)
        except BadGGUFError:
            return ShardScan(number, name, size, None, error=strict.message)
        return ShardScan(number, name, size, replace(header, file_size=size), data_error=_cut_off(header, size, strict))


def _cut_off(header: GGUFHeader, size: int, strict: BadGGUFError) -> str:
    """Which tensors a file cut short lacks (the strict parser names only the first)."""
    cut = [t for t in header.tensors if header.data_offset + t.offset + t.nbytes > size]
    if not cut:
        return strict.message
    first = cut[0]
    end = header.data_offset + first.offset + first.nbytes
    return (
        f"truncated at {size:,} bytes: {len(cut)} tensor(s) end past it, first {first.name!r} "
        f"({first.type_name}, {first.nbytes:,} bytes, ends at byte {end:,})"
    )


def _read_local(number: int, path: Path) -> ShardScan:
    name = os.fspath(path)
    try:
        fd, info = open_regular(name)  # a named pipe is refused without waiting for a writer
    except FileNotFoundError:
        return ShardScan(number, name, None, None, error="missing")
    except IsADirectoryError:
        return ShardScan(number, name, 0, None, error="is a directory, not a GGUF file")
    except NotARegularFileError:
        return ShardScan(number, name, 0, None, error="is not a regular file (a pipe, socket or device)")
    except OSError as e:
        return ShardScan(number, name, 0, None, error=f"cannot open: {e.strerror}")
    try:
        return _read(number, name, info.st_size, lambda offset, n: os.pread(fd, n, offset), max_header_bytes(), 1 << 20)
    finally:
        os.close(fd)


def _split_names(name: str) -> tuple[str | None, int, int]:
    """(prefix, shard number, shard count) from a file name; (None, 0, 1) for a single file."""
    match = SPLIT_NAME.match(name)
    if not match:
        return None, 0, 1
    number, count = int(match["no"]), int(match["count"])
    if count < 1 or not 1 <= number <= count:
        raise ShardSetError(f"shard number {number} is not within 1..{count}", name)
    return match["prefix"], number, count


def _scan_local(source: str) -> ScannedModel:
    path = Path(source)
    if not path.exists():
        raise BadGGUFError("no such file", path)
    if path.is_dir():
        raise BadGGUFError("is a directory, not a GGUF file", path)
    prefix, _, count = _split_names(path.name)
    if prefix is None:
        return ScannedModel(source, None, (_read_local(0, path),))
    shards = tuple(_read_local(i, path.with_name(split_file_name(prefix, i, count))) for i in range(1, count + 1))
    return ScannedModel(source, prefix, shards)


def _declared_count(header: GGUFHeader | None) -> int | None:
    """A header's ``split.count`` when it is a positive integer, else ``None``."""
    value = header.get(KEY_SPLIT_COUNT) if header is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _scan_remote(source: str) -> ScannedModel:
    """Every shard the name promises, asked for in order, but no more than the set itself says it has.

    Each request carries the user's token, and a name may promise 99,999 shards: the first readable
    shard's ``split.count`` bounds the shards asked for, and :data:`MISSING_RUN` missing shards in a row
    (before any ``split.count`` was read) end the walk. The named file is always read.
    """
    named = HubFile.parse(source)
    prefix, number, count = _split_names(named.name)
    if prefix is None:
        shard, fetched, requests = _read_remote(0, named, must_exist=True)
        return ScannedModel(source, None, (shard,), remote=True, bytes_fetched=fetched, http_requests=requests)
    shards: list[ShardScan] = []
    fetched = requests = missing_run = 0
    bound, reason = count, ""
    for index in range(1, count + 1):
        if index > bound and index != number:
            if index > number:
                break
            continue
        shard, got, asked = _read_remote(index, named.sibling(split_file_name(prefix, index, count)), index == number)
        shards.append(shard)
        fetched, requests = fetched + got, requests + asked
        missing_run = missing_run + 1 if shard.missing else 0
        declared = _declared_count(shard.header)
        if reason:
            continue
        if declared is not None and declared < count:
            bound, reason = declared, f"{shard.label} says {KEY_SPLIT_COUNT} = {declared}"
        elif missing_run >= MISSING_RUN and index < count:
            bound, reason = index, f"{MISSING_RUN} shards in a row are missing"
    return ScannedModel(source, prefix, tuple(shards), remote=True, bytes_fetched=fetched, http_requests=requests,
                        promised=count, unread_reason=reason)


def _read_remote(number: int, hub_file: HubFile, must_exist: bool) -> tuple[ShardScan, int, int]:
    """One remote file's scan, the body bytes received and the requests made for it.

    Raises:
        RemoteNotFoundError: the file is missing and ``must_exist`` (the file the user named).
    """
    try:
        remote = RemoteFile.open(hub_file, limit=MAX_REMOTE_HEADER_BYTES)
    except RemoteNotFoundError:
        if must_exist:
            raise
        return ShardScan(number, str(hub_file), None, None, error="missing"), 0, 1
    shard = _read(number, str(hub_file), remote.size, remote.read_at, MAX_REMOTE_HEADER_BYTES, FIRST_READ)
    return shard, remote.bytes_received, remote.requests


def scan_model(source: str | os.PathLike[str]) -> ScannedModel:
    """Read the header of every file of the model ``source`` belongs to, tolerating broken sets.

    Args:
        source: a local GGUF, any shard of a ``<prefix>-NNNNN-of-NNNNN.gguf`` set, or a Hub file
            ``hf://OWNER/REPO/path/to/file.gguf[@revision]`` (read with HTTP range requests).

    Returns:
        A :class:`ScannedModel`: one :class:`ShardScan` per file the name promises, each with its
        header or the reason it has none.

    Raises:
        BadGGUFError: ``source`` itself does not exist or is a folder.
        ShardSetError: its name promises an impossible shard number.
        HubError: a Hub file could not be reached (offline, no access, network failure, not found).
    """
    if is_hub_path(source):
        return _scan_remote(str(source))
    return _scan_local(os.fspath(source))


# ----------------------------------------------------------------------------------------------- problems


def missing_shard_problems(model: ScannedModel) -> list[str]:
    """Files of the set that do not exist, whose header cannot be read, or that were not asked for."""
    problems = unread_shard_problems(model)
    for shard in model.shards:
        if shard.missing:
            problems.append(f"{shard.label} is missing ({model.count} files expected)")
        elif shard.header is None:
            problems.append(f"{shard.label}: {shard.error}")
    return problems


def unread_shard_problems(model: ScannedModel) -> list[str]:
    """Shards the name promises that were not asked for, and why (a remote set whose own keys say it is smaller)."""
    if not model.unread:
        return []
    return [
        f"the file names promise {model.count:,} shards, but {model.unread_reason}: "
        f"{model.unread:,} of them were not asked for"
    ]


def split_key_problems(model: ScannedModel) -> list[str]:
    """``split.no`` / ``split.count`` as llama.cpp checks them, in every readable file (the rules of
    :func:`gguf_mtp.model.shards.split_rules`, shared with the strict reader)."""
    count = model.count if model.is_split else None
    problems: list[str] = []
    for shard in model.shards:
        if shard.header is not None:
            position = shard.number - 1 if model.is_split else 0
            problems.extend(f"{shard.label}: {p}" for p in split_rules(shard.header, position, count))
    return problems


def tensor_count_problems(model: ScannedModel) -> list[str]:
    """Each file's own ``split.tensors.count`` against the tensors the set holds."""
    found = sum(len(h.tensors) for h in model.headers)
    where = f"the {model.count} shards hold" if model.count > 1 else "the file holds"
    if not model.complete:
        where = "the readable shards hold"
    problems = []
    for shard in model.shards:
        if shard.header is None:
            continue
        # None when missing or not an integer: split_rules reports those
        declared = declared_tensor_count(shard.header)
        if declared is not None and declared != found:
            problems.append(f"{shard.label}: {KEY_SPLIT_TENSORS_COUNT} = {declared}, but {where} {found} tensors")
    return problems


def duplicate_tensor_problems(model: ScannedModel) -> list[str]:
    """Tensor names found in more than one file (llama.cpp refuses them)."""
    seen: dict[str, ShardScan] = {}
    problems = []
    for shard in model.shards:
        for tensor in shard.header.tensors if shard.header else ():
            if tensor.name in seen:
                problems.append(f"tensor {tensor.name!r} is in {seen[tensor.name].label} and in {shard.label}")
            else:
                seen[tensor.name] = shard
    return problems


def architecture_problems(model: ScannedModel) -> list[str]:
    """Files that say they belong to another architecture than shard 1."""
    first = model.first
    arch = first.get(KEY_ARCHITECTURE) if first is not None else None
    problems = []
    if first is not None and not isinstance(arch, str):
        problems.append(f"{model.shards[0].label} has no {KEY_ARCHITECTURE}")
    for shard in model.shards[1:]:
        other = shard.header.get(KEY_ARCHITECTURE) if shard.header else None
        if other is not None and arch is not None and other != arch:
            problems.append(f"{shard.label} is a {other!r} file, shard 1 a {arch!r} one")
    return problems


def data_problems(model: ScannedModel) -> list[str]:
    """Tensors mis-sized or outside their file, and data sections not laid out as llama.cpp requires
    (tensors back to back in table order, each padded to the alignment)."""
    problems = []
    for shard in model.shards:
        if shard.data_error:
            problems.append(f"{shard.label}: {shard.data_error}")
        elif shard.header is not None:
            misplaced = shard.header.first_misplaced_tensor()
            if misplaced is not None:
                tensor, expected = misplaced
                problems.append(
                    f"{shard.label}: tensor {tensor.name!r} is at data offset {tensor.offset:,}, llama.cpp expects "
                    f"{expected:,} (tensors back to back in table order)"
                )
    return problems


def consistency_problems(model: ScannedModel) -> list[str]:
    """Every problem of the set as a whole, in the order llama.cpp would meet them."""
    return [
        *missing_shard_problems(model),
        *data_problems(model),
        *split_key_problems(model),
        *tensor_count_problems(model),
        *duplicate_tensor_problems(model),
        *architecture_problems(model),
    ]
