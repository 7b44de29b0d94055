"""Small functions with one job (issue 40): the planners (``jobs/``), the Hub transport (``hub/``), the format
codecs (``format/``) and the model card are written as named helpers, none with more than ten paths through it
(McCabe's count, as ruff's C901 measures it), as ``format/header.parse_header`` reads its header a section at a
time. A function that grows past the bound is split, not allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The code held to the bound, and the bound (radon rates a block of 11 paths or more "C").
SMALL_FUNCTIONS = ("gguf_mtp/jobs", "gguf_mtp/hub", "gguf_mtp/format", "gguf_mtp/release/card.py")
MAX_PATHS = 10


def test_no_function_of_the_planners_hub_codecs_or_card_has_more_than_ten_paths() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901", "--config",
         f"lint.mccabe.max-complexity = {MAX_PATHS}", "--output-format", "concise", *SMALL_FUNCTIONS],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
