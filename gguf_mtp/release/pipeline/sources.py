"""What a pipeline run is made from, pinned, and ``--if-changed``: has any of it moved since the last publish?

A run's sources are the head repo and the target repo, each at a commit, the llama.cpp build its proof runs
against and the gguf-mtp that writes the files. Online, a run first resolves each repo's revision to the commit
it points at (:func:`pin_sources`) and uses that commit throughout: a branch that moves mid-run cannot mix two
revisions, and the card records what was really read. The card keeps them as one machine-readable line
(:func:`gguf_mtp.release.card.published_sources`), as ggml-org/convert keeps each source's commit in ``.src_sha``.

``--if-changed`` reads that line from the out repo's card and compares it with the sources now
(:func:`check_sources`, the comparison itself pure: :func:`moved_sources`). Nothing moved: the run stops there,
having downloaded nothing. Something moved: the run goes on, and each move names the stages it makes again
(:data:`AFFECTS`); in a work folder that holds an earlier run's stages, the rest are reused by their keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_mtp.errors import ParameterError
from gguf_mtp.hub import client as hub
from gguf_mtp.hub.hub_api import HubApi

from ..card import published_sources
from .options import PipelineOptions
from .state import STAGES

__all__ = [
    "AFFECTS", "Move", "SourceCheck", "check_sources", "chosen_llama_cpp", "moved_sources", "pin_sources",
    "require_comparable",
]

#: The stages a moved source makes again. The draft is converted for the target (laid out in step with it), so a
#: moved target makes every stage again; a moved head the draft and what follows; another llama.cpp only the
#: proof and the card; another gguf-mtp everything it writes.
AFFECTS: dict[str, tuple[str, ...]] = {
    "head": ("draft", "compose", "verify", "publish"),
    "target": STAGES,
    "llama.cpp": ("verify", "publish"),
    "gguf-mtp": STAGES,
}

#: Each source and the recorded fields that identify it (:meth:`gguf_mtp.release.card.Provenance.sources`).
_FIELDS: dict[str, tuple[str, ...]] = {
    "head": ("head_repo", "head_commit"),
    "target": ("target_repo", "target_commit"),
    "llama.cpp": ("llama_cpp",),
    "gguf-mtp": ("gguf_mtp",),
}


@dataclass(frozen=True)
class Move:
    """One source that is not what the published files were made from."""

    source: str  # a key of AFFECTS
    before: str
    after: str

    def describe(self) -> str:
        return f"{self.source} {self.before} -> {self.after}"


def _shown(sources: dict[str, str | None], source: str) -> str:
    """One source as the lines show it: ``REPO@COMMIT12`` for a repo, the value itself otherwise."""
    values = [sources.get(name) for name in _FIELDS[source]]
    if len(values) == 2:
        repo, commit = values
        return f"{repo or 'not recorded'}@{commit[:12] if commit else 'unknown commit'}"
    return values[0] or "none"


def moved_sources(published: dict[str, str | None], current: dict[str, str | None]) -> list[Move]:
    """The sources whose recorded fields differ between ``published`` and ``current`` (a pure comparison; a
    field the card does not record counts as moved: what it was cannot be proved)."""
    return [
        Move(source, _shown(published, source), _shown(current, source))
        for source, names in _FIELDS.items()
        if any(name not in published or published[name] != current.get(name) for name in names)
    ]


@dataclass(frozen=True)
class SourceCheck:
    """``--if-changed``'s answer: the sources now, what the out repo's card records (``None``: no record), and what
    moved."""

    current: dict[str, str | None]
    published: dict[str, str | None] | None
    moves: list[Move]

    @property
    def nothing_moved(self) -> bool:
        return self.published is not None and not self.moves

    @property
    def stages(self) -> list[str]:
        """The stages to make again, in run order (every stage when nothing was recorded)."""
        if self.published is None:
            return list(STAGES)
        touched = {stage for move in self.moves for stage in AFFECTS[move.source]}
        return [stage for stage in STAGES if stage in touched]

    def line(self, out_repo: str) -> str:
        """What the check found, in one line."""
        if self.published is None:
            return f"{out_repo}'s card records no sources (nothing published yet, or by an older gguf-mtp): making all"
        if self.nothing_moved:
            now = ", ".join(f"{source} {_shown(self.current, source)}" for source in _FIELDS)
            return f"nothing moved: {out_repo} was made from {now}"
        moves = "; ".join(m.describe() for m in self.moves)
        return f"moved: {moves}; making again: {', '.join(self.stages)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "current": self.current,
            "published": self.published,
            "moved": [dataclasses.asdict(m) for m in self.moves],
            "nothing_moved": self.nothing_moved,
            "stages": self.stages,
        }


def _hub_head(options: PipelineOptions) -> bool:
    """Whether the head is a Hub repo (not a local folder: a folder has no commit to pin or compare)."""
    return not Path(options.head_repo).expanduser().is_dir()


def pin_sources(api: HubApi, token: str | None, options: PipelineOptions) -> PipelineOptions:
    """``options`` with the target's and a Hub head's revisions resolved to the commits they point at now.

    Raises:
        HubError: offline, or the Hub cannot be asked.
    """
    target = hub.resolve_commit(api, options.target_repo, token=token, revision=options.target_revision)
    head = options.head_revision
    if _hub_head(options):
        head = hub.resolve_commit(api, options.head_repo, token=token, revision=head)
    return dataclasses.replace(options, target_revision=target, head_revision=head)


def chosen_llama_cpp(llama: bool | None) -> str | None:
    """The llama.cpp build a run's proof runs against (``None``: the run does not load the files with llama.cpp)."""
    from gguf_mtp.check.llama_check import llama_cpp_available, llama_cpp_build

    use = llama_cpp_available() if llama is None else llama
    return llama_cpp_build() if use else None


def require_comparable(options: PipelineOptions) -> str:
    """The out repo whose card ``--if-changed`` compares with, once the options allow a comparison at all.

    Raises:
        ParameterError: no ``out_repo`` (nothing to compare with), or a local head folder (it has no commit).
    """
    if not options.out_repo:
        raise ParameterError("--if-changed compares with what was published: give --out-repo", parameter="if_changed")
    if not _hub_head(options):
        raise ParameterError(f"--if-changed compares commits on the Hub; the head {options.head_repo} is a local "
                             "folder, which has none", parameter="if_changed")
    return options.out_repo


def check_sources(api: HubApi, token: str | None, pinned: PipelineOptions) -> SourceCheck:
    """Compare the sources of a run with ``pinned`` options (:func:`pin_sources`) with what ``out_repo``'s card
    records. Reads the card and nothing else from the Hub.

    Raises:
        ParameterError: no ``out_repo`` (nothing to compare with), or a local head folder (it has no commit).
        HubError: the Hub cannot be asked.
    """
    from gguf_mtp._version import __version__

    from ..card import Provenance
    from ..publish import CARD_MAX_BYTES, CARD_NAME

    repo = require_comparable(pinned)
    current = Provenance(target_repo=pinned.target_repo, target_revision=pinned.target_revision,
                         head_source=pinned.head_repo, head_revision=pinned.head_revision,
                         llama_cpp_build=chosen_llama_cpp(pinned.llama)).sources(__version__)
    card = hub.remote_files(api, repo, [CARD_NAME], token=token, revision=pinned.out_revision).get(CARD_NAME)
    published = None
    if card is not None and card.size <= CARD_MAX_BYTES:
        text = hub.read_remote_text(api, repo, CARD_NAME, token=token, revision=pinned.out_revision)
        published = published_sources(text)
    moves = moved_sources(published, current) if published is not None else []
    return SourceCheck(current, published, moves)
