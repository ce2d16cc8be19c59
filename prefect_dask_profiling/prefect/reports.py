"""Per-stage Dask performance reports: window marks, and the two ways to draw them.

A stage's report covers its window: wall times, the task-stream recorder's append counter
(so exactly the stage's tasks, whatever the clock offsets) and the system monitor's sample
counter, marked at the stage's entry and exit. Two renderers:

* ``"flow"`` (default): the scheduler only copies the window's data
  (:mod:`~prefect_dask_profiling.prefect.report_data`) and the flow process draws Dask's
  report with Bokeh (:mod:`~prefect_dask_profiling.prefect.report_html`) in its report
  thread: a few milliseconds of scheduler event loop per report instead of half a second.
* ``"dask"``: Dask's own ``Scheduler.performance_report``, rendered on the scheduler
  (~0.5-0.8 s of event loop per report, during which it schedules nothing), bounded to the
  window by a wrapper around its task-stream and profile reads.

Either way the task-stream recorder Dask relies on stays resident once used (~0.7 KB per
task, its buffer keeps the last ``distributed.scheduler.dashboard.tasks.task-stream-length``
tasks): a report drawn after more tasks than that finished shows the stage's records still
held, never a later stage's, and says it is cut. :func:`release_task_stream` drops the
recorder after the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distributed.metrics import time

from prefect_dask_profiling.prefect import report_data

if TYPE_CHECKING:
    from distributed import Client

TASK_STREAM_PLUGIN = report_data.TASK_STREAM_PLUGIN
RENDERERS = ("flow", "dask")
_TASKS_IN_REPORT = re.compile(r"number of tasks:\s*(\d+)")


@dataclass
class ReportWindow:
    """Where a stage's report starts: wall time, monitor count and task-stream cursor."""

    start: float
    last_count: int
    index: int
    stream_limit: int
    installed_stream: bool


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


def open_window(client: Client) -> ReportWindow:
    """Mark the start of a report window (installs Dask's task-stream recorder)."""
    start = time()
    state = client.run_on_scheduler(report_data.window_state)
    return ReportWindow(start=start, last_count=state["count"], index=state["index"],
                        stream_limit=state["limit"], installed_stream=state["installed"])


@dataclass(frozen=True)
class WindowEnd:
    """Where a stage's report ends: wall time, task-stream cursor and monitor count."""

    stop: float
    index: int
    count: int | None = None


def close_window(client: Client) -> WindowEnd:
    """Mark the end of a report window (one cheap round trip; nothing is rendered)."""
    stop = time()
    state = client.run_on_scheduler(report_data.window_state)
    return WindowEnd(stop=stop, index=state["index"], count=state["count"])


def render(client: Client, window: ReportWindow, end: WindowEnd | None = None,
           timeout: float = 120.0, renderer: str = "flow",
           stage: str = "") -> RenderedReport:
    """Render the performance report of ``window``, up to ``end`` (default: now).

    With ``end`` the report may be rendered later, while other work runs: its task stream
    holds exactly the records between the two cursors and its profiles stop at
    ``end.stop``, so the next stage's tasks do not leak in. ``renderer`` is ``"flow"``
    (drawn here from copied data) or ``"dask"`` (drawn by the scheduler).

    Raises
    ------
    ValueError
        For an unknown ``renderer``.
    """
    check_renderer(renderer)
    end = end or close_window(client)
    if renderer == "flow":
        return _render_in_flow(client, window, end, timeout, stage)
    return _render_by_dask(client, window, end, timeout)


def check_renderer(renderer: str) -> str:
    """``renderer`` if it names a renderer; ``ValueError`` naming the choices otherwise."""
    if renderer not in RENDERERS:
        raise ValueError(f"report_renderer must be one of {RENDERERS}, got {renderer!r}")
    return renderer


def _render_in_flow(client: Client, window: ReportWindow, end: WindowEnd, timeout: float,
                    stage: str) -> RenderedReport:
    from prefect_dask_profiling.prefect.report_html import render_html

    data = report_data.fetch(
        client, start=window.start, stop=end.stop, first=window.index, last=end.index,
        last_count=window.last_count,
        end_count=end.count if end.count is not None else window.last_count,
        limit=window.stream_limit, timeout=timeout)
    stream = data.stream
    return RenderedReport(html=render_html(data, stage), tasks=stream.total,
                          truncated=stream.cut, shown=stream.kept, renderer="flow")


def _render_by_dask(client: Client, window: ReportWindow, end: WindowEnd,
                    timeout: float) -> RenderedReport:
    tasks = end.index - window.index
    html = client.run_on_scheduler(_bounded_report_function(), start=window.start,
                                   stop=end.stop, last_count=window.last_count,
                                   first=window.index, last=end.index,
                                   callback_timeout=timeout)
    match = _TASKS_IN_REPORT.search(html)
    shown = int(match.group(1)) if match else tasks
    return RenderedReport(html=html, tasks=tasks, truncated=shown < tasks, shown=shown,
                          renderer="dask")


def _bounded_report_function():
    """A scheduler-side coroutine: Dask's ``performance_report`` with an end time.

    Dask's report runs from ``start`` to *now*. Its task stream and profiles are read
    through ``get_task_stream``/``get_profile``; a wrapper around those two (installed once
    per scheduler, inert unless a render is in progress) bounds them to the window, read
    from a context variable local to the render's own asyncio task so concurrent renders of
    other runs are not affected: the task stream by the recorder's append counter (exact),
    the profiles by the stage's end time. Built in a function so it travels by value (the
    scheduler need not have this package).
    """

    async def bounded_report(dask_scheduler, start: float, stop: float, last_count: int,
                             first: int, last: int) -> str:
        import contextvars

        var = dask_scheduler.__dict__.get("_dask_profiling_report_window")
        if var is None:
            var = contextvars.ContextVar("dask_profiling_report_window", default=None)
            stream, profile = dask_scheduler.get_task_stream, dask_scheduler.get_profile

            def get_task_stream(start=None, stop=None, count=None, start_index=None):
                window = var.get()
                if window is None or stop is not None or start_index is not None:
                    return stream(start=start, stop=stop, count=count,
                                  start_index=start_index)
                # by the recorder's append counter, not by time: exact at stage boundaries
                # whatever the clock offsets between workers and scheduler; records that
                # left the buffer are missing, never replaced by later ones (Dask's
                # start_index clamps to the buffer's start)
                plugin = dask_scheduler.plugins["task-stream"]
                first = max(window[1], plugin.index - len(plugin.buffer))
                if first >= window[2]:
                    return []
                return stream(start_index=first)[: window[2] - first]

            async def get_profile(*args, stop=None, **kwargs):
                window = var.get()
                bound = window[0] if window is not None and stop is None else stop
                return await profile(*args, stop=bound, **kwargs)

            dask_scheduler.get_task_stream = get_task_stream
            dask_scheduler.get_profile = get_profile
            dask_scheduler._dask_profiling_report_window = var
        token = var.set((stop, first, last))
        try:
            return await dask_scheduler.performance_report(start=start, last_count=last_count,
                                                           code="")
        finally:
            var.reset(token)

    return bounded_report


def release_task_stream(client: Client, keep_if_prefix: str = "task-timings-") -> bool:
    """Remove Dask's task-stream recorder unless another profiled run still uses it."""
    return client.run_on_scheduler(report_data.drop_task_stream,
                                   keep_if_prefix=keep_if_prefix)
