"""Large sets on Hugging Face's machines (issue 32): a Job that mounts the target repo instead of downloading it,
a pipeline that reads a read-only target folder, the disk check before the first byte, and what an upload sent.

Everything here runs against stand-ins (no Hub, no Job, no Xet storage on the test machines): the recorded
``run_uv_job`` request, a read-only bind mount (or, where this process may not mount, a folder whose every
entry's bytes and timestamps are compared before and after), and a free-space figure injected through
:func:`gguf_mtp.release.pipeline.disk.free_space`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub
import huggingface_hub.constants
import pytest
from support.helpers import flip_byte
from support.hub_standin import JobsHub, NoVolumesJobsHub
from support.small_disk import PAGE, free_bytes, small_disk

from gguf_mtp import ShardSetError, UnsafeOutputError
from gguf_mtp.files.plan import CopyRange
from gguf_mtp.jobs.compose_plan import plan_composition
from gguf_mtp.jobs.convert import draft_size_bound
from gguf_mtp.model.shards import open_model
from gguf_mtp.release.pipeline import disk as pipeline_disk
from gguf_mtp.release.pipeline import run_pipeline
from gguf_mtp.release.publish import bytes_beyond_target
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import write_target

TARGET_REPO = "unsloth/Tiny-Nemotron-GGUF"
PREFIX = "Tiny-Nemotron-UD-Q4_K_XL"
PATTERN = f"UD-Q4_K_XL/{PREFIX}-*-of-*.gguf"
SHARDS = [f"UD-Q4_K_XL/{PREFIX}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
COMMIT = "c0ffee" + "0" * 34
HF_JOB = Path(__file__).resolve().parent.parent / "scripts" / "hf_job.py"
JOB_ARGS = ["--package", "gguf-mtp[llama] @ git+https://example.com/o/gguf-mtp", "--",
            "--target-repo", TARGET_REPO, "--target-files", PATTERN, "--head-repo", "nvidia/Tiny-Nemotron-MTPv2",
            "--out-repo", "me/Out"]
HAS_VOLUMES = hasattr(huggingface_hub, "Volume")


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def target_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out like the target's Hub repo, an earlier composite beside the shards as on real repos."""
    root = tmp_path_factory.mktemp("target-repo")
    write_target(root / "UD-Q4_K_XL", shards=3, name=PREFIX)
    write_target(root / "UD-Q4_K_XL", shards=3, name=f"{PREFIX}-MTPv2", seed=7)
    (root / "README.md").write_text("target card\n")
    return root


@pytest.fixture(scope="module")
def target_bytes(target_repo: Path) -> int:
    return sum((target_repo / s).stat().st_size for s in SHARDS)


@pytest.fixture(scope="module")
def head_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mtpv2_checkpoint(tmp_path_factory.mktemp("head") / "Tiny-Nemotron-MTPv2")


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def hf_job() -> Any:
    spec = importlib.util.spec_from_file_location("hf_job_large", HF_JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _state(folder: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry of ``folder``: size, mtime and ctime (ns) and, for files, sha256. A write of any kind, by
    anyone (root included), changes one of them."""
    entries = {}
    for path in sorted([folder, *folder.rglob("*")]):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        entries[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, digest)
    return entries


@pytest.fixture
def read_only_target(target_repo: Path, tmp_path: Path) -> Iterator[Path]:
    """The target repo as a Job sees its mounted volume: a read-only bind mount where this process may mount
    (root in a container), else the folder itself (its state is compared before and after either way)."""
    mount = tmp_path / "target-repo"
    mount.mkdir()
    try:
        subprocess.run(["mount", "--bind", str(target_repo), str(mount)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        mount.rmdir()
        yield target_repo
        return
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True, capture_output=True)
        with pytest.raises(OSError):  # the mount really refuses writes, root's included
            (mount / "probe").write_bytes(b"x")
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _run(hub: JobsHub, tmp_path: Path, head: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        target_repo=TARGET_REPO, target_files=PATTERN, head_repo=str(head), work_dir=tmp_path / "work",
        cache_dir=tmp_path / "cache", api=hub, llama=False, progress=False, say=lambda line: None,
    )
    return run_pipeline(**(options | kwargs))


# ------------------------------------------------------------------------------------------- item 1: the Job


@pytest.mark.skipif(not HAS_VOLUMES, reason="huggingface_hub < 1.8 has no Job volumes: "
                    "test_a_job_request_on_a_hub_without_volumes_* cover that line")
def test_the_job_mounts_the_target_repo_at_the_resolved_commit(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = JobsHub(source=target_repo, commit=COMMIT)
    assert hf_job.main(JOB_ARGS, api=hub) == 0
    assert hub.calls[0][:2] == ("model_info", (TARGET_REPO,)) and hub.calls[0][2]["revision"] is None
    (_, (script,), request) = next(c for c in hub.calls if c[0] == "run_uv_job")
    assert script == str(HF_JOB)
    (volume,) = request["volumes"]
    assert volume == huggingface_hub.Volume(type="model", source=TARGET_REPO, mount_path="/target-repo",
                                            revision=COMMIT, read_only=True)
    assert volume.to_dict() == {"type": "model", "source": TARGET_REPO, "mountPath": "/target-repo",
                                "revision": COMMIT, "readOnly": True}
    assert request["script_args"][-4:] == ["--target-dir", "/target-repo", "--target-revision", COMMIT]
    assert request["secrets"] == {"HF_TOKEN": "hf_secret"}
    assert not [c for c in hub.calls if c[0] in ("snapshot_download", "hf_hub_download")]


@pytest.mark.skipif(not HAS_VOLUMES, reason="huggingface_hub < 1.8 has no Job volumes")
def test_the_dry_run_prints_the_request_with_its_volume_and_both_disk_figures(
    hf_job: Any, target_repo: Path, target_bytes: int, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = JobsHub(source=target_repo, commit=COMMIT)
    assert hf_job.main(["--dry-run", *JOB_ARGS[:-2], "--target-revision", "main", *JOB_ARGS[-2:]], api=hub) == 0
    out = capsys.readouterr().out
    assert f"volumes=[Volume(type='model', source='{TARGET_REPO}', mount_path='/target-repo', revision='{COMMIT}'" \
        in out
    assert f"'--target-dir', '/target-repo', '--target-revision', '{COMMIT}']" in out
    assert "read from the mounted repo, not downloaded" in out
    assert f"({target_bytes:,} bytes: the composite; the target's 3 file(s) are read from the mount)" in out
    assert f"({2 * target_bytes:,} bytes: the target downloaded + the composite)" in out
    assert [c[0] for c in hub.calls if c[0] == "run_uv_job"] == []
    assert next(c for c in hub.calls if c[0] == "model_info")[2]["revision"] == "main"


def test_a_job_request_on_a_hub_without_volumes_is_one_line_naming_the_release(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = NoVolumesJobsHub(source=target_repo)
    for dry in ([], ["--dry-run"]):
        assert hf_job.main(["--mount-target", *dry, *JOB_ARGS], api=hub) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "huggingface_hub 1.8.0" in err and "--no-mount-target" in err
    assert "run_uv_job" not in hub.methods


def test_a_job_request_on_a_hub_without_volumes_downloads_by_default_and_says_so(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = NoVolumesJobsHub(source=target_repo)
    assert hf_job.main(JOB_ARGS, api=hub) == 0
    (_, _, request) = next(c for c in hub.calls if c[0] == "run_uv_job")
    assert "volumes" not in request and "--target-dir" not in request["script_args"]
    assert "has no Job volumes (added in 1.8.0): the Job downloads the target" in capsys.readouterr().err


def test_no_mount_target_downloads_in_the_job(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = JobsHub(source=target_repo)
    assert hf_job.main(["--no-mount-target", *JOB_ARGS], api=hub) == 0
    assert hub.methods == ["run_uv_job"]  # nothing resolved, nothing mounted
    assert "volumes" not in hub.calls[0][2]


# ------------------------------------------------------------------ issue 37: the pipeline's options, read its way


def _pipeline_reads(script_args: list[str]) -> Any:
    """What the Job's ``gguf-mtp pipeline`` reads from the arguments hf_job.py gives it."""
    from gguf_mtp.cli.pipeline import read_pipeline_arguments

    assert script_args[0] == "--local"
    return read_pipeline_arguments(script_args[1:])


@pytest.mark.skipif(not HAS_VOLUMES, reason="huggingface_hub < 1.8 has no Job volumes")
@pytest.mark.parametrize("revision", [["--target-revi", "v1.0"], ["--target-revi=v1.0"], ["--target-revision=v1.0"]])
def test_the_job_mounts_the_target_revision_however_the_pipeline_accepts_it_spelled(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch, revision: list[str]
) -> None:
    """Issue 37 item 5: an abbreviation the pipeline accepts pins the mount to that revision's commit, not main's."""
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = JobsHub(source=target_repo, commit=COMMIT)
    assert hf_job.main([*JOB_ARGS, *revision], api=hub) == 0
    assert next(c for c in hub.calls if c[0] == "model_info")[2]["revision"] == "v1.0"
    (_, _, request) = next(c for c in hub.calls if c[0] == "run_uv_job")
    job_reads = _pipeline_reads(request["script_args"])
    assert (job_reads.target_revision, job_reads.target_dir) == (COMMIT, "/target-repo")


@pytest.mark.skipif(not HAS_VOLUMES, reason="huggingface_hub < 1.8 has no Job volumes")
def test_a_target_dir_however_spelled_is_not_mounted_over(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = JobsHub(source=target_repo, commit=COMMIT)
    assert hf_job.main([*JOB_ARGS, "--target-d=/data/mine"], api=hub) == 0
    (_, _, request) = next(c for c in hub.calls if c[0] == "run_uv_job")
    assert "volumes" not in request and _pipeline_reads(request["script_args"]).target_dir == "/data/mine"


def test_an_abbreviated_out_repo_is_a_job_that_publishes(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = JobsHub(source=target_repo, commit=COMMIT)
    assert hf_job.main(["--no-mount-target", *JOB_ARGS[:-2], "--out-rep", "me/Out"], api=hub) == 0
    (_, _, request) = next(c for c in hub.calls if c[0] == "run_uv_job")
    assert _pipeline_reads(request["script_args"]).out_repo == "me/Out"


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_a_job_without_target_files_is_refused_with_the_pipelines_one_line(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    dry: list[str],
) -> None:
    """Issue 37 item 13: what the pipeline would refuse when the Job starts is refused before anything is asked."""
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = JobsHub(source=target_repo, commit=COMMIT)
    files = JOB_ARGS.index("--target-files")
    assert hf_job.main([*dry, *JOB_ARGS[:files], *JOB_ARGS[files + 2 :]], api=hub) == 2
    assert capsys.readouterr().err == \
        "hf_job.py: error: gguf-mtp pipeline: the following arguments are required: --target-files\n"
    assert hub.calls == []


@pytest.mark.skipif(not HAS_VOLUMES, reason="huggingface_hub < 1.8 has no Job volumes")
def test_the_dry_run_plans_abbreviated_target_files(
    hf_job: Any, target_repo: Path, target_bytes: int, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = JobsHub(source=target_repo, commit=COMMIT)
    files = JOB_ARGS.index("--target-files")
    args = [*JOB_ARGS[:files], f"--target-fi={PATTERN}", *JOB_ARGS[files + 2 :]]
    assert hf_job.main(["--dry-run", *args], api=hub) == 0
    assert f"({target_bytes:,} bytes: the composite; the target's 3 file(s) are read from the mount)" \
        in capsys.readouterr().out


def test_without_gguf_py_an_abbreviation_of_an_option_it_reads_is_refused(
    hf_job: Any, target_repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`uv run` installs only huggingface_hub: the pipeline's parser (its --outtype needs gguf-py's tables) cannot
    be built, so the options this script reads are read by their full names and an abbreviation is refused."""
    monkeypatch.setitem(sys.modules, "gguf_mtp.constants", None)  # what a missing gguf-py makes of it
    hub = JobsHub(source=target_repo, commit=COMMIT)
    assert hf_job.main(["--dry-run", *JOB_ARGS, "--target-revi", "v1.0"], api=hub) == 2
    assert capsys.readouterr().err == "hf_job.py: error: --target-revi: write the option in full " \
        "(--target-revision): without gguf-py here, this script cannot read an abbreviation as the pipeline would\n"
    assert hf_job.main(["--dry-run", "--no-mount-target", *JOB_ARGS, "--target-revision=v1.0"], api=hub) == 0
    out = capsys.readouterr().out
    assert "note: the pipeline's options are read here by their full names only and not checked" in out
    assert hub.calls == []


# ------------------------------------------------------------------------------ item 1: a read-only target folder


def test_a_pipeline_over_a_read_only_target_folder_composes_verifies_and_publishes_without_writing_there(
    online: None, read_only_target: Path, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    before = _state(read_only_target)
    hub = JobsHub(source=target_repo)
    report = _run(hub, tmp_path, head_checkpoint, target_dir=read_only_target, target_revision=COMMIT,
                  out_repo="me/Tiny-MTP", keep=True)
    assert [(s.name, s.status) for s in report.stages] == [
        ("target", "ran"), ("draft", "ran"), ("compose", "ran"), ("verify", "ran"), ("publish", "ran")]
    assert "read from the mounted repo" in report.stage("target").summary
    assert "not downloaded" in report.stage("target").summary
    assert [p.parent for p in report.target] == [read_only_target / "UD-Q4_K_XL"] * 3
    assert _state(read_only_target) == before  # not one byte, name or timestamp changed
    assert not [m for m in hub.methods if m in ("snapshot_download", "hf_hub_download")]
    assert not (tmp_path / "cache").exists()
    assert f"at `{COMMIT}`" in report.published.card
    # the same composite as from a downloaded copy of the same files
    downloaded = _run(JobsHub(source=target_repo), tmp_path / "dl", head_checkpoint, keep=True)
    assert [hashlib.sha256(p.read_bytes()).digest() for p in report.composite] == \
        [hashlib.sha256(p.read_bytes()).digest() for p in downloaded.composite]


def test_the_dry_run_of_a_target_folder_plans_no_download(
    online: None, target_repo: Path, target_bytes: int, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = JobsHub(source=target_repo)
    report = _run(hub, tmp_path, head_checkpoint, target_dir=target_repo, dry_run=True)
    target = report.stage("target").summary
    assert target.startswith("read 3 file(s) (") and "from the mounted repo" in target and "not downloaded" in target
    assert report.planned["download"] == [] and [r["path"] for r in report.planned["read"]] == SHARDS
    need = _folder_need(target_repo, head_checkpoint, tmp_path / "work")
    assert need.download == 0 and report.disk_needed == need.total  # the composite and the draft, no cache
    assert hub.methods == []  # the folder is listed, not the Hub
    assert not (tmp_path / "work").exists()


@pytest.fixture
def folder_copy(target_repo: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "mounted"
    shutil.copytree(target_repo, copy)
    return copy


def test_a_target_folder_missing_a_shard_is_one_line(
    online: None, folder_copy: Path, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    (folder_copy / SHARDS[1]).unlink()
    hub = JobsHub(source=target_repo)
    with pytest.raises(ShardSetError) as e:
        _run(hub, tmp_path, head_checkpoint, target_dir=folder_copy)
    assert "\n" not in str(e.value) and e.value.path == str(folder_copy)
    assert f"missing {SHARDS[1].rpartition('/')[2]}" in e.value.message and TARGET_REPO in e.value.message
    assert not (tmp_path / "work").exists()


def test_a_target_folder_without_the_patterns_folder_is_one_line(
    online: None, tmp_path: Path, target_repo: Path, head_checkpoint: Path
) -> None:
    empty = tmp_path / "not-the-repo"
    empty.mkdir()
    with pytest.raises(ShardSetError, match="has no folder 'UD-Q4_K_XL': not the target repo's layout"):
        _run(JobsHub(source=target_repo), tmp_path, head_checkpoint, target_dir=empty)


def test_a_target_folder_of_another_revision_is_one_line(
    online: None, folder_copy: Path, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = JobsHub(source=target_repo)
    with open(folder_copy / SHARDS[2], "ab") as f:  # another revision: the last shard grew
        f.write(b"\0" * 32)
    with pytest.raises(ShardSetError) as e:
        _run(hub, tmp_path, head_checkpoint, target_dir=folder_copy, target_revision=COMMIT)
    assert "\n" not in str(e.value) and f"on {TARGET_REPO}@{COMMIT}: the folder holds another revision" in str(e.value)


def test_a_target_folder_of_another_revision_of_the_same_size_is_one_line(
    online: None, folder_copy: Path, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = JobsHub(source=target_repo)
    shard = folder_copy / SHARDS[2]
    flip_byte(shard, shard.stat().st_size - 10)  # same size, other bytes: only the sha256 tells
    with pytest.raises(ShardSetError) as e:
        _run(hub, tmp_path, head_checkpoint, target_dir=folder_copy, target_revision=COMMIT)
    assert "\n" not in str(e.value) and "has sha256" in str(e.value) and "another revision" in str(e.value)
    assert not (tmp_path / "work" / "composite").exists()


def test_the_cli_refuses_a_folder_that_is_not_the_repos_layout_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {"HF_HUB_OFFLINE": "1",
                                                                              "HF_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "pipeline", "--target-repo", TARGET_REPO, "--target-files", PATTERN,
         "--head-repo", str(tmp_path), "--target-dir", str(tmp_path), "--work-dir", str(tmp_path / "w")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"gguf-mtp: error: {tmp_path}: has no folder 'UD-Q4_K_XL': not the target repo's")


# ------------------------------------------------------------------------------------------- item 4: the disk


def _free(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> list[Path]:
    asked: list[Path] = []

    def free_space(folder: Path) -> int:
        asked.append(folder)
        return nbytes

    monkeypatch.setattr(pipeline_disk, "free_space", free_space)
    return asked


def test_a_download_and_composite_that_do_not_fit_are_refused_before_the_first_byte(
    online: None, target_repo: Path, target_bytes: int, head_checkpoint: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # the download into the Hub cache + the composite and the draft, on the same filesystem here
    need = target_bytes + _folder_need(target_repo, head_checkpoint, tmp_path / "work").total
    _free(monkeypatch, need - 1)
    hub = JobsHub(source=target_repo)
    with pytest.raises(UnsafeOutputError) as e:
        _run(hub, tmp_path, head_checkpoint)
    message = str(e.value)
    assert "\n" not in message and f"({need:,} bytes:" in message and f"free ({need - 1:,} bytes)" in message
    assert "into the Hub cache" in message
    assert "snapshot_download" not in hub.methods and not (tmp_path / "cache").exists()
    assert not (tmp_path / "work").exists()  # the run made nothing it leaves behind


def _folder_need(target_repo: Path, head: Path, work: Path) -> pipeline_disk.DiskNeed:
    """What a run from the target folder into ``work`` needs, as the pipeline counts it."""
    sizes = [(target_repo / s).stat().st_size for s in SHARDS]
    draft = pipeline_disk.HeadNeed(draft_size_bound(head))
    return pipeline_disk.disk_need(sizes, local=[target_repo / SHARDS[0]], download=0, cache=None, work=work,
                                   head=draft)


def test_a_target_folder_needs_the_composite_and_the_draft(
    online: None, target_repo: Path, target_bytes: int, head_checkpoint: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    if pipeline_disk.can_share(target_repo / SHARDS[0], tmp_path):
        pytest.skip("a reflink filesystem: the composite shares the target's bytes (tested below)")
    need = _folder_need(target_repo, head_checkpoint, tmp_path / "work").total
    _free(monkeypatch, need - 1)
    refusal = rf"\({need:,} bytes: .*composite .*draft .*free \({need - 1:,}"
    with pytest.raises(UnsafeOutputError, match=refusal):
        _run(JobsHub(source=target_repo), tmp_path, head_checkpoint, target_dir=target_repo)
    _free(monkeypatch, need)  # exactly enough: the run goes through
    report = _run(JobsHub(source=target_repo), tmp_path, head_checkpoint, target_dir=target_repo)
    assert report.stage("compose").status == "ran"


def test_the_disk_figures_are_never_below_what_the_run_writes(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    need = _folder_need(target_repo, head_checkpoint, tmp_path / "work")
    report = _run(JobsHub(source=target_repo), tmp_path, head_checkpoint, target_dir=target_repo)
    assert report.draft is not None and report.draft.stat().st_size <= need.draft
    assert sum(p.stat().st_size for p in report.composite) <= need.composite


def test_free_space_between_the_target_and_the_composite_is_refused_before_the_first_byte(
    online: None, target_repo: Path, target_bytes: int, head_checkpoint: Path, tmp_path: Path
) -> None:
    """Enough for the target's size (the old figure), not for the composite and the draft: refused at the start,
    on a real filesystem of that size, with the figures in the one line."""
    with small_disk(tmp_path / "disk", target_bytes + 8 * PAGE) as disk:
        need = _folder_need(target_repo, head_checkpoint, disk / "work")
        free = free_bytes(disk)
        assert target_bytes < free < need.total  # between the old estimate and the new one
        with pytest.raises(UnsafeOutputError) as refused:
            _run(JobsHub(source=target_repo), tmp_path, head_checkpoint, target_dir=target_repo, work_dir=disk / "work")
        left = os.listdir(disk)
    message = str(refused.value)
    assert "\n" not in message and f"({need.total:,} bytes:" in message and "a draft of at most" in message
    assert left == []  # no draft, no state file, no work folder


def test_reflink_sharing_is_counted_as_free(tmp_path: Path, target_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_disk, "can_share", lambda source, folder: True)
    need = pipeline_disk.disk_need([1000, 2000], local=[target_repo / SHARDS[0]], download=0, cache=None,
                                   work=tmp_path / "w", head=pipeline_disk.HeadNeed(draft=500))
    growth = 2 * pipeline_disk.SHARD_HEADER_GROWTH  # the headers and the NextN block are new bytes, shared or not
    assert (need.composite, need.shared, need.total) == (3000 + 500 + growth, 3000, 500 + growth + 500)
    _free(monkeypatch, need.total)
    pipeline_disk.check_disk(need)  # the target's data takes no new blocks


def test_the_cache_and_the_work_folder_on_two_filesystems_are_checked_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need = pipeline_disk.DiskNeed(download=500, composite=700, shared=0, cache=Path("/dev/shm"), work=tmp_path)
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem here")
    _free(monkeypatch, 700)
    pipeline_disk.check_disk(need)  # 500 fits the cache's, 700 the work folder's
    _free(monkeypatch, 600)
    with pytest.raises(UnsafeOutputError, match=r"\(700 bytes: .*free \(600 bytes\)"):
        pipeline_disk.check_disk(need)


# ------------------------------------------------------------------------------------------- item 3: the upload


def test_pipeline_publish_compares_with_the_target_at_its_commit_and_says_why_each_shard_is_uploaded(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    hub = JobsHub(source=target_repo, commit=COMMIT)
    published = _run(hub, tmp_path, head_checkpoint, out_repo="me/Tiny-MTP").published
    assert published.copy_source == (TARGET_REPO, COMMIT) and hub.copies == []
    # compose rewrites every shard's header: no shard of a composite is one of the target's files
    assert [t.how for t in published.transfers] == ["uploaded"] * len(published.files)
    for t in published.transfers:
        assert t.why.startswith("a new file: its header changed (")
        assert t.why.endswith(f"; not in {TARGET_REPO}@{COMMIT}")
    assert "holds the NextN block" in published.transfers[-1].why


def test_publish_reports_the_upload_and_the_bytes_that_differ_from_the_target(
    online: None, target_repo: Path, head_checkpoint: Path, tmp_path: Path
) -> None:
    report = _run(JobsHub(source=target_repo), tmp_path, head_checkpoint, out_repo="me/Tiny-MTP", keep=True)
    published = report.published
    card = len(published.card.encode())
    total = sum(p.stat().st_size for p in report.composite)
    # the bytes compose did not copy from the target: its plan says exactly which
    target, draft = open_model(report.target[0]), open_model(report.draft)
    plan = plan_composition(target, draft, tmp_path / "replan")
    target_paths = {str(p) for p in target.paths}
    copied = sum(s.nbytes for o in plan.outputs for s in o.segments
                 if isinstance(s, CopyRange) and str(s.source) in target_paths)
    assert bytes_beyond_target(open_model(report.composite[0])) == plan.bytes_to_write - copied
    upload = published.to_dict()["upload"]
    assert upload == {
        "total_bytes": total + card, "copied_bytes": 0, "unchanged_bytes": 0, "new_bytes": None,
        "new_bytes_measured": False,
        "why_not_measured": f"huggingface_hub {huggingface_hub.__version__} does not return Xet's deduplication "
                            "metrics for an upload",
        "expected_new_bytes": plan.bytes_to_write - copied + card,
    }
    assert 0 < upload["expected_new_bytes"] < total  # the trunk is never sent again
    lines = published.describe()
    assert f"new bytes: not measured (huggingface_hub {huggingface_hub.__version__} does not return Xet's " \
        "deduplication metrics for an upload)" in lines
    assert any(line.startswith("expected upload: ") and f"({plan.bytes_to_write - copied + card:,} bytes)" in line
               for line in lines)
    assert "of it differing from the target set: the expected upload" in report.stage("publish").summary
