"""Issue 56, defects 2 and 7: one stored night costs at most itself.

A night that cannot be read (a damaged ``carried`` field, verdict table, tasks table or
manifest) is left out, named in the next night's manifest, in ``check`` and in ``alerts``,
and never stops the judgement of later nights; ``accept`` always gets a pipeline judged
again. Real ``finish_run`` on a real local store (``night_sim.py``), damage done to the
stored bytes.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from helpers.run_records import record_stages
from night_sim import Driver, NightRun, NightSpec

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.regression import alert_history
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.runs import RunStore

pytestmark = pytest.mark.slow  # generated nights through finish_run: > 10 s a test


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


def driver(record, tmp_path) -> Driver:
    """A driver whose flows fail on a confirmed regression (``on_regression="fail"``)."""
    return Driver(RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool"), record,
                  ProfilingOptions())


def quiet(day: int, **kwargs) -> NightSpec:
    """A healthy night: every prefix within +-5% of its level."""
    rng = np.random.default_rng(5600 + day)
    factors = {(s, p): rng.uniform(0.95, 1.05) for s in ("read", "reduce")
               for p in ("sum", "sum-partial")}
    factors.update(kwargs.pop("factors", {}))
    return NightSpec(day=day, factors=factors, **kwargs)


def lines(runs: list[NightRun]) -> str:
    return "\n".join(r.line() for r in runs)


def edit_manifest(drive: Driver, run_id: str, change) -> None:
    """Rewrite a stored manifest with ``change(doc)`` applied (no checksum covers it)."""
    path = drive.store._path(layout.manifest_file(drive.pipeline, run_id))
    doc = json.loads(drive.store.fs.cat_file(path))
    change(doc)
    drive.store.fs.pipe_file(path, json.dumps(doc).encode())


def skipped_of(run: NightRun) -> list[str]:
    return [s["run_id"] for s in run.manifest.get("skipped") or []]


@pytest.mark.parametrize("position", [0, 4])
def test_a_damaged_carried_state_costs_nothing(record, tmp_path, position):
    """Defect 2: a damaged ``carried`` at the window's start (the replay starts from the
    first night there is) or inside it (not needed) leaves every later night judged, and a
    4x step still fails."""
    drive = driver(record, tmp_path)
    runs = [drive.run(quiet(d)) for d in range(8)]
    edit_manifest(drive, runs[position].run_id,
                  lambda doc: doc.update(carried={"episodes": "not a list"}))
    later = [drive.run(quiet(d)) for d in (8, 9)]
    slow = [drive.run(quiet(d, factors={"read": 4.0}, kind="4x read")) for d in (10, 11)]
    all_runs = runs + later + slow
    assert all(r.judged for r in later + slow), lines(all_runs)
    assert any(r.status == "regressed" for r in slow), lines(all_runs)
    again = drive.judge_again(slow[-1].run_id)
    assert again.judgement is not None, again.error


@pytest.mark.parametrize("name", ["regression.csv", "manifest.json", "tasks.csv"])
def test_a_damaged_night_is_left_out_and_named_everywhere(record, tmp_path, caplog, name):
    """Defect 2: a damaged verdict table, manifest or tasks table inside the window is left
    out of tonight's history, named in tonight's manifest, in ``check`` and in ``alerts``."""
    drive = driver(record, tmp_path)
    runs = [drive.run(quiet(d)) for d in range(6)]
    victim = runs[3].run_id
    drive.damage(victim, name)
    tonight = drive.run(quiet(6))
    assert tonight.judged and tonight.status == "healthy", lines([*runs, tonight])
    assert victim in skipped_of(tonight) and victim not in tonight.baseline_runs
    assert any(victim in w for w in tonight.manifest.get("warnings") or [])
    checked = drive.judge_again(tonight.run_id).to_json()
    assert checked["agrees"] and victim in [s["run_id"] for s in checked["skipped"]]
    assert victim in checked["baseline"]["note"]
    assert "5 of 8 baseline runs available" in checked["baseline"]["note"]
    if name != "tasks.csv":  # the replay reads no tasks table
        with caplog.at_level(logging.WARNING):
            drive.episodes("1")
        assert any(victim in m for m in caplog.messages), caplog.messages


def test_garbage_tasks_and_a_truncated_manifest_still_fail_a_4x_night(record, tmp_path):
    """Defect 7: a garbage tasks.csv on one night and a truncated manifest.json on
    another; the next night, 4x slower, ends regressed, the damaged nights named."""
    drive = driver(record, tmp_path)
    runs = [drive.run(quiet(d)) for d in range(10)]
    garbage, truncated = runs[4].run_id, runs[7].run_id
    drive.damage(garbage, "tasks.csv")
    path = drive.store._path(layout.manifest_file(drive.pipeline, truncated))
    drive.store.fs.pipe_file(path, drive.store.fs.cat_file(path)[:60])
    slow = drive.run(quiet(10, factors={"read": 4.0}, kind="4x read"))
    assert slow.status == "regressed" and slow.result.regressed, lines([*runs, slow])
    assert slow.manifest["state"] == "FAILED"
    assert {garbage, truncated} <= set(skipped_of(slow))


def test_accept_gets_a_pipeline_judged_again(record, tmp_path):
    """Defect 2: a night that cannot be read for an unknown cause (its manifest's path is
    a folder) leaves the next nights unjudged, naming it; accepting a later run restarts the
    history there, and nothing older is read any more."""
    drive = driver(record, tmp_path)
    runs = [drive.run(quiet(d)) for d in range(5)]
    path = drive.store._path(layout.manifest_file(drive.pipeline, runs[2].run_id))
    drive.store.fs.rm(path)
    drive.store.fs.makedirs(path + "/not-a-file", exist_ok=True)
    blind = drive.run(quiet(5))
    assert blind.status == "unjudged", lines([*runs, blind])
    assert runs[2].run_id in blind.manifest["unjudged_reason"]
    drive.accept(runs[4].run_id)
    seen = [drive.run(quiet(d)) for d in (6, 7)]
    assert all(r.judged for r in seen), lines([*runs, blind, *seen])
    episodes, _ = drive.episodes("1")
    assert episodes.restart == runs[4].run_id


def test_alerts_names_a_damaged_night(record, tmp_path, caplog):
    """``alerts`` (the replay) leaves a damaged night out with a warning naming it."""
    drive = driver(record, tmp_path)
    runs = [drive.run(quiet(d)) for d in range(4)]
    drive.damage(runs[1].run_id, "regression.csv")
    with caplog.at_level(logging.WARNING):
        book, _ = alert_history.episodes_of(drive.store, drive.pipeline, "1")
    assert runs[1].run_id not in book.runs and runs[2].run_id in book.runs
    assert any(runs[1].run_id in m and "verdict table" in m for m in caplog.messages)


def test_a_damaged_carried_at_the_window_start_moves_the_start_older(record, tmp_path):
    """Only the replay's first night needs its ``carried``: when it is damaged, the window
    reaches back to an older night whose state can be read, and the replay ends in the
    state the whole history gives."""
    drive = driver(record, tmp_path)
    runs = [drive.run(quiet(d, peak={"read": 0.93}, kind="chronic")) for d in range(8)]
    whole = alert_history.read_nights(drive.store, drive.pipeline, "1")
    window = alert_history.read_nights(drive.store, drive.pipeline, "1", runs=3)
    assert [n.run_id for n in window.nights] == [r.run_id for r in runs[-3:]]
    edit_manifest(drive, runs[5].run_id,
                  lambda doc: doc.update(carried={"episodes": [{"id": 1}], "ratios": []}))
    moved = alert_history.read_nights(drive.store, drive.pipeline, "1", runs=3)
    first = moved.nights[0].run_id
    assert first < runs[5].run_id and not moved.skipped, moved.notes
    assert any(runs[5].run_id in note for note in moved.notes)
    open_moved = {e.key: e.id for e in alert_history.replay(moved.nights)[0].open()}
    open_whole = {e.key: e.id for e in alert_history.replay(whole.nights)[0].open()}
    assert open_moved == open_whole and open_whole, lines(runs)
