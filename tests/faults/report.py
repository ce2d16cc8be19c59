"""The fault suite's ledger and its one-line figures at the end of the pytest run.

Registered as a plugin by ``tests/conftest.py`` (``pytest_plugins``), so the terminal
summary hook runs whichever folder pytest was started on. Tests record through the
``fault`` and ``bad_input`` fixtures of ``tests/faults/conftest.py``; only what a test
really did and asserted is counted.

Under ``pytest -n`` (pytest-xdist) the tests run in worker processes: each hands its ledger
to the controller at the end of its session (``workeroutput``), and the controller adds
them up before it prints the line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pytest

_OUTPUT_KEY = "fault_ledger"


@dataclass
class Ledger:
    """What the fault tests injected and what survived."""

    injected: list[str] = field(default_factory=list)
    survived: list[str] = field(default_factory=list)
    summaries_expected: int = 0
    summaries_recovered: int = 0
    bad_tried: int = 0
    bad_clear: int = 0
    timings: list[str] = field(default_factory=list)

    def line(self) -> str:
        lost = self.summaries_expected - self.summaries_recovered
        return (f"faults: {len(self.injected)} injected, {len(self.survived)} survived, "
                f"{self.summaries_recovered} summaries recovered, {lost} summaries lost; "
                f"bad inputs: {self.bad_tried} tried, {self.bad_clear} clear errors")

    def add(self, other: dict) -> None:
        """Add a worker's ledger (:func:`dataclasses.asdict` of one) to this one."""
        for name, value in other.items():
            setattr(self, name, getattr(self, name) + value)


LEDGER = Ledger()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand this process's ledger to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_OUTPUT_KEY] = asdict(LEDGER)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """In the xdist controller: add up the ledger of a worker that finished."""
    LEDGER.add(getattr(node, "workeroutput", {}).get(_OUTPUT_KEY, {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not (LEDGER.injected or LEDGER.bad_tried):
        return
    terminalreporter.section("fault suite")
    for timing in LEDGER.timings:
        terminalreporter.write_line(timing)
    terminalreporter.write_line(LEDGER.line())
