"""A bottleneck diagnosis for every stage of a profiled run, from what the run recorded.

The same signal names and the same :func:`~prefect_dask_profiling.diagnosis.classify.classify`
as ``dask-profiling bench``: one classifier, two callers. A profiled run has fewer streams
than a bench session; what it lacks is simply absent from the signal dict and the verdict
says how many sources agreed:

=================  ==============================================================
source             from the run record
=================  ==============================================================
task records       per-(stage, prefix) aggregates: compute seconds against the
                   stage's thread-seconds (busy fraction), p50 / p95 / max per prefix
                   (typical duration, longest task vs p95 and vs the stage's wall),
                   transfer and disk seconds
process CPU        the worker processes' CPU and run-queue wait between the stage's
                   opening and closing (the workers' counters, ``io`` table: exact for
                   any stage length); without them, system-monitor samples (CPU
                   percent) inside the stage's window, which a stage of a few
                   seconds does not have
scheduler load     the scheduler's event-loop CPU and run-queue wait while the stage
                   ran (the plugin's per-stage loop samples), per task of the stage
memory samples     managed / spilled bytes against the memory limit in the window
transfer log       MB moved and MB per transfer, attributed to a stage by the
                   *receiving* task's stage (see below)
storage requests   bytes the stage's tasks fetched from storage (GDAL, s3fs) against
                   the bytes Dask moved to them
=================  ==============================================================

Transfers per stage: the record's transfers table has no stage column (bytes come from
the workers' incoming logs, per worker pair, for the whole run), but every task record
carries the seconds its task spent receiving its inputs (``transfer_s``, from Dask's
``transfer`` start-stops, which name the receiving task). So a stage whose tasks received
nothing moved nothing: it gets ``transfer.mb_moved = 0`` and ``transfer.mb_per_transfer =
0`` — no payloads, so transfer's required rule (large payloads) rules it out, whatever
other stages moved. A stage whose tasks did all of the run's receiving owns the run's
transfer log. A stage that received part of it has no bytes or payload size of its own in
the record, and gets none: a stage's diagnosis uses that stage's own figures only (the run's
mean MB per transfer used to stand in, and made a read stage with 1% of its time in
transfers transfer-bound, issue 35). Its own ``tasks.transfer_share`` still decides, and
transfer cannot be chosen below
:data:`~prefect_dask_profiling.diagnosis.classify.MIN_TRANSFER_SHARE` of it.

Fine metrics, host network counters, calibration and per-worker task times are not in a run
record: those rules are skipped. On a shared cluster (``scope="run"``) the scheduler's load
includes other runs' work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from prefect_dask_profiling.diagnosis.classify import Evidence, Signals, check_classes, classify
from prefect_dask_profiling.diagnosis.signals import (
    MIN_STRAGGLER_SHARE,
    memory_signals,
    monitor_signals,
    ratio,
    sampled_cpu_seconds,
    storage_signals,
)
from prefect_dask_profiling.errors import InvalidInput

MIN_SKEW_TASKS = 10
"""Tasks a prefix needs before its longest task is compared with its p95."""
MIN_SCHEDULER_TASKS = 100
"""Tasks a stage needs before the scheduler's load is judged per task: below it the loop's
fixed cost per stage (a graph's arrival, the stage's own snapshot) is most of its CPU, and
so few tasks cannot keep a scheduler busy."""


@dataclass
class Diagnosis:
    """One stage's bottleneck verdict, as stored in the manifest (``stages[i]["diagnosis"]``).

    ``signals`` are the primary class's evidence rows: ``signal, source, value, op,
    threshold, supports``.
    """

    stage: str
    primary: str
    secondary: str | None
    confidence: str
    agreeing_sources: int
    sources: list[str] = field(default_factory=list)
    signals: list[Evidence] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, stage: str = "?") -> Diagnosis | None:
        """Read a stored diagnosis; ``None`` for runs stored before diagnoses existed.

        Unknown keys are ignored and missing ones take defaults, so a manifest written by
        an older or newer version still loads.
        """
        if not isinstance(data, dict) or not data.get("primary"):
            return None
        return cls(stage=str(data.get("stage") or stage), primary=str(data["primary"]),
                   secondary=data.get("secondary"),
                   confidence=str(data.get("confidence") or "low"),
                   agreeing_sources=int(data.get("agreeing_sources") or 0),
                   sources=list(data.get("sources") or []),
                   signals=[s for s in data.get("signals") or [] if isinstance(s, dict)],
                   disagreements=list(data.get("disagreements") or []),
                   actions=list(data.get("actions") or []), note=str(data.get("note") or ""))

    def summary(self) -> str:
        """One line: ``io (high, 3 sources: ...); secondary compute``."""
        text = (f"{self.primary} ({self.confidence}, {self.agreeing_sources} source(s)"
                + (f": {', '.join(self.sources)}" if self.sources else "") + ")")
        if self.secondary:
            text += f"; secondary {self.secondary}"
        return text

    def evidence(self) -> str:
        """The supporting signals with their values, for tables: ``signal=value [source]``."""
        return "; ".join(f"{s['signal']}={s['value']:.3g} [{s['source']}]"
                         for s in self.signals if s.get("supports"))


def stage_signals(record, stage: str) -> Signals:
    """The classifier's signals for one stage of a run record (absent when not recorded).

    Raises
    ------
    ValueError
        When the record has no task of ``stage`` (naming the stages it has).
    """
    tasks = record.stage_rows("tasks", stage)
    if tasks.empty:
        known = ", ".join(map(str, record.stages)) or "none"
        raise InvalidInput(f"stage {stage!r} has no tasks in this run (stages: {known})")
    window = record.window(stage)
    signals: Signals = {}
    if window is None or window[1] <= window[0]:
        return signals
    wall = window[1] - window[0]
    compute_s = float(tasks["compute_s"].fillna(0).sum())
    signals["tasks.count"] = int(tasks["tasks"].fillna(0).sum())
    signals["tasks.compute_s"] = compute_s
    signals["tasks.busy_fraction"] = ratio(compute_s, record.thread_seconds(*window))
    transfer_s = float(tasks["transfer_s"].fillna(0).sum())
    disk_s = float(tasks["disk_read_s"].fillna(0).sum() + tasks["disk_write_s"].fillna(0).sum())
    signals["tasks.transfer_share"] = ratio(transfer_s, compute_s + transfer_s)
    signals["tasks.disk_share"] = ratio(disk_s, compute_s)
    signals["tasks.typical_s"] = _typical(tasks)
    signals["tasks.median_s"] = _median(tasks)
    longest = float(tasks["max_s"].max()) if tasks["max_s"].notna().any() else None
    signals["tasks.longest_share"] = ratio(longest, wall)
    skew, prefix = _task_skew(tasks, wall)
    signals["tasks.task_skew"] = skew
    if prefix is not None and skew is not None and skew >= 5:
        signals["context.straggler"] = (f"task prefix {prefix} (longest task {skew:.1f}x its "
                                        "prefix's p95)")
    signals.update(_process_cpu(record, stage, _nthreads(record), compute_s, window))
    signals.update(_scheduler_load(record, stage, signals["tasks.count"],
                                   signals["tasks.median_s"]))
    signals.update(memory_signals(record, window))
    transfer, moved_estimate = _transfer(record, transfer_s)
    signals.update(transfer)
    signals.update(storage_signals(_fetched_bytes(record, stage), moved_estimate))
    top = tasks.groupby("prefix")["compute_s"].sum().sort_values(ascending=False)
    if not top.empty:
        signals["context.top_prefix"] = str(top.index[0])
    return signals


def diagnose_stage(record, stage: str, classes: Any = None) -> Diagnosis:
    """Diagnose one stage's bottleneck with :func:`classify` on :func:`stage_signals`.

    Parameters
    ----------
    record
        The run's :class:`~prefect_dask_profiling.summary.RunRecord`.
    stage
        A stage name present in ``record.tasks``.
    classes
        Only consider these classes (see :func:`classify`); default all.

    Raises
    ------
    ValueError
        For an unknown stage or an unknown class name.
    """
    allowed = check_classes(classes)
    verdict = classify(stage_signals(record, stage), classes=allowed)
    rows = [{k: e[k] for k in ("signal", "source", "value", "op", "threshold", "supports")}
            for e in verdict["signals"]]
    return Diagnosis(stage=stage, primary=verdict["primary"], secondary=verdict["secondary"],
                     confidence=verdict["confidence"],
                     agreeing_sources=verdict["agreeing_sources"], sources=verdict["sources"],
                     signals=rows, disagreements=verdict["disagreements"],
                     actions=verdict["actions"], note=verdict["note"])


def diagnose_run(record, classes: Any = None) -> tuple[dict[str, Diagnosis], list[str]]:
    """Diagnose every stage of a run; a stage that fails becomes a warning, not an error.

    Returns
    -------
    ``({stage: Diagnosis}, warnings)``.
    """
    allowed = check_classes(classes)
    out: dict[str, Diagnosis] = {}
    warnings: list[str] = []
    for stage in record.stages:
        try:
            out[str(stage)] = diagnose_stage(record, stage, allowed)
        except Exception as exc:  # one stage's odd record must not cost the others
            warnings.append(f"diagnosis of stage {stage!r} failed: {type(exc).__name__}: {exc}")
    return out, warnings


def _typical(tasks) -> float | None:
    """p50 of the prefix holding the median compute-second (time-weighted granularity)."""
    return _middle_p50(tasks, "compute_s")


def _median(tasks) -> float | None:
    """The median task's duration: the p50 of the prefix holding the middle task (by count)."""
    return _middle_p50(tasks, "tasks")


def _middle_p50(tasks, weight: str) -> float | None:
    """The p50 of the prefix in which half of ``weight`` (summed in p50 order) is reached."""
    p50 = tasks["p50_s"].to_numpy(dtype=float, na_value=np.nan)
    w = tasks[weight].to_numpy(dtype=float, na_value=np.nan)
    keep = ~(np.isnan(p50) | np.isnan(w))
    p50, w = p50[keep], w[keep]
    order = np.argsort(p50, kind="stable")
    total = float(w.sum())
    if not len(p50) or total <= 0:
        return None
    reached = np.cumsum(w[order]) >= total / 2
    return float(p50[order][np.argmax(reached)])


def _task_skew(tasks, wall: float) -> tuple[float | None, str | None]:
    """Largest ``max / p95`` over the stage's prefixes with enough tasks.

    A prefix counts only when its longest task is a material part of the stage
    (:data:`~prefect_dask_profiling.diagnosis.signals.MIN_STRAGGLER_SHARE` of its wall): a
    10 ms task preempted on a loaded host is far outside a tiny prefix's p95 and costs the
    stage nothing.
    """
    best: tuple[float | None, str | None] = (None, None)
    for prefix, n, p95, longest in zip(tasks["prefix"], tasks["tasks"], tasks["p95_s"],
                                       tasks["max_s"], strict=True):
        if not (n == n and p95 == p95 and longest == longest):  # NaN
            continue
        if n < MIN_SKEW_TASKS or p95 < 0.001 or longest < MIN_STRAGGLER_SHARE * wall:
            continue
        r = float(longest) / float(p95)
        if best[0] is None or r > best[0]:
            best = (r, str(prefix))
    return best


def _nthreads(record) -> dict[str, int]:
    w = record.workers
    if w is None or w.empty:
        return {}
    return {str(a): int(n) for a, n in zip(w["worker"], w["nthreads"].fillna(1), strict=True)}


def _process_cpu(record, stage: str, nthreads: dict[str, int], compute_s: float,
                 window: tuple[float, float]) -> Signals:
    """Process-CPU signals: from the workers' counters at the stage's boundaries, else
    from the system-monitor samples in its window.

    The counters give each worker process's CPU and its task threads' run-queue wait
    between the stage's opening and closing, however short the stage; CPU *wanted* (used +
    the tasks' wait for a core) per busy thread then tells a CPU-bound stage on a loaded
    host from one that waits. Samples carry
    CPU used only (``monitor.cpu_wait_measured = 0``).
    """
    io = record.io
    rows = None
    if io is not None and not io.empty and "cpu_s" in io.columns:
        rows = record.stage_rows("io", stage).dropna(subset=["cpu_s"])
    if rows is None or rows.empty:
        out = monitor_signals(sampled_cpu_seconds(record.samples, window), nthreads,
                              compute_s, window[1] - window[0])
        out["monitor.cpu_wait_measured"] = 0.0
        return out
    per_worker = rows.groupby("worker")
    cpu = {str(w): float(g["cpu_s"].sum()) for w, g in per_worker}
    wanted = None
    if "task_wait_s" in rows.columns and rows["task_wait_s"].notna().all():
        wanted = {str(w): float(g["cpu_s"].sum() + g["task_wait_s"].sum())
                  for w, g in per_worker}
    seconds = float(per_worker["seconds"].sum().max())
    out = monitor_signals(cpu, nthreads, compute_s, seconds, wanted)
    out["monitor.cpu_wait_measured"] = 1.0 if wanted is not None else 0.0
    return out


def _scheduler_load(record, stage: str, tasks: int, median_s: float | None) -> Signals:
    """Scheduler-load signals from the event loop's CPU while the stage ran (``{}`` without,
    or below :data:`MIN_SCHEDULER_TASKS` tasks).

    ``scheduler.cpu_per_task_s`` is the loop's CPU per task of the stage, against the median
    task (``scheduler.overhead_ratio``); ``scheduler.loop_busy`` its CPU plus run-queue wait
    per second: the time the loop wanted a core.
    """
    entry = (record.scheduler or {}).get(stage)
    if not entry or not entry.get("seconds") or tasks < MIN_SCHEDULER_TASKS:
        return {}
    cpu = float(entry.get("loop_cpu_s") or 0.0)
    wanted = cpu + float(entry.get("loop_wait_s") or 0.0)
    per_task = cpu / tasks
    return {"scheduler.cpu_s": cpu, "scheduler.cpu_per_task_s": per_task,
            "scheduler.overhead_ratio": ratio(per_task, median_s),
            "scheduler.loop_busy": min(wanted / float(entry["seconds"]), 1.0)}


def _fetched_bytes(record, stage: str) -> float | None:
    """Bytes the stage's tasks fetched from storage (GDAL + s3fs), or None when not counted."""
    io = record.io
    if io is None or io.empty:
        return None
    columns = [c for c in ("gdal_bytes", "s3fs_bytes") if c in io.columns]
    if not columns:
        return None
    rows = record.stage_rows("io", stage)
    if rows.empty:
        return None
    return float(rows[columns].apply(pd.to_numeric, errors="coerce").fillna(0).to_numpy().sum())


ALL_RECEIVING = 0.999
"""Share of the run's receiving seconds a stage must hold for the run's transfer log to be
its own (every transfer of the run went to this stage's tasks)."""


def _transfer(record, stage_transfer_s: float) -> tuple[Signals, float | None]:
    """The stage's own transfer figures, and an estimate of the MB it received.

    Attributed by the receiving task's stage (see the module docstring): none received,
    nothing moved (``0``, which rules transfer out); all of the run's receiving seconds in
    this stage, the run's transfer log is the stage's own; otherwise the stage's bytes and
    payload sizes are not known and are left out — never the run's figures, which a stage
    with a little transfer time would otherwise inherit (issue 35). The second value is the
    MB the stage received estimated by its share of the run's receiving seconds: only the
    storage-request share uses it (fetched bytes against bytes from other workers), no
    transfer rule does. ``({}, None)`` when the run has no transfer log.
    """
    if stage_transfer_s <= 0:
        return {"transfer.mb_moved": 0.0, "transfer.mb_per_transfer": 0.0}, 0.0
    t = record.transfers
    if t is None or t.empty:
        return {}, None
    count = float(t["count"].fillna(0).sum())
    nbytes = float(t["bytes"].fillna(0).sum())
    run_transfer_s = float(record.tasks["transfer_s"].fillna(0).sum())
    if count <= 0 or nbytes <= 0 or run_transfer_s <= 0:
        return {}, None
    share = min(stage_transfer_s / run_transfer_s, 1.0)
    if share < ALL_RECEIVING:
        return {}, nbytes / 1e6 * share
    return ({"transfer.mb_moved": nbytes / 1e6, "transfer.mb_per_transfer": nbytes / 1e6 / count},
            nbytes / 1e6)
