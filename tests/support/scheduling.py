"""How ``make test`` spreads the suite over pytest-xdist workers (``pytest -n 2 --dist loadscope``): one work unit per
module, or per ParitySet for the tests that share one (:func:`support.parity_sets.work_unit`), so that what a module
or a set builds once is built by one worker only. Imported only by pytest-xdist's scheduler hook (tests/conftest.py).
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

from support.parity_sets import work_unit


class ModuleOrParitySetScheduling(LoadScopeScheduling):
    """xdist's ``loadscope`` with :func:`~support.parity_sets.work_unit` as the scope of a test."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
