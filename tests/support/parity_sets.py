"""Each family's :class:`~support.upstream.ParitySet`, built once per session and shared by every test that
compares with it, whichever module it is in, then deleted after the last of them.

A test names the set it uses with the ``parity`` marker (``@pytest.mark.parity("step35")``, or the marks of a
``pytest.param``) and takes it from the ``parity`` fixture. The plugin counts, once the run's tests are chosen,
how many use each set; a set's folder goes when the last one has ended, unless a test failed while it was in use
(it then stays for a look, as :func:`support.session.shared_tmp_dir` leaves its folders). Within a module the
tests of one set run together, so a parametrised module holds one family's files at a time.

:data:`BUILDERS` is the one table of how each set is made: the checkpoint builder (``support/<family>_checkpoints``),
the tokenizer's extra special tokens, and, where upstream needs another copy of the checkpoint or another
``--outtype``, those.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from support.glm_checkpoints import GLM_SPECIAL_TOKENS, write_glm_checkpoint
from support.hy_checkpoints import write_hy_checkpoint
from support.ling_checkpoints import write_ling_checkpoint
from support.mimo_checkpoints import write_mimo_checkpoint
from support.nano_checkpoints import write_full_nano_checkpoint
from support.step_checkpoints import write_step_checkpoint
from support.upstream import ParitySet, parity_set

#: set name -> how it is made in a fresh folder ``work`` (the checkpoint in ``work/hf``).
BUILDERS: dict[str, Callable[[Path], ParitySet]] = {
    "glm4moe": lambda work: parity_set(write_glm_checkpoint(work / "hf", qk_norm=True, nextn_copies=True), work,
                                       GLM_SPECIAL_TOKENS),
    "glm4moe-2nextn": lambda work: parity_set(
        write_glm_checkpoint(work / "hf", qk_norm=True, nextn_copies=True, n_nextn=2), work, GLM_SPECIAL_TOKENS),
    "nemotron_nano": lambda work: parity_set(write_full_nano_checkpoint(work / "hf"), work),
    "hy_v3": lambda work: parity_set(write_hy_checkpoint(work / "hf"), work),
    "hy_v3-2mtp": lambda work: parity_set(write_hy_checkpoint(work / "hf", n_nextn=2), work),
    "bailingmoe3": lambda work: parity_set(write_ling_checkpoint(work / "hf"), work),
    "step35": lambda work: parity_set(write_step_checkpoint(work / "hf"), work),
    "mimo2-bf16": lambda work: parity_set(write_mimo_checkpoint(work / "hf"), work, name="bf16"),
    "mimo2-tp4": lambda work: parity_set(write_mimo_checkpoint(work / "hf", fp8="tp4"), work, name="tp4"),
}


class ParitySets:
    """The session's sets: made on first use, deleted after their last user (see the module's text)."""

    def __init__(self) -> None:
        self._sets: dict[str, tuple[ParitySet, int]] = {}  # name -> (set, session.testsfailed when made)
        self.users: Counter[str] = Counter()

    def get(self, name: str, request: pytest.FixtureRequest) -> ParitySet:
        """The set ``name``, made now if no test has used it yet."""
        if name not in self._sets:
            factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
            self._sets[name] = (BUILDERS[name](factory.mktemp(f"parity-{name}")), request.session.testsfailed)
        return self._sets[name][0]

    def done(self, name: str, session: pytest.Session) -> None:
        """One user of ``name`` has ended; after the last, its folder goes (unless a test failed meanwhile)."""
        self.users[name] -= 1
        if self.users[name] > 0 or name not in self._sets:
            return
        files, failed_before = self._sets.pop(name)
        if session.testsfailed == failed_before:
            shutil.rmtree(files.work, ignore_errors=True)


_KEY = pytest.StashKey[ParitySets]()


def _name(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("parity")
    return None if marker is None else str(marker.args[0])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within each module, the tests of one set together (in the order the module first uses them)."""
    first: dict[tuple[str, str], int] = {}
    order: list[tuple[int, int]] = []
    for index, item in enumerate(items):
        name = _name(item)
        group = first.setdefault((item.nodeid.split("::")[0], name), index) if name is not None else index
        order.append((group, index))
    items[:] = [items[index] for _, index in sorted(order)]


def pytest_collection_finish(session: pytest.Session) -> None:
    sets = ParitySets()
    sets.users.update(name for item in session.items if (name := _name(item)) is not None)
    session.config.stash[_KEY] = sets


@pytest.fixture
def parity(request: pytest.FixtureRequest) -> ParitySet:
    """The ParitySet this test's ``parity`` marker names (made on first use, shared for the session)."""
    name = _name(request.node)
    assert name is not None, "the parity fixture needs @pytest.mark.parity(name)"
    sets = request.config.stash[_KEY]
    request.addfinalizer(lambda: sets.done(name, request.session))
    return sets.get(name, request)
