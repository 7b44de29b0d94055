"""The reflink case of the benchmark: compose, strip and graft on an XFS filesystem with reflink.

On a filesystem that can share extents (XFS with ``reflink=1``, btrfs, ZFS with block cloning), ``cp``
copies a file in milliseconds and uses no extra disk; gguf-mtp lays its outputs out so that the
unchanged tensor data shares the input's extents too (issue 13). This case measures that, on a
loop-mounted XFS image (made once in the work folder and reused; its file is sparse):

- ``gguf-mtp compose`` of the split target + draft, ``strip`` of the composite, ``graft`` of the
  composite's NextN block into the target (``--no-verify``: the copy alone, as for compose);
- against ``cp --reflink=always`` and ``cp --reflink=never`` of the target's files and the draft;
- and the interpreter's start-up (``python -m gguf_mtp --version``), the floor of every gguf-mtp run.

Each run records its time and the disk its outputs cost: the blocks of their extent maps that no other
file shares (``perf_lib.own_bytes``: a block shared with an input is free, and nothing else writing to
the disk counts). Needs root (``mount -o loop``) and ``mkfs.xfs`` (Debian's ``xfsprogs``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from perf_inputs import SyntheticTarget, TargetSpec, ensure_target, make_composite, size_label
from perf_lib import Command, Sample, case_conditions, load_average, measure_case
from perf_report import goals_table, write_json_and_markdown

from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

__all__ = [
    "REFLINK_MD",
    "reflink_unavailable",
    "render_reflink_markdown",
    "run_reflink",
    "write_reflink_report",
    "xfs_mount",
]

PYTHON = sys.executable
REFLINK_MD = "reflink.md"
REFLINK_JSON = "reflink.json"
#: Goals of issue 13 at the largest size (3 GiB in a full run).
MAX_COMPOSE_SECONDS = 0.3
MAX_COMPOSE_OVER_CP_REFLINK = 1.2  # of cp --reflink=always's time plus the interpreter's start-up
EXTRA_DISK_ALLOWANCE = 2**20  # compose may use the draft's size plus this much


def reflink_unavailable() -> str | None:
    """Why the reflink case cannot run here (``None`` when it can)."""
    if os.geteuid() != 0:
        return "loop mounts need root"
    if shutil.which("mkfs.xfs") is None:
        return "mkfs.xfs not found (apt-get install xfsprogs)"
    return None


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


@contextlib.contextmanager
def xfs_mount(base: Path, image_bytes: int) -> Iterator[Path]:
    """Mount ``base/xfs-reflink.img`` (made with ``mkfs.xfs -m reflink=1`` if missing or too small) on
    ``base/xfs-mnt`` and yield the mount point; unmounted afterwards, the image is kept for the next run."""
    base.mkdir(parents=True, exist_ok=True)
    image, mount_point = base / "xfs-reflink.img", base / "xfs-mnt"
    if os.path.ismount(mount_point):
        _run("umount", str(mount_point))
    if not image.exists() or image.stat().st_size < image_bytes:
        image.unlink(missing_ok=True)
        with open(image, "wb") as f:
            f.truncate(image_bytes)  # sparse: it costs only what is written into it
        made = _run("mkfs.xfs", "-q", "-m", "reflink=1", str(image))
        if made.returncode:
            image.unlink(missing_ok=True)
            raise RuntimeError(f"mkfs.xfs -m reflink=1 {image} failed: {made.stderr.strip()}")
    mount_point.mkdir(exist_ok=True)
    mounted = _run("mount", "-o", "loop", str(image), str(mount_point))
    if mounted.returncode:
        raise RuntimeError(f"mount -o loop {image} failed: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if _run("umount", str(mount_point)).returncode:
            _run("umount", "-l", str(mount_point))


def _env() -> dict[str, str]:
    return {"GGUF_MTP_DISABLE_PROGRESS": "1", "PYTHONUNBUFFERED": "1"}


def _converted_draft(inputs: Path, target: SyntheticTarget, log: Callable[[str], None]) -> Path:
    """The draft as users make it, ``gguf-mtp convert HEAD --target TARGET``: an MTPv2 head checkpoint of the
    target's dimensions converted for it, so its data lands in step where compose appends it."""
    label = size_label(target.spec.size)
    head = inputs / f"head-{label}"
    if not (head / "config.json").exists():
        log(f"writing an MTPv2 head checkpoint for the {label} target")
        write_mtpv2_checkpoint(head, hparams=target.hparams, files=2)
    draft = inputs / f"draft-{label}.gguf"
    done = subprocess.run([PYTHON, "-m", "gguf_mtp", "convert", str(head), "-o", str(draft), "--target",
                           str(target.first), "--force", "--quiet"], capture_output=True, text=True, check=False,
                          env={**os.environ, **_env()})
    if done.returncode:
        raise RuntimeError(f"convert for the reflink inputs failed: {done.stderr.strip()}")
    return draft


def reflink_group(mount: Path, target: SyntheticTarget, draft: Path, composite: Path) -> list[Command]:
    """compose | cp --reflink=always | cp --reflink=never | strip | graft | start-up, all on ``mount``."""
    size, env, runs = target.spec.size, _env(), mount / "runs"
    sources = (*map(str, target.paths), str(draft))
    composite_files = tuple(sorted(composite.parent.glob("*.gguf")))
    gguf_mtp = (PYTHON, "-m", "gguf_mtp")
    return [
        Command("compose", "reflink", size,
                (*gguf_mtp, "compose", str(target.first), str(draft), "-o", str(runs / "compose"), "--quiet",
                 "--no-verify"),
                (*target.paths, draft), runs / "compose", env),
        Command("cp --reflink=always", "reflink", size,
                ("cp", "--reflink=always", *sources, str(runs / "cp-always") + "/"),
                (*target.paths, draft), runs / "cp-always", env, syncs_itself=False),
        Command("cp --reflink=never", "reflink", size,
                ("cp", "--reflink=never", *sources, str(runs / "cp-never") + "/"),
                (*target.paths, draft), runs / "cp-never", env, syncs_itself=False),
        Command("strip", "reflink", size, (*gguf_mtp, "strip", str(composite), "-o", str(runs / "strip"), "--quiet"),
                composite_files, runs / "strip", env),
        Command("graft", "reflink", size,
                (*gguf_mtp, "graft", "--from", str(composite), "--into", str(target.first), "-o", str(runs / "graft"),
                 "--quiet", "--no-verify"),
                (*composite_files, *target.paths), runs / "graft", env),
        Command("startup", "reflink", size, (*gguf_mtp, "--version"), env=env),
    ]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _summary(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    keys = sorted({(s.size, s.tool) for s in samples}, key=lambda k: (k[0], _ORDER.index(k[1])))
    rows = []
    for size, tool in keys:
        mine = [s for s in samples if (s.size, s.tool) == (size, tool)]
        disk = [s.extra_disk for s in mine if s.extra_disk is not None]
        rows.append({"tool": tool, "size": size, "runs": len(mine),
                     "median_seconds": _median([s.seconds for s in mine]),
                     "median_extra_disk": int(_median(disk)) if disk else None,
                     "max_extra_disk": max(disk) if disk else None,
                     "bytes_out": max(s.bytes_out for s in mine),
                     "max_rss": max(s.peak_rss for s in mine)})
    return rows


_ORDER = ["compose", "cp --reflink=always", "cp --reflink=never", "strip", "graft", "startup"]


def _targets(rows: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    largest = max(t["size"] for t in inputs)
    by_tool = {r["tool"]: r for r in rows if r["size"] == largest}
    draft = next(t["draft_bytes"] for t in inputs if t["size"] == largest)
    compose, cp, startup = by_tool["compose"], by_tool["cp --reflink=always"], by_tool["startup"]
    label = size_label(largest)
    factor, cp_s, startup_s = MAX_COMPOSE_OVER_CP_REFLINK, cp["median_seconds"], startup["median_seconds"]
    bound = factor * cp_s + startup_s
    extra = compose["max_extra_disk"]
    return [
        {"goal": f"compose of the {label} target <= {MAX_COMPOSE_SECONDS} s on XFS",
         "measured": f"{compose['median_seconds']:.3f} s", "met": compose["median_seconds"] <= MAX_COMPOSE_SECONDS},
        {"goal": f"compose <= {MAX_COMPOSE_OVER_CP_REFLINK} x cp --reflink=always + start-up ({label})",
         "measured": f"{compose['median_seconds']:.3f} s vs {bound:.3f} s "
                     f"({cp_s:.3f} s x {factor} + {startup_s:.3f} s)",
         "met": compose["median_seconds"] <= bound},
        {"goal": f"compose's extra disk <= draft + 1 MiB ({label})",
         "measured": None if extra is None else f"{extra / 2**20:.2f} MiB (draft {draft / 2**20:.2f} MiB)",
         "met": extra is not None and extra <= draft + EXTRA_DISK_ALLOWANCE},
    ]


def _disk_round_text(sample: Sample) -> str:
    return (f"  round {sample.round + 1}: {sample.tool}: {sample.seconds:.3f} s, "
            f"+{(sample.extra_disk or 0) / 2**20:.1f} MiB on disk")


def run_reflink(
    work_dir: Path, sizes: Sequence[int], *, shards: int, pattern: str, repeat: int, warmup: int, cache: str,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the reflink case on an XFS image in ``work_dir``; returns its results (see ``reflink.json``)."""
    reason = reflink_unavailable()
    if reason is not None:
        raise RuntimeError(f"the reflink case cannot run: {reason}")
    # inputs (targets, drafts, composites) twice over the sizes, plus the largest output, plus room
    image_bytes = max(512 * 2**20, int(3.5 * sum(sizes)) + 2**30)
    samples: list[Sample] = []
    inputs_info: list[dict[str, Any]] = []
    load_before = load_average()
    with xfs_mount(work_dir, image_bytes) as mount:
        inputs = mount / "inputs"
        shutil.rmtree(mount / "runs", ignore_errors=True)
        for size in sizes:
            target = ensure_target(inputs, TargetSpec(size, shards, pattern), log=log)
            draft = _converted_draft(inputs, target, log)
            composite = make_composite(inputs / f"composite-{size_label(target.spec.size)}", target, draft,
                                           env=_env(), log=log)
            inputs_info.append({"size": size, "shards": shards, "target_bytes": target.nbytes,
                                "draft_bytes": draft.stat().st_size})
            group = reflink_group(mount, target, draft, composite)
            generated = sorted({p for c in group for p in c.inputs})
            samples += measure_case(group, f"on XFS (reflink) {size_label(size)}", repeat=repeat, warmup=warmup,
                                    cache=cache, log_dir=work_dir / "logs-reflink", log=log, evict=generated,
                                    disk=True, describe=_disk_round_text)
        mkfs = _run("xfs_info", str(mount)).stdout.strip()
    rows = _summary(samples)
    return {
        "schema": 1,
        "filesystem": {"kind": "xfs (mkfs.xfs -m reflink=1), loop-mounted image", "image_bytes": image_bytes,
                       "xfs_info": mkfs},
        "config": {"sizes": list(sizes), "shards": shards, "repeat": repeat, "warmup": warmup, "cache": cache},
        "conditions": case_conditions(load_before),
        "inputs": inputs_info,
        "samples": [asdict(s) for s in samples],
        "summary": rows,
        "targets": _targets(rows, inputs_info),
    }


def _mib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:+.2f}" if abs(n) < 100 * 2**20 else f"{n / 2**20:+,.0f}"


def render_reflink_markdown(results: dict[str, Any]) -> str:
    """The reflink case as Markdown: a table per size and the goals of issue 13."""
    c = results["config"]
    lines = [
        "# Benchmark: compose, strip and graft on a reflink filesystem (XFS)",
        "",
        f"A loop-mounted XFS image made with `mkfs.xfs -m reflink=1`; inputs and outputs on it; "
        f"{c['shards']}-file synthetic targets; page cache {c['cache']} before each run; medians of "
        f"{c['repeat']} alternating round(s) after {c['warmup']} warm-up round(s); every output on disk "
        "(fsync/sync) before the clock stops. *Extra disk* is what a run's outputs cost on disk: the blocks of "
        "their extent maps (FIEMAP) that no other file shares, so a block shared with an input costs nothing. "
        "Made by `scripts/perf.py` (`--reflink-only` runs just this case).",
        "",
    ]
    cond = results.get("conditions")
    if cond:
        lines += [f"Load average (1, 5, 15 min) on {cond['cpus']} CPU(s): before {cond['load_before']}, after "
                  f"{cond['load_after']}. `startup` is `python -m gguf_mtp --version`, the floor of every gguf-mtp "
                  "command: on a busy machine it varies from run to run as much as the commands themselves.", ""]
    for info in results["inputs"]:
        size = info["size"]
        lines += [f"## {size_label(size)} target ({info['target_bytes']:,} bytes in {info['shards']} files; "
                  f"draft {info['draft_bytes']:,} bytes)", "",
                  "| command | median time | extra disk (median, MiB) | bytes written | peak RSS |",
                  "|---|---:|---:|---:|---:|"]
        for row in (r for r in results["summary"] if r["size"] == size):
            lines.append(f"| {row['tool']} | {row['median_seconds']:.3f} s | {_mib(row['median_extra_disk'])} | "
                         f"{row['bytes_out'] / 2**20:,.1f} MiB | {row['max_rss'] / 2**20:.0f} MiB |")
        lines.append("")
    lines += goals_table(results["targets"], "issue 13")
    return "\n".join(lines)


def write_reflink_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write ``reflink.json`` and ``reflink.md`` into ``out_dir``; returns their paths."""
    return write_json_and_markdown(results, out_dir, REFLINK_JSON, REFLINK_MD, render_reflink_markdown(results))
