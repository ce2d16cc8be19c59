"""Probes of the scheduler and the workers, read before and after the measured phase.

:func:`scheduler_probe` (event-loop thread CPU, tick counters), :func:`fine_metrics` (the
scheduler's cumulative fine performance metrics) and :func:`worker_probe` (executed
tasks, execute seconds, incoming transfer log, run-queue accounting) run on the scheduler /
workers and are shipped by value (:func:`by_value`): the cluster need not have this package
installed. :func:`settled_fine_metrics` waits for the heartbeats that carry fine metrics.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling._util import ship_by_value
from prefect_dask_profiling.bench import calibrate as calibration
from prefect_dask_profiling.timing import cpu

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.diagnosis.signals import SchedulerProbe, WorkerProbe

HEARTBEAT_WAIT_S = 1.2


def scheduler_probe(dask_scheduler) -> SchedulerProbe:
    """Event-loop thread CPU, tick count and total tick duration (runs on the scheduler)."""
    import time

    loop_cpu, loop_wait = cpu.thread_cpu()
    return {"time": time.time(), "loop_cpu": loop_cpu, "loop_wait": loop_wait,
            "ticks": int(getattr(dask_scheduler, "_tick_counter", 0)),
            "tick_total": float(dask_scheduler.digests_total.get("tick-duration", 0.0)),
            "tick_interval": float(getattr(dask_scheduler, "_tick_interval", 0.02))}


def fine_metrics(dask_scheduler) -> dict[Any, float]:
    """The scheduler's cumulative fine performance metrics (runs on the scheduler)."""
    # tuple keys only: the str keys (latency, tick-duration, ...) grow on every heartbeat
    return {k: float(v) for k, v in dask_scheduler.cumulative_worker_metrics.items()
            if isinstance(k, tuple) and isinstance(v, (int, float))}


def worker_probe(dask_worker, since: float) -> WorkerProbe:
    """Executed tasks, execute seconds, transfers since ``since``, schedstat (on a worker)."""
    exec_s = 0.0
    for key, value in dask_worker.digests_total.items():
        if (isinstance(key, tuple) and len(key) >= 3 and key[0] == "execute"
                and key[-1] == "seconds" and key[-2] in ("thread-cpu", "thread-noncpu")):
            exec_s += value
    incoming = [(e.get("who"), e.get("total", 0), e.get("duration", 0.0))
                for e in dask_worker.transfer_incoming_log if e.get("start", 0) >= since]
    return {"executed": int(dask_worker.state.executed_count), "exec_s": float(exec_s),
            "incoming": incoming, "schedstat": _schedstat(),
            "task_threads": _task_thread_schedstat(dask_worker), "netns": netns(),
            "net_recv": _net_received(), "io_write": _io_written()}


def netns(dask_scheduler=None) -> str | None:
    """This host and network namespace (``hostname:net:[inode]``): processes that share it
    share the interface counters (also runs on the scheduler)."""
    import os
    import socket

    try:
        return f"{socket.gethostname()}:{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return None


def _net_received() -> float | None:
    """Bytes received by every interface of this network namespace (kernel counters)."""
    try:
        with open("/proc/net/dev") as fh:
            lines = fh.read().splitlines()[2:]
    except OSError:
        return None
    total = 0
    for line in lines:
        _, _, fields = line.partition(":")
        parts = fields.split()
        if parts:
            total += int(parts[0])
    return float(total)


def _io_written() -> float | None:
    """Bytes this process caused to be written to storage (``/proc/self/io`` write_bytes)."""
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("write_bytes:"):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _task_thread_schedstat(dask_worker) -> dict[int, tuple[float, float]]:
    """(CPU s, run-queue wait s) of each thread of the worker's task executors (Linux).

    Only the threads that run tasks: the event loop, heartbeats and the profiler of the same
    process also wait for a core on a loaded host, which says nothing about the tasks.
    """
    import os

    out: dict[int, tuple[float, float]] = {}
    for executor in getattr(dask_worker, "executors", {}).values():
        for thread in list(getattr(executor, "_threads", ()) or ()):
            tid = getattr(thread, "native_id", None)
            if tid is None:
                continue
            try:
                with open(f"/proc/{os.getpid()}/task/{tid}/schedstat") as fh:
                    cpu, wait, _ = fh.read().split()
            except (OSError, ValueError):
                continue
            out[int(tid)] = (int(cpu) / 1e9, int(wait) / 1e9)
    return out


def _schedstat() -> tuple[float, float, float] | None:
    """(monotonic s, CPU s, run-queue wait s) of this process, where the kernel reports the
    wait (Linux); else ``None``. CPU plus the wait is the CPU the process *wanted*."""
    import time

    used, wait = cpu.process_cpu()
    return None if wait is None else (time.monotonic(), used, wait)


def by_value() -> None:
    """Ship this module (and the calibration) by value: workers need not have the package."""
    ship_by_value(calibration.__name__, cpu.__name__, __name__)


def settled_fine_metrics(client: Client) -> dict[Any, float]:
    """Fine metrics reach the scheduler with heartbeats: wait until two reads agree."""
    time.sleep(HEARTBEAT_WAIT_S)
    last = client.run_on_scheduler(fine_metrics)
    for _ in range(5):
        time.sleep(0.6)
        now = client.run_on_scheduler(fine_metrics)
        if now == last:
            break
        last = now
    return last
