"""Would holding the task records as tuples of atoms spare the scheduler's garbage collector?

The scheduler plugin keeps up to ``MAX_TASK_RECORDS`` finished tasks for the stage reports
(:class:`~prefect_dask_profiling.timing.tasks.TaskRecords`), each with Dask's ``startstops``
list of dicts: about three objects a record that every full collection walks. Tuples of
atoms are untracked by Python's collector after a few collections. This script measures,
in one process and without a cluster, both ways of holding them:

* ``--part gc``: a heap of ``--heap`` task-state-like objects (slots and four containers,
  as the scheduler's ``TaskState``) plus the records of ``--tasks`` finished tasks (at most
  ``MAX_TASK_RECORDS``, 40,000: all of them kept, none thinned); the
  objects the collector tracks and the thread CPU of a full ``gc.collect()`` (median of 15);
* ``--part add``: the thread CPU of recording one task (best of 5 passes over ``--tasks``).

The tuple form is :class:`TupleRecords` below, which was tried in the package and not kept
(docs/scaling.md, run (V)): on the cluster the profiled scheduler's collections did not
shrink, and recording cost more.

    PYTHONPATH=. .venv/bin/python -m benchmarks.investigations.gc_records [--part gc|add]
        [--tasks 40000] [--heap 200000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from prefect_dask_profiling.timing.tasks import MAX_TASK_RECORDS, TaskRecords


def _held(startstops: Iterable[Mapping[str, Any]]) -> tuple:
    """``startstops`` as ``(action, start, stop, source)`` tuples."""
    return tuple([(ss.get("action"), ss.get("start"), ss.get("stop"), ss.get("source"))
                  for ss in startstops])


class TupleRecords(TaskRecords):
    """:class:`TaskRecords` holding each record's ``startstops`` as tuples of atoms, for
    windows of at most ``limit`` tasks (every task kept, no thinning, as in this script)."""

    __slots__ = ()

    def add(self, key: Hashable, kwargs: Mapping[str, Any]) -> None:
        """Record one finished task, its ``startstops`` held as tuples."""
        counter = self.index
        self.index += 1
        self.buffer.append((counter, (key, kwargs.get("worker"), kwargs.get("thread"),
                                      _held(kwargs.get("startstops") or ()),
                                      kwargs.get("status"))))
        if len(self.buffer) > self.limit:
            raise SystemExit("TupleRecords does not thin: use --tasks <= MAX_TASK_RECORDS")


class TaskStateLike:
    """The shape of a scheduler ``TaskState`` for the collector: slots and containers."""

    __slots__ = ("key", "dependencies", "dependents", "who_has", "annotations")

    def __init__(self, i: int) -> None:
        self.key = ("ndvi-0a1b2c", i, 0, 0)
        self.dependencies: set = set()
        self.dependents: set = set()
        self.who_has: set = set()
        self.annotations: dict = {}


def messages(n: int) -> list[tuple[tuple, dict]]:
    """``n`` finished tasks' transition arguments: a transfer and a compute each."""
    return [(("ndvi-0a1b2c", i, 0, 0),
             {"worker": "tcp://127.0.0.1:4000", "thread": 140_000 + i % 2, "status": "OK",
              "startstops": [{"action": "transfer", "start": i, "stop": i + 0.1,
                              "source": "tcp://127.0.0.1:4001"},
                             {"action": "compute", "start": i + 0.1, "stop": i + 1.0}]})
            for i in range(n)]


def filled(kind: type[TaskRecords], msgs: list[tuple[tuple, dict]]) -> TaskRecords:
    """A recorder of ``kind`` after one report window of ``msgs``."""
    records = kind(MAX_TASK_RECORDS)
    records.mark()
    for key, kwargs in msgs:
        records.add(key, kwargs)
    return records


def full_collection(kind: type[TaskRecords], tasks: int, heap: int) -> str:
    """Tracked objects and a full collection's CPU with ``kind``'s records held."""
    states = [TaskStateLike(i) for i in range(heap)]
    records = filled(kind, messages(tasks))
    for _ in range(4):  # the tuples untrack one level a collection
        gc.collect()
    tracked = len(gc.get_objects())
    times = []
    for _ in range(15):
        start = time.thread_time()
        gc.collect()
        times.append(time.thread_time() - start)
    del states
    return (f"{kind.__name__}: {len(records.buffer):,} records held, {tracked:,} tracked "
            f"objects, a full collection {statistics.median(times) * 1000:.1f} ms")


def add_cost(kind: type[TaskRecords], tasks: int) -> str:
    """The thread CPU of recording one task with ``kind`` (best of 5 passes)."""
    msgs = messages(tasks)
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        filled(kind, msgs)
        best = min(best, time.thread_time() - start)
    return f"{kind.__name__}: {best / tasks * 1e6:.2f} us a task recorded"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("gc", "add"), default="gc")
    parser.add_argument("--tasks", type=int, default=MAX_TASK_RECORDS)
    parser.add_argument("--heap", type=int, default=200_000)
    args = parser.parse_args()
    if not 0 < args.tasks <= MAX_TASK_RECORDS:
        parser.error(f"--tasks must be between 1 and {MAX_TASK_RECORDS}")
    for _ in range(2):  # alternated, twice
        for kind in (TaskRecords, TupleRecords):
            print(full_collection(kind, args.tasks, args.heap) if args.part == "gc"
                  else add_cost(kind, args.tasks), flush=True)


if __name__ == "__main__":
    main()
