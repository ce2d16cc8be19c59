"""The ETA estimator on generated nights: pure, no Prefect, no cluster (fast tier)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pandas as pd
import pytest

from prefect_dask_profiling.forecast.model import (
    Deadline,
    RiskTracker,
    RunProgress,
    boundary_text,
    check_eta_interval,
    check_margin,
    estimate,
    history_stats,
    parse_deadline,
    resolve_deadline,
    risk,
)

NOW = datetime(2026, 12, 3, 2, 0, tzinfo=UTC)
# stage -> (seconds, {prefix: tasks})
PLAN = {"read": (100.0, {"load": 10}), "ndvi": (200.0, {"ndvi": 40, "mask": 10}),
        "write": (50.0, {"store": 5})}


def night(i: int, plan=PLAN, version: str = "v1", scale: float = 1.0,
          gap: float = 0.0) -> tuple[dict, list[dict]]:
    jitter = 1.0 + 0.02 * ((i % 5) - 2)  # -4 % .. +4 %
    stages = [{"name": n, "wall_s": s * jitter * scale, "tasks": sum(p.values()), "windows": 1}
              for n, (s, p) in plan.items()]
    wall = sum(s["wall_s"] for s in stages) + gap
    manifest = {"run_id": f"r{i:03d}", "version": version, "wall_s": wall, "stages": stages}
    rows = [{"run_id": f"r{i:03d}", "stage": n, "prefix": p, "tasks": c,
             "total_s": s * c / sum(ps.values())}
            for n, (s, ps) in plan.items() for p, c in ps.items()]
    return manifest, rows


def stats_of(n: int = 5, plan=PLAN, version: str = "v1", **kw):
    nights = [night(i, plan, version, **kw) for i in range(n)]
    tasks = pd.DataFrame([r for _, rows in nights for r in rows])
    return history_stats("p", version, [m for m, _ in nights], tasks)


def test_stats_per_stage_in_order():
    stats = stats_of()
    assert [s.name for s in stats.stages] == ["read", "ndvi", "write"]
    ndvi = stats.stage("ndvi")
    assert ndvi.p50_s == pytest.approx(200.0)
    assert ndvi.p90_s > ndvi.p50_s
    assert dict(ndvi.tasks) == {"ndvi": 40, "mask": 10}
    assert stats.total_p50_s == pytest.approx(350.0)


def test_gaps_are_shared_by_the_stages():
    stats = stats_of(gap=35.0)  # 10 % between the windows
    assert sum(s.p50_s for s in stats.stages) == pytest.approx(385.0)


def test_at_start_the_eta_is_the_sum_of_the_stages():
    eta = estimate(stats_of(), RunProgress(now=NOW, elapsed_s=0.0))
    assert eta.known
    assert eta.remaining_s == pytest.approx(350.0)
    assert eta.remaining_high_s > eta.remaining_s
    assert eta.finish_low == NOW + timedelta(seconds=350.0)
    assert eta.percent_done == 0.0
    assert eta.text.startswith("ETA 02:05–02:0")


def test_no_history_says_how_many_runs_are_needed():
    eta = estimate(stats_of(1), RunProgress(now=NOW, elapsed_s=0.0))
    assert not eta.known and eta.needs_runs == 2
    assert eta.text.startswith("no ETA yet: needs 2 earlier runs")
    assert eta.finish_high is None


def test_new_version_has_no_history():
    nights = [night(i)[0] for i in range(5)]
    stats = history_stats("p", "v2", nights)
    assert stats.runs == () and not stats.ready
    assert estimate(stats, RunProgress(now=NOW, elapsed_s=0.0)).text.startswith(
        "no ETA yet: needs 3 earlier runs")


def test_completed_stages_count_nothing_ahead():
    progress = RunProgress(now=NOW, elapsed_s=100.0, completed={"read": 100.0},
                           windows={"read": 1})
    eta = estimate(stats_of(), progress)
    assert eta.remaining_s == pytest.approx(250.0)
    assert eta.percent_done == pytest.approx(100 * 100 / 350)


def test_a_slow_stage_moves_the_eta_inside_the_stage():
    stats = stats_of()
    # ndvi half done after 200 s (its whole usual duration): running 2x slow
    done = {"ndvi": {"ndvi": 20, "mask": 5}}
    slow = RunProgress(now=NOW, elapsed_s=300.0, completed={"read": 100.0},
                       windows={"read": 1, "ndvi": 1}, current="ndvi", current_s=200.0,
                       done=done)
    time_only = RunProgress(now=NOW, elapsed_s=300.0, completed={"read": 100.0},
                            windows={"read": 1, "ndvi": 1}, current="ndvi", current_s=200.0)
    eta = estimate(stats, slow)
    assert eta.remaining_s > 100.0 + 50.0  # most of a second 200 s (prior-weighted), write
    assert eta.remaining_s > estimate(stats, time_only).remaining_s
    assert eta.lag.stage == "ndvi" and eta.lag.behind_pct > 50
    doc = eta.to_json()  # the stored estimate and the events' payloads
    assert list(doc) == ["known", "text", "remaining_s", "remaining_high_s", "finish_low",
                         "finish_high", "percent_done", "unknown", "lag", "needs_runs"]
    assert doc["lag"] == {"stage": "ndvi", "behind_pct": eta.lag.behind_pct,
                          "expected_s": eta.lag.expected_s, "projected_s": eta.lag.projected_s}
    assert doc["finish_low"] == eta.finish_low.isoformat()


def test_on_pace_stage_keeps_the_usual_eta():
    progress = RunProgress(now=NOW, elapsed_s=200.0, completed={"read": 100.0},
                           windows={"read": 1, "ndvi": 1}, current="ndvi", current_s=100.0,
                           done={"ndvi": {"ndvi": 20, "mask": 5}})
    assert estimate(stats_of(), progress).remaining_s == pytest.approx(150.0, rel=0.02)


def test_a_new_stage_is_named_and_left_out():
    progress = RunProgress(now=NOW, elapsed_s=120.0, completed={"read": 100.0},
                           windows={"read": 1, "publish": 1}, current="publish",
                           current_s=20.0, done={"publish": {"x": 3}})
    eta = estimate(stats_of(), progress)
    assert ("publish", "no history") in eta.unknown
    assert "not counting stage `publish`: no history" in eta.text
    assert eta.remaining_s == pytest.approx(250.0)


def test_a_stage_with_too_little_history_is_unknown():
    nights = [night(i)[0] for i in range(5)]
    nights[-1]["stages"].append({"name": "publish", "wall_s": 30.0, "windows": 1})
    eta = estimate(history_stats("p", "v1", nights), RunProgress(now=NOW, elapsed_s=0.0))
    assert ("publish", "too little history (1 of 3 nights)") in eta.unknown
    assert eta.remaining_s == pytest.approx(350.0, rel=0.05)


def test_a_stage_not_run_tonight_is_assumed_skipped():
    progress = RunProgress(now=NOW, elapsed_s=100.0, completed={"read": 100.0},
                           windows={"read": 1, "write": 1}, current="write", current_s=0.0)
    eta = estimate(stats_of(), progress)
    assert any(s == "ndvi" for s, _ in eta.unknown)
    assert eta.remaining_s == pytest.approx(50.0)


def test_an_optional_first_stage_keeps_its_place_in_the_order():
    # "prepare" ran first on the oldest night only (the data was missing): the night it
    # runs again, the stages after it are still to come, not skipped
    nights = [night(i)[0] for i in range(5)]
    nights[0]["stages"].insert(0, {"name": "prepare", "wall_s": 40.0, "windows": 1})
    nights[1]["stages"].append({"name": "publish", "wall_s": 5.0, "windows": 1})
    stats = history_stats("p", "v1", nights)
    assert [s.name for s in stats.stages] == ["prepare", "read", "ndvi", "write", "publish"]
    progress = RunProgress(now=NOW, elapsed_s=40.0, completed={"prepare": 40.0},
                           windows={"prepare": 1})
    eta = estimate(stats, progress)
    assert not any("not run tonight" in reason for _, reason in eta.unknown), eta.unknown
    assert eta.remaining_s == pytest.approx(350.0, rel=0.05)


def test_a_stage_with_zero_tasks_uses_time_only():
    plan = {"setup": (10.0, {}), **PLAN}
    stats = stats_of(plan=plan)
    assert stats.stage("setup").usual_tasks == 0
    progress = RunProgress(now=NOW, elapsed_s=5.0, windows={"setup": 1}, current="setup",
                           current_s=5.0, done={})
    eta = estimate(stats, progress)
    assert eta.remaining_s == pytest.approx(355.0)


def test_a_reused_stage_name_is_not_done_until_its_usual_windows():
    plan = dict(PLAN)
    nights = [night(i, plan)[0] for i in range(5)]
    for m in nights:
        m["stages"][1]["windows"] = 2
    stats = history_stats("p", "v1", nights)
    assert stats.stage("ndvi").windows == 2
    first = RunProgress(now=NOW, elapsed_s=200.0, completed={"read": 100.0, "ndvi": 100.0},
                        windows={"read": 1, "ndvi": 1})
    assert estimate(stats, first).remaining_s == pytest.approx(150.0)
    both = RunProgress(now=NOW, elapsed_s=300.0, completed={"read": 100.0, "ndvi": 200.0},
                       windows={"read": 1, "ndvi": 2})
    assert estimate(stats, both).remaining_s == pytest.approx(50.0)


def test_boundary_line():
    stats = stats_of()
    progress = RunProgress(now=NOW, elapsed_s=112.0, completed={"read": 112.0},
                           windows={"read": 1})
    eta = estimate(stats, progress)
    line = boundary_text("read", 112.0, stats, eta, NOW)
    assert line.startswith("stage read done at 02:00, 12 % behind its usual; ETA 02:0")
    assert "(02:04–02:0" in line


def test_parse_deadline():
    assert parse_deadline("06:00 Europe/Berlin") == Deadline(at=time(6), zone="Europe/Berlin")
    assert parse_deadline(timedelta(hours=4)) == Deadline(after=timedelta(hours=4))
    assert parse_deadline(None) is None


@pytest.mark.parametrize("bad, words", [
    ("six o'clock", "not \"HH:MM Zone\""), ("06:00", "not \"HH:MM Zone\""),
    ("25:00 UTC", "no such time"), ("06:00 Mars/Olympus", "unknown time zone"),
    (timedelta(0), "positive"), (6, "time of day")])
def test_bad_deadline_is_named(bad, words):
    with pytest.raises(ValueError, match="deadline") as info:
        parse_deadline(bad)
    assert words in str(info.value)


@pytest.mark.parametrize("check, name", [(check_margin, "deadline_margin"),
                                         (check_eta_interval, "eta_interval")])
def test_bad_margin_and_interval_are_named(check, name):
    for bad in (-1, float("nan"), "30", True, timedelta(seconds=-5)):
        with pytest.raises(ValueError, match=name):
            check(bad)
    assert check(timedelta(minutes=1)) == 60.0


def test_zero_margin_ok_zero_interval_not():
    assert check_margin(0) == 0.0
    with pytest.raises(ValueError, match="eta_interval"):
        check_eta_interval(0)


def test_time_of_day_deadline_is_the_next_one_after_the_schedule():
    berlin = parse_deadline("06:00 Europe/Berlin")
    evening = datetime(2026, 12, 2, 22, 0, tzinfo=UTC)  # 23:00 in Berlin
    at, note = resolve_deadline(berlin, evening, scheduled=evening)
    assert at == datetime(2026, 12, 3, 5, 0, tzinfo=UTC) and note is None
    early = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)  # 04:00 in Berlin: same morning
    assert resolve_deadline(berlin, early)[0] == datetime(2026, 12, 3, 5, 0, tzinfo=UTC)


@pytest.mark.parametrize("scheduled, expected", [
    # 2026-10-25 in Berlin: 03:00 summer time -> 02:00 winter time (02:00-03:00 twice)
    (datetime(2026, 10, 24, 21, 0, tzinfo=UTC), datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),
    # 02:45 summer time: the winter-time 02:30 is 45 minutes later, not the next day's
    (datetime(2026, 10, 25, 0, 45, tzinfo=UTC), datetime(2026, 10, 25, 1, 30, tzinfo=UTC)),
    # 02:20 winter time: the summer-time 02:30 has passed (no deadline in the past)
    (datetime(2026, 10, 25, 1, 20, tzinfo=UTC), datetime(2026, 10, 25, 1, 30, tzinfo=UTC)),
    (datetime(2026, 10, 25, 1, 40, tzinfo=UTC), datetime(2026, 10, 26, 1, 30, tzinfo=UTC)),
    # 2026-03-29: 02:30 does not exist; read with the offset before the change (03:30 CEST)
    (datetime(2026, 3, 28, 21, 0, tzinfo=UTC), datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
])
def test_a_deadline_in_a_clock_change_is_its_first_occurrence_after_the_start(scheduled,
                                                                               expected):
    at, note = resolve_deadline(parse_deadline("02:30 Europe/Berlin"), scheduled, scheduled)
    assert (at, note) == (expected, None)
    assert at > scheduled


def test_duration_deadline_counts_from_the_schedule():
    four = parse_deadline(timedelta(hours=4))
    scheduled = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
    late_start = scheduled + timedelta(minutes=30)
    assert resolve_deadline(four, late_start, scheduled)[0] == scheduled + timedelta(hours=4)
    at, note = resolve_deadline(four, late_start, None)
    assert at == late_start + timedelta(hours=4)
    assert "no scheduled start" in note and "its start" in note


def test_risk_and_tracker():
    stats = stats_of()
    eta = estimate(stats, RunProgress(now=NOW, elapsed_s=0.0))
    roomy = NOW + timedelta(hours=1)
    tight = NOW + timedelta(seconds=300)
    assert risk(eta, roomy, 0.0, NOW) == "on-track"
    assert risk(eta, tight, 0.0, NOW) == "at-risk"
    assert risk(eta, roomy, 3600.0, NOW) == "at-risk"  # the margin counts
    assert risk(eta, tight, 0.0, tight) == "late"
    assert risk(eta, tight, 0.0, tight, finished=True) == "at-risk"
    unknown = estimate(stats_of(1), RunProgress(now=NOW, elapsed_s=0.0))
    assert risk(unknown, roomy, 0.0, NOW) is None
    tracker = RiskTracker()
    seq = ["on-track", "on-track", "at-risk", "at-risk", "on-track", "at-risk", "late",
           "late", "on-track"]
    assert [tracker.update(s) for s in seq] == [
        None, None, "at-risk", None, "on-track", "at-risk", "late", None, None]


def test_a_prefect_scheduled_start_resolves_to_a_comparable_instant():
    """Prefect's ``expected_start_time`` is a pendulum-like DateTime: its arithmetic after
    ``astimezone(UTC)`` dropped the zone, and the live ETA's comparisons failed."""
    objects = pytest.importorskip("prefect.client.schemas.objects")
    run = objects.FlowRun(flow_id="00000000-0000-0000-0000-000000000000",
                          expected_start_time=NOW)
    for deadline in (parse_deadline(timedelta(hours=2)), parse_deadline("06:00 UTC")):
        at, note = resolve_deadline(deadline, NOW, run.expected_start_time)
        assert type(at) is datetime and at.tzinfo is not None and note is None
        assert at > NOW  # comparable with a plain aware datetime


def test_a_recovery_is_news_only_once_it_has_held():
    """The ETA inside a stage is a sawtooth: near the threshold it reads at-risk, on-track,
    at-risk...; with a hold, one at-risk and one on-track once the recovery held."""
    tracker = RiskTracker(hold_s=60.0)
    at = [NOW + timedelta(seconds=10 * i) for i in range(12)]
    seq = ["on-track", "at-risk", "on-track", "at-risk", "on-track", "on-track", "at-risk",
           "on-track", "on-track", "on-track", "on-track", "on-track"]
    got = [tracker.update(s, t) for s, t in zip(seq, at, strict=True)]
    assert got == [None, "at-risk"] + [None] * 10  # on-track since 70 s: held 40 s
    assert tracker.update("on-track", at[-1] + timedelta(seconds=10)) is None  # 50 s
    assert tracker.update("on-track", at[-1] + timedelta(seconds=20)) == "on-track"  # 60 s
    assert tracker.emitted == ["at-risk", "on-track"]
    with pytest.raises(ValueError, match="hold_s"):
        RiskTracker(hold_s=-1)
