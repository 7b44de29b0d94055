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
Output folders of a redone stage are recreated, never reused. Each stage is one :class:`.stage.Stage` record (its
key, its work, what a reuse says) run by the one reuse-or-run skeleton, :meth:`.stage.StageRunner.run`; the state
file's format, written and read, is :mod:`.state`'s.

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
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gguf_mtp.errors import HubError, VerificationError
from gguf_mtp.files.commit import folder_lock, remove_leftovers
from gguf_mtp.files.digests import FileDigest
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
from .plan import TargetFiles, plan_pipeline, run_disk_need, target_files_of
from .report import PipelineReport, StageResult
from .sources import SourceCheck, check_sources, chosen_llama_cpp, pin_sources, require_comparable
from .stage import ReuseNote, Stage, StageDone, StageRunner, stage_line
from .state import LOCK_NAME, STATE_NAME, StateFile, stage_key
from .target import basename_of, check_folder_digests, check_folder_matches

if TYPE_CHECKING:
    from gguf_mtp.check.verify import Check

__all__ = ["run", "run_pipeline"]  # the other public names of the pipeline: gguf_mtp.release.pipeline


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


@dataclass(frozen=True)
class _Context:
    """What every stage of one run reads: its options, the Hub, and the runner of its stages (state and report)."""

    options: PipelineOptions
    api: HubApi
    token: str | None
    stages: StageRunner

    @property
    def report(self) -> PipelineReport:
        return self.stages.report

    @property
    def state(self) -> StateFile:
        return self.stages.state


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

    The keywords other than ``api`` and ``say`` are the fields of one :class:`PipelineOptions`, each documented
    there; they are built into it here and passed down (:func:`run` takes that object, as the command line does).

    Args:
        api: an ``HfApi``-like object (a stand-in in tests).
        say: where the one-line stage messages go (default: stderr).

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
    _check_repo_ids(options)
    token = hub_access.resolve_token()
    hub_api = hub.make_api(api, token=token)  # constructing it touches no network
    check = None
    if options.if_changed:
        options, check = _compare_sources(hub_api, token, options)
        if check.nothing_moved:
            return PipelineReport(options.work_dir, dry_run=options.dry_run, sources=check.to_dict(),
                                  nothing_moved=check.line(str(options.out_repo)))
    if options.dry_run:
        report = plan_pipeline(hub_api, token, options)
    else:
        if check is not None:
            say(check.line(str(options.out_repo)))
        report = _run_in_claimed_folder(options, hub_api, token, say, started, pin=check is None)
    if check is not None:
        report.sources = check.to_dict()
        report.notes.insert(0, check.line(str(options.out_repo)))
    return report


def _check_repo_ids(options: PipelineOptions) -> None:
    """Every repo id is checked before anything is created or asked (a trailing newline, "..", "a/b/c")."""
    hub.check_repo_id(options.target_repo, "target_repo")
    if not Path(options.head_repo).expanduser().is_dir():
        hub.check_repo_id(options.head_repo, "head_repo")
    if options.out_repo:
        hub.check_repo_id(options.out_repo, "out_repo")


def _compare_sources(api: HubApi, token: str | None, options: PipelineOptions) -> tuple[PipelineOptions, SourceCheck]:
    """``if_changed``: the options pinned to the sources' commits, and how they compare with the published card's."""
    # Options or a work folder the run would refuse are refused before the Hub is asked anything.
    require_comparable(options)
    claim_work_dir(options.work_dir, "pipeline", force=options.force, parameter="work_dir",
                   also_ours=(STATE_NAME, LOCK_NAME), dry_run=True)
    options = pin_sources(api, token, options)
    return options, check_sources(api, token, options)


def _outermost_new_folder(work: Path) -> Path:
    """The outermost folder a run in ``work`` creates (claim_work_dir makes missing parents)."""
    top = work.absolute()
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return top


def _run_in_claimed_folder(options: PipelineOptions, api: HubApi, token: str | None, say: Callable[[str], None],
                           started: float, *, pin: bool) -> PipelineReport:
    """Claim the work folder and run the stages there; a run that fails before its first stage finishes removes
    the folder it created. ``pin``: pin the sources to their commits first (online)."""
    work = options.work_dir
    top = _outermost_new_folder(work)
    # Only a folder a pipeline made (its marker or state file) is one whose draft/ and composite/ it replaces.
    created = claim_work_dir(
        work, "pipeline", force=options.force, parameter="work_dir", also_ours=(STATE_NAME, LOCK_NAME)
    )
    try:
        if pin and not hub_access.is_offline():
            options = pin_sources(api, token, options)  # one commit per source for the whole run
        return _run(options, api, token, say, started)
    except BaseException:
        if created:
            _remove_unused_work_dir(work.absolute(), top)
        raise


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
    if options.out_repo:
        _check_publishable(options, api, token, say)
    with _work_lock(work):
        leftovers = remove_leftovers(work)  # a killed pipeline's temporary state file
        if leftovers is not None:
            report.notes.append(leftovers)
        ctx = _Context(options, api, token, StageRunner(StateFile(work), report, say, options.progress))
        files = target_files_of(api, token, options)  # the run's one listing of the target repo
        _check_disk_first(ctx, files)
        _run_stages(ctx, files)
    report.seconds = time.perf_counter() - started
    return report


def _check_publishable(options: PipelineOptions, api: HubApi, token: str | None, say: Callable[[str], None]) -> None:
    """Hours of downloading and composing are wasted if the upload is refused at the end: ask first."""
    out_repo = str(options.out_repo)
    say(stage_line("publish", f"checking the token and write access to {out_repo}", ahead=True))
    hub.check_write_access(api, out_repo, token=token, private=options.private, revision=options.out_revision)
    from ..publish import check_card_replaceable

    check_card_replaceable(api, out_repo, token=token, revision=options.out_revision,
                           replace_readme=options.replace_readme)


def _check_disk_first(ctx: _Context, files: TargetFiles) -> None:
    """Hours of downloading are wasted too if the composite cannot be written at the end: check the disk first."""
    composite_done = "compose" in ctx.state.stages
    need = run_disk_need(files, ctx.options, head=lambda: _head_need(ctx), composite_done=composite_done)
    if need is None:
        ctx.report.notes.append("the disk was not checked before the run: the target's sizes are unknown offline")
    else:
        check_disk(need)


def _run_stages(ctx: _Context, files: TargetFiles) -> None:
    """Target, draft, compose, verify and publish, each reused or run; then the published work files removed."""
    options = ctx.options
    target, commit = _stage_target(ctx, files)
    draft = _stage_draft(ctx, target)
    composite = _stage_compose(ctx, target, draft)
    _stage_verify(ctx, target, draft, composite)
    published = _stage_publish(ctx, composite, _provenance(ctx, commit))
    if published and not options.keep:
        for folder in (options.work_dir / "composite", options.work_dir / "draft"):
            shutil.rmtree(folder, ignore_errors=True)
        ctx.report.notes.append(
            "removed the draft and the composite from the work folder (published; --keep keeps them)"
        )


def _provenance(ctx: _Context, commit: str | None) -> Provenance:
    """Where the composite came from, as its card records it: the target's commit and files, the head, and the
    llama.cpp build verify ran against."""
    options, stages = ctx.options, ctx.state.stages
    return Provenance(
        target_repo=options.target_repo,
        target_revision=commit or options.target_revision,
        target_files=tuple(stages["target"]["detail"]["files"]),
        head_source=options.head_repo,
        head_revision=options.head_revision,
        llama_cpp_build=stages["verify"]["detail"].get("llama_cpp"),
    )


def _head_need(ctx: _Context) -> HeadNeed:
    """The draft this run writes (an upper bound, from the head's tensors and the outtype) and the head's byte
    ranges it fetches for it, known before the first of them: a Hub head's headers are read for it."""
    from gguf_mtp.jobs.convert import draft_size_bound, resolve_source

    options = ctx.options
    record = ctx.state.stages.get("draft")
    if record is not None:  # a re-run reuses it or, converting again, first removes it (_fresh_folder)
        return HeadNeed(sum(d.size for d in ctx.state.outputs(record)), done=True)
    local = Path(options.head_repo).expanduser()
    if local.is_dir():
        return HeadNeed(draft_size_bound(local, outtype=options.outtype))
    with scratch_folder(options.work_dir) as scratch:
        folder, fetched = resolve_source(options.head_repo, options.head_revision, ranges_into=scratch,
                                         tensor_data=False)
        ranges = fetched.ranges if fetched is not None else None
        return HeadNeed(draft_size_bound(folder, outtype=options.outtype),
                        ranges.scratch_bytes if ranges is not None else 0)


def _again(why: str | None) -> str:
    """The tail of a stage's first line when an earlier record did not hold."""
    return f" ({why}, so again)" if why else ""


# ----------------------------------------------------------------------------------- 1. target


def _stage_target(ctx: _Context, files: TargetFiles) -> tuple[list[FileDigest], str | None]:
    """The target's files (downloaded, or read from the target folder) and the commit they were read at."""
    stage = _target_folder_stage(ctx, files) if files.folder is not None else _target_download_stage(ctx, files)
    outputs, detail = ctx.stages.run(stage)
    ctx.report.target = [d.path for d in outputs]
    return outputs, detail.get("commit")


def _target_params(options: PipelineOptions) -> dict[str, str | None]:
    return {"repo": options.target_repo, "files": options.target_files, "revision": options.target_revision}


def _target_reused(where: str, done: str) -> Callable[[list[FileDigest], dict[str, object]], ReuseNote]:
    def note(outputs: list[FileDigest], _detail: dict[str, object]) -> ReuseNote:
        return ReuseNote(f"{len(outputs)} file(s) {where} already {done} (sizes and sha256 checked)",
                         f"{len(outputs)} file(s) {where}, checked")
    return note


def _target_summary(what: str, commit: str | None) -> str:
    return what + (f" @ {commit[:12]}" if commit else "")


def _target_download_stage(ctx: _Context, files: TargetFiles) -> Stage:
    repo = ctx.options.target_repo
    return Stage("target", stage_key("target", _target_params(ctx.options)),
                 work=lambda why: _download_target(ctx, files.names, why),
                 reused=_target_reused(f"of {repo}", "downloaded"))


def _download_target(ctx: _Context, names: list[str], why: str | None) -> StageDone:
    """Download exactly the target's shard set into the Hub cache (again, over what it holds, when ``why``)."""
    options, say = ctx.options, ctx.stages.say_stage
    repo, revision = options.target_repo, options.target_revision
    if why:
        say("target", f"{why}; downloading again")
    shown = ", ".join(n.rpartition("/")[2] for n in names)
    say("target", f"downloading {len(names)} file(s) of {repo}: {shown}")
    snapshot = hub.download_files(ctx.api, repo, [glob.escape(n) for n in names], token=ctx.token, revision=revision,
                                  cache_dir=options.cache_dir, force=why is not None)
    paths = [snapshot / n for n in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise HubError(f"{repo}: downloaded snapshot lacks {', '.join(missing)}")
    model = open_model(paths[0])  # the set is complete and consistent, as llama.cpp will see it
    outputs = ctx.stages.digest(model.paths, "target")
    commit = snapshot.name if hub.is_commit(snapshot.name) else None
    return StageDone(outputs, {"files": names, "commit": commit, "repo": repo},
                     _target_summary(f"{len(names)} file(s) of {repo}", commit))


def _target_folder_stage(ctx: _Context, files: TargetFiles) -> Stage:
    """The target read from a folder laid out like the repo (a read-only mount): nothing downloaded, nothing
    written there; online, checked against the Hub's record of the repo at ``target_revision``."""
    assert files.folder is not None
    folder = files.folder
    source = str(folder.resolve())
    return Stage("target", stage_key("target", {**_target_params(ctx.options), "dir": source}),
                 work=lambda _why: _read_target_folder(ctx, folder, files.names),
                 reused=_target_reused(f"in {folder}", "read"))


def _read_target_folder(ctx: _Context, folder: Path, names: list[str]) -> StageDone:
    options = ctx.options
    repo, revision = options.target_repo, options.target_revision
    remote = None
    if hub_access.is_offline():
        ctx.report.notes.append(
            f"offline: the files in {folder} were not checked against {repo}'s record on the Hub"
        )
    else:
        remote = hub.remote_files(ctx.api, repo, names, token=ctx.token, revision=revision)
        check_folder_matches(folder, names, remote, repo, revision)
    ctx.stages.say_stage(
        "target", f"reading {len(names)} file(s) of {repo} from the mounted repo {folder}, not downloaded"
    )
    model = open_model(folder / names[0])  # the set is complete and consistent, as llama.cpp will see it
    outputs = ctx.stages.digest(model.paths, "target")
    if remote is not None:
        check_folder_digests(folder, [(n, d.sha256) for n, d in zip(names, outputs)], remote, repo, revision)
    commit = revision if hub.is_commit(revision) else None
    what = f"{len(names)} file(s) of {repo} read from the mounted repo {folder}, not downloaded"
    detail = {"files": names, "commit": commit, "repo": repo, "dir": str(folder.resolve())}
    return StageDone(outputs, detail, _target_summary(what, commit))


# ----------------------------------------------------------------------------------- 2. draft


def _stage_draft(ctx: _Context, target: list[FileDigest]) -> FileDigest:
    """The draft converted from the head for the target."""
    options = ctx.options
    local = Path(options.head_repo).expanduser()
    source = str(local.resolve()) if local.is_dir() else options.head_repo
    params = {"head": source, "revision": options.head_revision, "outtype": options.outtype}
    (draft,), _ = ctx.stages.run(Stage(
        "draft", stage_key("draft", params, target),
        work=lambda why: _convert_draft(ctx, source, target, why),
        reused=lambda outputs, _detail: ReuseNote(f"{outputs[0].name} already converted (size and sha256 checked)",
                                                  f"{outputs[0].name}, checked"),
    ))
    ctx.report.draft = draft.path
    return draft


def _convert_draft(ctx: _Context, source: str, target: list[FileDigest], why: str | None) -> StageDone:
    from gguf_mtp.jobs.convert import convert

    options = ctx.options
    head, revision = options.head_repo, options.head_revision
    ctx.stages.say_stage("draft", f"converting the MTP head of {head} for {target[0].name}" + _again(why))
    folder = _fresh_folder(options.work_dir / "draft")
    result = convert(source, folder / "mtp-draft.gguf", target=target[0].path, outtype=options.outtype,
                     revision=revision, force=True, progress=options.progress)
    (draft,) = ctx.stages.digest([Path(result.output)], "draft")
    summary = f"{draft.name} ({draft.size:,} bytes) from {head}"
    return StageDone([draft], {"head": source, "revision": revision}, summary)


# ----------------------------------------------------------------------------------- 3. compose


def _stage_compose(ctx: _Context, target: list[FileDigest], draft: FileDigest) -> list[FileDigest]:
    """The composite: the draft spliced into the target."""
    name = ctx.options.basename or basename_of(target[0].name)
    outputs, _ = ctx.stages.run(Stage(
        "compose", stage_key("compose", {"basename": name}, [*target, draft]),
        work=lambda why: _compose(ctx, target, draft, name, why),
        reused=lambda outputs, _detail: ReuseNote(
            f"{len(outputs)} file(s) {name}-* already composed (sizes and sha256 checked)",
            f"{len(outputs)} file(s) {name}-*, checked",
        ),
    ))
    ctx.report.composite = [d.path for d in outputs]
    return outputs


def _compose(ctx: _Context, target: list[FileDigest], draft: FileDigest, name: str, why: str | None) -> StageDone:
    from gguf_mtp.jobs.compose import compose

    ctx.stages.say_stage("compose", f"{target[0].name} + {draft.name} -> {name}" + _again(why))
    folder = _fresh_folder(ctx.options.work_dir / "composite")
    result = compose(target[0].path, draft.path, folder, basename=name, force=True, progress=ctx.options.progress)
    outputs = ctx.stages.digest(result.output_paths, "compose")
    plan = result.plan
    summary = (f"{len(outputs)} file(s), {plan.target.tensor_count} target tensors + "
               f"{len(plan.renamed)} NextN tensors as blk.{plan.block}")
    return StageDone(outputs, {"block": plan.block, "added": len(plan.renamed)}, summary)


# ----------------------------------------------------------------------------------- 4. verify


def _stage_verify(ctx: _Context, target: list[FileDigest], draft: FileDigest, composite: list[FileDigest]) -> None:
    """The composite checked against both inputs (and loaded by llama.cpp when it is used)."""
    from gguf_mtp.check.llama_check import llama_cpp_available

    llama = ctx.options.llama
    use_llama = llama_cpp_available() if llama is None else llama
    build = chosen_llama_cpp(use_llama)  # another llama.cpp proves nothing about these files yet: verify again
    ctx.stages.run(Stage(
        "verify", stage_key("verify", {"llama": use_llama, "llama_cpp": build}, [*target, draft, *composite]),
        work=lambda _why: _verify(ctx, target, draft, composite, use_llama, build),
        reused=lambda _outputs, detail: ReuseNote("these exact files passed before",
                                                  detail.get("summary", "passed before")),
    ))


def _verify(ctx: _Context, target: list[FileDigest], draft: FileDigest, composite: list[FileDigest],
            use_llama: bool, build: str | None) -> StageDone:
    from gguf_mtp.check.verify import verify

    llama_part = ", llama.cpp load + MTP decode" if use_llama else ""
    ctx.stages.say_stage("verify", f"structure, target and draft bytes{llama_part}")
    result = verify(composite[0].path, target=target[0].path, draft=draft.path, llama=use_llama,
                    progress=ctx.options.progress)
    ctx.report.verification = result
    checks = list(result.checks)
    if not result.ok:
        ctx.state.forget("verify")
        raise _verification_failed(checks, composite[0].path)
    passed = sum(1 for c in checks if c.ok)
    summary = f"{passed} checks passed" + (" (llama.cpp loaded it and ran the NextN block)" if use_llama else "")
    if result.llama is not None:
        build = result.llama.llama_cpp_build  # what ran the proof, as the child reported it
    return StageDone([], {"summary": summary, "checks": [c.name for c in checks], "llama_cpp": build}, summary)


def _verification_failed(checks: list[Check], composite: Path) -> VerificationError:
    """The one line a failed verify stops the run with: the first check that failed."""
    failed = [c for c in checks if c.ok is False]
    detail = f"{failed[0].name}: {failed[0].detail}" if failed else "see the verify report"
    return VerificationError(f"the composite failed verification ({detail}); nothing was published", composite)


# ----------------------------------------------------------------------------------- 5. publish


def _stage_publish(ctx: _Context, composite: list[FileDigest], provenance: Provenance) -> bool:
    """The composite and its card uploaded to ``out_repo``; whether it was (False: no ``out_repo``)."""
    options = ctx.options
    repo = options.out_repo
    if not repo:
        ctx.report.stages.append(StageResult("publish", "skipped", "no --out-repo given"))
        return False
    params = {"repo": repo, "revision": options.out_revision, "private": options.private,
              "provenance": provenance.to_dict()}
    ctx.stages.run(Stage(
        "publish", stage_key("publish", params, composite),
        work=lambda why: _publish(ctx, repo, composite, provenance, why),
        reused=lambda _outputs, _detail: ReuseNote(
            f"{repo} already holds these files (sizes and sha256 checked on the Hub)",
            f"{repo}: the Hub still holds these files (checked)",
        ),
        still_holds=lambda _record: _hub_differs(ctx, repo, composite),
        changed="the composite or the destination changed",
    ))
    return True


def _hub_differs(ctx: _Context, repo: str, composite: list[FileDigest]) -> str | None:
    """Why ``repo`` no longer holds the composite as published (checked on the Hub), or ``None`` when it does."""
    from ..publish import compare_remote

    names = [d.name for d in composite]
    try:
        remote = hub.remote_files(ctx.api, repo, names, token=ctx.token, revision=ctx.options.out_revision)
    except HubError as e:
        return f"the Hub could not be asked ({e})"
    if remote and all(c.ok for c in compare_remote(composite, None, remote)):
        return None
    return "the Hub's files differ from the composite"


def _publish(ctx: _Context, repo: str, composite: list[FileDigest], provenance: Provenance,
             why: str | None) -> StageDone:
    from gguf_mtp._version import __version__

    from ..publish import CopySource, PublishOptions
    from ..publish import run as publish

    options = ctx.options
    ctx.stages.say_stage("publish", f"{len(composite)} file(s) + model card to {repo}" + (f" ({why})" if why else ""))
    # Files identical to the target's at the commit it was read at are copied on the Hub's side, not uploaded.
    source = CopySource(options.target_repo, provenance.target_revision)
    asked = PublishOptions(repo=repo, private=options.private, revision=options.out_revision, provenance=provenance,
                           progress=options.progress, replace_readme=options.replace_readme, copy_from=source)
    result = publish(composite[0].path, asked, api=ctx.api, token=ctx.token,
                     digests={str(d.path): d for d in composite})
    ctx.report.published = result
    sent = result.upload
    size = "" if sent is None else (f" ({human_bytes(sent.total_bytes)} uploaded, {human_bytes(sent.differing_bytes)} "
                                    "of it differing from the target set: the expected upload)")
    detail = {"repo": repo, "commit_url": result.commit_url, "gguf_mtp": __version__}
    return StageDone([], detail, f"{repo}: {result.commit_url or result.url}{size}")
