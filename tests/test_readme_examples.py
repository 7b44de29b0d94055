"""Every output example in README.md and docs/ is what the tool really prints, so the docs cannot drift.

Each ```` ```text ```` block of README.md and of every page under docs/ starts with ``$ COMMAND`` and shows that
command's output. The
test runs the command (``gguf-mtp ...`` and ``python -m gguf_mtp ...`` both as ``python -m gguf_mtp``) on
the demo's files (``python -m gguf_mtp demo --dir DIR`` builds them; the command runs in DIR), and compares
its output, line for line, with the block. Both sides are normalised first: the demo's temporary folder
becomes ``/tmp/gguf-mtp-demo-…``, durations become ``N s``, terminal colours and trailing spaces go. Every
relative link of those pages leads to a file of the repository, and every ``#anchor`` to a heading of its page.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The pages whose examples are run: the README and every page of docs/ (the reference moved there, issue 40 item 5).
PAGES = (README, *sorted((ROOT / "docs").rglob("*.md")))
TEMP_DEMO = "/tmp/gguf-mtp-demo-…"
#: The examples the pages must keep (their first words after ``$``): dropping one is a change to notice.
EXPECTED = ("python -m gguf_mtp demo", "gguf-mtp compose", "gguf-mtp verify", "gguf-mtp accept")

pytestmark = [pytest.mark.llama, pytest.mark.slow]  # the demo and verify print llama.cpp's verdict


@dataclass(frozen=True)
class Example:
    """One output block of a page: the command line after ``$`` and the lines it shows."""

    page: str
    line: int
    command: str
    output: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        words = shlex.split(self.command)
        if words[0] == "gguf-mtp":
            return [sys.executable, "-m", "gguf_mtp", *words[1:]]
        if words[:3] in (["python", "-m", "gguf_mtp"], ["python3", "-m", "gguf_mtp"]):
            return [sys.executable, *words[1:]]
        raise AssertionError(f"{self.page}:{self.line}: cannot run {self.command!r} (gguf-mtp or python -m gguf_mtp)")


def readme_examples(text: str, page: str = "README.md") -> list[Example]:
    """The ```` ```text ```` blocks of a page (``page``: its path, for messages), each as an :class:`Example`."""
    examples = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```text":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            block = lines[start:end]
            if not block or not block[0].startswith("$ "):
                raise AssertionError(f"{page}:{start + 1}: a text block must start with '$ COMMAND'")
            examples.append(Example(page, start + 1, block[0][2:].strip(), tuple(block[1:])))
            i = end
        i += 1
    return examples


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SECONDS = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s)\b")
_TEMP_DEMO = re.compile(r"(?:/[^\s:]+)?/gguf-mtp-demo-[^/\s]+")


def normalise(lines: list[str] | tuple[str, ...], replacements: dict[str, str] | None = None) -> list[str]:
    """Lines with paths replaced (longest first), temporary demo folders and durations made uniform."""
    out = []
    for line in lines:
        line = _ANSI.sub("", line).rstrip()
        for old, new in sorted((replacements or {}).items(), key=lambda kv: -len(kv[0])):
            line = line.replace(old, new)
        line = _TEMP_DEMO.sub(TEMP_DEMO, line)
        out.append(_SECONDS.sub("N s", line))
    while out and not out[-1]:
        out.pop()
    return out


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGUF_MTP_", "HF_"))}
    env.update(TMPDIR=str(tmp), GGUF_MTP_DISABLE_PROGRESS="1", HF_HUB_OFFLINE="1", COLUMNS="200", NO_COLOR="1")
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}"
    return done.stdout.splitlines()


def _relative(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


EXAMPLES = [example for page in PAGES for example in readme_examples(page.read_text(encoding="utf-8"), _relative(page))]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's files (target, head checkpoint, draft, composite), made once."""
    work = tmp_path_factory.mktemp("readme") / "demo"
    _run([sys.executable, "-m", "gguf_mtp", "demo", "--dir", str(work)], work.parent, _env(work.parent))
    return work


def test_readme_keeps_its_examples() -> None:
    commands = [e.command for e in EXAMPLES]
    for prefix in EXPECTED:
        assert any(c.startswith(prefix + " ") or c == prefix for c in commands), (prefix, commands)


def test_normalise_makes_paths_and_timings_uniform() -> None:
    got = normalise(["done in 1.25 s: /var/tmp/x/gguf-mtp-demo-ab_12/target \x1b[32mok\x1b[0m  ", ""],
                    {"/var/tmp/x": "/tmp"})
    assert got == [f"done in N s: {TEMP_DEMO}/target ok"]
    assert normalise(["took 830 ms", "11 checks"]) == ["took N s", "11 checks"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.command.split(" -")[0] for e in EXAMPLES])
def test_readme_example_output_is_the_real_output(example: Example, demo_dir: Path, tmp_path: Path) -> None:
    if example.argv[2:4] == ["gguf_mtp", "demo"] and "--dir" not in example.argv:
        # as a user runs it: a new temporary folder (TMPDIR points into tmp_path, so nothing is left behind)
        got = _run(example.argv, tmp_path, _env(tmp_path))
    else:
        got = _run(example.argv, demo_dir, _env(tmp_path))
    replacements = {str(demo_dir) + "/": "", str(demo_dir): "."}
    where = f"{example.page}:{example.line}: {example.command}"
    assert normalise(got, replacements) == normalise(example.output), where


def test_readme_says_how_to_get_gguf_mtp_on_path_before_first_using_it() -> None:
    """Issue 21 item 13: ``make demo`` installs into .venv; the README says so before its first ``gguf-mtp`` command."""
    lines = README.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("gguf-mtp "))
    before = "\n".join(lines[:first])
    assert ". .venv/bin/activate" in before and ".venv/bin/gguf-mtp" in before
