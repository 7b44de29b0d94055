"""Write planned output files safely and fast.

A planned file is a list of segments: literal bytes (a header), a byte range of an input file copied
verbatim, zero padding, or bytes generated on the fly in bounded chunks (converted tensor data).
Copies go through the kernel (``copy_file_range``, then ``sendfile``, then a
plain read/write loop where neither works), so tensor data never passes through Python buffers, and
memory stays flat whatever the size.

Safety rules: every output is written under a temporary name in its final folder, fsynced, and only
renamed into place once every file of the set is complete (under a lock on the output folder, with
no-replace renames and a journal, see :mod:`gguf_mtp.files.commit`); any failure or interrupt removes the
temporary files and puts replaced files back; an output is never allowed to be one of the inputs (links
included); an existing output is only replaced with ``force``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.files.commit import (
    FileIdentity,
    Replacement,
    backup_name,
    commit,
    folder_lock,
    pending_recovery,
    recover,
    remove_leftovers,
)
from gguf_mtp.files.create import create_exclusive, temporary_name, write_all
from gguf_mtp.files.kernel_copy import ENV_COPY_METHOD, CopyTally, copy_method, shareable_bytes
from gguf_mtp.files.kernel_copy import copy_range as _copy  # a module global: the fault tests wrap it
from gguf_mtp.files.plan import Bytes, Generated, OutputFile, Zeros
from gguf_mtp.files.progress import ProgressBar, progress_bar

from .errors import GGUFMTPError, OutputWriteError, UnsafeOutputError
from .text import human_bytes

__all__ = [
    "OutputCheck",
    "WriteStats",
    "check_output_folder",
    "check_outputs",
    "copy_method",
    "signals_as_interrupt",
    "write_outputs",
]

#: At most this many files are fsynced at once (a set of hundreds of shards must not start hundreds of threads).
_MAX_FSYNC_THREADS = 8
logger = logging.getLogger(__name__)


def _write_generated(fd: int, segment: Generated, bar: ProgressBar) -> None:
    written = 0
    for chunk in segment.chunks():
        data = memoryview(chunk).cast("B")
        write_all(fd, data)
        written += len(data)
        bar.update(len(data))
    if written != segment.nbytes:
        raise OutputWriteError(f"a generated segment gave {written:,} bytes, planned {segment.nbytes:,}")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output_folder(folder: str | os.PathLike[str], parameter: str | None = "output_dir") -> None:
    """Refuse an output folder that exists and is not a folder (a file, a dangling link), in one line
    naming it (and the ``parameter`` that gave it).

    Raises:
        UnsafeOutputError: ``folder`` exists and is not a folder.
    """
    if os.path.lexists(folder) and not os.path.isdir(folder):
        what = "a file" if os.path.isfile(folder) else "not a folder"
        if parameter:
            message = f"{parameter} must be a folder (the outputs go inside it), but this is {what}"
        else:
            message = f"the outputs go into this folder, but it is {what}"
        raise UnsafeOutputError(message, folder, parameter)


def check_outputs(files: Sequence[OutputFile], inputs: Sequence[Path], *, force: bool) -> list[Path]:
    """Refuse outputs that are inputs (through any link), collide, exist without ``force``, or cannot be
    written (read-only folder, not enough free space, a name the filesystem refuses).

    Returns:
        The outputs that exist and ``force`` replaces.

    Raises:
        UnsafeOutputError: one line naming the file and the reason.
    """
    try:
        return _check_outputs(files, inputs, force=force)
    except UnsafeOutputError:  # an OSError too: already one line
        raise
    except OSError as e:  # a name too long, a symlink loop, a folder we may not look into
        where = e.filename if e.filename is not None else (files[0].path if files else None)
        raise UnsafeOutputError(f"cannot use this output path: {e.strerror or e}", where) from None


def _check_outputs(files: Sequence[OutputFile], inputs: Sequence[Path], *, force: bool) -> list[Path]:
    finals = [f.path for f in files]
    replaced: list[Path] = []
    if len({os.path.abspath(p) for p in finals}) != len(finals):
        raise UnsafeOutputError("two outputs would have the same name", finals[0].parent)
    all_inputs = list(inputs) + [s for f in files for s in f.sources]
    for final in finals:
        for source in all_inputs:
            if _same_file(final, source) or os.path.abspath(final) == os.path.abspath(source):
                raise UnsafeOutputError(f"output would overwrite the input {source}", final)
        if final.is_dir():
            raise UnsafeOutputError("output name is a folder", final)
        if final.exists() or final.is_symlink():
            if not force:
                raise UnsafeOutputError("output exists (use force to replace it)", final, parameter="force")
            replaced.append(final)
    folders = {f.parent for f in finals}
    for folder in folders:
        check_output_folder(folder, None)
        probe = folder
        while not probe.exists():
            probe = probe.parent
        if not os.access(probe, os.W_OK | os.X_OK):
            raise UnsafeOutputError("output folder is not writable", probe)
    needed = sum(f.size for f in files)
    probe = finals[0].parent
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:  # on a reflink filesystem, data shared with the inputs takes no new blocks
        needed -= shareable_bytes(files, probe)
    # Files replaced with --force free their space only after the rename: do not count it.
    if needed > free:  # named by the output folder, whether it exists yet (the real run) or not (a dry run)
        raise UnsafeOutputError(f"not enough free space: {needed:,} bytes needed, {free:,} free", finals[0].parent)
    return replaced


#: Signals that end a run like Ctrl-C while it writes (temporary files removed, old files put back):
#: SIGTERM (``kill``), SIGHUP (the terminal closed, the SSH session dropped).
INTERRUPTING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM and SIGHUP like Ctrl-C for the duration (while writing: temporary files are cleaned up either way;
    while benchmarking: the server is stopped).

    A signal the process ignores (``nohup`` ignores SIGHUP) stays ignored: the user asked the run to
    survive it.
    """

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous: dict[int, Any] = {}
    try:
        for signum in INTERRUPTING_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, handler)
        # Past a file-size limit, let write() fail with EFBIG (cleaned up) instead of dying of SIGXFSZ.
        previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


@dataclass(frozen=True)
class OutputCheck:
    """What the checks before the first byte found (:func:`write_outputs`, a dry run's included)."""

    replaced: tuple[Path, ...] = ()  # existing outputs that ``force`` replaces
    notes: tuple[str, ...] = ()  # e.g. an interrupted earlier run rolled back


@dataclass(frozen=True)
class WriteStats:
    """What :func:`write_outputs` did (nothing but its checks with ``dry_run``)."""

    bytes_written: int
    seconds: float
    copy_methods: tuple[str, ...]
    bytes_shared: int = 0  # of bytes_written: extents shared with an input (reflink), not copied
    notes: tuple[str, ...] = ()  # e.g. an interrupted earlier run rolled back
    replaced: tuple[Path, ...] = ()  # existing outputs replaced (with ``dry_run``: that would be)


def write_outputs(
    files: Sequence[OutputFile],
    *,
    inputs: Sequence[Path] = (),
    force: bool = False,
    progress: bool = True,
    desc: str = "writing",
    dry_run: bool = False,
    on_checked: Callable[[OutputCheck], None] | None = None,
) -> WriteStats:
    """Write every planned file atomically: all appear under their final names, or none does.

    The output folder is locked for the whole run (a second gguf-mtp writer is refused, never merged);
    a rename phase that a killed earlier run left half done is finished first (rolled forward or back),
    and the temporary files of dead runs are removed; files replaced with ``force`` are moved aside and
    only deleted once the whole new set is in place (see :mod:`gguf_mtp.files.commit`). A folder this
    run made is removed again when it commits nothing.

    Args:
        files: the planned outputs.
        inputs: input files that must never be overwritten (segment sources are added automatically).
        force: replace existing outputs.
        progress: show a byte progress bar on stderr (only when it is a terminal).
        dry_run: make every check a real run makes before its first byte (the same ones, so a dry run
            is refused exactly when the real run would be), change nothing, and return.
        on_checked: called once every check passed, before the first byte is written.

    Raises:
        UnsafeOutputError: see :func:`check_outputs`; or another run holds the output folder.
        OutputWriteError: an I/O error while writing (the message says which file and why); temporary
            files were removed, no new output was left behind, and replaced files are back in place.
    """
    groups: dict[Path, list[OutputFile]] = {}
    for planned in files:
        groups.setdefault(Path(os.path.abspath(planned.path.parent)), []).append(planned)
    created: list[Path] = []  # folders this run made: removed again if it commits nothing
    with ExitStack() as locks:
        try:
            check = _check_before_writing(files, inputs, groups, locks, created, force=force, dry_run=dry_run)
            if on_checked is not None:
                on_checked(check)
            if dry_run:
                return WriteStats(0, 0.0, (), 0, check.notes, check.replaced)
            stats = _write_locked(files, groups, force=force, progress=progress, desc=desc)
        except BaseException:
            # Refused, failed or interrupted before anything was committed: leave nothing, not even the
            # folder this run made (rmdir only ever removes an empty folder; one that existed is not in
            # the list). Still under the lock, so no other run is using it.
            for folder in reversed(created):
                with suppress(OSError):
                    folder.rmdir()
            raise
    return WriteStats(
        stats.bytes_written, stats.seconds, stats.copy_methods, stats.bytes_shared, check.notes, check.replaced
    )


def _check_before_writing(
    files: Sequence[OutputFile],
    inputs: Sequence[Path],
    groups: dict[Path, list[OutputFile]],
    locks: ExitStack,
    created: list[Path],
    *,
    force: bool,
    dry_run: bool,
) -> OutputCheck:
    """Everything :func:`write_outputs` does before its first byte, for a real run and a dry run alike.

    A real run creates each output folder (adding the folders it made to ``created`` as it makes them),
    locks it until ``locks`` closes, settles what a killed run left there (its journal: rolled back or
    forward) and removes dead runs' temporary files.
    A dry run changes nothing: a folder that does not exist yet is only checked for whether it can be
    made; an existing one is locked just for the checks (a folder another run writes into is refused
    all the same) and an interrupted run's journal is only read (a journal the real run refuses is
    refused alike).
    """
    notes: list[str] = []
    for folder in sorted(groups):
        missing = _missing_folders(folder)
        if dry_run and missing:
            continue  # nothing to lock, no journal: the real run makes the folder
        if not dry_run:
            _make_folder(folder)
            created.extend(missing)
        try:
            if dry_run:
                with folder_lock(folder):
                    found = [pending_recovery(folder)]
            else:
                locks.enter_context(folder_lock(folder))
                found = [recover(folder), remove_leftovers(folder)]
        except GGUFMTPError:  # an OSError too (a refused journal, a failed roll-back): already one line
            raise
        except OSError as e:  # a folder we may not open, a journal we may not remove
            raise UnsafeOutputError(f"cannot use this output folder: {e.strerror or e}", folder) from None
        for note in found:
            if note is not None:
                logger.warning(note)
                notes.append(note)
    replaced = check_outputs(files, inputs, force=force)
    return OutputCheck(tuple(replaced), tuple(notes))


def _missing_folders(folder: Path) -> list[Path]:
    """The folders to make for ``folder`` (outermost first), once it is known they can be made: a file in
    the way, or a parent we may not write in, is refused (one line)."""
    missing: list[Path] = []
    probe = folder
    while not os.path.lexists(probe) and probe != probe.parent:  # lexists never raises
        missing.insert(0, probe)
        probe = probe.parent
    if not missing:
        check_output_folder(folder, None)
    elif not probe.is_dir():  # a file (or a dangling link) where a parent folder must be
        raise UnsafeOutputError(f"cannot use this output path: {os.strerror(errno.ENOTDIR)}", folder)
    elif not os.access(probe, os.W_OK | os.X_OK):
        raise UnsafeOutputError("output folder is not writable", probe)
    return missing


def _make_folder(folder: Path) -> None:
    """Create the output folder (to lock it), checked by :func:`_missing_folders`; one line when that fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        probe = folder
        while not os.path.lexists(probe) and probe != probe.parent:  # lexists never raises
            probe = probe.parent
        if isinstance(e, PermissionError):
            raise UnsafeOutputError("output folder is not writable", probe) from None
        raise UnsafeOutputError(f"cannot use this output path: {e.strerror or e}", folder) from None


def _write_locked(
    files: Sequence[OutputFile], groups: dict[Path, list[OutputFile]], *, force: bool, progress: bool, desc: str
) -> WriteStats:
    """The writing and the rename phase of :func:`write_outputs`, with every output folder locked."""
    started = time.perf_counter()
    method = copy_method()
    logger.info(
        "writing %d file(s), %s; copy method: %s",
        len(files),
        human_bytes(sum(f.size for f in files)),
        "auto (reflink where possible, else copy_file_range, sendfile, read/write)"
        if method == "auto"
        else f"{method} (forced by {ENV_COPY_METHOD})",
    )
    partials: dict[Path, os.stat_result] = {}  # temporary files this run created, with their fstat then
    methods: set[str] = set()
    total = sum(f.size for f in files)
    current = files[0].path if files else Path()
    replacing = False
    try:
        with signals_as_interrupt(), progress_bar(total, desc, enabled=progress) as bar:
            tally = CopyTally(bar)  # counts shared (cloned) bytes apart from copied ones
            for planned in files:
                current = planned.path
                methods |= _write_partial(planned, bar, tally, method, partials)
            # What is on disk when, and why (each step must be durable before the next one can be, or a crash
            # could leave a set that looks complete and is not):
            # 1. every new file's bytes and size: one fsync per file, here, before the journal (without it a
            #    crash after the renames could leave final names over empty or partial data: delayed
            #    allocation). Once all are written, not after each: that would stall reading the next file
            #    (+20 % for 3 shards, issue 6); and all at once, one thread each, so the disk gets every file's
            #    write-back in one queue instead of one file's at a time (issue 41). Starting each file's
            #    write-back early (sync_file_range) was measured slower on a cold cache (issue 41): the disk
            #    then reads and writes at once.
            # 2. the journal: its file fsynced, renamed, the folder fsynced, before the first final name
            #    changes (commit._write_journal): a crash during the renames finds it and rolls back or forward.
            # 3. the renames and the journal's removal: one folder fsync after the unlink (commit.remove_journal)
            #    makes both durable before the run returns; the renames need no fsync of their own, a crash
            #    before it leaves the journal, and the next run settles the set by it (commit.recover).
            for planned, error in _fsync_all(files, partials):
                current = planned.path
                raise error
            # The entry point (shard 1) appears last, so a set that is visible is a complete set; the old
            # files (--force) are moved aside first and come back if anything fails (gguf_mtp.files.commit).
            for folder, planned_files in groups.items():
                current = planned_files[0].path
                entries = _replacements(planned_files, partials, force)
                replacing = replacing or any(e.backup for e in entries)
                commit(folder, entries)
                logger.info(
                    "committed %d file(s) in %s: %s%s",
                    len(entries),
                    folder,
                    ", ".join(p.path.name for p in planned_files),
                    " (replacing the previous files)" if any(e.backup for e in entries) else "",
                )
                for planned in planned_files:
                    del partials[temporary_name(planned.path)]
    except OutputWriteError as e:  # before OSError, which it also is
        _discard(partials)
        raise OutputWriteError(f"{e.message}; {_left_behind(replacing)}", e.path or current) from None
    except GGUFMTPError:  # an output that appeared since the checks (UnsafeOutputError): already one line
        _discard(partials)
        raise
    except OSError as e:
        _discard(partials)
        reason = e.strerror or str(e)
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            reason = f"{reason} (disk full or file too large)"
        raise OutputWriteError(f"writing failed: {reason}; {_left_behind(replacing)}", current) from None
    except BaseException:
        _discard(partials)
        raise
    if tally.shared:
        methods.add("reflink")
    return WriteStats(total, time.perf_counter() - started, tuple(sorted(methods)), tally.shared)


def _write_partial(
    planned: OutputFile, bar: ProgressBar, tally: CopyTally, method: str, partials: dict[Path, os.stat_result]
) -> set[str]:
    """Write one output under its temporary name (added to ``partials`` once created, never through a
    link planted there); the copy methods used."""
    partial = temporary_name(planned.path)
    fd = create_exclusive(partial)
    try:
        partials[partial] = os.fstat(fd)
    except BaseException:
        os.close(fd)
        with suppress(OSError):
            os.unlink(partial)
        raise
    before = (tally.shared, tally.copied)
    used: set[str] = set()
    try:
        _write_segments(fd, planned, bar, tally, method, used)
    finally:
        os.close(fd)
    _log_written(planned, used, tally.shared - before[0], tally.copied - before[1])
    if os.path.getsize(partial) != planned.size:
        raise OutputWriteError(f"wrote {os.path.getsize(partial):,} bytes, planned {planned.size:,}", planned.path)
    return used


def _replacements(
    planned_files: Sequence[OutputFile], partials: dict[Path, os.stat_result], force: bool
) -> list[Replacement]:
    """The renames that publish one folder's outputs, the entry point (shard 1) last; old files moved
    aside; each with the identities of the new and the old file, for the journal."""
    entries = []
    for planned in reversed(planned_files):
        partial = temporary_name(planned.path)
        new = FileIdentity.of(partial)
        if new is None or not new.same_inode(partials[partial]):
            raise UnsafeOutputError("the temporary file was replaced by another program during the run", partial)
        old = FileIdentity.of(planned.path)
        if old is not None and not force:  # appeared since the checks: never replaced without --force
            raise UnsafeOutputError("output exists (use force to replace it)", planned.path, parameter="force")
        backup = backup_name(planned.path.name) if old is not None else None
        entries.append(Replacement(partial.name, planned.path.name, new, backup, old))
    return entries


def _log_written(planned: OutputFile, used: set[str], shared: int, copied: int) -> None:
    """One INFO line per finished (not yet committed) output: how its bytes were made."""
    written = planned.size - shared - copied  # headers, padding, converted tensor data
    how = ", ".join(sorted(used | ({"reflink"} if shared else set()))) or "no copies"
    logger.info(
        "wrote %s (%s bytes): %s bytes shared with the inputs (reflink), %s copied (%s), %s written",
        planned.path.name,
        f"{planned.size:,}",
        f"{shared:,}",
        f"{copied:,}",
        how,
        f"{written:,}",
    )


def _left_behind(replacing: bool) -> str:
    if replacing:
        return "no output was left behind, the previous files are back in place"
    return "no output was left behind"


def _write_segments(
    fd: int, planned: OutputFile, bar: ProgressBar, tally: CopyTally, method: str, methods: set[str]
) -> None:
    sources: dict[Path, int] = {}
    try:
        for segment in planned.segments:
            if isinstance(segment, Bytes):
                write_all(fd, segment.data)
                bar.update(segment.nbytes)
            elif isinstance(segment, Zeros):
                write_all(fd, b"\0" * segment.nbytes)
                bar.update(segment.nbytes)
            elif isinstance(segment, Generated):
                _write_generated(fd, segment, bar)
            else:
                if segment.source not in sources:
                    sources[segment.source] = _open_source(segment.source)
                try:
                    source_fd = sources[segment.source]
                    methods.add(_copy(source_fd, fd, segment.offset, segment.nbytes, tally, method))
                except OutputWriteError as e:  # the input shrank while we copied it
                    raise OutputWriteError(f"{e.message} in {segment.source}", planned.path) from None
    finally:
        for source_fd in sources.values():
            os.close(source_fd)


def _open_source(path: Path) -> int:
    """Open an input to copy from, telling the kernel it is read front to back (as ``cp`` does): a larger
    readahead, so a cold input streams at the disk's speed rather than in small reads."""
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):  # advice only: a filesystem may not take it
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return fd


def _discard(partials: dict[Path, os.stat_result]) -> None:
    """Remove this run's temporary files (only a name that is still the file this run created)."""
    for partial, created in partials.items():
        with suppress(OSError):
            if os.path.samestat(os.lstat(partial), created):
                os.unlink(partial)


def _fsync_all(
    files: Sequence[OutputFile], partials: dict[Path, os.stat_result]
) -> list[tuple[OutputFile, BaseException]]:
    """fsync every output's temporary file at once, one thread each, so the kernel writes them back as one
    queue; returns the failures, in the outputs' order."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(files), _MAX_FSYNC_THREADS))) as pool:
        futures = [(planned, pool.submit(_fsync_file, temporary_name(planned.path), partials)) for planned in files]
    return [(planned, error) for planned, future in futures if (error := future.exception()) is not None]


def _fsync_file(path: Path, partials: dict[Path, os.stat_result]) -> None:
    # By name again (the descriptors were closed to keep few open): never through a link, never waiting on
    # a FIFO someone put in its place (O_NONBLOCK), and only the very file this run created.
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not os.path.samestat(os.fstat(fd), partials[path]):
            raise UnsafeOutputError("the temporary file was replaced by another program during the run", path)
        os.fsync(fd)
    finally:
        os.close(fd)
