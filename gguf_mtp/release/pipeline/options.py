"""What a pipeline run was asked to do: one frozen object, built once and handed to every stage.

The command line builds it from its flags (:func:`gguf_mtp.cli.pipeline.pipeline_options`);
:func:`~gguf_mtp.release.pipeline.run_pipeline` builds it from its keyword arguments. Below them, the run, its
dry-run plan and its disk check read the fields they need from it instead of taking each one as a keyword.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PipelineOptions"]


@dataclass(frozen=True, kw_only=True)
class PipelineOptions:
    """The options of one pipeline run (see :func:`~gguf_mtp.release.pipeline.run_pipeline` for each field)."""

    target_repo: str
    target_files: str
    head_repo: str
    work_dir: Path
    out_repo: str | None = None
    keep: bool = False
    force: bool = False
    target_revision: str | None = None
    target_dir: Path | None = None
    head_revision: str | None = None
    out_revision: str | None = None
    private: bool = False
    replace_readme: bool = False
    basename: str | None = None
    outtype: str | None = None
    cache_dir: str | os.PathLike[str] | None = None
    llama: bool | None = None
    progress: bool = True
    dry_run: bool = False
    if_changed: bool = False
