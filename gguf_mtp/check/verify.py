"""``verify``: prove a composite is right, check by check.

Structural checks read only headers (every shard present and readable, ``split.*`` right in every
shard, tensors sized and placed as llama.cpp requires, per-layer arrays as long as ``block_count``
and trunk-length ones as long as the trunk, per :mod:`gguf_mtp.model.arch_rules`, every declared
NextN block complete). With the target, every target tensor's bytes are compared with
the composite's and every target KV must be unchanged except those compose changes; with the draft,
every draft block tensor must be in the composite, bytes identical. Bytes are compared in fixed-size
chunks read with ``os.pread`` (memory stays flat whatever the model size), under a progress bar.
Last, llama.cpp itself loads the composite with its NextN block and runs an MTP decode step through
each NextN block: a load alone would miss a NextN block llama.cpp quietly ignored.

An MTP-only file (a draft: a ``--standalone`` sidecar, or a bare draft for ``compose``) is proved as a
draft: the same structural checks, its NextN blocks complete, its global tensors
(:mod:`gguf_mtp.check.draft_checks`), with a target its fit to that target (instead of byte comparisons:
it is not made of the target), and llama.cpp loads a sidecar as the drafter it is and runs the MTP decode
steps only (an MTP-only file has no trunk graph; llama.cpp crashes trying one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gguf_mtp.constants import (
    BLOCK_TENSOR,
    DRAFT_GLOBAL_TENSORS,
    KEY_BLOCK_COUNT,
    KEY_NEXTN_PREDICT_LAYERS,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
)
from gguf_mtp.errors import BadGGUFError, GGUFMTPError, ParameterError
from gguf_mtp.files.extents import ExtentProver
from gguf_mtp.files.journal import pending_journal, uncommitted_line
from gguf_mtp.files.progress import progress_bar
from gguf_mtp.format.header import GGUFHeader, KeyValue, TensorInfo
from gguf_mtp.format.layout import PAD_KEY
from gguf_mtp.hub.remote import is_hub_path
from gguf_mtp.model.arch_rules import nextn_graph_note
from gguf_mtp.model.blocks import (
    BlockLayout,
    block_indices,
    block_layout_problem,
    is_mtp_only,
    missing_nextn_tensors,
    per_layer_keys,
    per_layer_problems,
)
from gguf_mtp.model.set_id import SET_ID_KEY, set_id_problems
from gguf_mtp.model.shard_scan import (
    ScannedModel,
    architecture_problems,
    data_problems,
    duplicate_tensor_problems,
    missing_shard_problems,
    scan_model,
    split_key_problems,
    tensor_count_problems,
)
from gguf_mtp.model.shards import ShardSet, open_model
from gguf_mtp.text import human_bytes, short, short_change

from .acceptance_floor import DEFAULT_FLOOR, acceptance_verdict, refuse_unmeasurable
from .draft_checks import draft_globals_check, target_fit_check
from .llama_check import INSTALL_HINT, LlamaCheck, check_with_llama, llama_cpp_available

__all__ = ["Check", "VerifyReport", "verify"]

#: Bytes read per comparison step (two buffers of this size are alive at a time).
COMPARE_CHUNK = 8 * 1024 * 1024

#: At most this many problems are spelled out in one check's detail (the rest are counted).
_SHOWN = 5


@dataclass(frozen=True)
class Check:
    """One verification step: passed (``ok=True``), failed (``False``) or skipped (``None``)."""

    name: str
    ok: bool | None
    detail: str

    @property
    def status(self) -> str:
        return "skip" if self.ok is None else ("pass" if self.ok else "fail")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "ok": self.ok, "detail": self.detail}


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`: every check with its status and what it found."""

    composite: str
    kind: str = "model"  # or "mtp-draft": an MTP-only file, checked as a draft
    sidecar: bool = False  # an MTP-only draft llama.cpp loads beside its target (it carries token_embd/output_norm)
    target: str | None = None
    draft: str | None = None
    checks: list[Check] = field(default_factory=list)
    bytes_compared: int = 0
    bytes_shared: int = 0  # of bytes_compared: proven identical by shared extents (reflink), not read
    seconds: float = 0.0
    llama: LlamaCheck | None = None
    hints: list[str] = field(default_factory=list)  # what to do about a failure, one line each

    @property
    def ok(self) -> bool:
        """No check failed (skipped checks are listed as skipped, not counted as passed)."""
        return bool(self.checks) and all(c.ok is not False for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def check(self, name: str) -> Check:
        """The check called ``name``.

        Raises:
            KeyError: no such check was run.
        """
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        result: dict[str, Any] = {
            "command": "verify",
            "composite": self.composite,
            "kind": self.kind,
            "sidecar": self.sidecar,
            "target": self.target,
            "draft": self.draft,
            "ok": self.ok,
            "checks": [c.to_dict() for c in self.checks],
            "passed": sum(c.ok is True for c in self.checks),
            "failed": len(self.failures),
            "skipped": sum(c.ok is None for c in self.checks),
            "bytes_compared": self.bytes_compared,
            "bytes_shared": self.bytes_shared,
            "seconds": round(self.seconds, 3),
            "hints": list(self.hints),
            "llama_cpp_build": self.llama.llama_cpp_build if self.llama is not None else None,
            "llama_cpp_library": self.llama.llama_cpp_library if self.llama is not None else None,
        }
        if self.llama is not None:
            result["llama"] = {k: v for k, v in asdict(self.llama).items() if k != "log_tail"} | {"ok": self.llama.ok}
        return result

    def describe(self) -> list[str]:
        """One line per check (``PASS``/``FAIL``/``SKIP``), then the verdict."""
        lines = [f"verify {self.composite}" + (" (an MTP-only draft)" if self.kind == "mtp-draft" else "")]
        width = max((len(c.name) for c in self.checks), default=0)
        lines += [f"  {c.status.upper():4}  {c.name:<{width}}  {c.detail}" for c in self.checks]
        passed = sum(c.ok is True for c in self.checks)
        skipped = sum(c.ok is None for c in self.checks)
        tail = f", {skipped} skipped" if skipped else ""
        if self.ok:
            lines.append(f"verified: {passed} checks passed{tail}")
        else:
            lines.append(f"NOT verified: {len(self.failures)} of {len(self.checks)} checks failed{tail}")
            lines += [f"hint: {hint}" for hint in self.hints]
        return lines


def _summary(problems: list[str]) -> str:
    shown = "; ".join(problems[:_SHOWN])
    more = len(problems) - _SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def _check(name: str, problems: list[str], passed: str) -> Check:
    return Check(name, not problems, _summary(problems) if problems else passed)


# ------------------------------------------------------------------------------------------ structural


@dataclass(frozen=True)
class _Layout:
    """The composite's block layout, as its metadata states it."""

    arch: str
    block_count: int
    nextn: int

    @property
    def trunk(self) -> int:
        return self.block_count - self.nextn


def _layout(model: ScannedModel) -> tuple[_Layout | None, str | None]:
    first = model.first
    if first is None:
        return None, f"{model.shards[0].label} is unreadable, so the model metadata is unknown"
    layout, problem = block_layout_problem(first)  # bounded: nothing below loops 4e9 times
    if layout is None:
        return None, problem
    return _Layout(layout.arch, layout.block_count, layout.nextn), None


def _structural_checks(model: ScannedModel, layout: _Layout | None, layout_error: str | None) -> list[Check]:
    n_files = model.count
    readable = "" if all(s.header is not None for s in model.shards) else "readable "
    n_tensors = sum(len(h.tensors) for h in model.headers)
    tensor_bytes = sum(t.nbytes for h in model.headers for t in h.tensors)
    checks = [
        _check("files", missing_shard_problems(model), f"{n_files} of {n_files} file(s) present and readable"),
        _check(
            "split keys",
            split_key_problems(model) + architecture_problems(model)
            + set_id_problems([(s.label, s.header) for s in model.shards]),
            f"split.no 0..{n_files - 1} and split.count {n_files} in every {readable}shard"
            if model.is_split
            else "single file",
        ),
        _check(
            "split.tensors.count",
            tensor_count_problems(model),
            f"{n_tensors} in every shard, the number of tensors found" if model.is_split else "single file",
        ),
        _check("tensor names", duplicate_tensor_problems(model), f"{n_tensors} tensors, no name twice"),
        _check(
            "tensor data",
            data_problems(model),
            f"{n_tensors} tensors ({tensor_bytes:,} bytes) sized per GGML_QUANT_SIZES, packed and inside their files",
        ),
    ]
    if layout is None:
        checks.append(Check("per-layer arrays", False, layout_error or "no model metadata"))
        return checks
    first = model.first
    assert first is not None
    arrays = per_layer_keys(first, layout.arch, layout.block_count)
    checks.append(
        _check(
            "per-layer arrays",
            per_layer_problems(first, layout.arch, layout.block_count, layout.trunk),
            f"{len(arrays)} array(s) with {layout.block_count} entries (block_count)"
            + (f": {', '.join(kv.key.split('.', 1)[1] for kv in arrays)}" if arrays else ""),
        )
    )
    return checks


def _nextn_check(
    model: ScannedModel, layout: _Layout | None, layout_error: str | None, draft_names: Iterable[str] = ()
) -> Check:
    if layout is None:
        return Check("NextN tensors", False, layout_error or "no model metadata")
    nextn_key = KEY_NEXTN_PREDICT_LAYERS.format(arch=layout.arch)
    if layout.nextn == 0:
        return Check("NextN tensors", False, f"{nextn_key} is 0 or missing: the file declares no NextN block")
    names = {t.name for h in model.headers for t in h.tensors}
    problems = []
    for block in range(layout.trunk, layout.block_count):
        missing = missing_nextn_tensors(names, layout.arch, block)
        if missing:
            problems.append(f"blk.{block} lacks {', '.join(missing)}")
    absent = [n for n in draft_names if n not in names]
    if absent:
        problems.append(f"draft tensor(s) not in the composite: {', '.join(absent[:_SHOWN])}")
    stray = sorted(
        {int(m["block"]) for n in names if (m := BLOCK_TENSOR.match(n)) and int(m["block"]) >= layout.block_count}
    )
    problems += [f"tensors of blk.{b}, beyond block_count {layout.block_count}" for b in stray]
    graph_note = nextn_graph_note(layout.arch, layout.nextn)
    if graph_note:
        problems.append(graph_note)
    blocks = ", ".join(f"blk.{b}" for b in range(layout.trunk, layout.block_count))
    per_block = sum(1 for n in names if n.startswith(f"blk.{layout.trunk}."))
    passed = f"{blocks} declared; {per_block} tensors incl. nextn.eh_proj/enorm/hnorm"
    return _check("NextN tensors", problems, passed)


# ---------------------------------------------------------------------------------------------- bytes


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


def _draft_renames(draft: ShardSet, block: int) -> tuple[dict[str, str], list[str]]:
    """Draft block tensor -> name in the composite (blk.0 -> blk.N, or blk.N kept), and the globals
    the composite does not carry (it uses the target's). A whole model with NextN blocks (what graft
    takes them from) counts as the draft of its NextN blocks only."""
    renames: dict[str, str] = {}
    dropped: list[str] = []
    start = _nextn_start(draft)
    blocks = sorted({int(m["block"]) for _, t in draft.iter_tensors() if (m := BLOCK_TENSOR.match(t.name))})
    if start is not None:
        blocks = [b for b in blocks if b >= start]
    shift = block - blocks[0] if blocks and blocks[0] in (0, start) else 0
    for _, tensor in draft.iter_tensors():
        match = BLOCK_TENSOR.match(tensor.name)
        if match and start is not None and int(match["block"]) < start:
            continue  # a trunk block of the source model: the target's trunk is what the composite has
        if start is not None and not match:
            continue  # its globals belong to the source model, not to the NextN block
        if match:
            renames[tensor.name] = f"blk.{int(match['block']) + shift}.{match['rest']}"
        elif tensor.name in DRAFT_GLOBAL_TENSORS:
            dropped.append(tensor.name)
        else:
            renames[tensor.name] = tensor.name
    return renames, dropped


# ------------------------------------------------------------------------------------------- metadata


def _show(kv: KeyValue | None) -> str:
    if kv is None:
        return "(absent)"
    text = repr(kv.value)
    return (text if len(text) <= 40 else text[:37] + "...") + f" ({kv.type_name})"


def _bookkeeping(key: str) -> bool:
    """gguf-mtp's own keys (``gguf_mtp.pad``, ...): placement and provenance, not model metadata; not listed."""
    return key == PAD_KEY or key.startswith("gguf_mtp.")


@dataclass(frozen=True)
class _KVRules:
    """What a composite's KVs may differ in from the target's: the keys compose edits and their expected values."""

    allowed: frozenset[str]  # changed on purpose (--set-kv, re-sharding): listed, never a problem
    count_key: str
    nextn_key: str
    per_layer: frozenset[str]
    block_count: int  # expected in the composite
    nextn: int
    added_tensors: int
    layout_blocks: int | None


def _kv_problems(
    target: ShardSet, model: ScannedModel, layout: _Layout | None, added: int, allowed: set[str]
) -> tuple[list[str], list[str], list[str]]:
    """(problems, changes seen, keys a ``--set-kv`` could have changed) comparing every target KV with the
    composite's, shard by shard."""
    problems: list[str] = []
    changes: list[str] = []
    settable: list[str] = []  # changed or added keys compose does not manage: allow_kv would accept them
    pairs = list(zip(target.headers, model.shards))
    if len(model.shards) != len(target.headers):
        # re-sharded after compose (llama-gguf-split --merge / --split): the split.* keys describe the new
        # files, every other KV is compared with the target's first shard (gguf-split keeps them in shard 1)
        changes.append(f"re-sharded: {len(target.headers)} -> {len(model.shards)} file(s)")
        allowed = allowed | {KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT}
        pairs = pairs[:1]
    nextn = layout.nextn if layout else 0
    rules = _KVRules(
        allowed=frozenset(allowed),
        count_key=KEY_BLOCK_COUNT.format(arch=target.arch),
        nextn_key=KEY_NEXTN_PREDICT_LAYERS.format(arch=target.arch),
        per_layer=frozenset(kv.key for kv in per_layer_keys(target.first, target.arch, target.block_count)),
        block_count=target.block_count + nextn,
        nextn=nextn,
        added_tensors=added,
        layout_blocks=layout.block_count if layout else None,
    )
    for index, (old_header, shard) in enumerate(pairs):
        new_header = shard.header
        if new_header is None:
            continue  # "files" already fails
        where = "" if index == 0 else f" in {shard.label}"
        for key, old in old_header.kvs.items():
            problem, change = _kv_difference(rules, key, old, new_header.kvs.get(key), index, where)
            problems += [problem] if problem else []
            if problem and problem.startswith(f"{key}{where} changed:") and key not in settable:
                settable.append(key)
            changes += [change] if change else []
        for key, new in new_header.kvs.items():
            if key in old_header.kvs:
                continue
            if key in rules.allowed:
                if not _bookkeeping(key):
                    changes.append(f"{key}{where} = {short(new.value, 40)} (added)")
            elif key == rules.nextn_key and index == 0:
                changes.append(f"{key.split('.', 1)[1]} = {new.value}")
            else:
                problems.append(f"{key}{where} was added ({_show(new)})")
                if key not in settable:
                    settable.append(key)
    return problems, changes, settable


def _kv_difference(
    rules: _KVRules, key: str, old: KeyValue, new: KeyValue | None, index: int, where: str
) -> tuple[str | None, str | None]:
    """(problem, change) for one target KV and its counterpart in the composite's file ``index``."""
    if key in rules.allowed:
        if not _bookkeeping(key) and (new is None or new.raw != old.raw):
            value = "removed" if new is None else short_change(old.value, new.value, 40)
            return None, f"{key}{where} {value}"
        return None, None
    if new is None:
        return f"{key}{where} was removed", None
    short_key = key.split(".", 1)[1]
    if key == rules.count_key and index == 0:
        return _int_difference(key, old, new, rules.block_count, short_key)
    if key == rules.nextn_key and index == 0:  # a target may state 0 explicitly
        return _int_difference(key, old, new, rules.nextn, short_key)
    if key == KEY_SPLIT_TENSORS_COUNT:
        problem, change = _int_difference(key + where, old, new, old.value + rules.added_tensors, key)
        return problem, change if index == 0 else None
    if key in rules.per_layer and index == 0:
        return _per_layer_difference(key, old, new, rules.layout_blocks)
    if new.raw != old.raw:
        return f"{key}{where} changed: {_show(old)} -> {_show(new)}", None
    return None, None


def _int_difference(
    label: str, old: KeyValue, new: KeyValue, expected: int, change_label: str
) -> tuple[str | None, str | None]:
    """A count compose sets: a problem unless it has the target's type and the ``expected`` value."""
    if new.vtype != old.vtype or new.value != expected:
        return f"{label} is {_show(new)}, expected {expected} ({old.type_name})", None
    if new.value != old.value:
        return None, f"{change_label} {old.value}->{new.value}"
    return None, None


def _per_layer_difference(
    key: str, old: KeyValue, new: KeyValue, layout_blocks: int | None
) -> tuple[str | None, str | None]:
    """A per-layer array: the trunk's entries unchanged, one entry per block of the composite."""
    items = new.value if new.is_array else None
    if new.element_type != old.element_type or items is None:
        return f"{key} is {_show(new)}, was {_show(old)}", None
    if items[: len(old.value)] != old.value:
        return f"{key}: the trunk's entries changed ({old.value!r} -> {items[: len(old.value)]!r})", None
    if layout_blocks is not None and len(items) != layout_blocks:
        return f"{key} has {len(items)} entries, block_count is {layout_blocks}", None
    if len(items) != len(old.value):
        return None, f"{key.split('.', 1)[1]} extended"
    return None, None


# ------------------------------------------------------------------------------------------- llama.cpp


def _not_run(llama: bool | None, detail: str) -> tuple[Check, None]:
    """The llama.cpp check when it cannot run: skipped, or failed when it was required (``llama=True``)."""
    return Check("llama.cpp", None if llama is None else False, ("skipped: " if llama is None else "") + detail), None


def _llama_check(
    model: ScannedModel,
    layout: _Layout | None,
    llama: bool | None,
    draft: bool = False,
    sidecar: bool = False,
    target: ShardSet | None = None,
) -> tuple[Check, LlamaCheck | None]:
    """Load the file with llama.cpp and run its decode steps: a model's trunk step and the MTP step through each
    NextN block; a draft (``draft``) only the MTP steps, and only a ``sidecar`` (a bare draft cannot load), on the
    hidden rows of its ``target``'s trunk decode where one is given. A composite llama.cpp refuses is compared
    with its ``target`` (see :func:`_target_refusal`)."""
    name = "llama.cpp"
    if llama is False:
        return Check(name, None, "skipped (--no-llama)"), None
    what = "the draft" if draft else "the composite"
    if model.remote:
        return _not_run(llama, f"{what} is remote: download it to load it with llama.cpp")
    if draft and not sidecar:
        return _not_run(
            llama,
            "a draft without token_embd/output_norm runs only inside its composite: verify that "
            "(gguf-mtp compose TARGET DRAFT -o OUTDIR --verify)",
        )
    if not llama_cpp_available():
        return _not_run(llama, f"llama-cpp-python is not installed; to load {what} with llama.cpp: {INSTALL_HINT}")
    # An MTP-only file has no trunk graph to run (llama.cpp crashes trying), nor has a model without trunk blocks.
    beside = target.name if draft and target is not None else None
    result = check_with_llama(model.shards[0].name, trunk=not draft and (layout is None or layout.trunk > 0),
                              beside=beside)
    detail = result.summary()
    ok = result.ok
    declared = layout.nextn if layout else 0
    if result.loaded and declared and result.n_layer_nextn != declared:
        ok = False
        detail += f"; the file declares {declared} NextN block(s), llama.cpp loaded {result.n_layer_nextn}"
    elif result.loaded and declared and result.mtp_decode_ok is not True:
        ok = False
        detail += "; the MTP decode step did not run"
    elif result.loaded and declared and result.mtp_blocks_decoded != declared:
        ok = False
        detail += f"; the MTP decode step ran through {result.mtp_blocks_decoded} of {declared} NextN blocks"
    if not ok and result.error and result.error not in detail:
        detail += f" ({result.error})"
    if target is not None and not draft and not result.loaded and result.crashed is None:
        detail += _target_refusal(target)
    if result.llama_cpp_build:
        detail += f"; checked with {result.llama_cpp_build}"
    return Check(name, ok, detail), result


def _target_refusal(target: ShardSet) -> str:
    """What a composite llama.cpp refused owes to its ``target``: a composite is as loadable as its target, so when
    this llama.cpp refuses the target too (a key type it cannot read, an architecture it does not know), the fault
    is not the composition's. Empty when the target loads."""
    refused = check_with_llama(target.name, mtp=False, trunk=False)
    if refused.loaded or refused.crashed is not None:
        return ""
    return f"; the target {target.name} is refused by this llama.cpp too: {refused.error or 'load failed'}"


# ---------------------------------------------------------------------------------------------- verify


def verify(
    composite: str | os.PathLike[str],
    *,
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | None = None,
    llama: bool | None = None,
    progress: bool = True,
    allow_kv: Iterable[str] = (),
    acceptance: bool = False,
    floor: float = DEFAULT_FLOOR,
) -> VerifyReport:
    """Check a composite GGUF (one file or any shard of a split set), or an MTP-only draft, and report each check.

    Args:
        composite: the composite (a local path; a ``hf://`` file gets the header checks only); or an
            MTP-only file (a ``--standalone`` sidecar, a bare draft), which is checked as a draft:
            structure, NextN blocks, global tensors, and llama.cpp loads a sidecar and runs its MTP steps.
        target: the model the composite was made from: every one of its tensors must be in the
            composite with identical bytes, and its KVs unchanged except ``{arch}.block_count``,
            ``{arch}.nextn_predict_layers``, the per-layer arrays (extended; the trunk's entries
            equal) and ``split.tensors.count``. For a draft: the model it runs beside, which it must fit
            (architecture, width, ``token_embd``/``output`` shapes, vocabulary).
        draft: the MTP draft: every one of its block tensors must be in the composite (``blk.0``
            renamed to ``blk.N``), bytes identical; or a whole model with NextN blocks (a graft
            source): then its NextN blocks' tensors. Not for a draft.
        llama: load the file with llama.cpp and run the MTP decode steps: ``True`` (fail when
            llama-cpp-python is missing), ``False`` (skip), ``None`` (when installed).
        progress: a progress bar over the bytes compared (stderr, only on a terminal).
        allow_kv: further keys the composite may change or add (e.g. ``--set-kv`` keys of compose).
        acceptance: also predict the head's acceptance (``accept``, n-max 1, built-in prompts) and fail below
            ``floor`` (:mod:`gguf_mtp.check.acceptance_floor`). A sidecar needs ``target`` for it.
        floor: the lowest acceptance that passes, from 0 to 1.

    Returns:
        A :class:`VerifyReport`; ``.ok`` is true when no check failed; ``.kind`` says whether the file was
        checked as a model or as an MTP-only draft.

    Raises:
        BadGGUFError: ``composite`` does not exist or a file of it is not a readable GGUF (no check runs, nor
            llama.cpp), or ``target``/``draft`` is unreadable.
        ParameterError: ``draft`` is given for an MTP-only file; ``acceptance`` for a model without a tokenizer.
        ShardSetError: ``target``/``draft`` is an inconsistent split set.
        HubError: a remote composite could not be reached.
    """
    started = time.perf_counter()
    if not 0.0 <= floor <= 1.0:
        raise ParameterError(f"floor {floor:g}: give an acceptance from 0 to 1", parameter="floor")
    if is_hub_path(composite) and (target is not None or draft is not None):
        raise BadGGUFError("comparing bytes with --target/--draft needs the composite on disk", str(composite))
    model = scan_model(composite)
    model.require_readable_headers()  # a file that is not a GGUF: one line, as inspect and compose say it
    report = VerifyReport(
        composite=str(composite),
        target=os.fspath(target) if target is not None else None,
        draft=os.fspath(draft) if draft is not None else None,
    )
    layout, layout_error = _layout(model)
    measured = target if _is_draft(model, layout) else composite  # a draft's head runs beside its target
    if acceptance and measured is not None and not model.remote:
        refuse_unmeasurable(measured)
    journal = pending_journal(shard.name for shard in model.shards) if not model.remote else None
    if journal is not None:  # listed only when it fails: a set on disk is committed unless a journal says not
        report.checks.append(Check("committed", False, uncommitted_line(str(journal))))
    if _is_draft(model, layout):
        if draft is not None:
            raise ParameterError(
                "draft compares a composite with the draft it was made from, but this file is itself an MTP draft "
                "(to check it beside its model, give that as target)",
                model.shards[0].name,
                parameter=("draft", "target"),
            )
        report.kind = "mtp-draft"
        target_set = open_model(target) if target is not None else None
        report.checks += _structural_checks(model, layout, layout_error)
        report.checks.append(_nextn_check(model, layout, layout_error))
        report.sidecar = _draft_checks(report, model, target_set)
        llama_check, report.llama = _llama_check(model, layout, llama, draft=True, sidecar=report.sidecar,
                                                 target=target_set)
        report.checks.append(llama_check)
        if acceptance:
            report.checks.append(_acceptance_check(report, llama_check, floor))
        report.seconds = time.perf_counter() - started
        return report

    target_set = open_model(target) if target is not None else None
    draft_set = open_model(draft) if draft is not None else None
    report.checks += _structural_checks(model, layout, layout_error)

    block = target_set.block_count if target_set is not None else (layout.trunk if layout else 0)
    renames, dropped = _draft_renames(draft_set, block) if draft_set is not None else ({}, [])
    report.checks.append(_nextn_check(model, layout, layout_error, renames.values()))

    if target_set is not None or draft_set is not None:
        report.checks += _byte_checks(report, model, target_set, draft_set, renames, dropped, progress)
    if target_set is not None:
        metadata, hint = _metadata_check(target_set, model, layout, allow_kv)
        report.checks.append(metadata)
        report.hints += [hint] if hint else []

    llama_check, report.llama = _llama_check(model, layout, llama, target=target_set)
    report.checks.append(llama_check)
    if acceptance:
        report.checks.append(_acceptance_check(report, llama_check, floor))
    report.seconds = time.perf_counter() - started
    return report


def _acceptance_check(report: VerifyReport, llama_check: Check, floor: float) -> Check:
    """The ``acceptance`` check: the predicted n-max 1 acceptance against ``floor`` (a composite; a sidecar beside
    its ``target``), after the llama.cpp check passed."""
    name = "acceptance"
    if llama_check.ok is not True:
        return Check(name, False, "not run: the llama.cpp check did not pass")
    if report.kind == "mtp-draft":
        if not report.sidecar or report.target is None:
            return Check(name, False, "a draft's acceptance is measured beside its model: give it as --target")
        ok, detail = acceptance_verdict(report.target, draft=report.composite, floor=floor)
    else:
        ok, detail = acceptance_verdict(report.composite, floor=floor)
    return Check(name, ok, detail)


def _is_draft(model: ScannedModel, layout: _Layout | None) -> bool:
    """Whether the file is MTP-only (NextN block tensors, none of a trunk block): a draft, not a model."""
    if layout is None:
        return False
    blocks = block_indices(t.name for h in model.headers for t in h.tensors)
    return is_mtp_only(BlockLayout(layout.arch, layout.block_count, layout.nextn), blocks)


def _draft_checks(report: VerifyReport, model: ScannedModel, target: ShardSet | None) -> bool:
    """Append a draft's own checks (its global tensors; with ``target``, its fit to it); whether it is a sidecar
    llama.cpp can load beside its target."""
    first = model.first
    assert first is not None  # a layout was read from it
    found = draft_globals_check(first, model.headers)
    report.checks.append(_check("draft globals", list(found.problems), found.detail))
    if target is not None:
        problems, matched = target_fit_check(target, first, model.headers)
        report.checks.append(_check("target fit", problems, matched))
    return found.sidecar


def _byte_checks(
    report: VerifyReport,
    model: ScannedModel,
    target: ShardSet | None,
    draft: ShardSet | None,
    renames: dict[str, str],
    dropped: list[str],
    progress: bool,
) -> list[Check]:
    composite = _locations(model)
    total = 0
    if target is not None:
        total += 2 * sum(t.nbytes for _, t in target.iter_tensors())
    if draft is not None:
        total += 2 * sum(t.nbytes for _, t in draft.iter_tensors() if t.name in renames)
    checks = []
    with progress_bar(total, "verify", enabled=progress) as bar:
        if target is not None:
            result = _compare_tensors(target, composite, None, bar.update)
            report.bytes_compared += result.nbytes
            report.bytes_shared += result.shared
            checks.append(
                _check(
                    "target tensors",
                    result.problems("target"),
                    f"all {result.compared} target tensors ({result.nbytes:,} bytes) identical in the composite"
                    + result.sharing("target"),
                )
            )
        if draft is not None:
            result = _compare_tensors(draft, composite, renames, bar.update)
            report.bytes_compared += result.nbytes
            report.bytes_shared += result.shared
            left_out = f"; left out {', '.join(dropped)} (the composite uses the target's)" if dropped else ""
            blocks = sorted({int(m["block"]) for name in renames.values() if (m := BLOCK_TENSOR.match(name))})
            where = (f" as blk.{blocks[0]}" + (f"-{blocks[-1]}" if len(blocks) > 1 else "")) if blocks else ""
            checks.append(
                _check(
                    "draft tensors",
                    result.problems("draft"),
                    f"all {result.compared} draft block tensors ({result.nbytes:,} bytes) identical{where}"
                    + result.sharing("draft")
                    + left_out,
                )
            )
    return checks


def _allow_kv_hint(keys: Sequence[str]) -> str:
    """What to pass when the changed keys were set on purpose (compose --set-kv)."""
    flags = " ".join(f"--allow-kv {key}" for key in keys[:_SHOWN])
    more = f" (and {len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
    return f"if compose --set-kv changed {', '.join(keys[:_SHOWN])}{more} on purpose, pass {flags}{more}"


def _metadata_check(
    target: ShardSet, model: ScannedModel, layout: _Layout | None, allow_kv: Iterable[str]
) -> tuple[Check, str | None]:
    """The target-metadata check, and a hint naming ``--allow-kv`` when keys a ``--set-kv`` could set differ."""
    try:
        # tensors the composite has and the target has not: what compose added to split.tensors.count
        added = len({t.name for h in model.headers for t in h.tensors} - set(target.tensor_locations))
        # gguf_mtp.pad may come and go: it only places the data section (gguf_mtp.format.layout)
        problems, changes, settable = _kv_problems(target, model, layout, added, {*allow_kv, PAD_KEY, SET_ID_KEY})
    except GGUFMTPError as e:
        return Check("target metadata", False, str(e)), None
    compared = [h for h, shard in zip(target.headers, model.shards) if shard.header is not None]
    n_kvs = sum(len(h.kvs) for h in compared)
    where = "" if len(compared) == len(target.headers) else f" of the {len(compared)} readable shard(s)"
    check = _check(
        "target metadata",
        problems,
        f"all {n_kvs} target KVs{where} unchanged" + (f" except {', '.join(changes)}" if changes else ""),
    )
    return check, _allow_kv_hint(settable) if settable else None
