"""The time outside the stages (the lead before the first, the tail after the last) as parts of
the ETA: pure, generated nights (fast tier)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from prefect_dask_profiling.forecast.model import (
    LEAD,
    TAIL,
    RunProgress,
    estimate,
    history_stats,
    night_layout,
)

NOW = datetime(2026, 12, 3, 2, 0, tzinfo=UTC)
T0 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
PLAN = {"read": (100.0, {"load": 10}), "ndvi": (200.0, {"ndvi": 40, "mask": 10}),
        "write": (50.0, {"store": 5})}
LEAD_S, TAIL_S = 120.0, 80.0  # large: 200 s of a 550 s night


def night(i: int, lead: float = LEAD_S, tail: float = TAIL_S, gap: float = 0.0,
          windows: bool = True, jitter: float = 0.0) -> tuple[dict, list[dict]]:
    """A night: ``lead``, the stages with ``gap`` between them, ``tail``; its stage windows
    stored (``allocation`` start / stop) unless ``windows`` is false."""
    scale = 1.0 + jitter * ((i % 5) - 2)
    started = T0 + timedelta(days=i)
    at, stages = started.timestamp() + lead * scale, []
    for k, (name, (seconds, prefixes)) in enumerate(PLAN.items()):
        at += gap * (k > 0)
        entry = {"name": name, "wall_s": seconds * scale, "tasks": sum(prefixes.values()),
                 "windows": 1}
        if windows:
            entry["allocation"] = {"start": at, "stop": at + seconds * scale}
        stages.append(entry)
        at += seconds * scale
    wall = at + tail * scale - started.timestamp()
    manifest = {"run_id": f"r{i:03d}", "version": "v1", "wall_s": wall,
                "started": started.isoformat(), "stages": stages}
    rows = [{"run_id": f"r{i:03d}", "stage": n, "prefix": p, "tasks": c,
             "total_s": s * c / sum(ps.values())}
            for n, (s, ps) in PLAN.items() for p, c in ps.items()]
    return manifest, rows


def stats_of(nights: list[tuple[dict, list[dict]]]):
    tasks = pd.DataFrame([r for _, rows in nights for r in rows])
    return history_stats("p", "v1", [m for m, _ in nights], tasks)


def progress_at(t: float, lead: float = LEAD_S) -> RunProgress:
    """Where a night laid out as :func:`night` (no gaps) is ``t`` seconds in (time only)."""
    at, completed, windows, current, current_s, closed = lead, {}, {}, None, 0.0, None
    for name, (seconds, _) in PLAN.items() if t >= lead else ():
        windows[name] = 1
        if t < at + seconds:
            current, current_s = name, t - at
            break
        completed[name] = seconds
        at += seconds
        closed = at
    since = t - closed if closed is not None and current is None else None
    return RunProgress(now=NOW, elapsed_s=t, completed=completed, windows=windows,
                       current=current, current_s=current_s, since_stage_s=since)


def test_layout_reads_lead_and_tail_from_the_windows():
    manifest, _ = night(0, gap=10.0)
    layout = night_layout(manifest)
    assert layout.known
    assert layout.lead_s == pytest.approx(LEAD_S)
    assert layout.tail_s == pytest.approx(TAIL_S)
    # the gaps between windows (2 x 10 s) are shared by the stages, in proportion
    assert sum(s for _, s, _ in layout.stages) == pytest.approx(370.0)
    assert dict((n, s) for n, s, _ in layout.stages)["ndvi"] == pytest.approx(200 * 370 / 350)


def test_a_night_without_windows_has_no_lead_or_tail():
    manifest, _ = night(0, windows=False)
    layout = night_layout(manifest)
    assert not layout.known and layout.lead_s is None and layout.tail_s is None
    assert sum(s for _, s, _ in layout.stages) == pytest.approx(550.0)  # as before: the wall


def test_windows_outside_the_wall_are_read_as_missing():
    manifest, _ = night(0)
    manifest["wall_s"] = 300.0  # the scheduler's clock and the flow's disagree
    assert not night_layout(manifest).known


def test_lead_and_tail_have_their_own_p50_and_p90():
    stats = stats_of([night(i, jitter=0.02) for i in range(5)])
    assert stats.lead.name == LEAD and stats.tail.name == TAIL
    assert stats.lead.nights == stats.tail.nights == 5
    assert stats.lead.p50_s == pytest.approx(LEAD_S)
    assert stats.lead.p90_s > stats.lead.p50_s
    assert stats.tail.p50_s == pytest.approx(TAIL_S)
    assert stats.stage("read").p50_s == pytest.approx(100.0)  # not holding the lead


def test_at_the_start_the_eta_is_lead_plus_stages_plus_tail():
    eta = estimate(stats_of([night(i) for i in range(5)]), RunProgress(now=NOW, elapsed_s=0.0))
    assert eta.remaining_s == pytest.approx(LEAD_S + 350.0 + TAIL_S)
    assert eta.unknown == ()


@pytest.mark.parametrize("share", [0.1, 0.25, 0.5, 0.75, 0.9])
def test_a_stationary_history_is_exact_at_every_point(share):
    stats = stats_of([night(i) for i in range(5)])
    total = LEAD_S + 350.0 + TAIL_S
    t = share * total  # 10 %: in the lead; 25-75 %: in the stages; 90 %: in the tail
    eta = estimate(stats, progress_at(t))
    assert t + eta.remaining_s == pytest.approx(total)
    assert eta.remaining_high_s == pytest.approx(eta.remaining_s)  # identical nights


def test_between_stages_the_tail_is_still_to_come():
    stats = stats_of([night(i) for i in range(5)])
    between = RunProgress(now=NOW, elapsed_s=LEAD_S + 105.0, completed={"read": 100.0},
                          windows={"read": 1}, since_stage_s=5.0)
    assert estimate(stats, between).remaining_s == pytest.approx(250.0 + TAIL_S)


def test_after_the_last_stage_only_the_tail_remains():
    stats = stats_of([night(i) for i in range(5)])
    done = {n: s for n, (s, _) in PLAN.items()}
    after = RunProgress(now=NOW, elapsed_s=LEAD_S + 380.0, completed=done,
                        windows=dict.fromkeys(PLAN, 1), since_stage_s=30.0)
    eta = estimate(stats, after)
    assert eta.remaining_s == pytest.approx(TAIL_S - 30.0)
    unknown_since = RunProgress(now=NOW, elapsed_s=LEAD_S + 380.0, completed=done,
                                windows=dict.fromkeys(PLAN, 1))
    assert estimate(stats, unknown_since).remaining_s == pytest.approx(TAIL_S)
    late = RunProgress(now=NOW, elapsed_s=LEAD_S + 500.0, completed=done,
                       windows=dict.fromkeys(PLAN, 1), since_stage_s=150.0)
    assert estimate(stats, late).remaining_s == pytest.approx(0.0)


def test_a_slow_start_up_moves_the_eta_in_the_lead():
    stats = stats_of([night(i) for i in range(5)])
    eta = estimate(stats, RunProgress(now=NOW, elapsed_s=2 * LEAD_S))
    assert eta.remaining_s == pytest.approx(350.0 + TAIL_S)  # the lead is over its p90
    assert eta.lag is None  # the stage behind (events, logs) is always a stage


def test_too_few_nights_with_windows_say_so():
    nights = [night(i, windows=i >= 3) for i in range(5)]  # two nights with windows
    stats = stats_of(nights)
    assert stats.lead.nights == 2
    start = estimate(stats, RunProgress(now=NOW, elapsed_s=0.0))
    reason = "too little history (2 of 3 nights with stage windows)"
    assert start.unknown == ((LEAD, reason), (TAIL, reason))
    assert f"not counting the time {LEAD}: {reason}" in start.text
    inside = estimate(stats, progress_at(LEAD_S + 10.0))
    assert inside.unknown == ((TAIL, reason),)  # the lead is over: nothing left out of it


def test_no_night_with_windows_keeps_the_outside_time_in_the_stages():
    stats = stats_of([night(i, windows=False) for i in range(5)])
    assert stats.lead is None and stats.tail is None
    eta = estimate(stats, RunProgress(now=NOW, elapsed_s=0.0))
    assert eta.unknown == ()
    assert eta.remaining_s == pytest.approx(LEAD_S + 350.0 + TAIL_S)


def test_the_plan_shows_lead_and_tail():
    from prefect_dask_profiling.cli.eta import plan_json, plan_lines

    stats = stats_of([night(i) for i in range(5)])
    plan = plan_json(stats)
    assert [o["part"] for o in plan["outside"]] == [LEAD, TAIL]
    assert plan["outside"][0]["p50_s"] == pytest.approx(LEAD_S)
    assert plan["run"]["expected_s"] == pytest.approx(LEAD_S + 350.0 + TAIL_S)
    lines = plan_lines(stats, plan)
    assert any(line.strip().startswith(LEAD) for line in lines), lines
    assert any(line.strip().startswith(TAIL) for line in lines), lines
