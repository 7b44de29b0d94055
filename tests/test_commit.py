"""The rename phase (gguf_mtp.files.commit) and the set id (gguf_mtp.set_id): lock, no-replace renames,
journal and roll-back, and a set mixed from two compose runs that verify refuses."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from malformed import SMALL, TRUNK

import gguf_mtp.files.commit as commit_module
from gguf_mtp.check.verify import verify
from gguf_mtp.errors import UnsafeOutputError
from gguf_mtp.files.commit import (
    JOURNAL_NAME,
    Replacement,
    backup_name,
    commit,
    folder_lock,
    recover,
    rename_noreplace,
)
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
        if old:
            (tmp_path / name).write_bytes(f"old {name}".encode())
        entries.append(Replacement(partial, name, backup_name(name) if old else None))
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
    (tmp_path / JOURNAL_NAME).write_text(
        json.dumps({"format": 1, "pid": 424242, "entries": [e.to_dict() for e in entries]})
    )
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


@pytest.mark.parametrize("renames_done", range(0, 3))
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
        b'{"format": 2, "entries": []}',
        b'{"format": 1, "entries": [{"partial": "../x.partial", "final": "one"}]}',
        b'{"format": 1, "entries": [{"partial": ".one.1.partial", "final": "/etc/passwd"}]}',
        b'{"format": 1, "entries": [{"partial": ".one.1.partial", "final": "one", "backup": "two"}]}',
        b"[" * 100_000,
    ],
    ids=["not-json", "format", "partial-outside", "final-outside", "backup-not-ours", "deep"],
)
def test_a_journal_gguf_mtp_did_not_write_is_refused_and_nothing_touched(tmp_path: Path, journal: bytes) -> None:
    (tmp_path / "one").write_bytes(b"a user's file")
    (tmp_path / JOURNAL_NAME).write_bytes(journal)
    with pytest.raises(UnsafeOutputError, match="an interrupted run's journal cannot be used"):
        recover(tmp_path)
    assert listing(tmp_path) == {JOURNAL_NAME: journal, "one": b"a user's file"}


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
