"""The cluster's workers: their lifetimes and threads over time, and the incidents.

Standard library only (shipped by value with the scheduler plugin); every list is bounded
(``MAX_TIMELINE``, ``MAX_LIFETIMES``, ``MAX_INCIDENTS``).

An *incident* is a worker that left while tasks of this run were processing on it, without a
clean retire or close (Dask's ``remove-worker`` event with ``expected=False``), with its last
memory sample, and the nanny's report when it restarted the worker for memory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling.timing.scope import RunScope

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.memory import WorkerStats
    from prefect_dask_profiling.timing.types import Incident, WorkerLifetime

MAX_TIMELINE = 10_000
MAX_INCIDENTS = 100
MAX_LIFETIMES = 10_000  # worker arrivals kept (adaptive clusters come and go)
MAX_INCIDENT_KEYS = 20
# A worker whose last sample was at least this fraction of its memory limit when it died is
# a suspected OOM (Dask pauses a worker at 80% by default and its nanny kills it at 95%;
# samples lag the heartbeat, so the last one is usually below the kill point).
NEAR_LIMIT = 0.8


class WorkerLifetimes:
    """Each worker's stay (arrival to departure) and the cluster's threads over time.

    Parameters
    ----------
    scope
        The run recorded, shared with the other streams.
    """

    def __init__(self, scope: RunScope) -> None:
        self.scope = scope
        #: (time, threads connected): a point at every arrival and departure
        self.timeline: list[tuple[float, int]] = []
        #: one entry per worker arrival
        self.lifetimes: list[WorkerLifetime] = []
        #: address -> its open entry in :attr:`lifetimes`
        self.open: dict[str, WorkerLifetime] = {}
        #: arrivals not kept (over ``MAX_LIFETIMES``)
        self.dropped = 0

    def record_threads(self) -> None:
        """Add the threads connected now to the timeline (its first point is kept)."""
        scheduler = self.scope.scheduler
        if scheduler is None:
            return
        nthreads = sum(ws.nthreads for ws in scheduler.workers.values())
        if len(self.timeline) >= MAX_TIMELINE:
            self.timeline.pop(1)
        self.timeline.append((time.time(), nthreads))

    def record_present(self, started: float) -> None:
        """Open a lifetime for every worker connected at registration (``add_worker`` is
        not called for them): it started at the scheduler's ``add-worker`` event for it
        when that is still in the event log, else at ``started`` (``start_known`` says
        which)."""
        for addr in list(self.scope.scheduler.workers):
            arrived = self._arrival_event(addr)
            self.arrived(addr, arrived if arrived is not None else started,
                         start_known=arrived is not None)

    def arrived(self, addr: str | None, now: float, start_known: bool = True) -> None:
        """Open a lifetime for ``addr`` with its threads, memory limit and name."""
        if addr is None or addr in self.open:
            return
        scheduler = self.scope.scheduler
        ws = scheduler.workers.get(addr) if scheduler is not None else None
        if ws is None:
            return
        if len(self.lifetimes) >= MAX_LIFETIMES:
            self.dropped += 1
            return
        entry: WorkerLifetime = {
            "worker": addr, "name": str(ws.name), "nthreads": int(ws.nthreads),
            "memory_limit": int(ws.memory_limit or 0), "arrived": now,
            "departed": None, "start_known": start_known,
            "resources": {str(k): float(v)
                          for k, v in (getattr(ws, "resources", None) or {}).items()}}
        self.lifetimes.append(entry)
        self.open[addr] = entry

    def departed(self, addr: str | None, now: float) -> None:
        """Close the open lifetime of ``addr`` (if it arrived while we watched)."""
        entry = self.open.pop(addr, None) if addr is not None else None
        if entry is not None:
            entry["departed"] = now

    def rows(self) -> list[WorkerLifetime]:
        """The snapshot's ``lifetimes`` (copies: open ones still change)."""
        return [entry.copy() for entry in self.lifetimes]

    def _arrival_event(self, addr: str) -> float | None:
        """When the scheduler logged the worker's latest ``add-worker`` event, or None."""
        get_events = getattr(self.scope.scheduler, "get_events", None)
        if get_events is None:
            return None
        for stamp, msg in reversed(get_events(addr)):
            if isinstance(msg, dict) and msg.get("action") == "add-worker":
                return float(stamp)
        return None


@dataclass(slots=True)
class MemoryKill:
    """The nanny's report of a worker it restarted for exceeding its memory budget."""

    time: float
    rss: int | None
    pid: int | None


class Incidents:
    """Workers that died with this run's work on them, classified (suspected OOM or not).

    Parameters
    ----------
    scope
        The run recorded, shared with the other streams.
    """

    def __init__(self, scope: RunScope) -> None:
        self.scope = scope
        #: the incidents, oldest first
        self.incidents: list[Incident] = []
        #: incidents not kept (over ``MAX_INCIDENTS``)
        self.dropped = 0
        #: worker -> the nanny's latest report (at most ``MAX_INCIDENTS`` workers)
        self.memory_kills: dict[str, MemoryKill] = {}

    def memory_kill(self, msg: Mapping[str, Any]) -> None:
        """The nanny restarted a worker for exceeding its memory budget."""
        worker = msg.get("worker")
        if not isinstance(worker, str):
            return
        report = MemoryKill(time.time(), msg.get("rss"), msg.get("pid"))
        if len(self.memory_kills) >= MAX_INCIDENTS and worker not in self.memory_kills:
            self.memory_kills.pop(next(iter(self.memory_kills)))
        self.memory_kills[worker] = report
        for incident in reversed(self.incidents):  # the report may come after the removal
            if incident["worker"] == worker:
                _classify(incident, report)
                break

    def worker_removed(self, msg: Mapping[str, Any], last: WorkerStats | None) -> None:
        """Record an incident when a worker left unexpectedly while running our tasks.

        ``last`` is the worker's aggregate of memory samples (``None`` if never sampled).
        """
        if msg.get("expected"):
            return  # retire_workers, scale-down: Dask moved its data and tasks on purpose
        scope = self.scope
        status = getattr(getattr(scope.scheduler, "status", None), "name", "running")
        if status not in ("running", "init"):
            return  # the scheduler is closing: every worker leaves
        ours: list[tuple[str, str, str]] = []
        for key in msg.get("processing-tasks") or ():
            ts = scope.task(key)
            stage = scope.owner_stage(ts)
            if stage is not None:
                ours.append((stage, scope.prefix(key, ts), str(key)))
        if not ours:
            return
        if len(self.incidents) >= MAX_INCIDENTS:
            self.dropped += 1
            return
        worker = str(msg.get("worker"))
        incident: Incident = {
            "worker": worker, "time": time.time(),
            "stages": sorted({s for s, _, _ in ours}),
            "prefixes": sorted({p for _, p, _ in ours}),
            "keys": sorted(k for _, _, k in ours)[:MAX_INCIDENT_KEYS],
            "n_keys": len(ours),
            "last_process": last.last_process if last is not None else None,
            "last_sample_time": last.last_time if last is not None else None,
            "memory_limit": last.memory_limit if last is not None else None,
            "stimulus_id": msg.get("stimulus_id"),
            "kind": "worker lost", "reason": "", "nanny_rss": None,
        }
        _classify(incident, self.memory_kills.get(worker))
        self.incidents.append(incident)

    def rows(self) -> list[Incident]:
        """The snapshot's ``incidents`` (copies: a late nanny report reclassifies one)."""
        return [incident.copy() for incident in self.incidents]


def _classify(incident: Incident, report: MemoryKill | None) -> None:
    """``suspected OOM`` when the nanny said so or the last sample was near the limit."""
    limit = incident.get("memory_limit") or 0
    last = incident.get("last_process") or 0
    how = f"({incident.get('stimulus_id') or 'no stimulus id'})"
    if report is not None:
        incident["kind"] = "suspected OOM"
        incident["nanny_rss"] = report.rss
        incident["reason"] = ("the nanny restarted it for exceeding its memory budget "
                              f"(rss {report.rss} bytes) {how}")
    elif limit and last >= NEAR_LIMIT * limit:
        incident["kind"] = "suspected OOM"
        incident["reason"] = (f"its last memory sample was {last / limit:.0%} of its "
                              f"limit {how}")
    else:
        incident["kind"] = "worker lost"
        share = f"{last / limit:.0%} of its limit" if limit else "no limit known"
        incident["reason"] = f"connection lost; last memory sample {share} {how}"
