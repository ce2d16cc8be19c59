"""The history's state machine (regression/alerts.py), row by row of its transition table.

Pure: generated nights of signals in, the state and events out. The same machine through
the real judge and store is tests/regression/test_history_simulation.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_dask_profiling._util import InvalidInput, json_clean
from prefect_dask_profiling.regression.alerts import (
    Ack,
    Book,
    Night,
    Signal,
    advance,
    failing,
    replay,
    run_status,
)
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store.manifest import RunKey

READ = ("read", "open", "total_s")
OOM = ("reduce", "", "headroom")
PEAK = ("reduce", "", "peak_bytes")


def night(day: int, signals: dict | None = None, status: str | None = None,
          rule: RegressionRule | None = None) -> Night:
    sig = signals or {}
    flagged = any(s.alert in ("regression", "suspected") for s in sig.values())
    return Night(RunKey(f"r{day:03d}", "p", "v"), sig, rule or RegressionRule(),
                 status or ("regressed" if flagged else "healthy"),
                 started=f"2026-11-{day:02d}T02:00:00+00:00")


def reg(ratio: float = 3.0, verdict: str = "regression") -> Signal:
    return Signal("regression", ratio, verdict)


def sus(ratio: float = 2.5, verdict: str = "regression") -> Signal:
    return Signal("suspected", ratio, verdict)


def calm(ratio: float = 1.0) -> Signal:
    return Signal("", ratio, "ok")


def run(nights: list[Night], acks: list[Ack] | None = None) -> tuple[Book, list[list[str]],
                                                                        list[bool]]:
    """Fold nights one at a time: the state, each night's events and whether it failed."""
    book, events, fails = Book(), [], []
    for n in nights:
        book, new = advance(book, n, acks or [])
        events.append([e.kind for e in new])
        fails.append(bool(failing(book, n)))
    return book, events, fails


def test_a_suspicion_confirmed_then_resolved():
    nights = [night(1, {READ: sus()}), night(2, {READ: reg()}), night(3, {READ: reg()}),
              *[night(d, {READ: calm()}) for d in (4, 5, 6)]]
    book, events, fails = run(nights)
    assert events == [["suspected"], ["detected"], [], [], [], ["resolved"]]
    assert fails == [False, True, True, False, False, False]
    [ep] = book.episodes
    assert ep.state == "resolved" and ep.flagged_runs == ("r001", "r002", "r003")
    # the flagged nights stay out of the time baseline, the calm ones count
    assert book.baseline_runs("time") == ["r006", "r005", "r004"]


def test_a_cleared_suspicion_gives_its_night_back():
    book, events, fails = run([night(1, {READ: calm()}), night(2, {READ: sus()}),
                               night(3, {READ: Signal("cleared", 1.1, "ok")})])
    assert events == [[], ["suspected"], ["cleared"]] and fails == [False] * 3
    assert book.baseline_runs("time") == ["r003", "r002", "r001"]


def test_an_open_suspicion_keeps_its_night_out_until_decided():
    book, _, _ = run([night(1, {READ: calm()}), night(2, {READ: sus()})])
    assert book.baseline_runs("time") == ["r001"]
    assert run_status(book, night(2, {READ: sus()})) == "suspected"


def test_chronic_near_oom_fails_once_and_time_stays_judgeable():
    """Defect 1: every night at 0.93 of the limit, then a 10x read on night 9."""
    nights = [night(d, {OOM: reg(math.nan, "near-oom"), READ: calm()}) for d in range(1, 9)]
    book, events, fails = run(nights)
    assert fails == [True] + [False] * 7  # reported every night, fails once per episode
    assert events[0] == ["detected"] and all(e == [] for e in events[1:])
    assert book.baseline_runs("time") == [f"r{d:03d}" for d in range(8, 0, -1)]
    assert book.baseline_runs("memory") == book.baseline_runs("time")  # no family of its own
    tonight = night(9, {OOM: reg(math.nan, "near-oom"), READ: reg(10.0)})
    after, new = advance(book, tonight)
    assert [ep.metric for ep in failing(after, tonight)] == ["total_s"]
    assert [e.kind for e in new] == ["detected"]


def test_a_memory_regression_keeps_the_night_out_of_the_memory_baseline_only():
    book, _, _ = run([night(1), night(2, {PEAK: sus(2.0, "memory-regression")}),
                      night(3, {PEAK: reg(2.1, "memory-regression")})])
    assert book.baseline_runs("time") == ["r003", "r002", "r001"]
    assert book.baseline_runs("memory") == ["r001"]


def test_an_acknowledged_episode_is_silent_and_stays_out_of_the_baseline():
    """Defect 5: an ack is not accept."""
    confirmed = [night(1, {READ: reg(5.0)})]
    book, _, _ = run(confirmed)
    ep_id = book.episodes[0].id
    ack = Ack(ep_id, at="2026-11-01T12:00:00+00:00")
    nights = [*confirmed, *[night(d, {READ: reg(5.0)}) for d in (2, 3, 4)]]
    book, events, fails = run(nights, [ack])
    assert fails == [True, False, False, False]
    assert events == [["detected"], [], [], []]
    assert book.episodes[0].state == "acknowledged"
    assert book.baseline_runs("time") == []


def test_a_bounded_ack_runs_out_and_the_episode_is_detected_again():
    book, _, _ = run([night(1, {READ: reg(5.0)})])
    ack = Ack(book.episodes[0].id, at="2026-11-01T12:00:00+00:00", nights=2)
    nights = [night(d, {READ: reg(5.0)}) for d in range(1, 6)]
    book, events, fails = run(nights, [ack])
    assert fails == [True, False, False, True, True]
    assert events == [["detected"], [], [], ["detected"], []]
    first, again = (e for n in nights for e in advance(replay(
        [m for m in nights if m.run_id < n.run_id], [ack])[0], n, [ack])[1])
    assert first.id != again.id and first.episode.id == again.episode.id


def test_an_ack_made_later_does_not_silence_earlier_nights():
    book, _, _ = run([night(1, {READ: reg(5.0)})])
    ack = Ack(book.episodes[0].id, at="2026-11-03T00:00:00+00:00")
    _, events, fails = run([night(d, {READ: reg(5.0)}) for d in (1, 2, 3)], [ack])
    assert fails == [True, True, False]


def test_an_ack_by_run_silences_every_episode_open_at_it():
    nights = [night(1, {READ: reg(5.0), PEAK: sus(2.0, "memory-regression")}),
              night(2, {READ: reg(5.0), PEAK: reg(2.0, "memory-regression")})]
    _, _, fails = run(nights, [Ack("r001", at="2026-11-01T12:00:00+00:00")])
    assert fails == [True, False]


def test_accepting_a_night_restarts_every_baseline_and_ends_its_episodes():
    nights = [night(1), night(2, {READ: reg(5.0)}), night(3, {READ: reg(5.0)}),
              night(4, {READ: calm(5.0)})]
    book, _ = replay(nights, restart="r003")
    assert book.open() == [] and book.baseline_runs("time") == ["r004", "r003"]


def test_a_night_folded_twice_changes_nothing():
    book, _, _ = run([night(1, {READ: sus()})])
    again, events = advance(book, night(1, {READ: sus()}))
    assert again is book and events == []


def test_nights_are_folded_by_their_start_whatever_the_listing_order():
    nights = [night(1, {READ: sus()}), night(2, {READ: reg()}), night(3, {READ: calm()})]
    forward, fe = replay(nights)
    backward, be = replay(nights[::-1])
    assert forward == backward and [e.id for e in fe] == [e.id for e in be]


def test_an_overlapping_nights_events_are_those_its_judge_derived():
    """A (02:00-04:00) suspects `read`; B (03:00-03:30) flags it too. B's judge did not see
    A (still running when B started): B opens its own suspicion. The replay says the same
    for B, and carries both nights on to C, which confirms."""
    a = replace(night(1, {READ: sus()}), ended="2026-11-01T04:00:00+00:00")
    b = replace(night(1, {READ: sus()}), run=RunKey("r001b", "p", "v"),
                started="2026-11-01T03:00:00+00:00", ended="2026-11-01T03:30:00+00:00")
    c = night(2, {READ: reg()})
    alone, b_events = replay([b])
    book, events = replay([c, b, a])
    assert [(e.kind, e.run_id) for e in events if e.run_id == "r001b"] == \
        [(e.kind, e.run_id) for e in b_events] == [("suspected", "r001b")]
    assert [e.kind for e in events if e.run_id == "r001"] == ["suspected"]
    assert [e.kind for e in events if e.run_id == "r002"] == ["detected"]
    assert failing(book, c)
    [ep] = book.episodes  # B flagged A's open suspicion again: it stayed open, C confirmed it
    assert ep.flagged_runs == ("r001", "r001b", "r002") and ep.confirmed_run == "r002"
    # without the overlap the same replay advances B from A's state: one shared episode
    b_after = replace(b, started="2026-11-01T05:00:00+00:00", ended="2026-11-01T05:30:00+00:00")
    _, later = replay([a, b_after])
    assert len({e.episode.id for e in later}) == 1


def test_a_stored_regressed_night_without_signals_is_out_of_every_baseline():
    book, _, _ = run([night(1), night(2, status="regressed"), night(3)])
    for family in ("time", "memory", "requests"):
        assert book.baseline_runs(family) == ["r003", "r001"]


def test_each_night_transitions_with_its_own_rule():
    slow = RegressionRule(resolve_after=5)
    nights = [night(1, {READ: reg()}, rule=slow),
              *[night(d, {READ: calm()}, rule=slow) for d in (2, 3, 4)]]
    book, _, _ = run(nights)
    assert book.open() != []  # three calm nights do not resolve under resolve_after=5


def test_bad_ack_nights_are_refused():
    with pytest.raises(ValueError, match="ack nights"):
        Ack("ep-1", nights=0)


# ---------------------------------------------------------------------- carried state
SIGNALS = {"calm": calm(), "reg": reg(), "sus": sus(), "back": calm(1.05), "gone": None}


def _stored(book: Book) -> Book:
    """``book`` as a later replay reads it: through the manifest's JSON and back."""
    return Book.from_carried(json.loads(json.dumps(json_clean(book.carried()))))


def _open_state(book: Book) -> list:
    return json_clean(sorted((e.to_json() for e in book.open()), key=lambda e: e["id"]))


@settings(max_examples=150, deadline=None)
@given(plan=st.lists(st.tuples(st.sampled_from(sorted(SIGNALS)), st.sampled_from(sorted(SIGNALS)),
                               st.sampled_from(sorted(SIGNALS)), st.booleans()),
                     min_size=1, max_size=30))
def test_every_window_replays_to_the_state_of_the_whole_history(plan):
    """Each night stores the state its judge started from; a replay of any number of the
    newest nights, starting from what its first night stored, ends in the state of the
    whole history (the same open episodes: ids, acks, counts) with the same events for the
    newest night — an episode older than the window is not re-opened under a new id."""
    nights, acks, book, last_events = [], [], Book(), []
    for day, (read, oom, peak, ack) in enumerate(plan, start=1):
        signals = {key: SIGNALS[name] for key, name in ((READ, read), (OOM, oom), (PEAK, peak))
                   if SIGNALS[name] is not None}
        tonight = replace(night(day, signals), carried=_stored(book))
        if ack:  # ``ack RUN`` of the previous night, made before tonight started
            acks.append(Ack(f"r{day - 1:03d}", at=f"2026-11-{day:02d}T01:00:00+00:00"))
        book, last_events = advance(book, tonight, acks)
        nights.append(tonight)
    for window in range(1, len(nights) + 1):
        replayed, events = replay(nights[-window:], acks)
        assert _open_state(replayed) == _open_state(book), window
        assert [e.id for e in events if e.run_id == nights[-1].run_id] == \
            [e.id for e in last_events], window


def test_a_damaged_carried_state_is_refused_by_name():
    with pytest.raises(InvalidInput, match="'episodes' and 'ratios'"):
        Book.from_carried({"episodes": "none"})
    with pytest.raises(InvalidInput, match="has no 'pipeline'"):
        Book.from_carried({"episodes": [{"id": "ep-1"}], "ratios": []})
    book, _ = advance(Book(), night(1, {READ: reg()}))
    doc = json_clean(book.carried())
    doc["episodes"][0]["state"] = "resolved"
    with pytest.raises(InvalidInput, match="not open"):
        Book.from_carried(doc)
