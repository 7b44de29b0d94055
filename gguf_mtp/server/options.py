"""llama-server's options as its own ``--help`` prints them, and the rules ``bench`` draws from them: the options
bench sets itself (refused in the user's extra arguments under every spelling the server accepts), and the thread
counts of the trunk and the MTP head.

llama.cpp's ``common_arg::to_string`` prints one option per entry: its spellings on a line that starts in column 0
(``-hf,   -hfr, --hf-repo <user>/<model>[:quant]``), then the value hint, then the help text, indented, ending with
``(env: LLAMA_ARG_...)`` when an environment variable sets the same thing. Reading the aliases from there, rather
than from a list of our own, follows the server the user actually has: a spelling added in a later llama.cpp is
refused the day it appears.

Pure: no process. :func:`gguf_mtp.server.process.probe_server` runs ``--help``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gguf_mtp.errors import ParameterError

from .bench_rules import SPEC_DRAFT_SAMPLING

__all__ = [
    "OWNED_OPTIONS",
    "ServerOption",
    "ServerOptions",
    "Threads",
    "check_extra_arguments",
    "choose_threads",
    "option_name",
    "parse_help",
    "pool_share",
    "shared_threads",
]

#: The options bench sets itself, each by one of its spellings (every alias the server prints is refused too):
#: the model and every other source of one (a URL, a Docker or Hugging Face repository and file, for the trunk
#: and the draft), the loopback address and the paths bench asks, and the speculative settings it measures.
OWNED_OPTIONS = (
    "--model",
    "--model-url",
    "--docker-repo",
    "--hf-repo",
    "--hf-file",
    "--host",
    "--port",
    "--api-prefix",
    "--spec-type",
    "--spec-draft-n-max",
    "--spec-draft-model",
    "--spec-draft-hf",
)
#: A preset whose help says this downloads and loads a model of its own choice (``--fim-qwen-7b-spec``...).
_DOWNLOADS = "download weights from the internet"
#: The options that size the trunk's and the draft model's thread pools, by one spelling each.
TRUNK_THREADS = "--threads"
DRAFT_THREADS = "--spec-draft-threads"

_OPTION_LINE = re.compile(r"(-[\w.-]+(?:,\s*-[\w.-]+)*)")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")


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


@dataclass(frozen=True)
class ServerOptions:
    """What bench needs of a llama-server's options: the flags it owns (with their environment variables), the
    spellings of the thread options, and whether ``--metrics`` and probabilistic drafting exist."""

    reserved: frozenset[str]
    reserved_env: frozenset[str]
    trunk_threads: frozenset[str]
    draft_threads: frozenset[str]
    thread_env: frozenset[str]
    metrics: bool
    probabilistic: bool = False  #: it drafts by sampling and verifies by rejection (``--spec-draft-sampling``)

    @classmethod
    def from_help(cls, text: str) -> ServerOptions:
        """Read them from ``--help``; an owned option the help does not print is still refused by that name."""
        options = parse_help(text)

        def spellings(name: str) -> tuple[frozenset[str], frozenset[str]]:
            found = [o for o in options if name in o.flags]
            return (frozenset(f for o in found for f in o.flags) | {name},
                    frozenset(o.env for o in found if o.env))

        reserved: set[str] = set()
        reserved_env: set[str] = set()
        for name in OWNED_OPTIONS:
            flags, env = spellings(name)
            reserved |= flags
            reserved_env |= env
        for option in options:
            if _DOWNLOADS in option.help:
                reserved |= set(option.flags)
        trunk, trunk_env = spellings(TRUNK_THREADS)
        draft, draft_env = spellings(DRAFT_THREADS)
        return cls(
            reserved=frozenset(reserved), reserved_env=frozenset(reserved_env), trunk_threads=trunk | {"-t"},
            draft_threads=draft | {"-td"}, thread_env=trunk_env | draft_env,  # the spellings bench itself gives
            metrics=any("--metrics" in o.flags for o in options),
            probabilistic=any(SPEC_DRAFT_SAMPLING in o.flags and "probabilistic" in o.help for o in options),
        )

    def server_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``environ`` without the variables that would set an option bench owns (``LLAMA_ARG_MODEL_URL``...):
        llama.cpp reads them before the command line, so one left set would still reach the server."""
        return {k: v for k, v in environ.items() if k not in self.reserved_env}


def option_name(arg: str) -> str:
    """The option a server argument names, as llama.cpp looks it up: ``--hf_repo`` is ``--hf-repo``.

    llama.cpp's parser (common/arg.cpp, ``common_params_parse_ex``) replaces every ``_`` with ``-`` in an argument
    that starts with ``--`` (single-dash ones stay as they are) before looking it up, so every underscore spelling
    of a long option reaches the same option. It never splits ``=``; it is split here all the same, so that
    ``--hf_repo=X`` counts as the option it would be to any server that does.
    """
    name = arg.replace("_", "-") if arg.startswith("--") else arg
    return name.split("=", 1)[0]


def check_extra_arguments(extra: Sequence[str], options: ServerOptions) -> None:
    """Refuse extra server arguments that set what bench sets itself, under any spelling (underscores included:
    :func:`option_name`).

    Raises:
        ParameterError: one line naming the flag as given (and as llama-server reads it, when that differs).
    """
    for arg in extra:
        name = option_name(arg)
        if arg.startswith("-") and name in options.reserved:
            given = arg.split("=", 1)[0]
            shown = given if given == name else f"{given} (llama-server's {name})"
            raise ParameterError(
                f"server_args: {shown} is set by bench itself (the model and where it comes from, the loopback "
                "address, the MTP settings)",
                parameter="server_args",
            )


@dataclass(frozen=True)
class Threads:
    """The thread counts of a bench: ``arguments`` bench adds (empty when the user chose), the threads the trunk's
    and the head's pools use in an MTP run, and the free cores they were sized to."""

    arguments: tuple[str, ...]
    draft_arguments: tuple[str, ...]
    trunk: int | None
    head: int | None
    free: int

    @property
    def oversubscribed(self) -> bool:
        """The user's thread counts give the two pools of an MTP run more threads than there are free cores
        (one thread each, the least there is, never counts as too many)."""
        return not self.arguments and self.trunk is not None and self.head is not None \
            and self.trunk + self.head > max(2, self.free)

    def warning(self, remedy: str) -> str | None:
        """The warning for :attr:`oversubscribed` counts (``None`` when they fit); ``remedy`` says how to give
        fewer."""
        if not self.oversubscribed:
            return None
        return (f"threads: an MTP run's two thread pools hold {self.trunk} + {self.head} threads for {self.free} "
                f"free core(s): it may run many times slower than it would with fewer ({remedy})")

    def describe(self, flags: str) -> str:
        """The progress line saying the counts: chosen (``flags`` is how the user gives their own) or given."""
        if not self.arguments:
            return f"threads: as given ({self.free} free core(s))"
        return (f"threads: {' '.join((*self.arguments, *self.draft_arguments))} in every run (an MTP run's two "
                f"thread pools, the trunk's and the head's, get half of the {self.free} free core(s) each, at least "
                f"1; give {flags} to choose)")


def pool_share(free: int) -> int:
    """The threads each of an MTP run's two pools gets of ``free`` cores when the user chose none: half, at
    least 1 (with every core in both, each pool waits on the other)."""
    return max(1, free // 2)


def _given(extra: Sequence[str], flags: frozenset[str], default: int | None) -> int | None:
    """The thread count the last of ``flags`` in ``extra`` sets (``default`` when absent; llama.cpp's
    hardware concurrency for 0 or less); ``None`` when its value is not a number (llama-server refuses it)."""
    found = default
    for i, arg in enumerate(extra):
        _, equals, inline = arg.partition("=")
        if option_name(arg) in flags:
            text = inline if equals else (extra[i + 1] if i + 1 < len(extra) else "")
            value = int(text) if re.fullmatch(r"-?\d{1,6}", text) else None
            found = None if value is None else (value if value > 0 else os.cpu_count() or 1)
    return found


def choose_threads(extra: Sequence[str], options: ServerOptions, free: int, *, draft: bool,
                   environ: Mapping[str, str] | None = None) -> Threads:
    """The threads of the trunk and of the MTP head, so that an MTP run does not oversubscribe the free cores.

    In an MTP run llama-server holds two thread pools: the trunk's and the MTP context's (``-t`` for a composite;
    ``-td``, which defaults to ``-t``, for a sidecar). With every core in both, each pool waits on the other (on a
    busy 2-core machine about 1.4 tokens/s instead of hundreds). When the user sets no thread count (no flag, no
    ``LLAMA_ARG_THREADS``-style variable), bench gives each pool half the free cores (at least 1), in every run so
    that the runs compare alike; otherwise the user's counts stand and :attr:`Threads.oversubscribed` says whether
    to warn.
    """
    environ = os.environ if environ is None else environ
    user_set = any(option_name(a) in options.trunk_threads | options.draft_threads for a in extra)
    if not user_set:
        if any(name in environ for name in options.thread_env):  # set by the environment: the user's choice
            return Threads((), (), None, None, free)
        each = pool_share(free)
        return Threads(("-t", str(each)), ("-td", str(each)) if draft else (), each, each, free)
    trunk = _given(extra, options.trunk_threads, os.cpu_count() or 1)
    head = _given(extra, options.draft_threads, trunk) if draft else trunk
    return Threads((), (), trunk, head, free)


def shared_threads(given: int | None, free: int, flag: str) -> Threads:
    """The threads of a process whose trunk and MTP head pools take one count (``gguf-mtp accept``'s llama.cpp
    child, ``flag`` its option): ``given`` as the user chose it, else :func:`pool_share` of ``free``."""
    if given is not None:
        return Threads((), (), given, given, free)
    each = pool_share(free)
    return Threads((flag, str(each)), (), each, each, free)
