"""The live ETA's lines in the run's markdown artifact: the ETA at the start, the deadline
and its events, how the estimate fared at 25 / 50 / 75 % (no cluster, no server: the
forecast is fed its estimates directly)."""

from __future__ import annotations

from datetime import UTC, datetime

from helpers.live_etas import live_eta

from prefect_dask_profiling.forecast.live import LiveForecast
from prefect_dask_profiling.forecast.model import Eta
from prefect_dask_profiling.prefect.runner import ProfilingOptions
from prefect_dask_profiling.store.manifest import RunContext

START = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)


def live(**options) -> LiveForecast:
    return live_eta(ProfilingOptions(**options), RunContext(
        run_id="r1", pipeline="ndvi", version="1", started=START)).forecast


def test_no_eta_says_why():
    eta = live()
    assert eta.markdown_lines() == []
    eta.eta = Eta(False, "no ETA yet: needs 2 earlier runs of ndvi 1 (has 1)")
    assert eta.markdown_lines() == ["- **ETA**: no ETA yet: needs 2 earlier runs of ndvi 1 "
                                    "(has 1)"]


def test_the_start_eta_the_deadline_and_how_it_fared():
    eta = live(deadline="06:00 Europe/Berlin")
    eta.eta = Eta(True, "ETA 05:10–05:20")
    eta.first_text = "ETA 04:55–05:25"
    eta.deadline.at = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
    eta.deadline.tracker.emitted = ["at-risk", "on-track"]
    # (elapsed s, predicted total s) of a 1000 s run: 900 by 25 %, 1100 by 50 %, 1020 by 75 %
    eta.predictions = [(0.0, 950.0), (200.0, 900.0), (450.0, 1100.0), (700.0, 1020.0),
                       (990.0, 1000.0)]
    lines = eta.markdown_lines(actual_s=1000.0)
    assert lines[0] == "- **ETA** at the start: ETA 04:55–05:25"
    assert lines[1] == ("- deadline: 2026-12-03 06:00 CET (06:00 Europe/Berlin); ETA events: "
                        "`dask-profiling.run.at-risk`, `dask-profiling.run.on-track`")
    assert lines[2] == ("- how the ETA fared (predicted finish minus actual, in % of the run's "
                        "1000 s): at 25%: -10.0 %, at 50%: +10.0 %, at 75%: +2.0 %")


def test_a_healthy_run_without_deadline_has_no_deadline_line():
    eta = live()
    eta.eta = eta_known = Eta(True, "ETA 05:10–05:20")
    eta.first_text = eta_known.text
    eta.predictions = [(0.0, 100.0)]
    lines = eta.markdown_lines(actual_s=100.0)
    assert len(lines) == 2 and "deadline" not in " ".join(lines)
    assert lines[1].endswith("at 25%: +0.0 %, at 50%: +0.0 %, at 75%: +0.0 %")


def test_a_history_read_whose_estimate_is_still_queued_is_settled_for_the_markdown():
    """The background job that estimates from the history may still be queued when the run
    publishes: the markdown then estimates itself (pure), saying what is known."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    eta = live()
    history: Future = Future()
    history.set_result(SimpleNamespace(manifests=(), baseline=SimpleNamespace(history=None)))
    eta.history = history
    assert eta.markdown_lines(actual_s=10.0) == [
        "- **ETA**: no ETA yet: needs 3 earlier runs of ndvi 1 (has 0)"]
    failed: Future = Future()
    failed.set_exception(OSError("store down"))
    other = live()
    other.history = failed
    assert other.markdown_lines() == []
