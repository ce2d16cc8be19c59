"""The live ETA's estimate in the run store (``live/<pipeline>/<run_id>.json``), without a
cluster or a server: the LiveEta is fed its history directly, Prefect's progress artifact
is stubbed. A store that fails never fails the estimate nor the other publications."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from prefect_dask_profiling.forecast.live_store import LIVE_KIND
from prefect_dask_profiling.forecast.model import HistoryStats, StageStats
from prefect_dask_profiling.prefect import publish
from prefect_dask_profiling.prefect.eta import LiveEta
from prefect_dask_profiling.prefect.runner import ProfilingOptions
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore

STATS = HistoryStats("ndvi", "1", ("r-a", "r-b", "r-c"),
                     (StageStats("one", 3, 10.0, 12.0), StageStats("two", 3, 20.0, 30.0)),
                     30.0)


@dataclass
class Owner:
    """What a LiveEta reads of its session: the options and the run's context."""

    options: ProfilingOptions
    ctx: RunContext = field(default_factory=lambda: RunContext(
        run_id="20261203T010000Z-abcdef", pipeline="ndvi", version="1",
        started=datetime.now(UTC) - timedelta(seconds=5), flow_run_id="f-1"))


@pytest.fixture(autouse=True)
def no_prefect_api(monkeypatch):
    posted: list[float] = []
    monkeypatch.setattr(publish.Publisher, "progress",
                        staticmethod(lambda artifact, key, percent, text: posted.append(percent)
                                     or "artifact-id"))
    return posted


def live(store: str, **options) -> LiveEta:
    eta = LiveEta(Owner(ProfilingOptions(store=store, **options)))
    eta.stats = STATS
    return eta


def test_each_estimate_replaces_the_stored_one_and_the_end_removes_it(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    eta = live(store.url, deadline=timedelta(hours=3))
    eta.deadline_at = datetime.now(UTC) + timedelta(hours=3)
    eta.stage_opened("one")
    eta._update(read_counts=False)
    [(run_id, first)] = store.live_estimates("ndvi").items()
    assert run_id == "20261203T010000Z-abcdef" and first["kind"] == LIVE_KIND
    assert first["stage"] == "one" and first["stages_done"] == [] and first["known"] is True
    assert first["flow_run_id"] == "f-1" and first["risk"] == "on-track"
    assert first["remaining_p50_s"] <= first["remaining_p90_s"]
    assert first["deadline"] == eta.deadline_at.isoformat()
    eta._clock.completed["one"] = 10.0  # stage one closed (without queueing the boundary)
    eta._clock.current = None
    eta._update(read_counts=False)
    second = store.live_estimates("ndvi")[run_id]
    assert second["stage"] is None and second["stages_done"] == ["one"]
    assert second["done_fraction"] > first["done_fraction"]
    eta._remove_live()
    assert store.live_estimates("ndvi") == {}
    eta._update(read_counts=False)  # a job queued before the end, run after it: no write
    assert store.live_estimates("ndvi") == {}


def test_a_boundary_estimates_from_the_counts_its_close_read(tmp_path):
    """The stage's close read the plugin's snapshot: its counts serve the boundary's
    estimate, with no second read (this owner has no client: a read would fail)."""
    eta = live(RunStore(str(tmp_path / "store")).url)
    eta.stage_opened("one")
    counts = {"one": {"load": 3}}
    eta.stage_closed("one")  # not started: nothing queued
    eta._boundary("one", counts)
    assert eta._counts is counts
    assert eta.log and eta.log[-1].startswith("stage one done")
    eta._boundary("one")  # without them: the read fails quietly, the last counts stay
    assert eta._counts is counts


def test_a_run_without_history_stores_that_it_has_no_eta(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    eta = live(store.url)
    eta.stats = HistoryStats("ndvi", "1", ("r-a",), STATS.stages, 30.0)
    eta._update(read_counts=False)
    stored = store.live_estimates("ndvi")["20261203T010000Z-abcdef"]
    assert stored["known"] is False and stored["finish_p90"] is None
    assert stored["text"] == "no ETA yet: needs 2 earlier runs of ndvi 1 (has 1)"


def test_a_failing_store_fails_nothing_and_the_progress_still_moves(tmp_path, no_prefect_api):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's root should be")
    eta = live(str(blocker))
    eta.stage_opened("one")
    assert eta._update(read_counts=False).known  # the write failed, quietly
    assert no_prefect_api and eta._live_written is None
    eta._remove_live()  # nothing was written: nothing to remove, no error


def test_a_failing_prefect_api_does_not_keep_the_estimate_from_the_store(tmp_path,
                                                                        monkeypatch):
    def down(*args):
        raise ConnectionError("Prefect API down")

    monkeypatch.setattr(publish.Publisher, "progress", staticmethod(down))
    store = RunStore(str(tmp_path / "store"))
    eta = live(store.url)
    eta.stage_opened("one")
    eta._update(read_counts=False)
    assert list(store.live_estimates("ndvi")) == ["20261203T010000Z-abcdef"]
