"""The KVs group: every target KV unchanged in the composite except those compose changes (``block_count``,
``nextn_predict_layers``, the per-layer arrays, extended with the trunk's entries equal, ``split.tensors.count``),
those ``--allow-kv`` names, and gguf-mtp's own bookkeeping keys; with a hint naming ``--allow-kv`` when keys a
``compose --set-kv`` could have set differ."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gguf_mtp.constants import (
    KEY_BLOCK_COUNT,
    KEY_NEXTN_PREDICT_LAYERS,
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
)
from gguf_mtp.errors import GGUFMTPError
from gguf_mtp.format.header import GGUFHeader, KeyValue
from gguf_mtp.format.layout import PAD_KEY
from gguf_mtp.model.blocks import BlockLayout, per_layer_keys
from gguf_mtp.model.set_id import SET_ID_KEY
from gguf_mtp.model.shard_scan import ScannedModel
from gguf_mtp.model.shards import ShardSet
from gguf_mtp.text import short, short_change

from .report import SHOWN, Check, VerifyReport, check_from
from .subject import Subject

__all__ = ["metadata_group"]


def metadata_group(subject: Subject, report: VerifyReport) -> None:
    """The ``target metadata`` check of a model verified against its target (a draft has no target KVs to keep)."""
    if subject.is_draft or subject.target is None:
        return
    check, hint = _metadata_check(subject.target, subject.model, subject.layout, subject.options.allow_kv)
    report.checks.append(check)
    report.hints += [hint] if hint else []


def _metadata_check(
    target: ShardSet, model: ScannedModel, layout: BlockLayout | None, allow_kv: Iterable[str]
) -> tuple[Check, str | None]:
    """The target-metadata check, and a hint naming ``--allow-kv`` when keys a ``--set-kv`` could set differ."""
    try:
        # tensors the composite has and the target has not: what compose added to split.tensors.count
        added = len({t.name for h in model.headers for t in h.tensors} - set(target.tensor_locations))
        # gguf_mtp.pad may come and go: it only places the data section (gguf_mtp.format.layout)
        tally = _compare_target_kvs(target, model, layout, added, {*allow_kv, PAD_KEY, SET_ID_KEY})
    except GGUFMTPError as e:
        return Check("target metadata", False, str(e)), None
    compared = [h for h, shard in zip(target.headers, model.shards) if shard.header is not None]
    n_kvs = sum(len(h.kvs) for h in compared)
    where = "" if len(compared) == len(target.headers) else f" of the {len(compared)} readable shard(s)"
    check = check_from(
        "target metadata",
        tally.problems,
        f"all {n_kvs} target KVs{where} unchanged" + (f" except {', '.join(tally.changes)}" if tally.changes else ""),
    )
    return check, _allow_kv_hint(tally.settable) if tally.settable else None


def _allow_kv_hint(keys: Sequence[str]) -> str:
    """What to pass when the changed keys were set on purpose (compose --set-kv)."""
    flags = " ".join(f"--allow-kv {key}" for key in keys[:SHOWN])
    more = f" (and {len(keys) - SHOWN} more)" if len(keys) > SHOWN else ""
    return f"if compose --set-kv changed {', '.join(keys[:SHOWN])}{more} on purpose, pass {flags}{more}"


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


@dataclass
class _KVTally:
    """What comparing the KVs found."""

    problems: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # changes compose (or --allow-kv) accounts for, listed
    #: changed or added keys compose does not manage: allow_kv would accept them
    settable: list[str] = field(default_factory=list)

    def add_settable(self, key: str) -> None:
        if key not in self.settable:
            self.settable.append(key)


def _compare_target_kvs(
    target: ShardSet, model: ScannedModel, layout: BlockLayout | None, added: int, allowed: set[str]
) -> _KVTally:
    """Every target KV compared with the composite's, shard by shard."""
    tally = _KVTally()
    pairs = list(zip(target.headers, model.shards))
    if len(model.shards) != len(target.headers):
        # re-sharded after compose (llama-gguf-split --merge / --split): the split.* keys describe the new
        # files, every other KV is compared with the target's first shard (gguf-split keeps them in shard 1)
        tally.changes.append(f"re-sharded: {len(target.headers)} -> {len(model.shards)} file(s)")
        allowed = allowed | {KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT}
        pairs = pairs[:1]
    rules = _kv_rules(target, layout, added, allowed)
    for index, (old_header, shard) in enumerate(pairs):
        if shard.header is not None:  # else "files" already fails
            where = "" if index == 0 else f" in {shard.label}"
            _compare_kvs(rules, old_header, shard.header, index, where, tally)
    return tally


def _kv_rules(target: ShardSet, layout: BlockLayout | None, added: int, allowed: set[str]) -> _KVRules:
    nextn = layout.nextn if layout else 0
    return _KVRules(
        allowed=frozenset(allowed),
        count_key=KEY_BLOCK_COUNT.format(arch=target.arch),
        nextn_key=KEY_NEXTN_PREDICT_LAYERS.format(arch=target.arch),
        per_layer=frozenset(kv.key for kv in per_layer_keys(target.first, target.arch, target.block_count)),
        block_count=target.block_count + nextn,
        nextn=nextn,
        added_tensors=added,
        layout_blocks=layout.block_count if layout else None,
    )


def _compare_kvs(
    rules: _KVRules, old_header: GGUFHeader, new_header: GGUFHeader, index: int, where: str, tally: _KVTally
) -> None:
    """The target's file ``index`` against the composite's: its KVs kept, changed or removed, and the keys added."""
    for key, old in old_header.kvs.items():
        problem, change = _kv_difference(rules, key, old, new_header.kvs.get(key), index, where)
        if problem:
            tally.problems.append(problem)
            if problem.startswith(f"{key}{where} changed:"):
                tally.add_settable(key)
        if change:
            tally.changes.append(change)
    for key, new in new_header.kvs.items():
        if key not in old_header.kvs:
            _added_kv(rules, key, new, index, where, tally)


def _added_kv(rules: _KVRules, key: str, new: KeyValue, index: int, where: str, tally: _KVTally) -> None:
    if key in rules.allowed:
        if not _bookkeeping(key):
            tally.changes.append(f"{key}{where} = {short(new.value, 40)} (added)")
    elif key == rules.nextn_key and index == 0:
        tally.changes.append(f"{key.split('.', 1)[1]} = {new.value}")
    else:
        tally.problems.append(f"{key}{where} was added ({_show(new)})")
        tally.add_settable(key)


def _kv_difference(
    rules: _KVRules, key: str, old: KeyValue, new: KeyValue | None, index: int, where: str
) -> tuple[str | None, str | None]:
    """(problem, change) for one target KV and its counterpart in the composite's file ``index``."""
    if key in rules.allowed:
        return None, _allowed_change(key, old, new, where)
    if new is None:
        return f"{key}{where} was removed", None
    managed = _managed_difference(rules, key, old, new, index, where)
    if managed is not None:
        return managed
    if new.raw != old.raw:
        return f"{key}{where} changed: {_show(old)} -> {_show(new)}", None
    return None, None


def _allowed_change(key: str, old: KeyValue, new: KeyValue | None, where: str) -> str | None:
    """How a key the composite may change did change (listed, never a problem); bookkeeping keys go unlisted."""
    if _bookkeeping(key) or (new is not None and new.raw == old.raw):
        return None
    value = "removed" if new is None else short_change(old.value, new.value, 40)
    return f"{key}{where} {value}"


def _managed_difference(
    rules: _KVRules, key: str, old: KeyValue, new: KeyValue, index: int, where: str
) -> tuple[str | None, str | None] | None:
    """(problem, change) for a key compose sets in the composite's file ``index``; None for any other key."""
    if key == rules.count_key and index == 0:
        return _int_difference(key, old, new, rules.block_count, key.split(".", 1)[1])
    if key == rules.nextn_key and index == 0:  # a target may state 0 explicitly
        return _int_difference(key, old, new, rules.nextn, key.split(".", 1)[1])
    if key == KEY_SPLIT_TENSORS_COUNT:
        problem, change = _int_difference(key + where, old, new, old.value + rules.added_tensors, key)
        return problem, change if index == 0 else None
    if key in rules.per_layer and index == 0:
        return _per_layer_difference(key, old, new, rules.layout_blocks)
    return None


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
