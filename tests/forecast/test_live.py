"""The live forecast on its own (pure: no Prefect, no store, no thread): what it hands its
sink — the progress (never backwards, 100 at the end), the deadline's news with their stable
ids, the lines for the run's log."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from prefect_dask_profiling.forecast.live import (
    AT_RISK_EVENT,
    LATE_EVENT,
    LiveForecast,
    RiskNews,
    event_id,
)
from prefect_dask_profiling.forecast.model import HistoryStats, StageStats
from prefect_dask_profiling.store.manifest import RunContext

START = datetime.now(UTC) - timedelta(seconds=5)
STATS = HistoryStats("ndvi", "1", ("r-a", "r-b", "r-c"),
                     (StageStats("one", 3, 10.0, 12.0), StageStats("two", 3, 20.0, 30.0)),
                     30.0)


class Sink:
    """Keeps what it is told."""

    def __init__(self) -> None:
        self.percents: list[float] = []
        self.news: list[RiskNews] = []
        self.lines: list[tuple[int, str]] = []

    def progress(self, percent: float, text: str) -> None:
        self.percents.append(percent)

    def risk(self, news: RiskNews) -> None:
        self.news.append(news)

    def say(self, level: int, message: str) -> None:
        self.lines.append((level, message))


def forecast(**options) -> tuple[LiveForecast, Sink]:
    sink = Sink()
    ctx = RunContext(run_id="r1", pipeline="ndvi", version="1", started=START,
                     flow_run_id="f-1")
    return LiveForecast(ctx, sink, interval=30.0, **options), sink


def test_the_progress_never_goes_back_and_ends_at_100():
    live, sink = forecast()
    live.stats = STATS
    live.clock.opened("one")
    live.update()
    live.clock.closed("one")
    live.boundary("one", {"one": {"load": 3}})
    live.percent = 99.0  # as if an earlier estimate had said more
    live.update()
    live.finished()
    assert sink.percents == sorted(sink.percents) and sink.percents[-1] == 100.0
    assert [level for level, _ in sink.lines] == [logging.INFO]
    assert sink.lines[0][1].startswith("dask-profiling: stage one done")
    assert live.counts == {"one": {"load": 3}} and live.live_estimate(
        live.eta, live.made_at)["stages_done"] == ["one"]


def test_the_deadlines_news_goes_to_the_sink_with_its_stable_id():
    live, sink = forecast(deadline=timedelta(hours=1))
    live.resolve_deadline(None)
    live.update(now=START + timedelta(minutes=59))  # no history: nothing to judge yet
    assert sink.news == []
    live.update(now=START + timedelta(hours=1))
    [late] = sink.news
    assert (late.kind, late.event, late.id) == ("late", LATE_EVENT, event_id("f-1", "late", 1))
    assert late.payload["judged"]["on"] == "clock" and late.stage is None
    assert late.line.startswith("dask-profiling: run late (deadline ")
    assert AT_RISK_EVENT not in {n.event for n in sink.news}


def test_a_failing_sink_never_stops_the_forecast():
    live, _ = forecast(deadline=timedelta(minutes=1))

    class Down:
        def progress(self, *args):
            raise ConnectionError("Prefect API down")

        risk = say = progress

    live.resolve_deadline(None)
    live.sink = Down()
    live.stats = STATS
    assert live.update(now=START + timedelta(minutes=2)) is not None
    assert live.deadline.tracker.emitted == ["late"]
    assert not live.progressed
