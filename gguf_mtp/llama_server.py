"""A llama-server binary, as it describes itself: its ``--help`` (the options it takes, whether it drafts with an MTP
head, whether it drafts by sampling) and its ``--version``.

These are facts about the user's llama.cpp build, asked of it before anything runs: ``bench`` reads them before it
starts a server (:mod:`gguf_mtp.server`), ``accept --spec-draft-sampling probabilistic`` before it predicts
(:mod:`gguf_mtp.check.accept_sampling`), so they sit below both.

llama.cpp's ``common_arg::to_string`` prints one option per entry: its spellings on a line that starts in column 0
(``-hf,   -hfr, --hf-repo <user>/<model>[:quant]``), then the value hint, then the help text, indented, ending with
``(env: LLAMA_ARG_...)`` when an environment variable sets the same thing (:func:`parse_help`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gguf_mtp.errors import LlamaServerError
from gguf_mtp.text import printable

__all__ = ["BUILD_HINT", "MAX_ANSWER_BYTES", "PROBE_TIMEOUT_SECONDS", "SPEC_DRAFT_SAMPLING", "ServerOption",
           "offers_probabilistic", "parse_help", "probe_server", "server_build"]

#: Seconds ``--help`` may take.
PROBE_TIMEOUT_SECONDS = 60.0
#: The most bytes read from ``--help`` or from one HTTP answer.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: Where a llama-server that runs MTP comes from: the first llama.cpp release whose ``--spec-type`` has
#: ``draft-mtp``, built by cmake as llama.cpp's docs/build.md says; a user without one may have no checkout of
#: gguf-mtp (scripts/build_llama_tools.py, behind ``make tools``, is not installed), hence llama.cpp's own build.
BUILD_HINT = ("llama.cpp b11025 or later: `cmake -B build && cmake --build build --target llama-server` in its "
              "checkout makes build/bin/llama-server; in a gguf-mtp checkout `make tools` builds one and prints "
              "its path")
#: llama-server's option for sampled drafts verified by rejection (llama.cpp b11434's ``common/arg.cpp``; not in
#: 0c1e570): ``--spec-draft-sampling {greedy,probabilistic}``.
SPEC_DRAFT_SAMPLING = "--spec-draft-sampling"

_OPTION_LINE = re.compile(r"(-[\w.-]+(?:,\s*-[\w.-]+)*)")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")


def probe_server(binary: str) -> str:
    """Check that ``binary`` is llama-server and knows ``--spec-type draft-mtp``, from its ``--help``; that text.

    Raises:
        LlamaServerError: not an executable file, not llama-server, or too old for MTP (one line).
    """
    path = Path(binary)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise LlamaServerError("server: not an executable file", binary, "server")
    try:
        proc = subprocess.run(
            [binary, "--help"], stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise LlamaServerError(
            f"'--help' did not finish in {PROBE_TIMEOUT_SECONDS:.0f} s: not llama-server?", binary, "server"
        ) from None
    except OSError as e:
        raise LlamaServerError(f"cannot run: {e.strerror}", binary, "server") from None
    text = (proc.stdout[:MAX_ANSWER_BYTES] + proc.stderr[:MAX_ANSWER_BYTES]).decode("utf-8", "replace")
    if not all(flag in text for flag in ("--port", "--host", "--model")):
        raise LlamaServerError("not llama-server: its --help lists no --model, --host and --port", binary, "server")
    if "--spec-type" not in text or "draft-mtp" not in text:
        raise LlamaServerError(
            f"llama-server too old for MTP: its --help has no '--spec-type draft-mtp' (needed: {BUILD_HINT})",
            binary,
            "server",
        )
    return text


def server_build(binary: str) -> str | None:
    """The build ``binary`` (llama-server) says it is, from its ``--version`` (``version: 0.5.0-dev (build 1, commit
    0c1e570)``): that line without its label, or ``None`` when it prints none."""
    try:
        proc = subprocess.run([binary, "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=PROBE_TIMEOUT_SECONDS)
    except (subprocess.TimeoutExpired, OSError):
        return None
    text = (proc.stdout[:MAX_ANSWER_BYTES] + proc.stderr[:MAX_ANSWER_BYTES]).decode("utf-8", "replace")
    line = next((line for line in text.splitlines() if line.startswith("version:")), None)
    return None if line is None else printable(f"llama-server {line.removeprefix('version:').strip()}")[:200]


@dataclass(frozen=True)
class ServerOption:
    """One option of llama-server: every spelling it accepts, its environment variable, its help text."""

    flags: tuple[str, ...]
    env: str | None
    help: str


def parse_help(text: str) -> tuple[ServerOption, ...]:
    """The options of a llama.cpp program's ``--help`` (``common_arg::to_string``'s layout)."""
    options: list[ServerOption] = []
    flags: tuple[str, ...] | None = None
    lines: list[str] = []

    def close() -> None:
        if flags:
            body = " ".join(lines)
            env = _ENV.search(body)
            options.append(ServerOption(flags, env.group(1) if env else None, body))

    for line in text.splitlines():
        match = _OPTION_LINE.match(line)
        if match and line.startswith("-"):
            close()
            flags = tuple(f.strip() for f in match.group(1).split(","))
            lines = [line[match.end():].strip()]
        elif line.startswith(" ") and flags:
            lines.append(line.strip())
        else:
            close()
            flags, lines = None, []
    close()
    return tuple(options)


def offers_probabilistic(options: Iterable[ServerOption]) -> bool:
    """Whether a llama-server with these options drafts by sampling and verifies by rejection (``--spec-draft-sampling
    probabilistic``, llama.cpp b11434 and later)."""
    return any(SPEC_DRAFT_SAMPLING in o.flags and "probabilistic" in o.help for o in options)
