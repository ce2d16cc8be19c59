"""``dask-profiling eta`` on a generated local store (``RunStore.write_run``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.cli.eta import IN_PROGRESS_NOTE
from prefect_dask_profiling.store.runs import RunStore, new_run_id

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
READ = [100.0, 110.0, 90.0, 105.0, 95.0]  # seconds of stage read, night by night


def night(store: RunStore, i: int, read_s: float, *, version: str = "v1",
          status: str = "healthy", stages: tuple[str, ...] = ("read", "write")) -> str:
    walls = {"read": read_s, "write": 20.0, "publish": 5.0}
    started = T0 + timedelta(days=i)
    run_id = new_run_id(started)
    tasks = pd.DataFrame({"stage": list(stages), "prefix": [f"{s}_task" for s in stages],
                          "tasks": [40] * len(stages), "total_s": [walls[s] for s in stages],
                          "p50_s": [1.0] * len(stages), "p95_s": [1.0] * len(stages),
                          "gb_out": [0.0] * len(stages), "share": [0.5] * len(stages)})
    wall = sum(walls[s] for s in stages)
    doc = {"version": version, "status": status, "state": "COMPLETED", "wall_s": wall,
           "started": started.isoformat(),
           "ended": (started + timedelta(seconds=wall)).isoformat(),
           "stages": [{"name": s, "wall_s": walls[s], "windows": 1} for s in stages],
           "utilisation": {"run": 0.5}}
    assert not store.write_run("ndvi", run_id, {"tasks": tasks}, doc).spooled
    return run_id


@pytest.fixture
def store(tmp_path) -> RunStore:
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    for i, read_s in enumerate(READ):
        night(store, i, read_s)
    return store


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_eta_prints_each_stage_p50_p90_and_the_nights(store):
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ndvi v1: ETA plan from 5 baseline nights (2026110")
    read = next(line for line in lines if line.strip().startswith("read"))
    assert "1m40s" in read and "1m48s" in read  # p50, p90 (linear) of READ
    assert any(line.strip().startswith("write") and "20.0s" in line for line in lines)
    assert any(line.startswith("whole run: 2m00s expected") for line in lines), lines
    assert f"note: {IN_PROGRESS_NOTE}" in lines


def test_eta_json_has_the_figures_and_says_it_is_the_plan(store):
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url, "--json")
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    stages = {s["stage"]: s for s in plan["stages"]}
    assert stages["read"]["p50_s"] == pytest.approx(100.0)
    assert stages["read"]["p90_s"] == pytest.approx(108.0)
    assert stages["read"]["nights"] == 5 and stages["read"]["usual_tasks"] == 40
    assert len(plan["nights"]) == 5 and plan["ready"] is True
    assert plan["run"]["expected_s"] == pytest.approx(120.0)
    assert plan["naive_s"] == pytest.approx(120.0)
    assert plan["note"] == IN_PROGRESS_NOTE


def test_a_stage_with_too_little_history_is_named_unknown(store):
    night(store, 9, 100.0, stages=("read", "write", "publish"))
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)
    assert out.exit_code == 0, out.output
    assert "unknown: too little history (1 of 3 nights)" in out.stdout
    assert "not counting stage `publish`: too little history (1 of 3 nights)" in out.stdout


def test_a_new_version_has_no_eta_yet(store):
    night(store, 10, 100.0, version="v2")
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)  # the newest run's version
    assert out.exit_code == 0, out.output
    assert "ndvi v2: ETA plan from 1 baseline night" in out.stdout
    assert "no ETA yet: needs 2 earlier runs of ndvi v2 (has 1)" in out.stdout
    old = cli("eta", "--pipeline", "ndvi", "--version", "v1", "--store", store.url)
    assert "ndvi v1: ETA plan from 5 baseline nights" in old.stdout


def test_a_pipeline_without_runs_is_bad_input(tmp_path, store):
    out = cli("eta", "--pipeline", "nope", "--store", store.url)
    assert out.exit_code == 2, out.output
    assert "nope" in out.stderr


# ---------------------------------------------------------------------- runs in progress
def live(store: RunStore, run_id: str, *, age_s: float = 12.0, pipeline: str = "ndvi",
         **fields) -> None:
    """Store the estimate of a run in progress, computed ``age_s`` ago."""
    from prefect_dask_profiling.forecast.live_store import estimate_doc

    now = datetime.now(UTC)
    doc = {"pipeline": pipeline, "version": "v1", "run_id": run_id, "flow_run_id": "f-1",
           "started": (now - timedelta(minutes=2)).isoformat(),
           "computed_at": (now - timedelta(seconds=age_s)).isoformat(), "interval_s": 30.0,
           "stage": "read", "stages_done": [], "known": True, "done_fraction": 0.4,
           "remaining_p50_s": 70.0, "remaining_p90_s": 80.0,
           "finish_p50": (now + timedelta(seconds=70)).isoformat(),
           "finish_p90": (now + timedelta(seconds=80)).isoformat(),
           "deadline": None, "risk": None, "unknown": [], "text": "ETA 02:09–02:10"}
    store.write_live(estimate_doc(**{**doc, **fields}))


def test_a_run_in_progress_is_listed_with_its_estimate_and_its_age(store):
    running = new_run_id(T0 + timedelta(days=20))
    live(store, running, deadline="2026-11-21T06:00:00+00:00", risk="on-track")
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert "runs in progress: 1" in lines
    [line] = [x for x in lines if x.strip().startswith(running)]
    assert "stage read running, 40 % done; ETA 02:09–02:10" in line
    assert "deadline 2026-11-21T06:00:00+00:00 (on-track)" in line
    assert "computed 1" in line and line.endswith("s ago"), line  # ~12 s
    assert "stale" not in line


def test_the_json_has_each_run_in_progress_with_its_estimate(store):
    running = new_run_id(T0 + timedelta(days=20))
    live(store, running, age_s=5.0)
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url, "--json")
    assert out.exit_code == 0, out.output
    [run] = json.loads(out.stdout)["in_progress"]
    assert run["run_id"] == running and run["stale"] is False and run["age_s"] >= 5.0
    estimate = run["estimate"]
    assert estimate["stage"] == "read" and estimate["done_fraction"] == 0.4
    assert estimate["remaining_p50_s"] == 70.0 and estimate["remaining_p90_s"] == 80.0


def test_an_ended_run_and_a_stale_estimate(store):
    ended = night(store, 7, 100.0)  # its manifest exists: a leftover estimate is skipped
    live(store, ended)
    old = new_run_id(T0 + timedelta(days=21))
    live(store, old, age_s=3600.0)
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)
    assert out.exit_code == 0, out.output
    assert ended not in out.stdout.split("runs in progress")[1]
    [line] = [x for x in out.stdout.splitlines() if x.strip().startswith(old)]
    assert "computed 1h00m ago (stale: not updated since" in line


def test_no_run_in_progress_is_said(store):
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)
    assert "runs in progress: none stored" in out.stdout.splitlines()
    assert json.loads(cli("eta", "--pipeline", "ndvi", "--store", store.url,
                          "--json").stdout)["in_progress"] == []


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "is not valid JSON"),
    (b'{"kind": "something else"}', "is not a dask-profiling live estimate"),
    (b'{"kind": "dask-profiling.live-eta", "schema": 99}', "has schema 99"),
    (b'{"kind": "dask-profiling.live-eta", "schema": 1, "pipeline": "ndvi"}',
     "lacks run_id, computed_at"),
    (b"\xff\xfe", "is not valid JSON"),
])
def test_a_damaged_estimate_is_named_with_its_reason(tmp_path, store, body, reason):
    running = new_run_id(T0 + timedelta(days=20))
    path = tmp_path / "store" / "live" / "ndvi" / f"{running}.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)
    assert out.exit_code == 0, out.output
    [line] = [x for x in out.stdout.splitlines() if x.strip().startswith(running)]
    assert f"unreadable estimate: {path}" in line and reason in line, line
    data = json.loads(cli("eta", "--pipeline", "ndvi", "--store", store.url, "--json").stdout)
    assert reason in data["in_progress"][0]["error"]


def test_a_first_night_in_progress_has_no_plan_but_its_estimate(store):
    running = new_run_id(T0 + timedelta(days=20))
    live(store, running, pipeline="fresh", known=False, done_fraction=None,
         text="no ETA yet: needs 3 earlier runs of fresh v1 (has 0)")
    out = cli("eta", "--pipeline", "fresh", "--store", store.url)
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[0] == "fresh: no stored run yet (no ETA plan)"
    assert "stage read running; no ETA yet: needs 3 earlier runs" in out.stdout
    assert cli("eta", "--pipeline", "other", "--store", store.url).exit_code == 2


def test_estimates_that_cannot_be_listed_leave_the_plan(store, monkeypatch):
    from prefect_dask_profiling.store.errors import StoreAccessDenied

    def denied(self, pipeline):
        raise StoreAccessDenied("could not list s3://bucket/live/ndvi: AccessDenied")

    monkeypatch.setattr(RunStore, "live_estimates", denied)
    out = cli("eta", "--pipeline", "ndvi", "--store", store.url)
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[0].startswith("ndvi v1: ETA plan from 5 baseline nights")
    assert ("runs in progress: not read: could not list s3://bucket/live/ndvi: AccessDenied"
            in out.stdout)
