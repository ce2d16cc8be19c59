"""The index partitioned by month: windows read only recent partitions, old stores still read.

Stores written before the partitions keep every marker directly below
``index/<pipeline>/<version>/``; they are built here the way the previous code wrote them (a
run written, then its marker moved to the flat key it had), on a local folder and on moto S3.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

from prefect_dask_profiling.regression.baseline import load_baseline
from prefect_dask_profiling.regression.drift import load_series
from prefect_dask_profiling.regression.verdict import detect_regressions
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.runs import RunStore, new_run_id

PIPE, VERSION, BUCKET = "ndvi", "v1", "index-layout"
T0 = datetime(2025, 1, 3, 2, tzinfo=UTC)
STATUSES = {5: "regressed", 9: "failed", 17: "regressed"}  # by night; the rest healthy


def tasks(scale: float = 1.0) -> pd.DataFrame:
    total = np.array([20.0 * scale, 10.0])
    return pd.DataFrame({
        "stage": ["read", "reduce"], "prefix": ["open_dataset", "nanmedian"], "tasks": [40, 8],
        "total_s": total, "p50_s": total / 40, "p95_s": total / 20, "gb_out": [1.0, 0.0],
        "max_s": total / 10, "errors": [0, 0], "reruns": [0, 0], "transfer_s": [0.0, 0.0],
        "disk_read_s": [0.0, 0.0], "disk_write_s": [0.0, 0.0], "share": total / total.sum()})


def put(store: RunStore, night: int, *, flat: bool = False, version: str = VERSION,
        status: str | None = None) -> str:
    """One run every 9 days (so the history spans many months); ``flat``: its marker where
    the previous layout wrote it."""
    run_id = new_run_id(T0 + timedelta(days=9 * night))
    status = status or STATUSES.get(night, "healthy")
    jitter = 1.0 + 0.02 * ((night * 7) % 5 - 2)
    result = store.write_run(PIPE, run_id, {"tasks": tasks(jitter)},
                             {"version": version, "status": status, "state": "COMPLETED"})
    assert not result.spooled, result.warnings
    if flat:
        new = store._path(layout.index_marker(PIPE, version, run_id, status))
        old = store._path(layout.flat_index_marker(PIPE, version, run_id, status))
        store.fs.mv(new, old)
    return run_id


def judged(store: RunStore, latest: str) -> tuple[list[str], pd.DataFrame, pd.DataFrame]:
    """Baseline runs, verdicts of ``latest`` against them, and the drift series."""
    base = load_baseline(store, PIPE, VERSION, n=8, exclude_run_id=latest)
    verdicts = detect_regressions(base.history, store.read_table(PIPE, latest))
    series, _ = load_series(store, PIPE, VERSION, exclude_run_id=latest, max_runs=12,
                            keep_first=3)
    return base.runs, verdicts, series


def test_markers_are_partitioned_by_month_of_the_run_id():
    assert layout.index_marker("p", "v", "20261201T020000Z-abcdef", "healthy") == \
        "index/p/v/2026-12/20261201T020000Z-abcdef.healthy"
    assert layout.index_marker("p", "v", "my-run", "healthy") == "index/p/v/undated/my-run.healthy"
    for rel in ("index/p/v/2026-12/20261201T020000Z-abcdef.healthy",
                "index/p/v/20261201T020000Z-abcdef.healthy"):  # both layouts parse
        assert layout.parse_marker(rel, ("healthy",)).run_id == "20261201T020000Z-abcdef"
    assert isinstance(layout.parse_marker("index/p/v/2026-11/20261201T020000Z-abcdef.healthy",
                                          ("healthy",)), str)  # not in its run's month


def test_a_window_is_the_head_of_the_full_listing(store):
    ids = [put(store, night) for night in range(24)]
    full = store.list_runs(PIPE, VERSION)
    assert [r["run_id"] for r in full] == sorted(ids, reverse=True)
    newest = store.list_runs(PIPE, VERSION, newest=4, counting=("healthy",))
    # down to the 4th healthy run: nights 23, 22, 21, 20 (17 regressed is older)
    assert newest == full[:4]
    older = store.list_runs(PIPE, VERSION, newest=3, counting=("healthy",), before=ids[18])
    # down to the 3rd healthy run below night 18; regressed night 17 is listed, not counted
    assert [r["run_id"] for r in older] == [ids[17], ids[16], ids[15], ids[14]]
    oldest = store.list_runs(PIPE, VERSION, oldest=6, counting=("healthy",), since=ids[3])
    assert [r["run_id"] for r in oldest] == sorted(ids[3:11], reverse=True)  # 5, 9 do not count


def test_a_window_lists_only_the_partitions_it_needs(store):
    ids = [put(store, night) for night in range(30)]  # ~9 months
    listed: list[str] = []
    find = store._find  # every listing of files below a folder, local or S3

    def spy(rel, *args, **kwargs):
        listed.append(rel)
        return find(rel, *args, **kwargs)

    store._find = spy
    runs = store.list_runs(PIPE, VERSION, newest=3)
    assert [r["run_id"] for r in runs] == ids[-3:][::-1]
    months = {layout.index_partition(r) for r in ids}
    partitions = [p for p in listed if p.startswith("index/")]
    assert 1 <= len(partitions) <= 2 < len(months), partitions


def test_a_store_written_by_the_old_layout_is_judged_the_same(store, tmp_path):
    ids = [put(store, night, flat=True) for night in range(20)]
    latest = put(store, 20, flat=True)
    flat_runs, flat_verdicts, flat_series = judged(store, latest)
    assert not [p for p in store.fs.find(store._path(layout.index_dir(PIPE)))
                if p.count("/index/") and len(p.split("/index/")[1].split("/")) == 4]
    assert len(store._find(layout.index_dir(PIPE))) == 21  # truly the old layout
    expected = [r for i, r in enumerate(ids) if STATUSES.get(i, "healthy") == "healthy"][-8:]
    assert flat_runs == expected
    # the same history in the new layout is judged identically
    again = RunStore(str(tmp_path / "new"), spool_dir=tmp_path / "spool2")
    for rel, data in store.fs.find(store._path(""), detail=False) and [
            (rel, store.fs.cat_file(store._path(rel)))
            for rel in store._find(layout.RUNS)]:
        again.fs.pipe_file(again._path(rel), data)
    for entry in store.list_runs(PIPE):
        again.fs.pipe_file(again._path(layout.index_marker(PIPE, VERSION, entry["run_id"],
                                                           entry["status"])), b"{}")
    runs, verdicts, series = judged(again, latest)
    assert runs == flat_runs
    pd.testing.assert_frame_equal(verdicts, flat_verdicts)
    pd.testing.assert_frame_equal(series, flat_series)


def test_a_store_upgraded_mid_history_reads_both_layouts(store):
    old = [put(store, night, flat=True) for night in range(12)]
    new = [put(store, night) for night in range(12, 20)]
    latest = put(store, 20)
    runs, verdicts, series = judged(store, latest)
    healthy = [r for i, r in enumerate(old + new) if STATUSES.get(i, "healthy") == "healthy"]
    assert runs == healthy[-8:]
    assert not (verdicts["verdict"] == "regression").any()
    assert sorted(series["run_id"].unique())[:3] == [old[0], old[1], old[2]]
    # the run being finished is judged the same way whichever layout its history is in
    slow = put(store, 21)
    slow_tasks = tasks(3.0)
    verdicts = detect_regressions(load_baseline(store, PIPE, VERSION, n=8,
                                                exclude_run_id=slow).history, slow_tasks)
    assert (verdicts["verdict"] == "regression").any()


def test_a_window_repairs_a_missing_marker_and_skips_a_gone_folder(store, caplog):
    ids = [put(store, night, status="healthy") for night in range(10)]
    store.fs.rm_file(store._path(layout.index_marker(PIPE, VERSION, ids[-1], "healthy")))
    store.fs.rm(store._path(layout.run_dir(PIPE, ids[-2])), recursive=True)
    put(store, 3, version="v2", status="healthy")  # another version's run: no repair
    with caplog.at_level(logging.WARNING):
        runs = [r["run_id"] for r in store.list_runs(PIPE, VERSION, newest=3)]
    assert runs == [ids[-1], ids[-3], ids[-4]]
    assert ids[-1] in caplog.text and "no index marker" in caplog.text
    assert ids[-2] in caplog.text and "is gone" in caplog.text
    assert store.fs.exists(store._path(layout.index_marker(PIPE, VERSION, ids[-1], "healthy")))
    assert "v2" not in {r["version"] for r in store.list_runs(PIPE, VERSION, newest=20)}
