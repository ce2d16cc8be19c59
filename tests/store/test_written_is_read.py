"""What the writer stores, the reader accepts (issue 56, defect 1): generated run records,
summarised as a run's end summarises them, stored on a local folder and read back.

The cases that broke it: a ``(stage, prefix)`` with no finished task (its only runs were
reruns of tasks then cancelled: ``tasks=0`` and an empty sketch), and a record built through
the API without sketches. Their quantiles were stored as ``NaN`` and the history reader
refused the table, so every later night of the pipeline went unjudged.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.store.tables import TOTALS_COLUMNS
from prefect_dask_profiling.summary import RunRecord, summarise
from prefect_dask_profiling.summary.record import TASK_COLUMNS
from prefect_dask_profiling.timing.sketch import QuantileSketch

PIPE = "written"
T0 = datetime(2026, 3, 1, 2, tzinfo=UTC)
# names a CSV must quote, or could read as numbers or missing values
ODD = st.sampled_from(["sum", "open,dataset", 'say "é"', "007", "1e5", "nan", "NA", "None",
                       "-", " lead", "trail ", "x\ny", "tab\there", "日本", "a;b", "#x"])
NAMES = st.one_of(ODD, st.text(st.characters(blacklist_categories=("Cs",),
                                             blacklist_characters="\x00\r"),
                               min_size=1, max_size=12))
SECONDS = st.one_of(st.floats(0.0, 1e6, allow_nan=False), st.sampled_from([0.0, 1e-9, 1e15,
                                                                          1e300]))


@st.composite
def rows(draw) -> dict:
    """One (stage, prefix) aggregate: finished runs (maybe none: reruns only), times,
    bytes, and whether its sketch was recorded."""
    tasks = draw(st.one_of(st.just(0), st.integers(1, 10**12)))
    total = 0.0 if tasks == 0 else draw(SECONDS)
    timed = tasks > 0 and draw(st.booleans())
    return {"stage": draw(NAMES), "prefix": draw(NAMES), "tasks": tasks,
            "errors": draw(st.integers(0, tasks)) if tasks else 0,
            "reruns": draw(st.integers(0, 5)), "compute_s": total,
            "p50_s": draw(st.one_of(st.just(math.nan), SECONDS)),
            "p95_s": draw(st.one_of(st.just(math.nan), SECONDS)),
            "max_s": total, "nbytes": draw(st.integers(0, 10**18)), "max_nbytes": 0,
            "transfer_s": 0.0, "disk_read_s": 0.0, "disk_write_s": 0.0,
            "first_start": 0.0, "last_stop": 1.0, "timed": timed,
            "samples": draw(st.lists(st.floats(1e-6, 1e6), min_size=1, max_size=5))}


def record_of(generated: list[dict]) -> RunRecord:
    """A record built through the API: the generated rows (one per stage and prefix), with
    a sketch only where the row was timed."""
    unique = list({(r["stage"], r["prefix"]): r for r in generated}.values())
    sketches = {}
    for r in unique:
        if r["timed"]:
            sketch = QuantileSketch()
            for x in r["samples"]:
                sketch.add(x)
            sketches[(r["stage"], r["prefix"])] = sketch
    tasks = pd.DataFrame([{c: r[c] for c in TASK_COLUMNS} for r in unique],
                         columns=TASK_COLUMNS)
    empty = pd.DataFrame()
    return RunRecord(name="generated", started=0.0, collected=1.0, tasks=tasks,
                     orchestration=empty, workers=empty, samples=empty, transfers=empty,
                     timeline=[], sketches=sketches)


def same_table(read: pd.DataFrame, written: pd.DataFrame) -> None:
    """The table read back holds the written values (names as text, numbers exactly,
    empty quantiles empty)."""
    assert list(read.columns) == list(written.columns)
    assert len(read) == len(written)
    for column in written.columns:
        a, b = read[column].tolist(), written[column].tolist()
        if column in ("stage", "prefix"):
            assert a == [str(v) for v in b], column
        else:
            assert np.array_equal(np.asarray(a, float), np.asarray(b, float),
                                  equal_nan=True), column


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(generated=st.lists(rows(), max_size=6), night=st.integers(0, 10_000))
def test_every_stored_tasks_table_is_read_back_the_same(tmp_path, generated, night):
    record = record_of(generated)
    summary = summarise(record)
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    run_id = new_run_id(T0 + timedelta(days=night, microseconds=len(generated)))
    if store.fs.exists(store._path(layout.run_dir(PIPE, run_id))):
        return  # the same run id drawn twice on the example's folder
    result = store.write_run(PIPE, run_id, {"tasks": summary},
                             {"version": "1", "status": "healthy", "state": "COMPLETED"})
    assert not result.spooled, result.warnings
    same_table(store.read_table(PIPE, run_id, "tasks"), summary)
    # the history reads: the baseline's tables, and the drift series' totals
    tables = store.read_tables(PIPE, [run_id], "tasks")
    assert isinstance(tables[run_id], pd.DataFrame), tables[run_id]
    totals = store.read_totals(PIPE, [run_id])[run_id]
    assert isinstance(totals, pd.DataFrame), totals
    same_table(totals[TOTALS_COLUMNS], summary[TOTALS_COLUMNS])


def test_a_rerun_only_prefix_is_stored_with_empty_quantiles(tmp_path):
    """The NaN row of defect 1: a prefix whose only run was a rerun, beside a timed one."""
    timed = {"stage": "read", "prefix": "load", "tasks": 3, "timed": True, "samples": [1.0]}
    rerun = {"stage": "read", "prefix": "cancelled", "tasks": 0, "reruns": 1, "timed": False,
             "samples": []}
    base = {"errors": 0, "reruns": 0, "compute_s": 3.0, "p50_s": math.nan, "p95_s": math.nan,
            "max_s": 1.0, "nbytes": 10, "max_nbytes": 10, "transfer_s": 0.0,
            "disk_read_s": 0.0, "disk_write_s": 0.0, "first_start": 0.0, "last_stop": 1.0}
    record = record_of([{**base, **timed}, {**base, **rerun, "compute_s": 0.0}])
    summary = summarise(record)
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    run_id = new_run_id(T0)
    store.write_run(PIPE, run_id, {"tasks": summary},
                    {"version": "1", "status": "healthy", "state": "COMPLETED"})
    raw = store.fs.cat_file(store._path(layout.run_file(PIPE, run_id, "tasks.csv"))).decode()
    assert "nan" not in raw.lower().replace("cancelled", "")
    read = store.read_table(PIPE, run_id, "tasks")
    row = read[read["prefix"] == "cancelled"].iloc[0]
    assert row["tasks"] == 0 and math.isnan(row["p50_s"]) and math.isnan(row["p95_s"])
