"""The live ETA's estimate in the run store (``live/<pipeline>/<run_id>.json``), without a
cluster or a server: the LiveEta is fed its history directly, the publisher's progress
artifact is stubbed. A store that fails never fails the estimate nor the other publications."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from helpers.live_etas import live_eta

from prefect_dask_profiling.forecast.live_store import LIVE_KIND
from prefect_dask_profiling.forecast.model import HistoryStats, StageStats
from prefect_dask_profiling.prefect import publish
from prefect_dask_profiling.prefect.runner import ProfilingOptions
from prefect_dask_profiling.run.live_eta import LiveEta
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore

STATS = HistoryStats("ndvi", "1", ("r-a", "r-b", "r-c"),
                     (StageStats("one", 3, 10.0, 12.0), StageStats("two", 3, 20.0, 30.0)),
                     30.0)


@pytest.fixture(autouse=True)
def no_prefect_api(monkeypatch):
    posted: list[float] = []
    monkeypatch.setattr(publish.Publisher, "progress",
                        lambda publisher, percent, text: posted.append(percent))
    return posted


def live(store: str, **options) -> LiveEta:
    eta = live_eta(ProfilingOptions(store=store, **options), RunContext(
        run_id="20261203T010000Z-abcdef", pipeline="ndvi", version="1",
        started=datetime.now(UTC) - timedelta(seconds=5), flow_run_id="f-1"))
    eta.forecast.stats = STATS
    return eta


def test_each_estimate_replaces_the_stored_one_and_the_end_removes_it(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    eta = live(store.url, deadline=timedelta(hours=3))
    eta.forecast.deadline.at = datetime.now(UTC) + timedelta(hours=3)
    eta.stage_opened("one")
    eta.update(read=False)
    [(run_id, first)] = store.live_estimates("ndvi").items()
    assert run_id == "20261203T010000Z-abcdef" and first["kind"] == LIVE_KIND
    assert first["stage"] == "one" and first["stages_done"] == [] and first["known"] is True
    assert first["flow_run_id"] == "f-1" and first["risk"] == "on-track"
    assert first["remaining_p50_s"] <= first["remaining_p90_s"]
    assert first["deadline"] == eta.forecast.deadline.at.isoformat()
    eta.forecast.clock.completed["one"] = 10.0  # stage one closed (no boundary queued)
    eta.forecast.clock.current = None
    eta.update(read=False)
    second = store.live_estimates("ndvi")[run_id]
    assert second["stage"] is None and second["stages_done"] == ["one"]
    assert second["done_fraction"] > first["done_fraction"]
    eta.live.remove()
    assert store.live_estimates("ndvi") == {}
    eta.update(read=False)  # a job queued before the end, run after it: no write
    assert store.live_estimates("ndvi") == {}


def test_a_boundary_estimates_from_the_counts_its_close_read(tmp_path):
    """The stage's close read the plugin's snapshot: its counts serve the boundary's
    estimate, with no second read (this one's read fails)."""
    eta = live(RunStore(str(tmp_path / "store")).url)

    def no_scheduler():
        raise ConnectionError("no scheduler")

    eta.read_counts = no_scheduler
    eta.stage_opened("one")
    counts = {"one": {"load": 3}}
    eta.stage_closed("one")  # not started: nothing queued
    eta.boundary("one", counts)
    assert eta.forecast.counts is counts
    assert eta.forecast.log and eta.forecast.log[-1].startswith("stage one done")
    eta.boundary("one")  # without them: the read fails quietly, the last counts stay
    assert eta.forecast.counts is counts


def test_a_run_without_history_stores_that_it_has_no_eta(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    eta = live(store.url)
    eta.forecast.stats = HistoryStats("ndvi", "1", ("r-a",), STATS.stages, 30.0)
    eta.update(read=False)
    stored = store.live_estimates("ndvi")["20261203T010000Z-abcdef"]
    assert stored["known"] is False and stored["finish_p90"] is None
    assert stored["text"] == "no ETA yet: needs 2 earlier runs of ndvi 1 (has 1)"


def test_a_failing_store_fails_nothing_and_the_progress_still_moves(tmp_path, no_prefect_api):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's root should be")
    eta = live(str(blocker))
    eta.stage_opened("one")
    assert eta.update(read=False).known  # the write failed, quietly
    assert no_prefect_api and eta.live.written is None
    eta.live.remove()  # nothing was written: nothing to remove, no error


def test_a_failing_prefect_api_does_not_keep_the_estimate_from_the_store(tmp_path,
                                                                        monkeypatch):
    def down(*args):
        raise ConnectionError("Prefect API down")

    monkeypatch.setattr(publish.Publisher, "progress", down)
    store = RunStore(str(tmp_path / "store"))
    eta = live(store.url)
    eta.stage_opened("one")
    eta.update(read=False)
    assert list(store.live_estimates("ndvi")) == ["20261203T010000Z-abcdef"]
