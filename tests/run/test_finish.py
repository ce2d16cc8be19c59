"""finish_run fails closed: the record is stored first, each later step is isolated.

Records come from a real LocalCluster; steps are made to fail by replacing them in
``finish.STEPS``/``FINAL`` (our own code, not Dask's or S3's), the way a bug or bad history would.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from helpers.run_records import record_stages, scaled

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.run import pipeline as finish_mod
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id


def record_of(client):
    return record_stages(client, {"read": 200, "reduce": 200})


def finish(store: RunStore, record, pipeline: str = "nightly", **kwargs):
    ctx = RunContext(run_id=new_run_id(), pipeline=pipeline, version="1")
    return finish_run(store, record, ctx, [], **kwargs)


def failing(message: str):
    def step(end) -> None:
        raise RuntimeError(message)

    return step


def replace_step(monkeypatch, name: str, step) -> None:
    """Replace the step ``name`` of the judgement (``STEPS``) or of the completion
    (``FINAL``: the views)."""
    found = False
    for where in ("STEPS", "FINAL"):
        steps = [(n, step if n == name else s) for n, s in getattr(finish_mod, where)]
        found |= any(n == name for n, _ in steps)
        monkeypatch.setattr(finish_mod, where, steps)
    assert found, name


def test_healthy_run_is_stored_complete(inproc_client, tmp_path):
    store = RunStore(str(tmp_path))
    result = finish(store, record_of(inproc_client))
    assert result.status == "healthy" and result.judged
    manifest = store.read_manifest("nightly", result.run_id)
    assert manifest["status"] == "healthy" and manifest["unjudged_reason"] is None
    assert {"tasks.csv", "regression.csv", "utilisation.csv"} <= set(manifest["files"])
    assert [r["status"] for r in store.list_runs("nightly")] == ["healthy"]
    markers = list((tmp_path / "index" / "nightly" / "1").rglob("*.*"))
    assert [m.name for m in markers] == [f"{result.run_id}.healthy"]  # provisional one removed


def test_a_failing_later_step_leaves_the_others_done(inproc_client, tmp_path, monkeypatch):
    replace_step(monkeypatch, "trend", failing("trend exploded"))
    store = RunStore(str(tmp_path))
    result = finish(store, record_of(inproc_client))
    manifest = store.read_manifest("nightly", result.run_id)
    assert manifest["status"] == "healthy"  # the verdict was still computed
    assert any("trend step failed" in w and "trend exploded" in w for w in manifest["warnings"])
    assert "regression.csv" in manifest["files"] and "trend.html" not in manifest["files"]


def test_a_failed_verdict_stores_the_run_unjudged_and_out_of_the_baseline(
        inproc_client, tmp_path, monkeypatch):
    store = RunStore(str(tmp_path))
    healthy = finish(store, record_of(inproc_client))
    replace_step(monkeypatch, "judgement", failing("bug in the rule"))
    broken = finish(store, record_of(inproc_client))
    assert broken.status == "unjudged" and not broken.judged and not broken.regressed
    manifest = store.read_manifest("nightly", broken.run_id)
    assert manifest["status"] == "unjudged"
    assert "bug in the rule" in manifest["unjudged_reason"]
    assert store.read_table("nightly", broken.run_id, "tasks").shape[0] > 0  # record kept
    monkeypatch.undo()
    later = finish(store, record_of(inproc_client))
    assert later.manifest["baseline"]["runs"] == [healthy.run_id]


def test_a_crash_after_the_record_leaves_a_visible_unjudged_run(inproc_client, tmp_path,
                                                               monkeypatch):
    def crash(end) -> None:
        raise KeyboardInterrupt  # not an Exception: the process is going down

    replace_step(monkeypatch, "history", crash)
    store = RunStore(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        finish(store, record_of(inproc_client))
    [run] = store.list_runs("nightly")
    assert run["status"] == "unjudged"
    manifest = store.read_manifest("nightly", run["run_id"])
    assert manifest["unjudged_reason"] == "verdict pending"
    assert store.read_table("nightly", run["run_id"], "tasks")["tasks"].sum() > 0


def test_flow_error_is_stored_failed_not_regressed(inproc_client, tmp_path):
    store = RunStore(str(tmp_path))
    result = finish(store, record_of(inproc_client), error=ValueError("flow body failed"))
    assert result.status == "failed" and not result.regressed
    assert store.read_manifest("nightly", result.run_id)["state"] == "FAILED"


def test_spooled_provisional_and_final_upload_as_one_complete_run(inproc_client, tmp_path):
    blocked = tmp_path / "store"
    blocked.write_text("a file where the store's folder should be")
    spool = tmp_path / "spool"
    store = RunStore(str(blocked), spool_dir=spool)
    result = finish(store, record_of(inproc_client))
    assert any("spool" in w for w in result.warnings)
    # the history could not be listed either: the run is unjudged, never "healthy"
    assert result.status == "unjudged" and not result.regressed
    assert "could not be listed" in result.manifest["unjudged_reason"]
    pending = [p.name for p in spool.rglob("*") if p.is_file()]
    assert pending.count(f"{result.run_id}.unjudged") == 1  # the final marker replaced the first
    blocked.unlink()
    uploaded = RunStore(str(blocked), spool_dir=spool).upload_pending()
    assert uploaded.failed == 0 and uploaded.uploaded >= 5
    back = RunStore(str(blocked))
    assert [r["status"] for r in back.list_runs("nightly")] == [result.status]
    manifest = back.read_manifest("nightly", result.run_id)
    assert json.loads((blocked / "runs" / "nightly" / result.run_id / "manifest.json")
                      .read_text())["files"] == manifest["files"]
    assert "regression.csv" not in manifest["files"]
    assert manifest["unjudged_reason"] == result.manifest["unjudged_reason"]


def test_judging_reads_the_history_once(inproc_client, tmp_path):
    """Baseline and drift series share one listing of the index and one read of each table
    (observed by a spy on the store's filesystem, which still does the work)."""
    store = RunStore(str(tmp_path))
    record = record_of(inproc_client)
    for _ in range(4):
        assert finish(store, record).judged
    listed, read = [], []
    find, cat_file = store.fs.find, store.fs.cat_file

    def spy_find(path, *args, **kwargs):
        listed.append(str(path))
        return find(path, *args, **kwargs)

    def spy_cat_file(path, *args, **kwargs):
        read.append(str(path))
        return cat_file(path, *args, **kwargs)

    store.fs.find, store.fs.cat_file = spy_find, spy_cat_file
    result = finish(store, record)
    assert result.judged and len(result.judgement.drift) > 0  # the drift step did read
    index = [p for p in listed if f"{tmp_path}/index/" in p]
    assert len(index) == 1, index
    tables = [p for p in read if p.endswith("/tasks.csv")]
    assert len(tables) == len(set(tables)) == 4, tables


def test_a_run_delivered_from_the_spool_gets_its_fleet_file(inproc_client, tmp_path):
    """The spooled run's own finish could not write its fleet rows: the run that delivers
    its files does (issue 19, item 11)."""
    blocked = tmp_path / "store"
    blocked.write_text("a file where the store's folder should be")
    spool = tmp_path / "spool"
    first = finish(RunStore(str(blocked), spool_dir=spool), record_of(inproc_client))
    assert first.fleet_location is None
    blocked.unlink()
    second = finish(RunStore(str(blocked), spool_dir=spool), record_of(inproc_client))
    assert second.manifest["spool_delivery"]["pipelines"] == {first.run_id: "nightly"}
    fleet = pd.read_parquet(blocked / "fleet")
    assert set(fleet["run_id"]) == {first.run_id, second.run_id}


def test_views_are_drawn_after_the_run_is_complete(inproc_client, tmp_path):
    store = RunStore(str(tmp_path))
    ctx = RunContext(run_id=new_run_id(), pipeline="nightly", version="1")
    result = finish_run(store, record_of(inproc_client), ctx, [])
    assert result.views_pending is not None
    assert result.wait_views(timeout=60) == []
    # linked where they are written, before they are: the same places
    assert result.trend_location == str(tmp_path / "runs" / "nightly" / ctx.run_id / "trend.html")
    assert (tmp_path / "runs" / "nightly" / ctx.run_id / "trend.html").read_text().startswith(
        "<!DOCTYPE html>")
    assert pd.read_parquet(result.fleet_location)["run_id"].unique().tolist() == [ctx.run_id]
    manifest = store.read_manifest("nightly", ctx.run_id)
    assert manifest["status"] == "healthy" and "trend.html" not in manifest["files"]


def test_with_auto_reports_only_a_flagged_night_draws_the_trend_page(inproc_client, tmp_path):
    """``stage_reports="auto"``: healthy nights draw no trend page (no Bokeh in a new process
    each night); the night that regresses does, and links it."""
    store = RunStore(str(tmp_path))
    options = ProfilingOptions(stage_reports="auto", on_regression="warn",
                               check_options={"min_seconds": 0.0, "min_share": 0.0})
    record = record_of(inproc_client)
    start = datetime(2026, 11, 1, 2, tzinfo=UTC)
    results = []
    for n in range(5):
        when = start + timedelta(days=n)
        ctx = RunContext(run_id=new_run_id(when), pipeline="auto-trend", version="1",
                         started=when)
        results.append(finish_run(store, scaled(record, {"read": 5.0} if n == 4 else None),
                                  ctx, [], options, ended=when + timedelta(hours=1)))
    *healthy, slow = results
    assert [r.regressed for r in results] == [False] * 4 + [True], [r.status for r in results]
    for result in healthy:
        assert result.wait_views(timeout=60) == []
        assert result.trend_location is None
        assert not (tmp_path / "runs" / "auto-trend" / result.run_id / "trend.html").exists()
    assert slow.wait_views(timeout=60) == []
    assert slow.trend_location == str(tmp_path / "runs" / "auto-trend" / slow.run_id
                                      / "trend.html")
    assert Path(slow.trend_location).read_text().startswith("<!DOCTYPE html>")


def test_a_view_that_fails_is_a_warning_and_the_run_is_unharmed(inproc_client, tmp_path,
                                                          monkeypatch):
    import prefect_dask_profiling.export.fleet as fleet

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(fleet, "write_fleet", broken)
    store = RunStore(str(tmp_path))
    ctx = RunContext(run_id=new_run_id(), pipeline="nightly", version="1")
    result = finish_run(store, record_of(inproc_client), ctx, [])
    warnings = result.wait_views(timeout=60)
    assert warnings == ["fleet view not stored: OSError: disk full"]
    assert store.read_manifest("nightly", ctx.run_id)["status"] == "healthy"  # run unharmed
    assert (tmp_path / "runs" / "nightly" / ctx.run_id / "trend.html").exists()  # the other
