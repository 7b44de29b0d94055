"""The structure group: what the headers alone prove. Every shard present and readable, ``split.*`` right in
every shard, tensors named once, sized and placed as llama.cpp requires, per-layer arrays as long as
``block_count`` and trunk-length ones as long as the trunk (per :mod:`gguf_mtp.model.arch_rules`), every declared
NextN block complete; for an MTP-only draft also its global tensors and, with a target, its fit to that target
(:mod:`gguf_mtp.check.draft_checks`)."""

from __future__ import annotations

from collections.abc import Iterable

from gguf_mtp.constants import BLOCK_TENSOR, KEY_NEXTN_PREDICT_LAYERS
from gguf_mtp.model.arch_rules import nextn_graph_note
from gguf_mtp.model.blocks import BlockLayout, missing_nextn_tensors, per_layer_keys, per_layer_problems
from gguf_mtp.model.set_id import set_id_problems
from gguf_mtp.model.shard_scan import (
    ScannedModel,
    architecture_problems,
    data_problems,
    duplicate_tensor_problems,
    missing_shard_problems,
    split_key_problems,
    tensor_count_problems,
)
from gguf_mtp.model.shards import ShardSet

from ..draft_checks import draft_globals_check, target_fit_check
from .report import SHOWN, Check, VerifyReport, check_from
from .subject import Subject

__all__ = ["structure_group"]


def structure_group(subject: Subject, report: VerifyReport) -> None:
    """The header checks, the NextN blocks' completeness and, for a draft, its own checks."""
    model, layout, layout_error = subject.model, subject.layout, subject.layout_error
    report.checks += _file_checks(model)
    report.checks.append(_per_layer_check(model, layout, layout_error))
    report.checks.append(_nextn_check(model, layout, layout_error, subject.renames.values()))
    if subject.is_draft:
        report.sidecar = _draft_checks(report, model, subject.target)


def _file_checks(model: ScannedModel) -> list[Check]:
    n_files = model.count
    n_tensors = sum(len(h.tensors) for h in model.headers)
    tensor_bytes = sum(t.nbytes for h in model.headers for t in h.tensors)
    return [
        check_from("files", missing_shard_problems(model), f"{n_files} of {n_files} file(s) present and readable"),
        _split_keys_check(model),
        check_from(
            "split.tensors.count",
            tensor_count_problems(model),
            f"{n_tensors} in every shard, the number of tensors found" if model.is_split else "single file",
        ),
        check_from("tensor names", duplicate_tensor_problems(model), f"{n_tensors} tensors, no name twice"),
        check_from(
            "tensor data",
            data_problems(model),
            f"{n_tensors} tensors ({tensor_bytes:,} bytes) sized per GGML_QUANT_SIZES, packed and inside their files",
        ),
    ]


def _split_keys_check(model: ScannedModel) -> Check:
    n_files = model.count
    readable = "" if all(s.header is not None for s in model.shards) else "readable "
    return check_from(
        "split keys",
        split_key_problems(model) + architecture_problems(model)
        + set_id_problems([(s.label, s.header) for s in model.shards]),
        f"split.no 0..{n_files - 1} and split.count {n_files} in every {readable}shard"
        if model.is_split
        else "single file",
    )


def _per_layer_check(model: ScannedModel, layout: BlockLayout | None, layout_error: str | None) -> Check:
    if layout is None:
        return Check("per-layer arrays", False, layout_error or "no model metadata")
    first = model.first
    assert first is not None  # a layout was read from it
    arrays = per_layer_keys(first, layout.arch, layout.block_count)
    return check_from(
        "per-layer arrays",
        per_layer_problems(first, layout.arch, layout.block_count, layout.trunk),
        f"{len(arrays)} array(s) with {layout.block_count} entries (block_count)"
        + (f": {', '.join(kv.key.split('.', 1)[1] for kv in arrays)}" if arrays else ""),
    )


def _nextn_check(
    model: ScannedModel, layout: BlockLayout | None, layout_error: str | None, draft_names: Iterable[str]
) -> Check:
    """Every declared NextN block complete, every draft tensor present, no block beyond ``block_count``, and no
    more NextN blocks than the architecture's MTP graph takes."""
    if layout is None:
        return Check("NextN tensors", False, layout_error or "no model metadata")
    if layout.nextn == 0:
        nextn_key = KEY_NEXTN_PREDICT_LAYERS.format(arch=layout.arch)
        return Check("NextN tensors", False, f"{nextn_key} is 0 or missing: the file declares no NextN block")
    names = {t.name for h in model.headers for t in h.tensors}
    problems = _incomplete_blocks(names, layout) + _absent_draft_tensors(names, draft_names)
    problems += _stray_blocks(names, layout)
    graph_note = nextn_graph_note(layout.arch, layout.nextn)
    problems += [graph_note] if graph_note else []
    blocks = ", ".join(f"blk.{b}" for b in layout.nextn_blocks)
    per_block = sum(1 for n in names if n.startswith(f"blk.{layout.trunk}."))
    passed = f"{blocks} declared; {per_block} tensors incl. nextn.eh_proj/enorm/hnorm"
    return check_from("NextN tensors", problems, passed)


def _incomplete_blocks(names: set[str], layout: BlockLayout) -> list[str]:
    problems = []
    for block in layout.nextn_blocks:
        missing = missing_nextn_tensors(names, layout.arch, block)
        if missing:
            problems.append(f"blk.{block} lacks {', '.join(missing)}")
    return problems


def _absent_draft_tensors(names: set[str], draft_names: Iterable[str]) -> list[str]:
    absent = [n for n in draft_names if n not in names]
    return [f"draft tensor(s) not in the composite: {', '.join(absent[:SHOWN])}"] if absent else []


def _stray_blocks(names: set[str], layout: BlockLayout) -> list[str]:
    stray = sorted(
        {int(m["block"]) for n in names if (m := BLOCK_TENSOR.match(n)) and int(m["block"]) >= layout.block_count}
    )
    return [f"tensors of blk.{b}, beyond block_count {layout.block_count}" for b in stray]


def _draft_checks(report: VerifyReport, model: ScannedModel, target: ShardSet | None) -> bool:
    """Append a draft's own checks (its global tensors; with ``target``, its fit to it); whether it is a sidecar
    llama.cpp can load beside its target."""
    first = model.first
    assert first is not None  # a layout was read from it
    found = draft_globals_check(first, model.headers)
    report.checks.append(check_from("draft globals", list(found.problems), found.detail))
    if target is not None:
        problems, matched = target_fit_check(target, first, model.headers)
        report.checks.append(check_from("target fit", problems, matched))
    return found.sidecar
