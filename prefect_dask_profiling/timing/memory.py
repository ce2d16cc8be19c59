"""The memory streams: periodic worker samples, and each stage's memory while it ran.

Standard library only (shipped by value with the scheduler plugin). Memory is bounded: a ring
of raw samples, one aggregate per worker, at most ``MAX_STAGE_MEMORY`` (stage, worker) rows
and one spill count per stage.

At each sample every stage that is running (a task of it is processing, or one finished
since the previous sample) gets each worker's sample folded into its per-(stage, worker)
peaks, and the bytes Dask spilled to / read back from disk since the previous sample
(cluster-wide: Dask does not report them per worker).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling.timing.scope import RunScope

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import StageSpill

MAX_STAGE_MEMORY = 20_000  # (stage, worker) rows of per-stage memory
MAX_SAMPLES = 20_000  # raw worker samples kept for per-stage summaries (a ring)

Sample = tuple[float, str, int, int, int, float]
"""``(time, worker, managed, unmanaged, spilled, cpu)``: one raw worker sample."""


@dataclass(slots=True)
class WorkerStats:
    """One worker's memory and CPU over the periodic samples (its last sample included)."""

    host: str
    nthreads: int
    memory_limit: int
    last_time: float
    samples: int = 0
    peak_managed: int = 0
    sum_managed: float = 0.0
    peak_unmanaged: int = 0
    sum_unmanaged: float = 0.0
    peak_spilled: int = 0
    peak_cpu: float = 0.0
    sum_cpu: float = 0.0
    peak_process: int = 0
    last_process: int = 0
    last_managed: int = 0

    def add(self, now: float, process: int, managed: int, unmanaged: int, spilled: int,
            cpu: float) -> None:
        """Fold one sample in."""
        self.samples += 1
        self.peak_managed = max(self.peak_managed, managed)
        self.sum_managed += managed
        self.peak_unmanaged = max(self.peak_unmanaged, unmanaged)
        self.sum_unmanaged += unmanaged
        self.peak_spilled = max(self.peak_spilled, spilled)
        self.peak_cpu = max(self.peak_cpu, cpu)
        self.sum_cpu += cpu
        self.peak_process = max(self.peak_process, process)
        self.last_process = process
        self.last_managed = managed
        self.last_time = now

    def to_dict(self) -> dict[str, Any]:
        """The snapshot's entry of this worker: its fields."""
        return {"host": self.host, "nthreads": self.nthreads, "samples": self.samples,
                "peak_managed": self.peak_managed, "sum_managed": self.sum_managed,
                "peak_unmanaged": self.peak_unmanaged, "sum_unmanaged": self.sum_unmanaged,
                "peak_spilled": self.peak_spilled, "peak_cpu": self.peak_cpu,
                "sum_cpu": self.sum_cpu, "memory_limit": self.memory_limit,
                "peak_process": self.peak_process, "last_process": self.last_process,
                "last_managed": self.last_managed, "last_time": self.last_time}


@dataclass(slots=True)
class StageMemory:
    """One worker's memory while one stage ran: peaks over the samples in its window.

    ``start_process`` / ``start_managed`` are the worker's process memory and managed bytes
    when the stage started (the sample before the stage's first one: what the process
    carried in from before the stage). Process memory comes with heartbeats: a reading that
    reached the scheduler before that sample (``since``) is the process as it was before the
    stage, however late it is sampled, so it raises the start level, not
    ``own_peak_process`` (the peak of the readings that arrived while the stage ran).
    ``peak_process`` keeps every reading (headroom is about the process, whenever).
    """

    memory_limit: int
    first: float
    last: float
    start_process: int = 0
    start_managed: int = 0
    since: float = 0.0
    samples: int = 0
    own_peak_process: int = 0
    peak_process: int = 0
    peak_managed: int = 0
    peak_unmanaged: int = 0
    peak_spilled: int = 0

    def add(self, now: float, process: int, managed: int, unmanaged: int,
            spilled: int, seen: float | None = None) -> None:
        """Fold one sample in; ``seen`` is when its process reading reached the scheduler."""
        self.samples += 1
        self.last = now
        if seen is not None and seen <= self.since:
            if process > self.start_process:  # a reading from before the stage
                self.start_process = process
        elif process > self.own_peak_process:
            self.own_peak_process = process
        if process > self.peak_process:
            self.peak_process = process
        if managed > self.peak_managed:
            self.peak_managed = managed
        if unmanaged > self.peak_unmanaged:
            self.peak_unmanaged = unmanaged
        if spilled > self.peak_spilled:
            self.peak_spilled = spilled

    def row(self, stage: str, worker: str) -> dict[str, Any]:
        """The snapshot's row of this (stage, worker): its fields but ``since``."""
        return {"stage": stage, "worker": worker,
                "samples": self.samples, "memory_limit": self.memory_limit,
                "start_process": self.start_process, "start_managed": self.start_managed,
                "own_peak_process": self.own_peak_process, "peak_process": self.peak_process,
                "peak_managed": self.peak_managed,
                "peak_unmanaged": self.peak_unmanaged, "peak_spilled": self.peak_spilled,
                "first": self.first, "last": self.last}


@dataclass(slots=True)
class SpillBytes:
    """Bytes Dask spilled to disk and read back while one stage ran (all workers)."""

    written: int = 0
    read: int = 0


class MemorySampler:
    """Worker samples, per-worker aggregates, and memory and spill per running stage.

    Parameters
    ----------
    scope
        The run recorded, shared with the other streams.
    """

    def __init__(self, scope: RunScope) -> None:
        self.scope = scope
        #: the latest raw samples (a ring: the oldest are dropped)
        self.samples: collections.deque[Sample] = collections.deque(maxlen=MAX_SAMPLES)
        #: samples ever taken (those dropped from the ring included)
        self.samples_taken = 0
        #: worker address -> its aggregate
        self.workers: dict[str, WorkerStats] = {}
        #: (stage, worker) -> the worker's memory while the stage ran
        self.stage_memory: dict[tuple[str, str], StageMemory] = {}
        #: stage -> bytes spilled and read back while it ran
        self.stage_spill: dict[str, SpillBytes] = {}
        #: cluster-wide (written, read) disk bytes at the last sample
        self.spill_totals: tuple[float, float] | None = None

    def sample(self, now: float, stages: set[str]) -> None:
        """Sample every worker once and fold it into ``stages``, which ran since the last."""
        for addr, ws in self.scope.scheduler.workers.items():
            mem = ws.memory
            cpu = float((ws.metrics or {}).get("cpu") or 0.0)
            managed, unmanaged, spilled = mem.managed, mem.unmanaged, mem.spilled
            process = mem.process
            self.samples.append((now, addr, managed, unmanaged, spilled, cpu))
            agg = self.workers.get(addr)
            if agg is None:
                agg = self.workers[addr] = WorkerStats(ws.host, ws.nthreads,
                                                       ws.memory_limit or 0, now)
            # the level before this sample: a stage first seen now started from it
            start = ((agg.last_process, agg.last_managed) if agg.samples
                     else (max(process - managed, 0), 0))
            since = agg.last_time if agg.samples else now
            seen = getattr(ws, "last_seen", None)  # when the process reading arrived
            agg.add(now, process, managed, unmanaged, spilled, cpu)
            self.samples_taken += 1
            for stage in stages:
                self._stage_sample(stage, addr, ws, now, (process, managed, unmanaged, spilled),
                                   start, since, seen)
        self._spill_sample(stages)

    def stage_memory_rows(self) -> list[dict[str, Any]]:
        """The snapshot's ``stage_memory``: one row per (stage, worker)."""
        return [m.row(s, w) for (s, w), m in self.stage_memory.items()]

    def stage_spill_rows(self) -> dict[str, StageSpill]:
        """The snapshot's ``stage_spill``: bytes per stage."""
        return {s: {"disk_write_bytes": b.written, "disk_read_bytes": b.read}
                for s, b in self.stage_spill.items()}

    def worker_rows(self) -> dict[str, dict[str, Any]]:
        """The snapshot's ``workers``: one aggregate per worker address."""
        return {a: v.to_dict() for a, v in self.workers.items()}

    def _stage_sample(self, stage: str, addr: str, ws: Any, now: float,
                      reading: tuple[int, int, int, int], start: tuple[int, int],
                      since: float, seen: float | None) -> None:
        """Fold one sample into ``stage``'s memory on ``addr``.

        ``reading`` is (process, managed, unmanaged, spilled); ``start`` the worker's
        process memory and managed bytes at its previous sample (without one, this sample's
        unmanaged bytes and nothing managed), kept as the stage's start level when this is
        the stage's first sample there, with ``since``, the time of that previous sample;
        ``seen`` is when the worker's process reading reached the scheduler.
        """
        entry = self.stage_memory.get((stage, addr))
        if entry is None:
            if len(self.stage_memory) >= MAX_STAGE_MEMORY:
                self.scope.warn_once("per-stage memory",
                                     f"more than {MAX_STAGE_MEMORY} (stage, worker) pairs:"
                                     " per-stage memory of the others was not kept")
                return
            entry = self.stage_memory[(stage, addr)] = StageMemory(
                ws.memory_limit or 0, now, now, start[0], start[1], since)
        entry.add(now, *reading, seen)

    def _spill_sample(self, stages: Iterable[str]) -> None:
        """Add the bytes spilled to / read back from disk since the last sample to ``stages``.

        Workers report them in their heartbeats' fine metrics, which the scheduler adds up
        cluster-wide (``cumulative_worker_metrics``: O(contexts x prefixes) keys).
        """
        metrics = getattr(self.scope.scheduler, "cumulative_worker_metrics", None)
        if metrics is None:
            return
        written = read = 0.0
        for key, value in list(metrics.items()):
            if type(key) is tuple and len(key) >= 3 and key[-1] == "bytes":
                if key[-2] == "disk-write":
                    written += value
                elif key[-2] == "disk-read":
                    read += value
        previous = self.spill_totals
        self.spill_totals = (written, read)
        if previous is None:
            return
        d_written, d_read = written - previous[0], read - previous[1]
        if d_written <= 0 and d_read <= 0:
            return
        for stage in stages:
            entry = self.stage_spill.get(stage)
            if entry is None:
                entry = self.stage_spill[stage] = SpillBytes()
            entry.written += int(max(d_written, 0))
            entry.read += int(max(d_read, 0))
