"""The docs hold together: every link of README.md and docs/ leads somewhere, and every page the code cites is one a
reader of this repository can open.

The README is a guide and the reference lives in docs/ (issue 40 item 5); a link left pointing at a section that
moved, or a docstring citing a file outside the repository, is a dead end for the reader. Links inside code blocks
are not links and are not read.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The pages a reader reads: the README and every page of docs/.
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
#: Where docstrings and comments cite pages: the package, the tests and the scripts.
SOURCES = tuple(sorted(p for folder in ("gguf_mtp", "tests", "scripts") for p in (ROOT / folder).rglob("*.py")))
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6}) (.+)$")
#: Notes that lived outside this repository (a folder beside it): spelt in two halves so this file does not cite it.
OUTSIDE_NOTES = "shared/" + "reference"
#: A page of this repository's docs/ cited in a source (llama.cpp's own, "llama.cpp's docs/build.md", are not ours).
_DOCS_CITED = re.compile(r"(?<!llama\.cpp's )\bdocs/[\w./-]+\.md\b")


def _relative(path: Path) -> str:
    """``path`` as the repository names it (a file outside it by its name alone)."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of ``text`` outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces made ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every ``#anchor`` of ``page``'s headings; a repeated heading's later anchors end ``-1``, ``-2``, ..."""
    seen: Counter[str] = Counter()
    found = set()
    for _, line in prose_lines(page.read_text(encoding="utf-8")):
        if heading := _HEADING.match(line):
            base = slug(heading[2])
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of the relative links of ``page`` (web addresses left out)."""
    return [(number, target) for number, line in prose_lines(page.read_text(encoding="utf-8"))
            for target in _LINK.findall(line) if not re.match(r"[a-z]+:", target)]


def dead_links(page: Path) -> list[str]:
    """``page:line: target`` for each link of ``page`` whose file or heading does not exist."""
    dead = []
    for number, target in links(page):
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists() or (anchor and (goal.suffix != ".md" or anchor not in anchors(goal))):
            dead.append(f"{_relative(page)}:{number}: {target}")
    return dead


def test_slug_is_githubs_anchor() -> None:
    assert slug("The head's type: `--outtype`") == "the-heads-type---outtype"
    assert slug("verify — prove a composite is right") == "verify--prove-a-composite-is-right"
    assert slug("MTP architectures by llama.cpp build") == "mtp-architectures-by-llamacpp-build"


def test_a_dead_link_and_a_missing_heading_are_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#a-section) [ok](#page) [gone](missing.md) [moved](other.md#nowhere)\n"
                    "[web](https://example.com)\n\n```sh\n[not a link](nowhere.md)\n```\n")
    assert [d.rpartition(": ")[2] for d in dead_links(page)] == ["missing.md", "other.md#nowhere"]


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_link_of_the_docs_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    assert dead_links(page) == []


def test_no_source_cites_notes_that_are_not_in_the_repository() -> None:
    citing = [f"{_relative(p)}:{n}" for p in SOURCES
              for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE_NOTES in line]
    assert citing == []


def test_every_docs_page_a_source_cites_exists() -> None:
    cited = {(_relative(p), page) for p in SOURCES for page in _DOCS_CITED.findall(p.read_text(encoding="utf-8"))}
    assert [(source, page) for source, page in sorted(cited) if not (ROOT / page).is_file()] == []


def reachable(start: Path) -> set[Path]:
    """The pages reached from ``start`` by following relative links between pages (a folder's link reaches its
    README.md)."""
    seen, todo = set(), [start.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        for _, target in links(page):
            goal = (page.parent / target.partition("#")[0]).resolve()
            todo.append(goal / "README.md" if goal.is_dir() else goal)
    return seen


def test_every_docs_page_is_reached_from_the_readme() -> None:
    orphans = [_relative(p) for p in PAGES if p.resolve() not in reachable(ROOT / "README.md")]
    assert orphans == []
