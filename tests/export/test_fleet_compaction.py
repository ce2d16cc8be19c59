"""Compacting the fleet view: one file per pipeline and closed month, every run read once.

``compact_fleet`` writes a month's file, then deletes the runs' own files. Readers
(``read_fleet`` and the DuckDB view) see each run exactly once at every point of that:
before, after, and when it stopped between the two writes (here: every deletion fails),
because a run's own file wins over its month's file. Running it again finishes the work.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.export.fleet import (
    compact_fleet,
    duckdb_view,
    fleet_location,
    read_fleet,
    rebuild_fleet,
    write_fleet,
)
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.runs import RunStore, new_run_id

T0 = datetime(2026, 9, 20, 2, tzinfo=UTC)  # 50 nights: September, October and November
NIGHTS = 50
COMPARED = ["pipeline", "run_id", "version", "started", "status", "stage", "prefix", "tasks",
            "total_s", "p95_s", "utilisation"]


def tasks(night: int, scale: float = 1.0) -> pd.DataFrame:
    total = [(20.0 + night) * scale, 10.0]
    return pd.DataFrame({"stage": ["read", "reduce"], "prefix": ["open_dataset", "nanmedian"],
                         "tasks": [40, 8], "total_s": total, "p50_s": [0.5, 1.2],
                         "p95_s": [0.9, 1.5], "gb_out": [1.5, 0.01]})


def manifest(pipeline: str, night: int) -> dict:
    started = T0 + timedelta(days=night)
    return {"run_id": new_run_id(started), "pipeline": pipeline, "version": "v1",
            "status": "healthy", "started": started.isoformat(),
            "utilisation": {"run": 0.5}}


@pytest.fixture
def store(tmp_path) -> RunStore:
    """A fleet view of two pipelines, 50 nights each (the runs themselves are not stored)."""
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    for pipeline in ("ndvi", "sar"):
        for night in range(NIGHTS):
            write_fleet(store, manifest(pipeline, night), tasks(night))
    return store


def duckdb_rows(store: RunStore) -> pd.DataFrame:
    """The whole view through the DuckDB view, sorted like :func:`sorted_rows`."""
    con = duckdb.connect()
    con.execute(duckdb_view(fleet_location(store)))
    return sorted_rows(con.sql("SELECT * FROM fleet").to_arrow_table().to_pandas())


def sorted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The compared columns, in one order, with one type each whoever read them."""
    frame = frame[COMPARED].astype({"pipeline": str, "run_id": str, "stage": str})
    frame["started"] = pd.to_datetime(frame["started"], utc=True).astype("datetime64[us, UTC]")
    return frame.sort_values(["pipeline", "run_id", "stage"]).reset_index(drop=True)


def files(store: RunStore, pipeline: str) -> list[str]:
    return sorted(p.name for p in Path(store._path(layout.fleet_dir(pipeline))).iterdir())


def check_once(store: RunStore, expected: pd.DataFrame) -> None:
    """Both readers give every run once, with the rows ``expected`` holds."""
    for rows in (sorted_rows(read_fleet(store)), duckdb_rows(store)):
        assert not rows.duplicated(["pipeline", "run_id", "stage", "prefix"]).any()
        pd.testing.assert_frame_equal(rows, expected, check_dtype=False)


def test_closed_months_fold_into_one_file_each_and_read_the_same(store):
    before = sorted_rows(read_fleet(store))
    assert len(before) == 2 * 2 * NIGHTS
    pd.testing.assert_frame_equal(duckdb_rows(store), before, check_dtype=False)
    done = compact_fleet(store, before="2026-11")
    assert done == {"months": 4, "removed": 2 * 42, "skipped": []}  # 11 + 31 nights each
    names = files(store, "ndvi")
    assert names[-2:] == ["month=2026-09.parquet", "month=2026-10.parquet"]
    assert len(names) == 2 + 8 and all(n.startswith("202611") for n in names[:-2])
    check_once(store, before)
    assert compact_fleet(store, before="2026-11") == {"months": 0, "removed": 0, "skipped": []}


def test_a_compaction_stopped_between_its_two_writes_shows_each_run_once(store, monkeypatch):
    before = sorted_rows(read_fleet(store))

    def crash(path: str) -> None:
        raise OSError("the machine went away")

    monkeypatch.setattr(store.fs, "rm_file", crash)
    with pytest.raises(OSError):
        compact_fleet(store, before="2026-11")
    assert "month=2026-09.parquet" in files(store, "ndvi")  # written, its runs not deleted
    assert len(files(store, "ndvi")) == NIGHTS + 1
    check_once(store, before)
    monkeypatch.undo()
    done = compact_fleet(store, before="2026-11")  # again: finishes the work
    assert done["removed"] == 2 * 42 and len(files(store, "sar")) == 8 + 2
    check_once(store, before)


def test_a_runs_own_file_wins_over_its_month_and_rebuild_returns_to_run_files(store):
    compact_fleet(store, before="2026-11")
    late = manifest("ndvi", 5)  # a September night's file written again (new times)
    old_run = sorted(read_fleet(store).query("pipeline == 'ndvi'")["run_id"].unique())[5]
    late["run_id"] = old_run
    write_fleet(store, late, tasks(5, scale=3.0))
    rows = sorted_rows(read_fleet(store))
    mine = rows[(rows["run_id"] == old_run) & (rows["stage"] == "read")]
    assert mine["total_s"].tolist() == [75.0]  # once, from its own file
    check_once(store, rows)

    store.write_run("ndvi", old_run, {"tasks": tasks(5)}, {**late, "state": "COMPLETED"})
    result = rebuild_fleet(store, "ndvi")  # one stored run: the month files go, stale ones too
    assert result["written"] == 1 and files(store, "ndvi") == [f"{old_run}.parquet"]


def test_the_cli_compacts(store):
    result = CliRunner().invoke(app, ["fleet", "--compact", "--store", store.url, "--json",
                                      "--pipeline", "sar"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert done["months"] >= 2 and done["skipped"] == []
    assert any(n.startswith("month=") for n in files(store, "sar"))
    assert not any(n.startswith("month=") for n in files(store, "ndvi"))
