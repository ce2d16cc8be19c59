"""What a stage's performance report shows, copied from the scheduler as plain data.

The flow-process renderer (:mod:`~prefect_dask_profiling.reports.html`) draws Dask's
report from this data, so the scheduler only copies: the stage's task records (kept by the
run's plugin, :class:`~prefect_dask_profiling.timing.tasks.TaskRecords`, and read by their
append counter, so exactly the stage's tasks), its own profile, bandwidths,
system-monitor samples and log lines of the window. The records are copied in pages of
:data:`PAGE` so no single call holds the scheduler's event loop long. Worker profiles are
asked of the workers directly (the scheduler neither merges nor forwards them) and only
through the scheduler when a worker cannot be reached from the flow process.

The scheduler-side functions are shipped by value (the scheduler need not have this
package): they use only their arguments, the standard library and distributed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from prefect_dask_profiling._util import ship_by_value

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger("prefect_dask_profiling")

PAGE = 2000  # task records per scheduler call (~2-4 ms of event loop on 2 slow cores)
PROFILE_TIMEOUT = 10.0  # seconds to wait for a worker's profile

# (key, worker, thread, startstops, status): what Dask's task-stream rectangles read, as
# timing.tasks.TaskRecords keeps them
TaskRecord = tuple[Any, str, int, tuple, str]


class ClusterInfo(TypedDict, total=False):
    """The scheduler's facts on a report's front page: its address, the workers, their
    threads and memory limits summed (bytes), and the Dask and distributed versions
    (empty until read)."""

    address: str
    workers: int
    threads: int
    memory: int
    dask: str
    distributed: str


@dataclass
class StreamSlice:
    """A stage's task-stream records: what was kept of the window ``[first, last)``.

    ``total`` tasks finished in the window; ``records`` are the ones the recorder still
    held when they were copied, oldest first: all of them, or (past its ``limit``) a sample
    spread over the window's whole time with its longest tasks, or what an earlier window
    left of them when later windows filled the recorder.
    """

    total: int
    records: list[TaskRecord]
    limit: int

    @property
    def kept(self) -> int:
        return len(self.records)

    @property
    def cut(self) -> bool:
        """Whether the picture shows fewer than the stage's tasks (sampled, or some left)."""
        return self.kept < self.total


@dataclass
class StageData:
    """Everything Dask's performance report shows for one stage window, as plain data."""

    start: float
    stop: float
    stream: StreamSlice
    compute_profile: dict
    server_profile: dict
    scheduler_profile: dict
    bandwidth: float = 0.0
    bandwidth_types: dict[str, float] = field(default_factory=dict)
    bandwidth_workers: dict[tuple[str, str], float] = field(default_factory=dict)
    worker_names: dict[str, str] = field(default_factory=dict)
    monitor: dict[str, list] = field(default_factory=dict)
    logs: list[tuple[float, str, str]] = field(default_factory=list)
    info: ClusterInfo = field(default_factory=dict)


# -- scheduler side (shipped by value) ----------------------------------------------------------


def _records(dask_scheduler, name: str):
    """The task records of run ``name``'s plugin (``None`` when it keeps none, or is gone)."""
    plugin = dask_scheduler.plugins.get(name)
    return getattr(getattr(plugin, "tasks", None), "records", None)


def window_state(dask_scheduler, name: str, opening: bool = False) -> dict:
    """Cursor of run ``name``'s task records and of the system monitor; ``opening``: a
    report window opens here (its tasks are kept one by one again, see ``TaskRecords``)."""
    records = _records(dask_scheduler, name)
    if records is None:  # a state of the scheduler (this runs there), not user input
        raise RuntimeError(f"the scheduler plugin {name!r} keeps no task records (not "
                           "installed, removed, or installed without task_records=True)")
    index = records.mark() if opening else records.index
    return {"count": dask_scheduler.monitor.count, "index": index, "limit": records.limit}


def stream_page(dask_scheduler, name: str, first: int, last: int, size: int) -> dict:
    """Up to ``size`` records of the append-counter range ``[first, last)`` still held.

    Returns ``next`` (the counter to read on from; ``last`` when none is left) and the
    records: those that left the buffer or were thinned are never replaced by later ones.
    No records when the plugin is gone.
    """
    records = _records(dask_scheduler, name)
    if records is None:
        return {"next": last, "records": []}
    after, page = records.page(first, last, size)
    return {"next": after, "records": page}


def stage_facts(dask_scheduler, name: str, start: float, stop: float, last_count: int,
                end_count: int, first: int, last: int, size: int) -> dict:
    """One call: the first page of records and every small part of the report."""
    from distributed import profile

    history = getattr(dask_scheduler.io_loop, "profile", None)
    monitor = dask_scheduler.monitor
    kept = monitor.range_query(start=last_count)
    begin = max(last_count, monitor.count - len(next(iter(kept.values()), [])))
    n = max(0, end_count - begin)
    workers = dask_scheduler.workers
    import dask
    import distributed

    return {
        "page": stream_page(dask_scheduler, name, first, last, size),
        "scheduler_profile": (profile.get_profile(history, start=start, stop=stop)
                              if history is not None else profile.create()),
        "bandwidth": dask_scheduler.bandwidth,
        "bandwidth_types": dict(dask_scheduler.bandwidth_types),
        "bandwidth_workers": dict(dask_scheduler.bandwidth_workers),
        "worker_names": {a: str(ws.name) if ws.name is not None else a
                         for a, ws in workers.items()},
        "monitor": {k: list(v[:n]) for k, v in kept.items()},
        "logs": [entry for entry in dask_scheduler.get_logs(start=start, timestamps=True)
                 if entry[0] <= stop],
        "info": {"address": dask_scheduler.address, "workers": len(workers),
                 "threads": sum(ws.nthreads for ws in workers.values()),
                 "memory": sum(ws.memory_limit or 0 for ws in workers.values()),
                 "dask": dask.__version__, "distributed": distributed.__version__},
    }


ship_by_value(__name__)


# -- flow side ----------------------------------------------------------------------------------


def fetch(client: Client, *, plugin: str, start: float, stop: float, first: int, last: int,
          last_count: int, end_count: int, limit: int, timeout: float = 120.0) -> StageData:
    """Copy the data of the stage window from the scheduler and its workers.

    Parameters
    ----------
    plugin
        The name of the run's ``TaskTimings`` plugin, whose task records the window reads.
    start, stop
        The window's wall times (profiles and log lines between them).
    first, last
        The task records' append counter at the window's start and end: the stage's tasks
        are exactly the records ``[first, last)``.
    last_count, end_count
        The system monitor's sample counter at the window's start and end.
    limit
        The recorder's buffer length (to say why a report is cut).
    """
    facts = client.run_on_scheduler(stage_facts, name=plugin, start=start, stop=stop,
                                    last_count=last_count, end_count=end_count, first=first,
                                    last=last, size=PAGE, callback_timeout=timeout)
    records = list(facts["page"]["records"])
    cursor = facts["page"]["next"]
    while cursor < last:  # later pages; a page may find its records gone
        page = client.run_on_scheduler(stream_page, name=plugin, first=cursor, last=last,
                                       size=PAGE, callback_timeout=timeout)
        records.extend(page["records"])
        cursor = page["next"] if page["records"] else last
    compute, server = worker_profiles(client, list(facts["worker_names"]), start, stop)
    return StageData(
        start=start, stop=stop,
        stream=StreamSlice(total=max(0, last - first), records=records, limit=limit),
        compute_profile=compute, server_profile=server,
        scheduler_profile=facts["scheduler_profile"], bandwidth=facts["bandwidth"],
        bandwidth_types=facts["bandwidth_types"],
        bandwidth_workers=facts["bandwidth_workers"], worker_names=facts["worker_names"],
        monitor=facts["monitor"], logs=facts["logs"], info=facts["info"])


def worker_profiles(client: Client, workers: list[str], start: float,
                    stop: float) -> tuple[dict, dict]:
    """The workers' compute and administrative profiles of the window, merged here.

    Asked of each worker directly; a worker the flow process cannot reach is asked through
    the scheduler (which then only forwards, ``merge_workers=False``).
    """
    from distributed import profile

    async def ask(server: bool) -> list:
        calls = [asyncio.wait_for(client.rpc(w).profile(start=start, stop=stop, server=server),
                                  PROFILE_TIMEOUT) for w in workers]
        return await asyncio.gather(*calls, return_exceptions=True)

    merged = []
    for server in (False, True):
        results = client.sync(ask, server)
        if any(isinstance(r, BaseException) for r in results):
            logger.debug("direct worker profile failed; asking the scheduler: %r", results)
            by_worker = client.profile(start=start, stop=stop, server=server,
                                       merge_workers=False)
            results = list(by_worker.values())
        merged.append(profile.merge(*results) if results else profile.create())
    return merged[0], merged[1]
