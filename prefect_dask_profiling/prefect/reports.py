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

from distributed.metrics import time

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


def _window_state(dask_scheduler) -> dict:
    plugin = dask_scheduler.plugins.get(TASK_STREAM_PLUGIN)
    installed = plugin is None
    if installed:
        dask_scheduler.get_task_stream_index()  # installs the recorder
        plugin = dask_scheduler.plugins[TASK_STREAM_PLUGIN]
    return {"count": dask_scheduler.monitor.count, "index": plugin.index,
            "limit": plugin.buffer.maxlen or 0, "installed": installed}


def open_window(client) -> ReportWindow:
    """Mark the start of a report window (installs Dask's task-stream recorder)."""
    start = time()
    state = client.run_on_scheduler(_window_state)
    return ReportWindow(start=start, last_count=state["count"], index=state["index"],
                        stream_limit=state["limit"], installed_stream=state["installed"])


def render(client, window: ReportWindow, timeout: float = 120.0) -> RenderedReport:
    """Render the performance report of everything since ``window`` opened."""
    index = client.sync(client.scheduler.get_task_stream_index)
    tasks = index - window.index
    html = client.sync(client.scheduler.performance_report, start=window.start,
                       last_count=window.last_count, code="", callback_timeout=timeout)
    match = _TASKS_IN_REPORT.search(html)
    shown = int(match.group(1)) if match else tasks
    truncated = bool(window.stream_limit) and tasks > window.stream_limit
    return RenderedReport(html=html, tasks=max(tasks, shown), truncated=truncated)


def _drop_task_stream(dask_scheduler, keep_if_prefix: str) -> bool:
    others = [n for n in dask_scheduler.plugins if n.startswith(keep_if_prefix)]
    if others:
        return False
    return dask_scheduler.plugins.pop(TASK_STREAM_PLUGIN, None) is not None


def release_task_stream(client, keep_if_prefix: str = "task-timings-") -> bool:
    """Remove Dask's task-stream recorder unless another profiled run still uses it."""
    return client.run_on_scheduler(_drop_task_stream, keep_if_prefix=keep_if_prefix)
