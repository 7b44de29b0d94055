"""llama-server's options as its own ``--help`` prints them, and the rules ``bench`` draws from them: the options
bench sets itself (refused in the user's extra arguments under every spelling the server accepts), and the thread
counts of the trunk and the MTP head.

The options are read from the help by :func:`gguf_mtp.llama_server.parse_help`. Reading the aliases from there,
rather than from a list of our own, follows the server the user actually has: a spelling added in a later llama.cpp
is refused the day it appears.

Pure: no process. :func:`gguf_mtp.llama_server.probe_server` runs ``--help``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gguf_mtp.errors import ParameterError
from gguf_mtp.llama_server import offers_probabilistic, parse_help
from gguf_mtp.model.drafting import Threads, pool_share

__all__ = [
    "OWNED_OPTIONS",
    "ServerOptions",
    "check_extra_arguments",
    "choose_threads",
    "option_name",
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
            probabilistic=offers_probabilistic(options),
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
