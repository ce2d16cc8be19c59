"""The live forecast of a flow run as a pure state machine (no Prefect, no store, no thread).

A :class:`LiveForecast` is told when stages open and close (flow thread) and when the
history is read, at each boundary and interval (the jobs of
:class:`~prefect_dask_profiling.run.live_eta.LiveEta`); it estimates and hands its news
(progress, log lines, ``at-risk``/``on-track``/``late``) to an :class:`EtaSink`, the run's
:class:`~prefect_dask_profiling.prefect.publish.Publisher`. A sink that raises is logged at
debug level and never keeps the other news from it (docs/eta.md)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from prefect_dask_profiling._util import json_clean
from prefect_dask_profiling.forecast.live_store import LiveEstimate, estimate_doc
from prefect_dask_profiling.forecast.model import (
    Eta,
    HistoryStats,
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

if TYPE_CHECKING:
    from collections.abc import Mapping
    from concurrent.futures import Future

logger = logging.getLogger("prefect_dask_profiling")

AT_RISK_EVENT = "dask-profiling.run.at-risk"
ON_TRACK_EVENT = "dask-profiling.run.on-track"
LATE_EVENT = "dask-profiling.run.late"
EVENTS = {"at-risk": AT_RISK_EVENT, "on-track": ON_TRACK_EVENT, "late": LATE_EVENT}
# A run at risk is back on track once its ETA said so for this long (and 3 intervals):
# inside a stage the ETA is a sawtooth, which would flap the events (RiskTracker).
RECOVERY_HOLD_S = 60.0
_ETA_EVENT_NAMESPACE = uuid.UUID("5d0f3a8e-7b21-4c6e-9a43-2f81c7e0b9d4")

#: The tasks finished per stage and prefix (the plugin's counts).
Counts = dict[str, dict[str, int]]


class StageBehind(TypedDict):
    """The stage an ETA event blames: how far behind its usual pace, its expected and
    projected seconds, and its bottleneck in the newest baseline night that diagnosed it."""

    stage: str
    behind_pct: float
    expected_s: float
    projected_s: float
    bottleneck: str | None


class Judged(TypedDict):
    """What an ETA event was judged on, and when (ISO text, UTC).

    ``on`` is ``"clock"`` for ``late`` (the deadline passed with the run unfinished: no
    estimate needed, ``finish`` is ``None``), or ``"finish_high"`` for ``at-risk`` and
    ``on-track``: the upper end of the estimate (``finish``) against the deadline minus the
    margin, the estimate being the event's ``eta``.
    """

    at: str
    on: str
    finish: str | None


class EtaPayload(TypedDict):
    """The payload of an ETA event (:meth:`LiveForecast.payload`): its ``kind`` (at-risk,
    on-track, late), the run, the estimate (``known`` false, with why, when there is none),
    the deadline (ISO text) and its margin, what it was ``judged`` on, and the stage behind
    (``None`` when none is)."""

    kind: str
    run_id: str
    pipeline: str
    version: str
    eta: dict[str, Any]  # Eta.to_json
    deadline: str | None
    deadline_margin_s: float
    judged: Judged
    stage_behind: StageBehind | None


def event_id(flow_run_id: str, kind: str, occurrence: int = 1) -> uuid.UUID:
    """The stable id of the ``occurrence``-th ``kind`` event of a flow run."""
    return uuid.uuid5(_ETA_EVENT_NAMESPACE, f"{flow_run_id}/{kind}/{occurrence}")


@dataclass(frozen=True)
class RiskNews:
    """A change of the run's standing against its deadline, to be told (an event)."""

    #: ``at-risk``, ``on-track`` or ``late``.
    kind: str
    #: Its event's name (:data:`EVENTS`).
    event: str
    #: Its event's stable id (:func:`event_id`): a retried emission adds nothing.
    id: uuid.UUID
    #: Its event's payload.
    payload: EtaPayload
    #: The stage behind, if any (a related resource of the event).
    stage: str | None
    #: The line for the run's log.
    line: str


class EtaSink(Protocol):
    """Where a :class:`LiveForecast` hands its news (the run's
    :class:`~prefect_dask_profiling.prefect.publish.Publisher`). Each call may raise: the
    forecast goes on."""

    def progress(self, percent: float, text: str) -> None:
        """The run's progress moved: ``percent`` of the expected work done (never less than
        before), ``text`` the ETA line."""

    def risk(self, news: RiskNews) -> None:
        """The run's standing against its deadline changed (at-risk, on-track, late)."""

    def say(self, level: int, message: str) -> None:
        """A line for the run's log (a boundary's estimate, a note)."""


class RunClock:
    """Where the run is: written by the flow thread (under :attr:`lock`), read by the jobs."""

    #: Seconds of each stage's closed windows, by name.
    completed: dict[str, float]
    #: Windows opened, by stage name.
    windows: dict[str, int]
    #: The stage open now, if any.
    current: str | None = None
    #: When it opened (monotonic seconds).
    opened_at: float = 0.0
    #: When the last stage window closed (monotonic seconds; ``None``: none has).
    closed_at: float | None = None
    #: Guards the fields above.
    lock: threading.Lock

    def __init__(self) -> None:
        self.completed, self.windows, self.lock = {}, {}, threading.Lock()

    def opened(self, name: str) -> None:
        with self.lock:
            self.current, self.opened_at = name, time.monotonic()
            self.windows[name] = self.windows.get(name, 0) + 1

    def closed(self, name: str) -> None:
        with self.lock:
            spent = time.monotonic() - self.opened_at if self.current == name else 0.0
            self.completed[name] = self.completed.get(name, 0.0) + spent
            self.current, self.closed_at = None, time.monotonic()

    def progress(self, started: datetime, done: Counts | None) -> RunProgress:
        """The run's progress now (``started``: its start; ``done``: its task counts)."""
        now = datetime.now(UTC)
        with self.lock:
            mono = time.monotonic()
            current_s = mono - self.opened_at if self.current else 0.0
            since = mono - self.closed_at if self.closed_at is not None and \
                self.current is None else None
            completed = dict(self.completed)  # closed windows (the current's earlier ones)
            windows, current = dict(self.windows), self.current
        elapsed = (now - started).total_seconds()
        return RunProgress(now=now, elapsed_s=max(elapsed, 0.0), completed=completed,
                           windows=windows, current=current, current_s=current_s,
                           done=done, since_stage_s=since)


class DeadlineWatch:
    """The run's deadline and its standing against it (:class:`RiskTracker`): ``late`` on
    the clock alone, ``at-risk`` and ``on-track`` on an estimate's upper end."""

    #: The ``deadline=`` option, parsed (``None``: no deadline).
    deadline: Any
    #: How long before the deadline an estimate must end to be on track (seconds).
    margin_s: float
    #: The deadline as an instant, resolved when the live ETA starts (:meth:`resolve`).
    at: datetime | None = None
    #: The current risk and the kinds emitted, in order (recoveries held).
    tracker: RiskTracker

    def __init__(self, deadline: object, margin: object, interval_s: float) -> None:
        self.deadline = parse_deadline(deadline)
        self.margin_s = check_margin(margin)
        self.tracker = RiskTracker(hold_s=max(RECOVERY_HOLD_S, 3 * interval_s))

    @property
    def zone(self):
        """The deadline's time zone (UTC without one): the zone ETA lines are shown in."""
        return self.deadline.tz if self.deadline is not None else UTC

    def resolve(self, started: datetime, scheduled: datetime | None) -> str | None:
        """Set :attr:`at` from the run's start and its ``scheduled`` start (``None``: none);
        the note when something else than asked was used. The clock decides ``late``, so the
        deadline never waits for the history, nor depends on its read succeeding."""
        if self.deadline is None or self.at is not None:
            return None
        self.at, note = resolve_deadline(self.deadline, started, scheduled)
        return note

    def judge(self, eta: Eta | None, now: datetime) -> str | None:
        """The kind that is news at ``now`` (``None``: nothing new, or no deadline)."""
        if self.at is None:
            return None
        return self.tracker.update(risk(eta, self.at, self.margin_s, now), now)

    def lines(self) -> list[str]:
        """The deadline and the ETA events emitted, for the run's markdown (none without
        a deadline)."""
        if self.at is None:
            return []
        emitted = ", ".join(f"`{EVENTS[k]}`" for k in self.tracker.emitted) or "none"
        local = self.at.astimezone(self.zone)
        return [f"- deadline: {local:%Y-%m-%d %H:%M %Z} ({self.deadline}); "
                f"ETA events: {emitted}"]


class LiveForecast:
    """The live forecast of one flow run (see the module docstring).

    Parameters
    ----------
    ctx
        The run's identity (a :class:`~prefect_dask_profiling.store.manifest.RunContext`:
        pipeline, version, run id, flow run id, start).
    sink
        Where its news goes (:class:`EtaSink`).
    interval, deadline, margin, needed
        The ``eta_interval``, ``deadline`` and ``deadline_margin`` options, and the earlier
        runs an estimate needs (the rule's ``min_history``).
    """

    #: The run's identity.
    ctx: Any
    #: Where its news goes.
    sink: EtaSink
    #: Seconds between two periodic estimates.
    interval: float
    #: Earlier runs of the version an estimate needs.
    needed: int
    #: The deadline and the run's standing against it.
    deadline: DeadlineWatch
    #: Where the run is (stages open and closed).
    clock: RunClock
    #: The history's figures (``None``: not read yet, or its read failed).
    stats: HistoryStats | None = None
    #: The history's manifests (the stages' bottlenecks).
    manifests: tuple[Mapping[str, Any], ...] = ()
    #: The history being read (``None``: not started).
    history: Future | None = None
    #: The last estimate.
    eta: Eta | None = None
    #: The progress it was made from (``None``: none made).
    made_at: RunProgress | None = None
    #: The first known ETA's line (the run's markdown).
    first_text: str | None = None
    #: (elapsed seconds, predicted total seconds) of each known estimate.
    predictions: list[tuple[float, float]]
    #: The boundary lines (the run's markdown shows the last).
    log: list[str]
    #: The last task counts read (``None``: none yet).
    counts: Counts | None = None
    #: The progress told last (percent; never goes back).
    percent: float = 0.0
    #: Whether the sink took a progress (then the end moves it to 100).
    progressed: bool = False
    #: Whether "no ETA" was said (once).
    said_no_eta: bool = False
    #: Seconds from the start to the run's end (``None``: running).
    ended_s: float | None = None

    def __init__(self, ctx: Any, sink: EtaSink, *, interval: object, deadline: object = None,
                 margin: object = 0.0, needed: int = 3) -> None:
        self.ctx, self.sink, self.needed = ctx, sink, needed
        self.interval = check_eta_interval(interval)
        self.deadline = DeadlineWatch(deadline, margin, self.interval)
        self.clock = RunClock()
        self.predictions, self.log = [], []

    # -- told by the run -------------------------------------------------------------------

    def resolve_deadline(self, scheduled: datetime | None) -> None:
        """Resolve the deadline from the run's start and its ``scheduled`` start."""
        note = self.deadline.resolve(self.ctx.started, scheduled)
        if note:
            self.sink.say(logging.WARNING, f"dask-profiling: {note}")

    def load(self, history: Any) -> None:
        """The run's history is read: estimate from it (with the last counts)."""
        self.manifests = tuple(history.manifests)
        self.stats = self._stats(history)
        self.update()

    def _stats(self, history: Any) -> HistoryStats:
        ctx = self.ctx
        return history_stats(ctx.pipeline, ctx.version, history.manifests,
                             history.baseline.history, needed=self.needed)

    def boundary(self, name: str, counts: Counts | None = None) -> None:
        """Stage ``name`` closed: estimate (from ``counts``, its close's, when given) and
        say the boundary's line."""
        eta = self.update(counts)
        if eta is None or self.stats is None:
            return
        line = boundary_text(name, self.clock.completed.get(name, 0.0), self.stats, eta,
                             datetime.now(UTC), self.deadline.zone)
        self.log.append(line)
        self.sink.say(logging.INFO, f"dask-profiling: {line}")

    def update(self, counts: Counts | None = None, now: datetime | None = None
               ) -> Eta | None:
        """Estimate now (from ``counts`` when given, else from the last); tell the progress
        and the deadline's news (judged at ``now``, default the current time). Without the
        history (not read yet, or its read failed) there is no estimate, and the deadline
        is still judged."""
        if self.stats is None:
            quietly(self.judge_deadline, None, now)
            return None
        if counts is not None:  # jobs run in order: a later tick's read replaces them
            self.counts = counts
        progress = self.made_at = self.progress_now()
        eta = self.eta = estimate(self.stats, progress, self.deadline.zone)
        if not eta.known:
            if not self.said_no_eta:
                self.said_no_eta = True
                quietly(self.sink.say, logging.INFO, f"dask-profiling: {eta.text}")
            quietly(self.judge_deadline, eta, now)  # late needs no estimate
            return eta
        if self.first_text is None:
            self.first_text = eta.text
        self.predictions.append((progress.elapsed_s, progress.elapsed_s + eta.remaining_s))
        # each on its own: a failing Prefect API never hides the deadline's news
        quietly(self.tell_progress, eta.percent_done or 0.0, eta.text)
        quietly(self.judge_deadline, eta, now)
        return eta

    def end(self) -> None:
        """The run is over (the flow thread): its time is kept for the markdown."""
        if self.ended_s is None:
            self.ended_s = (datetime.now(UTC) - self.ctx.started).total_seconds()

    def finished(self) -> None:
        """The run finished: its progress goes to 100 (when one was told)."""
        if self.progressed:
            self.tell_progress(100.0, "finished")

    def progress_now(self) -> RunProgress:
        return self.clock.progress(self.ctx.started, self.counts)

    def tell_progress(self, percent: float, text: str) -> None:
        """Tell the progress (never backwards)."""
        self.percent = max(self.percent, min(percent, 100.0))
        self.sink.progress(self.percent, text)
        self.progressed = True

    # -- the deadline ------------------------------------------------------------------------

    def judge_deadline(self, eta: Eta | None, now: datetime | None = None) -> str | None:
        """Judge the run against its deadline at ``now`` (default the current time) and
        tell what is news; the kind told, if any. ``late`` needs no estimate (``eta``
        ``None``: the history is not read, or its read failed); ``at-risk`` and
        ``on-track`` need a known one."""
        now = now or datetime.now(UTC)
        kind = self.deadline.judge(eta, now)
        if kind is not None:
            eta = eta or self.no_estimate()
            line = (f"dask-profiling: run {kind} (deadline {self.deadline.at:%Y-%m-%d %H:%M} "
                    f"UTC): {eta.text}")
            self.sink.risk(RiskNews(
                kind, EVENTS[kind], event_id(str(self.ctx.flow_run_id), kind,
                                             self.deadline.tracker.emitted.count(kind)),
                self.payload(kind, eta, now), eta.lag.stage if eta.lag else None, line))
        return kind

    def no_estimate(self) -> Eta:
        """The estimate an event carries when there is none: why (the history's read is
        under way, or failed)."""
        future = self.history
        failed = future is not None and future.done() and future.exception() is not None
        why = "its read failed (the judge says why at the run's end)" if failed else \
            "it is not read yet"
        return Eta(False, f"no ETA: the run's history is needed and {why}")

    def payload(self, kind: str, eta: Eta, now: datetime | None = None) -> EtaPayload:
        """The event's payload: the ETA range, the deadline, what the event was judged on
        at ``now`` (default the current time), the stage behind."""
        ctx, lag = self.ctx, eta.lag
        behind: StageBehind | None = None if lag is None else {
            "stage": lag.stage, "behind_pct": round(lag.behind_pct, 1),
            "expected_s": round(lag.expected_s, 1), "projected_s": round(lag.projected_s, 1),
            "bottleneck": self._bottleneck(lag.stage)}
        on_clock = kind == "late"
        judged: Judged = {
            "at": (now or datetime.now(UTC)).astimezone(UTC).isoformat(),
            "on": "clock" if on_clock else "finish_high",
            "finish": None if on_clock or eta.finish_high is None else
            eta.finish_high.isoformat()}
        at = self.deadline.at
        return json_clean({
            "kind": kind, "run_id": ctx.run_id, "pipeline": ctx.pipeline,
            "version": ctx.version, "eta": eta.to_json(),
            "deadline": at.isoformat() if at else None,
            "deadline_margin_s": self.deadline.margin_s, "judged": judged,
            "stage_behind": behind})

    def _bottleneck(self, stage: str) -> str | None:
        """The stage's bottleneck in the newest baseline night that diagnosed it (tonight's
        is diagnosed only when the run ends)."""
        for manifest in reversed(self.manifests):
            for entry in manifest.get("stages") or []:
                diagnosis = entry.get("diagnosis") if isinstance(entry, dict) else None
                if entry.get("name") == stage and isinstance(diagnosis, dict):
                    return diagnosis.get("primary")
        return None

    # -- what is kept of it --------------------------------------------------------------------

    def live_estimate(self, eta: Eta, progress: RunProgress) -> LiveEstimate:
        """The estimate as stored for ``dask-profiling eta`` (:class:`~prefect_dask_profiling.
        forecast.live_store.LiveEstimate`)."""
        ctx, at = self.ctx, self.deadline.at
        fraction = None if eta.percent_done is None else round(eta.percent_done / 100.0, 4)
        return estimate_doc(
            pipeline=ctx.pipeline, version=str(ctx.version), run_id=ctx.run_id,
            flow_run_id=str(ctx.flow_run_id) if ctx.flow_run_id else None,
            started=ctx.started.isoformat() if ctx.started else None,
            computed_at=progress.now.astimezone(UTC).isoformat(), interval_s=self.interval,
            stage=progress.current, stages_done=sorted(progress.completed),
            known=eta.known, done_fraction=fraction,
            remaining_p50_s=_rounded(eta.remaining_low_s),
            remaining_p90_s=_rounded(eta.remaining_high_s),
            finish_p50=eta.finish_low.isoformat() if eta.finish_low else None,
            finish_p90=eta.finish_high.isoformat() if eta.finish_high else None,
            deadline=at.isoformat() if at else None,
            risk=self.deadline.tracker.state if at else None,
            unknown=[{"stage": s, "reason": r} for s, r in eta.unknown], text=eta.text)

    def markdown_lines(self, actual_s: float | None = None) -> list[str]:
        """The run's markdown artifact lines: the ETA at the run's start, the deadline and
        what was emitted, and how the estimate fared: the prediction made by 25 / 50 / 75 %
        of the run against the actual finish (``actual_s``: the run's wall time; default
        its time when it ended).

        Safe to call from the flow thread at the end: it tells nothing.
        """
        if self.eta is None:
            self._settle()
        deadline = self.deadline.lines()
        if self.eta is None:  # no history: the deadline was still judged
            return deadline
        if not self.eta.known:
            return [f"- **ETA**: {self.eta.text}", *deadline]
        if not self.predictions:
            return ["- **ETA**: no estimate was made while the run computed (its history "
                    "was read too late)", *deadline]
        total = actual_s if actual_s is not None else self.ended_s
        if total is None:
            total = (datetime.now(UTC) - self.ctx.started).total_seconds()
        lines = [f"- **ETA** at the start: {self.first_text or self.eta.text}", *deadline]
        fared = []
        for share in (0.25, 0.5, 0.75):
            before = [p for p in list(self.predictions) if p[0] <= share * total]
            if before and total > 0:
                _, predicted = before[-1]
                fared.append(f"at {share:.0%}: {100 * (predicted - total) / total:+.1f} %")
        if fared:
            lines.append("- how the ETA fared (predicted finish minus actual, in % of the "
                         f"run's {total:.0f} s): " + ", ".join(fared))
        return lines

    def _settle(self) -> None:
        """The history is read but the job estimating from it has not run yet (it is queued
        behind others): estimate here, telling nothing, so the run's markdown says what is
        known (e.g. "no ETA yet: needs 3 earlier runs")."""
        future = self.history
        if future is None or not future.done() or future.exception() is not None:
            return
        try:
            if self.stats is None:
                self.stats = self._stats(future.result())
            self.eta = estimate(self.stats, self.progress_now(), self.deadline.zone)
        except Exception:
            logger.debug("dask-profiling: no ETA for the run's markdown", exc_info=True)


def quietly(job: Any, *args: Any) -> Any:
    """``job(*args)``; a failure (API, store, scheduler) is a debug log, never the flow's:
    how the live ETA runs each of its parts."""
    try:
        return job(*args)
    except Exception:
        logger.debug("dask-profiling: ETA job failed", exc_info=True)
        return None


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


__all__ = ["AT_RISK_EVENT", "EVENTS", "LATE_EVENT", "ON_TRACK_EVENT", "Counts",
           "DeadlineWatch", "EtaPayload", "EtaSink", "Judged", "LiveForecast", "RiskNews",
           "RunClock", "StageBehind", "event_id", "quietly"]
