"""The FP8 case of the benchmark (issue 22 item 6): ``gguf-mtp convert`` of a block-scaled FP8 MTP head against
``cp`` of its safetensors and against llama.cpp's own ``convert_hf_to_gguf.py --mtp`` on the same checkpoint.

The input is a synthetic DeepSeek-V3-like checkpoint (MLA attention, a MoE NextN layer of many experts, every linear
weight ``F8_E4M3`` with F32 ``weight_scale_inv`` in 128x128 blocks, partial blocks included; embeddings, norms and
the router BF16; ``quantization_config: fp8``). Its architecture is GLM-4.7-Flash's ``Glm4MoeLiteForCausalLM``: the
same deepseek2 tensor handling and FP8 dequantization upstream, and the only deepseek2 class whose ``--mtp`` upstream
accepts (its DeepSeek V3 class drops the MTP layer). The trunk is one small dense layer; the NextN layer, alone in
the last shard, is the bulk (a full run: at least 2 GB of FP8). The names and shapes are those of
``tests/support/deepseek_checkpoints.py``; the values are random (random FP8 codes, random block scales): the cost
of the work does not depend on them, and ``tests/test_family_deepseek2.py`` proves both converters write the same bytes.

Measured, alternating, page cache cold: ``gguf-mtp convert CKPT --block 1`` (dequantized to BF16, llama.cpp's
``--outtype auto`` for these checkpoints), ``cp`` of the NextN shard, and upstream's ``--mtp --outtype auto`` (run
with the torch venv ``.venv-upstream`` or ``$GGUF_MTP_UPSTREAM_PYTHON``; it writes the same NextN block plus
``token_embd``/``output_norm``/``output`` and the tokenizer, and does not fsync, so it runs as ``COMMAND && sync``).
Without that venv the upstream row is left out and the report says why.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from perf_lib import Command, case_results, load_average, measure_case, median_tool_ratio, tool_rows
from perf_report import conditions_and_summary, write_json_and_markdown

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from support.deepseek_checkpoints import MlaDims, mla_config, mla_tensors  # noqa: E402
from support.fp8_checkpoints import is_linear  # noqa: E402
from support.glm_checkpoints import GLM_SPECIAL_TOKENS  # noqa: E402

from gguf_mtp.format.safetensors_io import CONFIG_NAME, INDEX_NAME  # noqa: E402
from gguf_mtp.testing.tiny_checkpoints import CheckpointTensor  # noqa: E402

__all__ = ["FP8_JSON", "FP8_MD", "Fp8Spec", "ensure_fp8_checkpoint", "run_fp8", "write_fp8_report"]

PYTHON = sys.executable
FP8_MD = "fp8.md"
FP8_JSON = "fp8.json"
GENERATOR_VERSION = 1
BLOCK = 128
#: Issue 22 item 6: flat memory. The head's largest expert stack is bigger than this in BF16.
MAX_CONVERT_RSS = 2**30
#: Bytes generated per write while making the checkpoint.
_CHUNK = 32 * 2**20
N_TRUNK = 1  # one dense trunk layer: the NextN layer is model.layers.1 -> blk.1


@dataclass(frozen=True)
class Fp8Spec:
    """The synthetic checkpoint: DeepSeek V3's shape scaled down in width and expert count (a full run's head is
    3 x 128 experts of 2816 x 2048 = 2.2 GB of FP8, plus MLA attention and the shared expert)."""

    n_embd: int = 2048
    n_head: int = 16
    q_lora: int = 768
    kv_lora: int = 512
    nope: int = 128
    rope: int = 64
    v_dim: int = 128
    n_expert: int = 128
    n_expert_used: int = 8
    n_ff_exp: int = 2816
    n_ff_dense: int = 2816

    @property
    def dims(self) -> MlaDims:
        return MlaDims(n_embd=self.n_embd, n_head=self.n_head, q_lora=self.q_lora, kv_lora=self.kv_lora,
                       nope=self.nope, rope=self.rope, v_dim=self.v_dim, n_expert=self.n_expert,
                       n_expert_used=self.n_expert_used, n_ff_exp=self.n_ff_exp, n_ff_dense=self.n_ff_dense)


#: A --quick run: dims that are not multiples of 128 (partial blocks), 8 experts, a few MB.
QUICK_SPEC = Fp8Spec(n_embd=256, n_head=4, q_lora=96, kv_lora=64, nope=32, rope=16, v_dim=48, n_expert=8,
                     n_expert_used=2, n_ff_exp=200, n_ff_dense=320)


def _fp8_codes(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` random finite E4M3 codes (0x7F / 0xFF are NaN in e4m3fn)."""
    codes = rng.integers(0, 256, count, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x70
    return codes


def _bf16(rng: np.random.Generator, count: int, fill: str) -> np.ndarray:
    values = rng.standard_normal(count, dtype=np.float32) * (0.1 if fill == "norm" else 0.02)
    if fill == "norm":
        values += 1.0
    return (values.view(np.uint32) >> 16).astype(np.uint16)


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    fill: str  # "fp8", "scale", "norm", "weight", "bias"

    @property
    def nbytes(self) -> int:
        size = {"F8_E4M3": 1, "BF16": 2, "F32": 4}[self.dtype]
        return math.prod(self.shape) * size


def _entries(tensors: Sequence[CheckpointTensor]) -> list[_Entry]:
    """The checkpoint's tensors as written: linear weights FP8 with their block scales next to them."""
    out = []
    for t in tensors:
        if t.dtype == "BF16" and is_linear(t.name, list(t.shape)):
            rows, cols = t.shape
            out += [_Entry(t.name, "F8_E4M3", t.shape, "fp8"),
                    _Entry(t.name + "_scale_inv", "F32", (math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)), "scale")]
        else:
            out.append(_Entry(t.name, t.dtype, t.shape, t.fill))
    return out


def _write_safetensors(path: Path, entries: Sequence[_Entry], seed: int) -> None:
    """One safetensors file, its header first, then each tensor's random values a bounded chunk at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for e in entries:
            itemsize = e.nbytes // max(1, math.prod(e.shape))
            left = math.prod(e.shape)
            while left:
                count = min(left, _CHUNK // itemsize)
                if e.fill == "fp8":
                    chunk = _fp8_codes(rng, count)
                elif e.fill == "scale":
                    chunk = rng.uniform(1e-4, 1e-3, count).astype(np.float32)
                elif e.dtype == "F32":
                    chunk = (rng.standard_normal(count, dtype=np.float32) * 0.01).astype(np.float32)
                else:
                    chunk = _bf16(rng, count, e.fill)
                f.write(chunk.tobytes())
                left -= count


def ensure_fp8_checkpoint(work_dir: Path, spec: Fp8Spec, *, tokenizer: Callable[[Path], object] | None = None,
                          log: Callable[[str], None] = print) -> Path:
    """The checkpoint folder of ``spec`` under ``work_dir`` (two shards + index, the NextN layer alone in the
    second), written unless an identical one is there; ``tokenizer(folder)`` adds the tokenizer upstream needs."""
    folder = work_dir / f"fp8-e{spec.n_expert}-f{spec.n_ff_exp}-d{spec.n_embd}"
    checkpoint = folder / "checkpoint"
    stamp = folder / "params.json"
    params = {"version": GENERATOR_VERSION, **asdict(spec), "tokenizer": tokenizer is not None}
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return checkpoint
    log(f"generating {checkpoint} ({spec.n_expert} experts x {spec.n_ff_exp} x {spec.n_embd}, FP8 E4M3)")
    checkpoint.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    config = mla_config("glm47flash", spec.dims, n_layers=N_TRUNK)
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK],
                                     "activation_scheme": "dynamic"}
    (checkpoint / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    tensors = mla_tensors("glm47flash", spec.dims, n_layers=N_TRUNK)
    head = f"model.layers.{N_TRUNK}."
    files = {"model-00001-of-00002.safetensors": _entries([t for t in tensors if not t.name.startswith(head)]),
             "model-00002-of-00002.safetensors": _entries([t for t in tensors if t.name.startswith(head)])}
    for seed, (name, entries) in enumerate(files.items()):
        _write_safetensors(checkpoint / name, entries, seed)
    weight_map = {e.name: name for name, entries in files.items() for e in entries}
    total = sum(e.nbytes for entries in files.values() for e in entries)
    (checkpoint / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                    indent=2) + "\n")
    if tokenizer is not None:
        tokenizer(checkpoint)
    stamp.write_text(json.dumps(params))
    return checkpoint


def head_shard(checkpoint: Path) -> Path:
    """The shard that holds the NextN layer (what ``cp`` copies for the baseline)."""
    return checkpoint / "model-00002-of-00002.safetensors"


def upstream_runner(python: str | None) -> tuple[str, Path] | str:
    """(python, llama.cpp tree) to run llama.cpp's converter, or why it cannot run here."""
    import subprocess

    python = python or os.environ.get("GGUF_MTP_UPSTREAM_PYTHON") or str(REPO / ".venv-upstream" / "bin" / "python")
    python = os.path.abspath(python)
    try:
        ok = subprocess.run([python, "-c", "import torch, transformers, sentencepiece, yaml"], capture_output=True,
                            timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        return f"{python} cannot run llama.cpp's converter (torch, transformers): run `make upstream-venv`"
    os.environ["GGUF_MTP_UPSTREAM_PYTHON"] = python  # what tests/support/upstream.py runs the tokenizer build with
    from support.upstream import llama_cpp_tree

    return python, llama_cpp_tree()


def fp8_group(work_dir: Path, checkpoint: Path, upstream: tuple[str, Path] | None) -> list[Command]:
    """convert | cp (the NextN shard) | upstream's convert_hf_to_gguf.py --mtp (when it can run)."""
    env = {"GGUF_MTP_DISABLE_PROGRESS": "1", "PYTHONUNBUFFERED": "1"}
    inputs = tuple(sorted(p for p in checkpoint.iterdir() if p.is_file()))
    shard = head_shard(checkpoint)
    size = shard.stat().st_size
    runs = work_dir / "runs"
    group = [
        Command("convert", "fp8", size,
                (PYTHON, "-m", "gguf_mtp", "convert", str(checkpoint), "-o", str(runs / "fp8-convert" / "draft.gguf"),
                 "--block", str(N_TRUNK), "--quiet"),
                inputs, runs / "fp8-convert", env),
        Command("cp", "fp8", size, ("cp", str(shard), str(runs / "fp8-cp") + "/"), inputs, runs / "fp8-cp", env,
                syncs_itself=False),
    ]
    if upstream is not None:
        python, tree = upstream
        upstream_env = {"PYTHONPATH": str(tree / "gguf-py"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        group.append(Command(
            "convert_hf_to_gguf.py --mtp", "fp8", size,
            (python, str(tree / "convert_hf_to_gguf.py"), str(checkpoint), "--mtp", "--outtype", "auto",
             "--outfile", str(runs / "fp8-upstream" / "mtp.gguf")),
            inputs, runs / "fp8-upstream", upstream_env, syncs_itself=False))
    return group


def run_fp8(
    work_dir: Path, *, quick: bool, repeat: int, warmup: int, cache: str, spec: Fp8Spec | None = None,
    upstream_python: str | None = None, log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure convert of the FP8 head against cp and upstream; returns the results (see ``fp8.json``)."""
    spec = spec or (QUICK_SPEC if quick else Fp8Spec())
    notes: list[str] = []
    runner = upstream_runner(upstream_python)
    upstream = runner if isinstance(runner, tuple) else None
    if upstream is None:
        notes.append(f"llama.cpp's converter left out: {runner}")
        tokenizer = None
    else:
        from support.upstream import write_gpt2_tokenizer
        from support.warm_converter import close_warm_converters

        def tokenizer(folder: Path) -> object:
            try:
                return write_gpt2_tokenizer(folder, GLM_SPECIAL_TOKENS)
            finally:
                close_warm_converters()  # no idle converter process beside the measured runs

    checkpoint = ensure_fp8_checkpoint(work_dir, spec, tokenizer=tokenizer, log=log)
    group = fp8_group(work_dir, checkpoint, upstream)
    load_before = load_average()
    samples = measure_case(group, "the FP8 head", repeat=repeat, warmup=warmup, cache=cache,
                           log_dir=work_dir / "logs-fp8", log=log, evict=list(group[0].inputs))
    rows = tool_rows(samples)
    by_tool = {r["tool"]: r for r in rows}
    upstream_tool = "convert_hf_to_gguf.py --mtp"
    ratios = {"convert_vs_cp": median_tool_ratio(samples, "convert", "cp"),
              "convert_vs_upstream": median_tool_ratio(samples, "convert", upstream_tool)}
    ours = by_tool["convert"]
    shard = head_shard(checkpoint)
    fp8_bytes = sum(math.prod(e.shape) for e in _entries(mla_tensors("glm47flash", spec.dims, n_layers=N_TRUNK))
                    if e.dtype == "F8_E4M3" and e.name.startswith(f"model.layers.{N_TRUNK}."))
    targets = [
        {"goal": f"convert peak RSS < {MAX_CONVERT_RSS // 2**20} MiB (one expert at a time)",
         "measured": f"{ours['max_rss'] / 2**20:.0f} MiB", "met": ours["max_rss"] < MAX_CONVERT_RSS},
        {"goal": "convert faster than llama.cpp's convert_hf_to_gguf.py --mtp (same checkpoint)",
         "measured": None if ratios["convert_vs_upstream"] is None else
         f"{ratios['convert_vs_upstream']:.2f}x the time ({ours['median_seconds']:.1f} s vs "
         f"{by_tool[upstream_tool]['median_seconds']:.1f} s)",
         "met": ratios["convert_vs_upstream"] is not None and ratios["convert_vs_upstream"] < 1},
    ]
    if upstream is not None:
        theirs = by_tool[upstream_tool]
        targets.append({"goal": "convert peak RSS below upstream's",
                        "measured": f"{ours['max_rss'] / 2**20:.0f} MiB vs {theirs['max_rss'] / 2**20:.0f} MiB",
                        "met": ours["max_rss"] < theirs["max_rss"]})
    return case_results(
        {"repeat": repeat, "warmup": warmup, "cache": cache, "quick": quick, "spec": asdict(spec),
         "hf_architecture": "Glm4MoeLiteForCausalLM", "outtype": "auto (BF16)"},
        load_before,
        {"head_shard_bytes": shard.stat().st_size, "head_fp8_bytes": fp8_bytes,
         "checkpoint_bytes": sum(p.stat().st_size for p in checkpoint.glob("*.safetensors")),
         "upstream": None if upstream is None else {"python": upstream[0], "tree": str(upstream[1])}},
        samples, rows, ratios=ratios, targets=targets, notes=notes,
    )


def render_fp8_markdown(results: dict[str, Any]) -> str:
    c, inputs, spec = results["config"], results["inputs"], results["config"]["spec"]
    lines = [
        "# Benchmark: converting an FP8 MTP head",
        "",
        f"A synthetic DeepSeek-V3-like block-scaled FP8 checkpoint (`{c['hf_architecture']}`, hidden "
        f"{spec['n_embd']}, MLA, {spec['n_expert']} experts of {spec['n_ff_exp']} x {spec['n_embd']}, F8_E4M3 with "
        f"F32 128x128 block scales): the NextN layer alone in its shard, {inputs['head_shard_bytes']:,} bytes "
        f"({inputs['head_fp8_bytes']:,} bytes of FP8 weights). `gguf-mtp convert` dequantizes it to BF16 "
        "(llama.cpp's `--outtype auto` for such checkpoints); `cp` copies the shard; llama.cpp's own "
        "`convert_hf_to_gguf.py --mtp --outtype auto` converts the same checkpoint (its output also holds "
        "`token_embd`, `output_norm`, `output` and the tokenizer). Page cache "
        f"{c['cache']} before each run; medians of {c['repeat']} alternating round(s) after {c['warmup']} warm-up "
        "round(s); outputs on disk (fsync/sync) before the clock stops. Made by `scripts/perf.py` (`--fp8-only` "
        "runs just this case). Both converters write the same NextN bytes: `tests/test_family_deepseek2.py` "
        "proves it on tiny checkpoints, `tests/test_perf.py` on this benchmark's own (`--quick`) checkpoint.",
        "",
        *conditions_and_summary(results, rss=",.0f"),
    ]
    ratios = results["ratios"]
    lines += ["", "Same-round time ratios (medians): " + ", ".join(
        f"{name.replace('_', ' ')} {value:.2f}x" for name, value in ratios.items() if value is not None) + ".",
        "", "## Goals (issue 22 item 6)", "", "| goal | measured | met |", "|---|---|---|"]
    for t in results["targets"]:
        lines.append(f"| {t['goal']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |")
    if results["notes"]:
        lines += ["", "## Notes", "", *(f"- {n}" for n in results["notes"])]
    lines.append("")
    return "\n".join(lines)


def write_fp8_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write ``fp8.json`` and ``fp8.md`` into ``out_dir``; returns their paths."""
    return write_json_and_markdown(results, out_dir, FP8_JSON, FP8_MD, render_fp8_markdown(results))
