"""finish_run with the drift and fleet steps: a real record at the end of a drifting history.

The judged night is recorded on a real LocalCluster; the ten nights before it are its own
per-prefix table scaled down by 12% a night and stored with ``RunStore.write_run``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from helpers.run_records import record_stages

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary import summarise

SETTINGS = ProfilingOptions(check_options={"min_seconds": 0.0, "min_share": 0.0})


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 400})


def history(store: RunStore, record, now: datetime, growth: float, nights: int = 10) -> None:
    """``nights`` earlier runs whose totals grow by ``growth`` a night up to the record's."""
    summary = summarise(record)
    for n in range(nights):
        back = nights - n
        started = now - timedelta(days=back)
        tasks = summary.assign(total_s=summary["total_s"] / growth ** back)
        doc = {"version": "1", "status": "healthy", "state": "COMPLETED",
               "started": started.isoformat(), "utilisation": {"run": 0.5, "stages": {}}}
        assert not store.write_run("nightly", new_run_id(started), {"tasks": tasks},
                                   doc).spooled


def finish(store: RunStore, record, now: datetime):
    ctx = RunContext(run_id=new_run_id(now), pipeline="nightly", version="1", started=now)
    return finish_run(store, record, ctx, [], SETTINGS, ended=now + timedelta(hours=1))


def test_drifting_night_fails_stores_the_drift_and_writes_the_fleet_file(record, tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    now = datetime.now(UTC)
    history(store, record, now, growth=1.12)
    result = finish(store, record, now)
    assert result.regressed and result.status == "regressed", result.warnings
    assert not any("step failed" in w for w in result.warnings), result.warnings
    drift = result.judgement.drift
    assert set(drift["verdict"]) == {"drift"}
    assert (drift["cumulative_ratio"] > 2.0).all() and drift["fails"].all()
    assert set(result.verdicts["verdict"]) == {"drift"}  # the one-night rule saw nothing
    assert "since" in result.failure_message
    manifest = store.read_manifest("nightly", result.run_id)
    assert manifest["status"] == "regressed"
    assert manifest["drift"]["failing"] and "since the first run" in manifest["drift"]["note"]
    stored = store.read_table("nightly", result.run_id, "drift")
    assert set(stored["verdict"]) == {"drift"}
    fleet = pd.read_parquet(tmp_path / "store" / "fleet")
    assert set(fleet["run_id"]) == {result.run_id}  # only runs finished through here
    assert set(fleet["status"]) == {"regressed"}
    assert result.fleet_location.endswith(f"pipeline=nightly/{result.run_id}.parquet")


def test_a_steady_history_has_no_drift(record, tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    now = datetime.now(UTC)
    history(store, record, now, growth=1.0)
    result = finish(store, record, now)
    assert not result.regressed and result.status == "healthy", result.warnings
    assert set(result.judgement.drift["verdict"]) == {"ok"}
    assert result.failure_message == "no regression"
