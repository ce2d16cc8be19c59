"""Dask's performance report drawn in the flow process from a stage's copied data.

The same tabs, figures and template as ``Scheduler.performance_report`` (distributed's
own builders: ``profile.plot_data``/``plot_figure``, ``task_stream.rectangles``,
``task_stream_figure``, ``BandwidthTypes``/``BandwidthWorkers``, ``SystemMonitor``,
``SchedulerLogs``), fed from :class:`~prefect_dask_profiling.prefect.report_data.StageData`
instead of the live scheduler, so the scheduler's event loop spends nothing on Bokeh. The
dashboard components read a few scheduler attributes; small stand-ins hold the copies.
Bokeh is imported only here, and only when a report is drawn.
"""

from __future__ import annotations

import html as html_escape
import os
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from prefect_dask_profiling.prefect.report_data import StageData

TITLE = "Dask Performance Report"
# Dask's own tab order (Scheduler.performance_report)
TABS = ("Summary", "Task Stream", "System", "Scheduler Logs", "Worker Profile (compute)",
        "Worker Profile (administrative)", "Scheduler Profile (administrative)",
        "Bandwidth (Workers)", "Bandwidth (Types)")


_MONITORED = ("time", "cpu", "memory", "host_net_io.read_bps", "host_net_io.write_bps",
              "num_fds")


class _MonitorCopy:
    """The system-monitor samples of the window, shaped as ``SystemMonitor`` reads them."""

    def __init__(self, samples: dict[str, list]) -> None:
        self.quantities = {k: [] for k in _MONITORED} | samples
        self.count = len(self.quantities["time"])

    def range_query(self, start: int) -> dict[str, list]:
        return {k: list(v[start:]) for k, v in self.quantities.items()}

    def update(self) -> None:
        """Nothing to sample: the copy is final."""


def _stand_in(data: StageData) -> SimpleNamespace:
    """What the dashboard components read of a scheduler, from the copies."""
    return SimpleNamespace(
        bandwidth=data.bandwidth, bandwidth_types=data.bandwidth_types,
        bandwidth_workers=data.bandwidth_workers,
        workers={a: SimpleNamespace(name=n) for a, n in data.worker_names.items()},
        monitor=_MonitorCopy(data.monitor),
        get_logs=lambda start=0, n=None, timestamps=False: data.logs)


def _summary_html(data: StageData, stage: str) -> str:
    """Dask's summary tab, with the stage's name and whether its task stream is cut."""
    from dask.utils import format_bytes, format_time

    spent: dict[str, float] = defaultdict(float)
    for record in data.stream.records:
        for ss in record[3]:
            spent[ss["action"]] += ss["stop"] - ss["start"]
    timings = "".join(f"\n<li> {k} time: {format_time(spent[k])} </li>" for k in sorted(spent))
    stream = data.stream
    cut = ""
    if stream.cut:
        cut = (f"\n<li> <b>report cut: {stream.kept} of {stream.total} tasks shown</b> (Dask's "
               f"task-stream recorder keeps the last {stream.limit}; the others finished "
               "before this report was drawn) </li>")
    info = data.info
    return f"""
        <h1> {TITLE} </h1>

        <i> Select different tabs on the top for additional information </i>

        <h2> Stage: {html_escape.escape(stage)} </h2>
        <h2> Duration: {format_time(data.stop - data.start)} </h2>
        <h2> Tasks Information </h2>
        <ul>
         <li> number of tasks: {stream.total} </li>{cut}
         {timings}
        </ul>

        <h2> Scheduler Information </h2>
        <ul>
          <li> Address: {info.get("address")} </li>
          <li> Workers: {info.get("workers")} </li>
          <li> Threads: {info.get("threads")} </li>
          <li> Memory: {format_bytes(info.get("memory") or 0)} </li>
          <li> Dask Version: {info.get("dask")} </li>
          <li> Dask.Distributed Version: {info.get("distributed")} </li>
        </ul>

        <h2> Rendered </h2>
        <ul> <li> in the flow process by prefect-dask-profiling </li> </ul>
        """


def _profile_figure(state: dict) -> Any:
    from distributed import profile

    figure, _ = profile.plot_figure(profile.plot_data(state), sizing_mode="stretch_both")
    return figure


def _task_stream(data: StageData) -> Any:
    from distributed.dashboard.components.scheduler import task_stream_figure
    from distributed.diagnostics.task_stream import rectangles

    messages = [{"key": k, "worker": w, "thread": t, "startstops": ss, "status": s}
                for k, w, t, ss, s in data.stream.records]
    source, figure = task_stream_figure(sizing_mode="stretch_both")
    source.data.update(rectangles(messages))
    return figure


def _template() -> Any:
    import distributed
    from bokeh.core.templates import get_env

    env = get_env()  # a fresh Environment each call
    env.loader.searchpath.append(os.path.join(os.path.dirname(distributed.__file__),
                                              "dashboard", "templates"))
    return env.get_template("performance_report.html")


def render_html(data: StageData, stage: str) -> str:
    """Dask's performance report of ``data`` as a standalone HTML page (Bokeh from its CDN)."""
    from bokeh.embed import file_html
    from bokeh.models import Div, TabPanel, Tabs
    from bokeh.resources import CDN
    from distributed.dashboard.components import scheduler as components
    from distributed.dashboard.components.shared import SystemMonitor

    styles = getattr(components, "_STYLES", {"overflow": "auto", "padding": "12px"})
    stand_in = _stand_in(data)
    bandwidth_workers = components.BandwidthWorkers(stand_in, sizing_mode="stretch_both")
    bandwidth_workers.update()
    bandwidth_types = components.BandwidthTypes(stand_in, sizing_mode="stretch_both")
    bandwidth_types.update()
    system = SystemMonitor(stand_in, last_count=0, sizing_mode="stretch_both")
    if stand_in.monitor.count:
        system.update()  # its min/max/mean labels
    logs = components.SchedulerLogs(stand_in, start=data.start)
    children = (Div(text=_summary_html(data, stage), styles=styles), _task_stream(data),
                system.root, logs.root, _profile_figure(data.compute_profile),
                _profile_figure(data.server_profile), _profile_figure(data.scheduler_profile),
                bandwidth_workers.root, bandwidth_types.root)
    tabs = Tabs(tabs=[TabPanel(child=c, title=t) for t, c in zip(TABS, children, strict=True)],
                sizing_mode="stretch_both")
    return file_html(tabs, resources=CDN, title=TITLE, template=_template())
