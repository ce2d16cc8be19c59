"""What a run's cluster allocated, used and left idle, per stage and for the whole run.

Pure computation on a :class:`~prefect_dask_profiling.summary.record.RunRecord`: each
worker's stay is clipped to each stage's window and integrated (``worker_s``, ``thread_s``,
``busy_s``, ``idle_s``, ``idle_share``, ``gib_h``); the ``outside`` row is the rest, so
``sum(stages) + outside - overlap == run`` (docs/cost.md). Prices appear only with
:class:`~prefect_dask_profiling.cost.rates.CostRates`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from prefect_dask_profiling.cost.rates import CostRates
from prefect_dask_profiling.summary.record import RunRecord

__all__ = ["OUTSIDE", "RUN", "Allocation", "Lifetime", "RunAllocation", "allocated",
           "allocation", "allocation_markdown", "allocation_table", "lifetimes", "merge_windows"]

OUTSIDE = "outside stages"
RUN = "run"
GIB = 2 ** 30

Window = tuple[float, float]


@dataclass(frozen=True)
class Lifetime:
    """One worker's stay: ``[arrived, departed)`` on the scheduler's clock; ``resources``
    are its Dask resource tags (``{"GPU": 1.0}``; empty for runs recorded before them)."""

    worker: str
    name: str
    nthreads: int
    memory_limit: int
    arrived: float
    departed: float
    resources: dict[str, float] = field(default_factory=dict, hash=False)


@dataclass
class Allocation:
    """Resources allocated over one scope (a stage, the outside row or the run).

    ``cost`` is ``None`` unless rates were given; ``unpriced_worker_s`` is the
    worker-seconds of workers no rate covered.
    """

    scope: str
    start: float | None = None  # a stage's window (scheduler clock); None for other rows
    stop: float | None = None
    wall_s: float = 0.0
    worker_s: float = 0.0
    thread_s: float = 0.0
    gib_h: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    idle_share: float | None = None
    cost: float | None = None
    unpriced_worker_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the manifest (a stage entry's ``allocation``, the rows of the
        run's ``allocation``): the fields, ``cost`` and ``unpriced_worker_s`` left out when
        not priced."""
        out = asdict(self)
        if self.cost is None:
            out.pop("cost")
            out.pop("unpriced_worker_s")
        return out


@dataclass
class RunAllocation:
    """Per stage, outside the stages and for the whole run; the rates used, if any, and
    the worker stays it was computed from (to reconcile with a bill)."""

    stages: list[Allocation]
    outside: Allocation
    run: Allocation
    overlap_worker_s: float = 0.0
    rates: dict[str, Any] | None = None  # CostRates.to_dict of the rates used
    unpriced_workers: list[str] = field(default_factory=list)
    workers: list[Lifetime] = field(default_factory=list)

    @property
    def rows(self) -> list[Allocation]:
        """Stages, then the outside row, then the run."""
        return [*self.stages, self.outside, self.run]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the manifest's ``allocation``; ``rates`` and ``unpriced_workers``
        only when priced."""
        out: dict[str, Any] = {
            "stages": [a.to_dict() for a in self.stages], "outside": self.outside.to_dict(),
            "run": self.run.to_dict(), "overlap_worker_s": self.overlap_worker_s,
            "workers": [asdict(w) for w in self.workers]}
        if self.rates is not None:
            out["rates"] = self.rates
            out["unpriced_workers"] = list(self.unpriced_workers)
        return out


def lifetimes(record: RunRecord) -> list[Lifetime]:
    """The record's worker stays, open ones closed at ``record.collected``."""
    out = []
    for entry in record.lifetimes:
        arrived, departed = float(entry["arrived"]), entry.get("departed")
        end = record.collected if departed is None else min(float(departed), record.collected)
        out.append(Lifetime(worker=str(entry["worker"]), name=str(entry.get("name", "")),
                            nthreads=int(entry.get("nthreads") or 0),
                            memory_limit=int(entry.get("memory_limit") or 0),
                            arrived=arrived, departed=max(end, arrived),
                            resources=_resources(entry.get("resources"))))
    return out


def _resources(value: Any) -> dict[str, float]:
    """A stored ``resources`` mapping, its amounts as floats (anything else: none)."""
    if not isinstance(value, dict):
        return {}
    out = {}
    for tag, amount in value.items():
        try:
            out[str(tag)] = float(amount)
        except (TypeError, ValueError):
            continue
    return out


def merge_windows(windows: list[Window]) -> list[Window]:
    """The union of ``windows`` as sorted, disjoint windows."""
    merged: list[list[float]] = []
    for start, stop in sorted(w for w in windows if w[1] > w[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return [(a, b) for a, b in merged]


def _overlap(life: Lifetime, windows: list[Window]) -> float:
    """Seconds of ``life`` inside the disjoint ``windows``."""
    return sum(max(0.0, min(b, life.departed) - max(a, life.arrived)) for a, b in windows)


def allocated(stays: list[Lifetime], windows: list[Window], scope: str,
              rates: CostRates | None = None) -> Allocation:
    """Worker-, thread- and GiB-seconds of ``stays`` inside the disjoint ``windows``,
    priced at ``rates`` when given (busy and idle are left to the caller)."""
    result = Allocation(scope=scope, wall_s=sum(b - a for a, b in windows),
                        cost=0.0 if rates is not None else None)
    for life in stays:
        seconds = _overlap(life, windows)
        if seconds <= 0:
            continue
        threads_s, gib_s = seconds * life.nthreads, seconds * life.memory_limit / GIB
        result.worker_s += seconds
        result.thread_s += threads_s
        result.gib_h += gib_s / 3600.0
        if rates is not None:
            worker_rates = rates.rates_for(life.name, life.resources)
            if worker_rates is None:
                result.unpriced_worker_s += seconds
            else:
                result.cost = (result.cost or 0.0) + worker_rates.price(seconds, threads_s,
                                                                        gib_s)
    return result


def _with_busy(row: Allocation, busy_s: float) -> Allocation:
    """``row`` with its busy seconds, idle seconds and idle share set."""
    row.busy_s = busy_s
    row.idle_s = max(row.thread_s - busy_s, 0.0)
    row.idle_share = row.idle_s / row.thread_s if row.thread_s > 0 else None
    return row


def _complement(windows: list[Window], span: Window) -> list[Window]:
    """The parts of ``span`` outside the disjoint, sorted ``windows``."""
    out, cursor = [], span[0]
    for a, b in windows:
        if a > cursor:
            out.append((cursor, min(a, span[1])))
        cursor = max(cursor, b)
    if cursor < span[1]:
        out.append((cursor, span[1]))
    return [w for w in out if w[1] > w[0]]


def allocation(record: RunRecord, rates: CostRates | None = None) -> RunAllocation:
    """Allocated, busy and idle resources per stage, outside the stages and for the run.

    Parameters
    ----------
    record
        The run's record; without ``lifetimes`` (a run stored before them) every row is 0.
    rates
        Prices per unit-hour; ``None`` (default) prices nothing.

    Returns
    -------
    The :class:`RunAllocation`; its rows add up (``sum(stages) + outside == run`` up to
    ``overlap_worker_s``).
    """
    stays = lifetimes(record)
    span = ((min(s.arrived for s in stays), max(s.departed for s in stays))
            if stays else (record.started, record.started))
    stage_windows = {}
    for name in record.stages:
        window = record.window(name)
        if window is not None:  # clipped to the workers' span (when there are workers)
            stage_windows[name] = ((max(window[0], span[0]), min(window[1], span[1]))
                                   if stays else window)
    stages = [_with_busy(allocated(stays, [w] if w[1] > w[0] else [], name, rates),
                         float(record.stage_rows("tasks", name)["compute_s"].sum()))
              for name, w in stage_windows.items()]
    for row, (start, stop) in zip(stages, stage_windows.values(), strict=True):
        row.start, row.stop = start, stop
    union = merge_windows(list(stage_windows.values()))
    run_busy = float(record.tasks["compute_s"].sum())
    outside = _with_busy(allocated(stays, _complement(union, span), OUTSIDE, rates),
                         max(run_busy - sum(s.busy_s for s in stages), 0.0))
    run = _with_busy(allocated(stays, [span] if span[1] > span[0] else [], RUN, rates),
                     run_busy)
    overlap = sum(s.worker_s for s in stages) + outside.worker_s - run.worker_s
    return RunAllocation(stages=stages, outside=outside, run=run,
                         overlap_worker_s=max(overlap, 0.0),
                         rates=rates.to_dict() if rates is not None else None,
                         unpriced_workers=rates.unpriced((s.name, s.resources)
                                                         for s in stays)
                         if rates is not None else [], workers=stays)


def _hours(value: Any) -> str:
    return "n/a" if value is None else f"{float(value) / 3600.0:.3f}"


def _row_cells(row: dict[str, Any], priced: bool, currency: str) -> list[str]:
    share = row.get("idle_share")
    cells = [str(row.get("scope", "")), _hours(row.get("worker_s")),
             _hours(row.get("thread_s")), f"{float(row.get('gib_h') or 0.0):.3f}",
             _hours(row.get("busy_s")), _hours(row.get("idle_s")),
             "n/a" if share is None else f"{share:.0%}"]
    if priced:
        cost = row.get("cost")
        cells.append("n/a" if cost is None else f"{cost:.4f} {currency}")
    return cells


def allocation_markdown(doc: dict[str, Any] | None) -> list[str]:
    """Markdown lines of a stored allocation (the manifest's ``allocation``): a table of
    worker-, thread-, GiB-hours, busy / idle thread-hours and idle share per stage, outside
    the stages and for the run; the cost column and the rate used only when priced.
    Empty for a run stored before allocations were recorded."""
    if not doc or not doc.get("run"):
        return []
    rates = doc.get("rates")
    currency = (rates or {}).get("currency", "")
    header = ["scope", "worker-h", "thread-h", "GiB-h", "busy thread-h", "idle thread-h",
              "idle share", *(["est. cost"] if rates else [])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in [*doc.get("stages", []), doc.get("outside") or {}, doc["run"]]:
        lines.append("| " + " | ".join(_row_cells(row, bool(rates), currency)) + " |")
    if doc.get("overlap_worker_s"):
        lines.append(f"\nStage windows overlap: {_hours(doc['overlap_worker_s'])} worker-h "
                     "are counted in more than one stage.")
    if rates:
        lines.append(f"\nCost is an **estimate** at {rates.get('text', '')}: it prices what the "
                     "workers were allocated while the scheduler saw them, not the bill "
                     "(the scheduler's node, spot prices, shared clusters are not in it).")
        if doc.get("unpriced_workers"):
            lines.append("Not priced (no rate matched): "
                         + ", ".join(doc["unpriced_workers"]) + ".")
    return lines


def allocation_table(doc: dict[str, Any] | None) -> pd.DataFrame:
    """A stored allocation as a table (``dask-profiling show``): one row per stage, the
    outside row and the run, in hours; a ``cost`` column only when priced."""
    if not doc or not doc.get("run"):
        return pd.DataFrame()
    rows = []
    for row in [*doc.get("stages", []), doc.get("outside") or {}, doc["run"]]:
        out = {"scope": row.get("scope"),
               "worker_h": float(row.get("worker_s") or 0.0) / 3600.0,
               "thread_h": float(row.get("thread_s") or 0.0) / 3600.0,
               "gib_h": float(row.get("gib_h") or 0.0),
               "busy_thread_h": float(row.get("busy_s") or 0.0) / 3600.0,
               "idle_thread_h": float(row.get("idle_s") or 0.0) / 3600.0,
               "idle_share": row.get("idle_share")}
        if doc.get("rates"):
            out["cost"] = row.get("cost")
        rows.append(out)
    return pd.DataFrame(rows)
