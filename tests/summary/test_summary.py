"""summarise / utilisation / RunRecord on records built from plugin snapshots (no cluster)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.summary.tables import SUMMARY_COLUMNS, reading, summarise, utilisation
from prefect_dask_profiling.timing.plugin import TaskTimings
from prefect_dask_profiling.timing.sketch import DEFAULT_ALPHA

T0 = 10_000.0  # small, so start + seconds - start keeps full precision


def _finish(plugin: TaskTimings, key, start: float, seconds: float, *, erred: bool = False,
            nbytes: int = 1000, transfer: float = 0.0) -> None:
    startstops = []
    if transfer:
        startstops.append({"action": "transfer", "start": start - transfer, "stop": start,
                           "source": "tcp://127.0.0.1:2"})
    startstops.append({"action": "compute", "start": start, "stop": start + seconds})
    plugin.transition(key, "processing", "erred" if erred else "memory",
                      startstops=tuple(startstops), nbytes=nbytes, worker="tcp://127.0.0.1:1",
                      stimulus_id="task-finished-1")


def _record(stages: dict[str, list[tuple]], timeline: list[tuple[float, int]]) -> RunRecord:
    """A record whose stages hold ``(key, start, seconds)`` tasks, built by a real plugin."""
    snap: dict = {"tasks": [], "orchestration": []}
    for stage, tasks in stages.items():
        plugin = TaskTimings("t", sample_interval=0)
        for key, start, seconds in tasks:
            _finish(plugin, key, start, seconds)
        part = plugin.snapshot()
        for row in part["tasks"]:
            row["stage"] = stage
        snap["tasks"] += part["tasks"]
        snap.update({k: v for k, v in part.items() if k not in ("tasks", "orchestration")})
    snap["timeline"] = timeline
    return RunRecord.from_snapshot(snap, workers=1, threads=timeline[-1][1])


@pytest.fixture(scope="module")
def two_stage() -> tuple[RunRecord, dict]:
    rng = np.random.default_rng(3)
    durations = {("read", "open"): rng.lognormal(-2, 0.5, 300),
                 ("read", "getitem"): rng.lognormal(-5, 0.3, 200),
                 ("reduce", "getitem"): rng.lognormal(-4, 0.3, 100),
                 ("reduce", "median"): rng.lognormal(-1, 0.2, 50)}
    offsets = {"read": T0, "reduce": T0 + 100}
    stages: dict[str, list[tuple]] = {}
    for (stage, prefix), values in durations.items():
        stages.setdefault(stage, []).extend(
            ((f"{prefix}-{i:032x}", i), offsets[stage] + i * 0.1, float(d))
            for i, d in enumerate(values))
    timeline = [(T0 - 5, 4), (T0 + 50, 8), (T0 + 120, 2)]
    return _record(stages, timeline), durations


def test_summary_columns_order_and_sort(two_stage) -> None:
    record, durations = two_stage
    table = summarise(record)
    assert list(table.columns) == ["stage", "prefix", *SUMMARY_COLUMNS]
    assert list(table.columns[2:7]) == ["tasks", "total_s", "p50_s", "p95_s", "gb_out"]
    assert table["total_s"].is_monotonic_decreasing
    assert len(table) == len(durations)
    assert table["share"].sum() == pytest.approx(1.0)


@pytest.mark.parametrize("by", ["stage", "prefix"])
def test_counts_totals_and_quantiles_match_the_raw_durations(two_stage, by: str) -> None:
    record, durations = two_stage
    raw: dict = {}
    for (stage, prefix), values in durations.items():
        raw.setdefault((stage, prefix) if by == "stage" else prefix, []).extend(values)
    table = summarise(record, by=by)
    keys = ["stage", "prefix"] if by == "stage" else "prefix"
    table = table.set_index(keys)
    assert set(table.index) == set(raw)
    for ident, values in raw.items():
        row = table.loc[ident]
        assert row["tasks"] == len(values)
        assert row["total_s"] == pytest.approx(sum(values), rel=1e-5)
        assert row["max_s"] == pytest.approx(max(values), rel=1e-5)
        assert row["gb_out"] == pytest.approx(len(values) * 1000 / 1e9)
        for q, column in ((0.5, "p50_s"), (0.95, "p95_s")):
            low = np.quantile(values, q, method="lower")
            high = np.quantile(values, q, method="higher")
            assert low * (1 - DEFAULT_ALPHA) <= row[column] <= high * (1 + DEFAULT_ALPHA)


def test_by_prefix_merges_stages(two_stage) -> None:
    record, _ = two_stage
    by_prefix = summarise(record, by="prefix").set_index("prefix")
    by_stage = summarise(record).groupby("prefix")["tasks"].sum()
    assert by_prefix.loc["getitem", "tasks"] == by_stage["getitem"] == 300
    assert not by_prefix[["p50_s", "p95_s"]].isna().any().any()


def test_errors_and_reruns_are_columns() -> None:
    plugin = TaskTimings("t", sample_interval=0)
    _finish(plugin, "ok-1", T0, 0.5)
    _finish(plugin, "boom-1", T0, 0.1, erred=True)
    _finish(plugin, "boom-2", T0, 0.2, erred=True)
    snap = plugin.snapshot()
    snap["timeline"] = [(T0 - 1, 1)]
    table = summarise(RunRecord.from_snapshot(snap)).set_index("prefix")
    # erred runs are counted in tasks (and their seconds in total_s); errors says how many
    assert table.loc["boom", "errors"] == 2 and table.loc["boom", "tasks"] == 2
    assert table.loc["boom", "total_s"] == pytest.approx(0.3)
    assert table.loc["ok", "errors"] == 0 and table.loc["ok", "tasks"] == 1


def test_transfer_seconds_are_kept_apart_from_compute() -> None:
    plugin = TaskTimings("t", sample_interval=0)
    _finish(plugin, "sum-1", T0, 0.5, transfer=0.25)
    snap = plugin.snapshot()
    snap["timeline"] = [(T0 - 1, 1)]
    record = RunRecord.from_snapshot(snap)
    row = summarise(record).iloc[0]
    assert row["total_s"] == pytest.approx(0.5) and row["transfer_s"] == pytest.approx(0.25)
    assert record.transfers.iloc[0][["source", "destination", "count"]].tolist() == [
        "tcp://127.0.0.1:2", "tcp://127.0.0.1:1", 1]


def test_bad_by_is_rejected(two_stage) -> None:
    with pytest.raises(ValueError, match="by must be"):
        summarise(two_stage[0], by="worker")


def test_empty_record() -> None:
    record = RunRecord.from_snapshot(TaskTimings("t", sample_interval=0).snapshot())
    table = summarise(record)
    assert table.empty and list(table.columns) == ["stage", "prefix", *SUMMARY_COLUMNS]
    util = utilisation(record)
    assert list(util.index) == ["run"] and util.loc["run", "reading"] == "no tasks"


def _hand_thread_seconds(timeline: list[tuple[float, int]], start: float, stop: float) -> float:
    edges = [t for t, _ in timeline] + [math.inf]
    total = 0.0
    for (t, n), t_next in zip(timeline, edges[1:], strict=True):
        lo, hi = max(t, start), min(t_next, stop)
        if hi > lo:
            total += (hi - lo) * n
    return total


def test_utilisation_integrates_threads_over_joins_and_leaves(two_stage) -> None:
    record, durations = two_stage
    util = utilisation(record)
    assert list(util.index) == ["run", "read", "reduce"]
    for scope in util.index:
        window = record.window(None if scope == "run" else scope)
        expected = _hand_thread_seconds(record.timeline, *window)
        assert util.loc[scope, "thread_s"] == pytest.approx(expected)
        assert util.loc[scope, "wall_s"] == pytest.approx(window[1] - window[0])
    # the run window spans 4 -> 8 -> 2 threads: not wall x final threads
    run = util.loc["run"]
    assert run["thread_s"] != pytest.approx(run["wall_s"] * 2)
    task_s = sum(float(np.sum(v)) for v in durations.values())
    assert run["task_s"] == pytest.approx(task_s)
    assert run["utilisation"] == pytest.approx(task_s / run["thread_s"])


def test_thread_seconds_edges() -> None:
    record = _record({"s": [("a-1", T0, 1.0)]}, [(T0, 2), (T0 + 10, 4)])
    assert record.thread_seconds(T0, T0 + 10) == pytest.approx(20)
    assert record.thread_seconds(T0 + 5, T0 + 15) == pytest.approx(5 * 2 + 5 * 4)
    assert record.thread_seconds(T0 + 20, T0 + 21) == pytest.approx(4)
    # before the first change the first known thread count is assumed
    assert record.thread_seconds(T0 - 1, T0 + 1) == pytest.approx(4)
    assert record.thread_seconds(T0 + 3, T0 + 3) == 0.0


@pytest.mark.parametrize(("value", "word"), [(None, "no tasks"), (float("nan"), "no tasks"),
                                             (1.2, "over 1.05"), (0.2, "below 0.40"),
                                             (0.8, "ok")])
def test_reading(value, word: str) -> None:
    assert reading(value).startswith(word)


def test_record_warnings_from_snapshot() -> None:
    plugin = TaskTimings("t", sample_interval=0)
    snap = plugin.snapshot()
    snap.update(internal_errors=3, last_error="Traceback...\nKeyError: 'x'\n",
                samples_dropped=7, warnings=["registered late"],
                transfer_bytes={"tcp://w1": {"overflowed": True,
                                             "entries": [["tcp://w2", 100, 0.1],
                                                         ["tcp://w2", 50, 0.1]]}})
    record = RunRecord.from_snapshot(snap)
    text = "\n".join(record.warnings)
    assert record.internal_errors == 3
    assert "registered late" in text
    assert "3 internal error(s)" in text and "KeyError: 'x'" in text and "['" not in text
    assert "7 early worker samples" in text
    assert "transfer log overflowed on tcp://w1" in text
    pair = record.transfers.set_index(["source", "destination"]).loc[("tcp://w2", "tcp://w1")]
    assert pair["bytes"] == 150


def test_task_frame_dtypes(two_stage) -> None:
    tasks = two_stage[0].tasks
    for column in ("tasks", "compute_s", "p50_s", "first_start"):
        assert pd.api.types.is_numeric_dtype(tasks[column]), column


def test_stage_rows_split_once_and_follow_a_replaced_table(two_stage) -> None:
    record, _ = two_stage
    read = record.stage_rows("tasks", "read")
    assert set(read["stage"]) == {"read"} and len(read) == (record.tasks["stage"] == "read").sum()
    assert record.stage_rows("tasks", "read") is read  # split once
    assert record.stage_rows("tasks", "nope").empty
    assert list(record.stage_rows("tasks", "nope").columns) == list(record.tasks.columns)
    record.tasks = record.tasks[record.tasks["stage"] != "read"]  # another frame: split again
    assert record.stage_rows("tasks", "read").empty
    assert record.stage_rows("io", "read").empty  # an empty table has no stage rows
