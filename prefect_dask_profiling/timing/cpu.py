"""CPU a thread or a process used, and CPU it waited for (standard library only).

On a shared host a thread that wants a core may wait for one in the kernel's run queue: CPU
*used* then understates what a CPU-bound thread wanted, and a loaded machine makes compute look
like waiting. Linux reports both per thread in ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds
on a CPU, nanoseconds waiting in the run queue, time slices); elsewhere the wait is ``None``
and CPU comes from :func:`time.thread_time` / :func:`time.process_time`.

Used by the scheduler plugin (its event loop's CPU per stage) and by the workers' counters at
stage boundaries (:mod:`prefect_dask_profiling.timing.worker_io`). Never raises.
"""

from __future__ import annotations

import os
import threading
import time

CpuTimes = tuple[float, "float | None"]
"""``(cpu seconds, run-queue wait seconds or None)``, cumulative since the thread started."""


def _schedstat(path: str) -> tuple[float, float] | None:
    try:
        with open(path) as fh:
            run, wait, _ = fh.read().split()
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def thread_cpu() -> CpuTimes:
    """The calling thread's CPU seconds and run-queue wait (``None`` off Linux)."""
    times = _schedstat(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat")
    return times if times is not None else (time.thread_time(), None)


def threads_wait(thread_ids: list[int]) -> dict[int, float]:
    """Run-queue wait seconds of some threads of this process, by native id (Linux only).

    Threads that have exited are left out; ``{}`` where the kernel does not report them.
    """
    out = {}
    for tid in thread_ids:
        times = _schedstat(f"/proc/{os.getpid()}/task/{tid}/schedstat")
        if times is not None:
            out[int(tid)] = times[1]
    return out


def process_cpu() -> CpuTimes:
    """This process's CPU seconds (all threads) and their run-queue wait (``None`` off Linux).

    Summed over the threads alive now: a thread that exited took its wait with it, so the
    wait of two readings is compared over the threads of both (CPU comes from
    :func:`time.process_time`, which keeps exited threads' CPU).
    """
    cpu = time.process_time()
    base = f"/proc/{os.getpid()}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return cpu, None
    wait = 0.0
    for tid in tids:
        times = _schedstat(f"{base}/{tid}/schedstat")
        if times is not None:
            wait += times[1]
    return cpu, wait
