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
    """The options of one pipeline run: the keyword arguments of :func:`~gguf_mtp.release.pipeline.run_pipeline`.

    Attributes:
        target_repo: the Hub repo of the target quant (``unsloth/NVIDIA-Nemotron-3-Super-120B-A12B-GGUF``).
        target_files: which model in it: ``DIR/NAME-*-of-*.gguf``, one shard's name, or a single file's name.
        head_repo: the MTP head checkpoint: a Hub repo id, or a local folder.
        out_repo: publish the composite there (``OWNER/NAME``); without it the run ends after verify.
        work_dir: folder for the state file, the draft and the composite (created if missing).
        keep: after a successful publish, keep the draft and the composite (default: remove them).
        force: use a non-empty ``work_dir`` that no pipeline made (its ``draft/`` and ``composite/`` are
            replaced); without it such a folder is refused, and a new or empty one gets the marker
            :data:`gguf_mtp.files.workdir.MARKER_NAME`.
        target_revision, head_revision: revisions to download (default: the main branch).
        target_dir: read the target from this folder, laid out like ``target_repo`` (its root: the repo
            mounted read-only in a Hugging Face Job, or a local copy), instead of downloading it; the folder is
            never written to. Online, its files are checked against the Hub's record of ``target_repo`` at
            ``target_revision`` (present, same size, same sha256): another repo or revision is refused.
        out_revision: the branch to publish to.
        private: create ``out_repo`` private.
        replace_readme: replace ``out_repo``'s ``README.md`` even when gguf-mtp did not write it (checked
            before any download: :func:`gguf_mtp.release.publish.check_card_replaceable`).
        basename: the composite's file prefix (default: the target's prefix + ``-MTP``).
        outtype: the draft's matrix type (any of convert's: ``q8_0``, ``q4_k``...; default: the head's).
        cache_dir: the Hub cache for the target (default: huggingface_hub's, ``HF_HOME``/``HF_HUB_CACHE``).
        llama: load the composite with llama.cpp in verify (default: when installed).
        progress: progress bars on stderr.
        dry_run: only say what a run would download (the files and sizes the Hub lists), convert, write
            and upload, and the disk it needs; nothing is written, not even the work folder (see
            :func:`~gguf_mtp.release.pipeline.plan_pipeline`).
        if_changed: first compare the head's and the target's commits, the llama.cpp build verify would run
            against and the gguf-mtp version with what ``out_repo``'s card records; when none moved, stop there
            (nothing downloaded or written: the report says so in one line), else make again what the moves
            affect (:mod:`gguf_mtp.release.pipeline.sources`). Needs ``out_repo`` and a Hub head.
    """

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
