"""Fixtures of the fault suite: the recorders behind its figures, shared clusters, servers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from helpers.dask_processes import ExternalCluster, external_cluster
from helpers.s3_servers import moto_server
from helpers.tiers import starts_processes

from faults import fault_flows
from faults.report import LEDGER
from prefect_dask_profiling.errors import InvalidInput


class FaultRecorder:
    """Records one test's injected faults; a fault survives only when the test says so."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._expected = 0

    def inject(self, name: str) -> None:
        """Record a fault that was really injected."""
        self.names.append(name)
        LEDGER.injected.append(name)

    def expect_summary(self) -> None:
        """The run under this fault must end with a stored summary."""
        self._expected += 1
        LEDGER.summaries_expected += 1

    def recovered(self) -> None:
        """A summary expected by :meth:`expect_summary` was found stored and complete."""
        LEDGER.summaries_recovered += 1

    def survived(self) -> None:
        """Call last, after every assertion: all faults of this test were survived."""
        LEDGER.survived.extend(self.names)

    def timing(self, text: str) -> None:
        """A measured figure to print with the suite's summary."""
        LEDGER.timings.append(text)


class BadInputRecorder:
    """Tries bad inputs; counts those that got one clear error naming the problem."""

    def expect_error(self, call: Callable[[], object], *needles: str,
                     exc: type[BaseException] | tuple = InvalidInput) -> str:
        """Call ``call``; it must raise ``exc`` with a one-line message containing ``needles``."""
        LEDGER.bad_tried += 1
        with pytest.raises(exc) as info:
            call()
        message = str(info.value)
        assert message and "\n" not in message.strip(), message
        for needle in needles:
            assert needle in message, (needle, message)
        LEDGER.bad_clear += 1
        return message

    def counted(self, clear: bool) -> None:
        """Count one bad input tried elsewhere; ``clear`` after its assertions passed."""
        LEDGER.bad_tried += 1
        LEDGER.bad_clear += bool(clear)


@pytest.fixture
def fault() -> FaultRecorder:
    return FaultRecorder()


@pytest.fixture
def bad_input() -> BadInputRecorder:
    return BadInputRecorder()


@pytest.fixture
def hooks() -> Iterator[dict]:
    """``fault_flows.HOOKS``: callbacks the fault flows call between stages (flow process)."""
    fault_flows.HOOKS.clear()
    yield fault_flows.HOOKS
    fault_flows.HOOKS.clear()


@pytest.fixture(scope="package")
@starts_processes("dask scheduler and worker processes")
def shared_cluster(tmp_path_factory) -> Iterator[ExternalCluster]:
    """One real scheduler with two nanny-managed workers for the whole fault suite.

    Package-scoped, not session-scoped: stopped once the fault files that share it
    (one pytest-xdist scope, tests/conftest.py) are done. Idle, its five processes burn
    about a tenth of a core (0.11 CPU-s a second, 5 December 2026), which the rest of a
    session would otherwise pay for beside a CPU hog.
    """
    with external_cluster(tmp_path_factory.mktemp("faults-dask"), n_workers=2) as cluster:
        yield cluster


@pytest.fixture
def cluster(shared_cluster) -> ExternalCluster:
    """The shared cluster, back at two workers (a test may have killed one)."""
    shared_cluster.wait_for_workers(2, timeout=60)
    return shared_cluster


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def spool(tmp_path, monkeypatch):
    """A private spool folder for this test (``DASK_PROFILING_SPOOL``)."""
    path = tmp_path / "spool"
    monkeypatch.setenv("DASK_PROFILING_SPOOL", str(path))
    return path


class Stopwatch:
    """Durations of calls, for figures printed at the end (never asserted tightly)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append((name, time.monotonic() - start))

        return timed

    @property
    def longest(self) -> tuple[str, float]:
        return max(self.calls, key=lambda c: c[1]) if self.calls else ("none", 0.0)
