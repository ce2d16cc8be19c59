"""A deadline always fires: ``late`` on the clock alone, with or without an estimate, with
or without the run's history; ``at-risk`` only on an estimate, which its payload names.

No cluster, no server: the LiveEta is driven directly (its periodic job, its history's
future, explicit clocks). The run has no flow run id, so nothing is posted to Prefect; what
the run decided to emit is its tracker's ``emitted`` (the real emission is checked on a real
server by ``tests/prefect/test_eta_first_night_late.py``).
"""

from __future__ import annotations

from concurrent.futures import Future
from datetime import UTC, datetime, timedelta

import pytest
from helpers.live_etas import live_eta

from prefect_dask_profiling.errors import StoreError
from prefect_dask_profiling.forecast.model import Eta, HistoryStats, StageStats
from prefect_dask_profiling.prefect.runner import ProfilingOptions
from prefect_dask_profiling.run.background import Background
from prefect_dask_profiling.run.live_eta import EtaTick, LiveEta
from prefect_dask_profiling.store.manifest import RunContext

# Hours before the real clock: a deadline an hour after this start passed long ago, whatever
# the machine's load (no timing in these tests: the real clock is only ever far past it).
START = (datetime.now(UTC) - timedelta(hours=5)).replace(microsecond=0)
STAGES = (StageStats("one", 3, 10.0, 12.0), StageStats("two", 3, 20.0, 30.0))
READY = HistoryStats("ndvi", "1", ("r-a", "r-b", "r-c"), STAGES, 30.0)
FIRST_NIGHT = HistoryStats("ndvi", "1", (), (), None)  # a new version: no night yet


def live(tmp_path, **options) -> LiveEta:
    store = str(tmp_path / "store")
    return live_eta(ProfilingOptions(store=store, **options), RunContext(
        run_id="20261203T010000Z-abcdef", pipeline="ndvi", version="1", started=START))


def test_a_first_night_without_an_eta_is_late_at_its_deadline(tmp_path):
    """The first nights of a new version have no ETA: the periodic job still judges the
    deadline (4 h past here) and the run is late, once."""
    eta = live(tmp_path, deadline=timedelta(hours=1))
    eta.forecast.deadline.at = START + timedelta(hours=1)  # as the start resolves it
    eta.forecast.stats = FIRST_NIGHT
    EtaTick(eta).run()
    # no ETA yet: needs 3 earlier runs
    assert eta.forecast.eta is not None and not eta.forecast.eta.known
    assert eta.forecast.deadline.tracker.emitted == ["late"]
    EtaTick(eta).run()
    assert eta.forecast.deadline.tracker.emitted == ["late"], "late is news once"


def test_before_its_deadline_a_run_without_an_eta_emits_nothing(tmp_path):
    eta = live(tmp_path, deadline=timedelta(hours=1))
    eta.forecast.resolve_deadline(None)
    eta.forecast.stats = FIRST_NIGHT
    EtaTick(eta, START + timedelta(minutes=59)).run()
    assert eta.forecast.deadline.tracker.emitted == []
    EtaTick(eta, START + timedelta(hours=1)).run()
    assert eta.forecast.deadline.tracker.emitted == ["late"]


def test_a_failed_history_read_still_sets_a_clock_time_deadline_and_late_fires(tmp_path):
    """The history read failed at the start: no estimate for the whole run, but the
    deadline (a time of day) is set when the live ETA starts and late comes on the clock."""
    at = START + timedelta(hours=1)
    eta = live(tmp_path, deadline=f"{at:%H:%M} UTC", eta_interval=3600.0)
    failed: Future = Future()
    failed.set_exception(StoreError("the store did not answer"))
    eta.start(failed)
    try:
        assert Background.instance().drain(timeout=60)  # the history's job ran (and failed)
        assert eta.forecast.stats is None
        assert eta.forecast.deadline.at == at.replace(second=0)
        EtaTick(eta).run()
        assert eta.forecast.deadline.tracker.emitted == ["late"]
        payload = eta.forecast.payload("late", eta.forecast.no_estimate(),
                                       START + timedelta(hours=2))
        assert payload["eta"]["known"] is False
        assert "history" in payload["eta"]["text"] and "failed" in payload["eta"]["text"]
        assert payload["judged"] == {"at": (START + timedelta(hours=2)).isoformat(),
                                     "on": "clock", "finish": None}
        assert "ETA events: `dask-profiling.run.late`" in "\n".join(eta.forecast.markdown_lines())
    finally:
        eta.stop()


def test_late_fires_while_the_history_is_still_being_read(tmp_path):
    eta = live(tmp_path, deadline=timedelta(hours=1), eta_interval=3600.0)
    reading: Future = Future()  # never done in this test
    eta.start(reading)
    try:
        assert eta.forecast.deadline.at == START + timedelta(hours=1)
        EtaTick(eta, START + timedelta(hours=1, seconds=1)).run()
        assert eta.forecast.deadline.tracker.emitted == ["late"]
        assert "not read yet" in eta.forecast.no_estimate().text
    finally:
        eta.stop()


def test_at_risk_needs_an_estimate_and_names_the_one_it_judged(tmp_path):
    eta = live(tmp_path, deadline=timedelta(hours=1))
    eta.forecast.resolve_deadline(None)
    deadline = START + timedelta(hours=1)
    now = START + timedelta(minutes=30)
    assert eta.forecast.judge_deadline(None, now) is None  # no estimate: no risk to judge
    unknown = Eta(False, "no ETA yet: needs 3 earlier runs of ndvi 1 (has 0)")
    assert eta.forecast.judge_deadline(unknown, now) is None
    finish = deadline + timedelta(minutes=5)
    known = Eta(True, "ETA 01:20–01:35", remaining_s=60.0, remaining_low_s=60.0,
                remaining_high_s=2100.0, finish_low=now + timedelta(seconds=60),
                finish_high=finish, percent_done=40.0)
    assert eta.forecast.judge_deadline(known, now) == "at-risk"
    payload = eta.forecast.payload("at-risk", known, now)
    assert payload["judged"] == {"at": now.isoformat(), "on": "finish_high",
                                 "finish": finish.isoformat()}
    assert payload["eta"]["finish_high"] == finish.isoformat()
    assert eta.forecast.judge_deadline(None, deadline) == "late"
    assert eta.forecast.deadline.tracker.emitted == ["at-risk", "late"]


@pytest.mark.parametrize("stats", [None, FIRST_NIGHT], ids=["no history", "no ETA"])
def test_the_markdown_shows_the_deadline_and_its_events_without_an_eta(tmp_path, stats):
    eta = live(tmp_path, deadline=timedelta(hours=1))
    deadline = eta.forecast.deadline.at = START + timedelta(hours=1)
    eta.forecast.stats = stats
    EtaTick(eta).run()
    lines = eta.forecast.markdown_lines()
    assert lines[-1] == (f"- deadline: {deadline:%Y-%m-%d %H:%M} UTC (1:00:00 after the "
                         "scheduled start); ETA events: `dask-profiling.run.late`")
