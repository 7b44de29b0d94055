"""The one rule of the writing commands that verify their output (``compose``, ``graft``).

Both verify what they wrote by default (:func:`gguf_mtp.check.verify.verify`: structure, bytes against their
inputs, and a llama.cpp load with an MTP decode step when llama-cpp-python is installed); ``--no-verify`` skips
it, ``--no-llama`` verifies without llama.cpp. A failed verification exits 2 and keeps the files written, saying
which and where, so that they can be inspected (``gguf-mtp verify`` names every failed check again).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gguf_mtp.errors import GGUFMTPError

__all__ = ["add_verify_flags", "verification_status", "verify_requested"]


def add_verify_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--verify`` (the default) / ``--no-verify``, and ``--no-llama``."""
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--verify", dest="verify", action="store_const", const=True, default=None,
                        help=f"verify {what} after writing it (the default; exit 2 when a check fails)")
    choice.add_argument("--no-verify", dest="verify", action="store_const", const=False,
                        help=f"do not verify {what} (`gguf-mtp verify` can later)")
    parser.add_argument("--no-llama", action="store_true",
                        help="verify without loading the result with llama.cpp")


def verify_requested(args: argparse.Namespace) -> bool:
    """Whether to verify (the default) with these flags; a note when ``--verify`` meets ``--dry-run``.

    Raises:
        GGUFMTPError: ``--no-llama`` with ``--no-verify`` (nothing would load anything with llama.cpp).
    """
    if args.no_llama and args.verify is False:
        raise GGUFMTPError("--no-llama only applies when verifying (drop --no-verify)")
    if args.verify and args.dry_run:
        print("gguf-mtp: note: --verify is ignored with --dry-run: nothing is written, so there is nothing to verify",
              file=sys.stderr)
    return args.verify is not False


def verification_status(outputs: Sequence[Path], verification: Any) -> int:
    """Exit status after writing ``outputs``: 0 unless ``verification`` (a VerifyReport, or None) failed; then
    one line on stderr saying the files are kept and where, and 2."""
    if verification is None or verification.ok:
        return 0
    failed = len(verification.failures)
    folders = sorted({str(Path(p).parent) for p in outputs})
    print(f"gguf-mtp: error: {outputs[0]}: failed verification ({failed} check(s) failed, listed above); the "
          f"{len(outputs)} file(s) written are kept in {', '.join(folders)} for inspection (delete them, or "
          "write again with --force)", file=sys.stderr)
    return 2
