"""Stage data of any size for drawing a report: task records of a real run's shape.

The shape is that of a stage of tiny array tasks on a cluster of ``workers`` × ``threads``:
each thread runs tasks of ``seconds`` back to back (a compute interval each, as Dask's
``startstops`` say), keys of a few prefixes, and one straggler 60 times as long every
100,000 tasks; with ``jitter``, each task's time is drawn from ``seconds`` × (1 ± jitter)
(seeded), as real tasks' times vary. The records go through the run's recorder at its default bound
(:class:`~prefect_dask_profiling.timing.tasks.TaskRecords`), as the scheduler plugin keeps
them, and what it holds is copied as :func:`~prefect_dask_profiling.reports.data.fetch`
would.
"""

from __future__ import annotations

import random

from distributed import profile

from prefect_dask_profiling.reports.data import StageData, StreamSlice
from prefect_dask_profiling.timing.tasks import MAX_TASK_RECORDS, TaskRecords

PREFIXES = ("open_dataset", "getitem", "ndvi", "nanmedian-chunk")
STRAGGLER_EVERY, STRAGGLER_FACTOR = 100_000, 60


def straggler_keys(n: int) -> list[str]:
    """The keys of the stragglers among ``n`` tasks."""
    return [key_of(i) for i in range(STRAGGLER_EVERY // 2, n, STRAGGLER_EVERY)]


def key_of(i: int) -> str:
    return f"('{PREFIXES[i % len(PREFIXES)]}-5f2c', {i})"


def recorded(n: int, workers: int = 16, threads: int = 2, seconds: float = 0.05,
             limit: int = MAX_TASK_RECORDS, jitter: float = 0.0) -> TaskRecords:
    """The recorder after a window of ``n`` tasks (times varied by ``jitter``, seeded)."""
    rng = random.Random(0)
    records = TaskRecords(limit)
    records.mark()
    slots = workers * threads
    clock = [0.0] * slots
    for i in range(n):
        slot = i % slots
        duration = seconds * (STRAGGLER_FACTOR if i % STRAGGLER_EVERY == STRAGGLER_EVERY // 2
                              else 1)
        if jitter:
            duration *= 1 + rng.uniform(-jitter, jitter)
        start = clock[slot]
        clock[slot] = start + duration
        records.add(key_of(i), {
            "worker": f"tcp://127.0.0.1:{40000 + slot // threads}", "thread": slot % threads,
            "status": "OK",
            "startstops": ({"action": "compute", "start": 1e9 + start,
                            "stop": 1e9 + start + duration},)})
    return records


def stage_data_of(n: int, workers: int = 16, threads: int = 2,
                  seconds: float = 0.05, jitter: float = 0.0) -> StageData:
    """The data of a report of a stage of ``n`` tasks (times varied by ``jitter``)."""
    records = recorded(n, workers, threads, seconds, jitter=jitter)
    _, kept = records.page(0, records.index, records.index)
    stops = [ss["stop"] for r in kept for ss in r[3]]
    return StageData(start=1e9, stop=max(stops, default=1e9),
                     stream=StreamSlice(total=n, records=kept, limit=records.limit),
                     compute_profile=profile.create(), server_profile=profile.create(),
                     scheduler_profile=profile.create(),
                     worker_names={f"tcp://127.0.0.1:{40000 + w}": str(w)
                                   for w in range(workers)})
