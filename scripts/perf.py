#!/usr/bin/env python3
"""Benchmark gguf-mtp against the physical limit (``cp``) and the nearest upstream tool.

Measures wall time and peak memory, alternating runs and keeping medians, of:

- ``gguf-mtp compose`` of a split target (+ draft) vs ``cp`` of the same files onto the same disk;
- ``gguf-mtp compose`` of a single-file target vs gguf-py's ``gguf_new_metadata.py`` copying that file
  with one metadata change;
- ``gguf-mtp convert`` of a synthetic MTPv2 head (512 experts per stack) vs ``cp`` of its safetensors;
- on a loop-mounted XFS image with reflink (as root, with ``mkfs.xfs``): compose, strip and graft vs
  ``cp --reflink=always`` and ``cp --reflink=never``, time and extra disk used (``perf_reflink.py``);
- ``gguf-mtp compose --outtype q4_k`` (a BF16 head quantized on the way) vs ``llama-quantize --pure`` doing
  the same work, time and peak memory (``perf_quant.py``);
- ``gguf-mtp convert`` of a block-scaled FP8 head (>= 2 GB of FP8) vs ``cp`` of its safetensors and vs llama.cpp's
  ``convert_hf_to_gguf.py --mtp`` on the same checkpoint, time and peak memory (``perf_fp8.py``);
- ``gguf-mtp accept --n-max 1,2,3`` (predicting llama-server's acceptance) vs ``gguf-mtp bench --n-max 1,2,3``
  (measuring it with llama.cpp's llama-server) on the designed test model, time and peak memory
  (``perf_accept.py``);

at several target sizes, and writes a Markdown table, the raw results (JSON) and a plot into
``docs/benchmarks/`` (a full run) or a scratch folder (``--quick``, a smoke run, unless ``--update-docs``
or ``--out-dir`` says otherwise). Inputs are generated once into ``--work-dir`` and reused.

Examples::

    .venv/bin/python scripts/perf.py                     # the full run (sizes 1G,3G,4G, 5 rounds)
    .venv/bin/python scripts/perf.py --quick             # seconds, tiny inputs; report in WORK_DIR/quick-report
    .venv/bin/python scripts/perf.py --quick --update-docs   # the same, replacing docs/benchmarks/
    sudo .venv/bin/python scripts/perf.py --reflink-only     # just the XFS reflink case (1G,3G): reflink.md
    .venv/bin/python scripts/perf.py --quantize-only         # just --outtype vs llama-quantize: quantize.md
    .venv/bin/python scripts/perf.py --fp8-only --repeat 2   # just the FP8 head vs cp and upstream: fp8.md
    .venv/bin/python scripts/perf.py --accept-only --quick   # just accept vs bench (tiny model): accept.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from perf_accept import run_accept, write_accept_report
from perf_fp8 import run_fp8, write_fp8_report
from perf_inputs import (
    NEMOTRON_SUPER_PATTERN,
    HeadSpec,
    SyntheticTarget,
    TargetSpec,
    ensure_draft,
    ensure_head,
    ensure_target,
    head_files,
    make_composite,
    parse_size,
    size_label,
)
from perf_lib import CACHE_MODES, Command, Sample, load_average, machine_info, median_ratio, run_alternating, summarise
from perf_quant import run_quantize, write_quantize_report
from perf_reflink import reflink_unavailable, run_reflink, write_reflink_report
from perf_report import write_report

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: Where a full run's report goes (the committed figures).
DOCS_DIR = REPO / "docs" / "benchmarks"
#: Where a ``--quick`` run's report goes, inside the work folder: smoke runs never touch the committed figures.
QUICK_REPORT = "quick-report"

#: Goals from issue 6 (medians on the project's 2-core machine).
MAX_COMPOSE_OVER_CP = 1.15
#: The commands that copy a whole set through the writer (issue 41: each within the same bound of ``cp``).
SET_WRITERS = ("compose", "strip", "graft")
#: Issue 41: each of :data:`SET_WRITERS` / (cp + fsync of the bytes it writes), same-round medians, by target
#: size: a small set pays the fixed costs (start-up, the fsyncs) on fewer bytes, so its bound is looser.
MAX_COMPOSE_OVER_CP_BY_SIZE = {2**30: MAX_COMPOSE_OVER_CP, 3 * 2**30: 1.05}
MAX_COMPOSE_RSS = 150 * 2**20
MAX_COMPOSE_RSS_GROWTH = 0.10  # "flat": at most 10 % more at the largest size than at the smallest
MAX_CONVERT_RSS = 2**30
#: Above this 1-minute load average the report says the machine was busy (a measured command adds ~1).
BUSY_LOAD = 1.5

QUICK_HEAD = HeadSpec(n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_expert=64, n_expert_used=2, expert_ff=256,
                      shared_ff=512, moe_latent=256, files=2)


@dataclass(frozen=True)
class BenchConfig:
    work_dir: Path
    out_dir: Path
    sizes: tuple[int, ...]
    headline: int
    repeat: int
    warmup: int
    shards: int
    pattern: str
    cache: str
    head: HeadSpec | None
    quick: bool = False


def _env() -> dict[str, str]:
    return {"GGUF_MTP_DISABLE_PROGRESS": "1", "PYTHONUNBUFFERED": "1"}


def _runs(config: BenchConfig, name: str) -> Path:
    return config.work_dir / "runs" / name


def target_group(
    config: BenchConfig, sharded: SyntheticTarget, single: SyntheticTarget, draft: Path, composite: Path
) -> list[Command]:
    """compose (split) | cp (split + draft) | compose (single file) | gguf_new_metadata.py (single file) | strip
    (the split composite) | cp (split target alone: the bytes strip writes) | graft (the composite's head into
    the split target: the bytes compose writes)."""
    size = sharded.spec.size
    env = _env()
    composite_files = tuple(sorted(composite.parent.glob("*.gguf")))
    return [
        Command("compose", "sharded", size,
                (PYTHON, "-m", "gguf_mtp", "compose", str(sharded.first), str(draft), "-o",
                 str(_runs(config, "compose-sharded")), "--quiet", "--no-verify"),
                (*sharded.paths, draft), _runs(config, "compose-sharded"), env),
        # The same bytes compose moves: every target file and the draft.
        Command("cp", "sharded", size,
                ("cp", *map(str, sharded.paths), str(draft), str(_runs(config, "cp-sharded")) + "/"),
                (*sharded.paths, draft), _runs(config, "cp-sharded"), env, syncs_itself=False),
        Command("compose", "single", size,
                (PYTHON, "-m", "gguf_mtp", "compose", str(single.first), str(draft), "-o",
                 str(_runs(config, "compose-single")), "--quiet", "--no-verify", "--set-kv", "general.name=bench"),
                (single.first, draft), _runs(config, "compose-single"), env),
        Command("gguf_new_metadata", "single", size,
                (PYTHON, "-m", "gguf.scripts.gguf_new_metadata", "--general-name", "bench", "--force",
                 str(single.first), str(_runs(config, "new-metadata") / "bench.gguf")),
                (single.first,), _runs(config, "new-metadata"), env, syncs_itself=False),
        Command("strip", "sharded", size,
                (PYTHON, "-m", "gguf_mtp", "strip", str(composite), "-o", str(_runs(config, "strip-sharded")),
                 "--quiet"),
                composite_files, _runs(config, "strip-sharded"), env),
        Command("cp", "target", size,
                ("cp", *map(str, sharded.paths), str(_runs(config, "cp-target")) + "/"),
                sharded.paths, _runs(config, "cp-target"), env, syncs_itself=False),
        Command("graft", "sharded", size,
                (PYTHON, "-m", "gguf_mtp", "graft", "--from", str(composite), "--into", str(sharded.first), "-o",
                 str(_runs(config, "graft-sharded")), "--quiet", "--no-verify"),
                (*composite_files, *sharded.paths), _runs(config, "graft-sharded"), env),
    ]


def head_group(config: BenchConfig, checkpoint: Path, head: HeadSpec) -> list[Command]:
    """convert (head -> draft) | cp (the head's safetensors)."""
    files = head_files(checkpoint)
    inputs = tuple(sorted(p for p in checkpoint.iterdir() if p.is_file()))
    size = sum(p.stat().st_size for p in files)
    env = _env()
    return [
        Command("convert", "head", size,
                (PYTHON, "-m", "gguf_mtp", "convert", str(checkpoint), "-o",
                 str(_runs(config, "convert") / "draft.gguf"), "--block", str(head.block)),
                inputs, _runs(config, "convert"), env),
        Command("cp", "head", size, ("cp", *map(str, files), str(_runs(config, "cp-head")) + "/"),
                inputs, _runs(config, "cp-head"), env, syncs_itself=False),
    ]


def startup_group() -> list[Command]:
    """The floor every gguf-mtp command starts from: the interpreter with gguf-mtp (numpy, gguf) imported."""
    return [Command("startup", "none", 0, (PYTHON, "-m", "gguf_mtp", "--version"), env=_env())]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _describe(sample: Sample) -> str:
    size = f"{size_label(sample.size)} " if sample.size else ""
    return (f"  round {sample.round + 1}: {size}{sample.tool} ({sample.case}): {sample.seconds:.2f} s, "
            f"peak RSS {sample.peak_rss / 2**20:.0f} MiB")


def run_benchmark(config: BenchConfig, log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Generate (or reuse) the inputs, run every group, and return the results (see ``results.json``)."""
    config.work_dir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    groups: list[list[Command]] = []
    inputs: dict[str, Any] = {"targets": []}
    for size in config.sizes:
        sharded = ensure_target(config.work_dir, TargetSpec(size, config.shards, config.pattern), log=log)
        single = ensure_target(config.work_dir, TargetSpec(size, 1, config.pattern), log=log)
        draft = ensure_draft(config.work_dir, sharded.hparams, log=log)
        inputs["targets"].append({
            "size": size, "shards": config.shards, "blocks": len(config.pattern), "experts": sharded.hparams.n_expert,
            "sharded_bytes": sharded.nbytes, "single_bytes": single.nbytes, "draft_bytes": draft.stat().st_size,
        })
        composite = make_composite(config.work_dir / f"composite-{size_label(size)}", sharded, draft, env=_env(),
                                   log=log)
        groups.append(target_group(config, sharded, single, draft, composite))
    if config.head is not None:
        checkpoint = ensure_head(config.work_dir, config.head, log=log)
        files = head_files(checkpoint)
        inputs["head"] = {**asdict(config.head), "safetensors_bytes": sum(p.stat().st_size for p in files),
                          "files": len(files), "real_widths": config.head.has_real_widths}
        groups.append(head_group(config, checkpoint, config.head))
    groups.append(startup_group())
    generated = sorted({path for group in groups for command in group for path in command.inputs})

    load_before = load_average()
    loads = [load_before[0]]

    def on_sample(sample: Sample) -> None:
        loads.append(load_average()[0])
        log(_describe(sample))

    samples: list[Sample] = []
    for group in groups:
        names = " | ".join(f"{c.tool} ({c.case})" for c in group)
        log(f"measuring {size_label(group[0].size) if group[0].size else ''} {names}, {config.repeat} round(s)")
        samples += run_alternating(group, repeat=config.repeat, warmup=config.warmup, cache=config.cache,
                                   log_dir=config.work_dir / "logs", evict=generated, report=on_sample)
    load_after = load_average()
    if max(loads) > BUSY_LOAD:
        notes.append(f"the 1-minute load average reached {max(loads)} on {os.cpu_count()} CPUs (the measured "
                     "command itself accounts for about 1; the rest is other work on the machine): single runs "
                     "vary, medians of alternating runs and same-round ratios damp that")

    return {
        "schema": 2,
        "machine": machine_info(config.work_dir),
        "conditions": {"cache": config.cache, "load_before": load_before, "load_after": load_after,
                       "load_max": max(loads)},
        "config": {
            "sizes": list(config.sizes), "headline": config.headline, "repeat": config.repeat, "warmup": config.warmup,
            "shards": config.shards, "blocks": len(config.pattern), "quick": config.quick,
        },
        "inputs": inputs,
        "samples": [asdict(s) for s in samples],
        **analyse(samples, config),
        "notes": notes,
    }


def analyse(samples: list[Sample], config: BenchConfig) -> dict[str, Any]:
    """Medians, same-round time ratios and the goals of issue 6, from the raw samples."""
    summaries = summarise(samples)
    ratios = _ratios(samples, config)
    targets = _targets(summaries, ratios, config)
    return {"summary": [s.to_dict() for s in summaries], "ratios": ratios, "targets": targets}


def rerender(out_dir: Path) -> dict[str, Any]:
    """Recompute the analysis of ``out_dir/results.json`` from its samples (after a change to the report)."""
    results = json.loads((out_dir / "results.json").read_text())
    c = results["config"]
    head_fields = results["inputs"].get("head") or {}
    known = {k: v for k, v in head_fields.items() if k in HeadSpec.__dataclass_fields__}
    head = HeadSpec(**known) if head_fields else None
    config = BenchConfig(
        Path(), out_dir, tuple(c["sizes"]), c["headline"], c["repeat"], c.get("warmup", 0), c["shards"],
        "?" * c["blocks"], results["conditions"]["cache"], head, c.get("quick", False),
    )
    samples = [Sample(**s) for s in results["samples"]]
    return {**results, **analyse(samples, config)}


def _ratios(samples: list[Sample], config: BenchConfig) -> dict[str, dict[str, float | None]]:
    pairs = {
        "compose_vs_cp": (("compose", "sharded"), ("cp", "sharded")),
        "compose_vs_gguf_new_metadata": (("compose", "single"), ("gguf_new_metadata", "single")),
        "strip_vs_cp": (("strip", "sharded"), ("cp", "target")),
        "graft_vs_cp": (("graft", "sharded"), ("cp", "sharded")),
    }
    ratios = {
        name: {str(size): median_ratio(samples, a, b, size) for size in config.sizes} for name, (a, b) in pairs.items()
    }
    head = [s.size for s in samples if s.case == "head"]
    if head:
        ratios["convert_vs_cp"] = {str(head[0]): median_ratio(samples, ("convert", "head"), ("cp", "head"), head[0])}
    return ratios


def _targets(summaries: list, ratios: dict, config: BenchConfig) -> list[dict[str, Any]]:
    """Each goal of issue 6 with what was measured and whether it was met."""
    by_key = {(s.tool, s.case, s.size): s for s in summaries}
    headline = str(config.headline)
    results = [_over_cp(ratios, command, size, limit)
               for size, limit in _compose_limits(config) for command in SET_WRITERS]
    compose_rss = {size: max(by_key[(t, c, size)].max_rss for t, c in (("compose", "sharded"), ("compose", "single")))
                   for size in config.sizes}
    worst = max(compose_rss.values())
    results.append({"goal": f"compose peak RSS <= {MAX_COMPOSE_RSS // 2**20} MiB",
                    "measured": f"{worst / 2**20:.0f} MiB", "met": worst <= MAX_COMPOSE_RSS})
    smallest, largest = min(config.sizes), max(config.sizes)
    growth = compose_rss[largest] / compose_rss[smallest] - 1
    results.append({"goal": f"compose peak RSS flat from {size_label(smallest)} to {size_label(largest)} "
                            f"(<= {MAX_COMPOSE_RSS_GROWTH:.0%} growth)",
                    "measured": f"{compose_rss[smallest] / 2**20:.0f} -> {compose_rss[largest] / 2**20:.0f} MiB "
                                f"({growth:+.1%})",
                    "met": len(config.sizes) > 1 and growth <= MAX_COMPOSE_RSS_GROWTH})
    ratio = ratios["compose_vs_gguf_new_metadata"].get(headline)
    measured = None
    if ratio is not None:
        ours = by_key[("compose", "single", config.headline)]
        theirs = by_key[("gguf_new_metadata", "single", config.headline)]
        more = ours.bytes_out / theirs.bytes_out - 1
        change = f"{1 - ratio:.0%} less" if ratio < 1 else f"{ratio - 1:.0%} more"
        measured = (f"{ratio:.2f}x the time ({change}) while writing {more:.0%} more bytes (the draft): "
                    f"{(1 + more) / ratio:.2f}x the throughput")
    results.append({"goal": f"compose faster than gguf_new_metadata.py, same file ({size_label(config.headline)})",
                    "measured": measured, "met": ratio is not None and ratio < 1})
    convert = next((s for s in summaries if s.tool == "convert"), None)
    experts = config.head.n_expert if config.head else "?"
    results.append({"goal": f"convert peak RSS < {MAX_CONVERT_RSS // 2**20} MiB (head with {experts}-expert stacks)",
                    "measured": None if convert is None else f"{convert.max_rss / 2**20:.0f} MiB",
                    "met": convert is not None and convert.max_rss < MAX_CONVERT_RSS})
    return results


def _compose_limits(config: BenchConfig) -> list[tuple[int, float]]:
    """(size, bound on compose / cp) for each measured size issue 41 bounds, else the headline's issue-6 bound."""
    limits = [(size, limit) for size, limit in MAX_COMPOSE_OVER_CP_BY_SIZE.items() if size in config.sizes]
    return limits or [(config.headline, MAX_COMPOSE_OVER_CP)]


def _over_cp(ratios: dict, command: str, size: int, limit: float) -> dict[str, Any]:
    """The goal "``command`` / (cp + fsync of the bytes it writes) <= ``limit``" at ``size``: the same-round median
    ratio, met or not."""
    ratio = ratios.get(f"{command}_vs_cp", {}).get(str(size))
    return {"goal": f"{command} / (cp + fsync) <= {limit} at {size_label(size)}",
            "measured": None if ratio is None else round(ratio, 3),
            "met": ratio is not None and ratio <= limit}


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(sorted({parse_size(s) for s in text.split(",") if s.strip()}))
    if not sizes:
        raise argparse.ArgumentTypeError("give at least one size")
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--work-dir", type=Path, default=REPO / ".cache" / "perf",
                   help="where generated inputs are cached and outputs are written (default: .cache/perf)")
    p.add_argument("--out-dir", type=Path,
                   help="where README.md, results.json and perf.png go (default: docs/benchmarks for a full "
                        f"run, WORK_DIR/{QUICK_REPORT} for --quick)")
    p.add_argument("--update-docs", action="store_true",
                   help="write the report into docs/benchmarks even for a --quick run")
    p.add_argument("--sizes", type=_sizes, help="target sizes, comma-separated (default: 1G,3G,4G)")
    p.add_argument("--headline", type=parse_size, help="size the goals are checked at (default: 3G, or the largest)")
    p.add_argument("--repeat", type=int, help="rounds per command; medians are reported (default: 5)")
    p.add_argument("--warmup", type=int, help="rounds run first and not kept (default: 1)")
    p.add_argument("--shards", type=int, default=3, help="files of the split target (default: 3)")
    p.add_argument("--cache", choices=CACHE_MODES, default="cold",
                   help="page cache before each run: inputs evicted (cold, default) or read in (warm)")
    p.add_argument("--head-expert-ff", type=int,
                   help="rows per expert of the synthetic head (default: 1344; the real head has 2688)")
    p.add_argument("--no-convert", action="store_true", help="skip the convert benchmark")
    p.add_argument("--quick", action="store_true",
                   help="tiny inputs and one round (sizes 8M,16M, a 3-block target, a 64-expert head): a smoke test")
    p.add_argument("--clean", action="store_true", help="delete the work folder (the generated inputs) at the end")
    p.add_argument("--no-reflink", action="store_true",
                   help="skip the XFS reflink case (it runs as root with mkfs.xfs)")
    p.add_argument("--reflink-only", action="store_true",
                   help="only the XFS reflink case: writes reflink.md and reflink.json, links them from README.md")
    p.add_argument("--reflink-sizes", type=_sizes,
                   help="target sizes of the reflink case (default: 1G,3G; with --quick the --sizes)")
    p.add_argument("--no-quantize", action="store_true", help="skip the --outtype vs llama-quantize case")
    p.add_argument("--quantize-only", action="store_true",
                   help="only the --outtype vs llama-quantize --pure case: writes quantize.md and quantize.json")
    p.add_argument("--no-fp8", action="store_true", help="skip the FP8 head case")
    p.add_argument("--fp8-only", action="store_true",
                   help="only the FP8 head case (convert vs cp vs convert_hf_to_gguf.py --mtp): fp8.md and fp8.json")
    p.add_argument("--no-accept", action="store_true", help="skip the accept vs bench case")
    p.add_argument("--accept-only", action="store_true",
                   help="run only the accept vs bench case (the designed model: tiny with --quick, ~1 GB otherwise)")
    p.add_argument("--upstream-python", help="python of the torch venv that runs llama.cpp's convert_hf_to_gguf.py "
                                             "(default: $GGUF_MTP_UPSTREAM_PYTHON, else .venv-upstream)")
    p.add_argument("--render-only", action="store_true",
                   help="measure nothing: redo the tables and the plot from OUT_DIR/results.json")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    quick = args.quick
    if args.update_docs and args.out_dir is not None:
        raise SystemExit("perf: --update-docs writes docs/benchmarks; give it or --out-dir, not both")
    out_dir = args.out_dir or (DOCS_DIR if args.update_docs or not quick else args.work_dir / QUICK_REPORT)
    sizes = args.sizes or tuple(map(parse_size, ("8M", "16M") if quick else ("1G", "3G", "4G")))
    headline = args.headline or (parse_size("3G") if parse_size("3G") in sizes else max(sizes))
    if headline not in sizes:
        raise SystemExit(f"perf: --headline {size_label(headline)} is not one of --sizes")
    head = None
    if not args.no_convert:
        head = QUICK_HEAD if quick else HeadSpec()
        if args.head_expert_ff:
            head = replace(head, expert_ff=args.head_expert_ff)
    return BenchConfig(
        work_dir=args.work_dir.resolve(), out_dir=out_dir.resolve(), sizes=sizes, headline=headline,
        repeat=args.repeat or (1 if quick else 5),
        warmup=args.warmup if args.warmup is not None else (0 if quick else 1), shards=args.shards,
        pattern="M*E" if quick else NEMOTRON_SUPER_PATTERN, cache=args.cache, head=head, quick=quick,
    )


def _reflink_sizes(args: argparse.Namespace, config: BenchConfig) -> tuple[int, ...]:
    if args.reflink_sizes:
        return args.reflink_sizes
    return config.sizes if config.quick else tuple(map(parse_size, ("1G", "3G")))


def _log_targets(targets: list[dict[str, Any]]) -> None:
    """Log each goal: met or MISSED, and what was measured."""
    for target in targets:
        _log(f"{'met    ' if target['met'] else 'MISSED '} {target['goal']}: {target['measured']}")


def _tool_or_skip(name: str, case: str) -> Path | None:
    """llama.cpp's tool ``name``, built or found by scripts/build_llama_tools.py; None (and the ``case`` case
    logged as skipped) when it is not available."""
    from build_llama_tools import BuildError, build_tool

    try:
        return build_tool(name, quiet=False)
    except (BuildError, OSError) as e:
        _log(f"{case} case skipped: {name} is not available ({e})")
        return None


def reflink_case(args: argparse.Namespace, config: BenchConfig) -> list[Path]:
    """Run the reflink case when it can run here (else say why); returns the files it wrote."""
    reason = reflink_unavailable()
    if reason is not None:
        if args.reflink_only:
            raise SystemExit(f"perf: the reflink case cannot run: {reason}")
        _log(f"reflink case skipped: {reason}")
        return []
    results = run_reflink(config.work_dir, _reflink_sizes(args, config), shards=config.shards, pattern=config.pattern,
                          repeat=config.repeat, warmup=config.warmup, cache=config.cache, log=_log)
    _log_targets(results["targets"])
    return write_reflink_report(results, config.out_dir)


def _tool_case(config: BenchConfig, tool: str, case: str, run: Callable[..., dict[str, Any]],
               write: Callable[[dict[str, Any], Path], list[Path]]) -> list[Path]:
    """Run a case that needs llama.cpp's ``tool`` (skipped, said so, when it is not available): measure with
    ``run``, log its goals, write its report with ``write``; returns the files written."""
    path = _tool_or_skip(tool, case)
    if path is None:
        return []
    results = run(config.work_dir, path, quick=config.quick, repeat=config.repeat, warmup=config.warmup,
                  cache=config.cache, log=_log)
    _log_targets(results["targets"])
    return write(results, config.out_dir)


def quantize_case(config: BenchConfig) -> list[Path]:
    """Run the head-quantization case (llama-quantize built or found by scripts/build_llama_tools.py)."""
    return _tool_case(config, "llama-quantize", "quantize", run_quantize, write_quantize_report)


def fp8_case(args: argparse.Namespace, config: BenchConfig) -> list[Path]:
    """Run the FP8 head case (llama.cpp's converter when its torch venv is there, else without it, said so)."""
    results = run_fp8(config.work_dir, quick=config.quick, repeat=config.repeat, warmup=config.warmup,
                      cache=config.cache, upstream_python=args.upstream_python, log=_log)
    _log_targets(results["targets"])
    for note in results["notes"]:
        _log(f"note: {note}")
    return write_fp8_report(results, config.out_dir)


def accept_case(config: BenchConfig) -> list[Path]:
    """Run the accept vs bench case (llama-server built or found by scripts/build_llama_tools.py)."""
    return _tool_case(config, "llama-server", "accept", run_accept, write_accept_report)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    if config.quick and config.out_dir != DOCS_DIR.resolve():
        _log(f"smoke run: the report goes to {config.out_dir} (docs/benchmarks/ is left as it is; "
             "--update-docs replaces it)")
    case_reports: list[Path] = []
    if args.quantize_only:
        _log("wrote " + ", ".join(str(p) for p in quantize_case(config)))
        return 0
    if args.fp8_only:
        _log("wrote " + ", ".join(str(p) for p in fp8_case(args, config)))
        return 0
    if args.accept_only:
        _log("wrote " + ", ".join(str(p) for p in accept_case(config)))
        return 0
    if args.render_only:
        results = rerender(config.out_dir)
    else:
        try:
            if args.reflink_only:
                case_reports = reflink_case(args, config)
                results = rerender(config.out_dir)  # README.md again, now linking the reflink figures
            else:
                results = run_benchmark(config)
                if not args.no_reflink:
                    case_reports = reflink_case(args, config)
                if not args.no_quantize:
                    case_reports += quantize_case(config)
                if not args.no_fp8:
                    case_reports += fp8_case(args, config)
                if not args.no_accept:
                    case_reports += accept_case(config)
        finally:
            if args.clean:
                shutil.rmtree(config.work_dir, ignore_errors=True)
    written = case_reports + write_report(results, config.out_dir)
    _log_targets(results["targets"])
    _log("wrote " + ", ".join(str(p) for p in written))
    print(json.dumps(results["ratios"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
