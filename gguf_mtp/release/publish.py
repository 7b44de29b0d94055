"""``publish``: upload a composite and its model card to the Hugging Face Hub, all or nothing.

Order of work, so that nothing heavy happens before we know it can succeed, and nothing on the Hub
looks complete before it is:

1. **plan** (headers only): which files (exactly the shards of one model), how (one commit, or a
   resumable upload for a large set);
2. **check** (cheap Hub calls, skipped by ``dry_run``): token, ``whoami``, ``create_repo(exist_ok=True)``,
   branch, write access, and that the repo's ``README.md``, if any, is a card gguf-mtp wrote (another one
   is replaced only with ``replace_readme``: :func:`check_card_replaceable`);
3. **hash** every file (streaming sha256) and render the card (:mod:`gguf_mtp.release.card`);
4. **upload** from a staging folder recreated on every run (links to the shards + ``README.md``):
   a set that fits goes up as ONE commit; a large set goes up resumably, with any earlier card removed
   first and the new card committed last, only after the shards on the Hub were checked;
   Files byte-identical to a file of the source repo (``copy_from``: same sha256 and size in the Hub's listing
   at the pinned commit, never by name) are copied on the Hub's side (:func:`plan_transfers`); files the repo
   already holds unchanged are left alone; only the rest is uploaded;
5. **compare** what the Hub reports (size; sha256 for LFS/Xet files; the git blob id of the card)
   with the local files;
6. **say what was sent** (:class:`UploadSize`): the bytes of every file, and the bytes that differ from the
   target set (every shard's header and the NextN block: the rest is the target's tensor data, which Xet
   storage, deduplicating ~64 KB chunks across repos, already holds when the target is on the Hub). The new
   bytes Xet actually stored would be the measurement; huggingface_hub's ``upload_folder`` returns a commit
   without them (hf_xet computes them, huggingface_hub up to 2.4 drops them), so the report says so and
   labels the differing bytes as the expected upload.

A folder holding one model and ``mtp-*.gguf`` sidecars beside it is published as llama.cpp's own pipeline ships a
head: the trunk untouched (no NextN block; with ``copy_from`` its files are copied on the Hub's side) and the
sidecars, each checked to fit the trunk (:func:`~gguf_mtp.check.draft_checks.target_fit_check`); the card says which
sidecar ``llama-server -hf`` pairs with the trunk (:func:`~gguf_mtp.jobs.sidecar_pairing.pair_listing`).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf_mtp.check.draft_checks import draft_globals_check, target_fit_check
from gguf_mtp.constants import (
    KEY_BLOCK_COUNT,
    KEY_NEXTN_PREDICT_LAYERS,
    KEY_SPLIT_TENSORS_COUNT,
    SPLIT_NAME,
)
from gguf_mtp.errors import (
    BadGGUFError,
    HubError,
    IncompatibleDraftError,
    NoNextNBlockError,
    ParameterError,
    ShardSetError,
)
from gguf_mtp.files.create import create_exclusive, write_all
from gguf_mtp.files.digests import FileDigest, digest_files, git_blob_sha1
from gguf_mtp.format.header import GGUFHeader, TensorInfo, align_up
from gguf_mtp.hub import access as hub_access
from gguf_mtp.hub import client as hub
from gguf_mtp.hub.hub_api import HubApi
from gguf_mtp.jobs.sidecar_pairing import TrunkPairing, pair_listing
from gguf_mtp.model.blocks import block_index, is_mtp_only, read_block_layout
from gguf_mtp.model.set_id import SET_ID_KEY
from gguf_mtp.model.shards import ShardSet, open_model
from gguf_mtp.model.sidecar_names import SIDECAR_KEYWORD
from gguf_mtp.text import human_bytes

from .card import CardRequest, ModelFacts, Provenance, is_gguf_mtp_card, render_model_card

if TYPE_CHECKING:
    from gguf_mtp.server.bench_rules import BenchSummary

__all__ = [
    "CARD_NAME",
    "ONE_COMMIT_MAX_BYTES",
    "ONE_COMMIT_MAX_FILES",
    "CopySource",
    "FileTransfer",
    "PublishOptions",
    "PublishPlan",
    "PublishReport",
    "RemoteCheck",
    "UploadSize",
    "bytes_beyond_target",
    "check_card_replaceable",
    "compare_remote",
    "find_model",
    "find_models",
    "plan_publish",
    "plan_transfers",
    "publish",
    "run",
    "sidecar_name",
    "why_new_files",
]

#: A set up to this size goes up as one commit; a larger one resumably (a failed one-commit upload of
#: a hundred GB starts over, a resumable one picks up where it stopped).
ONE_COMMIT_MAX_BYTES = 50 * 2**30
#: ... and up to this many files.
ONE_COMMIT_MAX_FILES = 50
#: The model card's name in the repo.
CARD_NAME = "README.md"
#: A README.md on the Hub larger than this is not a card of ours (not downloaded to find out).
CARD_MAX_BYTES = 1 << 20
#: Staging folder (inside the published folder, so shards can be hard-linked), recreated on every run.
STAGING_NAME = ".gguf-mtp-publish"
#: What huggingface_hub's resumable upload keeps in the staging folder; kept so a re-run resumes.
_RESUME_CACHE = ".cache"
_UPLOAD_MODES = ("auto", "one-commit", "resumable")


@dataclass(frozen=True)
class CopySource:
    """A Hub repo whose files, where byte-identical to a published one, are copied on the Hub's side.

    ``revision`` is resolved to a commit once, before the listing is read; the copy names that commit.
    """

    repo: str
    revision: str | None = None

    @classmethod
    def parse(cls, text: str) -> CopySource:
        """``REPO[@REV]`` as a :class:`CopySource`.

        Raises:
            HubError: ``REPO`` is not an ``OWNER/NAME`` repo id, or ``@`` is followed by nothing.
        """
        repo, at, revision = text.partition("@")
        hub.check_repo_id(repo, "copy_from")
        if at and not revision:
            raise HubError(f"copy_from {text!r}: name a revision after '@', or leave '@' out", parameter="copy_from")
        return cls(repo, revision or None)


@dataclass(frozen=True)
class FileTransfer:
    """How one published file reaches the repo: ``copied`` (from ``source``, on the Hub's side), ``uploaded`` or
    ``unchanged`` (the repo already holds these bytes), and why."""

    name: str  # the path in the repo
    size: int
    how: str  # "copied", "uploaded" or "unchanged"
    why: str
    source: str | None = None  # copied: "REPO@COMMIT"
    source_path: str | None = None  # copied: the file's path in the source repo

    def to_dict(self) -> dict[str, Any]:
        return {"transfer": self.how, "copied_from": self.source, "source_path": self.source_path, "why": self.why}

    def describe(self) -> str:
        if self.how == "copied":
            return f"copied from {self.source} ({self.source_path}; on the Hub's side, 0 bytes uploaded)"
        return f"{self.how} ({self.why})"


@dataclass(frozen=True, kw_only=True)
class PublishOptions:
    """What a publish run was asked to do, as one object: built once by the command line or by :func:`publish` from
    its keyword arguments, and read by the plan, the checks and the card.

    Attributes:
        repo: the Hub repo, ``OWNER/NAME``; created if missing.
        private: create the repo private (an existing repo keeps its visibility).
        revision: the branch to commit to (created if missing); default the main branch.
        dry_run: plan, hash and render the card only: no token needed, no network used.
        provenance: where the target and the head came from, for the card.
        upload_mode: ``"auto"`` (by size and file count), ``"one-commit"`` or ``"resumable"``.
        one_commit_max_bytes: with ``auto``, the largest set uploaded as one commit.
        one_commit_max_files: with ``auto``, the most files (card included) uploaded as one commit.
        progress: progress bars on stderr (hashing; huggingface_hub shows its own for uploads).
        standalone: publish an MTP-only draft as a sidecar (named ``mtp-*``; its card shows both
            ``--spec-draft-model`` and ``llama-server -hf``). Without it, a folder holding one model and
            ``mtp-*.gguf`` sidecars is published as an untouched trunk beside its sidecars (:func:`find_models`).
        path_in_repo: the repo folder the files go to (e.g. a quant's folder, next to which a sidecar is
            found by ``llama-server -hf``); default the repo root. The card is the repo's root ``README.md``
            (the one the Hub shows).
        bench: a ``gguf-mtp bench --json`` report of these files (:func:`~gguf_mtp.server.bench_rules.parse_bench_json`)
            for the card's "Measured speed" table.
        replace_readme: replace the repo's ``README.md`` even when gguf-mtp did not write it (without it
            such a file is refused before anything is hashed or uploaded; a card of ours is always replaced).
        copy_from: a source repo, ``REPO[@REV]`` (:class:`CopySource`, ``--copy-from``; the pipeline passes its
            target repo at the commit it read; pinned to the commit ``REV`` names when the run starts): a file whose
            sha256 and size equal a ``.gguf`` file of it is copied on the Hub's side, 0 bytes uploaded
            (:func:`plan_transfers`; huggingface_hub 1.17.0 and later, Xet-stored files; elsewhere uploaded, said
            once in ``notes``); a dry run reads the source's listing (read-only) to say so per file. The report
            says per file copied, uploaded or unchanged.
    """

    repo: str
    revision: str | None = None
    private: bool = False
    dry_run: bool = False
    provenance: Provenance = field(default_factory=Provenance)
    upload_mode: str = "auto"
    one_commit_max_bytes: int = ONE_COMMIT_MAX_BYTES
    one_commit_max_files: int = ONE_COMMIT_MAX_FILES
    progress: bool = True
    standalone: bool = False
    path_in_repo: str | None = None
    bench: BenchSummary | None = None
    replace_readme: bool = False
    copy_from: CopySource | None = None


@dataclass(frozen=True)
class PublishPlan:
    """What a publish run uploads, and how."""

    repo: str
    revision: str | None
    private: bool
    model: ShardSet
    mode: str  # "one-commit" or "resumable"
    standalone: bool = False  # an MTP-only draft published as such (for llama-server --spec-draft-model)
    path_in_repo: str | None = None  # the repo folder the files go to (the card: the root); None: the root
    sidecars: tuple[ShardSet, ...] = ()  # mtp- sidecars published beside ``model``, then an untouched trunk

    @property
    def files(self) -> list[Path]:
        """The model's files, then each sidecar's."""
        return self.model.paths + [p for s in self.sidecars for p in s.paths]

    @property
    def names_in_repo(self) -> list[str]:
        """Each file's path in the repo: in :attr:`path_in_repo`, a draft named as a sidecar (``mtp-*``)."""
        return [self.repo_path(sidecar_name(p.name) if self.standalone else p.name) for p in self.files]

    @property
    def pairings(self) -> list[TrunkPairing]:
        """With sidecars: the sidecar ``llama-server -hf REPO:TAG`` pairs with the trunk (llama.cpp's rule)."""
        return pair_listing(self.names_in_repo) if self.sidecars else []

    @property
    def card_path(self) -> str:
        """The model card's path in the repo: the root ``README.md``, the one file the Hub shows as the card,
        also when the files go to :attr:`path_in_repo` (a ``README.md`` in a folder is shown by no one)."""
        return CARD_NAME

    def repo_path(self, name: str) -> str:
        """``name`` inside :attr:`path_in_repo`."""
        return f"{self.path_in_repo}/{name}" if self.path_in_repo else name

    @property
    def total_bytes(self) -> int:
        return sum(h.file_size for m in (self.model, *self.sidecars) for h in m.headers)


@dataclass(frozen=True)
class RemoteCheck:
    """One file compared with the Hub's record of it after the upload."""

    name: str
    size: int
    remote_size: int | None
    sha256: str | None  # local (for the card: its git blob id is compared instead)
    remote_sha256: str | None
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "remote_size": self.remote_size,
            "sha256": self.sha256,
            "remote_sha256": self.remote_sha256,
            "ok": self.ok,
            "detail": self.detail,
        }


def bytes_beyond_target(model: ShardSet) -> int:
    """The bytes of a composite that are not its target's: every shard's header (KV and tensor table, up to its
    data section) and the NextN block's tensors; all the rest is the target's tensor data, copied verbatim by
    compose (the same bytes :func:`gguf_mtp.jobs.compose.compose` plans as copies of the target)."""
    return sum(_bytes_beyond_target_per_shard(model))


def _bytes_beyond_target_per_shard(model: ShardSet) -> list[int]:
    """:func:`bytes_beyond_target`, one figure per shard."""
    head = {(shard, t.name) for shard, t in model.head_tensors()}
    figures = []
    for shard, header in enumerate(model.headers):
        trunk = sum(align_up(t.nbytes, header.alignment) for t in header.tensors if (shard, t.name) not in head)
        figures.append(header.file_size - min(trunk, header.data_size))
    return figures


#: The KVs compose edits, as far as a shard carries them: a shard holding one has a new header, so is a new file.
_COMPOSE_EDITED_KEYS = (KEY_BLOCK_COUNT, KEY_NEXTN_PREDICT_LAYERS, KEY_SPLIT_TENSORS_COUNT, SET_ID_KEY)


def why_new_files(model: ShardSet, standalone: bool, trunk: bool = False) -> list[str]:
    """Why each file of ``model`` is a new file, not one of its target's: a composite shard's header changed (the
    KVs compose edits that it carries) and, for the shard that holds it, the NextN block was appended; a
    standalone draft is the head itself; a ``trunk`` published beside its sidecars is the target's files as they
    are (new only to a repo that does not hold them)."""
    if trunk:
        return ["the trunk, unchanged"] * len(model.headers)
    if standalone:
        return ["the MTP head: a new file"] * len(model.headers)
    keys = [model.arch_key(k) for k in _COMPOSE_EDITED_KEYS]
    head = list(model.head_tensors())
    return [f"a new file: {_why_new_shard(header, keys, _head_blocks(head, shard))}"
            for shard, header in enumerate(model.headers)]


def _head_blocks(head: Sequence[tuple[int, TensorInfo]], shard: int) -> list[int]:
    """The NextN blocks whose tensors ``shard`` holds (``head``: :meth:`ShardSet.head_tensors`)."""
    return sorted({block for where, tensor in head
                   if where == shard and (block := block_index(tensor.name)) is not None})


def _why_new_shard(header: GGUFHeader, edited_keys: Sequence[str], blocks: Sequence[int]) -> str:
    """Why one composite shard is new: the edited KVs it carries, and the NextN blocks it holds."""
    edited = [k for k in edited_keys if k in header.kvs]
    why = f"its header changed ({', '.join(edited)})" if edited else "its header changed"
    if blocks:
        why += f" and it holds the NextN block ({', '.join(f'blk.{b}' for b in blocks)})"
    return why


def plan_transfers(
    files: Sequence[FileDigest],
    names: Sequence[str],
    why_new: Sequence[str],
    *,
    source: str | None,
    source_files: Mapping[str, hub.RemoteFile],
    held: Mapping[str, hub.RemoteFile],
    can_copy: bool,
) -> list[FileTransfer]:
    """How each file reaches the repo (pure): ``unchanged`` where the repo already holds a file of that name,
    size and sha256 (``held``); ``copied`` from ``source`` (``REPO@COMMIT``) where a file of ``source_files`` has
    the same sha256 and size (never by name alone) and is stored in Xet (what a copy between repos needs), and
    ``can_copy`` (the installed huggingface_hub copies between repos); else ``uploaded``, ``why_new`` saying why.
    """
    identical = {(r.sha256, r.size): r for r in source_files.values() if r.sha256 is not None}
    return [
        _transfer(f, name, why, held.get(name), identical.get((f.sha256, f.size)), source=source, can_copy=can_copy)
        for f, name, why in zip(files, names, why_new)
    ]


def _transfer(f: FileDigest, name: str, why: str, here: hub.RemoteFile | None, twin: hub.RemoteFile | None, *,
              source: str | None, can_copy: bool) -> FileTransfer:
    """How one file reaches the repo, given the repo's file of its name (``here``) and the source's file of its
    bytes (``twin``)."""
    if here is not None and here.sha256 == f.sha256 and here.size == f.size:
        return FileTransfer(name, f.size, "unchanged", "the repo already holds these bytes")
    if twin is None:
        return FileTransfer(name, f.size, "uploaded", why if source is None else f"{why}; not in {source}")
    if not can_copy:
        return FileTransfer(
            name, f.size, "uploaded", f"identical to {twin.path} of {source}, but this huggingface_hub cannot "
            f"copy between repos ({hub.SERVER_COPY_SINCE} and later can)")
    if twin.xet_hash is None:
        return FileTransfer(
            name, f.size, "uploaded", f"identical to {twin.path} of {source}, which is not stored in Xet (only "
            "Xet files are copied between repos)")
    return FileTransfer(name, f.size, "copied", f"identical to {twin.path}", source, twin.path)


@dataclass(frozen=True)
class UploadSize:
    """What an upload sent, as far as the installed huggingface_hub lets us know.

    The measurement would be the new bytes Xet stored after deduplication; no huggingface_hub release returns
    it from an upload (hf_xet reports it to huggingface_hub, whose ``upload_folder`` returns only the commit), so
    ``new_bytes`` stays unknown and ``differing_bytes`` is the expected upload. Copied and unchanged files are
    not uploaded: they count in ``copied_bytes`` and ``unchanged_bytes`` only.
    """

    total_bytes: int  # every uploaded file, the card included
    differing_bytes: int  # of those, bytes not in the target set (headers + the NextN block + card; a draft: all)
    copied_bytes: int = 0  # files copied on the Hub's side from the source repo (0 bytes uploaded)
    unchanged_bytes: int = 0  # files the repo already held

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_bytes": self.total_bytes,
            "copied_bytes": self.copied_bytes,
            "unchanged_bytes": self.unchanged_bytes,
            "new_bytes": None,
            "new_bytes_measured": False,
            "why_not_measured": self.why_not_measured,
            "expected_new_bytes": self.differing_bytes,
        }

    @property
    def why_not_measured(self) -> str:
        return f"huggingface_hub {_hub_version()} does not return Xet's deduplication metrics for an upload"

    def describe(self, dry_run: bool) -> list[str]:
        verb = "would upload" if dry_run else "uploaded"
        lines = [f"upload size: {verb} {human_bytes(self.total_bytes)} ({self.total_bytes:,} bytes)"]
        if self.copied_bytes:
            copied = "would copy" if dry_run else "copied"
            lines.append(f"{copied} on the Hub's side: {human_bytes(self.copied_bytes)} ({self.copied_bytes:,} bytes), "
                         "none of them uploaded")
        if self.unchanged_bytes:
            lines.append(f"unchanged on the Hub: {human_bytes(self.unchanged_bytes)} ({self.unchanged_bytes:,} bytes)")
        if not dry_run:
            lines.append(f"new bytes: not measured ({self.why_not_measured})")
        lines.append(f"expected upload: {human_bytes(self.differing_bytes)} ({self.differing_bytes:,} bytes), the "
                     "bytes that differ from the target set (headers + the NextN block + the card); Xet deduplicates "
                     "the rest against the target's chunks on the Hub")
        return lines


def _hub_version() -> str:
    from huggingface_hub import __version__

    return __version__


@dataclass
class PublishReport:
    """What a publish run did (or, with ``dry_run``, would do)."""

    plan: PublishPlan
    dry_run: bool
    files: list[FileDigest]
    card: str
    user: str | None = None
    commit_url: str | None = None
    upload_method: str | None = None
    checks: list[RemoteCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    upload: UploadSize | None = None
    transfers: list[FileTransfer] = field(default_factory=list)  # one per file, in the order of ``files``
    copy_source: tuple[str, str] | None = None  # (repo, commit) the copies are made from

    @property
    def ok(self) -> bool:
        return self.dry_run or (bool(self.checks) and all(c.ok for c in self.checks))

    @property
    def url(self) -> str:
        base = f"https://huggingface.co/{self.plan.repo}"
        return f"{base}/tree/{self.plan.revision}" if self.plan.revision else base

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "command": "publish",
            "dry_run": self.dry_run,
            "repo": plan.repo,
            "revision": plan.revision,
            "private": plan.private,
            "mode": plan.mode,
            "standalone": plan.standalone,
            "path_in_repo": plan.path_in_repo,
            "card_path": plan.card_path,
            "files": [
                f.to_dict() | {"name": f.name, "path_in_repo": n} | t.to_dict()
                for f, n, t in zip(self.files, plan.names_in_repo, self.transfers)
            ],
            "total_bytes": plan.total_bytes,
            "card": self.card,
            "user": self.user,
            "commit_url": self.commit_url,
            "upload_method": self.upload_method,
            "checks": [c.to_dict() for c in self.checks],
            "ok": self.ok,
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
            "upload": self.upload.to_dict() if self.upload is not None else None,
            "pairings": [p.to_dict() for p in plan.pairings],
        }

    def describe(self) -> list[str]:
        """Human-readable lines (the card itself is not included)."""
        lines = self._file_lines()
        if self.dry_run:
            lines.append("dry run: nothing was uploaded; the token and the repo were not checked")
        else:
            lines += self._check_lines()
        if self.upload is not None:
            lines += self.upload.describe(self.dry_run)
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def _file_lines(self) -> list[str]:
        """What goes where and how: one line per file, the card, and the sidecars ``-hf`` pairs."""
        plan = self.plan
        how = "as one commit" if plan.mode == "one-commit" else "resumably (model card committed last)"
        where = plan.repo + (f"@{plan.revision}" if plan.revision else "")
        verb = "would upload" if self.dry_run else "uploaded"
        lines = [f"{verb} {len(self.files)} file(s) + {plan.card_path} to {where} {how}:"]
        lines += [
            f"    {n}  {f.size:,} bytes  sha256 {f.sha256}  {t.describe()}"
            for f, n, t in zip(self.files, plan.names_in_repo, self.transfers)
        ]
        lines.append(f"    {plan.card_path}  {len(self.card.encode()):,} bytes (model card)")
        lines += [f"llama-server -hf {plan.repo}:{p.tag} pairs the trunk {p.trunk} with "
                  f"{p.sidecar or f'no {SIDECAR_KEYWORD} file'}" for p in plan.pairings]
        return lines

    def _check_lines(self) -> list[str]:
        """What the Hub holds after the upload: every mismatch, or that all match; and the commit."""
        bad = [c for c in self.checks if not c.ok]
        if bad:
            lines = [f"MISMATCH {c.name}: {c.detail}" for c in bad]
        else:
            lines = [f"checked on the Hub: {len(self.checks)} file(s), sizes and hashes match"]
        return [*lines, f"published: {self.commit_url or self.url}"]


def sidecar_name(name: str) -> str:
    """The name an MTP-only draft is published under so that ``llama-server -hf REPO --spec-type draft-mtp``
    downloads it: llama.cpp takes a ``.gguf`` whose path contains ``mtp-`` (``name`` itself when it does).
    """
    return name if SIDECAR_KEYWORD in name else f"{SIDECAR_KEYWORD}{name}"


def _exact(name: str) -> str:
    """An upload pattern that matches exactly ``name`` (huggingface_hub filters with fnmatch)."""
    return glob.escape(name)


def find_model(path: str | os.PathLike[str]) -> ShardSet:
    """The one model in a folder (or the model a given file belongs to), checked as a complete set.

    Raises:
        BadGGUFError: no such folder, or no GGUF in it.
        ShardSetError: several models in the folder (sidecars beside a trunk: :func:`find_models`), or an
            incomplete / inconsistent split set.
    """
    model, sidecars = find_models(path)
    if sidecars:
        raise ShardSetError(f"holds {model.name} and {len(sidecars)} {SIDECAR_KEYWORD} sidecar(s); pass the first "
                            "file of the one to publish", Path(path))
    return model


def find_models(path: str | os.PathLike[str]) -> tuple[ShardSet, tuple[ShardSet, ...]]:
    """The one model in a folder (or the model a given file belongs to), and the ``mtp-`` sidecars beside it when the
    folder holds one other model and those (a trunk and its sidecar set); each checked as a complete set.

    Raises:
        BadGGUFError: no such folder, or no GGUF in it.
        ShardSetError: several models in the folder, or an incomplete / inconsistent split set.
    """
    p = Path(path)
    if p.is_file():
        return open_model(p), ()
    models = _models_in_folder(p)
    if len(models) == 1:
        return open_model(next(iter(models.values()))), ()
    sidecars = sorted(key for key in models if SIDECAR_KEYWORD in key)
    trunks = [key for key in models if key not in sidecars]
    if len(trunks) != 1:
        raise ShardSetError(
            f"holds {len(models)} models ({', '.join(sorted(models))}); pass the first file of the one to publish, "
            f"or keep one trunk and its {SIDECAR_KEYWORD}*.gguf sidecars in the folder", p
        )
    return open_model(models[trunks[0]]), tuple(open_model(models[key]) for key in sidecars)


def _models_in_folder(folder: Path) -> dict[str, Path]:
    """The models of a folder, each by one key (``PREFIX-*-of-N.gguf`` for a split set, else its name) and its first
    file found (sorted); hidden files and non-``.gguf`` files are not models.

    Raises:
        BadGGUFError: no such folder, or no ``.gguf`` file in it.
    """
    if not folder.is_dir():
        raise BadGGUFError("no such file or folder", folder)
    models: dict[str, Path] = {}
    for f in sorted(folder.iterdir()):
        if f.name.startswith(".") or f.suffix != ".gguf" or not f.is_file():
            continue
        match = SPLIT_NAME.match(f.name)
        models.setdefault(f"{match['prefix']}-*-of-{match['count']}.gguf" if match else f.name, f)
    if not models:
        raise BadGGUFError("no .gguf file in this folder", folder)
    return models


def plan_publish(model: ShardSet, options: PublishOptions, sidecars: Sequence[ShardSet] = ()) -> PublishPlan:
    """Decide what to upload and how (pure: headers only).

    With ``sidecars`` (:func:`find_models`), ``model`` is an untouched trunk published beside them: it must carry
    no NextN block, and each sidecar must be one llama.cpp loads beside it (:func:`_check_sidecars`).

    The options read: ``repo``, ``revision``, ``private``, ``upload_mode`` and its two limits; ``standalone``
    (publish an MTP-only draft, NextN block tensors only, as a draft for ``llama-server --spec-draft-model``,
    under sidecar names, :func:`sidecar_name`; without it such a file is refused, since it is not a model);
    ``path_in_repo`` (the folder of the repo the files go to; the card is always the root ``README.md``); and,
    when ``repo`` is the target's repo, the provenance's target files: a sidecar must then lie in the folder of
    the target's first file or a parent of it (llama.cpp's rule).

    Raises:
        HubError: ``repo`` is not ``OWNER/NAME``, ``upload_mode`` is unknown, ``path_in_repo`` is not a
            folder path inside the repo, or a sidecar would lie where llama.cpp's ``-hf`` does not look.
        NoNextNBlockError: the model has no NextN block (nothing MTP to publish), and no sidecar beside it.
        ParameterError: an MTP-only draft is given without ``standalone``, or a whole model with it; or a model with
            a NextN block (a composite) beside sidecars.
        IncompatibleDraftError: a sidecar that llama.cpp cannot load beside the trunk.
    """
    repo, standalone = options.repo, options.standalone
    provenance = options.provenance
    target_files = provenance.target_files if provenance.target_repo == repo else ()
    hub.check_repo_id(repo)
    if options.upload_mode not in _UPLOAD_MODES:
        raise HubError(f"upload mode {options.upload_mode!r}: use one of {', '.join(_UPLOAD_MODES)}")
    if sidecars:
        _check_sidecars(model, sidecars, standalone)
    elif model.nextn_predict_layers == 0:
        raise NoNextNBlockError(
            f"{model.arch_key('{arch}.nextn_predict_layers')} is 0 or missing: not an MTP composite (compose it first)",
            model.name,
        )
    _check_draft_or_model(model, standalone)
    path_in_repo, revision = options.path_in_repo, options.revision
    folder = hub.check_path_in_repo(path_in_repo) if path_in_repo not in (None, "") else None
    if standalone and target_files:
        _check_sidecar_folder(folder, target_files[0])
    return PublishPlan(
        repo, revision if revision not in ("", None) else None, options.private, model,
        _upload_mode(model, sidecars, options), standalone, folder, tuple(sidecars),
    )


def _check_draft_or_model(model: ShardSet, standalone: bool) -> None:
    """An MTP-only draft is published only ``standalone``, and ``standalone`` publishes only such a draft.

    Raises:
        ParameterError: one without the other.
    """
    draft = is_mtp_only(read_block_layout(model.first), model.block_indices())
    if draft and not standalone:
        raise ParameterError(
            "an MTP draft (NextN block tensors only, no trunk block tensors), not a model: publish the composite "
            "made from it (gguf-mtp compose TARGET DRAFT), or pass standalone to publish it as a draft for "
            "llama-server --spec-draft-model",
            model.name,
            "standalone",
        )
    if standalone and not draft:
        raise ParameterError(
            "standalone publishes an MTP-only draft, but this is a whole model", model.name, "standalone"
        )


def _upload_mode(model: ShardSet, sidecars: Sequence[ShardSet], options: PublishOptions) -> str:
    """The asked upload mode; for ``auto``, one commit when the set (card included) is within both limits."""
    if options.upload_mode != "auto":
        return options.upload_mode
    headers = [h for m in (model, *sidecars) for h in m.headers]
    small = sum(h.file_size for h in headers) <= options.one_commit_max_bytes
    few = len(headers) + 1 <= options.one_commit_max_files
    return "one-commit" if small and few else "resumable"


def _check_sidecars(trunk: ShardSet, sidecars: Sequence[ShardSet], standalone: bool) -> None:
    """A trunk published beside sidecars: no NextN block of its own, each sidecar MTP-only, loadable by itself
    (``token_embd``/``output_norm``: :func:`draft_globals_check`) and of the trunk's model (:func:`target_fit_check`).

    Raises:
        ParameterError: ``standalone``, or the trunk carries a NextN block (a composite).
        IncompatibleDraftError: a sidecar that is not MTP-only, not loadable alone, or of another model.
    """
    if standalone:
        raise ParameterError("standalone publishes one MTP-only draft, but this folder holds a trunk and its "
                             f"{SIDECAR_KEYWORD} sidecars (publish them without standalone)", trunk.name, "standalone")
    if trunk.nextn_predict_layers:
        raise ParameterError(
            f"carries a NextN block ({trunk.arch_key('{arch}.nextn_predict_layers')} {trunk.nextn_predict_layers}): "
            f"a composite, not a trunk for {SIDECAR_KEYWORD} sidecars; publish it alone, or the trunk it was made from "
            "beside the sidecars", trunk.name)
    for sidecar in sidecars:
        problems, _ = target_fit_check(trunk, sidecar.first, sidecar.headers)
        if not problems and sidecar.trunk_block_count != trunk.block_count:
            problems.append(f"its head follows {sidecar.trunk_block_count} trunk blocks, the trunk has "
                            f"{trunk.block_count}")
        if not is_mtp_only(read_block_layout(sidecar.first), sidecar.block_indices()):
            problems.insert(0, "not an MTP-only sidecar (it holds trunk blocks)")
        elif not draft_globals_check(sidecar.first, sidecar.headers).sidecar:
            problems.insert(0, "no token_embd/output_norm of its own: llama.cpp cannot load it as a sidecar")
        if problems:
            raise IncompatibleDraftError(f"does not fit the trunk {trunk.name}: {'; '.join(problems)}", sidecar.name)


def _check_sidecar_folder(folder: str | None, target_first: str) -> None:
    """Refuse a sidecar folder that is neither the target's folder nor a parent of it."""
    target_folder = target_first.rsplit("/", 1)[0] if "/" in target_first else ""
    inside = folder is None or target_folder == folder or target_folder.startswith(f"{folder}/")
    if not inside:
        raise HubError(
            f"path_in_repo {folder!r} is not the folder of the target file {target_first!r} nor a parent of it: "
            f"llama-server -hf finds a sidecar only there (use path_in_repo {target_folder or '(the root)'!r})"
        )


def compare_remote(
    files: Sequence[FileDigest],
    card: bytes | None,
    remote: Mapping[str, hub.RemoteFile],
    *,
    names: Sequence[str] | None = None,
    card_path: str = CARD_NAME,
) -> list[RemoteCheck]:
    """Compare local files (and the card, when given) with what the Hub reports (pure).

    ``names`` are the files' paths in the repo (default: their names) and ``card_path`` the card's.
    Sizes are always compared; sha256 where the Hub reports one (LFS / Xet files); for the card, a plain
    git file, its git blob id.
    """
    shown = names if names is not None else [f.name for f in files]
    checks = [_compare_file(f, name, remote.get(name)) for f, name in zip(files, shown)]
    if card is not None:
        checks.append(_compare_card(card, card_path, remote.get(card_path)))
    return checks


def _compare_file(f: FileDigest, name: str, r: hub.RemoteFile | None) -> RemoteCheck:
    """One file against the Hub's record: its size, and its sha256 where the Hub reports one."""
    if r is None:
        return RemoteCheck(name, f.size, None, f.sha256, None, False, "not on the Hub after the upload")
    if r.size != f.size:
        return RemoteCheck(name, f.size, r.size, f.sha256, r.sha256, False,
                           f"size on the Hub {r.size:,} bytes, local {f.size:,}")
    if r.sha256 is not None and r.sha256 != f.sha256:
        return RemoteCheck(name, f.size, r.size, f.sha256, r.sha256, False,
                           f"sha256 on the Hub {r.sha256}, local {f.sha256}")
    detail = "size and sha256 match" if r.sha256 else "size matches (the Hub reports no sha256)"
    return RemoteCheck(name, f.size, r.size, f.sha256, r.sha256, True, detail)


def _compare_card(card: bytes, card_path: str, r: hub.RemoteFile | None) -> RemoteCheck:
    """The card against the Hub's record: its size, and its git blob id (a plain git file has no sha256)."""
    if r is None:
        return RemoteCheck(card_path, len(card), None, None, None, False, "not on the Hub after the upload")
    if r.size != len(card) or (r.blob_id is not None and r.sha256 is None and r.blob_id != git_blob_sha1(card)):
        return RemoteCheck(card_path, len(card), r.size, None, r.sha256, False,
                           "the model card on the Hub differs from the one uploaded")
    return RemoteCheck(card_path, len(card), r.size, None, r.sha256, True, "matches")


def _digests(paths: Sequence[Path], known: Mapping[str, FileDigest] | None, progress: bool) -> list[FileDigest]:
    """sha256 of each file, reusing a caller's digest whose path and size still match."""
    known = known or {}
    result: dict[Path, FileDigest] = {}
    todo = []
    for p in paths:
        d = known.get(str(p)) or known.get(p.name)
        if d is not None and p.stat().st_size == d.size:
            result[p] = FileDigest(p, d.size, d.sha256)
        else:
            todo.append(p)
    if todo:
        for d in digest_files(todo, progress=progress, desc="sha256"):
            result[d.path] = d
    return [result[p] for p in paths]


def _staging_folder(model_folder: Path) -> tuple[Path, bool]:
    """A fresh staging folder (its old links removed, the upload's resume cache kept); and whether
    hard links can be used (same file system as the shards)."""
    staging = model_folder / STAGING_NAME
    try:
        staging.mkdir(exist_ok=True)
    except OSError:
        return Path(tempfile.mkdtemp(prefix="gguf-mtp-publish-")), False
    if staging.is_symlink():  # not the folder we made: never empty a folder a link points to
        return Path(tempfile.mkdtemp(prefix="gguf-mtp-publish-")), False
    for entry in staging.iterdir():
        if entry.name == _RESUME_CACHE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return staging, True


def _stage(files: Sequence[Path], card: bytes, names: Sequence[str], card_path: str) -> Path:
    """The staging folder laid out as the repo: a link per file at its repo path, and the card."""
    staging, same_fs = _staging_folder(files[0].parent)
    for f, name in zip(files, names):
        link = staging / name
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not same_fs:
                raise OSError
            os.link(f, link)
        except OSError:
            os.symlink(f.resolve(), link)
    (staging / card_path).parent.mkdir(parents=True, exist_ok=True)
    fd = create_exclusive(staging / card_path)
    try:
        write_all(fd, card)
    finally:
        os.close(fd)
    return staging


@dataclass(frozen=True)
class _Upload:
    """One upload's fixed parts: the report it fills, the Hub, the staging folder, the card and the message."""

    report: PublishReport
    api: HubApi
    token: str | None
    staging: Path
    card: bytes
    message: str

    @property
    def plan(self) -> PublishPlan:
        return self.report.plan

    def copies(self) -> list[tuple[str, str]]:
        """``(source path, repo path)`` of every file copied on the Hub's side."""
        return [(t.source_path, t.name) for t in self.report.transfers if t.how == "copied" and t.source_path]

    def uploads(self) -> list[str]:
        """The repo paths of every file uploaded (neither copied nor already held)."""
        return [t.name for t in self.report.transfers if t.how == "uploaded"]

    def remote(self, names: Sequence[str]) -> dict[str, hub.RemoteFile]:
        """The Hub's record of ``names`` now."""
        return hub.remote_files(self.api, self.plan.repo, names, token=self.token, revision=self.plan.revision)

    def one_commit(self, names: Sequence[str], message: str) -> str | None:
        """Upload ``names`` from staging as one commit; its URL."""
        return hub.upload_one_commit(self.api, self.plan.repo, self.staging, [_exact(n) for n in names],
                                     token=self.token, revision=self.plan.revision, message=message)


def _upload(
    report: PublishReport, hub_api: HubApi, token: str | None, staging: Path, card_bytes: bytes, message: str
) -> None:
    """Copy what the source repo holds, upload the rest (one commit, or resumably with the card last); record the
    checks of every file against the Hub's record."""
    upload = _Upload(report, hub_api, token, staging, card_bytes, message)
    if report.plan.mode == "one-commit":
        _upload_one_commit(upload)
    else:
        _upload_resumably(upload)


def _upload_one_commit(upload: _Upload) -> None:
    """Every file and the card in one commit (copies and uploads together), then checked on the Hub."""
    report, plan = upload.report, upload.plan
    copies, sent = upload.copies(), [*upload.uploads(), plan.card_path]
    if copies:
        report.commit_url = _commit_copies(report, upload.api, upload.token, copies, sent, upload.staging,
                                           upload.message)
        report.upload_method = "create_commit"
    else:
        report.commit_url = upload.one_commit(sent, upload.message)
        report.upload_method = "upload_folder"
    remote = upload.remote([*plan.names_in_repo, plan.card_path])
    report.checks = compare_remote(report.files, upload.card, remote, names=plan.names_in_repo,
                                   card_path=plan.card_path)


def _upload_resumably(upload: _Upload) -> None:
    """The files resumably (any earlier card removed first), checked on the Hub; the card last, only if they match."""
    from gguf_mtp._version import __version__

    report, plan = upload.report, upload.plan
    _remove_earlier_card(upload)
    copies, uploads = upload.copies(), upload.uploads()
    if copies:
        _commit_copies(report, upload.api, upload.token, copies, [], upload.staging, upload.message)
    if uploads:
        report.upload_method = hub.upload_resumable(
            upload.api, plan.repo, upload.staging, [_exact(n) for n in uploads], token=upload.token,
            revision=plan.revision, private=plan.private, message=upload.message,
        )
    else:
        report.upload_method = "create_commit" if copies else None
    report.checks = compare_remote(report.files, None, upload.remote(plan.names_in_repo), names=plan.names_in_repo)
    if not all(c.ok for c in report.checks):
        report.notes.append(f"{plan.card_path} was not uploaded because the files on the Hub do not match")
        return
    report.commit_url = upload.one_commit([plan.card_path], f"Add the model card (gguf-mtp {__version__})")
    report.checks += compare_remote([], upload.card, upload.remote([plan.card_path]), card_path=plan.card_path)


def _remove_earlier_card(upload: _Upload) -> None:
    """An earlier card would make a half-uploaded set look complete: remove it first (the new one is added last)."""
    from gguf_mtp._version import __version__

    plan, card_path = upload.plan, upload.plan.card_path
    if card_path not in upload.remote([card_path]):
        return
    hub.delete_remote_file(
        upload.api, plan.repo, card_path, token=upload.token, revision=plan.revision,
        message=f"Remove the model card while new files are uploaded (gguf-mtp {__version__})",
    )
    upload.report.notes.append(f"removed the earlier {card_path} before uploading; the new one was added last")


def _commit_copies(
    report: PublishReport,
    hub_api: HubApi,
    token: str | None,
    copies: Sequence[tuple[str, str]],
    uploads: Sequence[str],
    staging: Path,
    message: str,
) -> str | None:
    """One commit: ``copies`` made on the Hub's side from the pinned source commit, ``uploads`` from staging."""
    assert report.copy_source is not None  # a transfer is "copied" only with a source
    source, commit = report.copy_source
    return hub.commit_with_copies(
        hub_api,
        report.plan.repo,
        source=source,
        source_commit=commit,
        copies=copies,
        uploads=[(n, staging / n) for n in uploads],
        token=token,
        revision=report.plan.revision,
        message=message,
    )


#: At most this many ``.gguf`` files of a copy source are compared (one listing call for all of them).
MAX_SOURCE_FILES = 4096


def _source_listing(
    api: HubApi, source: CopySource, token: str | None
) -> tuple[tuple[str, str], dict[str, hub.RemoteFile]]:
    """``(repo, commit)`` of ``source`` pinned now, and the Hub's record of its ``.gguf`` files at that commit.

    Raises:
        HubError: the Hub cannot be asked, or the source holds more than :data:`MAX_SOURCE_FILES` ``.gguf`` files.
    """
    commit = hub.resolve_commit(api, source.repo, token=token, revision=source.revision)
    names = [n for n in hub.list_repo_files(api, source.repo, token=token, revision=commit) if n.endswith(".gguf")]
    if len(names) > MAX_SOURCE_FILES:
        raise HubError(
            f"holds {len(names):,} .gguf files, more than the {MAX_SOURCE_FILES:,} a copy source may hold "
            "(publish without copy_from to upload every file)",
            f"{source.repo}@{commit}",
            parameter="copy_from",
        )
    return (source.repo, commit), hub.remote_files(api, source.repo, names, token=token, revision=commit)


def check_card_replaceable(
    api: HubApi, repo: str, *, token: str | None, revision: str | None, replace_readme: bool = False
) -> str | None:
    """Make sure publishing may replace ``repo``'s ``README.md``: it is missing, or a card gguf-mtp wrote
    (:func:`~gguf_mtp.release.card.is_gguf_mtp_card`), or ``replace_readme`` says to replace whatever is there.

    Returns:
        A note when a ``README.md`` gguf-mtp did not write will be replaced (``replace_readme``), else ``None``.

    Raises:
        HubError: the repo has a ``README.md`` gguf-mtp did not write and ``replace_readme`` is not set, or
            the Hub cannot be asked.
    """
    where = repo + (f"@{revision}" if revision else "")
    existing = hub.remote_files(api, repo, [CARD_NAME], token=token, revision=revision).get(CARD_NAME)
    if existing is None:
        return None
    if existing.size <= CARD_MAX_BYTES:
        text = hub.read_remote_text(api, repo, CARD_NAME, token=token, revision=revision)
        if is_gguf_mtp_card(text):
            return None
    if not replace_readme:
        raise HubError(
            f"{CARD_NAME} exists and was not written by gguf-mtp; publishing would replace it with the model card "
            "(pass replace_readme to replace it)",
            where,
            parameter="replace_readme",
        )
    return f"the {CARD_NAME} on the Hub was not written by gguf-mtp; it is replaced, as asked"


def _transfers(
    plan: PublishPlan, files: Sequence[FileDigest], options: PublishOptions, api: HubApi | None, token: str | None
) -> tuple[tuple[str, str] | None, list[FileTransfer]]:
    """The pinned copy source (when ``copy_from`` is given) and how each file reaches the repo
    (:func:`plan_transfers`); a dry run reads the source's listing but not the destination's."""
    copy_source: tuple[str, str] | None = None
    source_files: dict[str, hub.RemoteFile] = {}
    held: dict[str, hub.RemoteFile] = {}
    if api is not None and options.copy_from is not None:
        copy_source, source_files = _source_listing(api, options.copy_from, token)
    if api is not None and not options.dry_run:
        held = hub.remote_files(api, plan.repo, plan.names_in_repo, token=token, revision=plan.revision)
    transfers = plan_transfers(
        files,
        plan.names_in_repo,
        _why_new(plan),
        source=f"{copy_source[0]}@{copy_source[1]}" if copy_source else None,
        source_files=source_files,
        held=held,
        can_copy=hub.server_copy_supported(),
    )
    return copy_source, transfers


def _why_new(plan: PublishPlan) -> list[str]:
    """:func:`why_new_files` for every file of ``plan``: the model's, then each sidecar's (the head itself)."""
    model = why_new_files(plan.model, plan.standalone, trunk=bool(plan.sidecars))
    return model + [why for s in plan.sidecars for why in why_new_files(s, standalone=True)]


def _upload_size(
    plan: PublishPlan, files: Sequence[FileDigest], transfers: Sequence[FileTransfer], card_size: int
) -> UploadSize:
    """The bytes each way reaches the repo; only uploaded files (and the card) count as uploaded."""
    beyond = _bytes_beyond_target_per_file(plan, files)
    uploaded = [i for i, t in enumerate(transfers) if t.how == "uploaded"]
    return UploadSize(
        sum(files[i].size for i in uploaded) + card_size,
        sum(beyond[i] for i in uploaded) + card_size,
        copied_bytes=sum(t.size for t in transfers if t.how == "copied"),
        unchanged_bytes=sum(t.size for t in transfers if t.how == "unchanged"),
    )


def _bytes_beyond_target_per_file(plan: PublishPlan, files: Sequence[FileDigest]) -> list[int]:
    """Each file's bytes that are not the target's: none of an untouched trunk's, all of a head's (a sidecar, a
    standalone draft), a composite shard's header and NextN block."""
    if plan.sidecars:
        return [0] * len(plan.model.headers) + [f.size for f in files[len(plan.model.headers):]]
    return [f.size for f in files] if plan.standalone else _bytes_beyond_target_per_shard(plan.model)


def _check_bench_is_of(bench: BenchSummary, first_file: str) -> None:
    """A bench report shown in the card must have measured these files (the model or its sidecar, by name)."""
    measured = {os.path.basename(bench.model)} | ({os.path.basename(bench.draft)} if bench.draft else set())
    if first_file not in measured:
        raise ParameterError(
            f"bench measured {', '.join(sorted(measured))}, not the published {first_file}", parameter="bench"
        )


def publish(
    outdir: str | os.PathLike[str],
    repo: str,
    *,
    private: bool = False,
    revision: str | None = None,
    dry_run: bool = False,
    api: HubApi | None = None,
    provenance: Provenance | None = None,
    digests: Mapping[str, FileDigest] | None = None,
    upload_mode: str = "auto",
    one_commit_max_bytes: int = ONE_COMMIT_MAX_BYTES,
    one_commit_max_files: int = ONE_COMMIT_MAX_FILES,
    progress: bool = True,
    token: str | None = None,
    standalone: bool = False,
    path_in_repo: str | None = None,
    bench: BenchSummary | None = None,
    replace_readme: bool = False,
    copy_from: CopySource | str | None = None,
) -> PublishReport:
    """Upload every file of the composite in ``outdir`` and a generated model card to ``repo``.

    The keywords but ``api``, ``token`` and ``digests`` are the fields of one :class:`PublishOptions`, each
    documented there (``copy_from`` may also be given as ``REPO[@REV]``); they are built into it here and passed
    down (:func:`run` takes that object, as the command line and the pipeline do).

    Args:
        outdir: the folder holding the composite (exactly one model), or any of its files.
        api: an ``HfApi``-like object (default: a real one holding the token).
        digests: already-known sha256 by path or file name (reused when the size still matches).
        token: the Hub token (default: ``HF_TOKEN``, else the stored login).

    Returns:
        A :class:`PublishReport` (its ``checks`` compare every uploaded file with the Hub's record).

    Raises:
        HubError: bad repo id, offline, no token, token refused or read-only, no write access, a
            ``README.md`` gguf-mtp did not write (without ``replace_readme``; these are raised before any
            hashing or uploading), an upload failed, or the Hub's record of an uploaded file
            disagrees with the local file.
        BadGGUFError, ShardSetError: ``outdir`` does not hold exactly one complete model.
        NoNextNBlockError: the model has no NextN block (and no sidecar beside it).
        ParameterError: the model is an MTP-only draft without ``standalone``, or a whole model with it; or
            ``bench`` measured other files; or a composite lies beside sidecars.
        IncompatibleDraftError: a sidecar beside the trunk is not one llama.cpp loads beside it.

    Example:
        >>> report = publish("out/", "me/Model-GGUF-MTP", dry_run=True)  # doctest: +SKIP
        >>> print(report.card)  # doctest: +SKIP
    """
    options = PublishOptions(
        repo=repo, revision=revision, private=private, dry_run=dry_run, provenance=provenance or Provenance(),
        upload_mode=upload_mode, one_commit_max_bytes=one_commit_max_bytes, one_commit_max_files=one_commit_max_files,
        progress=progress, standalone=standalone, path_in_repo=path_in_repo, bench=bench,
        replace_readme=replace_readme,
        copy_from=CopySource.parse(copy_from) if isinstance(copy_from, str) else copy_from,
    )
    return run(outdir, options, api=api, token=token, digests=digests)


def run(
    outdir: str | os.PathLike[str],
    options: PublishOptions,
    *,
    api: HubApi | None = None,
    token: str | None = None,
    digests: Mapping[str, FileDigest] | None = None,
) -> PublishReport:
    """:func:`publish` with its options as one object (the command line builds it once from its flags).

    ``api``, ``token`` and ``digests`` as :func:`publish` takes them; returns and raises as :func:`publish`.
    """
    started = time.perf_counter()
    model, sidecars = find_models(outdir)
    plan = plan_publish(model, options, sidecars)
    if options.bench is not None:
        _check_bench_is_of(options.bench, plan.files[0].name)
    access = None if options.dry_run else _check_access(plan, options, api, token)
    files = _digests(plan.files, digests, options.progress)
    card = _card(plan, files, options)
    hub_api, token = (access.api, access.token) if access is not None else _source_reader(options, api, token)
    copy_source, transfers = _transfers(plan, files, options, hub_api, token)
    report = PublishReport(plan, options.dry_run, files, card, user=access.user if access else None,
                           transfers=transfers, copy_source=copy_source)
    report.upload = _upload_size(plan, files, transfers, len(card.encode()))
    if copy_source is not None and not hub.server_copy_supported():
        report.notes.append(
            f"huggingface_hub {_hub_version()} cannot copy files between repos on the Hub's side "
            f"({hub.SERVER_COPY_SINCE} and later can): files identical to {copy_source[0]}'s are uploaded"
        )
    if access is not None:
        _send(report, access)
    report.seconds = time.perf_counter() - started
    return report


@dataclass(frozen=True)
class _Access:
    """The Hub as a real (not dry) run uses it: the api holding the token, the user, and the note a replaced
    ``README.md`` gets."""

    api: HubApi
    token: str
    user: str | None
    replaced: str | None


def _check_access(plan: PublishPlan, options: PublishOptions, api: HubApi | None, token: str | None) -> _Access:
    """Before anything is hashed: online, a token, write access to the repo, and a ``README.md`` it may replace.

    Raises:
        HubError: offline, no token, no write access, or a ``README.md`` gguf-mtp did not write.
    """
    repo = options.repo
    token = token or hub_access.resolve_token()
    hub_access.require_online(f"publish to {repo}")
    if not token:
        raise HubError(f"cannot publish to {repo}: no Hugging Face token (set HF_TOKEN or run `hf auth login`)")
    hub_api = hub.make_api(api, token=token)
    user = hub.check_write_access(hub_api, repo, token=token, private=options.private, revision=plan.revision)
    replaced = check_card_replaceable(
        hub_api, repo, token=token, revision=plan.revision, replace_readme=options.replace_readme
    )
    return _Access(hub_api, token, user, replaced)


def _source_reader(
    options: PublishOptions, api: HubApi | None, token: str | None
) -> tuple[HubApi | None, str | None]:
    """A dry run's Hub: only to read the copy source's listing (``None`` without ``copy_from``)."""
    if options.copy_from is None:
        return None, token
    token = token or hub_access.resolve_token()
    return hub.make_api(api, token=token), token


def _card(plan: PublishPlan, files: Sequence[FileDigest], options: PublishOptions) -> str:
    """The model card of the published files: the sidecar's facts when there are sidecars, else the model's."""
    from gguf_mtp._version import __version__

    return render_model_card(CardRequest(
        repo=options.repo,
        files=files,
        facts=ModelFacts.from_model(plan.sidecars[0] if plan.sidecars else plan.model),
        provenance=options.provenance,
        version=__version__,
        standalone=options.standalone,
        names=plan.names_in_repo,
        path_in_repo=plan.path_in_repo,
        bench=options.bench,
        pairings=plan.pairings,
    ))


def _send(report: PublishReport, access: _Access) -> None:
    """Stage the files and the card, upload them, and refuse a Hub record that does not match what was sent.

    Raises:
        HubError: an upload failed, or the Hub's record of a file disagrees with the local file.
    """
    from gguf_mtp._version import __version__

    plan = report.plan
    if access.replaced:
        report.notes.append(access.replaced)
    card_bytes = report.card.encode()
    names = plan.names_in_repo
    staging = _stage(plan.files, card_bytes, names, plan.card_path)
    what = "MTP draft" if plan.standalone else "trunk and MTP sidecars" if plan.sidecars else "GGUF with MTP head"
    message = f"Upload {plan.model.arch} {what} ({len(names)} file(s), gguf-mtp {__version__})"
    _upload(report, access.api, access.token, staging, card_bytes, message)
    bad = [c for c in report.checks if not c.ok]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        held = "" if plan.mode == "one-commit" else f"; {plan.card_path} was not uploaded"
        raise HubError(f"after the upload, {bad[0].name} on the Hub does not match: {bad[0].detail}{more}{held}",
                       plan.repo)
    shutil.rmtree(staging, ignore_errors=True)
