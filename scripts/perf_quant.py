"""The head-quantization case of the benchmark: ``compose --outtype`` against ``llama-quantize --pure``.

Issue 23's goal: quantizing a head takes at most 1.2x what ``llama-quantize --pure`` takes for the same
tensors on the same machine. Both commands do the same work here:

- the inputs are a trunk whose matrices are already Q4_K (llama-quantize copies a tensor already in the
  wanted type) and a BF16 NextN block with Nemotron-like latent-MoE expert stacks;
- ``gguf-mtp compose TARGET DRAFT --outtype q4_k`` copies the trunk (kernel copy) and quantizes the block;
- ``llama-quantize --pure COMPOSITE OUT Q4_K`` (the composite of the same trunk and BF16 block) copies
  the trunk and quantizes the block; it does not fsync, so it runs as ``COMMAND && sync OUTPUTS``.

Both write the same bytes (``tests/test_quant_oracle.py`` proves it on small models). llama-quantize is the
one ``scripts/build_llama_tools.py`` builds from the llama.cpp vendored in the pinned llama-cpp-python.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from perf_lib import Command, case_results, load_average, measure_case, median_tool_ratio, ratio_target, tool_rows
from perf_report import conditions_and_summary, goals_table, write_json_and_markdown

from gguf_mtp.testing.tiny_models import TinyHparams, with_hparams, write_draft, write_target

__all__ = ["QUANTIZE_MD", "run_quantize", "write_quantize_report"]

PYTHON = sys.executable
QUANTIZE_MD = "quantize.md"
QUANTIZE_JSON = "quantize.json"
#: Issue 23: quantizing a head takes at most this much of llama-quantize --pure's time.
MAX_OVER_LLAMA_QUANTIZE = 1.2
QTYPE = "q4_k"

#: A NextN block of Nemotron 3 Super's latent-MoE shape, scaled: two 128-expert stacks of 1024 x 1024
#: (about 0.5 GiB in BF16) beside the attention half and eh_proj of a 2048-wide model.
FULL_HEAD = with_hparams(n_embd=2048, n_head=16, head_dim=128, n_expert=128, n_ff_exp=1024, moe_latent=1024,
                         n_ff_shexp=2048)
QUICK_HEAD = TinyHparams()


def _inputs(work_dir: Path, hp: TinyHparams, log: Callable[[str], None]) -> tuple[Path, Path, Path]:
    """(target with Q4_K matrices, BF16 draft, their composite), made once per hparams."""
    from gguf_mtp.jobs.compose import compose

    folder = work_dir / f"quantize-e{hp.n_expert}-d{hp.n_embd}-f{hp.n_ff_exp}-l{hp.moe_latent}"
    target, draft, composite = folder / "target.gguf", folder / "draft.gguf", folder / "composite" / "target.gguf"
    if not composite.exists():
        log(f"generating {folder}")
        write_target(folder, name="target", hparams=hp, quant=QTYPE.upper())
        write_draft(draft, hparams=hp, quant="BF16")
        compose(target, draft, folder / "composite", progress=False, force=True)
    return target, draft, composite


def quantize_group(work_dir: Path, llama_quantize: Path, target: Path, draft: Path, composite: Path) -> list[Command]:
    env = {"GGUF_MTP_DISABLE_PROGRESS": "1", "PYTHONUNBUFFERED": "1"}
    size = draft.stat().st_size
    ours, theirs = work_dir / "runs" / "quantize-ours", work_dir / "runs" / "quantize-llama"
    return [
        Command("compose --outtype", QTYPE, size,
                (PYTHON, "-m", "gguf_mtp", "compose", str(target), str(draft), "-o", str(ours), "--outtype", QTYPE,
                 "--quiet", "--no-verify"),
                (target, draft), ours, env),
        Command("llama-quantize --pure", QTYPE, size,
                (str(llama_quantize), "--pure", str(composite), str(theirs / "out.gguf"), QTYPE.upper()),
                (composite,), theirs, env, syncs_itself=False),
    ]


def run_quantize(
    work_dir: Path, llama_quantize: Path, *, quick: bool, repeat: int, warmup: int, cache: str,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure compose --outtype against llama-quantize --pure; returns the results (see ``quantize.json``)."""
    hp = QUICK_HEAD if quick else FULL_HEAD
    target, draft, composite = _inputs(work_dir, hp, log)
    group = quantize_group(work_dir, llama_quantize, target, draft, composite)
    load_before = load_average()
    samples = measure_case(group, f"{QTYPE} head quantization", repeat=repeat, warmup=warmup, cache=cache,
                           log_dir=work_dir / "logs-quantize", log=log, evict=[target, draft, composite])
    rows = tool_rows(samples)
    ratio = median_tool_ratio(samples, "compose --outtype", "llama-quantize --pure")
    by_tool = {r["tool"]: r for r in rows}
    ours, theirs = by_tool["compose --outtype"], by_tool["llama-quantize --pure"]
    return case_results(
        {"qtype": QTYPE, "repeat": repeat, "warmup": warmup, "cache": cache, "quick": quick, "hparams": asdict(hp)},
        load_before,
        {"target_bytes": target.stat().st_size, "draft_bytes": draft.stat().st_size,
         "composite_bytes": composite.stat().st_size},
        samples, rows, ratio=ratio,
        targets=[
            ratio_target(f"compose --outtype {QTYPE} <= {MAX_OVER_LLAMA_QUANTIZE} x llama-quantize --pure "
                         "(same tensors)", ratio, ours, theirs, MAX_OVER_LLAMA_QUANTIZE),
            {"goal": "peak RSS no higher than llama-quantize's",
             "measured": f"{ours['max_rss'] / 2**20:.0f} MiB vs {theirs['max_rss'] / 2**20:.0f} MiB",
             "met": ours["max_rss"] <= theirs["max_rss"]},
        ],
    )


def render_quantize_markdown(results: dict[str, Any]) -> str:
    c, inputs = results["config"], results["inputs"]
    lines = [
        "# Benchmark: quantizing a head (`--outtype`) against `llama-quantize --pure`",
        "",
        f"The same work on both sides: a trunk already in {c['qtype'].upper()} ({inputs['target_bytes']:,} bytes, "
        f"copied) and a BF16 NextN block ({inputs['draft_bytes']:,} bytes, quantized to {c['qtype'].upper()}); "
        f"page cache {c['cache']} before each run; medians of {c['repeat']} alternating round(s) after "
        f"{c['warmup']} warm-up round(s); outputs on disk (fsync/sync) before the clock stops. "
        "Made by `scripts/perf.py` (`--quantize-only` runs just this case).",
        "",
        *conditions_and_summary(results),
    ]
    lines += ["", *goals_table(results["targets"], "issue 23")]
    return "\n".join(lines)


def write_quantize_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write ``quantize.json`` and ``quantize.md`` into ``out_dir``; returns their paths."""
    return write_json_and_markdown(results, out_dir, QUANTIZE_JSON, QUANTIZE_MD, render_quantize_markdown(results))
