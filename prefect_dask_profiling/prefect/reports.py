"""Per-stage Dask performance reports, rendered by the scheduler and returned as HTML.

Dask's ``performance_report`` writes a file; here the scheduler's ``performance_report``
RPC is called directly so the HTML can go straight to object storage. Costs to respect:
rendering blocks the scheduler's event loop (~0.8 s per 10k tasks), the task-stream
recorder it relies on stays resident once used (~0.7 KB per task, up to 100k tasks) and a
report silently truncates past that many tasks — so the window's task count is recorded,
truncation is flagged, and :func:`release_task_stream` drops the recorder after the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distributed.metrics import time

if TYPE_CHECKING:
    from distributed import Client

TASK_STREAM_PLUGIN = "task-stream"
_TASKS_IN_REPORT = re.compile(r"number of tasks:\s*(\d+)")


@dataclass
class ReportWindow:
    """Where a stage's report starts: wall time, log count and task-stream cursor."""

    start: float
    last_count: int
    index: int
    stream_limit: int
    installed_stream: bool


@dataclass
class RenderedReport:
    """A stage's rendered report and what it covers."""

    html: str
    tasks: int
    truncated: bool


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


def _window_state(dask_scheduler) -> dict:
    plugin = dask_scheduler.plugins.get(TASK_STREAM_PLUGIN)
    installed = plugin is None
    if installed:
        dask_scheduler.get_task_stream_index()  # installs the recorder
        plugin = dask_scheduler.plugins[TASK_STREAM_PLUGIN]
    return {"count": dask_scheduler.monitor.count, "index": plugin.index,
            "limit": plugin.buffer.maxlen or 0, "installed": installed}


def open_window(client: Client) -> ReportWindow:
    """Mark the start of a report window (installs Dask's task-stream recorder)."""
    start = time()
    state = client.run_on_scheduler(_window_state)
    return ReportWindow(start=start, last_count=state["count"], index=state["index"],
                        stream_limit=state["limit"], installed_stream=state["installed"])


@dataclass(frozen=True)
class WindowEnd:
    """Where a stage's report ends: wall time and task-stream cursor at the stage's exit."""

    stop: float
    index: int


def close_window(client: Client) -> WindowEnd:
    """Mark the end of a report window (one cheap round trip; nothing is rendered)."""
    stop = time()
    return WindowEnd(stop=stop, index=client.sync(client.scheduler.get_task_stream_index))


def render(client: Client, window: ReportWindow, end: WindowEnd | None = None,
           timeout: float = 120.0) -> RenderedReport:
    """Render the performance report of ``window``, up to ``end`` (default: now).

    With ``end`` the report may be rendered later, while other work runs: its task stream
    stops at the stage's last task and its profiles at ``end.stop``, so the next stage's
    tasks do not leak in (the
    system-monitor and log tabs still run to the render time).
    """
    end = end or close_window(client)
    tasks = end.index - window.index
    html = client.run_on_scheduler(_bounded_report_function(), start=window.start,
                                   stop=end.stop, last_count=window.last_count,
                                   first=window.index, last=end.index,
                                   callback_timeout=timeout)
    match = _TASKS_IN_REPORT.search(html)
    shown = int(match.group(1)) if match else tasks
    truncated = bool(window.stream_limit) and tasks > window.stream_limit
    return RenderedReport(html=html, tasks=max(tasks, shown), truncated=truncated)


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
                # whatever the clock offsets between workers and scheduler
                records = stream(start_index=window[1])
                return records[: max(0, window[2] - window[1])]

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


def _drop_task_stream(dask_scheduler, keep_if_prefix: str) -> bool:
    others = [n for n in dask_scheduler.plugins if n.startswith(keep_if_prefix)]
    if others:
        return False
    return dask_scheduler.plugins.pop(TASK_STREAM_PLUGIN, None) is not None


def release_task_stream(client: Client, keep_if_prefix: str = "task-timings-") -> bool:
    """Remove Dask's task-stream recorder unless another profiled run still uses it."""
    return client.run_on_scheduler(_drop_task_stream, keep_if_prefix=keep_if_prefix)
