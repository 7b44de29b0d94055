"""The bytes group: every target tensor in the composite with identical bytes, and every draft block tensor
(``blk.0`` renamed to ``blk.N``). Bytes are compared in fixed-size chunks read with ``os.pread`` (memory stays flat
whatever the model size), under a progress bar; ranges on the same physical extents (reflink) need no reading."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_mtp.constants import BLOCK_TENSOR, DRAFT_GLOBAL_TENSORS
from gguf_mtp.errors import GGUFMTPError
from gguf_mtp.files.extents import ExtentProver
from gguf_mtp.files.progress import progress_bar
from gguf_mtp.format.header import GGUFHeader, TensorInfo
from gguf_mtp.model.shard_scan import ScannedModel
from gguf_mtp.model.shards import ShardSet
from gguf_mtp.text import human_bytes

from .report import Check, VerifyReport, check_from
from .subject import Subject

__all__ = ["COMPARE_CHUNK", "bytes_group", "draft_renames", "same_ggml_shape"]

#: Bytes read per comparison step (two buffers of this size are alive at a time).
COMPARE_CHUNK = 8 * 1024 * 1024


def bytes_group(subject: Subject, report: VerifyReport) -> None:
    """Compare a model's tensors with the target's and the draft's, where given (a draft is not made of its
    target: the structure group checks its fit instead)."""
    if subject.is_draft or (subject.target is None and subject.draft is None):
        return
    composite = _locations(subject.model)
    with progress_bar(_bytes_to_read(subject), "verify", enabled=subject.options.progress) as bar:
        if subject.target is not None:
            result = _compare_tensors(subject.target, composite, None, bar.update)
            _add_bytes(report, result)
            report.checks.append(_target_tensors_check(result))
        if subject.draft is not None:
            result = _compare_tensors(subject.draft, composite, subject.renames, bar.update)
            _add_bytes(report, result)
            report.checks.append(_draft_tensors_check(result, subject.renames, subject.dropped))


def _bytes_to_read(subject: Subject) -> int:
    """Both sides of every comparison: what the progress bar counts to."""
    total = 0
    if subject.target is not None:
        total += 2 * sum(t.nbytes for _, t in subject.target.iter_tensors())
    if subject.draft is not None:
        total += 2 * sum(t.nbytes for _, t in subject.draft.iter_tensors() if t.name in subject.renames)
    return total


def _add_bytes(report: VerifyReport, result: _ByteComparison) -> None:
    """Count a comparison's bytes in the report (the ``--json`` totals)."""
    report.bytes_compared += result.nbytes
    report.bytes_shared += result.shared


def _target_tensors_check(result: _ByteComparison) -> Check:
    return check_from(
        "target tensors",
        result.problems("target"),
        f"all {result.compared} target tensors ({result.nbytes:,} bytes) identical in the composite"
        + result.sharing("target"),
    )


def _draft_tensors_check(result: _ByteComparison, renames: dict[str, str], dropped: Sequence[str]) -> Check:
    left_out = f"; left out {', '.join(dropped)} (the composite uses the target's)" if dropped else ""
    blocks = sorted({int(m["block"]) for name in renames.values() if (m := BLOCK_TENSOR.match(name))})
    where = (f" as blk.{blocks[0]}" + (f"-{blocks[-1]}" if len(blocks) > 1 else "")) if blocks else ""
    return check_from(
        "draft tensors",
        result.problems("draft"),
        f"all {result.compared} draft block tensors ({result.nbytes:,} bytes) identical{where}"
        + result.sharing("draft")
        + left_out,
    )


def _locations(model: ScannedModel) -> dict[str, tuple[GGUFHeader, TensorInfo]]:
    return {t.name: (h, t) for h in model.headers for t in h.tensors}


class _RangeComparer:
    """Compares byte ranges of two files ``COMPARE_CHUNK`` at a time, into two buffers reused for the
    whole run (fresh buffers per read would page-fault at every chunk and halve the speed)."""

    def __init__(self, advance: Callable[[int], Any]) -> None:
        self.advance = advance
        self.a = bytearray(COMPARE_CHUNK)
        self.b = bytearray(COMPARE_CHUNK)
        self.view_a, self.view_b = memoryview(self.a), memoryview(self.b)
        self.prover = ExtentProver()  # reflink: ranges on the same physical extents need no reading
        self.shared = 0  # bytes proven identical by their extents

    def equal(self, fd_a: int, offset_a: int, fd_b: int, offset_b: int, nbytes: int) -> bool:
        lo, hi = self.prover.shared_span(fd_a, offset_a, fd_b, offset_b, nbytes)
        if hi > lo:
            self.shared += hi - lo
            self.advance(2 * (hi - lo))
            head = self._equal(fd_a, offset_a, fd_b, offset_b, lo)
            return self._equal(fd_a, offset_a + hi, fd_b, offset_b + hi, nbytes - hi) and head
        return self._equal(fd_a, offset_a, fd_b, offset_b, nbytes)

    def _equal(self, fd_a: int, offset_a: int, fd_b: int, offset_b: int, nbytes: int) -> bool:
        done = 0
        while done < nbytes:
            n = min(COMPARE_CHUNK, nbytes - done)
            got_a = os.preadv(fd_a, [self.view_a[:n]], offset_a + done)
            got_b = os.preadv(fd_b, [self.view_b[:n]], offset_b + done)
            self.advance(2 * n)
            # bytearray equality is a memcmp; memoryview equality would compare item by item
            same = self.a == self.b if n == COMPARE_CHUNK else self.a[:n] == self.b[:n]
            if got_a != n or got_b != n or not same:
                self.advance(2 * (nbytes - done - n))
                return False
            done += n
        return True


def same_ggml_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    """Shapes equal the way llama.cpp compares them: trailing dimensions of 1 do not count, so the ``[n, 1]``
    upstream's converter writes equals the ``[n]`` ``llama-gguf-split`` writes back (ggml drops unit dims)."""
    a, b = list(a), list(b)
    while a and a[-1] == 1:
        a.pop()
    while b and b[-1] == 1:
        b.pop()
    return a == b


@dataclass
class _ByteComparison:
    """Source tensors compared with their copies in the composite."""

    missing: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # type or shape
    differing: list[str] = field(default_factory=list)  # bytes
    compared: int = 0
    nbytes: int = 0
    shared: int = 0  # of nbytes: proven identical by shared extents, not read

    def sharing(self, what: str) -> str:
        """`` (shared with the target: X, compared: Y)`` where extents were shared, else nothing."""
        if not self.shared:
            return ""
        compared = human_bytes(self.nbytes - self.shared)
        return f" (shared with the {what}: {human_bytes(self.shared)}, compared: {compared})"

    def problems(self, what: str) -> list[str]:
        problems = []
        if self.differing:
            others = len(self.differing) - 1
            problems.append(
                f"{what} tensor {self.differing[0]!r} differs from its copy in the composite"
                + (f" (and {others} more)" if others else "")
            )
        if self.missing:
            problems.append(
                f"{len(self.missing)} {what} tensor(s) missing from the composite, first {self.missing[0]!r}"
            )
        problems += self.mismatched
        return problems


def _pairs(
    source: ShardSet, renames: dict[str, str] | None, composite: dict[str, tuple[GGUFHeader, TensorInfo]]
) -> Iterator[tuple[GGUFHeader, TensorInfo, str, tuple[GGUFHeader, TensorInfo] | None]]:
    for index, tensor in source.iter_tensors():
        if renames is not None and tensor.name not in renames:
            continue
        new_name = renames[tensor.name] if renames is not None else tensor.name
        yield source.headers[index], tensor, new_name, composite.get(new_name)


def _compare_tensors(
    source: ShardSet,
    composite: dict[str, tuple[GGUFHeader, TensorInfo]],
    renames: dict[str, str] | None,
    advance: Callable[[int], Any],
) -> _ByteComparison:
    result = _ByteComparison()
    comparer = _RangeComparer(advance)
    with ExitStack() as stack:
        fds: dict[str, int] = {}

        def fd(path: str) -> int:
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
                stack.callback(os.close, fds[path])
            return fds[path]

        for src_header, tensor, new_name, found in _pairs(source, renames, composite):
            if found is None:
                result.missing.append(new_name)
                advance(2 * tensor.nbytes)
                continue
            dst_header, copy = found
            if copy.ggml_type != tensor.ggml_type or not same_ggml_shape(copy.shape, tensor.shape):
                result.mismatched.append(
                    f"{new_name!r} is {copy.type_name} {list(copy.shape)} in the composite, "
                    f"{tensor.type_name} {list(tensor.shape)} in {Path(src_header.path).name}"
                )
                advance(2 * tensor.nbytes)
                continue
            if dst_header.data_offset + copy.offset + copy.nbytes > dst_header.file_size:
                result.differing.append(new_name)  # cut off in the composite ("tensor data" says more)
                advance(2 * tensor.nbytes)
                continue
            equal = comparer.equal(
                fd(src_header.path), src_header.data_offset + tensor.offset,
                fd(dst_header.path), dst_header.data_offset + copy.offset,
                tensor.nbytes,
            )
            result.compared += 1
            result.nbytes += tensor.nbytes
            if not equal:
                result.differing.append(new_name)
    result.shared = comparer.shared
    return result


def _nextn_start(draft: ShardSet) -> int | None:
    """Where the NextN blocks of a whole model with MTP start (a graft source given as the draft)."""
    try:
        nextn, trunk = draft.nextn_predict_layers, draft.trunk_block_count
    except GGUFMTPError:
        return None
    return trunk if nextn and any(b < trunk for b in draft.block_indices()) else None


def draft_renames(draft: ShardSet, block: int) -> tuple[dict[str, str], tuple[str, ...]]:
    """Draft block tensor -> name in the composite (blk.0 -> blk.N, or blk.N kept), and the globals
    the composite does not carry (it uses the target's). A whole model with NextN blocks (what graft
    takes them from) counts as the draft of its NextN blocks only."""
    renames: dict[str, str] = {}
    dropped: list[str] = []
    start = _nextn_start(draft)
    shift = _block_shift(draft, block, start)
    for _, tensor in draft.iter_tensors():
        match = BLOCK_TENSOR.match(tensor.name)
        if start is not None and (not match or int(match["block"]) < start):
            continue  # the source model's trunk blocks and globals: the composite has the target's
        if match:
            renames[tensor.name] = f"blk.{int(match['block']) + shift}.{match['rest']}"
        elif tensor.name in DRAFT_GLOBAL_TENSORS:
            dropped.append(tensor.name)
        else:
            renames[tensor.name] = tensor.name
    return renames, tuple(dropped)


def _block_shift(draft: ShardSet, block: int, start: int | None) -> int:
    """How far the draft's blocks move: a draft's ``blk.0`` (or a source model's first NextN block) becomes
    ``blk.<block>``; blocks already numbered otherwise keep their numbers."""
    blocks = sorted({int(m["block"]) for _, t in draft.iter_tensors() if (m := BLOCK_TENSOR.match(t.name))})
    if start is not None:
        blocks = [b for b in blocks if b >= start]
    return block - blocks[0] if blocks and blocks[0] in (0, start) else 0
