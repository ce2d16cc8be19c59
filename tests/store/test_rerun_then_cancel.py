"""Defect 1 of issue 56 as it arises: a task's worker leaves while the task runs (the plugin
counts a rerun and creates the prefix's aggregate with no finished task), then the task is
cancelled. The run's tasks table is stored and read back as the next night's baseline
reads it: on 5beef4d its quantiles were NaN and the reader refused the table.

Real transitions on an in-process LocalCluster: the task blocks on a ``threading.Event``
until it has been rescheduled and cancelled, so the order of events does not depend on time.
Not a ``distributed.Event``: an in-process worker's task uses the first worker's client
(it is the process's default), so the rerun failed with "ConnectionPool is closed" once
that worker left, and counted as a finished task (CI, stop 61).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pandas as pd
from distributed import Client, LocalCluster

from prefect_dask_profiling import collect, install, stage, uninstall
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary import summarise

PIPE = "rerun-cancel"
#: the in-process workers' tasks wait on it until the test lets go
RELEASE = threading.Event()


def blocked() -> int:
    """Wait for the test to let go (bounded, so a broken test never hangs a worker)."""
    RELEASE.wait(timeout=60)
    return 1


def quick(x: int) -> int:
    return x + 1


def _wait_for(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError("the cluster never reached the expected state")


def test_a_rerun_then_cancelled_prefix_is_stored_readable(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        name = install(client)
        RELEASE.clear()
        try:
            with client.as_current(), stage("work"):
                assert client.submit(quick, 1, pure=False).result() == 2
                future = client.submit(blocked, pure=False)
            running_on = _wait_for(lambda: next(
                (w for w, keys in client.processing().items() if future.key in keys), None))
            # the worker leaves while the task runs: still wanted, so it is a rerun
            client.sync(cluster.scheduler.remove_worker, address=running_on,
                        stimulus_id="test-worker-leaves")
            _wait_for(lambda: any(future.key in keys and w != running_on
                                  for w, keys in client.processing().items()))
            future.cancel()  # a dropped future: the rerun never finishes
            _wait_for(lambda: future.key not in client.who_has() and future.cancelled())
            record = collect(client, name)
        finally:
            RELEASE.set()
            uninstall(client, name)
    rows = record.tasks[record.tasks["prefix"] == "blocked"]
    assert len(rows) == 1 and int(rows["tasks"].iloc[0]) == 0 \
        and int(rows["reruns"].iloc[0]) >= 1, record.tasks
    summary = summarise(record)
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    run_id = new_run_id(datetime(2026, 3, 2, 2, tzinfo=UTC))
    store.write_run(PIPE, run_id, {"tasks": summary},
                    {"version": "1", "status": "healthy", "state": "COMPLETED"})
    table = store.read_tables(PIPE, [run_id], "tasks")[run_id]
    assert isinstance(table, pd.DataFrame), table  # the next night's baseline read
    row = table[table["prefix"] == "blocked"].iloc[0]
    assert row["tasks"] == 0 and pd.isna(row["p50_s"]) and pd.isna(row["p95_s"])
    assert (table[table["prefix"] == "quick"]["p50_s"] >= 0).all()
