"""The live ETA of a flow run: kept current off the flow's critical path, published to Prefect.

The :class:`~prefect_dask_profiling.prefect.session.Session` tells a :class:`LiveEta` when
the run's history is being read and when stages open and close (a few dictionary updates in
the flow thread); everything else runs as jobs of the process's one background service
(:class:`~prefect_dask_profiling.run.background.Background`):

* at the run's start (once the history the judge reads early is there), at every stage
  boundary and every ``eta_interval`` seconds:
  :func:`~prefect_dask_profiling.forecast.model.estimate` from the plugin's task counts — at
  a boundary those of the snapshot the stage's close already read
  (:func:`~prefect_dask_profiling.timing.client.counts_of`), otherwise one small read
  (:func:`~prefect_dask_profiling.timing.client.task_counts`);
* a Prefect progress artifact on the flow run (percent of the expected work done, never
  going back, 100 at the end), its description the ETA line;
* one flow-run log line per stage boundary;
* the current estimate in the run store (``live/<pipeline>/<run_id>.json``:
  :mod:`~prefect_dask_profiling.forecast.live_store`), replaced at each estimate and removed
  when the run ends, for ``dask-profiling eta``; never spooled, bounded by the store's timeout (at
  most :data:`LIVE_TIMEOUT_S`) and its breaker; at the start, the leftover estimates of the
  pipeline's earlier runs that died without ending are swept
  (:meth:`~prefect_dask_profiling.store.live.Live.sweep_live`);
* with a ``deadline=``: the events ``dask-profiling.run.at-risk``, ``...on-track`` (a run at
  risk recovered) and ``...late`` (the deadline passed, run unfinished: emitted by the
  periodic job even while a stage computes), each with a stable id per (flow run, kind,
  occurrence) so a retried emission adds nothing. The deadline is resolved when the live
  ETA starts, from the clock and the flow run's schedule alone, and ``late`` is judged on
  the clock alone: it fires without an estimate (a new version's first nights), before the
  history is read and when its read failed. ``at-risk`` and ``on-track`` need an estimate
  and name the one they were judged on (:class:`Judged`).

A failing Prefect API, store or scheduler read never fails or slows the flow: each job
catches and logs at debug level, and keeps the last good estimate.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict

from prefect_dask_profiling._util import json_clean
from prefect_dask_profiling.forecast.model import (
    Eta,
    EtaDoc,
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
    from concurrent.futures import Future

    from prefect_dask_profiling.forecast.live_store import LiveEstimate
    from prefect_dask_profiling.run.background import Periodic

logger = logging.getLogger("prefect_dask_profiling")

AT_RISK_EVENT = "dask-profiling.run.at-risk"
ON_TRACK_EVENT = "dask-profiling.run.on-track"
LATE_EVENT = "dask-profiling.run.late"
EVENTS = {"at-risk": AT_RISK_EVENT, "on-track": ON_TRACK_EVENT, "late": LATE_EVENT}
# A run at risk is back on track once its ETA said so for this long (and 3 intervals):
# inside a stage the ETA is a sawtooth, which would flap the events (RiskTracker).
RECOVERY_HOLD_S = 60.0
# The longest one write of the stored estimate may take (the store's timeout, if shorter):
# an estimate older than this is stale anyway, and the background service has other work.
LIVE_TIMEOUT_S = 5.0
_ETA_EVENT_NAMESPACE = uuid.UUID("5d0f3a8e-7b21-4c6e-9a43-2f81c7e0b9d4")


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
    """The payload of an ETA event (:meth:`LiveEta.payload`): its ``kind`` (at-risk,
    on-track, late), the run, the estimate (``known`` false, with why, when there is none),
    the deadline (ISO text) and its margin, what it was ``judged`` on, and the stage behind
    (``None`` when none is)."""

    kind: str
    run_id: str
    pipeline: str
    version: str
    eta: EtaDoc
    deadline: str | None
    deadline_margin_s: float
    judged: Judged
    stage_behind: StageBehind | None


def event_id(flow_run_id: str, kind: str, occurrence: int = 1) -> uuid.UUID:
    """The stable id of the ``occurrence``-th ``kind`` event of a flow run."""
    return uuid.uuid5(_ETA_EVENT_NAMESPACE, f"{flow_run_id}/{kind}/{occurrence}")


@dataclass
class _Clock:
    """Where the run is, kept by the flow thread (under the lock)."""

    completed: dict[str, float]
    windows: dict[str, int]
    current: str | None = None
    opened_at: float = 0.0  # monotonic
    closed_at: float | None = None  # monotonic, the last stage window's end


class LiveEta:
    """The ETA of one flow run (see the module docstring).

    Parameters
    ----------
    session
        The run's session (its client, plugin name, run context, options).
    """

    def __init__(self, session: Any) -> None:
        options = session.options
        self.session = session
        self.interval = check_eta_interval(options.eta_interval)
        self.margin_s = check_margin(options.deadline_margin)
        self.deadline = parse_deadline(options.deadline)
        self.needed = options.rules.regression.min_history
        self.stats: HistoryStats | None = None
        self.eta: Eta | None = None
        self.deadline_at: datetime | None = None
        self.tracker = RiskTracker(hold_s=max(RECOVERY_HOLD_S, 3 * self.interval))
        self.events: list[Any] = []
        self.log: list[str] = []  # the boundary lines (the run's markdown shows the last)
        self.predictions: list[tuple[float, float]] = []  # (elapsed_s, predicted total_s)
        self._artifact_id: Any = None
        self._percent = 0.0
        self._counts: dict[str, dict[str, int]] | None = None
        self._manifests: tuple[Any, ...] = ()
        self._clock = _Clock(completed={}, windows={})
        self._lock = threading.Lock()
        self._context: contextvars.Context | None = None
        self._periodic: Periodic | None = None
        self._stopped = False
        self._said_no_eta = False
        self._ended_s: float | None = None  # seconds from the start to stop()
        self._history_future: Future | None = None
        self.first_text: str | None = None  # the first known ETA (the run's markdown)
        self._live_store: Any = None  # (url, RunStore) the stored estimate is written to
        self._live_written: Any = None  # the RunStore holding it (removed at the end)
        self._live_over = False  # removed: write no more

    # -- told by the session (flow thread) ---------------------------------------------------

    def start(self, history: Future | None) -> None:
        """The run's history is being read (``history``: its future): estimate once it is
        there, then every ``eta_interval``."""
        from prefect_dask_profiling.run.background import Background

        if self._periodic is not None or self._stopped:
            return
        self._context = contextvars.copy_context()  # the flow run's: artifacts attach to it
        _quietly(lambda: self._resolve_deadline(_scheduled_start()))  # needs no history
        service = Background.instance()
        self._periodic = service.every(self.interval, self._tick, label="dask-profiling eta")
        self._history_future = history
        self._in_run(self._sweep_leftovers)
        if history is not None:
            history.add_done_callback(lambda f: self._in_run(self._load, f))

    def stage_opened(self, name: str) -> None:
        with self._lock:
            self._clock.current = name
            self._clock.opened_at = time.monotonic()
            self._clock.windows[name] = self._clock.windows.get(name, 0) + 1

    def stage_closed(self, name: str, counts: dict[str, dict[str, int]] | None = None) -> None:
        """Stage ``name`` closed; ``counts``: the tasks finished per stage and prefix as its
        close read them (None: the boundary's estimate reads them itself)."""
        with self._lock:
            clock = self._clock
            spent = time.monotonic() - clock.opened_at if clock.current == name else 0.0
            clock.completed[name] = clock.completed.get(name, 0.0) + spent
            clock.current = None
            clock.closed_at = time.monotonic()
        if self._periodic is not None:
            self._in_run(self._boundary, name, counts)

    def stop(self, finished: bool = True) -> None:
        """The run is over: no more ticks; the progress artifact goes to 100 (queued)."""
        if self._stopped:
            return
        self._stopped = True
        self._ended_s = (datetime.now(UTC) - self.session.ctx.started).total_seconds()
        if self._periodic is not None:
            self._periodic.cancel()
            self._in_run(self._remove_live)
        if finished and self._artifact_id is not None:
            self._in_run(self._progress, 100.0, "finished")

    # -- background jobs ---------------------------------------------------------------------

    def _in_run(self, job: Any, *args: Any) -> None:
        """Queue ``job`` on the background service inside the flow run's context."""
        from prefect_dask_profiling.run.background import Background

        context = self._context.copy() if self._context is not None else \
            contextvars.copy_context()
        context.run(Background.instance().submit, _quietly, job, *args,
                    label="dask-profiling eta")

    def _resolve_deadline(self, scheduled: datetime | None) -> None:
        """Set :attr:`deadline_at` from the run's start and its ``scheduled`` start (the
        flow run's ``expected_start_time``; ``None``: none): the clock decides ``late``, so
        the deadline never waits for the history, nor depends on its read succeeding."""
        if self.deadline is None or self.deadline_at is not None:
            return
        self.deadline_at, note = resolve_deadline(self.deadline, self.session.ctx.started,
                                                  scheduled)
        if note:
            _run_log(logging.WARNING, f"dask-profiling: {note}")

    def _load(self, future: Future) -> None:
        history = future.result()  # a failed read: no ETA (the judge says why at the end)
        ctx = self.session.ctx
        self._manifests = tuple(history.manifests)
        self.stats = history_stats(ctx.pipeline, ctx.version, history.manifests,
                                   history.baseline.history, needed=self.needed)
        self._update(read_counts=False)

    def _tick(self, now: datetime | None = None) -> None:
        """The periodic update (``now``: the clock the deadline is judged on, default the
        current time)."""
        if self._stopped:
            return
        _quietly(self._update, True, None, now)

    def _boundary(self, name: str, counts: dict[str, dict[str, int]] | None = None) -> None:
        eta = self._update(counts=counts)
        if eta is None or self.stats is None:
            return
        line = boundary_text(name, self._clock.completed.get(name, 0.0), self.stats, eta,
                             datetime.now(UTC), self._zone())
        self.log.append(line)
        _run_log(logging.INFO, f"dask-profiling: {line}")

    def _update(self, read_counts: bool = True,
                counts: dict[str, dict[str, int]] | None = None,
                now: datetime | None = None) -> Eta | None:
        """Estimate now (from ``counts`` when given, else from a fresh read when
        ``read_counts``, else from the last counts); publish the progress and the deadline's
        news (judged at ``now``, default the current time). Without the history (not read
        yet, or its read failed) there is no estimate, and the deadline is still judged."""
        if self.stats is None:
            _quietly(self._judge_deadline, None, now)
            return None
        if counts is not None:  # jobs run in order: a later tick's read replaces them
            self._counts = counts
        elif read_counts:
            self._read_counts()
        progress = self._progress_now()
        eta = estimate(self.stats, progress, self._zone())
        self.eta = eta
        if not eta.known:
            if not self._said_no_eta:
                self._said_no_eta = True
                _run_log(logging.INFO, f"dask-profiling: {eta.text}")
            _quietly(self._judge_deadline, eta, now)  # late needs no estimate
            _quietly(self._store_live, eta, progress)
            return eta
        if self.first_text is None:
            self.first_text = eta.text
        self.predictions.append((progress.elapsed_s, progress.elapsed_s + eta.remaining_s))
        # each publication on its own: a failing Prefect API neither hides the stored
        # estimate nor the deadline's events, a failing store neither of the others
        _quietly(self._progress, eta.percent_done or 0.0, eta.text)
        _quietly(self._judge_deadline, eta, now)
        _quietly(self._store_live, eta, progress)
        return eta

    # -- the stored estimate (``dask-profiling eta``) ---------------------------------------

    def live_estimate(self, eta: Eta, progress: RunProgress) -> LiveEstimate:
        """The estimate as stored for ``dask-profiling eta`` (:class:`~prefect_dask_profiling.
        forecast.live_store.LiveEstimate`)."""
        from prefect_dask_profiling.forecast.live_store import estimate_doc

        ctx = self.session.ctx
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
            deadline=self.deadline_at.isoformat() if self.deadline_at else None,
            risk=self.tracker.state if self.deadline_at else None,
            unknown=[{"stage": s, "reason": r} for s, r in eta.unknown], text=eta.text)

    def _store_live(self, eta: Eta, progress: RunProgress) -> None:
        """Replace the run's stored estimate (a background job; a failure is the caller's
        debug log, and the next estimate tries again)."""
        if self._live_over or not self.session.ctx.pipeline:
            return
        store = self._store_for_live()
        store.write_live(self.live_estimate(eta, progress))
        self._live_written = store

    def _store_for_live(self) -> Any:
        """The store of the run (its URL may change until the run ends: ``use_store``),
        with a write timeout of at most :data:`LIVE_TIMEOUT_S`."""
        from prefect_dask_profiling.store.runs import RunStore

        options = self.session.options
        if self._live_store is None or self._live_store[0] != options.store:
            timeout = min(float(options.store_timeout), LIVE_TIMEOUT_S)
            self._live_store = (options.store, RunStore(options.store, options.storage_options,
                                                        timeout=timeout))
        return self._live_store[1]

    def _sweep_leftovers(self) -> None:
        """Remove the leftover estimates of the pipeline's earlier runs (a background job:
        a failure is the caller's debug log, and the next run or ``dask-profiling sweep``
        tries again)."""
        ctx = self.session.ctx
        if not ctx.pipeline:
            return
        removed = self._store_for_live().sweep_live(ctx.pipeline, keep=ctx.run_id)
        if removed:
            logger.info("dask-profiling: removed %d leftover live estimate(s) of runs that "
                        "stopped without ending: %s", len(removed), ", ".join(removed))

    def _remove_live(self) -> None:
        """The run ended: remove its stored estimate (a reader ignores a leftover once the
        run's manifest exists)."""
        self._live_over = True
        store, self._live_written = self._live_written, None
        if store is not None:
            ctx = self.session.ctx
            store.remove_live(ctx.pipeline, ctx.run_id)

    def _read_counts(self) -> None:
        from prefect_dask_profiling.timing import client as timing_client

        try:
            self._counts = timing_client.task_counts(self.session.client, self.session.plugin_name)
        except Exception:  # the scheduler is busy or gone: time only, last counts kept
            logger.debug("dask-profiling: task counts not read for the ETA", exc_info=True)

    def _progress_now(self) -> RunProgress:
        now = datetime.now(UTC)
        with self._lock:
            clock = self._clock
            mono = time.monotonic()
            current_s = mono - clock.opened_at if clock.current else 0.0
            since = mono - clock.closed_at if clock.closed_at is not None and \
                clock.current is None else None
            completed = dict(clock.completed)  # closed windows (the current's earlier ones)
            windows = dict(clock.windows)
            current = clock.current
        elapsed = (now - self.session.ctx.started).total_seconds()
        return RunProgress(now=now, elapsed_s=max(elapsed, 0.0), completed=completed,
                           windows=windows, current=current, current_s=current_s,
                           done=self._counts, since_stage_s=since)

    def _zone(self):
        return self.deadline.tz if self.deadline is not None else UTC

    def _progress(self, percent: float, text: str) -> None:
        """Create or move the progress artifact (never backwards)."""
        from prefect_dask_profiling.prefect.publish import Publisher

        self._percent = max(self._percent, min(percent, 100.0))
        self._artifact_id = Publisher.progress(
            self._artifact_id, f"dask-profiling-eta-{_key(self.session.ctx.pipeline)}",
            self._percent, text)

    def _judge_deadline(self, eta: Eta | None, now: datetime | None = None) -> str | None:
        """Judge the run against its deadline at ``now`` (default the current time) and
        emit what is news; the kind emitted, if any. ``late`` needs no estimate (``eta``
        ``None``: the history is not read, or its read failed); ``at-risk`` and
        ``on-track`` need a known one."""
        if self.deadline_at is None:
            return None
        now = now or datetime.now(UTC)
        kind = self.tracker.update(risk(eta, self.deadline_at, self.margin_s, now), now)
        if kind is not None:
            self._emit(kind, eta or self._no_estimate(), now)
        return kind

    def _no_estimate(self) -> Eta:
        """The estimate an event carries when there is none: why (the history's read is
        under way, or failed)."""
        future = self._history_future
        failed = future is not None and future.done() and future.exception() is not None
        why = "its read failed (the judge says why at the run's end)" if failed else \
            "it is not read yet"
        return Eta(False, f"no ETA: the run's history is needed and {why}")

    def _emit(self, kind: str, eta: Eta, now: datetime | None = None) -> None:
        from prefect.events import emit_event

        ctx = self.session.ctx
        if not ctx.flow_run_id:
            return
        occurrence = self.tracker.emitted.count(kind)
        event = emit_event(EVENTS[kind], resource=_resource(ctx), related=_related(ctx, eta),
                           payload=self.payload(kind, eta, now),
                           id=event_id(ctx.flow_run_id, kind, occurrence))
        if event is not None:
            self.events.append(event)
        _run_log(logging.WARNING if kind != "on-track" else logging.INFO,
                 f"dask-profiling: run {kind} (deadline {self.deadline_at:%Y-%m-%d %H:%M} UTC):"
                 f" {eta.text}")

    def payload(self, kind: str, eta: Eta, now: datetime | None = None) -> EtaPayload:
        """The event's payload: the ETA range, the deadline, what the event was judged on
        at ``now`` (default the current time), the stage behind."""
        ctx = self.session.ctx
        lag = eta.lag
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
        return json_clean({
            "kind": kind, "run_id": ctx.run_id, "pipeline": ctx.pipeline,
            "version": ctx.version, "eta": eta.to_json(),
            "deadline": self.deadline_at.isoformat() if self.deadline_at else None,
            "deadline_margin_s": self.margin_s, "judged": judged, "stage_behind": behind})

    def _bottleneck(self, stage: str) -> str | None:
        """The stage's bottleneck in the newest baseline night that diagnosed it (tonight's
        is diagnosed only when the run ends)."""
        for manifest in reversed(self._manifests):
            for entry in manifest.get("stages") or []:
                diagnosis = entry.get("diagnosis") if isinstance(entry, dict) else None
                if entry.get("name") == stage and isinstance(diagnosis, dict):
                    return diagnosis.get("primary")
        return None

    def markdown_lines(self, actual_s: float | None = None) -> list[str]:
        """The run's markdown artifact lines: the ETA at the run's start, the deadline and
        what was emitted, and how the estimate fared: the prediction made by 25 / 50 / 75 %
        of the run against the actual finish (``actual_s``: the run's wall time; default
        its time when it stopped).

        Safe to call from the flow thread at the end: it publishes nothing.
        """
        if self.eta is None:
            self._settle()
        if self.eta is None:  # no history: the deadline was still judged
            return self._deadline_lines()
        if not self.eta.known:
            return [f"- **ETA**: {self.eta.text}", *self._deadline_lines()]
        if not self.predictions:
            return ["- **ETA**: no estimate was made while the run computed (its history "
                    "was read too late)", *self._deadline_lines()]
        total = actual_s if actual_s is not None else self._ended_s
        if total is None:
            total = (datetime.now(UTC) - self.session.ctx.started).total_seconds()
        lines = [f"- **ETA** at the start: {self.first_text or self.eta.text}",
                 *self._deadline_lines()]
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

    def _deadline_lines(self) -> list[str]:
        """The deadline and the ETA events emitted (none without a deadline)."""
        if self.deadline_at is None:
            return []
        emitted = ", ".join(f"`{EVENTS[k]}`" for k in self.tracker.emitted) or "none"
        local = self.deadline_at.astimezone(self._zone())
        return [f"- deadline: {local:%Y-%m-%d %H:%M %Z} ({self.deadline}); "
                f"ETA events: {emitted}"]

    def _settle(self) -> None:
        """The history is read but the background job estimating from it has not run yet
        (it is queued behind others): estimate here, without publishing, so the run's
        markdown says what is known (e.g. "no ETA yet: needs 3 earlier runs")."""
        future = self._history_future
        if future is None or not future.done() or future.exception() is not None:
            return
        try:
            if self.stats is None:
                history, ctx = future.result(), self.session.ctx
                self.stats = history_stats(ctx.pipeline, ctx.version, history.manifests,
                                           history.baseline.history, needed=self.needed)
            self.eta = estimate(self.stats, self._progress_now(), self._zone())
        except Exception:
            logger.debug("dask-profiling: no ETA for the run's markdown", exc_info=True)


def _quietly(job: Any, *args: Any) -> Any:
    """``job(*args)``; a failure (API, store, scheduler) is a debug log, never the flow's."""
    try:
        return job(*args)
    except Exception:
        logger.debug("dask-profiling: ETA job failed", exc_info=True)
        return None


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def _key(name: str) -> str:
    """An artifact key (lowercase letters, digits, dashes)."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or "run"


def _scheduled_start() -> datetime | None:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    run = getattr(ctx, "flow_run", None)
    at = getattr(run, "expected_start_time", None)
    if at is None:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _resource(ctx: Any) -> dict[str, str]:
    """The flow run as the resource (as the regression events)."""
    resource = {"prefect.resource.id": f"prefect.flow-run.{ctx.flow_run_id}",
                "dask-profiling.pipeline": ctx.pipeline,
                "dask-profiling.version": str(ctx.version),
                "dask-profiling.run-id": ctx.run_id}
    if ctx.flow_run_name:
        resource["prefect.resource.name"] = str(ctx.flow_run_name)
    return resource


def _related(ctx: Any, eta: Eta) -> list[dict[str, str]]:
    """The flow, the pipeline, its version and the stage behind (if any)."""
    related = []
    try:
        from prefect_dask_profiling.prefect.events import _run_identity

        flow_id, flow_name, _ = _run_identity(str(ctx.flow_run_id))
        flow = {"prefect.resource.id": f"prefect.flow.{flow_id}", "prefect.resource.role": "flow"}
        if flow_name:
            flow["prefect.resource.name"] = flow_name
        related.append(flow)
    except Exception:  # the API did not answer: the event still names the run
        logger.debug("dask-profiling: flow of the run not read", exc_info=True)
    related += [{"prefect.resource.id": f"dask-profiling.pipeline.{ctx.pipeline}",
                "prefect.resource.role": "pipeline"},
               {"prefect.resource.id": f"dask-profiling.pipeline.{ctx.pipeline}.version."
                                       f"{ctx.version}",
                "prefect.resource.role": "version"}]
    if eta.lag is not None:
        related.append({"prefect.resource.id": f"dask-profiling.pipeline.{ctx.pipeline}."
                                               f"stage.{eta.lag.stage}",
                        "prefect.resource.role": "stage"})
    if ctx.deployment:
        related.append({"prefect.resource.id": f"prefect.deployment.{ctx.deployment}",
                        "prefect.resource.role": "deployment"})
    return related


def _run_log(level: int, message: str) -> None:
    """To the flow run's logger (in the run's context), else ours."""
    try:
        from prefect.logging import get_run_logger

        get_run_logger().log(level, message)
    except Exception:
        logger.log(level, message)


__all__ = ["AT_RISK_EVENT", "EVENTS", "LATE_EVENT", "LIVE_TIMEOUT_S", "EtaPayload", "Judged",
           "LiveEta", "ON_TRACK_EVENT", "event_id"]
