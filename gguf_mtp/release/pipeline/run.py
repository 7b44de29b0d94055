"""``pipeline``: from two Hub repos (a target quant and an MTP head) to a verified, published composite.

Stages, each a function of the ones before it:

1. **target**: download exactly the target's shard set (``<prefix>-NNNNN-of-NNNNN.gguf``, chosen from
   the repo's file list by the exact split pattern: never an earlier composite or an mmproj file that
   a glob would also catch) into the Hub cache; or, with ``target_dir``, read it from a folder laid out
   like the repo (the repo mounted read-only in a Hugging Face Job), never written to, checked against the
   Hub's record of the repo at ``target_revision`` (names, sizes, sha256);
2. **draft**: convert the head checkpoint to a draft GGUF (:func:`gguf_mtp.jobs.convert.convert`, which
   downloads only the head's MTP files);
3. **compose**: splice the draft into the target (:func:`gguf_mtp.jobs.compose.compose`);
4. **verify**: check the composite against both inputs, with llama.cpp when installed
   (:func:`gguf_mtp.check.verify.verify`);
5. **publish**: upload it with a model card when ``out_repo`` is given (:func:`gguf_mtp.release.publish.publish`).

Resuming: a small JSON state file in the work folder records, for every finished stage, a key (a hash
of its parameters and of its inputs' sha256) and its outputs (path, size, sha256). A re-run reuses a
stage only when the key is the same *and* every recorded output still has its size and sha256 (they
are checked, not trusted); anything else is redone, and the stages after it follow by their keys.
Output folders of a redone stage are recreated, never reused.

Online, each source is first pinned to the commit it points at (:func:`.sources.pin_sources`), and the card and
the state record those commits, the llama.cpp build verify ran against and the gguf-mtp version. With
``if_changed`` the run compares them with what ``out_repo``'s card records and stops when nothing moved
(:func:`.sources.check_sources`).

Before the first byte, the disk the run needs (downloads + composite, or the composite alone for a target
folder) is compared with the free space (:mod:`gguf_mtp.release.pipeline.disk`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gguf_mtp.errors import HubError, VerificationError
from gguf_mtp.files.commit import folder_lock, remove_leftovers
from gguf_mtp.files.digests import FileDigest, digest_files, sha256_file
from gguf_mtp.files.json_io import write_json_file
from gguf_mtp.files.progress import progress_bar
from gguf_mtp.files.scratch import scratch_folder
from gguf_mtp.files.workdir import claim_work_dir
from gguf_mtp.hub import access as hub_access
from gguf_mtp.hub import client as hub
from gguf_mtp.hub.hub_api import HubApi
from gguf_mtp.model.shards import open_model
from gguf_mtp.text import human_bytes

from ..card import Provenance
from .disk import HeadNeed, check_disk
from .options import PipelineOptions
from .plan import plan_pipeline, run_disk_need
from .report import PipelineReport, StageResult
from .sources import check_sources, chosen_llama_cpp, pin_sources, require_comparable
from .state import LOCK_NAME, STATE_FORMAT, STATE_NAME, load_stages
from .target import (
    basename_of,
    check_folder_digests,
    check_folder_matches,
    select_folder_files,
    select_target_files,
    target_listing,
)

__all__ = ["run", "run_pipeline"]  # the other public names of the pipeline: gguf_mtp.release.pipeline

# ----------------------------------------------------------------------------------- the state file


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _key(stage: str, params: dict[str, Any], inputs: Sequence[FileDigest] = ()) -> str:
    """A stage's identity: its parameters and the sha256 of its inputs."""
    doc = {"stage": stage, "params": params, "inputs": [[d.name, d.size, d.sha256] for d in inputs]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class _State:
    """The JSON record of finished stages, rewritten atomically after each one."""

    def __init__(self, work_dir: Path) -> None:
        self.path = work_dir / STATE_NAME
        # A state file of any other shape (or a directory, a pipe) is refused with one line: it is not ours.
        self.stages: dict[str, dict[str, Any]] = load_stages(self.path, STATE_FORMAT)

    def record(self, stage: str, key: str, outputs: Sequence[FileDigest], detail: dict[str, Any]) -> None:
        self.stages[stage] = {
            "key": key,
            "finished": _now(),
            "outputs": [self._relative(d) for d in outputs],
            "detail": detail,
        }
        self._save()

    def _relative(self, digest: FileDigest) -> dict[str, Any]:
        # Outputs inside the work folder are recorded relative to it, so the folder can be moved.
        entry = digest.to_dict()
        with contextlib.suppress(ValueError):
            entry["path"] = digest.path.resolve().relative_to(self.path.parent.resolve()).as_posix()
        return entry

    def outputs(self, record: dict[str, Any]) -> list[FileDigest]:
        """A record's outputs with their paths resolved."""
        digests = [FileDigest.from_dict(o) for o in record.get("outputs", [])]
        return [FileDigest(self.path.parent / d.path, d.size, d.sha256) for d in digests]

    def forget(self, stage: str) -> None:
        if self.stages.pop(stage, None) is not None:
            self._save()

    def _save(self) -> None:
        write_json_file(self.path, {"format": STATE_FORMAT, "stages": self.stages})


# ----------------------------------------------------------------------------------- reports


# ----------------------------------------------------------------------------------- the run


@contextlib.contextmanager
def _work_lock(work_dir: Path) -> Iterator[None]:
    """One pipeline per work folder at a time (two would overwrite each other's outputs)."""
    # A lock on the folder itself: no lock file to create (through a planted link) or to leave behind.
    with folder_lock(work_dir, busy="another pipeline is running in this work folder"):
        yield


def _fresh_folder(path: Path) -> Path:
    """Recreate one of the pipeline's own output folders (never reuse what an earlier run left there)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


class _Runner:
    """Runs the stages in order, reusing the ones whose record still holds: the options, the Hub and the work
    folder every stage reads."""

    def __init__(
        self, options: PipelineOptions, api: HubApi, token: str | None, say: Callable[[str], None]
    ) -> None:
        self.options = options
        self.api = api
        self.token = token
        self.work_dir = options.work_dir
        self.state = _State(options.work_dir)
        self.say = say
        self.progress = options.progress

    def recorded(self, stage: str, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """The stage's record if it can be reused; else (None, why it cannot, or None if never run)."""
        record = self.state.stages.get(stage)
        if record is None:
            return None, None
        if record.get("key") != key:
            return None, "its inputs or parameters changed"
        outputs = self.state.outputs(record)
        total = sum(d.size for d in outputs)
        with progress_bar(total, f"checking {stage}", enabled=self.progress) as bar:
            for d in outputs:
                if not d.path.is_file():
                    return None, f"{d.path.name} is gone"
                if d.path.stat().st_size != d.size:
                    return None, f"{d.path.name} changed size"
                if sha256_file(d.path, bar=bar) != d.sha256:
                    return None, f"{d.path.name} changed (sha256 differs from the record)"
        return record, None

    def digest(self, paths: Sequence[Path], stage: str) -> list[FileDigest]:
        return digest_files(paths, progress=self.progress, desc=f"sha256 {stage}")


def _say_default(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def run_pipeline(
    *,
    target_repo: str,
    target_files: str,
    head_repo: str,
    out_repo: str | None = None,
    work_dir: str | os.PathLike[str],
    keep: bool = False,
    force: bool = False,
    target_revision: str | None = None,
    target_dir: str | os.PathLike[str] | None = None,
    head_revision: str | None = None,
    out_revision: str | None = None,
    private: bool = False,
    replace_readme: bool = False,
    basename: str | None = None,
    outtype: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    api: HubApi | None = None,
    llama: bool | None = None,
    progress: bool = True,
    say: Callable[[str], None] | None = None,
    dry_run: bool = False,
    if_changed: bool = False,
) -> PipelineReport:
    """Download, convert, compose, verify and (with ``out_repo``) publish; resume from finished stages.

    The keywords are the fields of one :class:`PipelineOptions`, built here and passed down (:func:`run` takes
    that object, as the command line does).

    Args:
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
        api: an ``HfApi``-like object (a stand-in in tests).
        llama: load the composite with llama.cpp in verify (default: when installed).
        progress: progress bars on stderr.
        say: where the one-line stage messages go (default: stderr).
        dry_run: only say what a run would download (the files and sizes the Hub lists), convert, write
            and upload, and the disk it needs; nothing is written, not even the work folder (see
            :func:`plan_pipeline`).
        if_changed: first compare the head's and the target's commits, the llama.cpp build verify would run
            against and the gguf-mtp version with what ``out_repo``'s card records; when none moved, stop there
            (nothing downloaded or written: the report says so in one line), else make again what the moves
            affect (:mod:`gguf_mtp.release.pipeline.sources`). Needs ``out_repo`` and a Hub head.

    Returns:
        A :class:`PipelineReport`.

    Raises:
        HubError: downloads or the upload failed (offline without a cached copy, no access, ...).
        ShardSetError: ``target_files`` does not name exactly one complete model.
        VerificationError: the composite failed verification (nothing is published then).
        GGUFMTPError: any other bad input (an incompatible head, an unsafe work folder, ...).
    """
    options = PipelineOptions(
        target_repo=target_repo, target_files=target_files, head_repo=head_repo, work_dir=Path(work_dir),
        out_repo=out_repo, keep=keep, force=force, target_revision=target_revision,
        target_dir=Path(target_dir) if target_dir is not None else None, head_revision=head_revision,
        out_revision=out_revision, private=private, replace_readme=replace_readme, basename=basename,
        outtype=outtype, cache_dir=cache_dir, llama=llama, progress=progress, dry_run=dry_run, if_changed=if_changed,
    )
    return run(options, api=api, say=say)


def run(
    options: PipelineOptions, *, api: HubApi | None = None, say: Callable[[str], None] | None = None
) -> PipelineReport:
    """:func:`run_pipeline` with its options as one object (the command line builds it once from its flags).

    ``api``: an ``HfApi``-like object (a stand-in in tests); ``say``: where the one-line stage messages go
    (default: stderr). Returns and raises as :func:`run_pipeline`.
    """
    started = time.perf_counter()
    say = say or _say_default
    # Every repo id is checked before anything is created or asked (a trailing newline, "..", "a/b/c").
    hub.check_repo_id(options.target_repo, "target_repo")
    if not Path(options.head_repo).expanduser().is_dir():
        hub.check_repo_id(options.head_repo, "head_repo")
    if options.out_repo:
        hub.check_repo_id(options.out_repo, "out_repo")
    work = options.work_dir
    token = hub_access.resolve_token()
    hub_api = hub.make_api(api, token=token)  # constructing it touches no network
    check = None
    if options.if_changed:
        # Options or a work folder the run would refuse are refused before the Hub is asked anything.
        require_comparable(options)
        claim_work_dir(work, "pipeline", force=options.force, parameter="work_dir", also_ours=(STATE_NAME, LOCK_NAME),
                       dry_run=True)
        options = pin_sources(hub_api, token, options)
        check = check_sources(hub_api, token, options)
        if check.nothing_moved:
            return PipelineReport(work, dry_run=options.dry_run, sources=check.to_dict(),
                                  nothing_moved=check.line(str(options.out_repo)))
    if options.dry_run:
        report = plan_pipeline(hub_api, token, options)
        if check is not None:
            report.sources = check.to_dict()
            report.notes.insert(0, check.line(str(options.out_repo)))
        return report
    if check is not None:
        say(check.line(str(options.out_repo)))
    # Only a folder a pipeline made (its marker or state file) is one whose draft/ and composite/ it replaces.
    top = work.absolute()  # the outermost folder this run creates (claim_work_dir makes missing parents)
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    created = claim_work_dir(
        work, "pipeline", force=options.force, parameter="work_dir", also_ours=(STATE_NAME, LOCK_NAME)
    )
    try:
        if check is None and not hub_access.is_offline():
            options = pin_sources(hub_api, token, options)  # one commit per source for the whole run
        report = _run(options, hub_api, token, say, started)
    except BaseException:
        if created:
            _remove_unused_work_dir(work.absolute(), top)
        raise
    if check is not None:
        report.sources = check.to_dict()
        report.notes.insert(0, check.line(str(options.out_repo)))
    return report


def _remove_unused_work_dir(work: Path, top: Path) -> None:
    """Remove the work folder this run created (and the parents up to ``top`` it created for it) when it
    holds nothing but the run's marker and lock.

    A run that fails before its first stage finishes (the Hub unreachable, a refused token) then leaves
    nothing behind; once a stage has recorded its outputs, the folder is what a re-run resumes from.
    """
    from gguf_mtp.files.workdir import MARKER_NAME

    try:
        names = set(os.listdir(work))
        if not names <= {MARKER_NAME, LOCK_NAME}:
            return
        for name in names:
            (work / name).unlink()
        folder = work
        while True:
            folder.rmdir()  # only ever an empty folder
            if folder == top:
                break
            folder = folder.parent
    except OSError:  # someone else's file appeared meanwhile: leave the folder
        pass


def _run(
    options: PipelineOptions, api: HubApi, token: str | None, say: Callable[[str], None], started: float
) -> PipelineReport:
    """The stages of :func:`run_pipeline`, in a work folder it has claimed."""
    work = options.work_dir
    report = PipelineReport(work)
    out_repo = options.out_repo
    if out_repo:
        # Hours of downloading and composing are wasted if the upload is refused at the end: ask first.
        say(f"[0/5] publish: checking the token and write access to {out_repo}")
        hub.check_write_access(api, out_repo, token=token, private=options.private, revision=options.out_revision)
        from ..publish import check_card_replaceable

        check_card_replaceable(api, out_repo, token=token, revision=options.out_revision,
                               replace_readme=options.replace_readme)
    with _work_lock(work):
        leftovers = remove_leftovers(work)  # a killed pipeline's temporary state file
        if leftovers is not None:
            report.notes.append(leftovers)
        runner = _Runner(options, api, token, say)
        # Hours of downloading are wasted too if the composite cannot be written at the end: check the disk first.
        stages = runner.state.stages
        need = run_disk_need(api, token, options, head=lambda: _head_need(runner), composite_done="compose" in stages)
        if need is None:
            report.notes.append("the disk was not checked before the run: the target's sizes are unknown offline")
        else:
            check_disk(need)
        if options.target_dir is not None:
            target, commit = _stage_target_folder(runner, report, options.target_dir)
        else:
            target, commit = _stage_target(runner, report)
        draft = _stage_draft(runner, report, target)
        composite = _stage_compose(runner, report, target, draft)
        _stage_verify(runner, report, target, draft, composite)
        provenance = Provenance(
            target_repo=options.target_repo,
            target_revision=commit or options.target_revision,
            target_files=tuple(runner.state.stages["target"]["detail"]["files"]),
            head_source=options.head_repo,
            head_revision=options.head_revision,
            llama_cpp_build=runner.state.stages["verify"]["detail"].get("llama_cpp"),
        )
        published = _stage_publish(runner, report, composite, provenance)
        if published and not options.keep:
            for folder in (work / "composite", work / "draft"):
                shutil.rmtree(folder, ignore_errors=True)
            report.notes.append(
                "removed the draft and the composite from the work folder (published; --keep keeps them)"
            )
    report.seconds = time.perf_counter() - started
    return report


def _head_need(runner: _Runner) -> HeadNeed:
    """The draft this run writes (an upper bound, from the head's tensors and the outtype) and the head's byte
    ranges it fetches for it, known before the first of them: a Hub head's headers are read for it."""
    from gguf_mtp.jobs.convert import draft_size_bound, resolve_source

    options = runner.options
    record = runner.state.stages.get("draft")
    if record is not None:  # a re-run reuses it or, converting again, first removes it (_fresh_folder)
        return HeadNeed(sum(d.size for d in runner.state.outputs(record)), done=True)
    local = Path(options.head_repo).expanduser()
    if local.is_dir():
        return HeadNeed(draft_size_bound(local, outtype=options.outtype))
    with scratch_folder(runner.work_dir) as scratch:
        folder, fetched = resolve_source(options.head_repo, options.head_revision, ranges_into=scratch,
                                         tensor_data=False)
        ranges = fetched.ranges if fetched is not None else None
        return HeadNeed(draft_size_bound(folder, outtype=options.outtype),
                        ranges.scratch_bytes if ranges is not None else 0)


def _status(before: str | None) -> str:
    return "redone" if before else "ran"


def _stage_target(runner: _Runner, report: PipelineReport) -> tuple[list[FileDigest], str | None]:
    stage = "target"
    api, token, options = runner.api, runner.token, runner.options
    repo, pattern, revision = options.target_repo, options.target_files, options.target_revision
    key = _key(stage, {"repo": repo, "files": pattern, "revision": revision})
    started = time.perf_counter()
    record, why = runner.recorded(stage, key)
    if record is not None:
        return _target_reused(runner, report, record, f"of {repo}", "downloaded", started)
    if why:
        runner.say(f"[1/5] target: {why}; downloading again")
    names = select_target_files(target_listing(api, token, repo, pattern, revision, options.cache_dir), pattern)
    shown = ", ".join(n.rpartition("/")[2] for n in names)
    runner.say(f"[1/5] target: downloading {len(names)} file(s) of {repo}: {shown}")
    snapshot = hub.download_files(
        api,
        repo,
        [glob.escape(n) for n in names],
        token=token,
        revision=revision,
        cache_dir=options.cache_dir,
        force=why is not None,
    )
    paths = [snapshot / n for n in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise HubError(f"{repo}: downloaded snapshot lacks {', '.join(missing)}")
    model = open_model(paths[0])  # the set is complete and consistent, as llama.cpp will see it
    outputs = runner.digest(model.paths, stage)
    commit = snapshot.name if hub.is_commit(snapshot.name) else None
    runner.state.record(stage, key, outputs, {"files": names, "commit": commit, "repo": repo})
    return _target_done(report, outputs, commit, f"{len(names)} file(s) of {repo}", why, started)


def _stage_target_folder(
    runner: _Runner, report: PipelineReport, folder: Path
) -> tuple[list[FileDigest], str | None]:
    """The target read from a folder laid out like the repo (a read-only mount): nothing downloaded, nothing
    written there; online, checked against the Hub's record of the repo at ``target_revision``."""
    stage = "target"
    api, token, options = runner.api, runner.token, runner.options
    repo, pattern, revision = options.target_repo, options.target_files, options.target_revision
    source = folder.resolve()
    key = _key(stage, {"repo": repo, "files": pattern, "revision": revision, "dir": str(source)})
    started = time.perf_counter()
    record, why = runner.recorded(stage, key)
    if record is not None:
        return _target_reused(runner, report, record, f"in {folder}", "read", started)
    names = select_folder_files(folder, pattern, repo)
    remote = None
    if hub_access.is_offline():
        report.notes.append(f"offline: the files in {folder} were not checked against {repo}'s record on the Hub")
    else:
        remote = hub.remote_files(api, repo, names, token=token, revision=revision)
        check_folder_matches(folder, names, remote, repo, revision)
    runner.say(f"[1/5] target: reading {len(names)} file(s) of {repo} from the mounted repo {folder}, not downloaded")
    paths = [folder / n for n in names]
    model = open_model(paths[0])  # the set is complete and consistent, as llama.cpp will see it
    outputs = runner.digest(model.paths, stage)
    if remote is not None:
        check_folder_digests(folder, [(n, d.sha256) for n, d in zip(names, outputs)], remote, repo, revision)
    commit = revision if hub.is_commit(revision) else None
    runner.state.record(stage, key, outputs, {"files": names, "commit": commit, "repo": repo, "dir": str(source)})
    detail = f"{len(names)} file(s) of {repo} read from the mounted repo {folder}, not downloaded"
    return _target_done(report, outputs, commit, detail, why, started)


def _target_reused(runner: _Runner, report: PipelineReport, record: dict[str, Any], where: str, done: str,
                   started: float) -> tuple[list[FileDigest], str | None]:
    """The target stage when its record still holds: the recorded files (sizes and sha256 checked) and commit."""
    outputs = runner.state.outputs(record)
    runner.say(f"[1/5] target: {len(outputs)} file(s) {where} already {done} (sizes and sha256 checked)")
    report.stages.append(StageResult("target", "reused", f"{len(outputs)} file(s) {where}, checked",
                                     time.perf_counter() - started, outputs))
    report.target = [d.path for d in outputs]
    return outputs, record["detail"].get("commit")


def _target_done(report: PipelineReport, outputs: list[FileDigest], commit: str | None, detail: str,
                 why: str | None, started: float) -> tuple[list[FileDigest], str | None]:
    """The target stage's files and commit, once read and recorded, in the report."""
    report.target = [d.path for d in outputs]
    report.stages.append(StageResult("target", _status(why), detail + (f" @ {commit[:12]}" if commit else ""),
                                     time.perf_counter() - started, outputs))
    return outputs, commit


def _stage_draft(runner: _Runner, report: PipelineReport, target: list[FileDigest]) -> FileDigest:
    stage = "draft"
    head, revision, outtype = runner.options.head_repo, runner.options.head_revision, runner.options.outtype
    local = Path(head).expanduser()
    source = str(local.resolve()) if local.is_dir() else head
    key = _key(stage, {"head": source, "revision": revision, "outtype": outtype}, target)
    started = time.perf_counter()
    record, why = runner.recorded(stage, key)
    if record is not None:
        (draft,) = runner.state.outputs(record)
        report.draft = draft.path
        runner.say(f"[2/5] draft: {draft.name} already converted (size and sha256 checked)")
        report.stages.append(
            StageResult(stage, "reused", f"{draft.name}, checked", time.perf_counter() - started, [draft])
        )
        return draft
    runner.say(
        f"[2/5] draft: converting the MTP head of {head} for {target[0].name}" + (f" ({why}, so again)" if why else "")
    )
    from gguf_mtp.jobs.convert import convert

    folder = _fresh_folder(runner.work_dir / "draft")
    result = convert(
        source,
        folder / "mtp-draft.gguf",
        target=target[0].path,
        outtype=outtype,
        revision=revision,
        force=True,
        progress=runner.progress,
    )
    (draft,) = runner.digest([Path(result.output)], stage)
    runner.state.record(stage, key, [draft], {"head": source, "revision": revision})
    report.draft = draft.path
    report.stages.append(
        StageResult(
            stage,
            _status(why),
            f"{draft.name} ({draft.size:,} bytes) from {head}",
            time.perf_counter() - started,
            [draft],
        )
    )
    return draft


def _default_basename(target: Sequence[FileDigest]) -> str:
    return basename_of(target[0].name)


def _stage_compose(
    runner: _Runner, report: PipelineReport, target: list[FileDigest], draft: FileDigest
) -> list[FileDigest]:
    stage = "compose"
    name = runner.options.basename or _default_basename(target)
    key = _key(stage, {"basename": name}, [*target, draft])
    started = time.perf_counter()
    record, why = runner.recorded(stage, key)
    if record is not None:
        outputs = runner.state.outputs(record)
        report.composite = [d.path for d in outputs]
        runner.say(f"[3/5] compose: {len(outputs)} file(s) {name}-* already composed (sizes and sha256 checked)")
        report.stages.append(
            StageResult(
                stage, "reused", f"{len(outputs)} file(s) {name}-*, checked", time.perf_counter() - started, outputs
            )
        )
        return outputs
    runner.say(f"[3/5] compose: {target[0].name} + {draft.name} -> {name}" + (f" ({why}, so again)" if why else ""))
    from gguf_mtp.jobs.compose import compose

    folder = _fresh_folder(runner.work_dir / "composite")
    result = compose(target[0].path, draft.path, folder, basename=name, force=True, progress=runner.progress)
    outputs = runner.digest(result.output_paths, stage)
    plan = result.plan
    runner.state.record(stage, key, outputs, {"block": plan.block, "added": len(plan.renamed)})
    report.composite = [d.path for d in outputs]
    report.stages.append(
        StageResult(
            stage,
            _status(why),
            f"{len(outputs)} file(s), {plan.target.tensor_count} target tensors + "
            f"{len(plan.renamed)} NextN tensors as blk.{plan.block}",
            time.perf_counter() - started,
            outputs,
        )
    )
    return outputs


def _stage_verify(
    runner: _Runner,
    report: PipelineReport,
    target: list[FileDigest],
    draft: FileDigest,
    composite: list[FileDigest],
) -> None:
    stage = "verify"
    from gguf_mtp.check.llama_check import llama_cpp_available

    llama = runner.options.llama
    use_llama = llama_cpp_available() if llama is None else llama
    build = chosen_llama_cpp(use_llama)  # another llama.cpp proves nothing about these files yet: verify again
    key = _key(stage, {"llama": use_llama, "llama_cpp": build}, [*target, draft, *composite])
    started = time.perf_counter()
    record, why = runner.recorded(stage, key)
    if record is not None:
        runner.say("[4/5] verify: these exact files passed before")
        report.stages.append(
            StageResult(
                stage, "reused", record["detail"].get("summary", "passed before"), time.perf_counter() - started
            )
        )
        return
    llama_part = ", llama.cpp load + MTP decode" if use_llama else ""
    runner.say(f"[4/5] verify: structure, target and draft bytes{llama_part}")
    from gguf_mtp.check.verify import verify

    result = verify(
        composite[0].path, target=target[0].path, draft=draft.path, llama=use_llama, progress=runner.progress
    )
    report.verification = result
    checks = list(result.checks)
    if not result.ok:
        runner.state.forget(stage)
        failed = [c for c in checks if c.ok is False]
        first = failed[0] if failed else None
        detail = f"{first.name}: {first.detail}" if first is not None else "see the verify report"
        raise VerificationError(
            f"the composite failed verification ({detail}); nothing was published", composite[0].path
        )
    passed = sum(1 for c in checks if c.ok)
    summary = f"{passed} checks passed" + (" (llama.cpp loaded it and ran the NextN block)" if use_llama else "")
    if result.llama is not None:
        build = result.llama.llama_cpp_build  # what ran the proof, as the child reported it
    runner.state.record(stage, key, [], {"summary": summary, "checks": [c.name for c in checks], "llama_cpp": build})
    report.stages.append(StageResult(stage, _status(why), summary, time.perf_counter() - started))


def _stage_publish(
    runner: _Runner, report: PipelineReport, composite: list[FileDigest], provenance: Provenance
) -> bool:
    stage = "publish"
    api, token, options = runner.api, runner.token, runner.options
    repo, revision, private = options.out_repo, options.out_revision, options.private
    if not repo:
        report.stages.append(StageResult(stage, "skipped", "no --out-repo given"))
        return False
    key = _key(
        stage, {"repo": repo, "revision": revision, "private": private, "provenance": provenance.to_dict()}, composite
    )
    record = runner.state.stages.get(stage)
    why = None
    if record is not None and record.get("key") == key:
        from ..publish import compare_remote

        try:
            remote = hub.remote_files(api, repo, [d.name for d in composite], token=token, revision=revision)
        except HubError as e:
            remote, why = {}, f"the Hub could not be asked ({e})"
        if remote and all(c.ok for c in compare_remote(composite, None, remote)):
            runner.say(f"[5/5] publish: {repo} already holds these files (sizes and sha256 checked on the Hub)")
            report.stages.append(StageResult(stage, "reused", f"{repo}: the Hub still holds these files (checked)"))
            return True
        why = why or "the Hub's files differ from the composite"
    elif record is not None:
        why = "the composite or the destination changed"
    started = time.perf_counter()
    runner.say(f"[5/5] publish: {len(composite)} file(s) + model card to {repo}" + (f" ({why})" if why else ""))
    from ..publish import CopySource, PublishOptions
    from ..publish import run as publish

    # Files identical to the target's at the commit it was read at are copied on the Hub's side, not uploaded.
    source = CopySource(options.target_repo, provenance.target_revision)
    asked = PublishOptions(repo=repo, private=private, revision=revision, provenance=provenance,
                           progress=runner.progress, replace_readme=options.replace_readme, copy_from=source)
    result = publish(composite[0].path, asked, api=api, token=token, digests={str(d.path): d for d in composite})
    report.published = result
    from gguf_mtp._version import __version__

    runner.state.record(stage, key, [], {"repo": repo, "commit_url": result.commit_url, "gguf_mtp": __version__})
    sent = result.upload
    size = "" if sent is None else (f" ({human_bytes(sent.total_bytes)} uploaded, {human_bytes(sent.differing_bytes)} "
                                    "of it differing from the target set: the expected upload)")
    report.stages.append(
        StageResult(stage, _status(why), f"{repo}: {result.commit_url or result.url}{size}",
                    time.perf_counter() - started)
    )
    return True
