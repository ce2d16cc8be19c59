"""Alert episodes on generated nights: one step, one blip, an acknowledgement, a retried run.

Each night goes through the real chain the judge runs — ``detect_regressions`` against the
last 8 runs that count, :func:`confirm_verdicts`, :func:`advance` — and the store round
trip writes real runs to a local :class:`RunStore` and reads them back with the CLI.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.cli._output import out_console
from prefect_dask_profiling.errors import HistoryUnavailable
from prefect_dask_profiling.regression import alert_history
from prefect_dask_profiling.regression.alerts import (
    Ack,
    AlertEvent,
    Book,
    Night,
    advance,
    episode_id,
    failing,
    priors,
    replay,
    run_status,
)
from prefect_dask_profiling.regression.confirm import confirm_verdicts, noise_reach
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.regression.verdict import detect_regressions
from prefect_dask_profiling.store.manifest import RunKey
from prefect_dask_profiling.store.runs import RunStore, StoreError, new_run_id

LEVELS = {"a": 50.0, "b": 40.0, "c": 30.0, "d": 20.0, "e": 60.0}
T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


class Pipeline:
    """A nightly pipeline judged like the judge does, one run at a time.

    The baseline is the last 8 runs that count: healthy ones, and suspected ones once the
    next run cleared all their suspicions. The 8 starting nights are healthy and include one
    2.6x blip of prefix ``e``: the pipeline's recent nights are not calm, so a 2.5x jump
    waits for a second night.
    """

    def __init__(self, seed: int = 0, rule: RegressionRule | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.rule = rule or RegressionRule()
        self.day = 0
        self.runs: list[tuple[str, pd.DataFrame, str]] = []
        for i in range(8):
            values = self.values(e=2.6 if i == 3 else 1.0)
            self.runs.append((self.next_id(), values, "healthy"))
        self.book, self.acks = Book(), []
        self.nights: list[Night] = []
        self.events: list[AlertEvent] = []

    def next_id(self) -> str:
        self.day += 1
        return new_run_id(T0 + timedelta(days=self.day)).split("-")[0] + f"-{self.day:06x}"

    def values(self, **factors: float) -> pd.DataFrame:
        jitter = self.rng.uniform(0.95, 1.05, len(LEVELS))
        return pd.DataFrame({"stage": "s", "prefix": list(LEVELS), "tasks": 10.0,
                             "total_s": [lvl * j * factors.get(p, 1.0) for (p, lvl), j
                                         in zip(LEVELS.items(), jitter, strict=True)]})

    def baseline(self) -> pd.DataFrame:
        counted = [(r, v) for r, v, s in self.runs if s == "healthy"][-8:]
        return pd.concat([v.assign(run_id=r) for r, v in counted], ignore_index=True)

    def judge(self, run_id: str | None = None, **factors: float
              ) -> tuple[Night, list[str], list[AlertEvent]]:
        """Judge one night; returns it, the prefixes failing it, and tonight's events."""
        history = self.baseline()
        verdicts = detect_regressions(history, self.values(**factors), rule=self.rule)
        table = confirm_verdicts(verdicts, priors(self.book), self.rule, noise_reach(history))
        night = Night.from_tables(RunKey(run_id or self.next_id(), "nightly", "v1"), table,
                                  rule=self.rule)
        self.book, events = advance(self.book, night, self.acks)
        if not any(r == night.run_id for r, _, _ in self.runs):
            self._clear_previous(table)
            self.runs.append((night.run_id, table.assign(total_s=table["latest_s"],
                                                         tasks=10.0),
                              run_status(self.book, night)))
            self.nights.append(night)
            self.events.extend(events)
        return night, sorted(e.prefix for e in failing(self.book, night)), events

    def _clear_previous(self, tonight: pd.DataFrame) -> None:
        """A suspected run counts again once tonight cleared all of its suspicions."""
        if not self.runs or self.runs[-1][2] != "suspected":
            return
        run_id, values, _ = self.runs[-1]
        if not (tonight["alert"] == "regression").any():
            self.runs[-1] = (run_id, values, "healthy")


def kinds(events: list[AlertEvent], prefix: str | None = None) -> list[str]:
    return [e.kind for e in events if prefix is None or e.episode.prefix == prefix]


def test_a_step_is_suspected_confirmed_and_resolved_once_it_is_removed():
    p = Pipeline()
    night, fails, events = p.judge(b=2.5)
    assert fails == [] and kinds(events) == ["suspected"]
    assert run_status(p.book, night) == "suspected"
    _, fails, events = p.judge(b=2.5)
    assert fails == ["b"] and kinds(events) == ["detected"]
    _, fails, events = p.judge(b=2.5)  # still there: fails again, nothing new to say
    assert fails == ["b"] and events == []
    for _ in range(2):
        _, fails, events = p.judge()
        assert fails == [] and events == []
    _, fails, events = p.judge()  # third run back within the baseline
    assert kinds(events) == ["resolved"]
    assert kinds(p.events) == ["suspected", "detected", "resolved"]
    assert len({e.episode.id for e in p.events}) == 1
    (ep,) = p.book.episodes
    assert (ep.state, ep.prefix, ep.nights) == ("resolved", "b", 3)
    assert ep.id == episode_id("nightly", "v1", "s", "b", "total_s", ep.start_run)


def test_a_one_night_blip_is_suspected_then_cleared_and_fails_nothing():
    p = Pipeline()
    _, fails1, _ = p.judge(b=2.5)
    night2, fails2, _ = p.judge()
    assert fails1 == fails2 == []
    assert kinds(p.events) == ["suspected", "cleared"]
    assert p.book.episodes[0].state == "cleared" and not p.book.open()
    assert run_status(p.book, night2) == "healthy"
    assert p.runs[-2][2] == "healthy"  # the cleared night counts in baselines again


def test_calm_history_fails_a_step_on_the_first_night():
    p = Pipeline()
    p.runs = [(r, v.assign(total_s=v["total_s"].where(v["prefix"] != "e", 60.0)), s)
              for r, v, s in p.runs]  # no blip in the baseline: reach ~1.1
    _, fails, events = p.judge(b=2.5)
    assert fails == ["b"] and kinds(events) == ["detected"]


@pytest.mark.parametrize("by", ["episode", "run"])
def test_an_acknowledged_episode_does_not_fail_the_next_night(by):
    p = Pipeline()
    p.judge(b=2.5)
    night2, fails, _ = p.judge(b=2.5)
    assert fails == ["b"]
    (ep,) = p.book.open()
    p.acks.append(Ack(ep.id if by == "episode" else night2.run_id))
    _, fails, events = p.judge(b=2.5)
    assert fails == [] and events == []
    (ep,) = p.book.open()
    assert ep.state == "acknowledged" and ep.acknowledged
    for _ in range(3):
        p.judge()
    assert kinds(p.events) == ["suspected", "detected", "resolved"]


def test_an_ack_names_only_the_episodes_it_was_given():
    p = Pipeline()
    first, _, _ = p.judge(b=2.5)
    p.acks.append(Ack(first.run_id))  # acked while suspected: confirmation stays silent
    _, fails, events = p.judge(b=2.5, c=2.5)
    assert fails == [] and kinds(events) == ["suspected"]  # c is a new episode
    assert [e.prefix for e in p.book.open() if e.acknowledged] == ["b"]


def test_feeding_the_same_run_twice_emits_nothing_twice():
    p = Pipeline()
    night, _, events = p.judge(b=2.5)
    assert kinds(events) == ["suspected"]
    before = p.book
    _, _, again = p.judge(run_id=night.run_id, b=2.5)  # a retried flow run
    assert again == [] and p.book == before
    p.judge(b=2.5)
    book, replayed = replay(p.nights, p.acks)
    assert [(e.kind, e.id) for e in replayed] == [(e.kind, e.id) for e in p.events]
    again_book, again_events = replay(p.nights, p.acks, book=book)
    assert again_events == [] and again_book == book
    assert len({e.id for e in p.events}) == len(p.events)


def test_advance_refuses_a_bad_rule():
    with pytest.raises(ValueError, match="rule must be a RegressionRule"):
        Night.from_tables(RunKey("r", "p", "v"), pd.DataFrame(), rule={})  # type: ignore[arg-type]


def test_runs_stored_before_confirmation_replay_as_failing_on_the_first_night():
    table = pd.DataFrame({"stage": ["s", "s"], "prefix": ["a", "b"],
                          "verdict": ["regression", "ok"], "ratio": [2.5, 1.0]})
    night = Night.from_tables(RunKey("r1", "p", "v"), table)
    book, events = advance(Book(), night, [])
    assert kinds(events) == ["detected"] and [e.prefix for e in failing(book, night)] == ["a"]


# ---- the store and the command line --------------------------------------------------------

@pytest.fixture
def stored(tmp_path) -> tuple[RunStore, Pipeline]:
    """A local store holding a pipeline's step: suspected, confirmed, still failing."""
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    p = Pipeline()
    for _ in range(3):
        p.judge(b=2.5)
    for run_id, table, status in p.runs[8:]:
        manifest = {"version": "v1", "status": "regressed" if status == "regressed"
                    else "healthy", "state": "COMPLETED"}
        tasks = table[["stage", "prefix"]].assign(tasks=10, total_s=table["latest_s"])
        result = store.write_run("nightly", run_id, {"tasks": tasks, "regression": table},
                                 manifest)
        assert not result.spooled, result.warnings
    return store, p


def test_episodes_recomputed_from_the_store_match_the_judged_ones(stored):
    store, p = stored
    book, events = alert_history.episodes_of(store, "nightly", "v1")
    assert [e.id for e in book.episodes] == [e.id for e in p.book.episodes]
    assert kinds(events) == ["suspected", "detected"]


def test_alerts_replays_the_window_its_newest_nights_judge_saw(stored):
    """The judge of the newest night replayed the ``runs`` nights before it: ``alerts``
    folds exactly those and the newest, so an episode at the window's edge is the same."""
    store, _ = stored
    ids = sorted(e["run_id"] for e in store.list_runs("nightly", "v1"))
    assert len(ids) == 3
    window = alert_history.load_nights(store, "nightly", "v1", 1, before=ids[-1])
    book, _ = alert_history.episodes_of(store, "nightly", "v1", runs=1)
    assert [n.run_id for n in window] == ids[-2:-1]
    assert list(book.runs) == ids[-2:]


def test_ack_is_stored_and_read_back(stored):
    store, p = stored
    (ep,) = p.book.open()
    ack = alert_history.acknowledge(store, "nightly", "v1", ep.id, note="known: new GDAL")
    assert alert_history.load_acks(store, "nightly", "v1") == [ack]
    book, _ = alert_history.episodes_of(store, "nightly", "v1")
    assert book.open()[0].acknowledged
    with pytest.raises(ValueError, match="ack target"):
        alert_history.ack_marker("nightly", "v1", "../x")


def test_cli_lists_acknowledges_and_counts(stored):
    store, p = stored
    runner = CliRunner()
    (ep,) = p.book.open()
    listed = runner.invoke(app, ["alerts", "--store", store.url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert [e["id"] for e in json.loads(listed.stdout)["episodes"]] == [ep.id]
    out_console.cache_clear()  # the console reads COLUMNS when it is made (on first use)
    try:
        table = runner.invoke(app, ["alerts", "--store", store.url], env={"COLUMNS": "200"})
    finally:
        out_console.cache_clear()  # the next test's console is its own
    assert ep.id in table.stdout and "confirmed" in table.stdout
    acked = runner.invoke(app, ["ack", ep.id, "--store", store.url])
    assert acked.exit_code == 0 and "acknowledged episode" in acked.stdout, acked.output
    stats = runner.invoke(app, ["alerts", "--stats", "--store", store.url, "--json"])
    (row,) = json.loads(stats.stdout)["stats"]
    assert (row["pipeline"], row["confirmed"], row["cleared"], row["acknowledged"],
            row["open"]) == ("nightly", 1, 0, 1, 1)
    unknown = runner.invoke(app, ["ack", "ep-0000000000", "--store", store.url])
    assert unknown.exit_code == 2 and "no alert episode ep-0000000000" in unknown.stderr
    by_run = runner.invoke(app, ["ack", p.runs[-1][0], "--store", store.url, "--json"])
    assert by_run.exit_code == 0 and json.loads(by_run.stdout)["version"] == "v1"


def test_a_night_with_a_damaged_carried_state_is_an_unreadable_night():
    """A replay that started from a damaged carried state would lose its open episodes:
    the night is unreadable (tonight ``unjudged``), named."""
    manifest = {"run_id": "20261101T020000Z-000001", "pipeline": "nightly", "version": "v1",
                "status": "healthy", "carried": {"episodes": [{"id": "ep-1"}], "ratios": []}}
    with pytest.raises(HistoryUnavailable, match="20261101T020000Z-000001 .*damaged carried"):
        alert_history.night_from_manifest(manifest, None)
    night = alert_history.night_from_manifest({**manifest, "carried": {
        "after": None, "episodes": [], "ratios": [
            {"stage": "s", "prefix": "p", "metric": "total_s", "ratio": None}]}}, None)
    assert night.carried is not None and math.isnan(night.carried.ratios[("s", "p", "total_s")])


def test_the_window_reaches_back_for_a_night_still_running_when_it_began():
    """The window's first night stored the state its judge started from, which cannot hold
    a night that had not ended then: the replay folds that night (and those between)."""
    def doc(day: int, start_h: int, end_h: int) -> dict:
        return {"started": f"2026-11-{day:02d}T{start_h:02d}:00:00+00:00",
                "ended": f"2026-11-{day:02d}T{end_h:02d}:00:00+00:00"}

    listed = ["r1", "r2", "r3", "r4", "r5"]
    manifests = {"r1": doc(1, 2, 3), "r2": doc(2, 2, 9), "r3": doc(2, 3, 4),
                 "r4": doc(2, 5, 6), "r5": doc(3, 2, 3)}
    # r4 starts the window of 2; r2 ran until 09:00, past r4's start: r2 and r3 come along
    assert alert_history._window(listed, 2, manifests) == ["r2", "r3", "r4", "r5"]
    manifests["r2"] = doc(2, 2, 4)  # ended before r4 started: the window is the newest 2
    assert alert_history._window(listed, 2, manifests) == ["r4", "r5"]
    manifests["r2"] = StoreError("unreadable")  # outside the window: taken as ended
    assert alert_history._window(listed, 2, manifests) == ["r4", "r5"]
    assert alert_history._window(listed, 9, manifests) == listed
