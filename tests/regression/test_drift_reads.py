"""Issue 56, defect 6: the drift series never thins silently.

A read error that is not damage (here the store answers with an ``IsADirectoryError`` for
one night's manifest: a cause the store cannot name, as a 503 is) used to drop that night
from the drift series with a log line, while the other families used it. Now it leaves the
judgement unavailable, naming the night and the cause; a damaged night is left out of every
family alike and named. Real local stores, real files.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from prefect_dask_profiling.errors import HistoryUnavailable
from prefect_dask_profiling.regression.drift import load_series
from prefect_dask_profiling.regression.judge import load_history
from prefect_dask_profiling.regression.rule import Rules
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.manifest import RunKey
from prefect_dask_profiling.store.runs import RunStore, new_run_id

PIPE, VERSION = "drift-reads", "1"
T0 = datetime(2026, 2, 1, 2, tzinfo=UTC)


def put(store: RunStore, night: int) -> str:
    run_id = new_run_id(T0 + timedelta(days=night))
    total = np.array([10.0 + night % 3, 2.0])
    tasks = pd.DataFrame({"stage": ["read", "reduce"], "prefix": ["sum", "sum"],
                          "tasks": [10, 2], "total_s": total, "p50_s": total / 10,
                          "p95_s": total / 5, "gb_out": [0.1, 0.0]})
    doc = {"version": VERSION, "status": "healthy", "state": "COMPLETED",
           "started": (T0 + timedelta(days=night)).isoformat(),
           "ended": (T0 + timedelta(days=night, hours=1)).isoformat()}
    assert not store.write_run(PIPE, run_id, {"tasks": tasks}, doc).spooled
    return run_id


@pytest.fixture
def nights(tmp_path) -> tuple[RunStore, list[str]]:
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    return store, [put(store, night) for night in range(6)]


def unanswerable(store: RunStore, run_id: str) -> None:
    """The night's manifest path answers with an error that is not damage (a folder)."""
    path = store._path(layout.manifest_file(PIPE, run_id))
    store.fs.rm(path)
    store.fs.makedirs(f"{path}/not-a-file", exist_ok=True)


def test_a_read_error_that_is_not_damage_stops_the_series(nights):
    store, ids = nights
    unanswerable(store, ids[2])
    with pytest.raises(HistoryUnavailable, match=ids[2]):
        load_series(store, PIPE, VERSION)
    with pytest.raises(HistoryUnavailable, match=ids[2]):
        load_history(store, RunKey(new_run_id(T0 + timedelta(10)), PIPE, VERSION), Rules())


def test_a_damaged_night_is_left_out_of_every_family_alike(nights):
    store, ids = nights
    path = store._path(layout.manifest_file(PIPE, ids[2]))
    store.fs.pipe_file(path, store.fs.cat_file(path)[:50])  # truncated
    with store.remembering_reads():
        history = load_history(store, RunKey(new_run_id(T0 + timedelta(10)), PIPE, VERSION),
                               Rules())
    assert [s.run_id for s in history.skipped] == [ids[2]]
    series = set(history.reads["drift"].data["run_id"])
    assert ids[2] not in series
    assert ids[2] not in history.baseline.runs
    assert series == set(history.baseline.runs) == set(ids) - {ids[2]}
    assert any(ids[2] in w for w in history.warnings)
