"""Measure commands fairly: wall time and peak memory of a subprocess, runs alternated, medians kept.

One run of a :class:`Command`:

1. its output folder is emptied and everything is synced, then the page cache is put in the same state
   for every command: ``cold`` evicts the command's inputs (``posix_fadvise(DONTNEED)``: what
   ``drop_caches`` does, for just these files, and allowed without root: ``/proc/sys/vm/drop_caches``
   is read-only in containers such as the project's machine), ``warm`` reads them in first;
2. the clock starts, the command runs as a subprocess, and its outputs are on disk before the clock
   stops: gguf-mtp fsyncs what it writes; ``cp`` and ``gguf_new_metadata.py`` do not, so they run as
   ``sh -c 'COMMAND && sync OUTPUTS'`` (otherwise they would be timed writing into memory, and the
   flush would not count in their CPU time); every output is fsynced once more before the clock stops;
3. peak RSS is the kernel's high-water mark of each process of the command's tree (``VmHWM`` in
   ``/proc/PID/status``, summed over the processes alive at a poll), polled every 5 ms until it exits;
   the high-water mark only grows, so a poll misses at most the growth of the last 5 ms. Not
   ``ru_maxrss``: on Linux a child starts from its parent's peak (``fork`` copies the counter and
   ``exec`` keeps the larger), so ``wait4`` or ``RUSAGE_CHILDREN`` deltas would report this script's own
   memory for a small command. The peak of anonymous memory (``RssAnon``: what a tool allocates, not
   file pages it maps) is sampled alongside;
4. CPU time is the command's own user + system time, from ``wait4`` on that child (unlike
   ``ru_maxrss``, CPU times are not inherited).

Commands of one group run alternately (A B C A B C ...), so slow drifts of a shared machine hit them alike.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from gguf_mtp.files.extents import file_extents

__all__ = [
    "CACHE_MODES",
    "Command",
    "CommandFailed",
    "Sample",
    "Summary",
    "case_conditions",
    "case_results",
    "load_average",
    "machine_info",
    "measure",
    "measure_case",
    "median_ratio",
    "median_tool_ratio",
    "own_bytes",
    "ratio_target",
    "round_text",
    "run_alternating",
    "set_cache_state",
    "summarise",
    "tool_rows",
]

CACHE_MODES = ("cold", "warm")
_SAMPLE_SECONDS = 0.005
_READ_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Command:
    """One thing to measure.

    Attributes:
        tool: what runs (``compose``, ``cp``, ``gguf_new_metadata``, ``convert``, ``startup``).
        case: which input it works on (``sharded``, ``single``, ``head``, ``none``).
        size: bytes of that input (the x axis of the plot).
        argv: the command line.
        inputs: files whose cache state is reset before each run.
        output_dir: the folder it writes into; emptied before and after each run.
        syncs_itself: whether the command fsyncs its outputs (gguf-mtp does); when not, it runs as
            ``sh -c 'COMMAND && sync OUTPUTS'``, so flushing its data to disk is part of its time and CPU.
    """

    tool: str
    case: str
    size: int
    argv: tuple[str, ...]
    inputs: tuple[Path, ...] = ()
    output_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    syncs_itself: bool = True

    @property
    def durable_argv(self) -> tuple[str, ...]:
        """The command line that also leaves the outputs on disk when the command itself does not."""
        if self.syncs_itself or self.output_dir is None:
            return self.argv
        script = 'out=$1; shift; "$@" && sync -- "$out"/*'
        return ("sh", "-c", script, "sh", str(self.output_dir), *self.argv)


@dataclass(frozen=True)
class Sample:
    """One measured run."""

    tool: str
    case: str
    size: int
    round: int
    seconds: float
    cpu_seconds: float  # user + system time of the command's process tree
    peak_rss: int  # bytes
    peak_anon: int  # bytes
    bytes_out: int
    extra_disk: int | None = None  # disk bytes its outputs alone hold (``measure(disk=True)``), else None


class CommandFailed(RuntimeError):
    """A measured command exited with a non-zero status."""


# -------------------------------------------------------------------------------------- page cache


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _preload(path: Path) -> None:
    buffer = bytearray(_READ_CHUNK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def set_cache_state(paths: Sequence[Path], mode: str, *, evict: Sequence[Path] = ()) -> None:
    """Put ``paths`` out of (``cold``) or into (``warm``) the page cache, after syncing everything and
    evicting ``evict`` (other big files, so that every run starts with as much free memory)."""
    if mode not in CACHE_MODES:
        raise ValueError(f"cache mode must be one of {CACHE_MODES}, not {mode!r}")
    os.sync()  # dirty pages cannot be evicted, and earlier runs' writeback must not land in this one
    for path in evict:
        if path.is_file():
            _evict(path)
    for path in paths:
        (_evict if mode == "cold" else _preload)(path)


# ------------------------------------------------------------------------------------------ memory


def _proc_kib(pid: int, field_name: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _tree(pid: int) -> list[int]:
    pids, stack = [], [pid]
    while stack:
        current = stack.pop()
        pids.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as f:
                stack.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            pass
    return pids


class _TreeSampler(threading.Thread):
    """Polls the process tree of ``pid``: the sum of each live process's RSS high-water mark (``VmHWM``,
    which only grows, so a poll misses at most the growth of the last interval) and of its anonymous RSS."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_rss_kib = 0
        self.peak_anon_kib = 0
        self._stop_event = threading.Event()

    def poll(self) -> None:
        pids = _tree(self.pid)
        self.peak_rss_kib = max(self.peak_rss_kib, sum(_proc_kib(p, "VmHWM:") for p in pids))
        self.peak_anon_kib = max(self.peak_anon_kib, sum(_proc_kib(p, "RssAnon:") for p in pids))

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.poll()
            self._stop_event.wait(_SAMPLE_SECONDS)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# ----------------------------------------------------------------------------------------- running


def _fsync_tree(folder: Path) -> int:
    """fsync every file under ``folder``; returns their total size."""
    total = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def _empty(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def own_bytes(folder: Path) -> int:
    """Disk bytes the files under ``folder`` hold that no other file shares: the blocks of each file's
    extent map (FIEMAP, after the kernel wrote the file back) not flagged shared, so a reflink of an input
    costs nothing and a hole costs nothing; ``st_blocks`` x 512 for a file whose filesystem has no extent
    map (nothing there can be shared). Only these files are looked at, so nothing else writing to the
    same disk changes the count."""
    total = 0
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            extents = file_extents(fd)
            total += os.fstat(fd).st_blocks * 512 if extents is None else sum(
                e.length for e in extents if not e.shared)
        finally:
            os.close(fd)
    return total


def measure(
    command: Command, *, cache: str = "cold", round_no: int = 0, log_file: Path | None = None,
    evict: Sequence[Path] = (),
    disk: bool = False,
) -> Sample:
    """Run ``command`` once under the rules of this module and measure it.

    Args:
        command: what to run.
        cache: ``cold`` (evict its inputs first) or ``warm`` (read them in first).
        round_no: recorded in the sample, to pair runs of one round.
        log_file: where the command's stdout and stderr go (default: discarded).
        evict: other files to drop from the page cache first (the benchmark's other inputs): without
            that, whichever command runs first after a big one pays for reclaiming its cache.
        disk: also record the sample's ``extra_disk``: the disk bytes the command's outputs hold that no
            other file shares (:func:`own_bytes` of its output folder, just after the run).

    Returns:
        The :class:`Sample`; the command's outputs are deleted again.

    Raises:
        CommandFailed: the command exited with a non-zero status (its output tail is in the message).
    """
    _empty(command.output_dir)
    if command.output_dir is not None:
        command.output_dir.mkdir(parents=True)
    set_cache_state(command.inputs, cache, evict=evict)
    env = {**os.environ, **command.env}
    log_path = log_file or Path(os.devnull)
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        process = subprocess.Popen(command.durable_argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        sampler = _TreeSampler(process.pid)
        sampler.start()
        try:
            # CPU times from wait4 are the child's own; its ru_maxrss is not (see the module docstring).
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            sampler.stop()
        process.returncode = os.waitstatus_to_exitcode(status)
        bytes_out = _fsync_tree(command.output_dir) if command.output_dir is not None else 0
        seconds = time.perf_counter() - started
    extra_disk = own_bytes(command.output_dir) if disk and command.output_dir is not None else None
    try:
        if process.returncode != 0:
            tail = Path(log_path).read_text(errors="replace")[-2000:] if log_file else ""
            raise CommandFailed(f"{' '.join(command.argv)} exited with {process.returncode}\n{tail}")
    finally:
        _empty(command.output_dir)
    return Sample(
        tool=command.tool,
        case=command.case,
        size=command.size,
        round=round_no,
        seconds=seconds,
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        peak_rss=sampler.peak_rss_kib * 1024,
        peak_anon=sampler.peak_anon_kib * 1024,
        bytes_out=bytes_out,
        extra_disk=extra_disk,
    )


def run_alternating(
    group: Sequence[Command],
    *,
    repeat: int,
    cache: str,
    log_dir: Path,
    warmup: int = 0,
    evict: Sequence[Path] = (),
    report: Callable[[Sample], None] = lambda s: None,
    disk: bool = False,
) -> list[Sample]:
    """Run every command of ``group`` ``repeat`` times, alternating (A B A B ...).

    Args:
        group: the commands to compare.
        repeat: rounds.
        cache: see :func:`measure`.
        log_dir: each command's output goes to ``<tool>-<case>.log`` there (the last run's).
        warmup: rounds run first and not kept (they absorb one-time costs: bytecode caches, the memory
            the previous group's files held).
        evict: see :func:`measure`.
        report: called with each kept sample as soon as it is measured.
        disk: see :func:`measure`.

    Returns:
        The kept samples, in the order they ran (rounds numbered from 0 after the warm-up).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    samples = []
    for round_no in range(-warmup, repeat):
        for command in group:
            log_file = log_dir / f"{command.tool}-{command.case}.log"
            sample = measure(command, cache=cache, round_no=round_no, log_file=log_file, evict=evict, disk=disk)
            if round_no >= 0:
                samples.append(sample)
                report(sample)
    return samples


# --------------------------------------------------------------------------------------- summaries


@dataclass(frozen=True)
class Summary:
    """Medians (and spread) of the samples of one command."""

    tool: str
    case: str
    size: int
    runs: int
    median_seconds: float
    min_seconds: float
    max_seconds: float
    median_cpu_seconds: float
    median_rss: int
    max_rss: int
    max_anon: int
    bytes_out: int

    @property
    def throughput(self) -> float:
        """Bytes written per second, at the median time."""
        return self.bytes_out / self.median_seconds if self.median_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "throughput_bytes_per_s": round(self.throughput)}


def summarise(samples: Sequence[Sample]) -> list[Summary]:
    """One :class:`Summary` per (tool, case, size), in the order the commands first ran."""
    groups: dict[tuple[str, str, int], list[Sample]] = {}
    for sample in samples:
        groups.setdefault((sample.tool, sample.case, sample.size), []).append(sample)
    return [
        Summary(
            tool=tool,
            case=case,
            size=size,
            runs=len(runs),
            median_seconds=statistics.median(s.seconds for s in runs),
            min_seconds=min(s.seconds for s in runs),
            max_seconds=max(s.seconds for s in runs),
            median_cpu_seconds=statistics.median(s.cpu_seconds for s in runs),
            median_rss=int(statistics.median(s.peak_rss for s in runs)),
            max_rss=max(s.peak_rss for s in runs),
            max_anon=max(s.peak_anon for s in runs),
            bytes_out=max(s.bytes_out for s in runs),
        )
        for (tool, case, size), runs in groups.items()
    ]


def median_ratio(
    samples: Sequence[Sample], numerator: tuple[str, str], denominator: tuple[str, str], size: int
) -> float | None:
    """Median over rounds of time(numerator) / time(denominator): each pair ran back to back, under the
    same conditions, so their ratio is steadier than a ratio of medians."""
    by_round: dict[int, dict[tuple[str, str], float]] = {}
    for s in samples:
        if s.size == size:
            by_round.setdefault(s.round, {})[(s.tool, s.case)] = s.seconds
    ratios = [r[numerator] / r[denominator] for r in by_round.values() if numerator in r and denominator in r]
    return statistics.median(ratios) if ratios else None


def median_tool_ratio(samples: Sequence[Sample], ours: str, theirs: str) -> float | None:
    """:func:`median_ratio` for a group of one case and one size: tools named by ``Sample.tool`` alone."""
    pairs = {s.tool: (s.case, s.size) for s in samples}
    if ours not in pairs or theirs not in pairs:
        return None
    return median_ratio(samples, (ours, pairs[ours][0]), (theirs, pairs[theirs][0]), pairs[ours][1])


# ----------------------------------------------------------------------------------------- machine


def _first_line(path: str, prefix: str) -> str | None:
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    return None


def _filesystem(path: Path) -> str:
    best, found = "", "?"
    target = str(path.resolve())
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            device, mount, fstype, *_ = line.split()
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, found = mount, f"{fstype} on {device}"
    return found


def _version(command: Sequence[str]) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout
        return out.splitlines()[0].strip() if out else None
    return None


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine_info(work_dir: Path) -> dict[str, Any]:
    """Where and with what the benchmark ran."""
    mem_kib = _first_line("/proc/meminfo", "MemTotal")
    repo = Path(__file__).resolve().parent.parent
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _first_line("/proc/cpuinfo", "model name") or platform.processor(),
        "cpus": os.cpu_count(),
        "memory_bytes": int(mem_kib.split()[0]) * 1024 if mem_kib else None,
        "kernel": platform.release(),
        "filesystem": _filesystem(work_dir),
        "python": platform.python_version(),
        "gguf": _package_version("gguf"),
        "gguf_mtp": _package_version("gguf-mtp"),
        "cp": _version(["cp", "--version"]),
        "commit": _version(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"]),
        "executable": sys.executable,
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------------------------ case helpers


def round_text(sample: Sample) -> str:
    """One kept round of a case, as the case's log shows it: time and peak RSS."""
    return (f"  round {sample.round + 1}: {sample.tool}: {sample.seconds:.2f} s, "
            f"peak RSS {sample.peak_rss / 2**20:.0f} MiB")


def measure_case(
    group: Sequence[Command], label: str, *, repeat: int, warmup: int, cache: str, log_dir: Path,
    log: Callable[[str], None], evict: Sequence[Path] = (), disk: bool = False,
    describe: Callable[[Sample], str] = round_text,
) -> list[Sample]:
    """Say what is measured (``measuring LABEL: A | B, N round(s)``), run ``group`` alternating
    (:func:`run_alternating`), and log each kept round with ``describe``; returns the kept samples."""
    log(f"measuring {label}: " + " | ".join(c.tool for c in group) + f", {repeat} round(s)")
    return run_alternating(group, repeat=repeat, warmup=warmup, cache=cache, log_dir=log_dir, evict=evict,
                           disk=disk, report=lambda s: log(describe(s)))


def tool_rows(samples: Sequence[Sample], *, bytes_out: bool = True) -> list[dict[str, Any]]:
    """One summary row per tool of a one-size case, in the order the tools ran: runs, median time and CPU
    time, bytes written (unless ``bytes_out`` is false) and the highest peak RSS."""
    rows = []
    for tool in dict.fromkeys(s.tool for s in samples):
        mine = [s for s in samples if s.tool == tool]
        row: dict[str, Any] = {"tool": tool, "runs": len(mine),
                               "median_seconds": statistics.median(s.seconds for s in mine),
                               "median_cpu_seconds": statistics.median(s.cpu_seconds for s in mine)}
        if bytes_out:
            row["bytes_out"] = max(s.bytes_out for s in mine)
        row["max_rss"] = max(s.peak_rss for s in mine)
        rows.append(row)
    return rows


def case_conditions(load_before: list[float]) -> dict[str, Any]:
    """The ``conditions`` of a case's results: the load average before and now, and the CPU count."""
    return {"load_before": load_before, "load_after": load_average(), "cpus": os.cpu_count()}


def case_results(config: dict[str, Any], load_before: list[float], inputs: dict[str, Any],
                 samples: Sequence[Sample], rows: list[dict[str, Any]], **rest: Any) -> dict[str, Any]:
    """The results record of a one-group case: schema, config, conditions, inputs, the raw samples and the
    summary rows, then ``rest`` (ratios, targets, notes) in the order given."""
    return {"schema": 1, "config": config, "conditions": case_conditions(load_before), "inputs": inputs,
            "samples": [asdict(s) for s in samples], "summary": rows, **rest}


def ratio_target(goal: str, ratio: float | None, ours: dict[str, Any], theirs: dict[str, Any],
                 limit: float) -> dict[str, Any]:
    """The goal "time(ours) / time(theirs) <= ``limit``": the same-round ratio and both medians, met or not
    (not met when nothing was measured)."""
    return {"goal": goal,
            "measured": None if ratio is None else f"{ratio:.2f}x ({ours['median_seconds']:.2f} s vs "
                                                   f"{theirs['median_seconds']:.2f} s)",
            "met": ratio is not None and ratio <= limit}
