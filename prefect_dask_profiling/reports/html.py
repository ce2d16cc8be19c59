"""Dask's performance report drawn in the flow process from a stage's copied data.

The same tabs, figures and template as ``Scheduler.performance_report`` (distributed's
own builders: ``profile.plot_data``/``plot_figure``, ``task_stream.rectangles``,
``task_stream_figure``, ``BandwidthTypes``/``BandwidthWorkers``, ``SystemMonitor``,
``SchedulerLogs``), fed from :class:`~prefect_dask_profiling.reports.data.StageData`
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

from prefect_dask_profiling.reports.bokeh_pages import FrozenPage, LayoutPool
from prefect_dask_profiling.reports.data import StageData, StreamSlice

TITLE = "Dask Performance Report"
# Dask's own tab order (Scheduler.performance_report)
_NO_STREAM = StreamSlice(total=0, records=[], limit=0)
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
        cut = (f"\n<li> <b>report sampled: {stream.kept} of {stream.total} tasks shown</b>, "
               "spread over the stage's whole time with its longest tasks (the run's task "
               f"records keep at most {stream.limit}); the run's summary counts every task "
               "</li>")
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


#: The numeric columns of Dask's task-stream rectangles and profile plots, sent as arrays
_STREAM_NUMBERS = ("start", "duration", "y", "alpha")
_PROFILE_NUMBERS = ("left", "right", "bottom", "width", "top", "line_number")


def _arrays(columns: dict, numeric: tuple[str, ...]) -> dict:
    """``columns`` with its ``numeric`` ones as float64 arrays.

    Bokeh writes an array as one base64 buffer; a list it encodes element by element in
    Python, which was most of a page's time (a 1,000-task stage: 14.7 → 8.7 ms a page with
    the keys below, and a tenth smaller).
    """
    import numpy as np

    return {name: (np.asarray(values, dtype=np.float64) if name in numeric else values)
            for name, values in columns.items()}


def _profile_columns(state: dict) -> dict:
    from distributed import profile

    data = profile.plot_data(state)
    data.pop("states", None)
    return _arrays(data, _PROFILE_NUMBERS)


def _stream_columns(data: StageData) -> dict:
    """Dask's task-stream rectangles of the stage's records; each key as its text (a tuple
    key, as an array chunk's, would be encoded element by element; the page shows keys
    nowhere, they stay in it to say which tasks it holds)."""
    from distributed.diagnostics.task_stream import rectangles

    columns = rectangles([{"key": k, "worker": w, "thread": t, "startstops": ss, "status": s}
                          for k, w, t, ss, s in data.stream.records])
    columns["key"] = [k if isinstance(k, str) else str(k) for k in columns["key"]]
    return _arrays(columns, _STREAM_NUMBERS)


def _template() -> Any:
    import distributed
    from bokeh.core.templates import get_env

    env = get_env()  # a fresh Environment each call
    env.loader.searchpath.append(os.path.join(os.path.dirname(distributed.__file__),
                                              "dashboard", "templates"))
    return env.get_template("performance_report.html")


class _Layout:
    """Dask's report tabs, built once and refilled for every report (one thread at a time).

    Building the Bokeh models (ten figures and their tools) costs most of a report's time
    and does not depend on the data, so, as Dask's live dashboard does with its figures,
    they are built once and their sources and texts replaced for each report.
    """

    def __init__(self) -> None:
        from bokeh.models import Div, TabPanel, Tabs
        from distributed import profile
        from distributed.dashboard.components import scheduler as components
        from distributed.dashboard.components.scheduler import task_stream_figure
        from distributed.dashboard.components.shared import SystemMonitor

        styles = getattr(components, "_STYLES", {"overflow": "auto", "padding": "12px"})
        empty = _stand_in(StageData(start=0.0, stop=0.0, stream=_NO_STREAM,
                                    compute_profile={}, server_profile={},
                                    scheduler_profile={}))
        self.summary = Div(text="", styles=styles)
        self.stream, stream_figure = task_stream_figure(sizing_mode="stretch_both")
        self.system = SystemMonitor(empty, last_count=0, sizing_mode="stretch_both")
        self.logs = Div(text="", styles=styles)
        self.profiles = [profile.plot_figure(_profile_columns(profile.create()),
                                             sizing_mode="stretch_both") for _ in range(3)]
        self.bandwidth_workers = components.BandwidthWorkers(empty, sizing_mode="stretch_both")
        self.bandwidth_types = components.BandwidthTypes(empty, sizing_mode="stretch_both")
        children = (self.summary, stream_figure, self.system.root, self.logs,
                    *(figure for figure, _ in self.profiles), self.bandwidth_workers.root,
                    self.bandwidth_types.root)
        self.tabs = Tabs(tabs=[TabPanel(child=c, title=t)
                               for t, c in zip(TABS, children, strict=True)],
                         sizing_mode="stretch_both")
        self.template = _template()
        self.page = FrozenPage(self.tabs, self.changed, self.template)

    def fill(self, data: StageData, stage: str) -> None:
        """Put ``data`` in every tab."""
        from distributed.dashboard.components.scheduler import SchedulerLogs

        stand_in = _stand_in(data)
        self.summary.text = _summary_html(data, stage)
        self.stream.data = _stream_columns(data)
        states = (data.compute_profile, data.server_profile, data.scheduler_profile)
        for (_, source), state in zip(self.profiles, states, strict=True):
            source.data = _profile_columns(state)
        self._fill_system(stand_in)
        self.logs.text = SchedulerLogs(stand_in, start=data.start).root.text
        for component in (self.bandwidth_workers, self.bandwidth_types):
            component.scheduler = stand_in
        self.bandwidth_types.update()
        if data.bandwidth_workers:
            self.bandwidth_workers.update()
        else:  # Dask's update() keeps the previous data when there is none
            from dask.utils import format_bytes

            root = self.bandwidth_workers.root
            root.title.text = f"Bandwidth: {format_bytes(data.bandwidth)}"
            source = self.bandwidth_workers.source
            source.data = {k: [] for k in source.data}

    def _fill_system(self, stand_in: SimpleNamespace) -> None:
        system = self.system
        system.worker, system.last_count = stand_in, 0
        system.source.data = system.get_data()
        if stand_in.monitor.count:
            system.update()  # its min/max/mean labels
        else:
            system.label_source.data.update({"cpu": [""] * 3, "memory": [""] * 3})

    def changed(self) -> list[tuple[Any, str]]:
        """The (model, property) pairs :meth:`fill` sets: all that differs between reports."""
        bw, bt = self.bandwidth_workers, self.bandwidth_types
        return [(self.summary, "text"), (self.logs, "text"), (self.stream, "data"),
                (self.system.source, "data"), (self.system.label_source, "data"),
                *((source, "data") for _, source in self.profiles),
                (bw.source, "data"), (bw.root.title, "text"), (bw.root.x_range, "factors"),
                (bw.root.y_range, "factors"), (bw.color_map, "high"),
                (bt.source, "data"), (bt.root.title, "text"), (bt.root.y_range, "factors")]

    def html(self) -> str:
        """The page of the current fill: the document serialized once, then only the
        :meth:`changed` properties encoded again (``bokeh_pages.FrozenPage``)."""
        return self.page.html(TITLE)


def render_html(data: StageData, stage: str) -> str:
    """Dask's performance report of ``data`` as a standalone HTML page (Bokeh from its CDN).

    The tabs are built once per process (per concurrent report) and refilled for each
    report (:class:`_Layout`): after the first report a page costs milliseconds.
    """
    with LAYOUTS.layout() as layout:
        layout.fill(data, stage)
        return layout.html()


LAYOUTS: LayoutPool[_Layout] = LayoutPool(_Layout)
