"""``pipeline --dry-run``: what a run would download, convert, write and upload, and the disk it needs.

Read-only: the Hub is asked for the target repo's file list and the files' sizes (offline, the Hub cache
answers), the Hub cache for which files it already holds, and the work folder for its state file; with a target
folder (a mounted repo), the folder is listed instead. Nothing is created, not even the work folder; no write
access is asked for (that would create the repo). :func:`run_disk_need` is the same disk arithmetic a real run
checks before its first byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.constants import SPLIT_NAME
from gguf_mtp.files.workdir import claim_work_dir
from gguf_mtp.hub import access as hub_access
from gguf_mtp.hub import client as hub
from gguf_mtp.hub.hub_api import HubApi
from gguf_mtp.jobs.compose_plan import composite_file_names
from gguf_mtp.jobs.convert import draft_size_bound
from gguf_mtp.text import human_bytes

from .disk import DiskNeed, HeadNeed, disk_need
from .options import PipelineOptions
from .report import PipelineReport, StageResult
from .state import LOCK_NAME, STATE_FORMAT, STATE_NAME, load_stages
from .target import basename_of, select_folder_files, select_target_files, target_listing

__all__ = ["TargetFiles", "plan_pipeline", "run_disk_need", "target_files_of"]

_PLANNED = "planned"


def _target_sizes(
    api: HubApi, token: str | None, repo: str, names: list[str], revision: str | None, cached: dict[str, Path | None]
) -> dict[str, int | None]:
    """Each file's size: the Hub's record, or offline the cached copy's (``None`` when unknown)."""
    if hub_access.is_offline():
        return {n: (p.stat().st_size if (p := cached[n]) is not None else None) for n in names}
    remote = hub.remote_files(api, repo, names, token=token, revision=revision)
    return {n: (remote[n].size if n in remote else None) for n in names}


@dataclass(frozen=True)
class TargetFiles:
    """The target's files as a run will get them: their repo paths, sizes (``None``: unknown) and local copies
    (``None``: to download)."""

    names: list[str]
    sizes: dict[str, int | None]
    local: dict[str, Path | None]
    folder: Path | None  # the target folder they are read from (nothing is downloaded), or None

    @property
    def total(self) -> int | None:
        known = [s for s in self.sizes.values() if s is not None]
        return sum(known) if len(known) == len(self.names) else None

    @property
    def to_download(self) -> list[str]:
        return [n for n in self.names if self.local[n] is None]

    @property
    def download_bytes(self) -> int | None:
        sizes = [self.sizes[n] for n in self.to_download]
        return None if None in sizes else sum(s for s in sizes if s is not None)


def target_files_of(api: HubApi, token: str | None, options: PipelineOptions) -> TargetFiles:
    """Which target files a run reads (from ``target_dir``) and which it downloads, with their sizes (reads only).

    Raises:
        ShardSetError: ``target_files`` does not name exactly one complete model (of the repo, or of the folder).
        HubError: the Hub cannot be asked (and, offline, the cache does not hold the listing).
    """
    repo, pattern, revision, cache_dir = (
        options.target_repo, options.target_files, options.target_revision, options.cache_dir
    )
    folder = options.target_dir
    if folder is not None:
        names = select_folder_files(folder, pattern, repo)
        local: dict[str, Path | None] = {n: folder / n for n in names}
        return TargetFiles(names, {n: (folder / n).stat().st_size for n in names}, local, folder)
    names = select_target_files(target_listing(api, token, repo, pattern, revision, cache_dir), pattern)
    local = {n: hub.cached_file(repo, n, revision=revision, cache_dir=cache_dir) for n in names}
    return TargetFiles(names, _target_sizes(api, token, repo, names, revision, local), local, None)


def _disk_need(files: TargetFiles, cache_dir: str | os.PathLike[str] | None, work: Path,
               composite_done: bool, head: HeadNeed | None = None) -> DiskNeed | None:
    sizes, download = [files.sizes[n] for n in files.names], files.download_bytes
    if None in sizes or download is None:
        return None
    local = [p for p in files.local.values() if p is not None]
    return disk_need([s for s in sizes if s is not None], local=local, download=download,
                     cache=hub.cache_folder(cache_dir), work=work, head=head, composite_done=composite_done)


def run_disk_need(
    files: TargetFiles, options: PipelineOptions, *, head: Callable[[], HeadNeed], composite_done: bool
) -> DiskNeed | None:
    """The disk a run needs for the target's ``files`` (:func:`target_files_of`: downloads, the head's byte ranges,
    the draft and the composite; no download from ``target_dir``), or ``None`` where the sizes are unknown
    (offline, a file the cache does not hold).

    ``head()`` is asked only here, after the target's files are known: a target the run refuses is refused first."""
    return _disk_need(files, options.cache_dir, options.work_dir, composite_done, head())


def _size(value: int | None) -> str:
    return human_bytes(value) if value is not None else "size unknown"


def _check_out_readme(
    report: PipelineReport, api: HubApi, token: str | None, repo: str, revision: str | None, replace_readme: bool
) -> None:
    """Refuse, as the real run would, an ``out_repo`` README.md gguf-mtp did not write (a read, no write);
    where the Hub cannot say (offline, a repo that does not exist yet), a note says so."""
    from gguf_mtp.errors import HubError

    from ..publish import check_card_replaceable

    if hub_access.is_offline():
        report.notes.append(f"offline: {repo}'s README.md was not checked (a run checks it before downloading)")
        return
    try:
        replaced = check_card_replaceable(api, repo, token=token, revision=revision, replace_readme=replace_readme)
    except HubError as e:
        if "replace_readme" in e.parameters:
            raise
        report.notes.append(f"{repo}'s README.md could not be checked ({e.message}); a run checks it first")
        return
    if replaced:
        report.notes.append(replaced)


def plan_pipeline(api: HubApi, token: str | None, options: PipelineOptions) -> PipelineReport:
    """The plan of a :func:`~gguf_mtp.release.pipeline.run_pipeline` call with the same options; writes nothing.

    Raises:
        HubError: the Hub cannot be asked for the file list (and, offline, the cache does not hold it).
        ShardSetError: ``target_files`` does not name exactly one complete model of the repo.
        UnsafeOutputError: the work folder would be refused by a real run.
        StateFileError: the work folder's state file is not one gguf-mtp wrote.
        HubError: ``out_repo`` has a ``README.md`` gguf-mtp did not write and ``replace_readme`` is not set
            (online only; see :func:`~gguf_mtp.release.publish.check_card_replaceable`).
    """
    report = PipelineReport(options.work_dir, dry_run=True)
    _note_work_folder(report, options)
    files = target_files_of(api, token, options)
    outputs = _composite_names(options, files)
    report.stages += [
        _target_step(options, files), _draft_step(options), _compose_step(options, files, outputs),
        StageResult("verify", _PLANNED, "structure, target and draft bytes, and llama.cpp when installed"),
    ]
    report.stages.append(_publish_step(report, api, token, options, outputs))
    # A Hub head's size needs its shards' headers, fetched into the work folder: the dry run makes none.
    local_head = Path(options.head_repo).expanduser()
    head = HeadNeed(draft_size_bound(local_head, outtype=options.outtype)) if local_head.is_dir() else None
    _note_disk(report, files, options, head)
    report.planned = _planned_files(files, options, outputs)
    return report


def _note_work_folder(report: PipelineReport, options: PipelineOptions) -> None:
    """Refuse the work folder a real run would refuse; note that it would be created, or what it holds."""
    work = options.work_dir
    would_create = claim_work_dir(
        work, "pipeline", force=options.force, parameter="work_dir", also_ours=(STATE_NAME, LOCK_NAME), dry_run=True
    )
    if would_create:
        report.notes.append(f"the work folder {work} would be created")
        return
    finished = sorted(load_stages(work / STATE_NAME, STATE_FORMAT))
    if finished:
        report.notes.append(
            f"the state file records finished stages ({', '.join(finished)}): a run re-checks their files "
            "(size, sha256) and reuses those that still match"
        )


def _composite_names(options: PipelineOptions, files: TargetFiles) -> list[str]:
    """The composite's file names, as compose will write them (compose's one rule:
    :func:`~gguf_mtp.jobs.compose_plan.composite_file_names`)."""
    first = files.names[0].rpartition("/")[2]
    return composite_file_names(options.basename or basename_of(first), len(files.names),
                                split=SPLIT_NAME.match(first) is not None)


def _target_step(options: PipelineOptions, files: TargetFiles) -> StageResult:
    count = len(files.names)
    if options.target_dir is not None:
        return StageResult(
            "target", _PLANNED,
            f"read {count} file(s) ({_size(files.total)}) from the mounted repo {options.target_dir}, not downloaded "
            f"(checked against {options.target_repo}'s record on the Hub when online; never written to)",
        )
    return StageResult(
        "target", _PLANNED,
        f"download {len(files.to_download)} of {count} file(s) of {options.target_repo} "
        f"({_size(files.download_bytes)}; {count - len(files.to_download)} already in the Hub cache)",
    )


def _draft_path(options: PipelineOptions) -> Path:
    return options.work_dir / "draft" / "mtp-draft.gguf"


def _draft_step(options: PipelineOptions) -> StageResult:
    local_head = Path(options.head_repo).expanduser()
    if local_head.is_dir():
        return StageResult("draft", _PLANNED, f"convert the MTP head in {local_head} -> {_draft_path(options)}")
    return StageResult(
        "draft", _PLANNED,
        f"download config.json, the index and the safetensors files holding the MTP head of {options.head_repo}, "
        f"convert -> {_draft_path(options)}",
    )


def _compose_step(options: PipelineOptions, files: TargetFiles, outputs: list[str]) -> StageResult:
    return StageResult(
        "compose", _PLANNED,
        f"write {len(outputs)} file(s) to {options.work_dir / 'composite'}: {', '.join(outputs)} (about "
        f"{_size(files.total)} + the draft)",
    )


def _publish_step(report: PipelineReport, api: HubApi, token: str | None, options: PipelineOptions,
                  outputs: list[str]) -> StageResult:
    out_repo = options.out_repo
    if not out_repo:
        return StageResult("publish", "skipped", "no --out-repo given")
    _check_out_readme(report, api, token, out_repo, options.out_revision, options.replace_readme)
    return StageResult(
        "publish", _PLANNED,
        f"upload {len(outputs)} file(s) + README.md to {out_repo} (the token and write access are checked "
        "before anything is downloaded)" + ("" if options.keep else "; then remove the draft and the composite"),
    )


def _note_disk(report: PipelineReport, files: TargetFiles, options: PipelineOptions, head: HeadNeed | None) -> None:
    """The disk a run needs, at most with a local head (its draft's bound known), else at least."""
    need = _disk_need(files, options.cache_dir, options.work_dir, composite_done=False, head=head)
    if need is None:
        return
    report.disk_needed = need.total
    report.notes.append(
        f"disk needed: {'at most' if head else 'at least'} {need.describe()}"
        + ("" if head else ", plus the head's byte ranges and the draft")
        + ("" if need.shared or options.target_dir is not None else "; less on a reflink filesystem holding both")
    )


def _planned_files(files: TargetFiles, options: PipelineOptions, outputs: list[str]) -> dict[str, Any]:
    """The files a run would download or read, write and upload (``--json``'s ``planned``)."""
    names, sizes, work = files.names, files.sizes, options.work_dir
    from_folder = options.target_dir is not None
    return {
        "download": [] if from_folder else
        [{"path": n, "size": sizes[n], "cached": files.local[n] is not None} for n in names],
        "read": [{"path": n, "size": sizes[n]} for n in names] if from_folder else [],
        "head": options.head_repo,
        "write": [str(_draft_path(options)), *(str(work / "composite" / o) for o in outputs)],
        "upload": [*outputs, "README.md"] if options.out_repo else [],
        "out_repo": options.out_repo,
    }
