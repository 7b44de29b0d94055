"""The benchmark script (``scripts/perf.py``): its inputs, its measuring rules, and one end-to-end smoke run.

No timing assertions: only that the right things are measured, on the right inputs, and reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_mtp import open_model, plan_compose
from gguf_mtp.constants import KEY_SPLIT_TENSORS_COUNT

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

from perf_inputs import TargetSpec, ensure_draft, ensure_target, parse_size  # noqa: E402
from perf_lib import Command, CommandFailed, Sample, measure, median_ratio, run_alternating  # noqa: E402
from perf_reflink import reflink_unavailable, xfs_mount  # noqa: E402
from support.session import IN_CI, shared_tmp_dir  # noqa: E402

MiB = 2**20


DOCS = SCRIPTS.parent / "docs" / "benchmarks"
DOC_FILES = ("README.md", "results.json", "perf.png")


def _doc_bytes() -> dict[str, bytes]:
    return {name: (DOCS / name).read_bytes() for name in DOC_FILES if (DOCS / name).exists()}


@pytest.fixture(scope="module")
def quick_run(request: pytest.FixtureRequest, llama_quantize_tool: Path) -> tuple[Path, dict, str, dict[str, bytes]]:
    """``perf.py --quick`` run once with only a work folder given, and the llama-quantize the suite has (a run
    under a timeout never builds llama.cpp's tools: the fixture has them before it starts).

    Returns (its report folder, results.json, its stderr, the committed docs/benchmarks files before it ran).
    """
    root = shared_tmp_dir(request, "perf")  # with its XFS image: deleted after the module
    before = _doc_bytes()
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "perf.py"), "--quick", "--work-dir", str(root / "work")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "GGUF_MTP_LLAMA_QUANTIZE": str(llama_quantize_tool)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = root / "work" / "quick-report"
    return out, json.loads((out / "results.json").read_text()), done.stderr, before


def _summary(results: dict, tool: str, case: str) -> list[dict]:
    return [r for r in results["summary"] if (r["tool"], r["case"]) == (tool, case)]


# ------------------------------------------------------------------------------------------ inputs


def test_parse_size_reads_binary_units() -> None:
    assert parse_size("3G") == 3 * 2**30
    assert parse_size("512M") == 512 * MiB
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse_size("0M")


def test_synthetic_split_target_is_a_valid_split_set_of_the_requested_size(tmp_path: Path) -> None:
    target = ensure_target(tmp_path, TargetSpec(parse_size("8M"), shards=3, pattern="M*E"), log=lambda _: None)
    model = open_model(target.paths[1])  # any shard finds its siblings
    assert [p.name for p in model.paths] == [f"bench-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert model.arch == "nemotron_h_moe" and model.block_count == 3
    assert all(h.get(KEY_SPLIT_TENSORS_COUNT) == model.tensor_count for h in model.headers)
    assert all(set(h.kvs) == {"split.no", "split.count", KEY_SPLIT_TENSORS_COUNT} for h in model.headers[1:])
    assert all(h.first_misplaced_tensor() is None for h in model.headers)  # the layout llama.cpp accepts
    assert abs(target.nbytes - 8 * MiB) < 0.05 * 8 * MiB
    assert model.headers[-1].file_size == model.headers[-1].data_offset + model.headers[-1].packed_data_size


def test_size_is_reached_through_the_expert_count_at_a_fixed_tensor_count(tmp_path: Path) -> None:
    small = ensure_target(tmp_path, TargetSpec(parse_size("8M"), shards=1, pattern="M*E"), log=lambda _: None)
    large = ensure_target(tmp_path, TargetSpec(parse_size("24M"), shards=1, pattern="M*E"), log=lambda _: None)
    assert open_model(small.first).tensor_count == open_model(large.first).tensor_count
    assert large.hparams.n_expert > 2 * small.hparams.n_expert
    assert abs(large.nbytes - 24 * MiB) < 0.05 * 24 * MiB


def test_compose_accepts_the_synthetic_target_and_its_draft(tmp_path: Path) -> None:
    target = ensure_target(tmp_path, TargetSpec(parse_size("8M"), shards=3, pattern="M*E"), log=lambda _: None)
    draft = ensure_draft(tmp_path, target.hparams, log=lambda _: None)
    composition = plan_compose(target.first, draft, tmp_path / "out")
    assert composition.block == 3
    assert len(composition.renamed) == 18


def test_generated_inputs_are_reused_while_their_parameters_do_not_change(tmp_path: Path) -> None:
    spec = TargetSpec(parse_size("8M"), shards=3, pattern="M*E")
    messages: list[str] = []
    first = ensure_target(tmp_path, spec, log=messages.append)
    stamps = [p.stat().st_mtime_ns for p in first.paths]
    again = ensure_target(tmp_path, spec, log=messages.append)
    assert [p.stat().st_mtime_ns for p in again.paths] == stamps
    assert len(messages) == 1
    ensure_target(tmp_path, TargetSpec(parse_size("8M"), shards=3, pattern="M*E", seed=7), log=messages.append)
    assert len(messages) == 2  # another seed is another input


# --------------------------------------------------------------------------------------- measuring


def _python(code: str, tool: str = "python") -> Command:
    return Command(tool, "none", 0, (sys.executable, "-c", code))


def test_peak_rss_is_the_commands_own_not_inherited_from_the_benchmark() -> None:
    ballast = b"\x01" * (300 * MiB)  # the measuring process is big; a small child must not look big
    small = measure(_python("import time; time.sleep(0.3)"))
    big = measure(_python("import time; b = b'\\x01' * (200 * 2**20); time.sleep(0.3)"))
    assert len(ballast) == 300 * MiB
    assert 1 * MiB < small.peak_rss < 60 * MiB
    assert big.peak_rss >= 200 * MiB
    assert big.peak_anon >= 200 * MiB
    assert big.cpu_seconds > 0  # the child's own CPU time (building 200 MiB), not this process's


def test_runs_alternate_and_outputs_are_counted_then_removed(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(1 << 20))
    out = tmp_path / "out"
    copy = Command("cp", "x", source.stat().st_size, ("cp", str(source), str(out) + "/"), (source,), out)
    noop = _python("pass", tool="noop")
    samples = run_alternating([copy, noop], repeat=2, cache="cold", log_dir=tmp_path / "logs")
    assert [(s.tool, s.round) for s in samples] == [("cp", 0), ("noop", 0), ("cp", 1), ("noop", 1)]
    assert [s.bytes_out for s in samples if s.tool == "cp"] == [1 << 20, 1 << 20]
    assert not out.exists()


def test_warm_up_rounds_run_but_are_not_kept(tmp_path: Path) -> None:
    tally = tmp_path / "tally"
    count = Command("count", "x", 0, ("sh", "-c", f"echo run >> {tally}"))
    samples = run_alternating([count], repeat=2, warmup=1, cache="cold", log_dir=tmp_path / "logs")
    assert [s.round for s in samples] == [0, 1]
    assert tally.read_text().count("run") == 3


def test_a_command_that_does_not_fsync_gets_sync_inside_its_measured_run(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(1 << 20))
    out = tmp_path / "out"
    argv = ("cp", str(source), str(out) + "/")
    copy = Command("cp", "x", 1 << 20, argv, (source,), out, syncs_itself=False)
    assert copy.durable_argv[:2] == ("sh", "-c") and copy.durable_argv[-3:] == argv
    assert "sync" in copy.durable_argv[2]
    assert measure(copy).bytes_out == 1 << 20


def test_a_failing_command_is_reported_with_its_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    failing = Command("cp", "x", 0, ("cp", str(tmp_path / "missing"), str(out) + "/"), (), out)
    with pytest.raises(CommandFailed, match="No such file"):
        measure(failing, log_file=tmp_path / "cp.log")
    assert not out.exists()


def test_time_ratio_is_the_median_of_same_round_pairs() -> None:
    def sample(tool: str, round_no: int, seconds: float) -> Sample:
        return Sample(tool, "c", 1, round_no, seconds, 0.0, 0, 0, 0)

    samples = [sample("a", 0, 4.0), sample("b", 0, 2.0), sample("a", 1, 1.0), sample("b", 1, 1.0),
               sample("a", 2, 3.0), sample("b", 2, 2.0)]
    assert median_ratio(samples, ("a", "c"), ("b", "c"), 1) == 1.5
    assert median_ratio(samples, ("a", "c"), ("b", "c"), 2) is None


# ------------------------------------------------------------------------------------- end to end


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
def test_quick_run_measures_every_comparison_at_every_size(quick_run: tuple[Path, dict]) -> None:
    _, results, *_ = quick_run
    sizes = results["config"]["sizes"]
    pairs = [("compose", "sharded"), ("cp", "sharded"), ("compose", "single"), ("gguf_new_metadata", "single"),
             ("strip", "sharded"), ("cp", "target"), ("graft", "sharded")]
    for tool, case in pairs:
        rows = _summary(results, tool, case)
        assert sorted(r["size"] for r in rows) == sizes, (tool, case)
        assert all(r["median_seconds"] > 0 and r["max_rss"] > 0 for r in rows)
    for name in ("compose_vs_cp", "compose_vs_gguf_new_metadata", "strip_vs_cp", "graft_vs_cp"):
        assert all(results["ratios"][name][str(size)] > 0 for size in sizes)


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
def test_cp_baseline_moves_exactly_the_bytes_compose_writes(quick_run: tuple[Path, dict]) -> None:
    _, results, *_ = quick_run
    compose = {r["size"]: r["bytes_out"] for r in _summary(results, "compose", "sharded")}
    cp = {r["size"]: r["bytes_out"] for r in _summary(results, "cp", "sharded")}
    targets = {t["size"]: t["sharded_bytes"] + t["draft_bytes"] for t in results["inputs"]["targets"]}
    # compose re-serialises headers (a few bytes more for the new keys, and per shard at most a block plus
    # 36 bytes of gguf_mtp.pad that keeps the data in step for reflink), cp copies files as they are.
    assert all(abs(compose[s] - cp[s]) < 4096 + 3 * (4096 + 36) and cp[s] == targets[s] for s in targets)


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
def test_quick_run_measures_convert_against_cp_of_the_head(quick_run: tuple[Path, dict]) -> None:
    _, results, *_ = quick_run
    (convert,) = _summary(results, "convert", "head")
    (cp,) = _summary(results, "cp", "head")
    assert convert["size"] == cp["size"] == results["inputs"]["head"]["safetensors_bytes"]
    assert convert["bytes_out"] > 0 and convert["max_rss"] > 0
    assert results["ratios"]["convert_vs_cp"][str(cp["size"])] > 0


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
def test_quick_run_writes_table_json_and_plot(quick_run: tuple[Path, dict]) -> None:
    out, results, *_ = quick_run
    readme = (out / "README.md").read_text()
    assert "| compose a 3-file target vs `cp` of the same files (+ draft) | 16 MiB |" in readme
    assert "vs `gguf_new_metadata.py`" in readme
    assert all(t["goal"] in readme for t in results["targets"])
    assert "![time and peak RSS vs target size](perf.png)" in readme
    png = (out / "perf.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
def test_quick_run_reports_into_a_scratch_folder_and_leaves_the_committed_figures(
    quick_run: tuple[Path, dict, str, dict[str, bytes]],
) -> None:
    out, results, stderr, before = quick_run
    assert set(before) == set(DOC_FILES)  # the committed figures exist, so "unchanged" means something
    assert _doc_bytes() == before
    assert f"smoke run: the report goes to {out.resolve()}" in stderr
    reflink = ("reflink.json", "reflink.md") if reflink_unavailable() is None else ()
    quantize = ("quantize.json", "quantize.md") if "quantize case skipped" not in stderr else ()
    fp8 = ("fp8.json", "fp8.md")
    accept = ("accept.json", "accept.md") if "accept case skipped" not in stderr else ()
    assert sorted(p.name for p in out.iterdir()) == sorted((*DOC_FILES, *reflink, *quantize, *fp8, *accept))
    assert results["config"]["quick"] is True


def test_only_a_full_run_or_update_docs_targets_docs_benchmarks(tmp_path: Path) -> None:
    import perf

    def out_dir(*argv: str) -> Path:
        return perf.config_from_args(perf.build_parser().parse_args(["--work-dir", str(tmp_path), *argv])).out_dir

    assert out_dir() == DOCS.resolve()
    assert out_dir("--quick") == (tmp_path / "quick-report").resolve()
    assert out_dir("--quick", "--update-docs") == DOCS.resolve()
    assert out_dir("--quick", "--out-dir", str(tmp_path / "x")) == (tmp_path / "x").resolve()
    with pytest.raises(SystemExit, match="not both"):
        out_dir("--update-docs", "--out-dir", str(tmp_path / "x"))


def test_extra_disk_is_what_the_outputs_hold_whatever_else_writes_meanwhile(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(8 * MiB))
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere.bin"
    # the measured run also writes 32 MiB beside its output folder, as any other process on the machine may
    script = f'cp --reflink=never "$1" "$2"/ && head -c {32 * MiB} /dev/urandom > "$3"'
    argv = ("sh", "-c", script, "sh", str(source), str(out), str(elsewhere))
    copy = Command("cp", "x", 8 * MiB, argv, (source,), out, syncs_itself=False)
    sample = measure(copy, disk=True)
    assert elsewhere.stat().st_size == 32 * MiB
    # the copy's own blocks, exactly (a filesystem without extent maps may add a block of metadata)
    assert sample.extra_disk is not None and 8 * MiB <= sample.extra_disk <= 8 * MiB + 64 * 1024
    assert measure(copy).extra_disk is None


def test_extra_disk_counts_allocated_blocks_not_the_apparent_size(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ("sh", "-c", 'truncate -s 64M "$1/sparse.bin" && printf x >> "$1/sparse.bin"', "sh", str(out))
    sparse = Command("truncate", "x", 0, argv, (), out, syncs_itself=False)
    sample = measure(sparse, disk=True)
    assert sample.bytes_out == 64 * MiB + 1
    assert sample.extra_disk is not None and 0 < sample.extra_disk < MiB  # one block of data, the rest a hole


def test_extra_disk_does_not_count_blocks_shared_with_the_input(tmp_path: Path) -> None:
    reason = reflink_unavailable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI=true: the reflink measurement must be tested ({reason})")
        pytest.skip(f"no reflink filesystem here: {reason}")
    with xfs_mount(tmp_path, 512 * MiB) as mount:
        source = mount / "in.bin"
        source.write_bytes(os.urandom(8 * MiB))
        out = mount / "out"

        def copy(mode: str) -> Command:
            argv = ("cp", f"--reflink={mode}", str(source), str(out) + "/")
            return Command(f"cp {mode}", "x", 8 * MiB, argv, (source,), out, syncs_itself=False)

        shared, copied = measure(copy("always"), disk=True), measure(copy("never"), disk=True)
    assert shared.bytes_out == copied.bytes_out == 8 * MiB
    assert shared.extra_disk == 0
    assert copied.extra_disk == 8 * MiB


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
def test_quick_run_measures_the_reflink_case_on_xfs(quick_run: tuple[Path, dict, str, dict[str, bytes]]) -> None:
    out, _, stderr, _ = quick_run
    reason = reflink_unavailable()
    if reason is not None:
        assert f"reflink case skipped: {reason}" in stderr
        if IN_CI:
            pytest.fail(f"CI=true: the reflink benchmark case must run ({reason})")
        pytest.skip(f"the reflink case cannot run here: {reason}")
    reflink = json.loads((out / "reflink.json").read_text())
    rows = {(r["tool"], r["size"]): r for r in reflink["summary"]}
    tools = ["compose", "cp --reflink=always", "cp --reflink=never", "strip", "graft", "startup"]
    for info in reflink["inputs"]:
        size, target, draft = info["size"], info["target_bytes"], info["draft_bytes"]
        assert all(rows[(tool, size)]["median_seconds"] > 0 for tool in tools)
        assert rows[("cp --reflink=never", size)]["median_extra_disk"] >= target + draft  # a real copy
        assert abs(rows[("cp --reflink=always", size)]["median_extra_disk"]) < MiB  # shared
        # compose shares the target's data and, the draft being made by convert --target, the draft's too:
        # only headers and partial blocks are new
        assert abs(rows[("compose", size)]["median_extra_disk"]) < MiB
        assert abs(rows[("strip", size)]["median_extra_disk"]) < MiB
        assert rows[("graft", size)]["median_extra_disk"] < MiB  # the NextN block's data is shared too
        assert rows[("compose", size)]["bytes_out"] >= target + draft
    text = (out / "reflink.md").read_text()
    assert "| cp --reflink=always |" in text and all(t["goal"] in text for t in reflink["targets"])
    assert "[`reflink.md`](reflink.md)" in (out / "README.md").read_text()


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
def test_quick_run_measures_head_quantization_against_llama_quantize(
    quick_run: tuple[Path, dict, str, dict[str, bytes]],
) -> None:
    out, _, stderr, _ = quick_run
    if "quantize case skipped" in stderr:
        if IN_CI:
            pytest.fail("CI=true: the --outtype vs llama-quantize benchmark case must run")
        pytest.skip("llama-quantize is not built here")
    results = json.loads((out / "quantize.json").read_text())
    rows = {r["tool"]: r for r in results["summary"]}
    ours, theirs = rows["compose --outtype"], rows["llama-quantize --pure"]
    assert ours["median_seconds"] > 0 and theirs["median_seconds"] > 0
    # the same work: the same number of bytes on disk (the composite with a Q4_K head; ours pads its header)
    assert abs(ours["bytes_out"] - theirs["bytes_out"]) < 64 * 1024
    assert results["ratio"] is not None and all(t["goal"] in (out / "quantize.md").read_text()
                                                for t in results["targets"])


@pytest.mark.bench
@pytest.mark.llama  # the quick run quantizes a head with llama.cpp's quantizer
@pytest.mark.upstream
def test_quick_run_measures_the_fp8_head_against_cp_and_llama_cpps_converter(
    quick_run: tuple[Path, dict, str, dict[str, bytes]], tmp_path: Path,
) -> None:
    from support.helpers import reader_tensors

    from gguf_mtp.jobs.convert import convert

    out, *_ = quick_run
    results = json.loads((out / "fp8.json").read_text())
    upstream_tool = "convert_hf_to_gguf.py --mtp"
    rows = {r["tool"]: r for r in results["summary"]}
    if upstream_tool not in rows:
        assert any("llama.cpp's converter left out" in n for n in results["notes"]), results["notes"]
        if IN_CI:
            pytest.fail("CI=true: the FP8 benchmark case must run llama.cpp's converter")
        pytest.skip("llama.cpp's converter (the torch venv) is not available here")
    ours, cp, theirs = rows["convert"], rows["cp"], rows[upstream_tool]
    shard = results["inputs"]["head_shard_bytes"]
    assert all(s["size"] == shard for s in results["samples"])
    assert cp["bytes_out"] == shard  # cp moves exactly the NextN shard
    # FP8 -> BF16 doubles the FP8 weights; upstream's --mtp file also holds token_embd / output and the tokenizer
    assert ours["bytes_out"] > shard + results["inputs"]["head_fp8_bytes"] // 2
    assert theirs["bytes_out"] > ours["bytes_out"]
    assert all(r["median_seconds"] > 0 and r["max_rss"] > 0 for r in rows.values())
    assert results["ratios"]["convert_vs_cp"] > 0 and results["ratios"]["convert_vs_upstream"] > 0
    text = (out / "fp8.md").read_text()
    assert f"| {upstream_tool} |" in text and all(t["goal"] in text for t in results["targets"])
    # the same checkpoint converts to the same NextN bytes both ways (so the timings compare the same work)
    spec = results["config"]["spec"]
    checkpoint = out.parent / f"fp8-e{spec['n_expert']}-f{spec['n_ff_exp']}-d{spec['n_embd']}" / "checkpoint"
    from support.upstream import upstream_convert

    mine = reader_tensors(convert(checkpoint, tmp_path / "d.gguf", block=1, progress=False).output)
    reference = upstream_convert(checkpoint, tmp_path / "mtp.gguf", "--mtp", outtype="auto")
    assert mine == {n: t for n, t in reader_tensors(reference).items() if n.startswith("blk.1.")}
    assert any(t == 30 for t, _, _ in mine.values())  # BF16 matrices, dequantized from FP8


def test_set_writer_goals_bound_cp_plus_fsync_at_1g_and_3g_from_same_round_ratios() -> None:
    import perf

    sizes = (2**30, 3 * 2**30)
    seconds = {("compose", "sharded"): 1.1, ("cp", "sharded"): 1.0, ("compose", "single"): 1.0,
               ("gguf_new_metadata", "single"): 1.0, ("strip", "sharded"): 0.9, ("cp", "target"): 0.9,
               ("graft", "sharded"): 1.2}
    samples = [Sample(tool, case, size, 0, seconds[(tool, case)] * size / 2**30, 0.0, MiB, MiB, size)
               for size in sizes for tool, case in seconds]
    config = perf.BenchConfig(Path(), Path(), sizes, 3 * 2**30, 1, 0, 3, "M", "cold", None)

    goals = {t["goal"]: (t["measured"], t["met"]) for t in perf.analyse(samples, config)["targets"]}

    assert goals["compose / (cp + fsync) <= 1.15 at 1G"] == (1.1, True)
    assert goals["compose / (cp + fsync) <= 1.05 at 3G"] == (1.1, False)
    assert goals["strip / (cp + fsync) <= 1.05 at 3G"] == (1.0, True)  # strip writes the target's bytes: cp of those
    assert goals["graft / (cp + fsync) <= 1.15 at 1G"] == (1.2, False)
