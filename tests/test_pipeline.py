"""pipeline: exactly the target's shard set, convert -> compose -> verify -> publish, and resuming that checks
finished stages instead of trusting them."""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import cast

import huggingface_hub
import huggingface_hub.constants
import pytest
from support.helpers import flip_byte
from support.hub_standin import FIRST_COMMIT, RecordingHub

from gguf_mtp import HubError, ShardSetError, UnsafeOutputError, VerificationError
from gguf_mtp.check.verify import Check, VerifyReport
from gguf_mtp.release.pipeline import STATE_NAME, PipelineReport, run_pipeline, select_target_files
from gguf_mtp.release.pipeline.disk import SHARD_HEADER_GROWTH
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import write_target

TARGET_REPO = "unsloth/Tiny-Nemotron-GGUF"
HEAD_REPO = "nvidia/Tiny-Nemotron-MTPv2"
PREFIX = "Tiny-Nemotron-UD-Q4_K_XL"
PATTERN = f"UD-Q4_K_XL/{PREFIX}-*-of-*.gguf"
SHARDS = [f"UD-Q4_K_XL/{PREFIX}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
COMMIT = "c0ffee" + "0" * 34


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def target_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out like the target's Hub repo, with the strays a glob would also catch."""
    root = tmp_path_factory.mktemp("target-repo")
    write_target(root / "UD-Q4_K_XL", shards=3, name=PREFIX)
    # an earlier composite and an mmproj file sit next to the shards, as on real repos
    write_target(root / "UD-Q4_K_XL", shards=3, name=f"{PREFIX}-MTPv2", seed=7)
    (root / "UD-Q4_K_XL" / f"mmproj-{PREFIX}.gguf").write_bytes(b"GGUF not a text model")
    (root / "README.md").write_text("target card\n")
    return root


@pytest.fixture(scope="module")
def head_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mtpv2_checkpoint(tmp_path_factory.mktemp("head") / "Tiny-Nemotron-MTPv2")


def put_in_hub_cache(cache: Path, repo_id: str, source: Path, commit: str = COMMIT) -> Path:
    """Lay ``source``'s files out as huggingface_hub's cache does: ``blobs/<hash>``, relative links in
    ``snapshots/<commit>/`` and ``refs/main``; returns the snapshot folder."""
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = path.relative_to(source)
        blob = storage / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory, target_repo: Path, head_checkpoint: Path) -> Path:
    home = tmp_path_factory.mktemp("hf-home")
    put_in_hub_cache(home / "hub", TARGET_REPO, target_repo)
    put_in_hub_cache(home / "hub", HEAD_REPO, head_checkpoint, commit="beef" + "0" * 36)
    return home


def pipeline_process(work: Path, hf_home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m gguf_mtp pipeline`` run offline against the Hub cache in ``hf_home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "GGUF_MTP_DISABLE_PROGRESS": "1"}
    argv = ["pipeline", "--target-repo", TARGET_REPO, "--target-files", PATTERN, "--head-repo", HEAD_REPO]
    return subprocess.run(
        [sys.executable, "-m", "gguf_mtp", *argv, "--work-dir", str(work), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def run_cli(work: Path, hf_home: Path, *extra: str) -> dict:
    """Run the pipeline against the prepared Hub cache; returns its JSON report."""
    proc = pipeline_process(work, hf_home, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def statuses(report: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in report["stages"]}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, hf_home: Path) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("pipeline") / "work"
    return work, run_cli(work, hf_home)


@pytest.fixture
def work_copy(first_run: tuple[Path, dict], tmp_path: Path) -> Path:
    """A private copy of the finished work folder (its records are relative, so it can move)."""
    work, _ = first_run
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    return copy


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------- offline, from the Hub cache


@pytest.mark.slow
def test_offline_run_from_the_hub_cache_goes_through_every_stage(first_run: tuple[Path, dict]) -> None:
    work, report = first_run
    assert statuses(report) == {
        "target": "ran",
        "draft": "ran",
        "compose": "ran",
        "verify": "ran",
        "publish": "skipped",
    }
    composite = [Path(p) for p in report["composite"]]
    assert [p.name for p in composite] == [f"{PREFIX}-MTP-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(p.is_file() and p.parent == work / "composite" for p in composite)
    assert report["verification"]["ok"] is True


def test_only_the_exact_shard_set_is_used_not_the_stray_composite_or_mmproj(first_run: tuple[Path, dict]) -> None:
    _, report = first_run
    names = [Path(p).name for p in report["target"]]
    assert names == [s.rpartition("/")[2] for s in SHARDS]


@pytest.mark.llama
def test_composite_loads_in_llama_cpp(first_run: tuple[Path, dict]) -> None:
    _, report = first_run
    names = [c["name"] for c in report["verification"]["checks"] if c["ok"]]
    assert any("llama" in n for n in names)


def test_state_file_records_each_stage_output_with_size_and_sha256(first_run: tuple[Path, dict]) -> None:
    work, _ = first_run
    state = json.loads((work / STATE_NAME).read_text())
    compose_outputs = state["stages"]["compose"]["outputs"]
    assert [o["path"] for o in compose_outputs] == [f"composite/{PREFIX}-MTP-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for o in compose_outputs:
        assert o["size"] == (work / o["path"]).stat().st_size and o["sha256"] == _sha256(work / o["path"])
    assert set(state["stages"]) == {"target", "draft", "compose", "verify"}
    assert not list(work.glob(f".{STATE_NAME}.*"))  # no temporary state file left


def test_rerun_reuses_every_finished_stage_without_rewriting_it(work_copy: Path, hf_home: Path) -> None:
    composite = sorted((work_copy / "composite").glob("*.gguf"))
    before = {p: p.stat().st_mtime_ns for p in [*composite, work_copy / "draft" / "mtp-draft.gguf"]}
    report = run_cli(work_copy, hf_home)
    assert statuses(report) == {
        "target": "reused",
        "draft": "reused",
        "compose": "reused",
        "verify": "reused",
        "publish": "skipped",
    }
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_a_killed_pipelines_temporary_state_file_is_removed_and_reported(work_copy: Path, hf_home: Path) -> None:
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    leftover = work_copy / f".gguf-mtp-pipeline.json.{dead}.partial"  # SIGKILL while saving the state
    leftover.write_bytes(b'{"format": 1, "stag')

    report = run_cli(work_copy, hf_home)

    assert not leftover.exists()
    assert any("removed 1 temporary file(s)" in n and f"(pid {dead})" in n for n in report["notes"])


def test_corrupted_composite_shard_is_detected_and_composed_again(work_copy: Path, hf_home: Path) -> None:
    shard = sorted((work_copy / "composite").glob("*.gguf"))[1]
    good = _sha256(shard)
    flip_byte(shard, shard.stat().st_size // 2)
    report = run_cli(work_copy, hf_home)
    assert statuses(report)["compose"] == "redone"
    assert statuses(report)["draft"] == "reused" and statuses(report)["target"] == "reused"
    assert _sha256(shard) == good
    # the new composite is byte-identical to the verified one, so that verification still holds
    assert statuses(report)["verify"] == "reused"


@pytest.mark.slow
def test_truncated_draft_is_converted_again_and_later_stages_still_hold(work_copy: Path, hf_home: Path) -> None:
    draft = work_copy / "draft" / "mtp-draft.gguf"
    with open(draft, "r+b") as f:
        f.truncate(draft.stat().st_size - 1)
    report = run_cli(work_copy, hf_home)
    assert statuses(report)["draft"] == "redone"
    assert statuses(report)["compose"] == "reused"


@pytest.mark.slow
def test_changed_parameter_redoes_the_stages_it_affects(work_copy: Path, hf_home: Path) -> None:
    report = run_cli(work_copy, hf_home, "--basename", "Renamed-MTP")
    assert statuses(report)["draft"] == "reused"
    assert statuses(report)["compose"] == "redone"
    assert statuses(report)["verify"] == "redone"
    assert sorted(p.name for p in (work_copy / "composite").iterdir()) == [
        f"Renamed-MTP-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]  # the folder was recreated: no file of the earlier name is left


@pytest.mark.slow
def test_offline_run_with_a_remembered_listing_needs_only_the_shard_set_cached(
    tmp_path: Path, target_repo: Path, head_checkpoint: Path
) -> None:
    """A cache filled online holds only the shards, but remembers the whole repo listing (strays included)."""
    tree_cache = pytest.importorskip("huggingface_hub._tree_cache")  # huggingface_hub >= 1.x keeps listings
    shards_only = tmp_path / "shards-only"
    for rel in SHARDS:
        (shards_only / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target_repo / rel, shards_only / rel)
    home = tmp_path / "hf-home"
    put_in_hub_cache(home / "hub", TARGET_REPO, shards_only)
    put_in_hub_cache(home / "hub", HEAD_REPO, head_checkpoint, commit="beef" + "0" * 36)
    listing = {
        p.relative_to(target_repo).as_posix(): tree_cache.TreeCacheEntry(size=p.stat().st_size, blob_id="0" * 40)
        for p in target_repo.rglob("*")
        if p.is_file()
    }
    storage = home / "hub" / f"models--{TARGET_REPO.replace('/', '--')}"
    tree_cache.write_tree_cache(str(storage), COMMIT, listing)
    report = run_cli(tmp_path / "work", home, "--no-llama")
    assert [Path(p).name for p in report["target"]] == [s.rpartition("/")[2] for s in SHARDS]


def test_offline_without_the_files_in_the_cache_is_one_line(tmp_path: Path) -> None:
    proc = pipeline_process(tmp_path / "work", tmp_path / "empty-home")
    assert proc.returncode == 2
    assert proc.stderr.startswith("gguf-mtp: error:") and proc.stderr.strip().count("\n") == 0
    assert TARGET_REPO in proc.stderr


# ------------------------------------------------------------------------------------------- online path (stand-in Hub)


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _run(hub: RecordingHub, tmp_path: Path, head: Path | str, **kwargs: object) -> object:
    options = dict(
        target_repo=TARGET_REPO,
        target_files=PATTERN,
        head_repo=str(head),
        work_dir=tmp_path / "work",
        cache_dir=tmp_path / "cache",
        api=hub,
        llama=False,
        progress=False,
        say=lambda line: None,
    )
    options |= kwargs
    return run_pipeline(**options)


def test_download_asks_for_exactly_the_shard_set(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = RecordingHub(source=target_repo)
    _run(hub, tmp_path, head_checkpoint)
    download = next(c for c in hub.calls if c[0] == "snapshot_download")
    assert download[2]["allow_patterns"] == SHARDS
    cached = sorted(p.name for p in (tmp_path / "cache").rglob("*.gguf"))
    assert cached == sorted(s.rpartition("/")[2] for s in SHARDS)


def test_a_run_lists_the_target_repo_on_the_hub_once(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = RecordingHub(source=target_repo)
    _run(hub, tmp_path, head_checkpoint)
    listed = [c[1][0] for c in hub.calls if c[0] == "list_repo_files"]
    assert listed == [TARGET_REPO]  # the disk check's listing is the one the target stage downloads from


def test_each_stage_says_its_number_and_a_rerun_says_what_it_reused(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub, lines = RecordingHub(source=target_repo), []
    _run(hub, tmp_path, head_checkpoint, say=lines.append)
    numbered = [line.partition(":")[0] for line in lines]
    assert numbered == ["[1/5] target", "[2/5] draft", "[3/5] compose", "[4/5] verify"]
    lines.clear()
    _run(hub, tmp_path, head_checkpoint, say=lines.append)
    assert lines == [
        f"[1/5] target: 3 file(s) of {TARGET_REPO} already downloaded (sizes and sha256 checked)",
        "[2/5] draft: mtp-draft.gguf already converted (size and sha256 checked)",
        f"[3/5] compose: 3 file(s) {PREFIX}-MTP-* already composed (sizes and sha256 checked)",
        "[4/5] verify: these exact files passed before",
    ]


def test_publishes_with_provenance_when_out_repo_is_given(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = RecordingHub(source=target_repo)
    report = _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP", keep=True)
    names = sorted(p.name for p in report.composite)
    assert hub.commits == [sorted([*names, "README.md"])]
    card = report.published.card
    assert f"[{TARGET_REPO}](https://huggingface.co/{TARGET_REPO}) at `{FIRST_COMMIT}`" in card
    assert f"`{SHARDS[0]}`" in card
    for path in report.composite:
        assert _sha256(path) in card


def test_published_work_files_are_removed_unless_kept(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    report = _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint, out_repo="me/Tiny-MTP")
    assert not (tmp_path / "work" / "composite").exists() and not (tmp_path / "work" / "draft").exists()
    assert any("--keep" in n for n in report.notes)


def test_rerun_after_publish_checks_the_hub_and_reuploads_what_it_lost(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = RecordingHub(source=target_repo)
    _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP", keep=True)
    again = _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP", keep=True)
    assert again.stage("publish").status == "reused" and len(hub.commits) == 1
    del hub.files[f"{PREFIX}-MTP-00002-of-00003.gguf"]
    third = _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP", keep=True)
    assert third.stage("publish").status == "redone" and len(hub.commits) == 2


def test_corrupted_target_in_the_cache_is_downloaded_again(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = RecordingHub(source=target_repo)
    first = _run(hub, tmp_path, head_checkpoint)
    shard = first.target[2]
    flip_byte(shard, shard.stat().st_size - 10)
    second = _run(hub, tmp_path, head_checkpoint)
    assert second.stage("target").status == "redone"
    downloads = [c for c in hub.calls if c[0] == "snapshot_download"]
    assert downloads[-1][2]["force_download"] is True
    assert _sha256(shard) == _sha256(target_repo / SHARDS[2])
    assert [second.stage(s).status for s in ("draft", "compose", "verify")] == ["reused"] * 3


def test_failed_verification_stops_before_publishing(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_verify(composite: object, **kwargs: object) -> VerifyReport:
        report = VerifyReport(str(composite))
        report.checks.append(Check("target bytes", False, "blk.1.attn_q.weight differs"))
        return report

    # the package exports the function `verify`; patch the module it lives in
    monkeypatch.setattr(importlib.import_module("gguf_mtp.check.verify"), "verify", failing_verify)
    hub = RecordingHub(source=target_repo)
    with pytest.raises(VerificationError, match="blk.1.attn_q.weight differs"):
        _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP")
    assert "upload_folder" not in hub.methods
    state = json.loads((tmp_path / "work" / STATE_NAME).read_text())
    assert "verify" not in state["stages"]


def test_no_write_access_to_out_repo_stops_before_downloading(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    from support.hub_standin import http_error

    hub = RecordingHub(source=target_repo, fail={"auth_check": http_error(403)})
    with pytest.raises(HubError, match="no write access to me/Tiny-MTP"):
        _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP")
    assert "snapshot_download" not in hub.methods and "list_repo_files" not in hub.methods


def test_second_pipeline_in_the_same_work_folder_is_refused(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    held = os.open(work, os.O_RDONLY)  # the work folder itself is locked: no lock file
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(UnsafeOutputError, match="another pipeline is running"):
            _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint)
    finally:
        os.close(held)
    assert ".gguf-mtp-pipeline.lock" not in os.listdir(work)  # no lock file to leave behind


def test_hub_refusal_while_listing_is_a_hub_error(online: None, head_checkpoint: Path, tmp_path: Path) -> None:
    from support.hub_standin import http_error

    hub = RecordingHub(fail={"list_repo_files": http_error(404)})
    with pytest.raises(HubError, match=f"{TARGET_REPO} not found"):
        _run(hub, tmp_path, head_checkpoint)


# ------------------------------------------------------------------------------------------- choosing the files (pure)

LISTING = [
    "README.md",
    *SHARDS,
    *[f"UD-Q4_K_XL/{PREFIX}-MTPv2-0000{i}-of-00003.gguf" for i in (1, 2, 3)],
    f"UD-Q4_K_XL/mmproj-{PREFIX}.gguf",
    "Q8_0/Tiny-Nemotron-Q8_0.gguf",
    f"UD-Q2_K_XL/{PREFIX}-00001-of-00002.gguf",
]


def test_split_glob_selects_exactly_that_prefix() -> None:
    assert select_target_files(LISTING, PATTERN) == SHARDS


def test_one_shard_name_selects_its_whole_set() -> None:
    assert select_target_files(LISTING, SHARDS[1]) == SHARDS


def test_single_file_name_selects_that_file() -> None:
    assert select_target_files(LISTING, "Q8_0/Tiny-Nemotron-Q8_0.gguf") == ["Q8_0/Tiny-Nemotron-Q8_0.gguf"]


def test_incomplete_split_set_is_refused() -> None:
    with pytest.raises(ShardSetError, match="missing Tiny-Nemotron-UD-Q4_K_XL-00002-of-00002.gguf"):
        select_target_files(LISTING, f"UD-Q2_K_XL/{PREFIX}-*-of-*.gguf")


def test_loose_glob_matching_two_models_is_refused() -> None:
    with pytest.raises(ShardSetError, match="matches 2 models"):
        select_target_files(LISTING, f"UD-Q4_K_XL/{PREFIX}*.gguf")


def test_pattern_matching_nothing_is_refused() -> None:
    with pytest.raises(ShardSetError, match="matches no file"):
        select_target_files(LISTING, "IQ1_S/Nope-*-of-*.gguf")


def test_two_shard_counts_of_one_prefix_are_refused() -> None:
    listing = [*SHARDS, f"UD-Q4_K_XL/{PREFIX}-00001-of-00001.gguf"]
    with pytest.raises(ShardSetError, match="split sets of 1 and 3 shards"):
        select_target_files(listing, PATTERN)


# ------------------------------------------------------------------------------------------- scripts/hf_job.py

HF_JOB = Path(__file__).resolve().parent.parent / "scripts" / "hf_job.py"
PIPELINE_ARGS = ["--target-repo", TARGET_REPO, "--target-files", PATTERN, "--head-repo", HEAD_REPO]


@pytest.fixture(scope="module")
def hf_job() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_job", HF_JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class JobsStandIn:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def run_uv_job(self, script: str, **kwargs: object) -> object:
        from types import SimpleNamespace

        self.calls.append({"script": script, **kwargs})
        return SimpleNamespace(id="job-123", url="https://huggingface.co/jobs/me/job-123")


def test_hf_job_script_has_a_pep723_block_that_needs_only_huggingface_hub() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    text = HF_JOB.read_text()
    block = re.search(r"^# /// script\n((?:#.*\n)+?)# ///$", text, re.MULTILINE)
    assert block is not None
    metadata = tomllib.loads("".join(line[2:] + "\n" for line in block.group(1).splitlines()))
    assert metadata["dependencies"] == ["huggingface_hub>=0.30"]
    assert "requires-python" in metadata


def test_hf_job_submits_the_pipeline_with_the_token_as_a_secret(
    hf_job: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    api = JobsStandIn()
    rc = hf_job.main(
        [
            "--no-mount-target",  # the mounted target: tests/test_large_sets.py
            "--flavor",
            "cpu-performance",
            "--timeout",
            "3h",
            "--package",
            "gguf-mtp[llama] @ git+x",
            "--",
            *PIPELINE_ARGS,
            "--out-repo",
            "me/Out",
            "--keep",
        ],
        api=api,
    )
    assert rc == 0
    (call,) = api.calls
    assert call["script"] == str(HF_JOB) and call["secrets"] == {"HF_TOKEN": "hf_secret"}
    assert call["flavor"] == "cpu-performance" and call["timeout"] == "3h"
    assert call["dependencies"] == ["gguf-mtp[llama] @ git+x"]
    assert call["script_args"] == ["--local", *PIPELINE_ARGS, "--out-repo", "me/Out", "--keep"]
    assert "hf_secret" not in str(call.get("env"))
    assert "job-123" in capsys.readouterr().out


def test_hf_job_refuses_a_job_that_would_not_publish(
    hf_job: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    api = JobsStandIn()
    assert hf_job.main(PIPELINE_ARGS, api=api) == 2
    assert api.calls == [] and "--out-repo" in capsys.readouterr().err


def test_hf_job_without_a_token_submits_nothing(
    hf_job: object, no_token_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    api = JobsStandIn()
    assert hf_job.main([*PIPELINE_ARGS, "--out-repo", "me/Out"], api=api) == 2
    assert api.calls == [] and "no Hugging Face token" in capsys.readouterr().err


def test_hf_job_dry_run_shows_the_request_without_the_token(
    hf_job: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("GGUF_MTP_PACKAGE", "gguf-mtp[llama] @ git+https://example.com/o/gguf-mtp")
    assert hf_job.main(["--dry-run", "--no-mount-target", *PIPELINE_ARGS, "--out-repo", "me/Out"],
                       api=JobsStandIn()) == 0
    out = capsys.readouterr().out
    assert "run_uv_job(" in out and "'--local'" in out and "hf_secret" not in out


def test_hf_job_local_mode_runs_the_pipeline_here(hf_home: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(HF_JOB),
            "--local",
            "--",
            *PIPELINE_ARGS,
            "--work-dir",
            str(tmp_path / "w"),
            "--json",
            "--no-llama",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert statuses(json.loads(proc.stdout))["compose"] == "ran"


@pytest.fixture
def no_token_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-stored-token"))


# ------------------------------------------------------------------------------ whose work folder it is


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def foreign_folder(tmp_path: Path) -> Path:
    """A user's folder that happens to hold ``draft/`` and ``composite/``."""
    work = tmp_path / "work"
    (work / "draft").mkdir(parents=True)
    (work / "composite").mkdir()
    (work / "draft" / "notes.txt").write_text("a user's notes\n")
    (work / "composite" / "model.gguf").write_bytes(b"a user's model")
    return work


def test_a_foreign_non_empty_work_folder_is_refused_and_left_alone(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    work = foreign_folder(tmp_path)
    before = folder_bytes(work)
    hub = RecordingHub(source=target_repo)
    with pytest.raises(UnsafeOutputError, match="not empty and was not made by gguf-mtp pipeline") as e:
        _run(hub, tmp_path, head_checkpoint)
    assert "\n" not in str(e.value) and "use force" in str(e.value)
    assert folder_bytes(work) == before and sorted(os.listdir(work)) == ["composite", "draft"]
    assert hub.calls == []  # refused before anything was asked


def test_the_cli_refuses_a_foreign_work_folder_with_one_line(tmp_path: Path) -> None:
    work = foreign_folder(tmp_path)
    before = folder_bytes(work)
    proc = pipeline_process(work, tmp_path / "empty-home")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--work-dir: this folder is not empty" in proc.stderr
    assert folder_bytes(work) == before


def test_a_work_dir_that_is_a_file_is_refused(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    (tmp_path / "work").write_bytes(b"a user's file")
    with pytest.raises(UnsafeOutputError, match="work_dir names a file, not a folder"):
        _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint)
    assert (tmp_path / "work").read_bytes() == b"a user's file"


def test_force_takes_a_foreign_folder_and_replaces_only_its_own_sub_folders(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    work = foreign_folder(tmp_path)
    (work / "keep-me.txt").write_text("mine\n")
    report = _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint, force=True)
    assert (work / "keep-me.txt").read_text() == "mine\n"
    assert not (work / "draft" / "notes.txt").exists()  # --force named them: draft/ is the pipeline's now
    assert all(p.parent == work / "composite" for p in report.composite)
    assert json.loads((work / ".gguf-mtp-workdir").read_text()) == {"format": 1, "created_by": "pipeline"}


def test_a_new_work_folder_gets_the_marker_and_a_rerun_needs_no_force(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint)
    marker = tmp_path / "work" / ".gguf-mtp-workdir"
    assert json.loads(marker.read_text()) == {"format": 1, "created_by": "pipeline"}
    _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint)  # resumes, no refusal


def test_a_work_folder_of_an_older_pipeline_without_marker_is_still_ours(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint)
    (tmp_path / "work" / ".gguf-mtp-workdir").unlink()  # as written before markers existed: the state file
    _run(RecordingHub(source=target_repo), tmp_path, head_checkpoint)
    assert (tmp_path / "work" / ".gguf-mtp-workdir").is_file()


def test_hf_job_installs_this_checkouts_origin_and_says_so(
    hf_job: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 21 item 12: never the unregistered PyPI name; --package, GGUF_MTP_PACKAGE, or the checkout's remote."""
    monkeypatch.delenv("GGUF_MTP_PACKAGE", raising=False)
    checkout = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    remote = ["git", "-C", str(checkout), "remote", "add", "origin"]
    subprocess.run([*remote, "https://example.com/o/gguf-mtp.git"], check=True)
    assert hf_job.checkout_package(checkout) == ("gguf-mtp[llama] @ git+https://example.com/o/gguf-mtp.git", ())
    real = hf_job.checkout_package
    monkeypatch.setattr(hf_job, "checkout_package", lambda root=None: real(checkout))
    assert hf_job.main(["--dry-run", "--no-mount-target", *PIPELINE_ARGS, "--out-repo", "me/Out"]) == 0
    out = capsys.readouterr().out
    assert "package: the Job installs 'gguf-mtp[llama] @ git+https://example.com/o/gguf-mtp.git' " \
        "(from this checkout's origin remote)" in out
    assert "dependencies=['gguf-mtp[llama] @ git+https://example.com/o/gguf-mtp.git']" in out

    subprocess.run(["git", "-C", str(checkout), "remote", "set-url", "origin", "git@github.com:o/gguf-mtp.git"],
                   check=True)
    assert real(checkout) == ("gguf-mtp[llama] @ git+ssh://git@github.com/o/gguf-mtp.git", ())
    subprocess.run(["git", "-C", str(checkout), "remote", "set-url", "origin", str(tmp_path)], check=True)
    assert real(checkout) is None  # a local path: a Job cannot reach it
    assert real(tmp_path / "not-a-checkout") is None

    monkeypatch.setenv("GGUF_MTP_PACKAGE", "gguf-mtp[llama] @ git+https://example.com/env")
    assert hf_job.main(["--dry-run", "--no-mount-target", *PIPELINE_ARGS, "--out-repo", "me/Out"]) == 0
    assert "(from GGUF_MTP_PACKAGE)" in capsys.readouterr().out
    assert hf_job.main(["--dry-run", "--no-mount-target", "--package", "x @ git+https://e/x", *PIPELINE_ARGS,
                        "--out-repo", "me/O"]) == 0
    assert "installs 'x @ git+https://e/x' (from --package)" in capsys.readouterr().out


def test_hf_job_without_a_package_source_submits_nothing(
    hf_job: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GGUF_MTP_PACKAGE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setattr(hf_job, "checkout_package", lambda root=None: None)
    api = JobsStandIn()
    for dry in ([], ["--dry-run"]):
        assert hf_job.main([*dry, *PIPELINE_ARGS, "--out-repo", "me/Out"], api=api) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pass --package 'gguf-mtp[llama] @ git+https://" in err
    assert api.calls == []


@pytest.mark.parametrize(
    ("origin", "address", "left_out"),
    [
        ("https://someone:ghp_SECRET@github.com/o/gguf-mtp.git", "https://github.com/o/gguf-mtp.git",
         ("a user name and password",)),
        ("https://ghp_SECRET@github.com/o/gguf-mtp.git", "https://github.com/o/gguf-mtp.git",
         ("a user name (or token)",)),
        ("https://github.com/o/gguf-mtp.git?private_token=SECRET#SECRET", "https://github.com/o/gguf-mtp.git",
         ("a query string", "a fragment")),
        ("ssh://git:SECRET@example.com:2222/o/gguf-mtp.git", "ssh://git@example.com:2222/o/gguf-mtp.git",
         ("a password",)),
        ("ssh://git@example.com/o/gguf-mtp.git", "ssh://git@example.com/o/gguf-mtp.git", ()),
        ("http://[::1]:8080/o/gguf-mtp", "http://[::1]:8080/o/gguf-mtp", ()),
    ],
)
def test_a_remote_address_loses_every_part_that_may_hold_a_credential(
    hf_job: object, origin: str, address: str, left_out: tuple[str, ...]
) -> None:
    assert hf_job.public_address(origin) == (address, left_out)


def test_hf_job_never_sends_nor_prints_the_origin_remotes_credentials(
    hf_job: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 37 item 2: the Job's requirement is visible to whoever sees the Job, and --dry-run prints it."""
    monkeypatch.delenv("GGUF_MTP_PACKAGE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    checkout = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "remote", "add", "origin",
                    "https://someone:ghp_SECRET@github.com/o/gguf-mtp.git?token=QSECRET"], check=True)
    real = hf_job.checkout_package
    monkeypatch.setattr(hf_job, "checkout_package", lambda root=None: real(checkout))
    api = JobsStandIn()
    args = ["--no-mount-target", *PIPELINE_ARGS, "--out-repo", "me/Out"]
    assert hf_job.main(["--dry-run", *args], api=api) == 0
    assert hf_job.main(args, api=api) == 0
    printed = capsys.readouterr()
    for secret in ("someone", "SECRET"):
        assert secret not in printed.out and secret not in printed.err and secret not in repr(api.calls)
    (call,) = api.calls
    assert call["dependencies"] == ["gguf-mtp[llama] @ git+https://github.com/o/gguf-mtp.git"]
    note = ("note: this checkout's origin remote has a user name and password and a query string in its address: "
            "left out of the Job's requirement (a private repo needs --package)\n")
    assert printed.out.count(note) == 1 and printed.err == note


def test_install_hints_work_from_a_clone(hf_job: object) -> None:
    from gguf_mtp.check.llama_check import INSTALL_HINT

    assert "pip install '.[llama]'" in INSTALL_HINT and "make install" in INSTALL_HINT
    assert "'gguf-mtp[llama]'" not in INSTALL_HINT and "'gguf-mtp[llama]'" not in HF_JOB.read_text()


# ------------------------------------------------------------------------------------------- state file (item 11)

BAD_STATE_EDITS = {
    "a stage without outputs": (lambda s: s["draft"].pop("outputs"), "stages.draft has no outputs list"),
    "verify without detail": (lambda s: s["verify"].pop("detail"), "stages.verify has no detail object"),
    "a draft with two outputs": (lambda s: s["draft"]["outputs"].append({**s["draft"]["outputs"][0], "path": "x"}),
                                 "stages.draft records 2 outputs; a draft stage has exactly 1"),
    "a file listed twice": (lambda s: s["compose"]["outputs"].append(s["compose"]["outputs"][0]),
                            "stages.compose.outputs lists a file twice"),
    "verify with outputs": (lambda s: s["verify"].update(outputs=s["draft"]["outputs"]),
                            "stages.verify records 1 outputs; a verify stage has exactly 0"),
    "a block that is text": (lambda s: s["compose"]["detail"].update(block="88"),
                             "stages.compose.detail.block is not a count"),
    "a head that is a number": (lambda s: s["draft"]["detail"].update(head=5),
                                "stages.draft.detail.head is not a string"),
    "a summary that is a list": (lambda s: s["verify"]["detail"].update(summary=[]),
                                 "stages.verify.detail.summary is not a string"),
    "checks that are numbers": (lambda s: s["verify"]["detail"].update(checks=[1]),
                                "stages.verify.detail.checks is not a list of strings"),
    "no finish time": (lambda s: s["target"].pop("finished"), "stages.target.finished is not a time"),
    "fewer files than outputs": (lambda s: s["target"]["detail"]["files"].pop(),
                                 "stages.target.detail.files names 2 files for 3 outputs"),
}


def _refused(work: Path, hf_home: Path, expect: str) -> None:
    state = work / STATE_NAME
    before = state.read_bytes()
    proc = pipeline_process(work, hf_home, "--no-llama")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"gguf-mtp: error: {state}: not a pipeline state file gguf-mtp wrote")
    assert expect in proc.stderr, proc.stderr
    assert state.read_bytes() == before  # never rewritten


@pytest.mark.parametrize("what", sorted(BAD_STATE_EDITS))
def test_a_state_file_of_the_wrong_shape_is_one_line(what: str, work_copy: Path, hf_home: Path) -> None:
    """Issue 21 item 11: each shape that was an IndexError / ValueError / KeyError traceback."""
    edit, expect = BAD_STATE_EDITS[what]
    state = work_copy / STATE_NAME
    doc = json.loads(state.read_text())
    edit(doc["stages"])
    state.write_text(json.dumps(doc))
    _refused(work_copy, hf_home, expect)


def test_a_state_file_with_outputs_listed_twice_is_one_line(work_copy: Path, hf_home: Path) -> None:
    """``"outputs"`` twice in one record: JSON would silently keep the last one."""
    state = work_copy / STATE_NAME
    doc = json.loads(state.read_text())
    record = json.dumps(doc["stages"]["compose"])
    doc["stages"]["compose"] = "@@"
    twice = '{"outputs": [], ' + record[1:]
    state.write_text(json.dumps(doc).replace('"@@"', twice))
    _refused(work_copy, hf_home, "key 'outputs' appears twice in one object")


def test_the_state_file_a_run_writes_passes_the_schema(first_run: tuple[Path, dict]) -> None:
    from gguf_mtp.release.pipeline.state import STAGES, load_stages

    work, _ = first_run
    stages = load_stages(work / STATE_NAME, 1)
    assert set(stages) == {"target", "draft", "compose", "verify"} and set(stages) <= set(STAGES)


# ------------------------------------------------------------------------------------------- --dry-run (item 14)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.slow
def test_dry_run_lists_the_download_and_writes_nothing(hf_home: Path, target_repo: Path, tmp_path: Path) -> None:
    work = tmp_path / "new" / "work"
    cache_before = _tree(hf_home)
    proc = pipeline_process(work, hf_home, "--dry-run", "--json", "--out-repo", "me/Out")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert not (tmp_path / "new").exists()  # not even the work folder
    assert _tree(hf_home) == cache_before
    sizes = {s: (target_repo / s).stat().st_size for s in SHARDS}
    assert report["dry_run"] is True
    assert report["planned"]["download"] == [{"path": s, "size": sizes[s], "cached": True} for s in SHARDS]
    composite = [f"{PREFIX}-MTP-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert report["planned"]["write"] == [str(work / "draft" / "mtp-draft.gguf"),
                                          *(str(work / "composite" / c) for c in composite)]
    assert report["planned"]["upload"] == [*composite, "README.md"]
    growth = 3 * SHARD_HEADER_GROWTH  # the head is on the Hub: its draft is not counted by a dry run
    assert report["disk_needed"] == sum(sizes.values()) + growth  # nothing to download, a composite
    assert statuses(report) == {n: "planned" for n in ("target", "draft", "compose", "verify", "publish")}

    text = pipeline_process(work, hf_home, "--dry-run")
    assert text.returncode == 0, text.stderr
    assert f"download 0 of 3 file(s) of {TARGET_REPO}" in text.stdout and "disk needed: at least" in text.stdout
    assert text.stdout.rstrip().endswith("dry run: nothing was downloaded, written or uploaded")
    assert not (tmp_path / "new").exists()


def test_dry_run_asks_the_hub_for_sizes_and_only_reads(online: None, target_repo: Path, tmp_path: Path) -> None:
    hub = RecordingHub(source=target_repo)
    for shard in SHARDS:
        hub.files[shard] = {"size": 10**9 + len(shard), "sha256": "ab" * 32, "blob_id": None}
    report = cast(PipelineReport, _run(hub, tmp_path, HEAD_REPO, out_repo="me/Out", dry_run=True))
    assert set(hub.methods) == {"list_repo_files", "get_paths_info"}  # no whoami, no create_repo, no download
    assert [d["size"] for d in report.planned["download"]] == [10**9 + len(s) for s in SHARDS]
    # downloaded, then composed (each shard's header grown)
    assert report.disk_needed == 2 * sum(10**9 + len(s) for s in SHARDS) + 3 * SHARD_HEADER_GROWTH
    assert report.stage("target").summary.startswith(f"download 3 of 3 file(s) of {TARGET_REPO} (")
    assert not (tmp_path / "work").exists() and not (tmp_path / "cache").exists()


def test_dry_run_names_the_composite_as_compose_does_for_a_whole_file_name_basename(
    online: None, target_repo: Path, tmp_path: Path
) -> None:
    report = cast(PipelineReport, _run(RecordingHub(source=target_repo), tmp_path, HEAD_REPO, out_repo="me/Out",
                                       dry_run=True, basename="Out-MTP.gguf"))
    # compose takes a whole file name as its prefix (never Out-MTP.gguf-00001-of-00003.gguf)
    assert report.planned["upload"] == [f"Out-MTP-0000{i}-of-00003.gguf" for i in (1, 2, 3)] + ["README.md"]


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_readme_gguf_mtp_did_not_write_in_out_repo_is_refused_before_downloading(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path, dry_run: bool
) -> None:
    hub = RecordingHub(source=target_repo)
    theirs = b"# Tiny MTP\n\nMy own words.\n"
    hub.put("README.md", theirs)
    with pytest.raises(HubError, match="me/Tiny-MTP: README.md exists and was not written by gguf-mtp") as caught:
        _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP", dry_run=dry_run)
    assert caught.value.parameters == ("replace_readme",)
    assert "snapshot_download" not in hub.methods and hub.files["README.md"]["data"] == theirs
    report = _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP", dry_run=dry_run, replace_readme=True)
    if dry_run:  # said, read, nothing written
        assert any("not written by gguf-mtp; it is replaced, as asked" in note for note in report.notes)
        assert not {"upload_folder", "delete_file", "create_repo"} & set(hub.methods)
        assert hub.files["README.md"]["data"] == theirs and not (tmp_path / "work").exists()
    else:  # checked before the target's file list was even asked for
        assert hub.methods.index("hf_hub_download") < hub.methods.index("list_repo_files")
        assert hub.files["README.md"]["data"] == report.published.card.encode()


def test_dry_run_refuses_what_a_run_refuses(hf_home: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("a user's file")
    proc = pipeline_process(foreign, hf_home, "--dry-run")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--force" in proc.stderr, proc.stderr
    assert sorted(os.listdir(foreign)) == ["mine.txt"]


def test_dry_run_of_a_finished_work_folder_changes_nothing(work_copy: Path, hf_home: Path) -> None:
    before = _tree(work_copy)
    proc = pipeline_process(work_copy, hf_home, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "the state file records finished stages (compose, draft, target, verify)" in proc.stdout
    assert _tree(work_copy) == before


@pytest.mark.slow
def test_a_failed_start_leaves_no_work_folder(hf_home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "pipeline", "--target-repo", TARGET_REPO, "--target-files",
         "UD-Q4_K_XL/Nothing-*-of-*.gguf", "--head-repo", HEAD_REPO, "--work-dir", str(work)],
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
            "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 2 and "matches no file" in proc.stderr, proc.stderr
    assert not work.exists()  # no marker, no empty lock file
    work.mkdir()  # a folder the user made stays
    again = subprocess.run(proc.args, capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
                               "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"})
    assert again.returncode == 2 and work.is_dir()


def test_the_offline_refusal_names_the_flag(hf_home: Path, tmp_path: Path) -> None:
    proc = pipeline_process(tmp_path / "work", hf_home, "--out-repo", "me/Out")
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].endswith("(unset it, or use --dry-run)"), proc.stderr
    assert "dry_run" not in proc.stderr
    assert not (tmp_path / "work").exists()


#: run_pipeline / publish parameters no user sets from the command line: objects and callbacks of the API.
_NOT_FLAGS = {"api", "say", "progress", "digests", "token", "provenance", "llama", "outdir", "repo"}
#: Tuning knobs of the library no error message names (the command line has --upload-mode instead).
_UNNAMED = {"one_commit_max_bytes", "one_commit_max_files"}


def test_every_library_parameter_an_error_can_name_has_a_flag() -> None:
    """Errors name library parameters; the CLI shows each as its flag, so each needs one (issue 21 item 14)."""
    import inspect as pyinspect

    from gguf_mtp.cli import build_parser
    from gguf_mtp.release.publish import publish

    subcommands = next(a for a in build_parser()._actions if a.dest == "command").choices
    dests = {name: {a.dest for a in sub._actions if a.option_strings} for name, sub in subcommands.items()}
    for command, function in (("pipeline", run_pipeline), ("publish", publish)):
        missing = set(pyinspect.signature(function).parameters) - _NOT_FLAGS - _UNNAMED - dests[command]
        assert not missing, f"{command}: parameters without a flag: {sorted(missing)}"
    # Every parameter the Hub and work-folder code names in an error is a flag of some command.
    every_flag = set().union(*dests.values())
    sources = [*(Path(__file__).resolve().parent.parent / "gguf_mtp" / "hub").glob("*.py"),
               *(Path(__file__).resolve().parent.parent / "gguf_mtp" / "release").rglob("*.py"),
               Path(__file__).resolve().parent.parent / "gguf_mtp" / "files" / "workdir.py"]
    named = set()
    for source in sources:
        text = source.read_text()
        for group in re.findall(r"parameter=(\([^)]*\)|\"\w+\")", text):
            named |= set(re.findall(r"\"(\w+)\"", group))
        named |= set(re.findall(r"check_repo_id\([^,()]+, \"(\w+)\"\)", text))
    assert named >= {"dry_run", "work_dir", "target_repo"}  # the scan finds what it looks for
    assert named <= every_flag, sorted(named - every_flag)
    messages = [line for source in sources for line in source.read_text().splitlines() if "Error(" in line]
    assert not [line for line in messages if any(knob in line for knob in _UNNAMED)]
