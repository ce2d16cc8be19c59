"""The regressing flow of the OpenTelemetry tests (tests/prefect/test_otel_flow.py,
tests/prefect/test_otel_receiver.py): a seeded store and a two-stage profiled flow whose
``compute`` stage is 16x slower than the seeded nights."""

from __future__ import annotations

from datetime import UTC, datetime

import dask.array as da
import pandas as pd
from prefect import flow
from prefect_dask import get_dask_client

from helpers.profiled_flows import slow_block
from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, new_run_id


def seed(store: RunStore, pipeline: str) -> set[str]:
    """Three healthy earlier nights in which ``compute/slow_block`` took a tenth of a second."""
    seeded = set()
    for second in range(3):
        tasks = pd.DataFrame([{"stage": "compute", "prefix": "slow_block", "tasks": 8,
                               "total_s": 0.1, "p50_s": 0.0125, "p95_s": 0.0125,
                               "gb_out": 0.0}], columns=TASKS_COLUMNS)
        run_id = new_run_id(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC))
        store.write_run(pipeline, run_id, {"tasks": tasks},
                        {"version": "1", "status": "healthy", "state": "COMPLETED"})
        seeded.add(run_id)
    return seeded


def regressing_flow(address: str, store: RunStore, name: str):
    """A profiled two-stage flow: ``load`` (fast, new) and ``compute`` (8 tasks of 0.2 s)."""
    runner = ProfiledDaskTaskRunner(address=address, store=store.url, stage_reports=False)

    @profiled
    def body() -> float:
        with get_dask_client() as client:
            with stage("load"):
                x = client.persist(da.ones((80, 10), chunks=(10, 10)))
            with stage("compute"):
                y = client.persist(x.map_blocks(slow_block, 0.2, dtype=float))
                return float(client.compute(y.sum()).result())

    return flow(name=name, version="1", task_runner=runner)(body)


def the_run(store: RunStore, pipeline: str, seeded: set[str]) -> dict:
    [run_id] = [r["run_id"] for r in store.list_runs(pipeline) if r["run_id"] not in seeded]
    return store.read_manifest(pipeline, run_id)
