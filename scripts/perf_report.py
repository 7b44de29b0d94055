"""Render benchmark results: ``README.md`` (tables), ``results.json`` (everything) and ``perf.png``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["LABELS", "goals_table", "render_markdown", "write_json_and_markdown", "write_plot", "write_report"]

#: (tool, case) -> how tables and the plot name it.
LABELS = {
    ("compose", "sharded"): "gguf-mtp compose, split target",
    ("cp", "sharded"): "cp, split target + draft",
    ("compose", "single"): "gguf-mtp compose, single file",
    ("gguf_new_metadata", "single"): "gguf_new_metadata.py, single file",
    ("convert", "head"): "gguf-mtp convert, MTP head",
    ("cp", "head"): "cp, head safetensors",
    ("strip", "sharded"): "gguf-mtp strip, split composite",
    ("cp", "target"): "cp, split target",
    ("graft", "sharded"): "gguf-mtp graft, split composite into split target",
    ("startup", "none"): "python -m gguf_mtp --version",
}
_PLOTTED = [
    (("compose", "sharded"), "tab:blue", "o-"),
    (("cp", "sharded"), "tab:gray", "s--"),
    (("compose", "single"), "tab:cyan", "o:"),
    (("gguf_new_metadata", "single"), "tab:red", "^-"),
]

PLOT_NAME = "perf.png"


def _size(n: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            value = n / factor
            return f"{value:g} {unit}" if value == int(value) else f"{value:.2f} {unit}"
    return f"{n} B"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f}" if n >= 10 * 2**20 else f"{n / 2**20:.1f}"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 2**20:.0f} MiB/s" if bytes_per_s else "-"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _label(row: dict[str, Any]) -> str:
    return LABELS.get((row["tool"], row["case"]), f"{row['tool']} ({row['case']})")


def _headline_rows(results: dict[str, Any]) -> list[str]:
    summary = {(r["tool"], r["case"], r["size"]): r for r in results["summary"]}
    headline = results["config"]["headline"]
    rows = []
    comparisons = [
        ("compose_vs_cp", ("compose", "sharded"), ("cp", "sharded"), headline,
         f"compose a {results['config']['shards']}-file target vs `cp` of the same files (+ draft)"),
        ("compose_vs_gguf_new_metadata", ("compose", "single"), ("gguf_new_metadata", "single"), headline,
         "compose a single-file target vs `gguf_new_metadata.py` (one metadata change)"),
        ("strip_vs_cp", ("strip", "sharded"), ("cp", "target"), headline,
         "strip the composite vs `cp` of the target's files (the bytes strip writes)"),
        ("graft_vs_cp", ("graft", "sharded"), ("cp", "sharded"), headline,
         "graft the composite's head into the target vs `cp` of the target (+ draft)"),
    ]
    if "convert_vs_cp" in results["ratios"]:
        head_size = int(next(iter(results["ratios"]["convert_vs_cp"])))
        comparisons.append(("convert_vs_cp", ("convert", "head"), ("cp", "head"), head_size,
                            f"convert a {_size(head_size)} MTP head vs `cp` of its safetensors"))
    for name, ours, theirs, size, what in comparisons:
        a, b = summary.get((*ours, size)), summary.get((*theirs, size))
        if a is None or b is None:
            continue
        ratio = results["ratios"][name].get(str(size))
        rows.append(f"| {what} | {_size(size)} | {_run(a)} | {_run(b)} | **{_ratio(ratio)}** |")
    return rows


def _run(row: dict[str, Any]) -> str:
    return (f"{row['median_seconds']:.2f} s ({row['median_cpu_seconds']:.2f} s CPU), {_size(row['bytes_out'])} "
            f"written, {_mib(row['max_rss'])} MiB")


def _ratio_rows(results: dict[str, Any]) -> list[str]:
    by_size = results["ratios"]
    names = ("compose_vs_cp", "strip_vs_cp", "graft_vs_cp", "compose_vs_gguf_new_metadata")
    return [
        f"| {_size(size)} | " + " | ".join(_ratio(by_size.get(name, {}).get(str(size))) for name in names) + " |"
        for size in results["config"]["sizes"]
    ]


def render_markdown(results: dict[str, Any], plot: str | None = PLOT_NAME,
                    reflink: dict[str, Any] | None = None, fp8: dict[str, Any] | None = None) -> str:
    """The ``README.md`` of a results folder (``reflink``, ``fp8``: those cases' results, linked when given)."""
    m, c, cond = results["machine"], results["config"], results["conditions"]
    memory = f"{m['memory_bytes'] / 2**30:.0f} GiB RAM" if m.get("memory_bytes") else "RAM unknown"
    lines = [
        "# Benchmarks",
        "",
        f"Latest results of `scripts/perf.py` ({m['date']}, commit {m.get('commit') or '?'}): "
        f"{c['repeat']} alternating round(s) per command, medians.",
        "",
        f"Machine: {m['cpus']} CPU(s) ({m['cpu']}), {memory}, {m['filesystem']}, Linux {m['kernel']}, "
        f"Python {m['python']}, gguf {m['gguf']}, {m.get('cp') or 'cp'}. "
        f"Load average (1, 5, 15 min) before {cond['load_before']}, after {cond['load_after']}; highest 1-min "
        f"value between runs {cond.get('load_max', '?')}.",
        "",
        *([("**Smoke run** (`--quick`): tiny inputs where start-up dominates; the goals are meant for "
             "the full run."), ""] if c.get("quick") else []),
        "## Headline",
        "",
        "| comparison | input | gguf-mtp (median time and CPU time, written, peak RSS) | baseline (same) "
        "| time ratio |",
        "|---|---|---|---|---|",
        *_headline_rows(results),
        "",
        "A time ratio is the median over rounds of gguf-mtp's time divided by the baseline's in the same round. "
        "By target size:",
        "",
        "| target | compose / cp | strip / cp | graft / cp | compose / gguf_new_metadata.py |",
        "|---|---|---|---|---|",
        *_ratio_rows(results),
        "",
        *goals_table(results["targets"], "issue 6"),
    ]
    if plot:
        lines += [f"![time and peak RSS vs target size]({plot})", ""]
    lines += [
        "## All results",
        "",
        "| input | command | runs | median time | min - max | CPU time | written | throughput "
        "| peak RSS (median / max) | peak anonymous |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["summary"]:
        lines.append(
            f"| {_size(r['size']) if r['size'] else '-'} | {_label(r)} | {r['runs']} | {r['median_seconds']:.2f} s "
            f"| {r['min_seconds']:.2f} - {r['max_seconds']:.2f} s | {r['median_cpu_seconds']:.2f} s "
            f"| {_size(r['bytes_out']) if r['bytes_out'] else '-'} "
            f"| {_rate(r['throughput_bytes_per_s'])} | {_mib(r['median_rss'])} / {_mib(r['max_rss'])} MiB "
            f"| {_mib(r['max_anon'])} MiB |"
        )
    lines += ["", "## Inputs", ""]
    for t in results["inputs"]["targets"]:
        lines.append(
            f"- {_size(t['size'])} target: `nemotron_h_moe`, {t['blocks']} blocks, {t['experts']} experts per MoE "
            f"block, mixed quant types (Q4_K, Q6_K, Q8_0, IQ4_XS, Q5_K, BF16, F16) holding random bytes; "
            f"{t['shards']} files ({_size(t['sharded_bytes'])}) and one file ({_size(t['single_bytes'])}); "
            f"BF16 draft {_size(t['draft_bytes'])}."
        )
    head = results["inputs"].get("head")
    if head:
        lines.append(
            f"- MTP head: NVIDIA MTPv2 layout, BF16, {head['files']} safetensors files "
            f"({_size(head['safetensors_bytes'])}): "
            f"hidden {head['n_embd']}, {head['n_head']}/{head['n_head_kv']} heads of {head['head_dim']}, "
            f"{head['n_expert']} experts of {head['expert_ff']} x {head['moe_latent']} per stack, shared expert "
            f"{head['shared_ff']}"
            + (" (Nemotron 3 Super's widths, scaled down only in length: its experts have 2688 rows)."
               if head.get("real_widths") else " (tiny widths).")
        )
    lines += [f"- Note: {note}" for note in results.get("notes", [])]
    lines += [
        "",
        "## Method",
        "",
        f"- Each command runs as a subprocess; the commands of one input alternate (A B C D A B C D ...), after "
        f"{c.get('warmup', 0)} warm-up round(s) that are not kept.",
        f"- Page cache: {_cache_text(cond['cache'])}",
        "- CPU time is the command's own user + system time (`wait4`), median over rounds: on a shared 2-CPU "
        "machine, what a tool leaves for the rest.",
        "- Every output is on disk before the clock stops: gguf-mtp fsyncs what it writes; `cp` and "
        "`gguf_new_metadata.py` do not, so they run as `sh -c 'COMMAND && sync OUTPUTS'` (the flush is part of "
        "their time and CPU time).",
        "- `cp` copies exactly the bytes compose writes (every target file and the draft) onto the same disk: "
        "on a filesystem without reflinks that is the physical limit. `gguf_new_metadata.py` can neither add "
        "tensors nor read split files, so it copies the single-file target with a new `general.name`; compose "
        "does the same change (`--set-kv general.name=bench`) and also appends the draft.",
        "- Peak RSS is the kernel's high-water mark of the command's process (`VmHWM`, summed over its process "
        "tree), polled every 5 ms until it exits. It counts file pages a tool maps, which is why "
        "`gguf_new_metadata.py` (it memory-maps its input) grows with the file; peak anonymous memory "
        "(`RssAnon`, sampled alongside) is what a tool really allocates. `ru_maxrss` is not used: a child "
        "inherits its parent's peak across fork and exec, so it would show this script's memory.",
        "",
        "Regenerate: `make perf` or `.venv/bin/python scripts/perf.py` (inputs are cached in `.cache/perf/`; "
        "`--clean` deletes them afterwards; `--quick` is a seconds-long smoke run that writes into "
        "`.cache/perf/quick-report/` and leaves this folder alone unless given `--update-docs`).",
        "",
    ]
    if reflink is not None:
        lines += _case_section("On a reflink filesystem (XFS)",
                               "Compose, strip and graft against `cp --reflink=always` and `cp --reflink=never`, "
                               "time and extra disk used: [`reflink.md`](reflink.md) (raw: `reflink.json`).",
                               reflink["targets"])
    if fp8 is not None:
        lines += _case_section("An FP8 head",
                               "`convert` of a block-scaled FP8 head against `cp` of its shard and llama.cpp's "
                               "`convert_hf_to_gguf.py --mtp` on the same checkpoint: [`fp8.md`](fp8.md) "
                               "(raw: `fp8.json`).", fp8["targets"])
    return "\n".join(lines)


def _case_section(title: str, text: str, targets: list[dict[str, Any]]) -> list[str]:
    """A case's section of README.md: its title, what it measures (linking its own report), its goals."""
    lines = [f"## {title}", "", text, "", "| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {t['goal']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |" for t in targets]
    return [*lines, ""]


def _cache_text(mode: str) -> str:
    if mode == "cold":
        return ("cold for every run: all dirty data is synced and each command's inputs are evicted with "
                "`posix_fadvise(POSIX_FADV_DONTNEED)`: what `drop_caches` does, for just those files, so it needs "
                "no root and leaves the rest of the machine's cache alone. The benchmark's other inputs are evicted "
                "too, so no command pays for reclaiming the memory an earlier one filled.")
    return ("warm for every run: the benchmark's inputs are evicted, then each command's own inputs are read "
            "into the page cache.")


def write_plot(results: dict[str, Any], path: Path) -> Path:
    """Time and peak RSS against target size, for compose, cp and gguf_new_metadata.py."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = [r for r in results["summary"] if r["case"] in ("sharded", "single")]
    fig, (ax_time, ax_rss) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, color, style in _PLOTTED:
        points = sorted((r["size"], r) for r in rows if (r["tool"], r["case"]) == key)
        if not points:
            continue
        x = [size / 2**30 for size, _ in points]
        ax_time.plot(x, [r["median_seconds"] for _, r in points], style, color=color, label=LABELS[key])
        ax_rss.plot(x, [r["max_rss"] / 2**20 for _, r in points], style, color=color, label=LABELS[key])
    ax_time.set(xlabel="target size (GiB)", ylabel="median wall time (s)", title="time (fsync included)")
    ax_rss.set(xlabel="target size (GiB)", ylabel="peak RSS (MiB, log scale)", title="peak memory", yscale="log")
    ax_rss.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax_rss.yaxis.set_minor_formatter(NullFormatter())
    for ax in (ax_time, ax_rss):
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
    ax_time.set_ylim(bottom=0)
    ax_time.legend(fontsize=8)
    m = results["machine"]
    fig.suptitle(f"gguf-mtp benchmark: {m['cpus']} CPUs, {m['filesystem']}, {results['conditions']['cache']} cache, "
                 f"median of {results['config']['repeat']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def goals_table(targets: list[dict[str, Any]], source: str) -> list[str]:
    """The "Goals (SOURCE)" section: each goal, what was measured, and whether it is met; then a blank line."""
    lines = [f"## Goals ({source})", "", "| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {t['goal']} | {t['measured'] if t['measured'] is not None else 'not measured'} | "
              f"{'yes' if t['met'] else '**no**'} |" for t in targets]
    return [*lines, ""]


def conditions_and_summary(results: dict[str, Any], *, bytes_out: bool = True, rss: str = ".0f") -> list[str]:
    """A case report's load-average line and its table of :func:`perf_lib.tool_rows` rows (with a bytes-written
    column unless ``bytes_out`` is false; peak RSS in MiB formatted with ``rss``)."""
    cond = results["conditions"]
    lines = [f"Load average (1, 5, 15 min) on {cond['cpus']} CPU(s): before {cond['load_before']}, after "
             f"{cond['load_after']}.", ""]
    if bytes_out:
        lines += ["| command | median time | median CPU time | bytes written | peak RSS |", "|---|---:|---:|---:|---:|"]
    else:
        lines += ["| command | median time | median CPU time | peak RSS |", "|---|---:|---:|---:|"]
    for row in results["summary"]:
        written = f"{row['bytes_out'] / 2**20:,.1f} MiB | " if bytes_out else ""
        lines.append(f"| {row['tool']} | {row['median_seconds']:.2f} s | {row['median_cpu_seconds']:.2f} s | "
                     f"{written}{format(row['max_rss'] / 2**20, rss)} MiB |")
    return lines


def write_json_and_markdown(results: dict[str, Any], out_dir: Path, json_name: str, md_name: str,
                            markdown: str) -> list[Path]:
    """Write ``results`` as ``json_name`` and ``markdown`` as ``md_name`` into ``out_dir``; returns their paths
    (the Markdown first)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / json_name, out_dir / md_name
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    md_path.write_text(markdown)
    return [md_path, json_path]


def write_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write ``results.json``, ``perf.png`` and ``README.md`` into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    plot = write_plot(results, out_dir / PLOT_NAME)
    readme = out_dir / "README.md"
    reflink_json = out_dir / "reflink.json"
    reflink = json.loads(reflink_json.read_text()) if reflink_json.exists() else None
    fp8_json = out_dir / "fp8.json"
    fp8 = json.loads(fp8_json.read_text()) if fp8_json.exists() else None
    readme.write_text(render_markdown(results, plot.name, reflink, fp8))
    return [readme, json_path, plot]
