"""What fixtures and tests share about the pytest session: whether it runs under CI, and the folder a fixture
shared by several tests keeps its big files in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def shared_tmp_dir(request: pytest.FixtureRequest, name: str) -> Path:
    """A fresh folder for the big files a module- or session-scoped (or parametrized) fixture makes for several
    tests: converted checkpoints, benchmark runs. It is deleted when that fixture is torn down, unless a test
    failed while it was in use (then it stays for a look, as a failed test's ``tmp_path`` does under
    ``tmp_path_retention_policy = "failed"``), so a session never holds more than the fixtures in use."""
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    path = factory.mktemp(name)
    failed_before = request.session.testsfailed

    def remove() -> None:
        if request.session.testsfailed == failed_before:
            shutil.rmtree(path, ignore_errors=True)

    request.addfinalizer(remove)
    return path
