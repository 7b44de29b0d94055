"""Faults during a compose run: a full disk, a kill, Ctrl-C, unsafe places to write.

Whatever happens, no output with a final name is left behind, the inputs never change (every test
hashes them before and after), and the next run just works. Runs are real ``python -m gguf_mtp``
processes; where a test must catch a run mid-copy, the process is paused *inside* a copy (half of a
byte range written) by a thin wrapper around the writer's copy function, so the signal always lands
mid-copy, whatever the machine's speed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from support.malformed import SMALL, TRUNK

from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.cli import main
from gguf_mtp.errors import OutputWriteError
from gguf_mtp.jobs.compose import compose
from gguf_mtp.testing.tiny_models import write_draft, write_target

pytestmark = pytest.mark.slow  # child processes killed, interrupted and starved at every step: seconds each

COPY_METHODS = ("copy_file_range", "sendfile", "readwrite")

#: ``python -c PAUSING_CLI compose ...``: the real CLI, stopped at one point of its writing. With
#: ``PAUSE_IN=copy`` the copy call number ``$PAUSE_AT_CALL`` writes half its bytes, then waits; with
#: ``PAUSE_IN=replace`` step number ``$PAUSE_AT_CALL`` of the rename phase waits before it happens: the
#: renames (``commit.rename_noreplace``: 1 is the journal, then the old files moved aside with ``--force``,
#: then the new files, shard 3 first), then the journal's removal (``commit.remove_journal``, the commit
#: point); with ``PAUSE_IN=committed`` the run waits right after the commit point. Waiting, it has
#: created ``$PAUSE_MARKER``; it goes on once ``$PAUSE_MARKER.resume`` exists (or it gets a signal).
PAUSING_CLI = r"""
import os, sys, time
import gguf_mtp.files.commit as commit
import gguf_mtp.write as output

marker = os.environ["PAUSE_MARKER"]
where, at = os.environ["PAUSE_IN"], int(os.environ["PAUSE_AT_CALL"])
calls = 0

def pause():
    open(marker, "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(marker + ".resume") and time.monotonic() < deadline:
        time.sleep(0.01)

real_copy, real_replace, real_remove_journal = output._copy, commit.rename_noreplace, commit.remove_journal

def copy_with_pause(src_fd, dst_fd, offset, nbytes, bar, method):
    global calls
    calls += 1
    if calls != at:
        return real_copy(src_fd, dst_fd, offset, nbytes, bar, method)
    half = nbytes // 2
    used = real_copy(src_fd, dst_fd, offset, half, bar, method)
    pause()
    real_copy(src_fd, dst_fd, offset + half, nbytes - half, bar, method)
    return used

def replace_with_pause(src, dst):
    global calls
    calls += 1
    if calls == at:
        pause()
    return real_replace(src, dst)

def remove_journal_with_pause(folder):
    global calls
    calls += 1
    if where == "replace" and calls == at:
        pause()
    real_remove_journal(folder)
    if where == "committed":
        pause()

if where == "copy":
    output._copy = copy_with_pause
else:
    commit.rename_noreplace = replace_with_pause
    commit.remove_journal = remove_journal_with_pause
from gguf_mtp.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass(frozen=True)
class Model:
    """A 3-shard target, a draft, and the composite a clean run makes of them."""

    target: Path
    draft: Path
    reference: Path  # folder holding the clean composite

    @property
    def inputs(self) -> list[Path]:
        return [*sorted(self.target.parent.iterdir()), self.draft]

    @property
    def output_names(self) -> list[str]:
        return sorted(p.name for p in self.reference.iterdir())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    folder = tmp_path_factory.mktemp("faults")
    target = write_target(folder / "target", hparams=SMALL, pattern=TRUNK, shards=3, name="Tiny-Q4")
    draft = write_draft(folder / "draft" / "mtp.gguf", hparams=SMALL, trunk_pattern=TRUNK, with_globals=True)
    compose(target, draft, folder / "reference", progress=False)
    return Model(target, draft, folder / "reference")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hashes(paths: list[Path]) -> dict[str, str]:
    return {str(p): sha256(p) for p in paths}


@pytest.fixture(autouse=True)
def inputs_unchanged(model: Model) -> Iterator[None]:
    """Every fault test: the target shards and the draft are byte for byte what they were."""
    before = hashes(model.inputs)
    yield
    assert hashes(model.inputs) == before


def compose_argv(model: Model, out: Path, *extra: str) -> list[str]:
    return ["compose", str(model.target), str(model.draft), "-o", str(out), *extra]


def cli_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "GGUF_MTP_DISABLE_PROGRESS": "1", **extra}


def run_gguf_mtp(
    argv: list[str], *, env: dict[str, str] | None = None, preexec_fn: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gguf_mtp", *argv],
        capture_output=True, text=True, env=env or cli_env(), preexec_fn=preexec_fn, timeout=120,
    )


def entries(folder: Path) -> list[str]:
    """Everything in ``folder``, hidden temporary files included."""
    return sorted(os.listdir(folder)) if folder.exists() else []


def assert_same_as_reference(out: Path, model: Model) -> None:
    assert entries(out) == model.output_names
    for name in model.output_names:
        assert sha256(out / name) == sha256(model.reference / name), name


def assert_one_error_line(result: subprocess.CompletedProcess[str], *phrases: str) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------ a full disk


def file_size_limit(nbytes: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


@pytest.mark.parametrize("method", COPY_METHODS)
def test_file_size_limit_mid_write_exits_2_and_leaves_no_file(model: Model, tmp_path: Path, method: str) -> None:
    out = tmp_path / "out"
    # Shards 1 and 2 fit under 1 MB; shard 3 (with the NextN block) does not: write() fails with EFBIG.
    result = run_gguf_mtp(
        compose_argv(model, out), env=cli_env(GGUF_MTP_COPY_METHOD=method), preexec_fn=file_size_limit(1_000_000)
    )

    assert result.returncode == 2
    assert_one_error_line(result, "Tiny-Q4-00003-of-00003.gguf", "File too large", "no output was left behind")
    assert entries(out) == []


class DiskBudget:
    """Fake a disk that fills up: writes into ``*.partial`` files fail with ENOSPC past ``budget`` bytes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
        self.left = budget
        for name in ("write", "copy_file_range", "sendfile"):
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name), name))

    def _spend(self, fd: int, nbytes: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".partial"):
            if nbytes > self.left:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.left -= nbytes

    def _wrap(self, real: Callable[..., int], name: str) -> Callable[..., int]:
        def write(*args: object) -> int:
            if name == "write":
                fd, size = args[0], len(args[1])  # type: ignore[arg-type]
            elif name == "copy_file_range":
                fd, size = args[1], args[2]
            else:  # sendfile(out_fd, in_fd, offset, count)
                fd, size = args[0], args[3]
            self._spend(fd, size)  # type: ignore[arg-type]
            return real(*args)

        return write


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell output files apart")
@pytest.mark.parametrize("method", COPY_METHODS)
def test_disk_full_mid_write_exits_2_and_leaves_no_file(
    model: Model, tmp_path: Path, method: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv("GGUF_MTP_COPY_METHOD", method)
    DiskBudget(monkeypatch, budget=1_000_000)

    status = main(compose_argv(model, out))

    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert "No space left on device (disk full or file too large); no output was left behind" in err
    assert entries(out) == []


def test_disk_full_through_the_api_raises_output_write_error(
    model: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    DiskBudget(monkeypatch, budget=300_000)  # fails in shard 2

    with pytest.raises(OutputWriteError, match="Tiny-Q4-00002-of-00003.gguf: writing failed: No space left"):
        compose(model.target, model.draft, tmp_path / "out", progress=False)
    assert entries(tmp_path / "out") == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell output files apart")
def test_an_io_error_when_one_output_is_synced_names_it_and_leaves_no_file(
    model: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outputs are fsynced together (one thread each): the one whose write-back fails is the one named."""
    real_fsync, synced = os.fsync, []

    def failing_fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(name)
        if "00002-of-00003" in name and name.endswith(".partial"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)

    with pytest.raises(OutputWriteError, match="Tiny-Q4-00002-of-00003.gguf: writing failed: Input/output error"):
        compose(model.target, model.draft, tmp_path / "out", progress=False)
    assert sum(name.endswith(".partial") for name in synced) == 3  # every output was synced, none renamed
    assert entries(tmp_path / "out") == []


@cache
def mount_namespaces_work() -> bool:
    """Whether this user may mount a tmpfs in a private user + mount namespace (``unshare -Urm``)."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as probe:
        script = 'mount -t tmpfs -o size=64k tmpfs "$1"'
        result = subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", probe], capture_output=True, timeout=30)
    return result.returncode == 0


needs_mounts = pytest.mark.skipif(
    sys.platform != "linux" or not mount_namespaces_work(),
    reason="needs a private tmpfs (unshare -Urm); the file-size-limit and ENOSPC tests cover every machine",
)


def run_on_tmpfs(
    options: str, mountpoint: Path, argv: list[str], listing: Path
) -> subprocess.CompletedProcess[str]:
    """Run gguf-mtp with a fresh tmpfs (mount ``options``) on ``mountpoint``, in a private namespace; what
    the tmpfs holds afterwards is written to ``listing`` (the tmpfs vanishes with the namespace)."""
    script = (
        'mount -t tmpfs -o "$1" tmpfs "$2" || exit 99; listing="$3"; shift 3; '
        '"$@"; status=$?; ls -AR "$MOUNTPOINT" > "$listing"; exit $status'
    )
    command = [sys.executable, "-m", "gguf_mtp", *argv]
    return subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script, "sh", options, str(mountpoint), str(listing), *command],
        capture_output=True, text=True, env=cli_env(MOUNTPOINT=str(mountpoint)), timeout=120,
    )


def files_on(listing: Path) -> list[str]:
    return [line for line in listing.read_text().splitlines() if line and not line.endswith(":")]


@needs_mounts
def test_full_filesystem_mid_write_exits_2_and_leaves_no_file(model: Model, tmp_path: Path) -> None:
    plan = json.loads(run_gguf_mtp([*compose_argv(model, tmp_path / "plan"), "--dry-run", "--json"]).stdout)
    sizes = [f["bytes"] for f in plan["files"]]
    pages = -(-sum(sizes) // 4096)
    # Room for every byte, but not for the partly used last page of each file: the free-space check
    # passes and the disk fills up while the last shard is written.
    assert sum(-(-s // 4096) for s in sizes) > pages
    mount = tmp_path / "disk"
    mount.mkdir()

    result = run_on_tmpfs(f"size={pages * 4096}", mount, compose_argv(model, mount / "out"), tmp_path / "listing")

    assert result.returncode == 2, result.stderr
    assert_one_error_line(result, "No space left on device", "no output was left behind")
    assert files_on(tmp_path / "listing") == []  # not even the output folder the run made


@needs_mounts
def test_too_small_filesystem_is_refused_before_writing(model: Model, tmp_path: Path) -> None:
    mount = tmp_path / "disk"
    mount.mkdir()

    result = run_on_tmpfs("size=1m", mount, compose_argv(model, mount / "out"), tmp_path / "listing")

    assert result.returncode == 2, result.stderr
    assert_one_error_line(result, "not enough free space")
    assert files_on(tmp_path / "listing") == []


# ---------------------------------------------------------------------------- killed, interrupted


def start_paused_run(
    model: Model, out: Path, tmp_path: Path, *, pause_in: str = "copy", at_call: int = 3, extra: tuple[str, ...] = (),
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[str]:
    """A compose run stopped in copy call ``at_call`` (3: shard 3's target data, so shards 1 and 2 are
    complete temporary files and shard 3 a half-written one), or before step ``at_call`` of the rename
    phase (``pause_in="replace"``), or right after its commit point (``pause_in="committed"``)."""
    marker = tmp_path / "paused"
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSING_CLI, *compose_argv(model, out, *extra)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn,
        env=cli_env(PAUSE_MARKER=str(marker), PAUSE_IN=pause_in, PAUSE_AT_CALL=str(at_call)),
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before the pause: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the run never reached the pause")
        time.sleep(0.02)
    return process


def resume(tmp_path: Path) -> None:
    (tmp_path / "paused.resume").touch()


def partial_files(out: Path) -> list[str]:
    return [name for name in entries(out) if name.endswith(".partial")]


def test_paused_run_is_mid_copy_with_only_temporary_files(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = start_paused_run(model, out, tmp_path)
    try:
        names = entries(out)
        assert len(names) == 3 and names == partial_files(out)
        shard3 = next(out / n for n in names if "00003-of-00003" in n)
        assert 0 < shard3.stat().st_size < (model.reference / "Tiny-Q4-00003-of-00003.gguf").stat().st_size
    finally:
        process.kill()
        process.communicate()


def test_sigkill_mid_copy_leaves_no_final_name_and_the_next_run_succeeds(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = start_paused_run(model, out, tmp_path)

    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)

    assert process.returncode == -signal.SIGKILL
    assert entries(out) == partial_files(out) != []  # only temporary names: nothing looks finished

    rerun = run_gguf_mtp(compose_argv(model, out))  # no --force needed

    assert rerun.returncode == 0, rerun.stderr
    assert_same_as_reference(out, model)  # the killed run's temporary files are gone too
    # ... and the run that removed them says so (issue 21 item 4: 1.2 GB+ of partials for a real model)
    assert "removed 3 temporary file(s) (" in rerun.stderr
    assert f"left by a killed gguf-mtp run (pid {process.pid})" in rerun.stderr


@pytest.mark.llama
def test_composite_finished_after_a_killed_run_is_loaded_by_llama_cpp(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = start_paused_run(model, out, tmp_path)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)

    assert run_gguf_mtp(compose_argv(model, out)).returncode == 0
    check = check_with_llama(out / model.target.name)

    assert check.ok, check.summary()
    assert (check.n_layer, check.n_layer_nextn, check.mtp_decode_ok) == (3, 1, True)


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_interrupt_mid_copy_exits_130_with_a_short_message_and_leaves_nothing(
    model: Model, tmp_path: Path, signum: int
) -> None:
    out = tmp_path / "made-by-the-run" / "out"
    process = start_paused_run(model, out, tmp_path)

    process.send_signal(signum)  # SIGHUP: the terminal closed, the SSH session dropped
    _, stderr = process.communicate(timeout=30)

    assert process.returncode == 130
    assert stderr == "gguf-mtp: interrupted; no output was left behind\n"
    assert entries(out) == []
    assert not (tmp_path / "made-by-the-run").exists()  # the folders the run made are gone too (issue 21 item 18)


def test_interrupt_between_renames_leaves_no_final_name(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # rename 1 is the journal, 2 shard 3, 3 shard 2: paused before shard 2
    process = start_paused_run(model, out, tmp_path, pause_in="replace", at_call=3)
    assert "Tiny-Q4-00003-of-00003.gguf" in entries(out)  # shard 3 already has its final name
    assert ".gguf-mtp-journal" in entries(out)

    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)

    assert process.returncode == 130
    assert stderr == "gguf-mtp: interrupted; no output was left behind\n"
    assert entries(out) == []  # an incomplete set is taken back, renamed files and journal included


def old_composite(model: Model, out: Path) -> dict[str, bytes]:
    """A folder holding an older composite of the same names (each shard's bytes told apart)."""
    out.mkdir()
    old = {name: f"an old composite's {name}".encode() for name in model.output_names}
    for name, data in old.items():
        (out / name).write_bytes(data)
    return old


def folder_bytes(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in entries(out)}


def test_interrupted_forced_rewrite_puts_the_whole_old_composite_back(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    old = old_composite(model, out)
    # renames: 1 journal, 2-4 the old shards moved aside, 5 new shard 3, 6 new shard 2: paused before 6
    process = start_paused_run(model, out, tmp_path, pause_in="replace", at_call=6, extra=("--force",))
    assert sha256(out / "Tiny-Q4-00003-of-00003.gguf") == sha256(model.reference / "Tiny-Q4-00003-of-00003.gguf")

    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)

    assert process.returncode == 130
    assert folder_bytes(out) == old  # the complete old set, byte for byte, and nothing else


def test_sigkill_between_renames_then_a_rerun_without_force_succeeds(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = start_paused_run(model, out, tmp_path, pause_in="replace", at_call=3)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert "Tiny-Q4-00003-of-00003.gguf" in entries(out) and ".gguf-mtp-journal" in entries(out)

    rerun = run_gguf_mtp(compose_argv(model, out))  # the killed run's half set is rolled back first

    assert rerun.returncode == 0, rerun.stderr
    assert "was killed while renaming its outputs into place; its incomplete set was removed" in rerun.stderr
    assert_same_as_reference(out, model)


def test_sigkill_in_a_forced_rewrite_then_the_next_run_restores_the_old_set(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    old = old_composite(model, out)
    process = start_paused_run(model, out, tmp_path, pause_in="replace", at_call=6, extra=("--force",))
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL

    rerun = run_gguf_mtp(compose_argv(model, out))  # no --force: the old files are the user's again

    assert rerun.returncode == 2
    assert "the previous files were restored" in rerun.stderr
    assert "output exists (use --force to replace it)" in rerun.stderr
    assert folder_bytes(out) == old

    forced = run_gguf_mtp(compose_argv(model, out, "--force"))

    assert forced.returncode == 0, forced.stderr
    assert_same_as_reference(out, model)  # no backup, journal or temporary file left


def test_a_second_concurrent_compose_into_the_folder_is_refused(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = start_paused_run(model, out, tmp_path, pause_in="replace", at_call=3)
    try:
        second = run_gguf_mtp(compose_argv(model, out, "--force"))
        assert second.returncode == 2
        assert_one_error_line(second, "another gguf-mtp run is writing into this folder", str(out))
    finally:
        resume(tmp_path)
        first.communicate(timeout=60)
    assert first.returncode == 0, first.stderr
    assert_same_as_reference(out, model)  # the first run's set, whole; nothing of the second


RENAMES_WITH_FORCE = 1 + 3 + 3  # the journal, three old shards moved aside, three new shards


def fail_rename_number(monkeypatch: pytest.MonkeyPatch, failing: int) -> Callable[[], int]:
    """Make the ``failing``-th no-replace rename of the commit phase fail with EIO; returns the call count."""
    import gguf_mtp.files.commit as commit_module

    real = commit_module.rename_noreplace
    calls = 0

    def flaky(source: Path, destination: Path) -> None:
        nonlocal calls
        calls += 1
        if calls == failing:
            raise OSError(errno.EIO, "Input/output error", str(destination))
        real(source, destination)

    monkeypatch.setattr(commit_module, "rename_noreplace", flaky)
    return lambda: calls


@pytest.mark.parametrize("failing", range(1, RENAMES_WITH_FORCE + 1))
def test_failure_at_any_rename_keeps_the_old_set_byte_identical(
    model: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    out = tmp_path / "out"
    old = old_composite(model, out)
    calls = fail_rename_number(monkeypatch, failing)
    with pytest.raises(OutputWriteError, match="Input/output error; no output was left behind") as failure:
        compose(model.target, model.draft, out, force=True, progress=False)

    assert calls() >= failing
    assert "the previous files are back in place" in str(failure.value)
    assert folder_bytes(out) == old  # no journal, backup or temporary file either


@pytest.mark.parametrize("failing", range(1, 1 + 3 + 1))
def test_failure_at_any_rename_into_an_empty_folder_leaves_it_empty(
    model: Model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fail_rename_number(monkeypatch, failing)
    with pytest.raises(OutputWriteError, match="no output was left behind"):
        compose(model.target, model.draft, out, progress=False)

    assert entries(out) == []


def test_input_that_shrinks_during_the_copy_fails_cleanly(tmp_path: Path, model: Model) -> None:
    private = Model(
        target=shutil.copytree(model.target.parent, tmp_path / "target") / model.target.name,
        draft=Path(shutil.copy(model.draft, tmp_path / "mtp.gguf")),
        reference=model.reference,
    )
    out = tmp_path / "out"
    shard3 = private.target.with_name("Tiny-Q4-00003-of-00003.gguf")
    process = start_paused_run(private, out, tmp_path)

    os.truncate(shard3, shard3.stat().st_size // 2)  # another program truncates the input mid-copy
    resume(tmp_path)
    _, stderr = process.communicate(timeout=30)

    assert process.returncode == 2
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert "ended early" in stderr and str(shard3) in stderr and "no output was left behind" in stderr
    assert entries(out) == []


def test_failed_forced_rewrite_keeps_the_previous_composite(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(model.reference, out)

    result = run_gguf_mtp(compose_argv(model, out, "--force"), preexec_fn=file_size_limit(1_000_000))

    assert result.returncode == 2
    assert_same_as_reference(out, model)  # replaced only by a rename once everything is written


def test_temporary_file_of_a_live_run_is_left_alone(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    live = out / f".Tiny-Q4-00001-of-00003.gguf.{os.getpid()}.partial"  # this test's process: alive
    live.write_bytes(b"another run is writing this")

    result = run_gguf_mtp(compose_argv(model, out))

    assert result.returncode == 0, result.stderr
    assert live.read_bytes() == b"another run is writing this"


# ------------------------------------------------------------------------------ unsafe destinations


def test_read_only_output_folder_is_refused_before_writing(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "read-only"
    out.mkdir()
    if os.geteuid() != 0:
        out.chmod(0o555)
        try:
            result = run_gguf_mtp(compose_argv(model, out))
        finally:
            out.chmod(0o755)
        left = entries(out)
    elif mount_namespaces_work():  # root ignores permission bits: use a read-only filesystem instead
        result = run_on_tmpfs("ro", out, compose_argv(model, out), tmp_path / "listing")
        left = files_on(tmp_path / "listing")
    else:
        pytest.skip("as root without mount namespaces there is no read-only folder to write into")

    assert result.returncode == 2
    assert_one_error_line(result, str(out), "output folder is not writable")
    assert left == []


def other_filesystem_folder(than: Path) -> Path | None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == than.stat().st_dev:
        return None
    return Path(tempfile.mkdtemp(prefix="gguf-mtp-test-", dir=shm))


def test_output_folder_on_another_filesystem_gets_identical_bytes(model: Model, tmp_path: Path) -> None:
    folder = other_filesystem_folder(tmp_path)
    if folder is None:
        pytest.skip("no writable /dev/shm on another filesystem than the temporary folder")
    try:
        out = folder / "out"
        # copy_file_range refuses to cross filesystems on most kernels: compose must fall back, not fail.
        result = run_gguf_mtp([*compose_argv(model, out), "--json"])

        assert result.returncode == 0, result.stderr
        assert set(json.loads(result.stdout)["copy_methods"]) <= {"copy_file_range", "sendfile", "readwrite"}
        assert_same_as_reference(out, model)
    finally:
        shutil.rmtree(folder)


def test_output_folder_linked_to_the_targets_folder_is_refused(model: Model, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(model.target.parent, target_is_directory=True)

    result = run_gguf_mtp(compose_argv(model, link, "--force"))

    assert result.returncode == 2
    assert_one_error_line(result, "output would overwrite the input", "Tiny-Q4-00001-of-00003.gguf")
    assert partial_files(model.target.parent) == []


def test_output_hard_linked_to_a_target_shard_is_refused_even_with_force(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    shard2 = model.target.with_name("Tiny-Q4-00002-of-00003.gguf")
    os.link(shard2, out / shard2.name)

    result = run_gguf_mtp(compose_argv(model, out, "--force"))

    assert result.returncode == 2
    assert_one_error_line(result, "output would overwrite the input", shard2.name)
    assert entries(out) == [shard2.name]
    assert os.path.samefile(out / shard2.name, shard2)


def test_output_symlinked_to_the_draft_is_refused_even_with_force(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "Tiny-Q4-00003-of-00003.gguf").symlink_to(model.draft)

    result = run_gguf_mtp(compose_argv(model, out, "--force"))

    assert result.returncode == 2
    assert_one_error_line(result, "output would overwrite the input", str(model.draft))
    assert entries(out) == ["Tiny-Q4-00003-of-00003.gguf"]


# ------------------------------------------------------------------------------------- copy methods


@pytest.mark.parametrize("method", COPY_METHODS)
def test_each_copy_method_writes_the_same_bytes(
    model: Model, tmp_path: Path, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GGUF_MTP_COPY_METHOD", method)

    report = compose(model.target, model.draft, tmp_path / "out", progress=False)

    assert report.copy_methods == (method,)
    assert_same_as_reference(tmp_path / "out", model)


# ------------------------------------------------------------------------------ the rename phase, more


def test_a_file_that_appears_at_a_final_name_mid_rename_is_never_replaced(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = start_paused_run(model, out, tmp_path, pause_in="replace", at_call=3)  # before shard 2
    intruder = out / "Tiny-Q4-00002-of-00003.gguf"
    intruder.write_bytes(b"another program's file")  # not a gguf-mtp run: the folder lock cannot stop it
    resume(tmp_path)
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 2
    assert stderr.count("\n") == 1 and "File exists; no output was left behind" in stderr
    assert folder_bytes(out) == {"Tiny-Q4-00002-of-00003.gguf": b"another program's file"}


def test_old_files_a_killed_run_had_already_replaced_are_removed_by_the_next_run(
    model: Model, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(model.reference, out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = out / f".Tiny-Q4-00001-of-00003.gguf.{int(dead.stdout)}.replaced"  # past the commit point
    leftover.write_bytes(b"the previous shard 1")
    journal = out / f".gguf-mtp-journal.{int(dead.stdout)}.partial"  # killed before its rename phase
    journal.write_bytes(b"{")
    live = out / f".Tiny-Q4-00002-of-00003.gguf.{os.getpid()}.replaced"  # a live pid: not touched
    live.write_bytes(b"a live run's")

    result = run_gguf_mtp(compose_argv(model, out, "--force"))

    assert result.returncode == 0, result.stderr
    assert not leftover.exists() and not journal.exists() and live.read_bytes() == b"a live run's"
    live.unlink()
    assert_same_as_reference(out, model)


def test_an_unusable_journal_is_one_line_and_nothing_is_touched(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(model.reference, out)
    (out / ".gguf-mtp-journal").write_bytes(b"{not json")
    before = folder_bytes(out)

    result = run_gguf_mtp(compose_argv(model, out, "--force"))

    assert result.returncode == 2
    assert_one_error_line(result, "an interrupted run's journal cannot be used", ".gguf-mtp-journal")
    assert folder_bytes(out) == before


# ------------------------------------------- issue 21: the commit protocol never touches what it did not create


def test_interrupt_into_a_folder_that_existed_keeps_the_folder(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    process = start_paused_run(model, out, tmp_path)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)

    assert process.returncode == 130
    assert out.is_dir() and entries(out) == []


def test_a_run_under_nohup_survives_sighup(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    def as_nohup_starts_it() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    process = start_paused_run(model, out, tmp_path, preexec_fn=as_nohup_starts_it)
    process.send_signal(signal.SIGHUP)  # ignored, as nohup asks
    resume(tmp_path)
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 0, stderr
    assert_same_as_reference(out, model)


@pytest.mark.parametrize("planted_at", ["journal", "partial"])
def test_a_link_planted_at_a_temporary_name_fails_the_run_and_its_target_is_untouched(
    model: Model, tmp_path: Path, planted_at: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"a root-owned file outside the folder")
    name = {"journal": ".gguf-mtp-journal", "partial": ".Tiny-Q4-00001-of-00003.gguf"}[planted_at]
    link = out / f"{name}.{os.getpid()}.partial"  # this process writes the set: its pid is in the names
    link.symlink_to(victim)

    status = main(compose_argv(model, out))

    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(link) in err and "something already has its name" in err
    assert victim.read_bytes() == b"a root-owned file outside the folder"
    assert entries(out) == [link.name]  # no final name, no temporary file, the link itself left alone


STEPS_WITHOUT_FORCE = 1 + 3 + 1  # the journal, three new shards, the journal's removal (the commit point)


def kill_at_step(model: Model, out: Path, tmp_path: Path, step: int, *extra: str) -> subprocess.Popen[str]:
    pause_in, at_call = ("committed", 0) if step == 0 else ("replace", step)
    process = start_paused_run(model, out, tmp_path, pause_in=pause_in, at_call=at_call, extra=extra)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    return process


@pytest.mark.parametrize("step", range(1, STEPS_WITHOUT_FORCE + 1))
def test_sigkill_at_every_step_of_the_rename_phase_then_the_next_run_finishes_it(
    model: Model, tmp_path: Path, step: int
) -> None:
    from gguf_mtp.check.inspect import inspect
    from gguf_mtp.check.verify import verify

    out = tmp_path / "out"
    killed = kill_at_step(model, out, tmp_path, step)
    entry_point = out / model.target.name

    if step == STEPS_WITHOUT_FORCE:  # after the last rename, before the commit point: the whole set is there
        assert [n for n in entries(out) if not n.startswith(".")] == model.output_names
        before = verify(entry_point, llama=False, progress=False)
        assert not before.ok and [c.name for c in before.failures] == ["committed"]
        assert "uncommitted set" in before.failures[0].detail and ".gguf-mtp-journal" in before.failures[0].detail
        summary = inspect(entry_point)
        assert summary.uncommitted == str(out / ".gguf-mtp-journal")
        assert summary.to_dict()["uncommitted"] == summary.uncommitted
        assert any(line.startswith("warning: uncommitted set") for line in summary.describe())

        rerun = run_gguf_mtp(compose_argv(model, out))  # rolls the set forward, then finds it complete

        assert rerun.returncode == 2
        assert f"a gguf-mtp run (pid {killed.pid}) was killed after renaming its whole set" in rerun.stderr
        assert "the set is complete and was kept" in rerun.stderr and "output exists" in rerun.stderr
        assert_same_as_reference(out, model)  # byte for byte, and no journal left
        assert verify(entry_point, llama=False, progress=False).ok
        assert inspect(entry_point).uncommitted is None
        return

    rerun = run_gguf_mtp(compose_argv(model, out))

    assert rerun.returncode == 0, rerun.stderr
    if step == 1:  # killed before its journal existed: only temporary files (3 shards + the journal's)
        assert "removed 4 temporary file(s) (" in rerun.stderr and f"(pid {killed.pid})" in rerun.stderr
    else:
        assert "was killed while renaming its outputs into place; its incomplete set was removed" in rerun.stderr
    assert_same_as_reference(out, model)


STEPS_WITH_FORCE = 1 + 3 + 3 + 1  # the journal, three old shards moved aside, three new shards, the commit point


@pytest.mark.parametrize("step", [*range(1, STEPS_WITH_FORCE + 1), 0], ids=[
    *(f"before-step-{n}" for n in range(1, STEPS_WITH_FORCE + 1)), "after-the-commit-point"])
def test_sigkill_at_every_step_of_a_forced_rewrite_keeps_one_whole_set(model: Model, tmp_path: Path, step: int) -> None:
    out = tmp_path / "out"
    old = old_composite(model, out)
    killed = kill_at_step(model, out, tmp_path, step, "--force")

    rerun = run_gguf_mtp(compose_argv(model, out))  # no --force: whatever set is there is the user's again

    assert rerun.returncode == 2
    assert "output exists (use --force to replace it)" in rerun.stderr
    if step == 0:  # committed: the new set stays; the old files it had moved aside are removed now
        assert "removed 3 temporary file(s) (" in rerun.stderr and f"(pid {killed.pid})" in rerun.stderr
        assert_same_as_reference(out, model)
        return
    if step == 1:
        assert "removed 4 temporary file(s) (" in rerun.stderr
    else:
        assert f"a gguf-mtp run (pid {killed.pid}) was killed while" in rerun.stderr
    assert folder_bytes(out) == old  # the complete old set, byte for byte, and nothing else


def test_a_users_file_copied_to_a_final_name_after_a_kill_survives_the_next_run(model: Model, tmp_path: Path) -> None:
    out = tmp_path / "out"
    kill_at_step(model, out, tmp_path, 3)  # the journal and shard 3 renamed in, then SIGKILL
    shard3 = out / "Tiny-Q4-00003-of-00003.gguf"
    assert shard3.exists()
    users = tmp_path / "users-own.gguf"
    users.write_bytes(b"the user's own shard 3")
    shutil.copyfile(users, shard3)  # cp onto the existing name: the same inode, rewritten

    rerun = run_gguf_mtp(compose_argv(model, out))

    assert rerun.returncode == 2  # their file is an existing output: replacing it needs --force
    assert "its incomplete set was removed; left alone Tiny-Q4-00003-of-00003.gguf" in rerun.stderr
    assert "output exists" in rerun.stderr
    assert folder_bytes(out) == {shard3.name: b"the user's own shard 3"}
