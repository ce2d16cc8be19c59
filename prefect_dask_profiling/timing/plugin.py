"""Scheduler-side task timings: the ``TaskTimings`` scheduler plugin.

This module runs inside someone else's scheduler, so it imports nothing but the standard
library and ``distributed``; it is registered by value, so the scheduler does not need this
package installed. Its memory is bounded by stages x prefixes (plus a bounded ring of worker
samples), never by the number of tasks, and no hook ever raises into the scheduler: internal
errors are counted and reported with the snapshot.

Five streams are recorded:

1. tasks, aggregated per ``(stage, prefix)``: counts, errors, reruns, compute / transfer /
   disk seconds from ``startstops``, bytes out (and the largest single result), and a
   quantile sketch of compute seconds;
2. workers: periodic samples of managed / unmanaged / spilled memory and CPU;
3. memory per stage: at each sample, every stage that is running (a task of it is
   processing, or one finished since the previous sample) gets each worker's sample folded
   into its per-(stage, worker) peaks, and the bytes Dask spilled to / read back from disk
   since the previous sample (cluster-wide: Dask does not report them per worker);
4. transfers: count and seconds per ``(source, destination)`` pair (bytes are collected
   worker-side, see :func:`snapshot`);
5. incidents: a worker that left while tasks of this run were processing on it, without a
   clean retire or close (Dask's ``remove-worker`` event with ``expected=False``), with its
   last memory sample, and the nanny's report when it restarted the worker for memory.

Tasks that launch Dask work of their own and wait for it (a Prefect task that computes a
collection) are *wrappers*: their compute interval covers the work they wait on. When the
launching task is known (the Prefect task runner tags inner graphs with the ``profiling_parent``
annotation), the wrapper's interval is split: the union of the intervals in which it waited on
its inner work (from an inner graph's arrival to the scheduler learning that the last of its
tasks finished) is *orchestration* time, aggregated apart and kept out of compute totals, and
the rest is the wrapper's own work, counted like any task. Untagged tasks that secede
(``worker_client``) are counted as orchestration whole, as their own work cannot be told
apart.

Counting rule: ``tasks`` counts every task run that finished, erred ones included, and the
seconds (``compute_s``, quantiles, ``max_s``) cover the same runs; ``errors`` says how many of
those runs failed.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from prefect_dask_profiling.timing.cpu import thread_cpu
from prefect_dask_profiling.timing.sketch import QuantileSketch

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.timing.types import Snapshot

logger = logging.getLogger(__name__)

STAGE_ANNOTATION = "stage"
RUN_ANNOTATION = "profiling_run"
PARENT_ANNOTATION = "profiling_parent"
DEFAULT_STAGE = "default"
MAX_TIMELINE = 10_000
MAX_WRAPPERS = 10_000
MAX_STAGE_MEMORY = 20_000  # (stage, worker) rows of per-stage memory
MAX_INCIDENTS = 100
MAX_LIFETIMES = 10_000  # worker arrivals kept (adaptive clusters come and go)
MAX_INCIDENT_KEYS = 20
MAX_PROCESSING_SCAN = 64  # tasks looked at per worker and sample to find running stages
MAX_STAGES = 1_000  # stages with scheduler-load entries
LOOP_SAMPLE_GAP = 0.05  # seconds between event-loop samples taken outside the periodic one
# A worker whose last sample was at least this fraction of its memory limit when it died is
# a suspected OOM (Dask pauses a worker at 80% by default and its nanny kills it at 95%;
# samples lag the heartbeat, so the last one is usually below the kill point).
NEAR_LIMIT = 0.8
# v2: listeners are told (key, run_id) after the scheduler accepted the message; a scheduler
# that still runs an older plugin's wrapper keeps it under the old name, untouched
_LONG_RUNNING_HOOK = "_dask_profiling_long_running_listeners_v2"
_NOT_DONE = ("waiting", "queued", "no-worker")


class PrefixStats:
    """Running aggregates of one ``(stage, prefix)``."""

    __slots__ = ("tasks", "errors", "reruns", "compute_s", "max_s", "nbytes", "max_nbytes",
                 "transfer_s", "disk_read_s", "disk_write_s", "sketch", "first_start",
                 "last_stop")

    def __init__(self) -> None:
        self.tasks = 0
        self.errors = 0
        self.reruns = 0
        self.compute_s = 0.0
        self.max_s = 0.0
        self.nbytes = 0
        self.max_nbytes = 0
        self.transfer_s = 0.0
        self.disk_read_s = 0.0
        self.disk_write_s = 0.0
        self.sketch = QuantileSketch()
        self.first_start = float("inf")
        self.last_stop = float("-inf")

    def to_dict(self) -> dict[str, Any]:
        seen = self.first_start != float("inf")
        return {
            "tasks": self.tasks, "errors": self.errors, "reruns": self.reruns,
            "compute_s": self.compute_s,
            "p50_s": self.sketch.quantile(0.5) if self.sketch.n else None,
            "p95_s": self.sketch.quantile(0.95) if self.sketch.n else None,
            "max_s": self.max_s, "nbytes": self.nbytes, "max_nbytes": self.max_nbytes,
            "transfer_s": self.transfer_s,
            "disk_read_s": self.disk_read_s, "disk_write_s": self.disk_write_s,
            "first_start": self.first_start if seen else None,
            "last_stop": self.last_stop if seen else None,
            "sketch": self.sketch.to_dict(),
        }


class StageMemory:
    """One worker's memory while one stage ran: peaks over the samples in its window, and
    ``start_process`` / ``start_managed``, the worker's process memory and managed bytes
    when the stage started (the sample before the stage's first one: what the process
    carried in from before the stage). Process memory comes with heartbeats: a reading that
    reached the scheduler before that sample (``since``) is the process as it was before the
    stage, however late it is sampled, so it raises the start level, not
    ``own_peak_process`` (the peak of the readings that arrived while the stage ran).
    ``peak_process`` keeps every reading (headroom is about the process, whenever)."""

    __slots__ = ("samples", "memory_limit", "start_process", "start_managed", "since",
                 "own_peak_process", "peak_process", "peak_managed", "peak_unmanaged",
                 "peak_spilled", "first", "last")

    def __init__(self, memory_limit: int, now: float, start: tuple[int, int] = (0, 0),
                 since: float = 0.0) -> None:
        self.samples = 0
        self.memory_limit = memory_limit
        self.start_process, self.start_managed = start
        self.since = since
        self.own_peak_process = 0
        self.peak_process = 0
        self.peak_managed = 0
        self.peak_unmanaged = 0
        self.peak_spilled = 0
        self.first = now
        self.last = now

    def add(self, now: float, process: int, managed: int, unmanaged: int,
            spilled: int, seen: float | None = None) -> None:
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

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "memory_limit": self.memory_limit,
                "start_process": self.start_process, "start_managed": self.start_managed,
                "own_peak_process": self.own_peak_process, "peak_process": self.peak_process,
                "peak_managed": self.peak_managed,
                "peak_unmanaged": self.peak_unmanaged, "peak_spilled": self.peak_spilled,
                "first": self.first, "last": self.last}


class WrapperWait:
    """How long one running wrapper task has waited on the inner work it launched.

    Inner tasks are counted, not listed: ``pending`` is the number of inner tasks not yet
    finished. While it is above zero the wrapper is waiting; the open interval starts when
    an inner graph arrives and ends when the scheduler learns that the last pending inner
    task finished. Overlapping batches merge into one interval, so ``waited`` is the length
    of the union of the waiting intervals.
    """

    __slots__ = ("pending", "start", "end", "waited", "graphs")

    def __init__(self) -> None:
        self.pending = 0
        self.start = 0.0
        self.end = 0.0
        self.waited = 0.0
        self.graphs = 0

    def arrived(self, n: int, now: float) -> None:
        """``n`` new inner tasks were submitted at ``now``."""
        if self.pending <= 0:
            self.start = max(now, self.end)
            self.end = self.start
        self.pending += n
        self.graphs += 1

    def done(self, now: float) -> None:
        """One inner task finished (or was cancelled) at ``now``."""
        if self.pending <= 0:
            return
        self.pending -= 1
        if now > self.end:
            self.end = now
        if self.pending == 0:
            self.waited += self.end - self.start

    def total(self) -> float:
        """Seconds waited so far; an interval still open counts up to its last completion."""
        return self.waited + (self.end - self.start if self.pending > 0 else 0.0)


class TaskTimings(SchedulerPlugin):
    """Record per-(stage, prefix) task timings, worker samples and transfers.

    Parameters
    ----------
    name
        Unique plugin name; one per run, so runs sharing a cluster never mix.
    owner_client
        Id of the client that owns this run. Graphs submitted by it are tagged with the
        run, tasks of other runs are ignored, and the plugin removes itself when this
        client disconnects. ``None`` records every task on the scheduler.
    sample_interval
        Seconds between worker memory / CPU samples; ``0`` disables sampling.
    max_samples
        Size of the ring of raw worker samples kept for per-stage summaries.
    installer
        Id of the client that installed the plugin: when it disconnects the plugin stops
        and removes itself. Defaults to ``owner_client``; ``None`` keeps the plugin until
        it is uninstalled or the scheduler closes.
    """

    idempotent = False

    def __init__(self, name: str = "task-timings", owner_client: str | None = None,
                 sample_interval: float = 1.0, max_samples: int = 20_000, *,
                 installer: str | None = None) -> None:
        self.name = name
        self.owner_client = owner_client
        self.installer = installer or owner_client
        self.sample_interval = sample_interval
        self.max_samples = max_samples
        self._reset()
        self.scheduler = None
        self._pc = None
        self._key_split = None

    def _reset(self) -> None:
        self.stats: dict[tuple[str, str], PrefixStats] = {}
        self.orchestration: dict[tuple[str, str], PrefixStats] = {}
        self.transfers: dict[tuple[str, str], list[float]] = {}
        self.workers: dict[str, dict[str, float]] = {}
        self.samples: collections.deque = collections.deque(maxlen=self.max_samples)
        self.samples_taken = 0
        self.timeline: list[tuple[float, int]] = []
        self.warnings: list[str] = []
        self.internal_errors = 0
        self.last_error: str | None = None
        self.seceded: dict = {}  # key -> run_id of the run that seceded (validated)
        self.wrappers: dict = {}  # running wrapper key -> WrapperWait
        self.stage_memory: dict[tuple[str, str], StageMemory] = {}
        self.stage_spill: dict[str, list[int]] = {}  # stage -> [bytes written, bytes read]
        # stage -> [loop cpu s, loop run-queue wait s, seconds sampled, wait known (0/1)]
        self.stage_loop: dict[str, list[float]] = {}
        self.loop_last: tuple[float, float, float | None] | None = None
        self.loop_thread: int | None = None
        self.spill_totals: tuple[float, float] | None = None  # cluster-wide, last sample
        self.last_sample_time = 0.0
        self.incidents: list[dict[str, Any]] = []
        self.incidents_dropped = 0
        self.memory_kills: dict[str, dict[str, Any]] = {}  # worker -> nanny's report
        # one entry per worker arrival: name, nthreads, memory_limit, arrived, departed
        self.lifetimes: list[dict[str, Any]] = []
        self._open_lifetimes: dict[str, dict[str, Any]] = {}  # address -> its open entry
        self.lifetimes_dropped = 0
        self.started = time.time()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["scheduler"] = None
        state["_pc"] = None
        state["_key_split"] = None
        return state

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self.started = time.time()
        try:
            self._record_threads()
            self._record_present_workers()
            self._check_late_registration()
            self._listen_long_running()
            if self.sample_interval and self.sample_interval > 0:
                from tornado.ioloop import PeriodicCallback

                self._pc = PeriodicCallback(self._sample_workers, self.sample_interval * 1000)
                self._pc.start()
                self._sample_workers()
        except Exception:
            self._fail()

    async def close(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._pc is not None:
            self._pc.stop()
            self._pc = None
        listeners = getattr(self.scheduler, _LONG_RUNNING_HOOK, None)
        if listeners is not None:
            listeners.pop(self.name, None)

    def remove_client(self, scheduler, client: str) -> None:
        if self.installer is None or client != self.installer:
            return
        try:
            self._stop()
            if scheduler.plugins.get(self.name) is self:
                del scheduler.plugins[self.name]
        except Exception:
            self._fail()

    # -- hooks -----------------------------------------------------------------------------

    def update_graph(self, scheduler, *, client: str = "", tasks=(), annotations=None,
                     **kwargs: Any) -> None:
        try:
            parents = (annotations or {}).get(PARENT_ANNOTATION)
            if parents:
                self._inner_arrived(parents)
            if self.loop_last is not None and time.time() - self.loop_last[0] >= LOOP_SAMPLE_GAP:
                self._loop_sample(self._running_stages(self.loop_last[0]))  # a stage's start
        except Exception:
            self._fail()
        if self.owner_client is None or client != self.owner_client:
            return
        try:
            all_tasks = scheduler.tasks
            for key in tasks:
                ts = all_tasks.get(key)
                if ts is None:
                    continue
                if ts.annotations is None:
                    ts.annotations = {RUN_ANNOTATION: self.name}
                else:
                    ts.annotations.setdefault(RUN_ANNOTATION, self.name)
        except Exception:
            self._fail()

    def transition(self, key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing":
            try:
                if finish == "memory":
                    self._finished(key, kwargs, erred=False)
                elif finish == "erred":
                    self._finished(key, kwargs, erred=True)
                elif finish == "released":
                    self.seceded.pop(key, None)
                    self.wrappers.pop(key, None)
                    self._released(key, start)
            except Exception:
                self._fail()
        elif start == "memory" and finish == "released":
            try:
                self._released(key, start)
            except Exception:
                self._fail()
        elif self.wrappers and ((finish == "erred" and start != "memory")
                                or (finish == "released" and start in _NOT_DONE)):
            try:  # an inner task that will not run: erred upstream, or cancelled
                ts = self._task(key)
                if finish == "erred" or not (ts is None or ts.who_wants or ts.waiters):
                    self._inner_done(ts)
            except Exception:
                self._fail()

    def add_worker(self, scheduler=None, worker: str | None = None) -> None:
        try:
            self._record_threads()
            self._worker_arrived(worker, time.time())
        except Exception:
            self._fail()

    def remove_worker(self, scheduler=None, worker: str | None = None, *args: Any,
                      **kwargs: Any) -> None:
        # Called after the worker's tasks were released: the keys it was running are read
        # from Dask's ``remove-worker`` event instead (see :meth:`log_event`).
        try:
            self._record_threads()
            self._worker_departed(worker, time.time())
        except Exception:
            self._fail()

    def log_event(self, topic, msg, *args: Any, **kwargs: Any) -> None:
        """Watch for workers leaving with tasks on them, and the nanny's memory kills."""
        if topic != "all" and topic != "worker-restart-memory":
            return
        try:
            if not isinstance(msg, dict):
                return
            if topic == "worker-restart-memory":
                self._memory_kill(msg)
            elif msg.get("action") == "remove-worker":
                self._worker_removed(msg)
        except Exception:
            self._fail()

    # -- internals -------------------------------------------------------------------------

    def _fail(self) -> None:
        self.internal_errors += 1
        self.last_error = traceback.format_exc(limit=3)
        logger.debug("TaskTimings internal error", exc_info=True)

    def _task(self, key):
        """The scheduler's ``TaskState`` of ``key``, or ``None`` (no scheduler, unknown key)."""
        return self.scheduler.tasks.get(key) if self.scheduler is not None else None

    def _owner_stage(self, ts) -> str | None:
        """The task's stage, or ``None`` when the task belongs to another run."""
        annotations = (ts.annotations if ts is not None else None) or {}
        if self.owner_client is not None and annotations.get(RUN_ANNOTATION) != self.name:
            return None
        return annotations.get(STAGE_ANNOTATION) or DEFAULT_STAGE

    def _prefix(self, key, ts) -> str:
        if ts is not None:
            return ts.prefix.name
        split = self._key_split
        if split is None:
            # dask's key_split is lru-cached over 100k keys: tens of MiB that would grow
            # with the task count up to that bound, so use the uncached function.
            from dask.utils import key_split

            split = self._key_split = getattr(key_split, "__wrapped__", key_split)
        return split(key)

    def _stats_for(self, key, ts, table: dict) -> PrefixStats | None:
        """The aggregates ``key`` adds to (``ts`` is its TaskState or ``None``)."""
        stage = self._owner_stage(ts)
        if stage is None:
            return None
        ident = (stage, self._prefix(key, ts))
        stats = table.get(ident)
        if stats is None:
            stats = table[ident] = PrefixStats()
        return stats

    def _released(self, key, start: str) -> None:
        """Count a rerun when a running or finished task is released but still wanted.

        That is what a worker death (or a retry) does: the task is still wanted by a
        client or a dependent, so it will run again. Tasks released because nobody needs
        them any more (intermediates, cancelled futures) are not reruns.
        """
        ts = self._task(key)
        if ts is None:
            return
        wanted = bool(ts.who_wants or ts.waiters)
        if self.wrappers:
            if wanted and start == "memory":
                self._inner_rerun(ts)  # its wrapper waits for it again
            elif not wanted and start == "processing":
                self._inner_done(ts)  # cancelled while running
        if not wanted:
            return
        stats = self._stats_for(key, ts, self.stats)
        if stats is not None:
            stats.reruns += 1

    # -- wrappers: tasks that launch inner work and wait for it ------------------------------

    def _inner_arrived(self, parents: dict) -> None:
        """New inner tasks arrived: ``parents`` maps each new task's key to its wrapper's.

        A wrapper is tracked only while the scheduler has it processing, so a stale or
        made-up parent never creates state, and the state is dropped when it leaves
        processing: memory is bounded by the wrappers running at once.
        """
        now = time.time()
        counts: dict = {}
        for parent in parents.values():
            counts[parent] = counts.get(parent, 0) + 1
        for parent, n in counts.items():
            wait = self.wrappers.get(parent)
            if wait is None:
                ts = self._task(parent)
                if ts is None or ts.state != "processing":
                    continue
                if len(self.wrappers) >= MAX_WRAPPERS:
                    if not any("wrapper tasks" in w for w in self.warnings):
                        self.warnings.append(
                            f"more than {MAX_WRAPPERS} wrapper tasks ran at once: the waits of "
                            "the others were counted as their own work")
                    continue
                wait = self.wrappers[parent] = WrapperWait()
            wait.arrived(n, now)

    def _wait_of(self, ts) -> WrapperWait | None:
        annotations = ts.annotations if ts is not None else None
        if not annotations:
            return None
        parent = annotations.get(PARENT_ANNOTATION)
        return None if parent is None else self.wrappers.get(parent)

    def _inner_done(self, ts) -> None:
        wait = self._wait_of(ts)
        if wait is not None:
            wait.done(time.time())

    def _inner_rerun(self, ts) -> None:
        wait = self._wait_of(ts)
        if wait is not None:
            wait.arrived(1, time.time())

    def _finished(self, key, kwargs: dict, erred: bool) -> None:
        ts = self._task(key)
        seceded_run = self.seceded.pop(key, None)
        wait = self.wrappers.pop(key, None) if self.wrappers else None
        if self.wrappers:
            self._inner_done(ts)
        if wait is not None and wait.graphs:
            self._finished_wrapper(key, ts, kwargs, erred, wait)
            return
        seceded = seceded_run is not None and (ts is None or ts.run_id == seceded_run)
        table = self.orchestration if seceded else self.stats
        stats = self._stats_for(key, ts, table)
        if stats is not None:
            compute, first, last = self._add_startstops(stats, kwargs)
            self._count(stats, compute, first, last, erred, kwargs.get("nbytes"))

    def _finished_wrapper(self, key, ts, kwargs: dict, erred: bool, wait: WrapperWait) -> None:
        """Split a wrapper's compute into its own work and the time it waited on inner work."""
        own = self._stats_for(key, ts, self.stats)
        if own is None:
            return
        compute, first, last = self._add_startstops(own, kwargs)
        waited = min(max(wait.total(), 0.0), compute)
        self._count(own, compute - waited, first, last, erred, kwargs.get("nbytes"))
        orchestration = self._stats_for(key, ts, self.orchestration)
        self._count(orchestration, waited, first, last, erred, 0)

    def _add_startstops(self, stats: PrefixStats, kwargs: dict) -> tuple[float, float, float]:
        """Add transfers and disk time; return compute seconds and the compute interval."""
        compute = 0.0
        first, last = float("inf"), float("-inf")
        worker = kwargs.get("worker")
        for ss in kwargs.get("startstops") or ():
            action = ss.get("action")
            start, stop = ss["start"], ss["stop"]
            duration = stop - start
            if action == "compute":
                compute += duration
                if start < first:
                    first = start
                if stop > last:
                    last = stop
            elif action == "transfer":
                stats.transfer_s += duration
                pair = (ss.get("source") or "?", worker or "?")
                entry = self.transfers.get(pair)
                if entry is None:
                    self.transfers[pair] = [1, duration]
                else:
                    entry[0] += 1
                    entry[1] += duration
            elif action == "disk-read":
                stats.disk_read_s += duration
            elif action == "disk-write":
                stats.disk_write_s += duration
        return compute, first, last

    @staticmethod
    def _count(stats: PrefixStats, compute: float, first: float, last: float, erred: bool,
               nbytes) -> None:
        """Count one finished run (erred ones too) and its compute seconds."""
        stats.tasks += 1
        if erred:
            stats.errors += 1
        elif nbytes:
            stats.nbytes += nbytes
            if nbytes > stats.max_nbytes:
                stats.max_nbytes = nbytes
        if first < stats.first_start:
            stats.first_start = first
        if last > stats.last_stop:
            stats.last_stop = last
        stats.compute_s += compute
        if compute > stats.max_s:
            stats.max_s = compute
        stats.sketch.add(compute)

    def _record_threads(self) -> None:
        if self.scheduler is None:
            return
        nthreads = sum(ws.nthreads for ws in self.scheduler.workers.values())
        if len(self.timeline) >= MAX_TIMELINE:
            self.timeline.pop(1)
        self.timeline.append((time.time(), nthreads))

    # -- worker lifetimes: what the cluster allocated ----------------------------------------

    def _record_present_workers(self) -> None:
        """Open a lifetime for every worker connected at registration (``add_worker`` is
        not called for them): it started at the scheduler's ``add-worker`` event for it
        when that is still in the event log, else now (``start_known`` says which)."""
        for addr in list(self.scheduler.workers):
            arrived = self._arrival_event(addr)
            self._worker_arrived(addr, arrived if arrived is not None else self.started,
                                 start_known=arrived is not None)

    def _arrival_event(self, addr: str) -> float | None:
        """When the scheduler logged the worker's latest ``add-worker`` event, or None."""
        get_events = getattr(self.scheduler, "get_events", None)
        if get_events is None:
            return None
        for stamp, msg in reversed(get_events(addr)):
            if isinstance(msg, dict) and msg.get("action") == "add-worker":
                return float(stamp)
        return None

    def _worker_arrived(self, addr: str | None, now: float, start_known: bool = True) -> None:
        """Open a lifetime for ``addr`` with its threads, memory limit and name."""
        if addr is None or addr in self._open_lifetimes:
            return
        ws = self.scheduler.workers.get(addr) if self.scheduler is not None else None
        if ws is None:
            return
        if len(self.lifetimes) >= MAX_LIFETIMES:
            self.lifetimes_dropped += 1
            return
        entry = {"worker": addr, "name": str(ws.name), "nthreads": int(ws.nthreads),
                 "memory_limit": int(ws.memory_limit or 0), "arrived": now,
                 "departed": None, "start_known": start_known,
                 "resources": {str(k): float(v)
                               for k, v in (getattr(ws, "resources", None) or {}).items()}}
        self.lifetimes.append(entry)
        self._open_lifetimes[addr] = entry

    def _worker_departed(self, addr: str | None, now: float) -> None:
        """Close the open lifetime of ``addr`` (if it arrived while we watched)."""
        entry = self._open_lifetimes.pop(addr, None) if addr is not None else None
        if entry is not None:
            entry["departed"] = now

    def _check_late_registration(self) -> None:
        busy = 0
        for ts in self.scheduler.tasks.values():
            if ts.state not in ("processing", "memory"):
                continue
            if self.owner_client is not None and not any(
                    cs.client_key == self.owner_client for cs in ts.who_wants or ()):
                continue
            busy += 1
        if busy:
            self.warnings.append(
                f"plugin registered after work started: {busy} task(s) were already processing "
                "or in memory and their timings are missing; register before submitting work")

    def _listen_long_running(self) -> None:
        """Learn which tasks secede (orchestration tasks) from the scheduler's handler.

        The scheduler's own handler runs first and drops stale messages (unknown worker,
        released key, a run that is not the current one); a key is recorded only if the
        scheduler then holds it as long-running, and with the run id it seceded in, so a
        later rerun of the same key is not taken for orchestration.
        """
        scheduler = self.scheduler
        listeners = getattr(scheduler, _LONG_RUNNING_HOOK, None)
        if listeners is None:
            handler = scheduler.stream_handlers.get("long-running")
            if handler is None:
                self.warnings.append("scheduler has no long-running handler: seceding tasks "
                                     "cannot be told apart from compute")
                return
            listeners = {}
            setattr(scheduler, _LONG_RUNNING_HOOK, listeners)

            def long_running(*args: Any, key=None, **kwargs: Any):
                result = handler(*args, key=key, **kwargs)
                try:
                    run_id = _accepted_long_running(scheduler, key, kwargs)
                    if run_id is not None:
                        for plugin in list(listeners.values()):
                            plugin.seceded[key] = run_id
                except Exception:  # never break the scheduler's handler
                    pass
                return result

            scheduler.stream_handlers["long-running"] = long_running
        listeners[self.name] = self

    def _sample_workers(self) -> None:
        try:
            now = time.time()
            stages = self._running_stages()
            for addr, ws in self.scheduler.workers.items():
                mem = ws.memory
                cpu = float((ws.metrics or {}).get("cpu") or 0.0)
                managed, unmanaged, spilled = mem.managed, mem.unmanaged, mem.spilled
                process = mem.process
                self.samples.append((now, addr, managed, unmanaged, spilled, cpu))
                agg = self.workers.get(addr)
                if agg is None:
                    agg = self.workers[addr] = {
                        "host": ws.host, "nthreads": ws.nthreads, "samples": 0,
                        "peak_managed": 0, "sum_managed": 0.0, "peak_unmanaged": 0,
                        "sum_unmanaged": 0.0, "peak_spilled": 0, "peak_cpu": 0.0,
                        "sum_cpu": 0.0, "memory_limit": ws.memory_limit or 0,
                        "peak_process": 0, "last_process": 0, "last_managed": 0,
                        "last_time": now}
                # the level before this sample: a stage first seen now started from it
                start = ((agg["last_process"], agg.get("last_managed", 0)) if agg["samples"]
                         else (max(process - managed, 0), 0))
                since = agg["last_time"] if agg["samples"] else now
                seen = getattr(ws, "last_seen", None)  # when the process reading arrived
                agg["samples"] += 1
                agg["peak_managed"] = max(agg["peak_managed"], managed)
                agg["sum_managed"] += managed
                agg["peak_unmanaged"] = max(agg["peak_unmanaged"], unmanaged)
                agg["sum_unmanaged"] += unmanaged
                agg["peak_spilled"] = max(agg["peak_spilled"], spilled)
                agg["peak_cpu"] = max(agg["peak_cpu"], cpu)
                agg["sum_cpu"] += cpu
                agg["peak_process"] = max(agg.get("peak_process", 0), process)
                agg["last_process"] = process
                agg["last_managed"] = managed
                agg["last_time"] = now
                self.samples_taken += 1
                for stage in stages:
                    self._stage_sample(stage, addr, ws, now, process, managed, unmanaged,
                                       spilled, start, since, seen)
            self._spill_sample(stages)
            self._loop_sample(stages)
            self.last_sample_time = now
        except Exception:
            self._fail()

    def _running_stages(self, since: float | None = None) -> set[str]:
        """Stages of this run that ran since the previous sample.

        A stage runs while a task of it is processing (a bounded look at each worker's
        processing tasks: they are few with Dask's queuing) or when one of its tasks
        finished since the previous sample. Cost: O(workers + stages x prefixes), nothing
        per task.
        """
        stages: set[str] = set()
        for ws in self.scheduler.workers.values():
            for i, ts in enumerate(ws.processing):
                if i >= MAX_PROCESSING_SCAN:
                    break
                stage = self._owner_stage(ts)
                if stage is not None:
                    stages.add(stage)
        since = self.last_sample_time if since is None else since
        for (stage, _prefix), stats in self.stats.items():
            if stats.last_stop >= since:
                stages.add(stage)
        return stages

    def _stage_sample(self, stage: str, addr: str, ws, now: float, process: int,
                      managed: int, unmanaged: int, spilled: int,
                      start: tuple[int, int], since: float, seen: float | None) -> None:
        """Fold one sample into ``stage``'s memory on ``addr``; ``start`` is the worker's
        process memory and managed bytes at its previous sample (without one, this sample's
        unmanaged bytes and nothing managed), kept as the stage's start level when this is
        the stage's first sample there, with ``since``, the time of that previous sample;
        ``seen`` is when the worker's process reading reached the scheduler."""
        entry = self.stage_memory.get((stage, addr))
        if entry is None:
            if len(self.stage_memory) >= MAX_STAGE_MEMORY:
                if not any("per-stage memory" in w for w in self.warnings):
                    self.warnings.append(f"more than {MAX_STAGE_MEMORY} (stage, worker) pairs:"
                                         " per-stage memory of the others was not kept")
                return
            entry = self.stage_memory[(stage, addr)] = StageMemory(ws.memory_limit or 0, now,
                                                                   start, since)
        entry.add(now, process, managed, unmanaged, spilled, seen)

    def _spill_sample(self, stages: set[str]) -> None:
        """Add the bytes spilled to / read back from disk since the last sample to ``stages``.

        Workers report them in their heartbeats' fine metrics, which the scheduler adds up
        cluster-wide (``cumulative_worker_metrics``: O(contexts x prefixes) keys).
        """
        metrics = getattr(self.scheduler, "cumulative_worker_metrics", None)
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
                entry = self.stage_spill[stage] = [0, 0]
            entry[0] += int(max(d_written, 0))
            entry[1] += int(max(d_read, 0))

    def _loop_sample(self, stages: set[str]) -> None:
        """Add the event loop's CPU (and run-queue wait) since the last sample to ``stages``.

        Called on the event loop only (the periodic sampler, graph arrivals, snapshots), so
        the thread's CPU is the loop's: the scheduler's own work for the tasks it schedules.
        Every stage running in the interval gets the whole interval; stages that overlap
        share it.
        """
        tid = threading.get_native_id()
        if self.loop_thread is None:
            self.loop_thread = tid
        elif tid != self.loop_thread:
            return  # not the event loop: its CPU would be another thread's
        now = time.time()
        cpu, wait = thread_cpu()
        previous, self.loop_last = self.loop_last, (now, cpu, wait)
        if previous is None:
            return
        seconds, d_cpu = now - previous[0], cpu - previous[1]
        d_wait = wait - previous[2] if wait is not None and previous[2] is not None else None
        for stage in stages:
            entry = self.stage_loop.get(stage)
            if entry is None:
                if len(self.stage_loop) >= MAX_STAGES:
                    continue
                entry = self.stage_loop[stage] = [0.0, 0.0, 0.0, 1.0]
            entry[0] += max(d_cpu, 0.0)
            entry[1] += max(d_wait or 0.0, 0.0)
            entry[2] += max(seconds, 0.0)
            if d_wait is None:
                entry[3] = 0.0

    # -- incidents: workers that died with work on them ------------------------------------

    def _memory_kill(self, msg: dict) -> None:
        """The nanny restarted a worker for exceeding its memory budget."""
        worker = msg.get("worker")
        if not isinstance(worker, str):
            return
        report = {"time": time.time(), "rss": msg.get("rss"), "pid": msg.get("pid")}
        if len(self.memory_kills) >= MAX_INCIDENTS and worker not in self.memory_kills:
            self.memory_kills.pop(next(iter(self.memory_kills)))
        self.memory_kills[worker] = report
        for incident in reversed(self.incidents):  # the report may come after the removal
            if incident["worker"] == worker:
                self._classify(incident, report)
                break

    def _worker_removed(self, msg: dict) -> None:
        """Record an incident when a worker left unexpectedly while running our tasks."""
        if msg.get("expected"):
            return  # retire_workers, scale-down: Dask moved its data and tasks on purpose
        status = getattr(getattr(self.scheduler, "status", None), "name", "running")
        if status not in ("running", "init"):
            return  # the scheduler is closing: every worker leaves
        keys = msg.get("processing-tasks") or ()
        ours: list[tuple[str, str, str]] = []
        for key in keys:
            ts = self._task(key)
            stage = self._owner_stage(ts)
            if stage is not None:
                ours.append((stage, self._prefix(key, ts), str(key)))
        if not ours:
            return
        if len(self.incidents) >= MAX_INCIDENTS:
            self.incidents_dropped += 1
            return
        worker = str(msg.get("worker"))
        agg = self.workers.get(worker) or {}
        incident: dict[str, Any] = {
            "worker": worker, "time": time.time(),
            "stages": sorted({s for s, _, _ in ours}),
            "prefixes": sorted({p for _, p, _ in ours}),
            "keys": sorted(k for _, _, k in ours)[:MAX_INCIDENT_KEYS],
            "n_keys": len(ours),
            "last_process": agg.get("last_process"),
            "last_sample_time": agg.get("last_time"),
            "memory_limit": agg.get("memory_limit"),
            "stimulus_id": msg.get("stimulus_id"),
            "kind": "worker lost", "reason": "", "nanny_rss": None,
        }
        report = self.memory_kills.get(worker)
        self._classify(incident, report)
        self.incidents.append(incident)

    @staticmethod
    def _classify(incident: dict[str, Any], report: dict[str, Any] | None) -> None:
        """``suspected OOM`` when the nanny said so or the last sample was near the limit."""
        limit = incident.get("memory_limit") or 0
        last = incident.get("last_process") or 0
        how = f"({incident.get('stimulus_id') or 'no stimulus id'})"
        if report is not None:
            incident["kind"] = "suspected OOM"
            incident["nanny_rss"] = report.get("rss")
            incident["reason"] = ("the nanny restarted it for exceeding its memory budget "
                                  f"(rss {report.get('rss')} bytes) {how}")
        elif limit and last >= NEAR_LIMIT * limit:
            incident["kind"] = "suspected OOM"
            incident["reason"] = (f"its last memory sample was {last / limit:.0%} of its "
                                  f"limit {how}")
        else:
            incident["kind"] = "worker lost"
            share = f"{last / limit:.0%} of its limit" if limit else "no limit known"
            incident["reason"] = f"connection lost; last memory sample {share} {how}"

    # -- read-out --------------------------------------------------------------------------

    def _cluster_size(self) -> dict[str, int]:
        """The workers connected now and their threads (what ``Client.nthreads`` would say,
        without its round trip)."""
        workers = list(self.scheduler.workers.values()) if self.scheduler is not None else []
        return {"workers": len(workers), "threads": sum(ws.nthreads for ws in workers)}

    def snapshot(self) -> dict[str, Any]:
        """Everything recorded so far, as plain data (cheap: O(stages x prefixes + samples))."""
        def rows(table: dict) -> list[dict[str, Any]]:
            return [{"stage": s, "prefix": p, **st.to_dict()} for (s, p), st in table.items()]

        if self.scheduler is not None:
            try:  # the loop's CPU up to now: a stage that just closed gets its last part
                since = self.loop_last[0] if self.loop_last is not None else None
                self._loop_sample(self._running_stages(since))
            except Exception:
                self._fail()

        return {
            "name": self.name, "started": self.started, "collected": time.time(),
            "tasks": rows(self.stats), "orchestration": rows(self.orchestration),
            "transfers": [{"source": a, "destination": b, "count": int(c), "seconds": s}
                          for (a, b), (c, s) in self.transfers.items()],
            "workers": {a: dict(v) for a, v in self.workers.items()},
            "samples": list(self.samples),
            "samples_dropped": max(0, self.samples_taken - len(self.samples)),
            "timeline": list(self.timeline),
            "stage_memory": [{"stage": s, "worker": w, **m.to_dict()}
                             for (s, w), m in self.stage_memory.items()],
            "stage_spill": {s: {"disk_write_bytes": w, "disk_read_bytes": r}
                            for s, (w, r) in self.stage_spill.items()},
            "stage_scheduler": {s: {"loop_cpu_s": c, "loop_wait_s": w if known else None,
                                    "seconds": t}
                                for s, (c, w, t, known) in self.stage_loop.items()},
            "cluster": self._cluster_size(),
            "incidents": [dict(i) for i in self.incidents],
            "incidents_dropped": self.incidents_dropped,
            "lifetimes": [dict(entry) for entry in self.lifetimes],
            "lifetimes_dropped": self.lifetimes_dropped,
            "warnings": list(self.warnings),
            "internal_errors": self.internal_errors, "last_error": self.last_error,
        }


def _accepted_long_running(scheduler, key, message: dict):
    """The run id of ``key`` if the scheduler accepted its long-running message, else None."""
    ts = scheduler.tasks.get(key)
    ws = ts.processing_on if ts is not None else None
    if ws is None or ts not in ws.long_running:
        return None
    if message.get("worker", ws.address) != ws.address:
        return None
    run_id = message.get("run_id", ts.run_id)
    return run_id if run_id == ts.run_id else None


# -- client API ------------------------------------------------------------------------------


def _register_by_value() -> None:
    """Send this module (and the sketch) by value: the scheduler need not have us installed."""
    import cloudpickle

    import prefect_dask_profiling.timing.cpu as cpu_module
    import prefect_dask_profiling.timing.sketch as sketch_module

    for module in (cpu_module, sketch_module, __import__(__name__, fromlist=["_"])):
        if module.__name__ not in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.register_pickle_by_value(module)


def install(client: Client, name: str | None = None, *, scope: str = "cluster",
            sample_interval: float = 1.0, max_samples: int = 20_000) -> str:
    """Register a fresh :class:`TaskTimings` on the client's scheduler.

    Parameters
    ----------
    client
        A connected synchronous ``distributed.Client``.
    name
        Plugin name; a unique ``task-timings-<hex>`` by default.
    scope
        ``"cluster"`` records every task on the scheduler (a cluster of your own);
        ``"run"`` records only this client's graphs and work tagged with the run (a
        shared cluster, see :func:`prefect_dask_profiling.stage.stage`).
    sample_interval
        Seconds between worker samples.

    Returns
    -------
    The plugin name, for :func:`~prefect_dask_profiling.summary.collect` and
    :func:`uninstall`. The plugin stops and removes itself when ``client`` disconnects, so
    collect before closing the client.
    """
    import uuid

    if scope not in ("cluster", "run"):
        raise ValueError(f"scope must be 'cluster' or 'run', got {scope!r}")
    if sample_interval < 0:
        raise ValueError(f"sample_interval must be >= 0, got {sample_interval!r}")
    name = name or f"task-timings-{uuid.uuid4().hex[:12]}"
    owner = client.id if scope == "run" else None
    _register_by_value()
    plugin = TaskTimings(name, owner, sample_interval, max_samples, installer=client.id)
    client.register_plugin(plugin, name=name)
    return name


def _snapshot(dask_scheduler, name: str) -> dict[str, Any] | None:
    plugin = dask_scheduler.plugins.get(name)
    return None if plugin is None else plugin.snapshot()


def _task_counts(dask_scheduler, name: str) -> dict[str, dict[str, int]] | None:
    plugin = dask_scheduler.plugins.get(name)
    if plugin is None:
        return None
    out: dict[str, dict[str, int]] = {}
    for (stage, prefix), stats in list(plugin.stats.items()):
        out.setdefault(str(stage), {})[str(prefix)] = int(stats.tasks)
    return out


def task_counts(client: Client, name: str) -> dict[str, dict[str, int]]:
    """Tasks finished so far per stage and prefix (the live ETA's progress): one small read
    on the scheduler, O(stages x prefixes), far lighter than :func:`snapshot`."""
    _register_by_value()
    counts = client.run_on_scheduler(_task_counts, name=name)
    if counts is None:
        raise KeyError(f"no TaskTimings plugin named {name!r} on the scheduler")
    return counts


def _incoming_transfers(dask_worker, since: float) -> dict[str, Any]:
    log = dask_worker.transfer_incoming_log
    entries = [(e.get("who"), e.get("total", 0), e.get("duration", 0.0))
               for e in log if e.get("start", 0) >= since]
    overflowed = log.maxlen is not None and len(log) == log.maxlen and (
        len(log) > 0 and log[0].get("start", 0) > since)
    return {"entries": entries, "overflowed": overflowed}


def snapshot(client: Client, name: str) -> Snapshot:
    """The raw snapshot of plugin ``name`` (plain data), with worker-side transfer bytes."""
    _register_by_value()
    snap = client.run_on_scheduler(_snapshot, name=name)
    if snap is None:
        raise KeyError(f"no TaskTimings plugin named {name!r} on the scheduler "
                       "(never installed, or removed when its client disconnected)")
    try:
        snap["transfer_bytes"] = client.run(_incoming_transfers, since=snap["started"])
    except Exception as exc:  # a dying worker must not cost the summary
        snap["transfer_bytes"] = {}
        snap["warnings"].append(f"transfer bytes not collected from workers: {exc!r}")
    return snap


def cluster_size(client: Client, snap: Snapshot) -> tuple[int, int]:
    """(workers, threads) connected when ``snap`` was taken; asked of the scheduler when
    the snapshot does not say (a plugin of an earlier version), ``(0, 0)`` if that fails."""
    size = snap.get("cluster")
    if size is not None:
        return int(size["workers"]), int(size["threads"])
    try:
        nthreads = client.nthreads()
    except Exception:
        return 0, 0
    return len(nthreads), sum(nthreads.values())


def _remove(dask_scheduler, name: str) -> bool:
    plugin = dask_scheduler.plugins.pop(name, None)
    if plugin is not None:
        plugin._stop()
    return plugin is not None


def uninstall(client: Client, name: str) -> bool:
    """Stop and remove plugin ``name`` (``unregister`` alone would not stop its sampler)."""
    _register_by_value()
    return client.run_on_scheduler(_remove, name=name)
