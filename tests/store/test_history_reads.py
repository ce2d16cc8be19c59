"""Reading a night's history cheaply, on a local folder and on moto's S3 server.

The drift series reads one object per run: the manifest, which carries the totals of the
run's tasks table. Stores written before the totals (manifests without them) are read from
their tables and judged the same. Listings send one request per folder, and a run-folder
listing answers every later window it covers while reads are remembered.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from helpers.s3_servers import boto_client, record_calls, reset_moto, s3_options

from prefect_dask_profiling.regression.drift import detect_drift, load_series
from prefect_dask_profiling.regression.judge import load_history
from prefect_dask_profiling.regression.rule import Rules
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.errors import DamagedRecord
from prefect_dask_profiling.store.manifest import RunKey, dump
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.store.tables import (
    TOTALS_COLUMNS,
    decode_table,
    decode_totals,
    encode_files,
    totals_of,
)

PIPE, VERSION, BUCKET = "ndvi", "v1", "history-reads"
T0 = datetime(2026, 1, 20, 2, tzinfo=UTC)  # one run a day: the history spans two months
NIGHTS = 14


def tasks(night: int) -> pd.DataFrame:
    """A drifting prefix, and names CSV must quote or could take for numbers."""
    total = np.array([10.0 * 1.12 ** night, 2.0 + night % 3, 5.0])
    return pd.DataFrame({
        "stage": ["read", "1", "reduce"], "prefix": ["open,dataset", "007", 'say "é"'],
        "tasks": [40, 3, 8], "total_s": total, "p50_s": total / 40, "p95_s": total / 20,
        "gb_out": [1.0, 0.0, 0.5]})


def put(store: RunStore, night: int, status: str = "healthy", start: datetime = T0) -> str:
    run_id = new_run_id(start + timedelta(days=night))
    doc = {"version": VERSION, "status": status, "state": "COMPLETED",
           "started": (start + timedelta(days=night)).isoformat()}
    result = store.write_run(PIPE, run_id, {"tasks": tasks(night)}, doc)
    assert not result.spooled, result.warnings
    return run_id


def edit_manifest(store: RunStore, run_id: str, change) -> None:
    """Rewrite a stored manifest with ``change(doc)`` applied (a store of another version)."""
    path = store._path(layout.manifest_file(PIPE, run_id))
    doc = json.loads(store.fs.cat_file(path))
    change(doc)
    store.fs.pipe_file(path, dump(doc))


def without_totals(doc: dict) -> None:
    doc.pop("totals")  # what the manifests of earlier versions hold


def spy_reads(store: RunStore) -> list[str]:
    """Paths (below the root) of the files the store reads from now on, each request."""
    if store.kind == "s3":  # a GET's URL path is its key: the root's prefix, then the path
        key = store.root.partition("/")[2]
        return record_calls(store, "GetObject",
                            lambda params: params["url_path"].removeprefix(f"/{key}/"))
    read: list[str] = []
    cat_file = store.fs.cat_file

    def spy(path, *args, **kwargs):
        read.append(str(path).removeprefix(f"{store.root}/"))
        return cat_file(path, *args, **kwargs)

    store.fs.cat_file = spy
    return read


def series_of(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A fresh store's drift series of the whole history, and its drift verdicts."""
    with store.remembering_reads():
        series, _ = load_series(store, PIPE, VERSION)
    return series, detect_drift(series)


def reopened(store: RunStore, moto: str) -> RunStore:
    """The same store, opened again: nothing remembered."""
    options = s3_options(moto) if store.kind == "s3" else None
    return RunStore(store.url, options, spool_dir=store.spool_dir)


@pytest.mark.parametrize("night", [0, 7])
def test_totals_give_back_what_the_tasks_table_gives(night):
    frames = [tasks(night), tasks(night).assign(total_s=[3, 4, 5])]  # float and int totals
    for frame in frames:
        data = encode_files({"tasks": frame}, None)["tasks.csv"]
        stored = json.loads(dump(totals_of(data)))
        pd.testing.assert_frame_equal(decode_totals(stored, "here"),
                                      decode_table(data, "tasks", "here")[TOTALS_COLUMNS])


def test_tables_json_would_change_carry_no_totals():
    empty = encode_files({"tasks": tasks(0).iloc[:0]}, None)["tasks.csv"]
    unnamed = encode_files({"tasks": tasks(0).assign(prefix=["a", None, "c"])}, None)
    assert totals_of(empty) is None
    assert totals_of(unnamed["tasks.csv"]) is None  # read back as NaN, not as a name
    assert totals_of(b"\x00\x01garbage\n\xff") is None


GOOD = {"stage": ["read"], "prefix": ["open"], "tasks": [4], "total_s": [1.5]}


@pytest.mark.parametrize("totals", [
    ["read", "open", 4, 1.5],
    {k: v for k, v in GOOD.items() if k != "tasks"},
    {**GOOD, "total_s": [1.5, 2.5]},
    {k: [] for k in GOOD},
    {**GOOD, "stage": [1]},
    {**GOOD, "total_s": [None]},
    {**GOOD, "tasks": [True]},
], ids=["not a dict", "a column missing", "unequal lengths", "empty", "a number as name",
        "a missing total", "a boolean count"])
def test_malformed_totals_are_damage_naming_the_manifest(totals):
    with pytest.raises(DamagedRecord, match="runs/x/manifest.json"):
        decode_totals(totals, "runs/x/manifest.json")


def test_the_drift_series_reads_one_object_per_run(store, moto):
    ids = [put(store, night) for night in range(NIGHTS)]
    store = reopened(store, moto)
    read = spy_reads(store)
    series, drift = series_of(store)
    assert sorted(read) == sorted(layout.manifest_file(PIPE, r) for r in ids)
    assert sorted(series["run_id"].unique()) == ids
    assert list(series.columns) == ["run_id", "started", "stage", "prefix", "tasks", "total_s"]
    newest = series[series["run_id"] == ids[-1]].drop(columns=["run_id", "started"])
    pd.testing.assert_frame_equal(newest.reset_index(drop=True),
                                  store.read_table(PIPE, ids[-1])[TOTALS_COLUMNS])
    assert drift.loc[drift["prefix"] == "open,dataset", "verdict"].item() == "drift"


@pytest.mark.parametrize("older", ["every run", "every other run"])
def test_a_store_written_before_the_totals_is_judged_the_same(store, moto, older):
    ids = [put(store, night, "regressed" if night == 9 else "healthy")
           for night in range(NIGHTS)]
    series, drift = series_of(reopened(store, moto))
    stripped = ids if older == "every run" else ids[::2]
    for run_id in stripped:
        edit_manifest(store, run_id, without_totals)
    store = reopened(store, moto)
    read = spy_reads(store)
    old_series, old_drift = series_of(store)
    pd.testing.assert_frame_equal(old_series, series)
    pd.testing.assert_frame_equal(old_drift, drift)
    assert sorted(p for p in read if p.endswith("/tasks.csv")) == sorted(
        layout.table_file(PIPE, r, "tasks") for r in stripped)  # their tables, once each


def test_malformed_totals_are_read_from_the_table_with_a_warning(store, moto, caplog):
    ids = [put(store, night) for night in range(NIGHTS)]
    series, _ = series_of(reopened(store, moto))
    edit_manifest(store, ids[5], lambda doc: doc.update(totals={"stage": "read"}))
    with caplog.at_level(logging.WARNING, logger="prefect_dask_profiling"):
        again, _ = series_of(reopened(store, moto))
    pd.testing.assert_frame_equal(again, series)
    assert any(ids[5] in m and "manifest.json" in m and "tasks table instead" in m
               for m in caplog.messages), caplog.messages


def s3_store(moto: str, tmp_path) -> RunStore:
    reset_moto(moto)
    boto_client(moto).create_bucket(Bucket=BUCKET)
    return RunStore(f"s3://{BUCKET}/root", s3_options(moto), spool_dir=tmp_path / "spool")


def record_listings(store: RunStore) -> list[tuple[str, str]]:
    """``(prefix, start-after)`` below the root of every listing the store sends from now."""
    return record_calls(store, "ListObjectsV2", lambda params: (
        params["query_string"]["prefix"].removeprefix("root/"),
        params["query_string"].get("start-after", "").removeprefix("root/")))


def test_listings_send_one_request_each_and_windows_reuse_the_run_folders(moto, tmp_path):
    store = s3_store(moto, tmp_path)
    ids = [put(store, night) for night in range(NIGHTS)]  # 20 January to 2 February
    lists = record_listings(store)
    heads = record_calls(store, "HeadObject")
    assert store.accepted(PIPE, VERSION) == []  # an empty folder: one listing, no HEAD
    assert lists == [(f"{layout.accepted_dir(PIPE, VERSION)}/", "")] and heads == []

    def listed(**window) -> list[tuple[str, str]]:
        """The listings a window sent."""
        before = len(lists)
        store.list_runs(PIPE, VERSION, **window)
        return lists[before:]

    folders = f"{layout.pipeline_runs(PIPE)}/"
    with store.remembering_reads():
        assert listed(newest=2) == [(f"{layout.index_dir(PIPE, VERSION)}/", ""),
                                    (f"{layout.index_dir(PIPE, VERSION)}/2026-02/", ""),
                                    (folders, f"{folders}202602")]  # from its month on
        assert listed(newest=1) == []  # inside what the first window listed
        assert listed(oldest=2) == [(f"{layout.index_dir(PIPE, VERSION)}/2026-01/", ""),
                                    (folders, f"{folders}202601")]
        assert listed(newest=10) == [(folders, f"{folders}202601")]  # not covered: reaches
        assert listed(newest=12) == []  # into January, and on to the newest run
        late = put(store, NIGHTS)  # a write forgets what was listed
        assert len(listed(newest=1)) == 3
        assert store.list_runs(PIPE, VERSION, newest=1)[0]["run_id"] == late
    assert [r["run_id"] for r in store.list_runs(PIPE, VERSION, oldest=2)] == ids[1::-1]


def test_judging_a_night_lists_the_run_folders_once(moto, tmp_path):
    """The drift series is read first: its newest runs hold the baseline's (here 16 healthy
    runs in February, the series back to 1 January), so the baseline lists nothing."""
    store = s3_store(moto, tmp_path)
    start = datetime(2026, 1, 1, 2, tzinfo=UTC)
    ids = [put(store, night, start=start) for night in range(50)]
    lists = record_listings(store)
    with store.remembering_reads():
        history = load_history(store, RunKey(new_run_id(), PIPE, VERSION), Rules())
    series = history.reads["drift"].data
    assert history.baseline.runs == ids[-8:] and len(series["run_id"].unique()) == 50
    folders = f"{layout.pipeline_runs(PIPE)}/"
    assert [after for prefix, after in lists if prefix == folders] == [f"{folders}202601"]
    index = [listed for listed in lists if listed[0].startswith(layout.INDEX)]
    assert len(index) == len(set(index)) == 3  # the version, then its two months
