"""The ``gguf-mtp`` command line: one thin module per subcommand, errors mapped to exit codes.

Exit status: 0 success; 2 bad input or usage (one line on stderr naming the file and the problem);
1 an unexpected internal error (a bug: the traceback is shown); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence

from gguf_mtp._version import __version__
from gguf_mtp.errors import GGUFMTPError
from gguf_mtp.text import ESCAPE_ERRORS, printable

from .common import error_object, print_json

#: Subcommands, each a module of this package with ``register(subparsers)``.
COMMANDS = (
    "convert", "compose", "demo", "extract", "strip", "graft", "publish", "inspect", "verify", "pipeline", "bench",
    "accept", "sidecars",
)


def build_parser(
    commands: Sequence[str] = COMMANDS, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """The ``gguf-mtp`` parser with ``commands`` (default: all); ``parser_class`` makes it and its subcommands'
    parsers (one whose ``error`` raises reads arguments without printing usage or exiting)."""
    parser = parser_class(
        prog="gguf-mtp",
        description="Convert, splice, verify and publish MTP (NextN) heads for llama.cpp GGUF models.",
    )
    parser.add_argument("--version", action="version", version=f"gguf-mtp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (to stderr)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in commands:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    for sub in subparsers.choices.values():
        _accept_verbose(sub)
        _case_insensitive_choices(sub)
        sub.set_defaults(flag_of_parameter=_flag_of_parameter(sub))
    return parser


def _flag_of_parameter(sub: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's destination (the library's parameter name) and the flag that sets it."""
    return {action.dest: max(action.option_strings, key=len) for action in sub._actions if action.option_strings}


def _in_cli_terms(text: str, parameters: tuple[str, ...], flag_of_parameter: dict[str, str]) -> str:
    """A library message with the parameters it names shown as the command's flags (``set_kv`` → ``--set-kv``)."""
    for parameter in parameters:
        flag = flag_of_parameter.get(parameter)
        if flag is not None:
            # A word of its own: not part of a name, a path or a file name (``/tmp/prompts.json``).
            text = re.sub(rf"(?<![\w./-]){re.escape(parameter)}(?![\w/-]|\.\w)", flag, text, count=1)
    return text


def _accept_verbose(sub: argparse.ArgumentParser) -> None:
    """``-v``/``--verbose`` after the subcommand too (``gguf-mtp inspect -v X``), as well as before it.

    ``SUPPRESS`` as the default: a subcommand without ``-v`` leaves the main parser's value alone.
    """
    if any(opt in sub._option_string_actions for opt in ("-v", "--verbose")):
        return
    sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log what happens")


def _case_insensitive_choices(sub: argparse.ArgumentParser) -> None:
    """Options with lower-case word choices take them in any case (``--outtype Q8_0`` is ``q8_0``)."""
    for action in sub._actions:
        choices = action.choices
        if action.type is not None or not isinstance(choices, (list, tuple)) or not choices:
            continue
        if all(isinstance(c, str) and c == c.lower() for c in choices):
            action.type = str.lower


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    _quiet_hub_logging(args.verbose)
    restore = _escape_unprintable_output()
    try:
        return _run(args)
    finally:
        restore()


#: Commands that pass what follows ``--`` to another program (as ``server_args``).
PASS_THROUGH = ("bench",)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; for a pass-through command (``bench ... -- -ngl 99``) what follows the first ``--`` is
    its ``server_args`` (argparse cannot take options after ``--`` behind a subcommand). The main parser's
    options take no values, so the command is the first word that is not an option."""
    command = next((word for word in argv if not word.startswith("-")), None)
    if command in PASS_THROUGH and "--" in argv:
        split = argv.index("--")
        args = parser.parse_args(argv[:split])
        args.server_args = argv[split + 1 :]
        return args
    return parser.parse_args(argv)


def _run(args: argparse.Namespace) -> int:
    """Run the subcommand; map errors to one line on stderr (and a JSON error object with ``--json``)."""
    from gguf_mtp.write import signals_as_interrupt

    want_json = bool(getattr(args, "json", False))
    try:
        # SIGTERM and SIGHUP end any stage like Ctrl-C, the head's fetch before the writer's included: every
        # scratch and temporary file is removed on the way out.
        with signals_as_interrupt(), _llama_cpp_chosen(args):
            return int(args.run(args) or 0)
    except GGUFMTPError as e:
        flags = getattr(args, "flag_of_parameter", {})
        message = _in_cli_terms(e.message, e.parameters, flags)
        _fail(
            want_json, f"gguf-mtp: error: {printable(_in_cli_terms(str(e), e.parameters, flags))}", message, e.path, 2
        )
        return 2
    except KeyboardInterrupt:
        _fail(want_json, "gguf-mtp: interrupted; no output was left behind", "interrupted", None, 130)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:
        if want_json:  # a bug: the traceback follows on stderr, but a script still gets an answer
            _print_json_quietly(error_object(f"internal error: {type(e).__name__}: {printable(e)}", None, 1))
        raise


@contextlib.contextmanager
def _llama_cpp_chosen(args: argparse.Namespace) -> Iterator[None]:
    """For a command with ``--llama-cpp``: the option (it wins over the variable) set as the variable every
    llama.cpp child inherits, and the build checked before any work; the variable restored afterwards."""
    from gguf_mtp.constants import ENV_LLAMA_CPP
    from gguf_mtp.llama_build import chosen

    if not hasattr(args, "llama_cpp"):
        yield
        return
    before = os.environ.get(ENV_LLAMA_CPP)
    if args.llama_cpp is not None:
        os.environ[ENV_LLAMA_CPP] = args.llama_cpp
    try:
        chosen()
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_LLAMA_CPP, None)
        else:
            os.environ[ENV_LLAMA_CPP] = before


def _fail(want_json: bool, line: str, message: str, path: str | None, status: int) -> None:
    if want_json:
        _print_json_quietly(error_object(printable(message), printable(path) if path is not None else None, status))
    with contextlib.suppress(OSError, ValueError):  # a terminal that hung up (SIGHUP): the status still tells
        print(line, file=sys.stderr)


def _print_json_quietly(data: dict[str, object]) -> None:
    with contextlib.suppress(BrokenPipeError, ValueError):  # stdout closed: stderr still has the line
        print_json(data)


def _quiet_hub_logging(verbose: bool) -> None:
    """huggingface_hub has its own stderr handler: through ours as well, every line printed twice.

    Its retry warnings ("Retrying in 8s [Retry 4/5]") are only shown with ``-v``; without it a failure
    is the one line the command prints in the end. Nothing is imported here (huggingface_hub before 1.0 loads
    requests, tqdm and yaml with its logging module): the level is set on the logger, and, for an import that
    comes later and sets it again, through huggingface_hub's own ``HF_HUB_VERBOSITY`` unless the user set it.
    """
    level = "info" if verbose else "error"
    os.environ.setdefault("HF_HUB_VERBOSITY", level)
    hub_logger = logging.getLogger("huggingface_hub")
    hub_logger.propagate = False
    hub_logger.setLevel(logging.INFO if verbose else logging.ERROR)


def _escape_unprintable_output() -> Callable[[], None]:
    """Make stdout and stderr write an unencodable character as ``\\xNN`` instead of raising.

    Every report escapes the names it prints; this is the last line of defence for anything that
    slips through (a progress bar's label, a message from a library). Returns the undo.
    """
    undo: list[Callable[[], None]] = []
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        errors = getattr(stream, "errors", None)
        if reconfigure is None or errors is None:
            continue
        try:
            reconfigure(errors=ESCAPE_ERRORS)
        except (ValueError, OSError):  # a detached or closed stream
            continue
        undo.append(functools.partial(reconfigure, errors=errors))

    def restore() -> None:
        for step in undo:
            with contextlib.suppress(ValueError, OSError):
                step()

    return restore
