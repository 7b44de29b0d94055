"""``gguf-mtp pipeline``: Hub target + MTP head -> draft -> composite -> verify -> publish, resumable.

One subject, one module per part: the run itself (:mod:`.run`), each stage a record run by one reuse-or-run
skeleton (:mod:`.stage`), its options (:mod:`.options`), its dry-run plan (:mod:`.plan`), its report (:mod:`.report`),
the choice of the target's files, on the Hub or in a mounted folder (:mod:`.target`), the disk check before the
first byte (:mod:`.disk`), the state file, written and read back checked (:mod:`.state`) and the sources pinned to
their commits, compared with the published card's by ``--if-changed`` (:mod:`.sources`).
The public names below are imported on first use (PEP 562), so importing one part does not import the run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .options import PipelineOptions
    from .plan import plan_pipeline
    from .report import PipelineReport, StageResult
    from .run import run_pipeline
    from .state import LOCK_NAME, STATE_FORMAT, STATE_NAME
    from .target import basename_of, select_target_files, target_listing

#: Public name -> the module of this package that defines it.
_LAZY: dict[str, str] = {
    "run_pipeline": "run",
    "PipelineOptions": "options",
    "plan_pipeline": "plan",
    "PipelineReport": "report",
    "StageResult": "report",
    "LOCK_NAME": "state",
    "STATE_FORMAT": "state",
    "STATE_NAME": "state",
    "basename_of": "target",
    "select_target_files": "target",
    "target_listing": "target",
}

__all__ = [
    "LOCK_NAME",
    "STATE_FORMAT",
    "STATE_NAME",
    "PipelineOptions",
    "PipelineReport",
    "StageResult",
    "basename_of",
    "plan_pipeline",
    "run_pipeline",
    "select_target_files",
    "target_listing",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
