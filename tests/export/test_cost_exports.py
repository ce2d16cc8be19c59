"""The allocation in the run artifact, the fleet rows and Prometheus: a price only when the
run was priced, never otherwise."""

from __future__ import annotations

import pandas as pd

from prefect_dask_profiling.cost.allocation import allocation, allocation_markdown
from prefect_dask_profiling.cost.rates import parse_cost
from prefect_dask_profiling.export.fleet import fleet_rows
from prefect_dask_profiling.export.prometheus import LatestRun, build_registry, exposition
from prefect_dask_profiling.summary.record import RunRecord

T0 = 1_000_000.0


def _record() -> RunRecord:
    tasks = [{"stage": "write", "prefix": "save", "tasks": 1, "compute_s": 60.0,
              "first_start": T0 + 100, "last_stop": T0 + 160}]
    lives = [{"worker": f"tcp://w{i}", "name": f"w{i}", "nthreads": 1,
              "memory_limit": 2 ** 30, "arrived": T0, "departed": T0 + 3600} for i in range(4)]
    return RunRecord.from_snapshot({"name": "t", "started": T0, "collected": T0 + 3600,
                                    "tasks": tasks, "lifetimes": lives})


def _manifest(priced: bool) -> dict:
    alloc = allocation(_record(), parse_cost({"worker_hour": 0.5}) if priced else None)
    stage = alloc.stages[0].to_dict()
    return {"run_id": "r1", "pipeline": "p", "version": "1", "status": "healthy",
            "started": "2026-01-01T00:00:00+00:00", "utilisation": {},
            "stages": [{"name": "write", "allocation": stage}],
            "allocation": alloc.to_dict()}


TASKS = pd.DataFrame([{"stage": "write", "prefix": "save", "tasks": 1, "total_s": 60.0,
                       "p50_s": 60.0, "p95_s": 60.0, "gb_out": 0.0}])


def test_a_priced_run_shows_its_cost_and_rate() -> None:
    manifest = _manifest(priced=True)
    text = "\n".join(allocation_markdown(manifest["allocation"]))
    assert "0.5 USD per worker-hour" in text and "estimate" in text
    assert "2.0000 USD" in text  # 4 worker-hours at 0.5
    rows = fleet_rows(manifest, TASKS)
    assert rows.loc[0, "run_cost"] == 2.0 and rows.loc[0, "cost_currency"] == "USD"
    assert rows.loc[0, "stage_worker_hours"] == 4 * 60 / 3600
    assert rows.loc[0, "stage_idle_share"] == 0.75
    metrics = exposition(build_registry([LatestRun("p", manifest, TASKS, pd.DataFrame(
        columns=["stage", "prefix", "verdict", "ratio"]))]))
    assert 'dask_profiling_cost_estimate{currency="USD",pipeline="p",scope="run"} 2.0' in metrics
    assert 'dask_profiling_idle_ratio{pipeline="p",scope="write"} 0.75' in metrics


def test_without_a_rate_no_price_appears_anywhere() -> None:
    manifest = _manifest(priced=False)
    text = "\n".join(allocation_markdown(manifest["allocation"]))
    assert "worker-h" in text and "cost" not in text.lower() and "USD" not in text
    assert "rates" not in manifest["allocation"]
    assert all("cost" not in row for row in manifest["allocation"]["stages"])
    rows = fleet_rows(manifest, TASKS)
    assert rows["run_cost"].isna().all() and rows["stage_cost"].isna().all()
    assert rows["cost_currency"].isna().all()
    assert rows.loc[0, "run_worker_hours"] == 4.0
    metrics = exposition(build_registry([LatestRun("p", manifest, TASKS, pd.DataFrame(
        columns=["stage", "prefix", "verdict", "ratio"]))]))
    assert "cost" not in metrics and "dask_profiling_allocated_worker_hours" in metrics


def test_a_run_stored_before_allocations_has_null_columns() -> None:
    manifest = _manifest(priced=False)
    del manifest["allocation"], manifest["stages"][0]["allocation"]
    rows = fleet_rows(manifest, TASKS)
    assert rows["run_worker_hours"].isna().all() and rows["stage_idle_share"].isna().all()
    assert allocation_markdown(None) == []
