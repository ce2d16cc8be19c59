"""A standalone HTML trend page: each prefix's total seconds across the baseline and the latest run.

One line per (stage, prefix), the largest ``MAX_LINES`` by share of the latest run (the rest
are named in the subtitle as left out); regressed prefixes get a red marker on the latest run.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from prefect_dask_profiling.reports.bokeh_pages import FrozenPage, LayoutPool

MAX_LINES = 12
LATEST = "latest"


def trend_html(history: pd.DataFrame, latest: pd.DataFrame, verdicts: pd.DataFrame,
               title: str) -> str:
    """A Bokeh page (CDN resources) of total seconds per prefix, run by run.

    Parameters
    ----------
    history
        Long table of the baseline runs (``run_id, stage, prefix, total_s``).
    latest
        The latest run's summary (``stage, prefix, total_s``).
    verdicts
        The output of ``detect_regressions`` (``stage, prefix, verdict``); may be empty.
    title
        Page and plot title.

    Notes
    -----
    The page is drawn at a run's end (every night with ``stage_reports=True``, otherwise
    on a night that flags): its figure is built once per process and
    refilled (:class:`_TrendLayout`), so after the first page one costs milliseconds
    instead of Bokeh's ~50 ms of building and serializing the same models.
    """
    wide = _wide(history, latest)
    top, left_out = _top(wide)
    flagged = _regressed_labels(verdicts)
    with LAYOUTS.layout() as layout:
        layout.fill(wide, top, left_out, flagged, title)
        return layout.page.html(title)


class _TrendLayout:
    """The trend page's models, built once and refilled for every page (one thread at a
    time): one renderer per kind (lines, points, regression markers), not one per prefix,
    so a page's model count does not grow with its prefixes."""

    def __init__(self) -> None:
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, Div, HoverTool
        from bokeh.plotting import figure

        self.subtitle = Div(text="")
        self.fig = fig = figure(title="", x_range=[LATEST], height=420,
                                sizing_mode="stretch_width", y_axis_label="total seconds",
                                x_axis_label="run", tools="pan,wheel_zoom,reset")
        fig.xaxis.major_label_orientation = 0.8
        self.lines = ColumnDataSource({"xs": [], "ys": [], "prefix": [], "color": []})
        self.points = ColumnDataSource({"run": [], "total_s": [], "prefix": [], "color": []})
        self.marks = ColumnDataSource({"run": [], "total_s": []})
        fig.multi_line("xs", "ys", color="color", line_width=2, legend_field="prefix",
                       source=self.lines)
        points = fig.scatter("run", "total_s", color="color", size=5, source=self.points)
        fig.add_tools(HoverTool(renderers=[points], tooltips=[
            ("prefix", "@prefix"), ("run", "@run"), ("seconds", "@total_s{0.00}")]))
        fig.scatter("run", "total_s", marker="circle", size=14, fill_color="red",
                    line_color="darkred", legend_label="regression", source=self.marks)
        fig.legend.location = "top_left"
        self.prefixes_item, self.marks_item = fig.legend.items
        self.root = column(self.subtitle, fig, sizing_mode="stretch_width")
        self.page = FrozenPage(self.root, self.changed)

    def fill(self, wide: pd.DataFrame, top: list[str], left_out: list[str],
             flagged: set[str], title: str) -> None:
        """Put one page's runs, prefixes and regression markers in the models."""
        from bokeh.palettes import Category20_20

        runs = [str(c) for c in wide.columns]
        colors = {label: Category20_20[i % 20] for i, label in enumerate(top)}
        values = {label: wide.loc[label].to_numpy(float) for label in top}
        self.fig.title.text = title
        self.fig.x_range.factors = runs
        self.lines.data = {"xs": [runs] * len(top), "prefix": top,
                           "ys": [values[label].tolist() for label in top],
                           "color": [colors[label] for label in top]}
        self.points.data = {
            "run": runs * len(top), "prefix": [label for label in top for _ in runs],
            "total_s": [v for label in top for v in values[label]],
            "color": [colors[label] for label in top for _ in runs]}
        marked = [label for label in top if label in flagged] if LATEST in runs else []
        self.marks.data = {"run": [LATEST] * len(marked),
                           "total_s": [values[label][-1] for label in marked]}
        self.prefixes_item.visible = bool(top)
        self.marks_item.visible = bool(marked)
        self.subtitle.text = _subtitle(len(runs) - (LATEST in runs), top, left_out, flagged)

    def changed(self) -> list[tuple[object, str]]:
        """The (model, property) pairs :meth:`fill` sets: all that differs between pages."""
        return [(self.fig.title, "text"), (self.fig.x_range, "factors"),
                (self.lines, "data"), (self.points, "data"), (self.marks, "data"),
                (self.prefixes_item, "visible"), (self.marks_item, "visible"),
                (self.subtitle, "text")]


LAYOUTS: LayoutPool[_TrendLayout] = LayoutPool(_TrendLayout)


def _wide(history: pd.DataFrame, latest: pd.DataFrame) -> pd.DataFrame:
    """Seconds per ``stage/prefix`` label (rows) and run (columns, oldest first, then latest)."""
    frames = []
    if len(history):
        frames.append(history[["run_id", "stage", "prefix", "total_s"]])
    if len(latest):
        frames.append(latest[["stage", "prefix", "total_s"]].assign(run_id=LATEST))
    if not frames:
        return pd.DataFrame()
    long = pd.concat(frames, ignore_index=True)
    long["label"] = long["stage"].astype(str) + "/" + long["prefix"].astype(str)
    long["total_s"] = pd.to_numeric(long["total_s"], errors="coerce")
    long.loc[~np.isfinite(long["total_s"]), "total_s"] = np.nan
    wide = long.pivot_table(index="label", columns="run_id", values="total_s", aggfunc="sum")
    order = sorted(c for c in wide.columns if c != LATEST) + [LATEST] * (LATEST in wide)
    return wide[order]


def _top(wide: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The :data:`MAX_LINES` labels to draw (largest latest share first; baseline median
    breaks ties) and the rest."""
    if wide.empty:
        return [], []
    latest = wide[LATEST] if LATEST in wide else pd.Series(0.0, index=wide.index)
    key = pd.DataFrame({"latest": latest.fillna(0.0), "median": wide.median(axis=1).fillna(0.0)})
    ordered = key.sort_values(["latest", "median"], ascending=False).index.tolist()
    return ordered[:MAX_LINES], ordered[MAX_LINES:]


def _regressed_labels(verdicts: pd.DataFrame) -> set[str]:
    if verdicts is None or verdicts.empty or "verdict" not in verdicts:
        return set()
    rows = verdicts[verdicts["verdict"] == "regression"]
    return {f"{s}/{p}" for s, p in zip(rows["stage"], rows["prefix"], strict=True)}


def _subtitle(n_runs: int, top: list[str], left_out: list[str], flagged: set[str]) -> str:
    text = f"{n_runs} baseline run(s) and the latest run; {len(top)} prefix(es) drawn"
    if left_out:
        text += (f"; {len(left_out)} smaller prefix(es) left out (only the {len(top)} largest "
                 f"by share of the latest run are drawn): " + ", ".join(left_out))
    if flagged:
        text += "; red marker = regression: " + ", ".join(sorted(flagged))
    return f"<p>{html.escape(text)}</p>"
