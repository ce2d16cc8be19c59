"""The run record: what one run's :class:`~prefect_dask_profiling.timing.plugin.TaskTimings` saw.

A :class:`RunRecord` is built from the plugin's plain-data snapshot on the client side and
holds pandas tables: per-(stage, prefix) task stats, orchestration (wrapper) tasks, workers,
worker samples and transfers, plus the thread-count timeline used for utilisation.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from prefect_dask_profiling.timing.sketch import QuantileSketch

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import (
        Incident,
        PrefixRow,
        Snapshot,
        StageScheduler,
        WorkerLifetime,
    )

TASK_COLUMNS = ["stage", "prefix", "tasks", "errors", "reruns", "compute_s", "p50_s", "p95_s",
                "max_s", "nbytes", "max_nbytes", "transfer_s", "disk_read_s", "disk_write_s",
                "first_start", "last_stop"]
WORKER_COLUMNS = ["worker", "host", "nthreads", "samples", "peak_managed", "mean_managed",
                  "peak_unmanaged", "mean_unmanaged", "peak_spilled", "peak_cpu", "mean_cpu",
                  "memory_limit"]
SAMPLE_COLUMNS = ["time", "worker", "managed", "unmanaged", "spilled", "cpu"]
IO_COLUMNS = ["stage", "worker", "chunks", "decoded_bytes"]
TRANSFER_COLUMNS = ["source", "destination", "count", "seconds", "bytes"]
MEMORY_COLUMNS = ["stage", "worker", "samples", "memory_limit", "peak_process", "peak_managed",
                  "peak_unmanaged", "peak_spilled", "start_process", "start_managed",
                  "own_peak_process", "headroom"]


@dataclass
class RunRecord:
    """Everything one run recorded, as tables.

    Attributes
    ----------
    tasks
        One row per (stage, prefix) of compute tasks (``TASK_COLUMNS``).
    orchestration
        The same for the time wrapper tasks spent waiting on the Dask work they launched
        (``compute_s`` is waiting, not work); a wrapper's own work is in ``tasks``.
    workers, samples, transfers
        Per-worker aggregates, raw worker samples, per-pair transfers.
    timeline
        ``(time, total threads)`` changes, for thread-seconds over any window.
    memory
        One row per (stage, worker) (``MEMORY_COLUMNS``): the worker's peak process,
        managed, unmanaged and spilled bytes over the samples taken while the stage ran,
        its process memory and managed bytes when the stage started (``start_process``,
        ``start_managed``), the peak of the process readings that arrived while it ran
        (``own_peak_process``; all three 0 in older runs),
        its memory limit and ``headroom = (limit - peak process) / limit``.
    spill
        Per stage: ``disk_write_bytes`` and ``disk_read_bytes`` Dask spilled to and read
        back from disk while it ran (all workers; stages that overlap share them).
    incidents
        Workers that left while tasks of the run were processing on them
        (:class:`~prefect_dask_profiling.timing.types.Incident`).
    scheduler
        Per stage: the scheduler's event-loop CPU, run-queue wait and sampled seconds while
        it ran (:class:`~prefect_dask_profiling.timing.types.StageScheduler`).
    lifetimes
        Each worker's stay (:class:`~prefect_dask_profiling.timing.types.WorkerLifetime`):
        what the cluster allocated (:mod:`prefect_dask_profiling.cost.allocation`).
    """

    name: str
    started: float
    collected: float
    tasks: pd.DataFrame
    orchestration: pd.DataFrame
    workers: pd.DataFrame
    samples: pd.DataFrame
    transfers: pd.DataFrame
    timeline: list[tuple[float, int]]
    n_workers: int = 0
    threads: int = 0
    warnings: list[str] = field(default_factory=list)
    internal_errors: int = 0
    incomplete: bool = False
    sketches: dict[tuple[str, str], QuantileSketch] = field(default_factory=dict, repr=False)
    # storage requests per (stage, worker) (summary.io.io_frame); empty when not counted
    io: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=IO_COLUMNS),
                             repr=False)
    memory: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MEMORY_COLUMNS))
    spill: dict[str, dict[str, int]] = field(default_factory=dict)
    incidents: list[Incident] = field(default_factory=list)
    scheduler: dict[str, StageScheduler] = field(default_factory=dict)
    # each worker's arrival and departure (timing.types.WorkerLifetime); empty in old runs
    lifetimes: list[WorkerLifetime] = field(default_factory=list)
    # (frame, {stage: rows}) per table name: each table split by stage once (stage_rows)
    _split: dict[str, tuple[pd.DataFrame, dict[str, pd.DataFrame]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    # (tasks frame, its stage names in order of first execution)
    _order: tuple[pd.DataFrame, list[str]] | None = field(
        default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, workers: int = 0,
                      threads: int = 0) -> RunRecord:
        """Build a record from :func:`prefect_dask_profiling.timing.client.snapshot` output."""
        warnings = list(snap.get("warnings", []))
        if snap.get("internal_errors"):
            last = (snap.get("last_error") or "").strip().splitlines()[-1:] or ["unknown"]
            warnings.append(f"plugin hit {snap['internal_errors']} internal error(s) and "
                            f"skipped those events; last: {last[0]}")
        if snap.get("samples_dropped"):
            warnings.append(f"{snap['samples_dropped']} early worker samples dropped from the "
                            "ring (per-worker peaks and means still cover the whole run)")
        sketches = {(r["stage"], r["prefix"]): QuantileSketch.from_dict(r["sketch"])
                    for r in snap.get("tasks", []) if r.get("sketch")}
        if snap.get("lifetimes_dropped"):
            warnings.append(f"{snap['lifetimes_dropped']} worker arrival(s) not kept (too "
                            "many in one run): allocated worker-hours are a lower bound")
        if snap.get("incidents_dropped"):
            warnings.append(f"{snap['incidents_dropped']} worker incident(s) not kept "
                            "(too many in one run)")
        transfers, overflowed = _transfers(snap)
        if overflowed:
            warnings.append("transfer log overflowed on " + ", ".join(sorted(overflowed)) +
                            ": transfer bytes are a lower bound")
        return cls(
            name=snap["name"], started=snap["started"], collected=snap["collected"],
            tasks=_task_frame(snap.get("tasks", [])),
            orchestration=_task_frame(snap.get("orchestration", [])),
            workers=_worker_frame(snap.get("workers", {})),
            samples=pd.DataFrame(snap.get("samples", []), columns=SAMPLE_COLUMNS),
            transfers=transfers,
            timeline=[(float(t), int(n)) for t, n in snap.get("timeline", [])],
            n_workers=workers, threads=threads, warnings=warnings,
            internal_errors=int(snap.get("internal_errors", 0)),
            incomplete=bool(snap.get("incomplete")), sketches=sketches,
            memory=_memory_frame(snap.get("stage_memory", [])),
            spill={str(k): {"disk_write_bytes": int(v.get("disk_write_bytes", 0)),
                            "disk_read_bytes": int(v.get("disk_read_bytes", 0))}
                   for k, v in (snap.get("stage_spill") or {}).items()},
            incidents=[dict(i) for i in snap.get("incidents", [])],
            scheduler={str(k): dict(v) for k, v in (snap.get("stage_scheduler") or {}).items()},
            lifetimes=[dict(x) for x in snap.get("lifetimes") or []])

    # -- windows -------------------------------------------------------------------------

    def stage_rows(self, table: str, stage: str) -> pd.DataFrame:
        """The rows of one stage in table ``table`` (``"tasks"``, ``"io"``, ``"memory"``...).

        Each table is split by stage once (a boolean filter per stage costs a pass over
        every column, per stage and per caller), and again when the attribute is given
        another frame; tables are not changed in place once the record is built.
        """
        frame = getattr(self, table)
        cached = self._split.get(table)
        if cached is None or cached[0] is not frame:
            groups = ({str(k): g for k, g in frame.groupby("stage", sort=False)}
                      if "stage" in frame.columns and not frame.empty else {})
            cached = self._split[table] = (frame, groups)
        rows = cached[1].get(str(stage))
        return rows if rows is not None else frame.iloc[0:0]

    def window(self, stage: str | None = None) -> tuple[float, float] | None:
        """First compute start and last compute stop (of one stage, or of the run)."""
        t = self.tasks if stage is None else self.stage_rows("tasks", stage)
        first = t["first_start"].to_numpy(dtype=float, na_value=np.nan)
        last = t["last_stop"].to_numpy(dtype=float, na_value=np.nan)
        both = ~(np.isnan(first) | np.isnan(last))  # rows with both ends (no frame copied)
        if not both.any():
            return None
        return float(first[both].min()), float(last[both].max())

    def thread_seconds(self, start: float, stop: float) -> float:
        """Thread-seconds available between ``start`` and ``stop``, as workers came and went."""
        if stop <= start or not self.timeline:
            return 0.0
        times = [t for t, _ in self.timeline]
        i = max(bisect.bisect_right(times, start) - 1, 0)
        total, t0 = 0.0, start
        for j in range(i, len(self.timeline)):
            t_next = self.timeline[j + 1][0] if j + 1 < len(self.timeline) else stop
            t1 = min(max(t_next, t0), stop)
            total += (t1 - t0) * self.timeline[j][1]
            t0 = t1
            if t0 >= stop:
                break
        return total

    @property
    def stages(self) -> list[str]:
        """Stage names in order of first execution (found once per ``tasks`` frame)."""
        cached = self._order
        if cached is None or cached[0] is not self.tasks:
            t = self.tasks
            first = pd.to_numeric(t["first_start"], errors="coerce").to_numpy(dtype=float)
            order = np.argsort(np.where(np.isnan(first), np.inf, first), kind="stable")
            names = t["stage"].to_numpy(dtype=object)[order]
            cached = self._order = (t, list(dict.fromkeys(names)))
        return list(cached[1])


def _task_frame(rows: list[PrefixRow]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=TASK_COLUMNS)
    for col in TASK_COLUMNS[2:]:
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def _memory_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=[*MEMORY_COLUMNS[:-1]])
    for col in MEMORY_COLUMNS[2:-1]:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").fillna(0).astype("int64")
    limit = frame["memory_limit"].where(frame["memory_limit"] > 0)
    frame["headroom"] = (limit - frame["peak_process"]) / limit
    return frame.sort_values(["stage", "worker"], kind="stable").reset_index(drop=True)


def _worker_frame(workers: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for addr, w in workers.items():
        n = max(w.get("samples", 0), 1)
        rows.append({"worker": addr, "host": w.get("host"), "nthreads": w.get("nthreads"),
                     "samples": w.get("samples", 0), "peak_managed": w.get("peak_managed", 0),
                     "mean_managed": w.get("sum_managed", 0) / n,
                     "peak_unmanaged": w.get("peak_unmanaged", 0),
                     "mean_unmanaged": w.get("sum_unmanaged", 0) / n,
                     "peak_spilled": w.get("peak_spilled", 0), "peak_cpu": w.get("peak_cpu", 0),
                     "mean_cpu": w.get("sum_cpu", 0) / n,
                     "memory_limit": w.get("memory_limit", 0)})
    return pd.DataFrame(rows, columns=WORKER_COLUMNS)


def _transfers(snap: Snapshot) -> tuple[pd.DataFrame, list[str]]:
    pairs: dict[tuple[str, str], dict[str, float]] = {}
    for row in snap.get("transfers", []):
        pairs[(row["source"], row["destination"])] = {
            "count": row["count"], "seconds": row["seconds"], "bytes": 0}
    overflowed = []
    for worker, info in (snap.get("transfer_bytes") or {}).items():
        if info.get("overflowed"):
            overflowed.append(worker)
        for who, total, _duration in info.get("entries", []):
            entry = pairs.setdefault((who, worker), {"count": 0, "seconds": 0.0, "bytes": 0})
            entry["bytes"] += total or 0
    rows = [{"source": a, "destination": b, **v} for (a, b), v in pairs.items()]
    return pd.DataFrame(rows, columns=TRANSFER_COLUMNS), overflowed
