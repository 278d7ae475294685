"""The order in which the suite's modules reach pytest-xdist's workers, as a pytest plugin (``tests/conftest.py``
loads it): under xdist, every module holding a ``slow`` test comes first, the rest after, each group in its
collection order and each module's tests in theirs.

``./dev test`` runs two workers with ``--dist loadfile`` and ``--no-loadscope-reorder``, so modules are handed out
in this order. xdist's own order (most tests first) hands out last the modules of one long test (the chaos test,
the recovery scenarios, the 200 MiB records): one worker runs them while the other has nothing left. Slow modules
first leaves the many short modules to even out the two workers' ends. A simulation of xdist's hand-out on session
23's durations (2 workers, each test's time +-40 %, 20 draws): the workers end 41 s apart (median; 140 s at worst)
in xdist's order, 16 s (18 s) in this one.

In one process (no xdist) the order is left as collected.
"""

from __future__ import annotations

import pytest


def slow_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the modules holding a ``slow`` test first; modules and their tests keep their order."""
    slow = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow") is not None}
    return sorted(items, key=lambda item: item.nodeid.split("::", 1)[0] not in slow)  # stable


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its collection is the order the controller hands out
        items[:] = slow_modules_first(items)
