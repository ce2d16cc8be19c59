"""Leftover live estimates are swept: those of runs that died without ending (not replaced
for 3 of their intervals and a minute), of runs that ended (their removal failed), and
unreadable ones a day old; by ``dask-profiling sweep`` and at the next run of the pipeline.

Real stores (a local folder and moto's S3), explicit clocks (``now``); the next run is a
real LiveEta started with its history still being read (no cluster, no server).
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta

import pandas as pd
from helpers.live_etas import live_eta
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.forecast.live_store import estimate_doc
from prefect_dask_profiling.prefect.runner import ProfilingOptions
from prefect_dask_profiling.run.background import Background
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id

BUCKET = "live-sweep"
NOW = datetime.now(UTC).replace(microsecond=0)


def estimate(store: RunStore, pipeline: str, run_id: str, age_s: float,
             interval_s: float = 30.0, now: datetime = NOW) -> str:
    """Store the estimate of ``run_id`` computed ``age_s`` before ``now``; its location.

    Tests whose sweep reads the real clock (the CLI, a LiveEta) pass ``now`` = the clock
    when they start, not the module's NOW (taken at collection, maybe minutes before)."""
    return store.write_live(estimate_doc(
        pipeline=pipeline, version="1", run_id=run_id, flow_run_id=None, started=None,
        computed_at=(now - timedelta(seconds=age_s)).isoformat(), interval_s=interval_s,
        stage=None, stages_done=[], known=False, done_fraction=None, remaining_p50_s=None,
        remaining_p90_s=None, finish_p50=None, finish_p90=None, deadline=None, risk=None,
        unknown=[], text="no ETA yet"))


def ended_run(store: RunStore, pipeline: str) -> str:
    run_id = new_run_id(NOW - timedelta(days=1))
    tasks = pd.DataFrame({"stage": ["s"], "prefix": ["p"], "tasks": [1], "total_s": [1.0],
                          "p50_s": [1.0], "p95_s": [1.0], "gb_out": [0.0]})
    assert not store.write_run(pipeline, run_id, {"tasks": tasks},
                               {"version": "1", "status": "healthy",
                                "state": "COMPLETED"}).spooled
    return run_id


def run_ids(n: int) -> list[str]:
    return [new_run_id(NOW - timedelta(hours=n - i)) for i in range(n)]


def test_leftovers_are_swept_and_live_runs_kept(store):
    fresh, dead, slow_interval, damaged = run_ids(4)
    estimate(store, "ndvi", fresh, age_s=5.0)
    dead_at = estimate(store, "ndvi", dead, age_s=3600.0)
    estimate(store, "ndvi", slow_interval, age_s=3600.0, interval_s=1800.0)  # 3 x 30 min
    ended = ended_run(store, "ndvi")
    ended_at = estimate(store, "ndvi", ended, age_s=5.0)
    store.fs.pipe_file(store._path(layout.live_file("ndvi", damaged)), b"not json")
    other = estimate(store, "other", dead, age_s=3600.0)

    assert store.sweep_live("ndvi", now=NOW) == sorted([dead_at, ended_at])
    assert sorted(store.live_estimates("ndvi")) == sorted([fresh, slow_interval, damaged])
    assert store.sweep_live("ndvi", now=NOW) == []
    assert store.sweep_live(now=NOW) == [other]  # every pipeline
    later = NOW + timedelta(days=2)  # the unreadable object is a day old by then
    assert len(store.sweep_live(now=later)) == 3
    assert store.live_estimates("ndvi") == {}


def test_the_stale_rule_is_three_intervals_and_a_minute():
    from prefect_dask_profiling.forecast.live_store import is_stale

    doc = {"computed_at": NOW.isoformat(), "interval_s": 30.0}
    assert is_stale(doc, NOW + timedelta(seconds=150)) is False  # type: ignore[arg-type]
    assert is_stale(doc, NOW + timedelta(seconds=151)) is True  # type: ignore[arg-type]
    assert is_stale({"computed_at": "yesterday"}, NOW) is None  # type: ignore[arg-type]


def test_dask_profiling_sweep_removes_the_leftover_estimates(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    fresh, dead = run_ids(2)
    now = datetime.now(UTC)  # the command sweeps by the real clock
    estimate(store, "ndvi", fresh, age_s=5.0, interval_s=600.0, now=now)
    dead_at = estimate(store, "ndvi", dead, age_s=3600.0, now=now)
    out = CliRunner().invoke(app, ["sweep", "--store", store.url, "--older-than", "30d",
                                   "--json"])
    assert out.exit_code == 0, out.output
    assert list(store.live_estimates("ndvi")) == [fresh]
    doc = json.loads(out.stdout)
    assert doc["live_removed"] == [dead_at] and doc["live_error"] is None
    human = CliRunner().invoke(app, ["sweep", "--store", store.url, "--older-than", "30d"])
    assert human.exit_code == 0 and "0 leftover live estimate(s) removed" in human.stdout


def test_the_next_run_of_the_pipeline_sweeps_the_leftovers(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    fresh, dead = run_ids(2)
    now = datetime.now(UTC)  # the live ETA sweeps by the real clock
    estimate(store, "ndvi", fresh, age_s=5.0, interval_s=600.0, now=now)  # overlapping, alive
    estimate(store, "ndvi", dead, age_s=3600.0, now=now)
    other = estimate(store, "other", dead, age_s=3600.0, now=now)  # another pipeline's
    ctx = RunContext(run_id=new_run_id(NOW), pipeline="ndvi", version="1", started=NOW,
                     flow_run_id=None)
    tonight = live_eta(ProfilingOptions(store=store.url, eta_interval=3600.0), ctx)
    estimate(store, "ndvi", ctx.run_id, age_s=3600.0, now=now)  # kept
    tonight.start(Future())  # the history is still being read
    try:
        assert Background.instance().drain(timeout=60)
        assert sorted(store.live_estimates("ndvi")) == sorted(
            [fresh, ctx.run_id])
        assert store.fs.exists(store._path(store._relative(other)))
    finally:
        tonight.stop()
