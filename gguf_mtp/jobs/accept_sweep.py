"""``gguf-mtp accept --outtypes q8_0,q6_k,...``: the head's type chosen by measurement.

For each type, the NextN block is re-typed through the ``--outtype`` quantizer of ``extract`` (exactly as
``llama-quantize --pure`` would write it) into a temporary MTP-only sidecar (the model's NextN tensors, its
``token_embd``/``output_norm``/``output``; a few hundred MiB at most, never the trunk), and ``accept`` predicts the
acceptance of the model with that sidecar as its drafter (llama.cpp skips the model's own NextN block when it is
given a drafter, so a composite serves as the trunk). The head as stored is measured the same way, first. The
recommendation is the smallest type whose acceptance is within one point (0.01) of the best.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.check.accept import AcceptReport, accept
from gguf_mtp.errors import ParameterError
from gguf_mtp.model.shards import open_model

from .extract import extract
from .head_type import parse_outtype

__all__ = ["TOLERANCE", "TypeRow", "TypeSweep", "sweep_head_types"]

#: Types within this much acceptance of the best count as good as it.
TOLERANCE = 0.01


@dataclass(frozen=True)
class TypeRow:
    """One head type: the NextN block's bytes in it, and the prediction with it."""

    outtype: str  #: a type name, or "as stored"
    head_bytes: int
    report: AcceptReport

    @property
    def acceptance(self) -> float | None:
        """The predicted acceptance at the smallest n-max asked."""
        return self.report.runs[0].acceptance if self.report.runs else None

    def to_dict(self) -> dict[str, Any]:
        return {"outtype": self.outtype, "head_bytes": self.head_bytes, "acceptance": self.acceptance,
                "runs": self.report.to_dict()["runs"]}


@dataclass(frozen=True)
class TypeSweep:
    """Every type measured, and the recommendation."""

    model: str
    draft: str | None
    rows: tuple[TypeRow, ...]

    @property
    def recommended(self) -> str | None:
        """The smallest re-typed head within :data:`TOLERANCE` of the best acceptance (``None``: nothing drafted)."""
        typed = [r for r in self.rows if r.outtype != "as stored" and r.acceptance is not None]
        if not typed:
            return None
        best = max(r.acceptance for r in typed if r.acceptance is not None)
        good = [r for r in typed if r.acceptance is not None and r.acceptance >= best - TOLERANCE]
        return min(good, key=lambda r: r.head_bytes).outtype

    @property
    def llama_cpp_build(self) -> str | None:
        """The llama.cpp that predicted (every row's child ran the same)."""
        return self.rows[0].report.llama_cpp_build if self.rows else None

    def to_dict(self) -> dict[str, Any]:
        return {"command": "accept", "model": self.model, "draft": self.draft, "llama_cpp_build": self.llama_cpp_build,
                "outtypes": [r.to_dict() for r in self.rows], "recommended_outtype": self.recommended}

    def describe(self) -> list[str]:
        n_max = self.rows[0].report.runs[0].n_max if self.rows and self.rows[0].report.runs else 1
        lines = [f"head types for {self.model}" + (f" with {self.draft}" if self.draft else "")
                 + f" (predicted acceptance at n-max {n_max}, with {self.llama_cpp_build or 'an unnamed llama.cpp'}):"]
        for r in self.rows:
            acc = f"{r.acceptance:.3f}" if r.acceptance is not None else "-"
            lines.append(f"  {r.outtype:<10} {r.head_bytes:>14,} bytes  acceptance {acc}")
        rec = self.recommended
        lines.append(f"recommended: --outtype {rec} (the smallest within {TOLERANCE:.2f} of the best)"
                     if rec else "nothing was drafted: no recommendation")
        return lines


def _head_bytes(path: str | os.PathLike[str]) -> int:
    sidecar = open_model(path)
    return sum(t.nbytes for _, t in sidecar.head_tensors())


def sweep_head_types(
    model: str | os.PathLike[str],
    outtypes: Sequence[str],
    *,
    draft: str | os.PathLike[str] | None = None,
    **accept_args: Any,
) -> TypeSweep:
    """Predict the acceptance of ``model``'s head (or of the sidecar ``draft``'s) re-typed to each of ``outtypes``.

    Args:
        model: a composite, or the trunk of ``draft``.
        outtypes: head types (``q8_0``, ``q6_k``, ``q4_k``, ``q4_0``...), as ``--outtype`` takes them.
        draft: an MTP-only sidecar: its head is the one re-typed.
        accept_args: passed to :func:`gguf_mtp.check.accept.accept` (prompts, tokens, n_max, threads...).

    Raises:
        ParameterError: an unknown type, or none given; and whatever ``accept`` and ``extract`` raise.
    """
    if not outtypes:
        raise ParameterError("outtypes: give one or more head types", parameter="outtypes")
    for name in outtypes:
        parse_outtype(name)  # one line for an unknown type, before anything runs
    source = draft if draft is not None else model
    rows = []
    with tempfile.TemporaryDirectory(prefix="gguf-mtp-accept-") as tmp:
        stored = Path(tmp) / "as-stored.gguf"
        extract(source, stored, standalone=True, progress=False)
        rows.append(TypeRow("as stored", _head_bytes(stored), accept(model, draft=stored, **accept_args)))
        stored.unlink()
        for name in outtypes:
            sidecar = Path(tmp) / f"{name}.gguf"
            extract(source, sidecar, standalone=True, outtype=name, progress=False)
            rows.append(TypeRow(name.lower(), _head_bytes(sidecar), accept(model, draft=sidecar, **accept_args)))
            sidecar.unlink()
    return TypeSweep(os.fspath(model), None if draft is None else os.fspath(draft), tuple(rows))
