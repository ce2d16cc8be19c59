"""The gate that holds a stage's report until the next stage has opened (pure threading)."""

from __future__ import annotations

import threading

from prefect_dask_profiling.prefect.session import BoundaryGate


def _waiter(gate: BoundaryGate, mark: int, log: list[str]) -> threading.Thread:
    def run() -> None:
        gate.wait(mark)
        log.append("drawn")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_held_report_is_drawn_once_the_next_stage_has_opened():
    gate = BoundaryGate(hold_s=600.0)  # only the opening can let it go within the test
    log: list[str] = []
    thread = _waiter(gate, gate.mark(), log)
    thread.join(0.2)
    assert thread.is_alive() and log == []
    log.append("opened")
    gate.opened()
    thread.join(30)
    assert not thread.is_alive() and log == ["opened", "drawn"]


def test_finishing_releases_every_held_report_and_later_ones():
    gate = BoundaryGate(hold_s=600.0)
    log: list[str] = []
    threads = [_waiter(gate, gate.mark(), log) for _ in range(3)]
    gate.release()
    for thread in threads:
        thread.join(30)
    assert log == ["drawn"] * 3
    gate.wait(gate.mark())  # released: nothing is held any longer (returns at once)


def test_an_opening_before_the_mark_does_not_release_it():
    gate = BoundaryGate(hold_s=600.0)
    gate.opened()
    mark = gate.mark()
    assert mark == 1
    log: list[str] = []
    thread = _waiter(gate, mark, log)
    thread.join(0.2)
    assert thread.is_alive()
    gate.opened()
    thread.join(30)
    assert log == ["drawn"]


def test_a_held_report_starts_anyway_after_the_hold():
    gate = BoundaryGate(hold_s=0.05)  # the flow did something else than open a stage
    log: list[str] = []
    thread = _waiter(gate, gate.mark(), log)
    thread.join(30)
    assert log == ["drawn"]
