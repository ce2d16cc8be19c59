"""Per-stage Dask performance reports: window marks, and how they are drawn.

A stage's report covers its window: wall times, the append counter of the run's task
records (so exactly the stage's tasks, whatever the clock offsets) and the system monitor's
sample counter, marked at the stage's entry and exit. The scheduler only copies the window's data
(:mod:`~prefect_dask_profiling.reports.data`) and the flow process draws Dask's
report with Bokeh (:mod:`~prefect_dask_profiling.reports.html`) on its background
service: a few milliseconds of scheduler event loop per report instead of half a second.

There is one renderer, ``"flow"``. The earlier ``"dask"`` renderer drew Dask's own
``Scheduler.performance_report`` on the scheduler (~0.5-0.8 s of event loop per report,
during which it schedules nothing) and bounded it to the window by replacing the
scheduler's ``get_task_stream`` and ``get_profile`` methods: patching someone else's
scheduler for a copy of what the flow renderer draws. The runner refuses it by name
(:func:`~prefect_dask_profiling.options.check_renderer`).

The task stream a report draws is kept by the run's own scheduler plugin
(:class:`~prefect_dask_profiling.timing.tasks.TaskRecords`: the run's finished tasks, the
last ``distributed.scheduler.dashboard.tasks.task-stream-length`` of them, as Dask's
recorder keeps them), not by Dask's ``TaskStreamPlugin``: that one is a second hook on every
transition of every client, and it is the dashboard's, so a run must neither install it
nor take it away. A report drawn after more of the run's tasks than that finished shows the
stage's records still held, never a later stage's, and says it is cut; the records go with
the plugin at the run's end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from distributed.metrics import time

from prefect_dask_profiling.reports import data as report_data

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.store.manifest import RunContext, StageInfo
    from prefect_dask_profiling.store.runs import RunStore

logger = logging.getLogger("prefect_dask_profiling")

#: The longest a presigned link (a report's, the trend page's) stays valid: S3's limit.
MAX_LINK_SECONDS = 7 * 24 * 3600
#: The longest :meth:`StageReports.drain` waits for the reports still being drawn and stored
#: (each render is bounded by its own timeout, each upload by the store's).
DRAIN_TIMEOUT_S = 300.0
LOCAL_WORK_FIX = (
    "prefect-dask's clients are not the default client, so a bare .compute() in the flow "
    "body (also inside `with get_dask_client():`) runs on Dask's local scheduler; send the "
    "work to the cluster with `with get_dask_client() as client: client.compute(x).result()` "
    "(or client.persist(x)), or do it inside a Prefect task")


@dataclass
class ReportWindow:
    """Where a stage's report starts: wall time, monitor count, and the cursor of the task
    records of ``plugin`` (the run's ``TaskTimings``), which keep the last ``stream_limit``."""

    start: float
    last_count: int
    index: int
    stream_limit: int
    plugin: str


@dataclass
class RenderedReport:
    """A stage's rendered report and what it covers.

    ``tasks`` ran in the stage; ``shown`` of them are in the report (fewer when the
    recorder had dropped some before the report was drawn: then ``truncated``).
    """

    html: str
    tasks: int
    truncated: bool
    shown: int = 0
    renderer: str = "flow"


def render_now(mode: bool | str, seconds: float, min_seconds: float,
               raised: bool = False) -> bool:
    """Whether a stage that ran ``seconds`` gets its report at its exit.

    ``mode`` is the runner's ``stage_reports``: ``True`` always, ``False`` never, ``"auto"``
    when the stage ran at least ``min_seconds`` or its block ``raised`` (a shorter stage's
    report waits until the run is judged, and is rendered only if the stage regressed).
    """
    if mode == "auto":
        return raised or seconds >= min_seconds
    return bool(mode)


def open_window(client: Client, plugin: str) -> ReportWindow:
    """Mark the start of a report window on the task records of ``plugin``, the run's
    ``TaskTimings`` (installed with ``task_records=True``; ``RuntimeError`` otherwise)."""
    start = time()
    state = client.run_on_scheduler(report_data.window_state, name=plugin, opening=True)
    return ReportWindow(start=start, last_count=state["count"], index=state["index"],
                        stream_limit=state["limit"], plugin=plugin)


@dataclass(frozen=True)
class WindowEnd:
    """Where a stage's report ends: wall time, task-stream cursor and monitor count."""

    stop: float
    index: int
    count: int | None = None


def close_window(client: Client, window: ReportWindow) -> WindowEnd:
    """Mark the end of ``window`` (one cheap round trip; nothing is rendered)."""
    stop = time()
    state = client.run_on_scheduler(report_data.window_state, name=window.plugin)
    return WindowEnd(stop=stop, index=state["index"], count=state["count"])


def render(client: Client, window: ReportWindow, end: WindowEnd | None = None,
           timeout: float = 120.0, stage: str = "") -> RenderedReport:
    """Render the performance report of ``window``, up to ``end`` (default: now), in this
    process from data copied off the scheduler.

    With ``end`` the report may be rendered later, while other work runs: its task stream
    holds exactly the records between the two cursors and its profiles stop at
    ``end.stop``, so the next stage's tasks do not leak in.
    """
    end = end or close_window(client, window)
    return _render_in_flow(client, window, end, timeout, stage)


def _render_in_flow(client: Client, window: ReportWindow, end: WindowEnd, timeout: float,
                    stage: str) -> RenderedReport:
    from prefect_dask_profiling.reports.html import render_html

    data = report_data.fetch(
        client, plugin=window.plugin, start=window.start, stop=end.stop, first=window.index,
        last=end.index,
        last_count=window.last_count,
        end_count=end.count if end.count is not None else window.last_count,
        limit=window.stream_limit, timeout=timeout)
    stream = data.stream
    return RenderedReport(html=render_html(data, stage), tasks=stream.total,
                          truncated=stream.cut, shown=stream.kept, renderer="flow")


def presign(store: RunStore, location: str, retention_days: int) -> str:
    """A presigned link to a stored file on S3, valid while it is kept; else its location."""
    expires = min(MAX_LINK_SECONDS, retention_days * 86400)
    try:
        return store.presign(location, expires) or location
    except Exception as exc:
        logger.debug("presign failed: %r", exc)
        return location


def local_work_text(info: StageInfo) -> str | None:
    """What a stage ran on local threads and the fix, or None (the warning and the note)."""
    local = info.local_work
    if not local:
        return None
    return (f"stage {info.name!r}: {local['tasks']} Dask tasks ran on local threads of the "
            f"flow process ({local['seconds']:.2f} s in {local['computes']} compute call(s)), "
            f"not on the cluster, so the profile did not record them. {LOCAL_WORK_FIX}")


class ReportStored(Protocol):
    """Told when a stage's report is stored: the run's
    :class:`~prefect_dask_profiling.prefect.publish.Publisher` (it posts the link)."""

    def report_stored(self, info: StageInfo) -> None: ...


@dataclass
class _Deferred:
    """A short stage's window, kept in ``"auto"`` mode: drawn only if the stage regresses."""

    info: StageInfo
    window: ReportWindow
    end: WindowEnd


class StageReports:
    """The per-stage reports of one run, from the stage's opening to its link artifact.

    The session tells it when a stage opens (:meth:`opened`: the report's window starts) and
    closes (:meth:`closed`: the window ends, and the report is drawn and stored by the
    process's one background service, ``submit``, while the flow goes on, its link posted by
    the run's publisher); once the run is judged,
    :meth:`flagged` draws the reports ``"auto"`` mode kept for stages that regressed;
    :meth:`drain` waits, with a bound, for the reports still being drawn (before the run is
    stored, and at the runner's exit).

    A stage opened again is the same stage: its report runs from its first opening to its
    last closing, and its note says which other stages ran in between. A report that cannot
    be drawn or stored leaves a note on its stage (and a warning), never an error.

    Parameters
    ----------
    client
        The run's Dask client.
    plugin
        The name of the run's ``TaskTimings`` plugin, installed with ``task_records=True``:
        its task records are the reports' task stream.
    ctx
        The run's identity (filled in by the session; a report is stored under its pipeline
        and run id).
    warnings
        The run's warnings: the reports add theirs (e.g. a spooled upload).
    store
        The run's store, when a report is stored (the session may switch stores).
    publisher
        The run's :class:`~prefect_dask_profiling.prefect.publish.Publisher`: told when a
        report is stored (it posts the report's link); ``None``: no link is posted.
    submit
        Queues a report's drawing: ``submit(fn, *args, label=...)`` returns its future (the
        session passes the submit of the process's one
        :class:`~prefect_dask_profiling.run.background.Background` service).
    mode
        The runner's ``stage_reports``: ``True`` (a report for every stage), ``False``
        (none) or ``"auto"`` (:func:`render_now`).
    min_seconds
        The runner's ``report_min_seconds``: in ``"auto"`` mode, the shortest stage that
        always gets its report.
    """

    def __init__(self, client: Client, plugin: str, ctx: RunContext, warnings: list[str],
                 store: Callable[[], RunStore], publisher: ReportStored | None = None, *,
                 submit: Callable[..., Future], mode: bool | str = True,
                 min_seconds: float = 0.0) -> None:
        self.publisher = publisher
        self._submit = submit
        self.client = client
        self.plugin = plugin
        self.ctx = ctx
        self.warnings = warnings
        self.mode, self.min_seconds = mode, min_seconds
        self._store = store
        self._first_window: dict[str, ReportWindow] = {}
        self._opened_since: dict[str, set[str]] = {}  # other stages opened since the first
        self._report_notes: dict[str, str | None] = {}
        self._span_notes: dict[str, str | None] = {}
        self._pending: dict[str, Future] = {}  # the report being drawn, per stage
        self._deferred: list[_Deferred] = []  # auto mode: drawn only if the stage regresses

    # -- the stages' windows ------------------------------------------------------------------

    def opened(self, name: str) -> ReportWindow | None:
        """Stage ``name`` opens: the start of its report's window (its first opening's, for
        a stage opened again); ``None`` when no report is made (or its start was not read:
        said in a warning)."""
        for other, since in self._opened_since.items():
            if other != name:
                since.add(name)
        self._opened_since.setdefault(name, set())
        window = self._first_window.get(name)
        if window is None and self.mode:
            try:
                window = open_window(self.client, self.plugin)
            except Exception as exc:
                self.warnings.append(f"stage {name!r}: report not started: {exc!r}")
                return None
            self._first_window[name] = window
        return window

    def end(self, window: ReportWindow | None) -> WindowEnd | BaseException | None:
        """The end of ``window``, read now (the exception when it could not be read)."""
        if window is None:
            return None
        try:
            return close_window(self.client, window)
        except Exception as exc:
            return exc

    def closed(self, info: StageInfo, window: ReportWindow | None,
               end: WindowEnd | BaseException | None, failed: bool = False) -> None:
        """The stage of ``info`` closed at ``end``: draw and store its report in the
        background while the flow goes on.

        In ``"auto"`` mode a stage shorter than ``min_seconds`` whose block did not raise
        (``failed``) keeps only its window marks: :meth:`flagged` draws it if it regressed.
        """
        if window is None or end is None:
            return
        if isinstance(end, BaseException):
            self.note(info, f"report not rendered: {end!r}")
            return
        self._span_notes[info.name] = self._span_note(info)
        self._deferred = [d for d in self._deferred if d.info is not info]  # superseded
        seconds = end.stop - window.start
        if not render_now(self.mode, seconds, self.min_seconds, raised=failed):
            self.note(info, (
                f"no report: the stage ran {seconds:.1f} s, under report_min_seconds="
                f"{self.min_seconds:g} (rendered only if it regresses)"))
            self._deferred.append(_Deferred(info, window, end))
            return
        earlier = self._pending.get(info.name)
        if earlier is not None:
            earlier.cancel()  # an earlier window's report not started yet: this one covers it
        self._pending[info.name] = self._submit(
            self._draw, info, window, end, label=f"stage report {info.name!r}")

    def flagged(self, stages: set[str]) -> list[str]:
        """Draw now the reports ``"auto"`` mode kept for ``stages`` (those that regressed or
        drifted); the warnings of storing them. Their links are posted with the run's
        artifacts (:meth:`~prefect_dask_profiling.prefect.publish.Publisher.unposted`).

        The task stream is read by the recorder's counter, so such a report is still exact
        unless more tasks than the recorder keeps ran since.
        """
        before = len(self.warnings)
        keep = []
        for deferred in self._deferred:
            if deferred.info.name in stages:
                self.note(deferred.info, None)
                self._draw(deferred.info, deferred.window, deferred.end, post_link=False)
            else:
                keep.append(deferred)
        self._deferred = keep
        return self.warnings[before:]

    @property
    def deferred(self) -> bool:
        """Whether reports are kept for stages that may regress (:meth:`flagged`)."""
        return bool(self._deferred)

    def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Wait, at most ``timeout`` seconds in all, for the reports being drawn and stored
        (never raises: a report not stored in time is a warning)."""
        pending, self._pending = list(self._pending.values()), {}
        deadline = time() + timeout
        for future in pending:
            if future.cancelled():  # superseded by a later window of the same stage
                continue
            try:
                future.result(max(deadline - time(), 0.0))
            except FutureTimeout:
                self.warnings.append(f"stage report not stored within {timeout:.0f} s")
            except Exception as exc:  # _draw notes its own failures; belt and braces
                self.warnings.append(f"stage report failed: {exc!r}")

    # -- notes --------------------------------------------------------------------------------

    def note(self, info: StageInfo, report_note: str | None) -> None:
        """Set the stage's note: its local work, its report's note, how its report spans it."""
        self._report_notes[info.name] = report_note
        parts = [local_work_text(info), report_note, self._span_notes.get(info.name)]
        info.note = "; ".join(p for p in parts if p) or None

    def renote(self, info: StageInfo) -> None:
        """Compose the stage's note again (its local work changed)."""
        self.note(info, self._report_notes.get(info.name))

    def _span_note(self, info: StageInfo) -> str | None:
        if info.windows < 2:
            return None
        others = sorted(self._opened_since.get(info.name, set()))
        text = (f"the report spans the stage's {info.windows} windows, from its first "
                "opening to its last closing")
        if others:
            text += (f" (stages {', '.join(others)} ran in between: their tasks appear in it "
                     "too)")
        return text

    # -- drawing and storing (in the background) ----------------------------------------------

    def _draw(self, info: StageInfo, window: ReportWindow, end: WindowEnd,
              post_link: bool = True) -> None:
        """Draw the stage's report, store it, and (``post_link``) tell the publisher."""
        try:
            rendered = render(self.client, window, end, stage=info.name)
        except Exception as exc:
            self.note(info, f"report not rendered: {exc!r}")
            return
        if rendered.tasks == 0:
            self.note(info, "no tasks ran in this stage: no report")
            return
        if not self.ctx.pipeline:
            self.note(info, "report not stored: stage opened outside a flow run")
            return
        result = self._store().write_report(self.ctx.pipeline, self.ctx.run_id, info.name,
                                            rendered.html)
        self.warnings.extend(result.warnings)
        info.report = {"location": result.location, "size": len(rendered.html.encode()),
                       "tasks": rendered.tasks, "shown": rendered.shown,
                       "truncated": rendered.truncated, "spooled": result.spooled,
                       "renderer": rendered.renderer}
        self.note(info, None if not rendered.truncated else (
            f"report sampled: it shows {rendered.shown} of the stage's {rendered.tasks} "
            f"tasks, spread over its whole time with its longest (the run's task records "
            f"keep at most {window.stream_limit}); the summary has every task"))
        if post_link and self.publisher is not None:
            self.publisher.report_stored(info)
