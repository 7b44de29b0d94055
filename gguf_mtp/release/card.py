"""The model card (``README.md``) published with a composite: a pure function of what is published.

It says what the files are (the target quant with its MTP head spliced in as its final block), where
each part came from (target repo, revision and file names; the head's source), which gguf-mtp wrote
them, each file's size and sha256, the llama.cpp release that runs the NextN block, and the exact
``llama-server`` command. The YAML front matter is written by ``huggingface_hub.ModelCardData``; the
line after it, :data:`CARD_MARKER`, is how ``publish`` tells a card of ours (which it replaces) from a
``README.md`` someone else wrote (which it replaces only when told to: :func:`is_gguf_mtp_card`).

Every interpolated string (the model's ``general.name``, file names, provenance) is escaped: it can add
no heading, table row, link or HTML of its own (:func:`~gguf_mtp.text.markdown_code`), and every
argument of a shell command is quoted with :func:`shlex.quote` (a file called ``x;curl evil|sh`` stays one
argument). Links go only to Hub repos whose ids pass the Hub's own validation.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gguf import Keys

from gguf_mtp.files.digests import FileDigest
from gguf_mtp.model.shards import ShardSet
from gguf_mtp.text import markdown_code, markdown_text, printable

if TYPE_CHECKING:
    from gguf_mtp.jobs.sidecar_pairing import TrunkPairing
    from gguf_mtp.server.bench_rules import BenchSummary

__all__ = [
    "CARD_MARKER",
    "LLAMA_CPP_MIN_RELEASE",
    "SOURCES_LINE",
    "CardRequest",
    "ModelFacts",
    "Provenance",
    "bench_section",
    "draft_command",
    "is_gguf_mtp_card",
    "llama_cpp_requirement",
    "published_sources",
    "render_model_card",
    "serve_command",
]

#: The first llama.cpp release that loads and runs the NextN block of each architecture. Nemotron-H MoE:
#: before b11025 the block's ``ffn_latent_down/up`` were unknown ("wrong number of tensors; expected 781, got 779").
LLAMA_CPP_MIN_RELEASE = {"nemotron_h_moe": "b11025"}

#: How many draft tokens the suggested command lets the MTP head propose per step.
DRAFT_N_MAX = 3

_HF_URL = "https://huggingface.co/"

#: The line after the front matter of every card gguf-mtp renders (an HTML comment: the Hub does not show it).
CARD_MARKER = "<!-- gguf-mtp model card: `gguf-mtp publish` replaces this file; delete this line to keep yours -->"
#: The start of the card's machine-readable record of its sources (:meth:`Provenance.sources`), an HTML comment
#: after :data:`CARD_MARKER`; ``pipeline --if-changed`` reads it back (:func:`published_sources`).
SOURCES_LINE = "<!-- gguf-mtp sources: "
_SOURCES_END = " -->"
#: The provenance row of the cards gguf-mtp rendered before :data:`CARD_MARKER` existed.
_LEGACY_CARD_ROW = "| written by | gguf-mtp "


def is_gguf_mtp_card(text: str) -> bool:
    """Whether ``text`` is a model card gguf-mtp rendered (it holds :data:`CARD_MARKER`, or the provenance
    row of the cards written before the marker existed): ``publish`` may replace it."""
    return CARD_MARKER in text or any(line.startswith(_LEGACY_CARD_ROW) for line in text.splitlines())


@dataclass(frozen=True)
class Provenance:
    """Where a composite came from, as far as the publisher knows it (every field optional)."""

    target_repo: str | None = None
    target_revision: str | None = None  # ideally the commit the files were downloaded at
    target_files: tuple[str, ...] = ()  # paths inside the target repo
    head_source: str | None = None  # Hub repo id or local checkpoint folder of the MTP head
    head_revision: str | None = None
    base_model: str | None = None  # the original model's Hub repo (front matter ``base_model``)
    llama_cpp_build: str | None = None  # the llama.cpp the published files were proved with (None: not loaded)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_repo": self.target_repo,
            "target_revision": self.target_revision,
            "target_files": list(self.target_files),
            "head_source": self.head_source,
            "head_revision": self.head_revision,
            "base_model": self.base_model,
            "llama_cpp_build": self.llama_cpp_build,
        }

    def sources(self, version: str) -> dict[str, str | None]:
        """What a refresh compares with the Hub (``pipeline --if-changed``): each source and its commit, the
        llama.cpp of the proof, and the gguf-mtp ``version`` that wrote the files."""
        return {
            "head_repo": self.head_source,
            "head_commit": self.head_revision,
            "target_repo": self.target_repo,
            "target_commit": self.target_revision,
            "llama_cpp": self.llama_cpp_build,
            "gguf_mtp": version,
        }


def sources_line(sources: dict[str, str | None]) -> str:
    """``sources`` as the card's one-line record: JSON in an HTML comment that no value can close (every ``>`` is
    written as its JSON escape) and no value can break onto another line (JSON escapes newlines)."""
    text = json.dumps(sources, sort_keys=True, ensure_ascii=True).replace(">", "\\u003e")
    return f"{SOURCES_LINE}{text}{_SOURCES_END}"


def published_sources(card: str) -> dict[str, str | None] | None:
    """The sources a card records (:func:`sources_line`), or ``None`` when it records none (a card of an older
    gguf-mtp, someone else's ``README.md``, a line that is not the JSON object of strings gguf-mtp writes)."""
    for line in card.splitlines():
        if not (line.startswith(SOURCES_LINE) and line.endswith(_SOURCES_END)):
            continue
        try:
            record = json.loads(line[len(SOURCES_LINE) : -len(_SOURCES_END)])
        except ValueError:  # JSONDecodeError, or a number too long to convert
            return None
        if not isinstance(record, dict) or not all(v is None or isinstance(v, str) for v in record.values()):
            return None
        return record
    return None


@dataclass(frozen=True)
class ModelFacts:
    """What the card says about the model itself, read from its GGUF headers."""

    architecture: str
    name: str | None
    trunk_blocks: int
    nextn_blocks: int
    tensor_count: int
    nextn_tensors: int
    nextn_types: tuple[str, ...] = field(default=())
    nextn_bytes: int = 0  # the NextN tensors' data (the head's size as published)
    base_model: str | None = None  # a huggingface.co repo the GGUF names as its base model
    license: str | None = None

    @property
    def first_nextn_block(self) -> int:
        return self.trunk_blocks

    @classmethod
    def from_model(cls, model: ShardSet) -> ModelFacts:
        """Read the facts from a model's headers (shard 1 holds the model KVs)."""
        trunk = model.trunk_block_count
        head = [tensor for _, tensor in model.head_tensors()]
        nextn_tensors, nextn_bytes = len(head), sum(t.nbytes for t in head)
        nextn_types = {t.type_name for t in head}
        repo_url = model.get(Keys.General.BASE_MODEL_REPO_URL.format(id=0))
        base = None
        if isinstance(repo_url, str) and repo_url.startswith(_HF_URL):
            base = repo_url[len(_HF_URL) :].strip("/") or None
        name = model.get(Keys.General.NAME)
        license_ = model.get(Keys.General.LICENSE)
        return cls(
            architecture=model.arch,
            name=name if isinstance(name, str) and name else None,
            trunk_blocks=trunk,
            nextn_blocks=model.nextn_predict_layers,
            tensor_count=model.tensor_count,
            nextn_tensors=nextn_tensors,
            nextn_types=tuple(sorted(nextn_types)),
            nextn_bytes=nextn_bytes,
            base_model=base,
            license=license_ if isinstance(license_, str) and license_ else None,
        )


def llama_cpp_requirement(architecture: str) -> str:
    """The llama.cpp release a composite of ``architecture`` needs, in words."""
    release = LLAMA_CPP_MIN_RELEASE.get(architecture)
    if release:
        return f"llama.cpp release {release} or later"
    return f"a llama.cpp release that runs the {architecture} NextN block with `--spec-type draft-mtp`"


def serve_command(first_file: str) -> str:
    """The ``llama-server`` command that serves the composite with its own MTP head as the drafter."""
    return f"llama-server -m {shell_word(first_file)} --spec-type draft-mtp --spec-draft-n-max {DRAFT_N_MAX}"


def draft_command(target_file: str, draft_file: str) -> str:
    """The ``llama-server`` command that serves ``target_file`` with the MTP-only ``draft_file`` as its drafter."""
    return (
        f"llama-server -m {shell_word(target_file)} --spec-draft-model {shell_word(draft_file)} "
        f"--spec-type draft-mtp --spec-draft-n-max {DRAFT_N_MAX}"
    )


#: What the card of a standalone draft calls the target's first file when no ``--target-file`` was given.
TARGET_PLACEHOLDER = "TARGET.gguf"


def shell_word(text: str) -> str:
    """``text`` as one shell argument: printable (no newline can end the command) and quoted."""
    return shlex.quote(printable(text))


def _front_matter(facts: ModelFacts, provenance: Provenance) -> str:
    from gguf_mtp.hub.client import is_repo_id

    # Only ids the Hub accepts: the value comes from a file's general.base_model.0.repo_url or a flag.
    candidates = [r for r in (provenance.base_model, facts.base_model) if r and is_repo_id(r)]
    base_model = candidates[0] if candidates else None
    relation = "quantized" if base_model else None
    if base_model is None and provenance.target_repo and is_repo_id(provenance.target_repo):
        base_model = provenance.target_repo  # a GGUF repo: let the Hub work out the relation
    from huggingface_hub import ModelCardData  # imported here: the Hub stack is not needed for anything else

    data = ModelCardData(
        base_model=base_model,
        base_model_relation=relation,
        library_name="gguf",
        license=printable(facts.license) if facts.license else None,
        pipeline_tag="text-generation",
        tags=["gguf", "mtp", "nextn", "speculative-decoding", "llama.cpp", "gguf-mtp", printable(facts.architecture)],
    )
    return f"---\n{data.to_yaml()}\n---\n"


def _repo_link(repo: str, revision: str | None = None) -> str:
    """A link to a Hub repo (only for an id the Hub's rules accept; anything else is shown as text)."""
    from gguf_mtp.hub.client import is_repo_id

    link = f"[{repo}]({_HF_URL}{repo})" if is_repo_id(repo) else markdown_code(repo)
    return f"{link} at {markdown_code(revision)}" if revision else link


def _proof(llama_cpp_build: str | None) -> str:
    """The card's "proved with" cell: the llama.cpp build that loaded the files and ran their NextN block."""
    if llama_cpp_build is None:
        return "not recorded (not loaded by llama.cpp before publishing)"
    return f"{markdown_code(llama_cpp_build)}: `gguf-mtp verify` loaded the files and ran the NextN block"


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


@dataclass(frozen=True)
class CardRequest:
    """What a model card is rendered from (:func:`render_model_card`): the published files and what is known of them.

    Attributes:
        repo: the Hub repo it is published to (``OWNER/NAME``).
        files: the published GGUF files in shard order, with sizes and sha256.
        facts: what the GGUF headers say (:meth:`ModelFacts.from_model`).
        version: the gguf-mtp version that wrote the files.
        provenance: where the target and the head came from.
        standalone: the files are an MTP-only draft: the card says it is not a model by itself and shows
            the ``llama-server -m TARGET --spec-draft-model DRAFT`` and ``llama-server -hf`` commands.
        names: the files' paths in the repo (default: their names).
        path_in_repo: the repo folder the files are in (default: the root).
        bench: the publisher's ``gguf-mtp bench --json`` report, shown as a table (:func:`bench_section`).
        pairings: the files are a trunk (first) and sidecars (``facts`` are a sidecar's): which sidecar
            ``llama-server -hf`` pairs with the trunk (:func:`~gguf_mtp.jobs.sidecar_pairing.pair_listing`).
    """

    repo: str
    files: Sequence[FileDigest]
    facts: ModelFacts
    version: str
    provenance: Provenance = Provenance()
    standalone: bool = False
    names: Sequence[str] | None = None
    path_in_repo: str | None = None
    bench: BenchSummary | None = None
    pairings: Sequence[TrunkPairing] = ()

    @property
    def paths(self) -> list[str]:
        """The files' paths in the repo."""
        return list(self.names) if self.names is not None else [f.name for f in self.files]

    @property
    def title(self) -> str:
        return self.repo.split("/", 1)[-1]

    @property
    def blocks(self) -> str:
        """The NextN block(s) as Markdown: ```blk.45``` or ```blk.45``..``blk.47```."""
        block, count = self.facts.first_nextn_block, self.facts.nextn_blocks
        return f"`blk.{block}`" if count == 1 else f"`blk.{block}`..`blk.{block + count - 1}`"


def render_model_card(card: CardRequest) -> str:
    """The ``README.md`` for a published composite (or, with ``standalone``, an MTP-only draft; with ``pairings``, an
    untouched trunk and its ``mtp-`` sidecars).

    Returns:
        The card's text: YAML front matter, then Markdown.
    """
    lines = [
        _front_matter(card.facts, card.provenance),
        CARD_MARKER,
        sources_line(card.provenance.sources(card.version)),
        "",
        f"# {markdown_text(card.title)}",
        "",
        _intro(card),
        *_sources_section(card),
        *_files_section(card),
        *_run_section(card),
        *(bench_section(card.bench) if card.bench is not None else []),
        *_check_section(card),
    ]
    return "\n".join(lines)


def _intro(card: CardRequest) -> str:
    """The paragraph under the title: what the files are, and how llama.cpp drafts with the head."""
    facts = card.facts
    what = markdown_code(facts.name) if facts.name else f"A {markdown_code(facts.architecture)} model"
    if card.pairings:
        return (
            f"{what} in GGUF as llama.cpp's own pipeline ships a head: the trunk, its target quant's files unchanged "
            f"(no NextN block), and its multi-token-prediction (MTP / NextN) head, block {card.blocks}, as `mtp-` "
            "sidecar(s) beside it, which llama.cpp loads as the drafter (`--spec-type draft-mtp`)."
        )
    if card.standalone:
        return (
            f"{what} as an MTP-only draft in GGUF: its multi-token-prediction (MTP / NextN) head, block "
            f"{card.blocks}, without the {facts.trunk_blocks} trunk blocks. It is not a model by itself: llama.cpp "
            "loads it beside its target model as the drafter (`--spec-draft-model`)."
        )
    return (
        f"{what} in GGUF with its multi-token-prediction (MTP / NextN) head built in: the head is block "
        f"{card.blocks}, after the {facts.trunk_blocks} trunk blocks, so llama.cpp drafts tokens with it "
        "(`--spec-type draft-mtp`) without a separate draft model." + _unchanged_trunk(card)
    )


def _unchanged_trunk(card: CardRequest) -> str:
    """For a composite of a known target: its trunk's bytes are the target's, and which metadata changed."""
    if not card.provenance.target_repo:
        return ""
    changed_keys = ["`block_count`", "`nextn_predict_layers`", "the per-layer arrays"]
    if len(card.files) > 1:
        changed_keys.append("`split.tensors.count`")
    return (
        " The trunk tensors are byte for byte those of the target quant (nothing was re-quantized); only "
        f"metadata changed ({', '.join(changed_keys)})."
    )


def _sources_section(card: CardRequest) -> list[str]:
    """"Where it comes from": the target quant, its files, the head, the NextN block, the writer and the proof."""
    facts, provenance = card.facts, card.provenance
    types = ", ".join(markdown_text(t) for t in facts.nextn_types) or "-"
    lines = ["", "## Where it comes from", "", "| part | source |", "|---|---|"]
    target = _repo_link(provenance.target_repo, provenance.target_revision) if provenance.target_repo else None
    lines.append(f"| target quant | {target or 'not recorded'} |")
    if provenance.target_files:
        lines.append("| target files | " + "<br>".join(markdown_code(name) for name in provenance.target_files) + " |")
    lines.append(f"| MTP head | {_head_source(provenance)} |")
    return [
        *lines,
        f"| NextN block | {card.blocks}: {facts.nextn_tensors} tensors ({types}), {_human(facts.nextn_bytes)} |",
        f"| written by | gguf-mtp {markdown_text(card.version)} (the `gguf-mtp` command of the Python package "
        "`gguf-mtp`) |",
        f"| proved with | {_proof(provenance.llama_cpp_build)} |",
    ]


def _head_source(provenance: Provenance) -> str:
    """The head's source: a link to its Hub repo, a local folder as code, or "not recorded"."""
    head = provenance.head_source
    if not head:
        return "not recorded"
    looks_like_repo = head.count("/") == 1 and not head.startswith((".", "/", "~"))
    return _repo_link(head, provenance.head_revision) if looks_like_repo else markdown_code(head)


def _files_section(card: CardRequest) -> list[str]:
    """"Files": how many, their tensors and size, and one row per file with its size and sha256."""
    files = card.files
    tensors = "" if card.pairings else f"{card.facts.tensor_count} tensors, "
    return [
        "",
        "## Files",
        "",
        f"{len(files)} file(s), {tensors}{_human(sum(f.size for f in files))} in all.",
        "",
        "| file | size | sha256 |",
        "|---|---:|---|",
        *(f"| {markdown_code(n)} | {f.size:,} bytes ({_human(f.size)}) | `{f.sha256}` |"
          for f, n in zip(files, card.paths)),
    ]


def _run_section(card: CardRequest) -> list[str]:
    """"Run it": for a trunk and its sidecars, for an MTP-only draft, or for a composite."""
    if card.pairings:
        return _run_section_sidecars(card.repo, card.facts, card.pairings)
    first = card.paths[0]
    if card.standalone:
        return _run_section_standalone(card.repo, card.title, first, card.facts, card.provenance, card.path_in_repo)
    return [
        "",
        "## Run it",
        "",
        f"Needs {llama_cpp_requirement(card.facts.architecture)}. Download every file into one folder and point "
        "llama.cpp at the first one; it finds the other shards itself:",
        "",
        "```sh",
        f"hf download {shell_word(card.repo)} --local-dir {shell_word(card.title)}",
        f"cd {shell_word(card.title)}",
        serve_command(first),
        "```",
    ]


def _check_section(card: CardRequest) -> list[str]:
    """"Check it": the files' sums, the check gguf-mtp makes of them, and the measurement of the head."""
    check, measure = _check_commands(card)
    return [
        "",
        "## Check it",
        "",
        "```sh",
        "sha256sum " + " ".join(shell_word(n) for n in card.paths),
        check,
        f"{measure}   # acceptance, tokens/s and the best n-max on your machine",
        "```",
        "",
    ]


def _check_commands(card: CardRequest) -> tuple[str, str]:
    """The ``gguf-mtp`` commands that check the files and measure the head: (check, measure)."""
    paired = next((p for p in card.pairings if p.sidecar), None)
    if paired is not None and paired.sidecar is not None:
        trunk, sidecar = shell_word(paired.trunk), shell_word(paired.sidecar)
        measure = f"gguf-mtp bench {trunk} --draft {sidecar} --server PATH/TO/llama-server"
        return f"gguf-mtp verify {sidecar} --target {trunk}", measure
    first = shell_word(card.paths[0])
    measure = f"gguf-mtp bench {shell_word(TARGET_PLACEHOLDER)} --draft {first}" if card.standalone \
        else f"gguf-mtp bench {first}"
    return f"gguf-mtp {'inspect' if card.standalone else 'verify'} {first}", f"{measure} --server PATH/TO/llama-server"


def bench_section(bench: BenchSummary) -> list[str]:
    """"Measured speed": the publisher's ``gguf-mtp bench`` table (their hardware, their llama-server flags)."""
    flags = " ".join(shell_word(a) for a in bench.server_args)
    lines = [
        "",
        "## Measured speed",
        "",
        f"Measured by the publisher with `gguf-mtp bench` and their own llama-server"
        f"{f' ({markdown_code(flags)})' if flags else ''}: {bench.prompts} prompt(s), up to {bench.tokens} tokens "
        "each, greedy. Tokens/s depend on the hardware; run `gguf-mtp bench` on yours.",
        "",
        "| n-max | acceptance | tokens/s | speed-up |",
        "|---:|---:|---:|---:|",
    ]
    for row in bench.rows:
        acceptance = "-" if row.acceptance is None else f"{row.acceptance:.2f} ({row.draft_n_accepted}/{row.draft_n})"
        speedup = bench.speedup(row)
        lines.append(f"| {'0 (no MTP)' if row.n_max == 0 else row.n_max} | {acceptance} | "
                     f"{row.predicted_per_second:.1f} | {'-' if speedup is None else f'{speedup:.2f}x'} |")
    verdict = "identical" if bench.lossless else "NOT identical"
    lines += ["", f"Greedy output with MTP: {verdict} to the output without it."]
    if bench.recommended_n_max:
        lines[-1] += f" Recommended: `--spec-draft-n-max {bench.recommended_n_max}`."
    elif bench.recommended_n_max == 0:
        lines[-1] += " On that machine MTP did not pay off."
    return lines


def hf_command(repo: str, tag: str | None = None, draft_repo: str | None = None) -> str:
    """``llama-server -hf REPO[:TAG] --spec-type draft-mtp``: llama.cpp downloads the model and, for
    ``draft-mtp``, the ``mtp-*.gguf`` sidecar in the model's folder or a parent of it (``-hfd`` names a
    separate repo holding the sidecar)."""
    model = f"{repo}:{tag}" if tag else repo
    draft = f" -hfd {shell_word(draft_repo)}" if draft_repo else ""
    return f"llama-server -hf {shell_word(model)}{draft} --spec-type draft-mtp --spec-draft-n-max {DRAFT_N_MAX}"


def _run_section_sidecars(repo: str, facts: ModelFacts, pairings: Sequence[TrunkPairing]) -> list[str]:
    """"Run it" for a trunk and its sidecars: the sidecar llama.cpp's ``-hf`` pairs with each trunk, and the command."""
    from gguf_mtp.model.sidecar_names import LLAMA_CPP_BUILD

    lines = [
        "",
        "## Run it",
        "",
        f"Needs {llama_cpp_requirement(facts.architecture)}. `llama-server -hf` downloads the trunk and the `mtp-` "
        "sidecar it pairs with it: the one in the trunk's folder or a parent whose quantization bits are closest to "
        f"the trunk's (llama.cpp {LLAMA_CPP_BUILD}, `common/download.cpp`, `find_best_sibling`):",
        "",
        "| trunk | tag | sidecar llama.cpp picks |",
        "|---|---|---|",
    ]
    lines += [f"| {markdown_code(p.trunk)} | {markdown_code(p.tag) if p.tag else '-'} | "
              f"{markdown_code(p.sidecar) if p.sidecar else p.failure or 'none'} |" for p in pairings]
    lines += ["", "```sh", *(hf_command(repo, p.tag or None) for p in pairings), "```"]
    return lines


def _run_section_standalone(
    repo: str, title: str, first: str, facts: ModelFacts, provenance: Provenance, path_in_repo: str | None = None
) -> list[str]:
    """"Run it" for an MTP-only draft: with ``--spec-draft-model`` (files on disk) and with ``-hf``."""
    target = provenance.target_files[0] if provenance.target_files else TARGET_PLACEHOLDER
    where = f" of {_repo_link(provenance.target_repo)}" if provenance.target_repo else ""
    download = f"hf download {shell_word(repo)} --local-dir {shell_word(title)}"
    if path_in_repo:
        download = f"hf download {shell_word(repo)} {shell_word(first)} --local-dir {shell_word(title)}"
    lines = [
        "",
        "## Run it",
        "",
        f"Needs {llama_cpp_requirement(facts.architecture)}. Download this draft, and the target model{where} "
        f"({markdown_code(target)} is its first file), then give llama.cpp both:",
        "",
        "```sh",
        download,
        draft_command(target, f"{title}/{first}"),
        "```",
    ]
    same_repo = provenance.target_repo == repo or (provenance.target_repo is None and path_in_repo)
    if same_repo:
        tag = path_in_repo.rsplit("/", 1)[-1] if path_in_repo else None
        lines += [
            "",
            "Or let llama.cpp download the model and this sidecar (a file named `mtp-*` in the model's folder "
            "or a parent of it) itself:",
            "",
            "```sh",
            hf_command(repo, tag),
            "```",
        ]
    elif provenance.target_repo:
        lines += [
            "",
            "Or let llama.cpp download the target model and this sidecar itself:",
            "",
            "```sh",
            hf_command(provenance.target_repo, None, repo),
            "```",
        ]
    return lines
