"""The task stream: what each ``(stage, prefix)`` of the run cost, and the transfers.

Standard library and ``distributed`` only (shipped by value with the scheduler plugin); its
memory is bounded by stages x prefixes and the wrappers running at once, never by tasks.
A task that waits on Dask work it launched is a *wrapper*: the time it waited on its
tagged inner work (``profiling_parent``) is *orchestration*, kept out of compute totals;
an untagged task that secedes is orchestration whole. ``tasks`` counts every finished run,
erred ones included (``errors`` says how many failed), and the seconds cover the same runs."""

from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling.timing.scope import PARENT_ANNOTATION, RunScope
from prefect_dask_profiling.timing.sketch import QuantileSketch

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import PrefixRow, TransferRow

MAX_WRAPPERS = 10_000
# The task records a stage report draws at most (Dask's own task stream keeps 100,000): a
# report of 40,000 tasks is ~8 MB of HTML and ~1.5 s of the flow process's CPU to draw, at
# any stage size (a larger stage is sampled over its whole time, TaskRecords)
MAX_TASK_RECORDS = 40_000
MAX_PROCESSING_SCAN = 64  # tasks looked at per worker and sample to find running stages
_INF = float("inf")

StageKey = tuple[str, str]
"""``(stage, prefix)``, or ``(source, destination)`` for transfers."""
TaskRecord = tuple[Hashable, Any, Any, Any, Any]
"""``(key, worker, thread, startstops, status)``: what Dask's task-stream rectangles read."""


@dataclass(slots=True)
class PrefixStats:
    """Running aggregates of one ``(stage, prefix)``."""

    tasks: int = 0
    errors: int = 0
    reruns: int = 0
    compute_s: float = 0.0
    max_s: float = 0.0
    nbytes: int = 0
    max_nbytes: int = 0
    transfer_s: float = 0.0
    disk_read_s: float = 0.0
    disk_write_s: float = 0.0
    sketch: QuantileSketch = field(default_factory=QuantileSketch)
    first_start: float = _INF
    last_stop: float = -_INF

    def count(self, compute: float, first: float, last: float, erred: bool,
              nbytes: int | None) -> None:
        """Count one finished run (erred ones too) and its compute seconds."""
        self.tasks += 1
        if erred:
            self.errors += 1
        elif nbytes:
            self.nbytes += nbytes
            if nbytes > self.max_nbytes:
                self.max_nbytes = nbytes
        if first < self.first_start:
            self.first_start = first
        if last > self.last_stop:
            self.last_stop = last
        self.compute_s += compute
        if compute > self.max_s:
            self.max_s = compute
        self.sketch.add(compute)

    def row(self, stage: str, prefix: str) -> PrefixRow:
        """The snapshot's row of this ``(stage, prefix)``."""
        seen = self.first_start != _INF
        sketch = self.sketch
        return {
            "stage": stage, "prefix": prefix,
            "tasks": self.tasks, "errors": self.errors, "reruns": self.reruns,
            "compute_s": self.compute_s,
            "p50_s": sketch.quantile(0.5) if sketch.n else None,
            "p95_s": sketch.quantile(0.95) if sketch.n else None,
            "max_s": self.max_s, "nbytes": self.nbytes, "max_nbytes": self.max_nbytes,
            "transfer_s": self.transfer_s,
            "disk_read_s": self.disk_read_s, "disk_write_s": self.disk_write_s,
            "first_start": self.first_start if seen else None,
            "last_stop": self.last_stop if seen else None,
            "sketch": sketch.to_dict(),
        }


@dataclass(slots=True)
class TransferStats:
    """Transfers from one worker to another: how many, and their seconds."""

    count: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class WrapperWait:
    """How long one running wrapper task has waited on the inner work it launched.

    Inner tasks are counted, not listed: ``pending`` is the number of inner tasks not yet
    finished. While it is above zero the wrapper is waiting; the open interval starts when
    an inner graph arrives and ends when the scheduler learns that the last pending inner
    task finished. Overlapping batches merge into one interval, so ``waited`` is the length
    of the union of the waiting intervals.
    """

    pending: int = 0
    start: float = 0.0
    end: float = 0.0
    waited: float = 0.0
    graphs: int = 0

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


class TaskRecords:
    """The run's finished task runs as Dask's task stream shows them, at most ``limit`` kept.

    What the stage reports draw. Dask's own recorder (``TaskStreamPlugin``) is another
    scheduler plugin, called on every transition of every client's tasks and shared with
    the dashboard; these records cost an append per finished task of the run, and the run
    owns them (removing them never takes a recorder from under the dashboard). ``index``
    counts every record ever added, so a window read as ``[first, last)`` of it holds
    exactly the tasks that finished in between, whatever the clocks say.

    Bounded at any size, and a window's records always span its whole time: Dask's
    recorder keeps the last 100,000 tasks, so a stage of a million shows only its end. When
    full, the records of earlier windows leave first (oldest first); then the open window's
    own are thinned evenly: every other one is dropped and from then on only every
    ``stride``-th task is kept, the stride doubling at each thinning. The longest tasks of
    the window (the :data:`STRAGGLERS`-th part of ``limit``) survive each thinning, so a
    straggler stays in the picture. A thinning costs one pass over the buffer, after
    ``limit / 2`` kept appends: amortised O(1) per task. The exact figures are the
    summary's, not the picture's.
    """

    #: the longest tasks of a window kept through a thinning: ``limit // STRAGGLERS`` of them
    STRAGGLERS = 20

    __slots__ = ("limit", "buffer", "index", "start", "stride", "floor")

    def __init__(self, limit: int) -> None:
        #: at most this many records are held
        self.limit = max(int(limit), 0)
        #: ``(counter, record)`` of the records held, oldest first
        self.buffer: deque[tuple[int, TaskRecord]] = deque()
        #: records ever added
        self.index = 0
        #: the counter at which the newest window opened (:meth:`mark`)
        self.start = 0
        #: of the newest window's tasks, every ``stride``-th is kept
        self.stride = 1
        #: and every one longer than this (compute seconds; the shortest straggler kept)
        self.floor = _INF

    def mark(self) -> int:
        """A report window opens: its tasks are kept one by one again; the counter."""
        self.start, self.stride, self.floor = self.index, 1, _INF
        return self.index

    def add(self, key: Hashable, kwargs: Mapping[str, Any],
            compute: float | None = None) -> None:
        """Record one finished (or erred) task run from its transition's arguments
        (``compute``: its compute seconds, when the caller summed them already)."""
        counter = self.index
        self.index += 1
        if not self.limit:
            return
        startstops = kwargs.get("startstops") or ()
        if (counter - self.start) % self.stride:  # off the stride: kept if a straggler
            if compute is None:
                compute = _compute_s(startstops)
            if compute <= self.floor:
                return
        self.buffer.append((counter, (key, kwargs.get("worker"), kwargs.get("thread"),
                                      startstops, kwargs.get("status"))))
        if len(self.buffer) > self.limit:
            self._make_room()

    def _make_room(self) -> None:
        """Drop an earlier window's oldest record, or thin the open window's records."""
        if self.buffer[0][0] < self.start:
            self.buffer.popleft()
            return
        self.stride *= 2
        longest = heapq.nlargest(self.limit // self.STRAGGLERS, self.buffer,
                                 key=lambda entry: _compute_s(entry[1][3]))
        keep = {counter for counter, _ in longest}
        if longest:  # a later task off the stride is kept when longer than these
            self.floor = _compute_s(longest[-1][1][3])
        self.buffer = deque(entry for entry in self.buffer
                            if (entry[0] - self.start) % self.stride == 0 or entry[0] in keep)

    def page(self, first: int, last: int, size: int) -> tuple[int, list[TaskRecord]]:
        """Up to ``size`` records of ``[first, last)`` still held, oldest first, and the
        counter to read on from (``last`` when none is left: the caller's page loop ends)."""
        lo = bisect.bisect_left(self.buffer, first, key=lambda entry: entry[0])
        found: list[TaskRecord] = []
        for counter, record in itertools.islice(self.buffer, lo, None):
            if counter >= last:
                break
            if len(found) == size:
                return counter, found
            found.append(record)
        return last, found


def _compute_s(startstops: Iterable[Mapping[str, Any]]) -> float:
    """A task run's compute seconds (its ``startstops`` of action ``compute``)."""
    return sum(ss["stop"] - ss["start"] for ss in startstops if ss.get("action") == "compute")


class TaskStream:
    """Per-(stage, prefix) task aggregates, orchestration apart, and transfers.

    Fed by the plugin's ``transition`` and ``update_graph`` hooks; its methods may raise
    (the plugin counts the error and goes on).

    Parameters
    ----------
    scope
        The run recorded, shared with the other streams.
    """

    #: states a task leaves without having run, when cancelled or erred upstream
    NOT_DONE = ("waiting", "queued", "no-worker")

    def __init__(self, scope: RunScope) -> None:
        self.scope = scope
        #: (stage, prefix) -> what its task runs cost
        self.stats: dict[StageKey, PrefixStats] = {}
        #: (stage, prefix) -> the time its wrappers waited on inner work
        self.orchestration: dict[StageKey, PrefixStats] = {}
        #: (source, destination) -> transfers between them
        self.transfers: dict[StageKey, TransferStats] = {}
        #: key -> run id it seceded in (validated by the scheduler's handler first)
        self.seceded: dict[Hashable, str] = {}
        #: running wrapper key -> its wait on inner work
        self.wrappers: dict[Hashable, WrapperWait] = {}
        #: the run's finished tasks for the stage reports (``None``: not kept)
        self.records: TaskRecords | None = None

    # -- hooks -----------------------------------------------------------------------------

    def left_processing(self, key: Hashable) -> None:
        """A running task was released (cancelled, or its worker died): drop its state."""
        self.seceded.pop(key, None)
        self.wrappers.pop(key, None)
        self.released(key, "processing")

    def inner_dropped(self, key: Hashable, finish: str) -> None:
        """A task that will not run (erred upstream, or cancelled): its wrapper stops
        waiting for it (called only while wrappers run)."""
        ts = self.scope.task(key)
        if finish == "erred" or not (ts is None or ts.who_wants or ts.waiters):
            self._inner_done(ts)

    def finished(self, key: Hashable, kwargs: Mapping[str, Any], erred: bool) -> None:
        """A task run finished (in memory, or erred): add it to its ``(stage, prefix)``."""
        ts = self.scope.task(key)
        stage = self.scope.owner_stage(ts)  # once a task: the records and the aggregates
        seceded_run = self.seceded.pop(key, None)
        wrappers = self.wrappers
        wait = wrappers.pop(key, None) if wrappers else None
        if wrappers:
            self._inner_done(ts)
        compute: float | None = None  # summed once: the aggregates and the records
        if wait is not None and wait.graphs:
            compute = self._finished_wrapper(key, ts, stage, kwargs, erred, wait)
        else:
            seceded = seceded_run is not None and (ts is None or ts.run_id == seceded_run)
            table = self.orchestration if seceded else self.stats
            stats = self._stats_in(stage, key, ts, table)
            if stats is not None:
                compute, first, last = self._add_startstops(stats, kwargs)
                stats.count(compute, first, last, erred, kwargs.get("nbytes"))
        records = self.records
        if records is not None and stage is not None:
            records.add(key, kwargs, compute)

    def released(self, key: Hashable, start: str) -> None:
        """Count a rerun when a running or finished task is released but still wanted.

        That is what a worker death (or a retry) does: the task is still wanted by a
        client or a dependent, so it will run again. Tasks released because nobody needs
        them any more (intermediates, cancelled futures) are not reruns.
        """
        ts = self.scope.task(key)
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

    def inner_arrived(self, parents: Mapping[Hashable, Hashable]) -> None:
        """New inner tasks arrived: ``parents`` maps each new task's key to its wrapper's.

        A wrapper is tracked only while the scheduler has it processing, so a stale or
        made-up parent never creates state, and the state is dropped when it leaves
        processing: memory is bounded by the wrappers running at once.
        """
        now = time.time()
        counts: dict[Hashable, int] = {}
        for parent in parents.values():
            counts[parent] = counts.get(parent, 0) + 1
        for parent, n in counts.items():
            wait = self.wrappers.get(parent)
            if wait is None:
                ts = self.scope.task(parent)
                if ts is None or ts.state != "processing":
                    continue
                if len(self.wrappers) >= MAX_WRAPPERS:
                    self.scope.warn_once(
                        "wrapper tasks",
                        f"more than {MAX_WRAPPERS} wrapper tasks ran at once: the waits of "
                        "the others were counted as their own work")
                    continue
                wait = self.wrappers[parent] = WrapperWait()
            wait.arrived(n, now)

    # -- read-out --------------------------------------------------------------------------

    def running_stages(self, since: float) -> set[str]:
        """Stages of this run that ran since ``since``.

        A stage runs while a task of it is processing (a bounded look at each worker's
        processing tasks: they are few with Dask's queuing) or when one of its tasks
        finished since then. Cost: O(workers + stages x prefixes), nothing per task.
        """
        stages: set[str] = set()
        owner_stage = self.scope.owner_stage
        for ws in self.scope.scheduler.workers.values():
            for i, ts in enumerate(ws.processing):
                if i >= MAX_PROCESSING_SCAN:
                    break
                stage = owner_stage(ts)
                if stage is not None:
                    stages.add(stage)
        for (stage, _prefix), stats in self.stats.items():
            if stats.last_stop >= since:
                stages.add(stage)
        return stages

    def counts(self) -> dict[str, dict[str, int]]:
        """Tasks finished so far per stage and prefix (O(stages x prefixes))."""
        out: dict[str, dict[str, int]] = {}
        for (stage, prefix), stats in list(self.stats.items()):
            out.setdefault(str(stage), {})[str(prefix)] = int(stats.tasks)
        return out

    def task_rows(self) -> list[PrefixRow]:
        """The snapshot's ``tasks``: one row per (stage, prefix)."""
        return [st.row(s, p) for (s, p), st in self.stats.items()]

    def orchestration_rows(self) -> list[PrefixRow]:
        """The snapshot's ``orchestration``: wrappers' waits per (stage, prefix)."""
        return [st.row(s, p) for (s, p), st in self.orchestration.items()]

    def transfer_rows(self) -> list[TransferRow]:
        """The snapshot's ``transfers``: one row per (source, destination)."""
        return [{"source": a, "destination": b, "count": t.count, "seconds": t.seconds}
                for (a, b), t in self.transfers.items()]

    # -- internals -------------------------------------------------------------------------

    def _stats_for(self, key: Hashable, ts: Any,
                   table: dict[StageKey, PrefixStats]) -> PrefixStats | None:
        """The aggregates ``key`` adds to (``ts`` is its TaskState or ``None``)."""
        return self._stats_in(self.scope.owner_stage(ts), key, ts, table)

    def _stats_in(self, stage: str | None, key: Hashable, ts: Any,
                  table: dict[StageKey, PrefixStats]) -> PrefixStats | None:
        """The aggregates ``key`` of ``stage`` (its :meth:`RunScope.owner_stage`, ``None``:
        another run's task, not counted) adds to."""
        if stage is None:
            return None
        ident = (stage, self.scope.prefix(key, ts))
        stats = table.get(ident)
        if stats is None:
            stats = table[ident] = PrefixStats()
        return stats

    def _finished_wrapper(self, key: Hashable, ts: Any, stage: str | None,
                          kwargs: Mapping[str, Any], erred: bool,
                          wait: WrapperWait) -> float | None:
        """Split a wrapper's compute into its own work and the time it waited on inner work;
        its compute seconds, both together (``None``: another run's task)."""
        own = self._stats_in(stage, key, ts, self.stats)
        if own is None:
            return None
        compute, first, last = self._add_startstops(own, kwargs)
        waited = min(max(wait.total(), 0.0), compute)
        own.count(compute - waited, first, last, erred, kwargs.get("nbytes"))
        orchestration = self._stats_in(stage, key, ts, self.orchestration)
        if orchestration is not None:
            orchestration.count(waited, first, last, erred, 0)
        return compute

    def _add_startstops(self, stats: PrefixStats,
                        kwargs: Mapping[str, Any]) -> tuple[float, float, float]:
        """Add transfers and disk time; return compute seconds and the compute interval."""
        compute = 0.0
        first, last = _INF, -_INF
        worker = kwargs.get("worker")
        startstops: Iterable[Mapping[str, Any]] = kwargs.get("startstops") or ()
        for ss in startstops:
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
                    entry = self.transfers[pair] = TransferStats()
                entry.count += 1
                entry.seconds += duration
            elif action == "disk-read":
                stats.disk_read_s += duration
            elif action == "disk-write":
                stats.disk_write_s += duration
        return compute, first, last

    def _wait_of(self, ts: Any) -> WrapperWait | None:
        annotations = ts.annotations if ts is not None else None
        if not annotations:
            return None
        parent = annotations.get(PARENT_ANNOTATION)
        return None if parent is None else self.wrappers.get(parent)

    def _inner_done(self, ts: Any) -> None:
        wait = self._wait_of(ts)
        if wait is not None:
            wait.done(time.time())

    def _inner_rerun(self, ts: Any) -> None:
        wait = self._wait_of(ts)
        if wait is not None:
            wait.arrived(1, time.time())
