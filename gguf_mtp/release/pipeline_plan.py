"""``pipeline --dry-run``: what a run would download, convert, write and upload, and the disk it needs.

Read-only: the Hub is asked for the target repo's file list and the files' sizes (offline, the Hub cache
answers), the Hub cache for which files it already holds, and the work folder for its state file. Nothing
is created, not even the work folder; no write access is asked for (that would create the repo).
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf_mtp.constants import split_file_name
from gguf_mtp.files.workdir import claim_work_dir
from gguf_mtp.formatting import human_bytes
from gguf_mtp.hub import client as hub
from gguf_mtp.hub.hub_api import HubApi

from .pipeline_report import PipelineReport, StageResult
from .pipeline_state import LOCK_NAME, STATE_FORMAT, STATE_NAME, load_stages
from .pipeline_target import basename_of, select_target_files, target_listing

__all__ = ["plan_pipeline"]

_PLANNED = "planned"


def _target_sizes(
    api: HubApi, token: str | None, repo: str, names: list[str], revision: str | None, cached: dict[str, Path | None]
) -> dict[str, int | None]:
    """Each file's size: the Hub's record, or offline the cached copy's (``None`` when unknown)."""
    if hub.is_offline():
        return {n: (p.stat().st_size if (p := cached[n]) is not None else None) for n in names}
    remote = hub.remote_files(api, repo, names, token=token, revision=revision)
    return {n: (remote[n].size if n in remote else None) for n in names}


def _size(value: int | None) -> str:
    return human_bytes(value) if value is not None else "size unknown"


def _check_out_readme(
    report: PipelineReport, api: HubApi, token: str | None, repo: str, revision: str | None, replace_readme: bool
) -> None:
    """Refuse, as the real run would, an ``out_repo`` README.md gguf-mtp did not write (a read, no write);
    where the Hub cannot say (offline, a repo that does not exist yet), a note says so."""
    from gguf_mtp.errors import HubError

    from .publish import check_card_replaceable

    if hub.is_offline():
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


def plan_pipeline(
    api: HubApi,
    token: str | None,
    *,
    target_repo: str,
    target_files: str,
    head_repo: str,
    out_repo: str | None,
    work: Path,
    force: bool,
    target_revision: str | None,
    basename: str | None,
    cache_dir: str | os.PathLike[str] | None,
    keep: bool,
    out_revision: str | None = None,
    replace_readme: bool = False,
) -> PipelineReport:
    """The plan of a :func:`~gguf_mtp.release.pipeline.run_pipeline` call with the same arguments; writes nothing.

    Raises:
        HubError: the Hub cannot be asked for the file list (and, offline, the cache does not hold it).
        ShardSetError: ``target_files`` does not name exactly one complete model of the repo.
        UnsafeOutputError: the work folder would be refused by a real run.
        StateFileError: the work folder's state file is not one gguf-mtp wrote.
        HubError: ``out_repo`` has a ``README.md`` gguf-mtp did not write and ``replace_readme`` is not set
            (online only; see :func:`~gguf_mtp.release.publish.check_card_replaceable`).
    """
    report = PipelineReport(work, dry_run=True)
    would_create = claim_work_dir(
        work, "pipeline", force=force, parameter="work_dir", also_ours=(STATE_NAME, LOCK_NAME), dry_run=True
    )
    if would_create:
        report.notes.append(f"the work folder {work} would be created")
    else:
        finished = sorted(load_stages(work / STATE_NAME, STATE_FORMAT))
        if finished:
            report.notes.append(
                f"the state file records finished stages ({', '.join(finished)}): a run re-checks their files "
                "(size, sha256) and reuses those that still match"
            )

    names = select_target_files(target_listing(api, token, target_repo, target_files, target_revision, cache_dir),
                                target_files)
    cached = {n: hub.cached_file(target_repo, n, revision=target_revision, cache_dir=cache_dir) for n in names}
    sizes = _target_sizes(api, token, target_repo, names, target_revision, cached)
    known = [s for s in sizes.values() if s is not None]
    target_bytes = sum(known) if len(known) == len(names) else None
    fetch = [n for n in names if cached[n] is None]
    fetch_sizes = [sizes[n] for n in fetch]
    fetch_bytes = sum(s for s in fetch_sizes if s is not None) if None not in fetch_sizes else None
    report.stages.append(StageResult(
        "target", _PLANNED,
        f"download {len(fetch)} of {len(names)} file(s) of {target_repo} ({_size(fetch_bytes)}; "
        f"{len(names) - len(fetch)} already in the Hub cache)",
    ))
    local_head = Path(head_repo).expanduser()
    report.stages.append(StageResult(
        "draft", _PLANNED,
        f"convert the MTP head in {local_head} -> {work / 'draft' / 'mtp-draft.gguf'}" if local_head.is_dir()
        else f"download config.json, the index and the safetensors files holding the MTP head of {head_repo}, "
        f"convert -> {work / 'draft' / 'mtp-draft.gguf'}",
    ))
    name = basename or basename_of(names[0])
    outputs = [split_file_name(name, i, len(names)) for i in range(1, len(names) + 1)] if len(names) > 1 \
        else [f"{name}.gguf"]
    report.stages.append(StageResult(
        "compose", _PLANNED,
        f"write {len(outputs)} file(s) to {work / 'composite'}: {', '.join(outputs)} (about {_size(target_bytes)}"
        " + the draft)",
    ))
    report.stages.append(StageResult(
        "verify", _PLANNED, "structure, target and draft bytes, and llama.cpp when installed"
    ))
    if out_repo:
        _check_out_readme(report, api, token, out_repo, out_revision, replace_readme)
        report.stages.append(StageResult(
            "publish", _PLANNED,
            f"upload {len(outputs)} file(s) + README.md to {out_repo} (the token and write access are checked "
            "before anything is downloaded)" + ("" if keep else "; then remove the draft and the composite"),
        ))
    else:
        report.stages.append(StageResult("publish", "skipped", "no --out-repo given"))
    if target_bytes is not None and fetch_bytes is not None:
        report.disk_needed = fetch_bytes + target_bytes
        report.notes.append(
            f"disk needed: at least {human_bytes(report.disk_needed)} ({human_bytes(fetch_bytes)} into the Hub "
            f"cache, a composite of about {human_bytes(target_bytes)} in {work}), plus the head's MTP files and "
            "the draft; less on a reflink filesystem holding both"
        )
    report.planned = {
        "download": [{"path": n, "size": sizes[n], "cached": cached[n] is not None} for n in names],
        "head": head_repo,
        "write": [str(work / "draft" / "mtp-draft.gguf"), *(str(work / "composite" / o) for o in outputs)],
        "upload": [*outputs, "README.md"] if out_repo else [],
        "out_repo": out_repo,
    }
    return report
