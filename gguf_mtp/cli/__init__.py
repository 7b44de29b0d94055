"""The ``gguf-mtp`` command line: one thin module per subcommand, errors mapped to exit codes.

Exit status: 0 success; 2 bad input or usage (one line on stderr naming the file and the problem);
1 an unexpected internal error (a bug: the traceback is shown); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import GGUFMTPError

#: Subcommands, each a module of this package with ``register(subparsers)``.
COMMANDS = ("convert", "compose", "demo", "extract", "strip", "graft", "publish", "inspect", "verify", "pipeline")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gguf-mtp",
        description="Convert, splice, verify and publish MTP (NextN) heads for llama.cpp GGUF models.",
    )
    parser.add_argument("--version", action="version", version=f"gguf-mtp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (to stderr)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        return int(args.run(args) or 0)
    except GGUFMTPError as e:
        print(f"gguf-mtp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gguf-mtp: interrupted; no output was left behind", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
