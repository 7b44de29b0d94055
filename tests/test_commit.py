"""The rename phase (gguf_mtp.files.commit) and the set id (gguf_mtp.set_id): lock, no-replace renames,
journal and roll-back, and a set mixed from two compose runs that verify refuses."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from support.malformed import SMALL, TRUNK

import gguf_mtp.files.commit as commit_module
from gguf_mtp.check.verify import verify
from gguf_mtp.errors import UnsafeOutputError
from gguf_mtp.files.commit import (
    JOURNAL_NAME,
    FileIdentity,
    Replacement,
    backup_name,
    commit,
    folder_lock,
    recover,
    rename_noreplace,
)
from gguf_mtp.files.journal import encode_journal
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.strip import strip
from gguf_mtp.model.set_id import SET_ID_KEY
from gguf_mtp.testing.tiny_models import write_draft, write_target


def listing(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


# ------------------------------------------------------------------------------------ no-replace rename


def test_rename_noreplace_moves_a_file(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"new")
    rename_noreplace(tmp_path / "a", tmp_path / "b")
    assert listing(tmp_path) == {"b": b"new"}


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "link+unlink"])
def test_rename_noreplace_never_replaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renameat2: bool) -> None:
    if not renameat2:
        monkeypatch.setattr(commit_module, "_renameat2", None)
    (tmp_path / "a").write_bytes(b"new")
    (tmp_path / "b").write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        rename_noreplace(tmp_path / "a", tmp_path / "b")
    assert listing(tmp_path) == {"a": b"new", "b": b"someone else's"}


def test_link_fallback_moves_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit_module, "_renameat2", None)
    (tmp_path / "a").write_bytes(b"new")
    rename_noreplace(tmp_path / "a", tmp_path / "b")
    assert listing(tmp_path) == {"b": b"new"}


# ------------------------------------------------------------------------------------------- the lock


def test_a_second_lock_on_the_folder_is_refused_with_one_line(tmp_path: Path) -> None:
    refused = pytest.raises(UnsafeOutputError, match="another gguf-mtp run is writing into this folder")
    with folder_lock(tmp_path):
        with refused as e, folder_lock(tmp_path):
            pass
        assert str(tmp_path) in str(e.value) and "\n" not in str(e.value)
    with folder_lock(tmp_path):  # released with the first
        pass


# ------------------------------------------------------------------------------- commit and roll back


def prepared(tmp_path: Path, *, old: bool) -> list[Replacement]:
    """Two new files (temporary names) for ``one`` and ``two``; with ``old``, older files at those names."""
    entries = []
    for name in ("two", "one"):
        partial = f".{name}.1.partial"
        (tmp_path / partial).write_bytes(f"new {name}".encode())
        new = FileIdentity.of(tmp_path / partial)
        assert new is not None
        if old:
            (tmp_path / name).write_bytes(f"old {name}".encode())
        previous = FileIdentity.of(tmp_path / name) if old else None
        entries.append(Replacement(partial, name, new, backup_name(name) if old else None, previous))
    return entries


def test_commit_replaces_the_old_set_and_leaves_nothing_else(tmp_path: Path) -> None:
    commit(tmp_path, prepared(tmp_path, old=True))
    assert listing(tmp_path) == {"one": b"new one", "two": b"new two"}


@pytest.mark.parametrize("failing", range(1, 6))  # journal, 2 moved aside, 2 renamed in
def test_a_failing_rename_restores_the_old_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int) -> None:
    entries = prepared(tmp_path, old=True)
    real = commit_module.rename_noreplace
    calls = 0

    def flaky(source: Path, destination: Path) -> None:
        nonlocal calls
        calls += 1
        if calls == failing:
            raise OSError(errno.EIO, "Input/output error")
        real(source, destination)

    monkeypatch.setattr(commit_module, "rename_noreplace", flaky)
    with pytest.raises(OSError, match="Input/output error"):
        commit(tmp_path, entries)
    assert listing(tmp_path) == {"one": b"old one", "two": b"old two"}  # temporary files removed too


def journal_of_a_killed_run(tmp_path: Path, entries: list[Replacement], renames_done: int) -> None:
    """What a run killed after ``renames_done`` renames of its phase leaves (journal in place)."""
    (tmp_path / JOURNAL_NAME).write_bytes(encode_journal(424242, entries))
    steps = [(e.final, e.backup) for e in entries if e.backup] + [(e.partial, e.final) for e in entries]
    for source, destination in steps[:renames_done]:
        os.rename(tmp_path / source, tmp_path / destination)


@pytest.mark.parametrize("renames_done", range(0, 5))
def test_recover_rolls_back_a_killed_forced_run(tmp_path: Path, renames_done: int) -> None:
    entries = prepared(tmp_path, old=True)
    journal_of_a_killed_run(tmp_path, entries, renames_done)
    note = recover(tmp_path)
    assert note is not None and "pid 424242" in note
    assert listing(tmp_path) == {"one": b"old one", "two": b"old two"}


@pytest.mark.parametrize("renames_done", range(0, 2))  # 2: the whole set is in place (rolled forward, below)
def test_recover_removes_a_killed_runs_incomplete_set(tmp_path: Path, renames_done: int) -> None:
    entries = prepared(tmp_path, old=False)
    journal_of_a_killed_run(tmp_path, entries, renames_done)
    note = recover(tmp_path)
    assert note is not None and "its incomplete set was removed" in note
    assert listing(tmp_path) == {}


def test_recover_without_a_journal_does_nothing(tmp_path: Path) -> None:
    (tmp_path / "one").write_bytes(b"a user's file")
    assert recover(tmp_path) is None
    assert listing(tmp_path) == {"one": b"a user's file"}


@pytest.mark.parametrize(
    "journal",
    [
        b"not json",
        b'{"format": 1, "entries": []}',  # format 1 recorded no identities
        b'{"format": 2, "entries": [{"partial": "../x.partial", "final": "one", "new": [1, 2, 3, 4]}]}',
        b'{"format": 2, "entries": [{"partial": ".one.1.partial", "final": "/etc/passwd", "new": [1, 2, 3, 4]}]}',
        b'{"format": 2, "entries": [{"partial": ".one.1.partial", "final": "one", "new": [1, 2, 3, 4], '
        b'"backup": "two", "old": [1, 2, 3, 5]}]}',
        b'{"format": 2, "entries": [{"partial": ".one.1.partial", "final": "one"}]}',
        b'{"format": 2, "entries": [{"partial": ".one.1.partial", "final": "one", "new": [1, 2, -3, 4]}]}',
        b"[" * 100_000,
    ],
    ids=["not-json", "format", "partial-outside", "final-outside", "backup-not-ours", "no-identity",
         "bad-identity", "deep"],
)
def test_a_journal_gguf_mtp_did_not_write_is_refused_and_nothing_touched(tmp_path: Path, journal: bytes) -> None:
    (tmp_path / "one").write_bytes(b"a user's file")
    (tmp_path / JOURNAL_NAME).write_bytes(journal)
    with pytest.raises(UnsafeOutputError, match="an interrupted run's journal cannot be used"):
        recover(tmp_path)
    assert listing(tmp_path) == {JOURNAL_NAME: journal, "one": b"a user's file"}


# ------------------------------------------------------------- only what it created (issue 21, items 1-4)


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped): no process has it now."""
    import subprocess
    import sys

    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_create_exclusive_never_writes_through_a_planted_link(tmp_path: Path, dangling: bool) -> None:
    from gguf_mtp.files.create import create_exclusive

    victim = tmp_path / "victim"
    if not dangling:
        victim.write_bytes(b"a file outside the output folder")
    (tmp_path / "out").mkdir()
    link = tmp_path / "out" / ".name.1.partial"
    link.symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match="something already has its name") as e:
        create_exclusive(link)
    assert str(link) in str(e.value) and "\n" not in str(e.value)
    assert os.path.lexists(victim) != dangling
    if not dangling:
        assert victim.read_bytes() == b"a file outside the output folder"


def test_the_journal_is_never_written_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    out.mkdir()
    entries = prepared(out, old=False)
    (out / f"{JOURNAL_NAME}.{os.getpid()}.partial").symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match="something already has its name"):
        commit(out, entries)
    assert victim.read_bytes() == b"precious"
    assert sorted(os.listdir(out)) == [f"{JOURNAL_NAME}.{os.getpid()}.partial"]  # the new files are gone too


def test_marker_and_state_files_are_never_written_through_a_planted_link(tmp_path: Path) -> None:
    from gguf_mtp.files.workdir import MARKER_NAME, claim_work_dir

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    work = tmp_path / "work"
    work.mkdir()
    (work / f"{MARKER_NAME}.{os.getpid()}.partial").symlink_to(victim)
    with pytest.raises(UnsafeOutputError, match="something already has its name"):
        claim_work_dir(work, "demo", force=True)
    assert victim.read_bytes() == b"precious" and not (work / MARKER_NAME).exists()


def test_recover_rolls_a_complete_set_forward(tmp_path: Path) -> None:
    entries = prepared(tmp_path, old=False)
    journal_of_a_killed_run(tmp_path, entries, renames_done=2)  # killed between the last rename and the commit point

    note = recover(tmp_path)

    assert note is not None and "was killed after renaming its whole set into place" in note
    assert "the set is complete and was kept" in note and "pid 424242" in note
    assert listing(tmp_path) == {"one": b"new one", "two": b"new two"}


def test_recover_rolls_a_forced_set_forward_once_its_old_files_are_gone(tmp_path: Path) -> None:
    entries = prepared(tmp_path, old=True)
    journal_of_a_killed_run(tmp_path, entries, renames_done=4)
    # With the old files still moved aside, a --force run that did not reach its commit point is undone
    # (the user gets the set they had); without them there is nothing to go back to: the new set stays.
    for entry in entries:
        assert entry.backup is not None
        os.unlink(tmp_path / entry.backup)

    note = recover(tmp_path)

    assert note is not None and "the set is complete and was kept" in note
    assert listing(tmp_path) == {"one": b"new one", "two": b"new two"}


def replace_with_users_file(path: Path, in_place: bool) -> None:
    if in_place:  # cp onto an existing name: the same inode, rewritten
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(b"the user's own file")
    else:
        os.unlink(path)
        path.write_bytes(b"the user's own file")


@pytest.mark.parametrize("in_place", [False, True], ids=["new-file", "rewritten-in-place"])
def test_roll_back_leaves_a_file_the_user_put_at_a_final_name(tmp_path: Path, in_place: bool) -> None:
    entries = prepared(tmp_path, old=False)
    journal_of_a_killed_run(tmp_path, entries, renames_done=1)  # "two" renamed in, "one" not yet
    replace_with_users_file(tmp_path / "two", in_place)

    note = recover(tmp_path)

    assert note is not None and "its incomplete set was removed" in note
    assert "left alone two: not the file(s) that run wrote" in note
    assert listing(tmp_path) == {"two": b"the user's own file"}


def test_a_users_file_where_an_old_file_must_go_back_stops_with_both_kept(tmp_path: Path) -> None:
    entries = prepared(tmp_path, old=True)
    journal_of_a_killed_run(tmp_path, entries, renames_done=3)  # both moved aside, "two" renamed in
    replace_with_users_file(tmp_path / "two", in_place=True)
    backup_two = backup_name("two")

    with pytest.raises(UnsafeOutputError, match="both files were kept") as e:
        recover(tmp_path)

    assert f"two now holds another file (the previous one is kept as {backup_two})" in str(e.value)
    assert "\n" not in str(e.value)
    left = listing(tmp_path)
    assert left["two"] == b"the user's own file" and left[backup_two] == b"old two" and JOURNAL_NAME in left
    assert left["one"] == b"old one"  # the rest was rolled back

    os.unlink(tmp_path / "two")  # the user chooses the previous file: the next run finishes the roll-back
    assert "the previous files were restored" in (recover(tmp_path) or "")
    assert listing(tmp_path) == {"one": b"old one", "two": b"old two"}


def test_a_failed_commit_never_removes_a_file_that_appeared_after_its_old_one_was_moved(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    entries = prepared(tmp_path, old=True)
    real = commit_module.rename_noreplace

    def intruding(source: Path, destination: Path) -> None:
        if destination.name == "two" and source.name.endswith(".partial"):
            destination.write_bytes(b"another program's file")  # lands after "two" was moved aside
        real(source, destination)

    monkeypatch.setattr(commit_module, "rename_noreplace", intruding)
    with pytest.raises(OSError, match="both files were kept"):
        commit(tmp_path, entries)
    left = listing(tmp_path)
    assert left["two"] == b"another program's file" and left[backup_name("two")] == b"old two"
    assert left["one"] == b"old one" and JOURNAL_NAME in left


def test_leftovers_of_dead_runs_are_removed_and_reported_nothing_else(tmp_path: Path) -> None:
    from gguf_mtp.files.commit import remove_leftovers

    dead, live = dead_pid(), os.getppid()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    out.mkdir()
    removed = {
        f".model-00001-of-00002.gguf.{dead}.partial": b"x" * 10_000,
        f".model-00002-of-00002.gguf.{dead}.replaced": b"y" * 5_000,
        f"{JOURNAL_NAME}.{dead}.partial": b"{",
    }
    kept = {
        f".model.gguf.{live}.partial": b"a live run's",
        f".model.gguf.{dead}.partial.bak": b"not our name",
        f"model.gguf.{dead}.partial": b"not hidden: not our name",
        f".model.gguf.x{dead}.partial": b"no pid",
        "model.gguf": b"a model",
    }
    for name, data in {**removed, **kept}.items():
        (out / name).write_bytes(data)
    (out / f".link.gguf.{dead}.partial").symlink_to(victim)
    (out / f".folder.gguf.{dead}.partial").mkdir()

    note = remove_leftovers(out)

    assert note is not None
    assert "removed 3 temporary file(s) (" in note and f"left by a killed gguf-mtp run (pid {dead})" in note
    assert sorted(os.listdir(out)) == sorted([*kept, f".link.gguf.{dead}.partial", f".folder.gguf.{dead}.partial"])
    assert victim.read_bytes() == b"precious"
    assert remove_leftovers(out) is None  # nothing left to remove


def test_pending_journal_names_an_uncommitted_set(tmp_path: Path) -> None:
    from gguf_mtp.files.journal import pending_journal

    entries = prepared(tmp_path, old=False)
    assert pending_journal([tmp_path / "one", tmp_path / "two"]) is None
    journal_of_a_killed_run(tmp_path, entries, renames_done=2)
    assert pending_journal([tmp_path / "one"]) == tmp_path / JOURNAL_NAME
    assert pending_journal([tmp_path / "three"]) is None
    (tmp_path / JOURNAL_NAME).write_bytes(b"{not ours")
    assert pending_journal([tmp_path / "three"]) == tmp_path / JOURNAL_NAME  # unreadable: counted, never trusted


# -------------------------------------------------------------------------------------------- set id


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("set-id")
    target = write_target(folder / "target", hparams=SMALL, pattern=TRUNK, shards=3, name="Tiny-Q4")
    draft = write_draft(folder / "draft" / "mtp.gguf", hparams=SMALL, trunk_pattern=TRUNK, with_globals=True)
    return target, draft


def set_ids(folder: Path) -> list[str]:
    values = []
    for path in sorted(folder.glob("*.gguf")):
        header = read_header(path)
        values.append(header.kvs[SET_ID_KEY].value)
    return values


def test_every_shard_carries_the_same_set_id_derived_from_the_plan(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = inputs
    compose(target, draft, tmp_path / "a", progress=False)
    compose(target, draft, tmp_path / "b", progress=False)
    compose(target, draft, tmp_path / "c", progress=False, set_kv=["general.name=Other"])

    ids = set_ids(tmp_path / "a")
    assert len(ids) == 3 and len(set(ids)) == 1
    assert len(ids[0]) == 32 and int(ids[0], 16) != 0
    # deterministic: the same inputs, the same bytes; another plan, another id
    for name in os.listdir(tmp_path / "a"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert set(set_ids(tmp_path / "c")) != set(ids)


def test_the_set_id_is_the_hash_of_the_headers_with_zeros_in_place(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = inputs
    compose(target, draft, tmp_path / "a", progress=False)
    set_id = set_ids(tmp_path / "a")[0]
    digest = hashlib.sha256()
    for path in sorted((tmp_path / "a").glob("*.gguf")):
        header = read_header(path)
        head = path.read_bytes()[: header.data_offset]
        assert head.count(set_id.encode()) == 1
        digest.update(head.replace(set_id.encode(), b"0" * 32))
    assert digest.hexdigest()[:32] == set_id


def test_strip_drops_the_set_id_and_gives_back_the_target(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = inputs
    composed = compose(target, draft, tmp_path / "composite", progress=False).output_paths[0]
    strip(composed, tmp_path / "trunk", progress=False)
    assert listing(tmp_path / "trunk") == listing(target.parent)


def test_verify_fails_a_set_mixed_from_two_runs(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = inputs
    first = compose(target, draft, tmp_path / "a", progress=False).output_paths
    compose(target, draft, tmp_path / "b", progress=False, set_kv=["general.name=Other"])
    mixed = tmp_path / "mixed"
    shutil.copytree(tmp_path / "a", mixed)
    shutil.copy(tmp_path / "b" / first[1].name, mixed / first[1].name)  # shard 2 from the other run

    report = verify(mixed / first[0].name, llama=False, progress=False)
    good = verify(tmp_path / "a" / first[0].name, llama=False, progress=False)

    assert good.ok, good.describe()
    assert not report.ok
    failed = [c for c in report.checks if c.ok is False]
    assert [c.name for c in failed] == ["split keys"]
    assert "shards come from different runs" in failed[0].detail


def test_shards_without_a_set_id_are_not_counted() -> None:
    from types import SimpleNamespace

    from gguf_mtp.format.header import encode_kv as kv
    from gguf_mtp.model.set_id import set_id_problems

    def header(set_id: str | None) -> object:
        kvs = {} if set_id is None else {SET_ID_KEY: kv(SET_ID_KEY, 8, set_id)}
        return SimpleNamespace(kvs=kvs)

    a, b = "a" * 32, "b" * 32
    # gguf-split keeps the metadata in the first shard only; an older composite has no id at all
    assert set_id_problems([("shard 1", header(a)), ("shard 2", header(None)), ("shard 3", None)]) == []
    assert set_id_problems([("shard 1", header(None)), ("shard 2", header(None))]) == []
    assert set_id_problems([("shard 1", header(a)), ("shard 2", header(None)), ("shard 3", header(b))]) == [
        f"shards come from different runs: shard 1 has set id {a}, shard 3 has {b}"
    ]
