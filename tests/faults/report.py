"""The fault suite's ledger and its one-line figures at the end of the pytest run.

Registered as a plugin by ``tests/conftest.py`` (``pytest_plugins``), so the terminal
summary hook runs whichever folder pytest was started on. Tests record through the
``fault`` and ``bad_input`` fixtures of ``tests/faults/conftest.py``; only what a test
really did and asserted is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


LEDGER = Ledger()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not (LEDGER.injected or LEDGER.bad_tried):
        return
    terminalreporter.section("fault suite")
    for timing in LEDGER.timings:
        terminalreporter.write_line(timing)
    terminalreporter.write_line(LEDGER.line())
