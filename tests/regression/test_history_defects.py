"""One focused test per defect of issue 33 that the history model fixes (1, 2, 3, 5, 6, 7).

Each drives the real ``finish_run`` on a real local store with the smallest sequence of
generated nights that shows the defect (``night_sim.py``: a real record made into nights
with known times, memory and storage requests; a night runs 02:00-03:00 UTC on its day).
Defects 4, 8, 9 and 10 have their tests elsewhere.
"""

from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pytest
from helpers.run_records import record_stages
from night_sim import MIB, Driver, NightRun, NightSpec, copy_local_store, same_verdict
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.prefect.events import REGRESSION_EVENT, findings
from prefect_dask_profiling.regression import alert_history
from prefect_dask_profiling.store.runs import RunStore

pytestmark = pytest.mark.slow  # generated nights through finish_run: > 10 s a test


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


def driver(record, tmp_path, **rule) -> Driver:
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    return Driver(store, record, ProfilingOptions(on_regression="warn", check_options=rule))


def quiet(day: int, seed: int = 0, **kwargs) -> NightSpec:
    """A healthy night: every prefix within +-5% of its level."""
    rng = np.random.default_rng(1000 + day + seed)
    factors = {("read", p): rng.uniform(0.95, 1.05) for p in ("sum", "sum-partial")}
    factors.update({("reduce", p): rng.uniform(0.95, 1.05) for p in ("sum", "sum-partial")})
    kind = kwargs.pop("kind", "quiet")
    extra = kwargs.pop("factors", {})
    return NightSpec(day=day, kind=kind, factors={**factors, **extra}, **kwargs)


def history(drive: Driver, days: range, **kwargs) -> list[NightRun]:
    return [drive.run(quiet(d, **kwargs)) for d in days]


def lines(runs: list[NightRun]) -> str:
    return "\n".join(r.line() for r in runs)


# ---------------------------------------------------------------------- defect 1
def test_chronic_near_oom_fails_once_and_keeps_time_judgeable(record, tmp_path):
    """Ten nights at 0.93 of a 1 GiB limit, then a 10x slower read: the chronic condition
    fails one night of its episode, the nights stay in the time baseline, and the read
    step fails by its second night (not ``insufficient-history``)."""
    drive = driver(record, tmp_path)
    chronic = [drive.run(quiet(d, peak={"read": 0.93}, kind="chronic")) for d in range(10)]
    slow = [drive.run(quiet(d, peak={"read": 0.93}, factors={"read": 10.0}, kind="10x read"))
            for d in (10, 11)]
    runs = chronic + slow
    assert sum(r.status == "regressed" for r in chronic) <= 1, lines(runs)
    assert len(slow[0].baseline_runs) >= 3, lines(runs)  # the time baseline is not emptied
    assert any(r.status == "regressed" and "read/sum" in r.result.failure_message
               for r in slow), lines(runs)


def test_spill_noise_fails_no_night(record, tmp_path):
    """300-600 MiB spilled on one night in ten is noise: it waits a night and clears."""
    drive = driver(record, tmp_path)
    spill = {8: 450, 15: 320, 21: 600}
    runs = [drive.run(quiet(d, spilled={"reduce": spill[d] * MIB} if d in spill else {},
                            kind="spill" if d in spill else "quiet")) for d in range(24)]
    assert not [r for r in runs if r.status == "regressed"], lines(runs)


@pytest.mark.parametrize("memory_history, spill, failed_days", [
    (30, {3: 450, 14: 400, 15: 500}, []),
    (8, {3: 450, 14: 400, 15: 500}, []),
    (8, {3: 450, 14: 400, 15: 500, 16: 450, 17: 480}, [17]),
])
def test_spill_nights_in_a_row_fail_only_as_a_persisting_onset(
        record, tmp_path, memory_history, spill, failed_days):
    """A stage that spills on some nights, two of them in a row eleven nights after the
    first: the default memory baseline (30 nights) still holds that night and flags
    nothing. A baseline of 8 nights has forgotten it: the pair is an onset after 8 clean
    nights, which confirms only after 4 nights in a row (``onset_nights``), so the pair
    fails nothing and four spill nights in a row fail the fourth."""
    drive = driver(record, tmp_path, memory_history=memory_history)
    runs = [drive.run(quiet(d, spilled={"reduce": spill[d] * MIB} if d in spill else {},
                            kind="spill" if d in spill else "quiet"))
            for d in range(max(spill) + 1)]
    failed = [r.spec.day for r in runs if r.status == "regressed"]
    assert failed == failed_days, lines(runs)


# ---------------------------------------------------------------------- defect 2
def test_a_10x_night_overlapping_a_later_run_fails_in_either_order(record, tmp_path):
    """A (02:00-04:00, 10x read) and B (03:00-03:30): A fails whichever finished first."""
    drive = driver(record, tmp_path)
    history(drive, range(6))
    a = quiet(6, factors={"read": 10.0}, kind="A 10x", end=timedelta(hours=4)).with_run_id()
    b = quiet(6, seed=1, kind="B", start=timedelta(hours=3),
              end=timedelta(hours=3, minutes=30)).with_run_id()
    other = Driver(copy_local_store(drive.store, tmp_path / "copy"), record,
                   drive.settings)
    b_first = {"B": drive.run(b), "A": drive.run(a)}
    a_first = {"A": other.run(a), "B": other.run(b)}
    assert b_first["A"].status == "regressed", lines(list(b_first.values()))
    assert not same_verdict(b_first["A"], a_first["A"])
    assert not same_verdict(b_first["B"], a_first["B"])
    assert b.run_id not in b_first["A"].baseline_runs


# ---------------------------------------------------------------------- defect 3
def test_a_cleared_suspected_night_returns_to_the_baseline(record, tmp_path):
    drive = driver(record, tmp_path, confirm="always")
    runs = history(drive, range(8))
    blip = drive.run(quiet(8, factors={("read", "sum"): 3.0}, kind="blip"))
    after = drive.run(quiet(9))
    third = drive.run(quiet(10))
    runs += [blip, after, third]
    assert blip.status == "suspected", lines(runs)
    assert after.events_of("cleared"), lines(runs)
    assert blip.run_id in third.baseline_runs, lines(runs)


# ---------------------------------------------------------------------- defect 5
def test_an_acknowledged_episode_emits_no_detected_and_stays_out_of_baselines(record,
                                                                             tmp_path):
    drive = driver(record, tmp_path)
    runs = history(drive, range(6))
    # the step is read/sum's alone: with the whole stage 10x, whether sum-partial also
    # passed the rule's min_share depended on the recorded shares (a real cluster's, which
    # move with the load) and the night's +-5 %, so it could pass on the night after the
    # ack and not on the step night — a new episode, rightly detected, that this test is
    # not about (beside a CPU hog, 5 December 2026)
    step_factors = {("read", "sum"): 10.0}
    step = drive.run(quiet(6, factors=step_factors, kind="10x read/sum"))
    detected = {e["episode"]["prefix"]: e for e in step.events_of("detected")}
    assert set(detected) == {"sum"}, lines([*runs, step])
    episode = detected["sum"]["episode"]["id"]
    # an ack by run id: every episode open at the step night
    drive.ack("1", step.run_id, step.spec.ended + timedelta(hours=6))
    acked = [drive.run(quiet(d, factors=step_factors, kind="10x read/sum, acked"))
             for d in (7, 8)]
    back = drive.run(quiet(9, kind="revert"))
    runs += [step, *acked, back]
    for run in acked:
        assert not run.events_of("detected"), lines(runs)
        assert run.status != "regressed" and episode not in run.failing_episodes, lines(runs)
        assert REGRESSION_EVENT not in findings(run.result), lines(runs)
        assert run.run_id not in back.baseline_runs, lines(runs)
    for run in runs:
        assert all((e.get("episode") or {}).get("id") for e in run.events)


# ---------------------------------------------------------------------- defect 6
def test_alerts_replays_with_the_runs_own_rule(record, tmp_path):
    """``resolve_after=5``: three nights back to normal leave the episode open for the
    judge; ``alerts`` (``episodes_of``) must say the same."""
    drive = driver(record, tmp_path, resolve_after=5)
    runs = history(drive, range(6))
    runs += [drive.run(quiet(d, factors={"read": 10.0}, kind="10x")) for d in (6, 7)]
    [detected] = [e for r in runs for e in r.events_of("detected")
                  if e["episode"]["prefix"] == "sum"]
    runs += history(drive, range(8, 11))
    assert not any(r.events_of("resolved") for r in runs), lines(runs)  # the judge: open
    book, _ = drive.episodes("1")
    [episode] = [e for e in book.episodes if e.id == detected["episode"]["id"]]
    assert episode.open, (episode, lines(runs))


# ---------------------------------------------------------------------- defect 7
def test_an_unreadable_verdict_table_costs_at_most_its_night(record, tmp_path):
    """A suspected night whose ``regression.csv`` cannot be read: the next night is judged
    without it and names it, and the step still fails a night later (issue 56 changed this:
    leaving the next night unjudged kept every later night unjudged too)."""
    drive = driver(record, tmp_path, confirm="always")
    runs = history(drive, range(6))
    first = drive.run(quiet(6, factors={"read": 3.0}, kind="3x read"))
    drive.damage(first.run_id, "regression.csv")
    second = drive.run(quiet(7, factors={"read": 3.0}, kind="3x read, again"))
    third = drive.run(quiet(8, factors={"read": 3.0}, kind="3x read, third"))
    runs += [first, second, third]
    assert first.status == "suspected", lines(runs)
    assert second.judged and third.judged, lines(runs)
    assert first.run_id in [s["run_id"] for s in second.manifest["skipped"]]
    assert "regressed" in (second.status, third.status), lines(runs)
    # `alerts` names the night its replay left out, in JSON and in the table's header
    listed = CliRunner().invoke(app, ["alerts", "--store", drive.store.url, "--json"])
    assert listed.exit_code == 0, listed.output
    [skipped] = json.loads(listed.stdout)["skipped"]
    assert skipped["run_id"] == first.run_id and "regression.csv" in skipped["reason"]
    shown = CliRunner().invoke(app, ["alerts", "--store", drive.store.url])
    assert f"night {first.run_id} left out of the replay" in shown.stdout, shown.output


# ---------------------------------------------------------------------- the window's edge
def test_an_episode_older_than_the_replay_window_keeps_its_id_and_its_ack(record, tmp_path,
                                                                          monkeypatch):
    """A chronic near-OOM open for more nights than the replay window: every night's judge,
    ``alerts`` and a small ``alerts --runs 3`` see the episode that opened on the first
    night, with the ack given to its id, and it failed one night in all.

    The window is 8 nights here, not 60 (``LOOKBACK_RUNS``, read when the replay is): the
    edge is the same code for every length (test_history_model.py checks all of them), and
    each night replays its whole window. Before each night stored the state its judge
    started from, the window's first night re-opened the condition under a new id, and the
    ack no longer applied to it."""
    window = 8
    monkeypatch.setattr(alert_history, "LOOKBACK_RUNS", window)
    drive = driver(record, tmp_path)
    first = drive.run(quiet(0, peak={"read": 0.93}, kind="chronic"))
    [episode] = first.failing_episodes
    drive.ack("1", episode, first.spec.ended + timedelta(hours=1))
    nights = window + 4
    runs = [first, *[drive.run(quiet(d, peak={"read": 0.93}, kind="chronic, acked"))
                     for d in range(1, nights)]]
    assert [r.spec.day for r in runs if r.status == "regressed"] == [0], lines(runs)
    assert not [e for r in runs[1:] for e in r.events if e["episode"]["id"] != episode], \
        lines(runs)
    stored = runs[-1].manifest["carried"]
    assert [e["id"] for e in stored["episodes"]] == [episode]
    assert stored["episodes"][0]["nights"] == nights - 1  # every earlier night, not the window's
    for runs_back in (None, 3):  # alerts, alerts --runs 3
        book, _ = alert_history.episodes_of(drive.store, "sim", "1", runs=runs_back)
        [open_episode] = book.open()
        assert (open_episode.id, open_episode.state, open_episode.nights) == \
            (episode, "acknowledged", nights), runs_back
