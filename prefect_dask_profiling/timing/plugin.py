"""Scheduler-side task timings: the ``TaskTimings`` scheduler plugin.

It runs inside someone else's scheduler: it and its stream modules import only the standard
library and ``distributed`` and are shipped by value
(:func:`~prefect_dask_profiling.timing.client.install`). Memory is bounded by stages x
prefixes, never by the number of tasks, and no hook raises into the scheduler (internal
errors are counted and reported with the snapshot). The plugin owns the lifecycle and hands
each hook to the streams: :class:`~.tasks.TaskStream`, :class:`~.memory.MemorySampler`,
:class:`~.loop.LoopSampler`, :class:`~.workers.WorkerLifetimes`, :class:`~.workers.Incidents`."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from prefect_dask_profiling.timing.loop import LoopSampler
from prefect_dask_profiling.timing.memory import MemorySampler
from prefect_dask_profiling.timing.scope import (
    DEFAULT_STAGE,
    PARENT_ANNOTATION,
    RUN_ANNOTATION,
    STAGE_ANNOTATION,
    RunScope,
)
from prefect_dask_profiling.timing.tasks import MAX_TASK_RECORDS, TaskRecords, TaskStream
from prefect_dask_profiling.timing.workers import Incidents, WorkerLifetimes

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import ClusterSize, Snapshot

__all__ = ["DEFAULT_STAGE", "PARENT_ANNOTATION", "RUN_ANNOTATION", "STAGE_ANNOTATION",
           "TaskTimings"]

logger = logging.getLogger(__name__)

# v2: listeners are told (key, run_id) after the scheduler accepted the message; a scheduler
# that still runs an older plugin's wrapper keeps it under the old name, untouched. Every
# listener keeps a ``seceded`` dict (key -> run id), whatever its version.
_LONG_RUNNING_HOOK = "_dask_profiling_long_running_listeners_v2"


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
    installer
        Id of the client that installed the plugin: when it disconnects the plugin stops
        and removes itself. Defaults to ``owner_client``; ``None`` keeps the plugin until
        it is uninstalled or the scheduler closes.
    task_records
        Keep the run's finished tasks as Dask's task stream shows them (the stage reports'
        task stream), the last ``distributed.scheduler.dashboard.tasks.task-stream-length``
        of them, as Dask's recorder would (:class:`~.tasks.TaskRecords`).
    """

    idempotent = False
    #: the scope the streams share (a subclass may tell stages its own way)
    scope_type: type[RunScope] = RunScope

    def __init__(self, name: str = "task-timings", owner_client: str | None = None,
                 sample_interval: float = 1.0, *,
                 installer: str | None = None, task_records: bool = False) -> None:
        self.name = name
        self.task_records = task_records
        self.owner_client = owner_client
        self.installer = installer or owner_client
        self.sample_interval = sample_interval
        self.scheduler: Any = None
        self._pc: Any = None
        self.scope = self.scope_type(name, owner_client)
        self.tasks = TaskStream(self.scope)
        self.memory = MemorySampler(self.scope)
        self.loop = LoopSampler()
        self.lifetimes = WorkerLifetimes(self.scope)
        self.incidents = Incidents(self.scope)
        #: the tasks that seceded, as every long-running listener keeps them (shared with
        #: the task stream)
        self.seceded = self.tasks.seceded
        self.internal_errors = 0
        self.last_error: str | None = None
        self.last_sample_time = 0.0
        self.started = time.time()

    @property
    def warnings(self) -> list[str]:
        """What could not be recorded, for the snapshot."""
        return self.scope.warnings

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["scheduler"] = None  # the scope drops its own reference when pickled
        state["_pc"] = None
        return state

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, scheduler: Any) -> None:
        self.scheduler = self.scope.scheduler = scheduler
        self.started = time.time()
        try:
            if self.task_records:
                self.tasks.records = TaskRecords(min(task_stream_length(), MAX_TASK_RECORDS))
            self.lifetimes.record_threads()
            self.lifetimes.record_present(self.started)
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

    def remove_client(self, scheduler: Any, client: str) -> None:
        if self.installer is None or client != self.installer:
            return
        try:
            self._stop()
            if scheduler.plugins.get(self.name) is self:
                del scheduler.plugins[self.name]
        except Exception:
            self._fail()

    # -- hooks -----------------------------------------------------------------------------

    def update_graph(self, scheduler: Any, *, client: str = "", tasks: Any = (),
                     annotations: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        try:
            parents = (annotations or {}).get(PARENT_ANNOTATION)
            if parents:
                self.tasks.inner_arrived(parents)
            loop = self.loop
            if loop.due(time.time()):  # a stage's start
                loop.sample(self.tasks.running_stages(loop.last_time or 0.0))
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

    def transition(self, key: Hashable, start: str, finish: str, *args: Any,
                   **kwargs: Any) -> None:
        stream = self.tasks
        if start == "processing":
            try:
                if finish == "memory":
                    stream.finished(key, kwargs, erred=False)
                elif finish == "erred":
                    stream.finished(key, kwargs, erred=True)
                elif finish == "released":
                    stream.left_processing(key)
            except Exception:
                self._fail()
        elif start == "memory" and finish == "released":
            try:
                stream.released(key, start)
            except Exception:
                self._fail()
        elif stream.wrappers and ((finish == "erred" and start != "memory")
                                  or (finish == "released" and start in stream.NOT_DONE)):
            try:
                stream.inner_dropped(key, finish)
            except Exception:
                self._fail()

    def add_worker(self, scheduler: Any = None, worker: str | None = None) -> None:
        try:
            self.lifetimes.record_threads()
            self.lifetimes.arrived(worker, time.time())
        except Exception:
            self._fail()

    def remove_worker(self, scheduler: Any = None, worker: str | None = None, *args: Any,
                      **kwargs: Any) -> None:
        # Called after the worker's tasks were released: the keys it was running are read
        # from Dask's ``remove-worker`` event instead (see :meth:`log_event`).
        try:
            self.lifetimes.record_threads()
            self.lifetimes.departed(worker, time.time())
        except Exception:
            self._fail()

    def log_event(self, topic: str, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Watch for workers leaving with tasks on them, and the nanny's memory kills."""
        if topic != "all" and topic != "worker-restart-memory":
            return
        try:
            if not isinstance(msg, dict):
                return
            if topic == "worker-restart-memory":
                self.incidents.memory_kill(msg)
            elif msg.get("action") == "remove-worker":
                last = self.memory.workers.get(str(msg.get("worker")))
                self.incidents.worker_removed(msg, last)
        except Exception:
            self._fail()

    # -- internals -------------------------------------------------------------------------

    def _fail(self) -> None:
        self.internal_errors += 1
        self.last_error = traceback.format_exc(limit=3)
        logger.debug("TaskTimings internal error", exc_info=True)

    def _sample_workers(self) -> None:
        """The periodic sample: workers' memory, then the loop, for the stages running."""
        try:
            now = time.time()
            stages = self.tasks.running_stages(self.last_sample_time)
            self.memory.sample(now, stages)
            self.loop.sample(stages)
            self.last_sample_time = now
        except Exception:
            self._fail()

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

            def long_running(*args: Any, key: Hashable = None, **kwargs: Any) -> Any:
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

    # -- read-out --------------------------------------------------------------------------

    def cluster_size(self) -> ClusterSize:
        """The workers connected now and their threads (what ``Client.nthreads`` would say,
        without its round trip)."""
        workers = list(self.scheduler.workers.values()) if self.scheduler is not None else []
        return {"workers": len(workers), "threads": sum(ws.nthreads for ws in workers)}

    def task_counts(self) -> dict[str, dict[str, int]]:
        """Tasks finished so far per stage and prefix (O(stages x prefixes))."""
        return self.tasks.counts()

    def snapshot(self) -> Snapshot:
        """Everything recorded so far, as plain data (cheap: O(stages x prefixes + samples))."""
        if self.scheduler is not None:
            try:  # the loop's CPU up to now: a stage that just closed gets its last part
                since = self.loop.last_time
                self.loop.sample(self.tasks.running_stages(
                    self.last_sample_time if since is None else since))
            except Exception:
                self._fail()
        memory, tasks = self.memory, self.tasks
        return {
            "name": self.name, "started": self.started, "collected": time.time(),
            "tasks": tasks.task_rows(), "orchestration": tasks.orchestration_rows(),
            "transfers": tasks.transfer_rows(),
            "workers": memory.worker_rows(),
            "samples": list(memory.samples),
            "samples_dropped": max(0, memory.samples_taken - len(memory.samples)),
            "timeline": list(self.lifetimes.timeline),
            "stage_memory": memory.stage_memory_rows(),
            "stage_spill": memory.stage_spill_rows(),
            "stage_scheduler": self.loop.rows(),
            "cluster": self.cluster_size(),
            "incidents": self.incidents.rows(),
            "incidents_dropped": self.incidents.dropped,
            "lifetimes": self.lifetimes.rows(),
            "lifetimes_dropped": self.lifetimes.dropped,
            "warnings": list(self.warnings),
            "internal_errors": self.internal_errors, "last_error": self.last_error,
        }


def task_stream_length() -> int:
    """How many task records Dask's task-stream recorder would keep on this scheduler."""
    import dask

    return max(int(dask.config.get("distributed.scheduler.dashboard.status.task-stream-length")),
               int(dask.config.get("distributed.scheduler.dashboard.tasks.task-stream-length")))


def _accepted_long_running(scheduler: Any, key: Hashable, message: Mapping[str, Any]) -> Any:
    """The run id of ``key`` if the scheduler accepted its long-running message, else None."""
    ts = scheduler.tasks.get(key)
    ws = ts.processing_on if ts is not None else None
    if ws is None or ts not in ws.long_running:
        return None
    if message.get("worker", ws.address) != ws.address:
        return None
    run_id = message.get("run_id", ts.run_id)
    return run_id if run_id == ts.run_id else None
