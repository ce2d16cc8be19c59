"""The client side of the scheduler plugin: install, read, uninstall.

:func:`install` registers a :class:`~.plugin.TaskTimings` on the scheduler, sending the
plugin and every module it uses by value (:data:`BY_VALUE`), so the scheduler need not have
this package installed; :func:`snapshot` and :func:`task_counts` read it back (functions of
this module run on the scheduler, so it is sent by value too), :func:`uninstall` stops and
removes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_dask_profiling.timing import (
    cpu,
    loop,
    memory,
    plugin,
    scope,
    sketch,
    tasks,
    types,
    workers,
)
from prefect_dask_profiling.timing.plugin import TaskTimings

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.timing.types import Snapshot, TransferLog

__all__ = ["BY_VALUE", "cluster_size", "counts_of", "install", "snapshot", "task_counts",
           "uninstall"]

BY_VALUE: tuple[str, ...] = tuple(m.__name__ for m in (
    cpu, sketch, types, scope, tasks, memory, loop, workers, plugin)) + (__name__,)
"""Every module the scheduler runs code of: the plugin's, and this one (the scheduler runs
the reads of :func:`snapshot` and :func:`task_counts`). ``tests/test_architecture.py`` checks
that it lists every package module they import."""


def _register_by_value() -> None:
    """Send :data:`BY_VALUE` by value: the scheduler need not have us installed."""
    import importlib

    import cloudpickle

    registered = cloudpickle.list_registry_pickle_by_value()
    for name in BY_VALUE:
        if name not in registered:
            cloudpickle.register_pickle_by_value(importlib.import_module(name))


def install(client: Client, name: str | None = None, *, scope: str = "cluster",
            sample_interval: float = 1.0, task_records: bool = False) -> str:
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
        shared cluster, see :func:`prefect_dask_profiling.stages.stage`).
    sample_interval
        Seconds between worker samples.
    task_records
        Keep the run's finished tasks for its stage reports' task stream (the last
        ``distributed.scheduler.dashboard.tasks.task-stream-length``).

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
    timings = TaskTimings(name, owner, sample_interval, installer=client.id,
                          task_records=task_records)
    client.register_plugin(timings, name=name)
    return name


def _snapshot(dask_scheduler: Any, name: str) -> Snapshot | None:
    found = dask_scheduler.plugins.get(name)
    return None if found is None else found.snapshot()


def _task_counts(dask_scheduler: Any, name: str) -> dict[str, dict[str, int]] | None:
    found = dask_scheduler.plugins.get(name)
    return None if found is None else found.task_counts()


def task_counts(client: Client, name: str) -> dict[str, dict[str, int]]:
    """Tasks finished so far per stage and prefix (the live ETA's progress): one small read
    on the scheduler, O(stages x prefixes), far lighter than :func:`snapshot`."""
    _register_by_value()
    counts = client.run_on_scheduler(_task_counts, name=name)
    if counts is None:
        raise KeyError(f"no TaskTimings plugin named {name!r} on the scheduler")
    return counts


def counts_of(snap: Snapshot) -> dict[str, dict[str, int]]:
    """What :func:`task_counts` would have read when ``snap`` was taken, from its ``tasks``
    rows: a caller holding a fresh snapshot needs no second round trip."""
    out: dict[str, dict[str, int]] = {}
    for row in snap.get("tasks") or []:
        out.setdefault(str(row["stage"]), {})[str(row["prefix"])] = int(row["tasks"])
    return out


def _incoming_transfers(dask_worker: Any, since: float) -> TransferLog:
    log = dask_worker.transfer_incoming_log
    entries = [(e.get("who"), e.get("total", 0), e.get("duration", 0.0))
               for e in log if e.get("start", 0) >= since]
    overflowed = log.maxlen is not None and len(log) == log.maxlen and (
        len(log) > 0 and log[0].get("start", 0) > since)
    return {"entries": entries, "overflowed": overflowed}


def snapshot(client: Client, name: str, *, transfers: bool = True) -> Snapshot:
    """The raw snapshot of plugin ``name`` (plain data), with worker-side transfer bytes.

    ``transfers=False`` leaves out the transfer bytes (``transfer_bytes`` absent): one read
    of the scheduler, no call to every worker — for a snapshot kept only in case the
    final one fails.
    """
    _register_by_value()
    snap = client.run_on_scheduler(_snapshot, name=name)
    if snap is None:
        raise KeyError(f"no TaskTimings plugin named {name!r} on the scheduler "
                       "(never installed, or removed when its client disconnected)")
    if not transfers:
        return snap
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


def _remove(dask_scheduler: Any, name: str) -> bool:
    found = dask_scheduler.plugins.pop(name, None)
    if found is not None:
        found._stop()
    return found is not None


def uninstall(client: Client, name: str) -> bool:
    """Stop and remove plugin ``name`` (``unregister`` alone would not stop its sampler)."""
    _register_by_value()
    return client.run_on_scheduler(_remove, name=name)
