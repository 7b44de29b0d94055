"""``sidecars``: a head written as the set of MTP-only sidecars llama.cpp's ``-hf`` pairs with trunks by name.

Each member is the standalone sidecar ``extract --standalone`` writes (:func:`gguf_mtp.jobs.extract.plan_extraction`)
with the NextN block and ``token_embd``/``output`` in the member's type, as ``llama-quantize --pure TYPE`` writes the
whole file (norms and 1-D tensors keep theirs), and is named as llama.cpp's converter names an MTP-only file,
``mtp-<Name>-<TYPE>.gguf`` (:func:`gguf_mtp.model.sidecar_names.sidecar_file_name`). The default set is the one
ggml-org ships: the head's own float type (BF16 for a converted head), Q8_0 and Q4_0. Every file is planned before
the first byte is written, and the set appears at once or not at all (:func:`gguf_mtp.jobs.runner.run_write`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGMLQuantizationType, Keys

from gguf_mtp.errors import BadGGUFError, ParameterError
from gguf_mtp.files.plan import OutputFile
from gguf_mtp.format.quant_rules import HEAD_TYPE_FILE_TYPES
from gguf_mtp.jobs.extract import ExtractionPlan, find_nextn_blocks, plan_extraction
from gguf_mtp.jobs.head_type import low_bit_warning, parse_outtype, summarize_head
from gguf_mtp.jobs.runner import WriteReport, run_write
from gguf_mtp.model.shards import ShardSet, open_model
from gguf_mtp.model.sidecar_names import sidecar_file_name
from gguf_mtp.text import human_bytes

__all__ = ["SET_TYPES", "SidecarMember", "SidecarSetPlan", "SidecarSetReport", "plan_sidecar_set", "write_sidecar_set"]

#: The quantized members of ggml-org's sidecar sets (``llama-quantize`` to Q8_0, ``--pure`` Q4_0), after the
#: head's own float type.
SET_TYPES: tuple[GGMLQuantizationType, ...] = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0)
_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
#: The metadata the converter's name is made of (``general.*``).
_NAME_KEYS = {"name": Keys.General.NAME, "basename": Keys.General.BASENAME, "finetune": Keys.General.FINETUNE,
              "version": Keys.General.VERSION}
#: A file name's limit on Linux filesystems (bytes).
_NAME_MAX = 255


@dataclass(frozen=True)
class SidecarMember:
    """One file of the set: its type, the label its name carries (``Q8_0``, ``Q4_K_M``) and its extraction plan."""

    qtype: GGMLQuantizationType
    label: str
    plan: ExtractionPlan

    def to_dict(self) -> dict[str, Any]:
        written = self.plan.header.tensor_by_name
        return {"file": str(self.plan.path), "type": self.label, "bytes": self.plan.output.size,
                "head": self.plan.head.to_dict(),
                "embeddings": {name: written[name].type_name for name in ("token_embd.weight", "output.weight")
                               if name in written}}


@dataclass(frozen=True)
class SidecarSetPlan:
    """Every file the set will hold, planned before any is written."""

    source: ShardSet
    folder: Path
    members: tuple[SidecarMember, ...]

    @property
    def outputs(self) -> list[OutputFile]:
        return [member.plan.output for member in self.members]


def type_label(qtype: GGMLQuantizationType) -> str:
    """The type as a file name carries it: the llama file type's name after ``MOSTLY_``/``ALL_`` (llama.cpp's
    converter's ``ftype.name.partition("_")[2]``: ``BF16``, ``Q8_0``, ``Q4_K_M``)."""
    return HEAD_TYPE_FILE_TYPES[qtype].name.partition("_")[2]


def default_set_types(source: ShardSet) -> tuple[list[GGMLQuantizationType], list[str]]:
    """(ggml-org's set for this head, notes): the head's own float type when every tensor of it is a float (a
    converted head: BF16, F16 or F32), then :data:`SET_TYPES`.

    A quantized (or mixed) head gets no 16-bit member: re-typed to BF16 it would be about twice the size of the Q8_0
    member and no more exact than its source."""
    head = summarize_head(t for _, t in find_nextn_blocks(source).tensors)
    floats = {t.name for t in _FLOAT_TYPES}
    if set(head.types) <= floats:
        return [GGMLQuantizationType[head.main_type], *SET_TYPES], []
    quantized = ", ".join(t for t in head.types if t not in floats)
    return list(SET_TYPES), [f"the head holds {quantized} tensors: no 16-bit member (--types bf16,q8_0,q4_0 "
                             "writes one)"]


def parse_set_types(types: str | Sequence[str]) -> list[GGMLQuantizationType]:
    """``"bf16,q8_0,q4_0"`` (or a list) as ggml types, each once.

    Raises:
        ParameterError: an unknown or importance-matrix type, a type named twice, or none.
    """
    wanted = [t for t in (parse_outtype(name, "types") for name in _listed(types)) if t is not None]
    if not wanted:
        raise ParameterError("types names no type: give e.g. bf16,q8_0,q4_0", parameter="types")
    twice = sorted({t.name for t in wanted if wanted.count(t) > 1})
    if twice:
        raise ParameterError(f"types names {', '.join(twice)} twice", parameter="types")
    return wanted


def _listed(items: str | Sequence[str]) -> list[str]:
    """The non-empty names of a comma-separated list (or of a list), stripped."""
    names = [n.strip() for n in (items.split(",") if isinstance(items, str) else items)]
    return [name for name in names if name]


def _model_name_parts(source: ShardSet) -> dict[str, str | None]:
    """``general.name``/``basename``/``finetune``/``version``, each a string or absent.

    Raises:
        BadGGUFError: one of them is not a string.
    """
    parts: dict[str, str | None] = {}
    for part, key in _NAME_KEYS.items():
        kv = source.kv(key)
        if kv is not None and not isinstance(kv.value, str):
            raise BadGGUFError(f"{key} is {kv.type_name}, not a string: give the sidecars' name with name", source.name)
        parts[part] = kv.value if kv is not None else None
    return parts


def _checked_file_name(file_name: str, source: ShardSet, name: str | None) -> str:
    """``file_name`` if it is one plain file name (no folder, no control character, within the filesystem's limit).

    Raises:
        ParameterError: ``name`` (given) makes no such file name.
        BadGGUFError: the model's ``general.*`` names make none (they are free text).
    """
    plain = ("/" not in file_name and not file_name.startswith(".") and file_name.isprintable()
             and len(file_name.encode("utf-8", "surrogateescape")) <= _NAME_MAX)
    if plain:
        return file_name
    if name is not None:
        raise ParameterError(f"name {name!r} makes {file_name!r}, not a plain file name", parameter="name")
    keys = ", ".join(_NAME_KEYS.values())
    raise BadGGUFError(f"the model's {keys} make {file_name!r}, not a plain file name: give the name with name",
                       source.name)


def sidecar_path(folder: Path, source: ShardSet, qtype: GGMLQuantizationType, name: str | None = None) -> Path:
    """Where the member of type ``qtype`` goes: ``folder/mtp-<Name>-<TYPE>.gguf``, ``<Name>`` from the model's
    metadata as llama.cpp's converter derives it, or ``name`` in its place."""
    parts = {"name": None, "basename": name, "finetune": None, "version": None} if name else _model_name_parts(source)
    file_name = sidecar_file_name(**parts, type_label=type_label(qtype))
    return folder / _checked_file_name(file_name, source, name)


def plan_sidecar_set(
    source: ShardSet,
    folder: str | os.PathLike[str],
    *,
    types: str | Sequence[str] | None = None,
    name: str | None = None,
) -> tuple[SidecarSetPlan, list[str]]:
    """Plan the set (pure: reads no tensor data): (the plan, notes).

    Args:
        source: a model carrying NextN block(s) and ``token_embd``/``output_norm`` (a composite, a quant that shipped
            a head, or a sidecar such as ``convert --standalone`` writes).
        folder: where the files go.
        types: the members' types (``"bf16,q8_0,q4_0"``); ``None``: ggml-org's set (:func:`default_set_types`).
        name: the ``<Name>`` of ``mtp-<Name>-<TYPE>.gguf``; ``None``: from the model's ``general.*`` metadata.

    Raises:
        NoNextNBlockError, BadGGUFError: the source has no head, or cannot make a standalone sidecar.
        ParameterError: a bad type list, or a name that makes no plain file name.
    """
    wanted, notes = default_set_types(source) if types is None else (parse_set_types(types), [])
    out = Path(folder)
    members = []
    for qtype in wanted:
        path = sidecar_path(out, source, qtype, name)
        plan = plan_extraction(source, path, standalone=True, outtype=qtype, embd_type=qtype)
        members.append(SidecarMember(qtype, type_label(qtype), plan))
        warning = low_bit_warning(qtype)
        if warning:
            notes.append(warning)
    return SidecarSetPlan(source, out, tuple(members)), notes


@dataclass(kw_only=True)
class SidecarSetReport(WriteReport):
    """What a sidecars run wrote (or, with ``dry_run``, would write)."""

    plan: SidecarSetPlan

    def plan_lines(self) -> list[str]:
        """The source's head, then one line per file: its name, size, and the types of its head and embeddings."""
        plan = self.plan
        first = plan.members[0].plan
        lines = [f"source: {plan.source.arch}, {len(plan.source.headers)} file(s), NextN block(s) "
                 f"{first.nextn.describe()}; {len(plan.members)} sidecar(s) named for llama-server -hf"]
        for member in plan.members:
            info = member.to_dict()
            embeddings = ", ".join(f"{n.removesuffix('.weight')} {t}" for n, t in info["embeddings"].items())
            lines.append(f"{self.action(member.plan.path)} {member.plan.path} ({human_bytes(info['bytes'])}; "
                         f"{member.plan.head.describe()}; {embeddings})")
        lines.extend(f"    note: {n}" for n in self.notes)
        return lines

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable view (the ``--json`` report)."""
        plan = self.plan
        return {"command": "sidecars", "dry_run": self.dry_run, "source": [str(p) for p in plan.source.paths],
                "architecture": plan.source.arch, "folder": str(plan.folder),
                "files": [m.to_dict() for m in plan.members], "bytes_to_write": sum(f.size for f in plan.outputs),
                **self.write_fields()}


def write_sidecar_set(
    source: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    *,
    types: str | Sequence[str] | None = None,
    name: str | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: bool = True,
    on_plan: Callable[[WriteReport], None] | None = None,
) -> SidecarSetReport:
    """Write ``source``'s head as a set of MTP-only sidecars ``mtp-<Name>-<TYPE>.gguf`` in ``folder``, one per type.

    Args:
        source: a GGUF carrying NextN block(s): one file or any shard of a ``<prefix>-NNNNN-of-NNNNN.gguf`` set.
        folder: the output folder (made if missing).
        types: the types (``"bf16,q8_0,q4_0"``; any ``--outtype`` type); ``None``: ggml-org's set, the head's own
            float type (when it has one), Q8_0 and Q4_0. Each file is what ``llama-quantize --pure TYPE`` writes.
        name: the ``<Name>`` part; ``None``: from ``general.basename``/``name``, ``finetune`` and ``version``.
        force: replace existing files of those names (never an input).
        dry_run: plan and check only; write nothing.
        progress: show a progress bar on stderr when it is a terminal.
        on_plan: called with the report before the first byte is written.

    Returns:
        A :class:`SidecarSetReport`.

    Raises:
        NoNextNBlockError, BadGGUFError, ShardSetError: the source has no usable head or is malformed.
        ParameterError: a bad type list or name.
        UnsafeOutputError: a file exists (without ``force``), is an input, or cannot be written.
        OutputWriteError: writing failed; nothing was left behind.

    Example:
        >>> write_sidecar_set("mtp-Qwen3.6-27B-BF16.gguf", "sidecars/")  # doctest: +SKIP
    """

    def prepare() -> tuple[SidecarSetReport, list[OutputFile], list[Path]]:
        model = open_model(source)
        plan, notes = plan_sidecar_set(model, folder, types=types, name=name)
        return SidecarSetReport(plan=plan, dry_run=dry_run, notes=notes), plan.outputs, model.paths

    return run_write(prepare, desc="sidecars", force=force, progress=progress, on_plan=on_plan, output_dir=folder)
