"""Compact tables from a run record: the per-prefix summary and utilisation.

``summarise`` turns tens of thousands of tasks into a short table of where the time went
(``tasks, total_s, p50_s, p95_s, gb_out`` first: the columns a reader scans); ``utilisation``
divides task seconds by the thread-seconds that were available, per run and per stage.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import pandas as pd

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.timing.sketch import QuantileSketch

SUMMARY_COLUMNS = ["tasks", "total_s", "p50_s", "p95_s", "gb_out", "max_s", "errors",
                   "reruns", "transfer_s", "disk_read_s", "disk_write_s", "share"]
UTILISATION_HIGH = 1.05
UTILISATION_LOW = 0.40


class PrefixSummary(TypedDict):
    """A row of ``summarise(record, by="prefix")`` (``prefix`` and :data:`SUMMARY_COLUMNS`):
    task runs, their total, median, 95th-percentile and longest seconds, GB returned,
    failed runs, reruns, transfer and disk seconds, and the share of the run's task time."""

    prefix: str
    tasks: int
    total_s: float
    p50_s: float
    p95_s: float
    gb_out: float
    max_s: float
    errors: int
    reruns: int
    transfer_s: float
    disk_read_s: float
    disk_write_s: float
    share: float


class UtilisationRow(TypedDict):
    """A row of :func:`utilisation` with its ``scope`` (``"run"`` or a stage name): task
    seconds over the thread-seconds available in the scope's window (``None``: no window)
    and its :func:`reading`."""

    scope: str
    task_s: float
    wall_s: float
    thread_s: float
    utilisation: float | None
    reading: str


def summarise(record: RunRecord, by: str = "stage") -> pd.DataFrame:
    """Per-prefix summary, sorted by ``total_s`` descending.

    Parameters
    ----------
    record
        The run's record.
    by
        ``"stage"`` for one row per (stage, prefix) or ``"prefix"`` to merge stages.

    Returns
    -------
    A DataFrame with columns ``stage`` (when ``by="stage"``), ``prefix`` and
    ``SUMMARY_COLUMNS``. ``tasks`` counts every finished task run, erred ones included, and
    ``total_s``, ``p50_s``, ``p95_s`` and ``max_s`` cover the same runs; ``errors`` is how
    many of them failed. ``p50_s`` and ``p95_s`` are ``NaN`` (stored as empty cells) where
    no task run was timed: a prefix whose only runs were reruns of tasks then cancelled.
    The time wrapper tasks spent waiting on the Dask work they launched is not included
    (it is in ``record.orchestration``); their own work is.
    """
    if by not in ("stage", "prefix"):
        raise InvalidInput(f"by must be 'stage' or 'prefix', got {by!r}")
    keys = ["stage", "prefix"] if by == "stage" else ["prefix"]
    t = record.tasks
    if t.empty:
        return pd.DataFrame(columns=keys + SUMMARY_COLUMNS)
    g = t.groupby(keys, sort=False)
    out = pd.DataFrame({
        "tasks": g["tasks"].sum(),
        "total_s": g["compute_s"].sum(),
        "gb_out": g["nbytes"].sum() / 1e9,
        "max_s": g["max_s"].max(),
        "errors": g["errors"].sum(),
        "reruns": g["reruns"].sum(),
        "transfer_s": g["transfer_s"].sum(),
        "disk_read_s": g["disk_read_s"].sum(),
        "disk_write_s": g["disk_write_s"].sum(),
    })
    p50, p95 = {}, {}
    for ident, rows in g:
        # groupby over a one-key list yields 1-tuples, while out's index is flat
        label = ident[0] if len(keys) == 1 else ident
        p50[label], p95[label] = _quantiles(record, rows)
    out["p50_s"] = pd.Series(p50, dtype=float)
    out["p95_s"] = pd.Series(p95, dtype=float)
    total = out["total_s"].sum()
    out["share"] = out["total_s"] / total if total > 0 else 0.0
    out = out.reset_index()[keys + SUMMARY_COLUMNS]
    out["tasks"] = out["tasks"].astype(int)
    return out.sort_values("total_s", ascending=False, kind="stable").reset_index(drop=True)


def _quantiles(record: RunRecord, rows: pd.DataFrame) -> tuple[float, float]:
    """The median and 95th percentile of one group's task seconds.

    From the merged sketches of its rows; a single row without a sketch (a record built
    through the API) keeps the quantiles it carries. Unknown quantiles are ``NaN``: a
    prefix with no finished task (only reruns, then cancelled) or without a sketch. They
    are stored as empty cells, which :func:`~prefect_dask_profiling.store.tables.check_tasks`
    accepts by design: they are never made up from the totals.
    """
    sketch = _merged_sketch(record, rows)
    if sketch.n:
        return sketch.quantile(0.5), sketch.quantile(0.95)
    if len(rows) == 1 and int(rows["tasks"].iloc[0]) > 0:
        return _finite(rows, "p50_s"), _finite(rows, "p95_s")
    return float("nan"), float("nan")


def _finite(rows: pd.DataFrame, column: str) -> float:
    """The first row's ``column`` as a finite float, else ``NaN`` (absent or not finite)."""
    if column not in rows:
        return float("nan")
    value = pd.to_numeric(rows[column], errors="coerce").iloc[0]
    return float(value) if pd.notna(value) and np.isfinite(value) else float("nan")


def _merged_sketch(record: RunRecord, rows: pd.DataFrame) -> QuantileSketch:
    merged = QuantileSketch()
    for stage, prefix in zip(rows["stage"], rows["prefix"], strict=True):
        sketch = record.sketches.get((stage, prefix))
        if sketch is not None:
            merged.merge(sketch)
    return merged


def reading(value: float | None) -> str:
    """What a utilisation value says: above 1.05 the timings overcount, below 0.40 the
    cluster waited (oversized or starved of input), in between the timings account for the
    run."""
    if value is None or value != value:
        return "no tasks"
    if value > UTILISATION_HIGH:
        return "over 1.05: the timings do not account for the run"
    if value < UTILISATION_LOW:
        return "below 0.40: cluster oversized or starved of input"
    return "ok: timings account for the run"


def utilisation(record: RunRecord) -> pd.DataFrame:
    """Task seconds / thread-seconds available, for the run and for each stage.

    The window of a stage is its execution window (first compute start to last compute
    stop of its tasks); thread-seconds are integrated over it as workers join and leave.

    Returns
    -------
    A DataFrame indexed by scope (``"run"``, then the stage names) with columns
    ``task_s, wall_s, thread_s, utilisation, reading``.
    """
    rows = []
    for scope in ["run", *record.stages]:
        stage = None if scope == "run" else scope
        window = record.window(stage)
        t = record.tasks if stage is None else record.stage_rows("tasks", stage)
        task_s = float(t["compute_s"].sum())
        if window is None:
            rows.append({"scope": scope, "task_s": task_s, "wall_s": 0.0, "thread_s": 0.0,
                         "utilisation": None, "reading": reading(None)})
            continue
        thread_s = record.thread_seconds(*window)
        value = task_s / thread_s if thread_s > 0 else None
        rows.append({"scope": scope, "task_s": task_s, "wall_s": window[1] - window[0],
                     "thread_s": thread_s, "utilisation": value, "reading": reading(value)})
    return pd.DataFrame(rows).set_index("scope")
