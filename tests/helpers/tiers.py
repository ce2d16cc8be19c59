"""The two test tiers: what puts a test in the slow one.

``make test-fast`` runs ``pytest -m "not slow"``: pure logic, generated data and in-process
``LocalCluster``\\ s. A test is slow (``make test`` only) if it

- needs a fixture that starts a Prefect server, real ``dask scheduler`` / ``dask worker``
  processes (``LocalCluster(processes=True)`` too), SeaweedFS or the netns cluster: such a
  fixture is decorated with :func:`starts_processes` (``prefect_server`` is one), and
  :func:`mark_slow_by_fixture` marks every test whose fixture closure reaches one;
- starts such a process in its own body, or takes more than ~10 s: it carries
  ``@pytest.mark.slow`` (or its module's ``pytestmark``) itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import pytest

F = TypeVar("F", bound=Callable)

_ATTRIBUTE = "_starts_processes"


def starts_processes(what: str) -> Callable[[F], F]:
    """Mark a fixture function (below ``@pytest.fixture``) as one that starts ``what``.

    Every test that uses the fixture, directly or through another fixture, is then slow.
    """
    def mark(function: F) -> F:
        setattr(function, _ATTRIBUTE, what)
        return function
    return mark


def started_by(item: pytest.Item) -> list[str]:
    """What the fixtures of ``item`` start (the reason it is slow), or ``[]``."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    found = []
    for name in item.fixturenames:
        for definition in info.name2fixturedefs.get(name, ()):
            what = getattr(definition.func, _ATTRIBUTE, None)
            if what is not None:
                found.append(f"{name}: {what}")
    return found


def mark_slow_by_fixture(items: Iterable[pytest.Item]) -> None:
    """Add ``slow`` to every item whose fixtures start a server or process cluster."""
    for item in items:
        if item.get_closest_marker("slow") is None and started_by(item):
            item.add_marker(pytest.mark.slow)
