"""What the scheduler-side sampler costs per worker (issue 58, target 5).

Every ``sample_interval`` (1 s by default) the run's scheduler plugin reads each worker's
memory and CPU from the scheduler's own state (the workers' heartbeats: nothing runs on
the workers for it) and folds them into the run's and the running stages' figures
(``TaskTimings._sample_workers``). This starts an in-process ``LocalCluster`` of N
single-thread workers, installs the plugin, and times that call on the scheduler's event
loop (thread CPU, ``repeats`` calls, with ``stages`` stages open), for each N: the CPU per
worker per sample is the cost per worker-second at the default interval.

It also prints the memory of one entry of a worker's incoming-transfer log (tracemalloc
over 100,000 entries shaped as ``distributed.Worker.gather_dep`` writes them, one key
each): what raising ``distributed.admin.low-level-log-length`` costs a worker per entry.

    .venv/bin/python -m benchmarks.many_workers [--workers 2 8 32] [--repeats 400]
        [--stages 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from distributed import Client, LocalCluster

from prefect_dask_profiling.timing.client import install, uninstall


def _time_samples(dask_scheduler: Any, name: str, repeats: int, stages: int) -> list[float]:
    """Thread-CPU seconds of ``repeats`` sampler calls, each with ``stages`` stages open."""
    plugin = dask_scheduler.plugins[name]
    open_stages = {f"stage-{i}" for i in range(stages)}
    plugin.tasks.running_stages = lambda since: open_stages
    out = []
    for _ in range(repeats):
        start = time.thread_time()
        plugin._sample_workers()
        out.append(time.thread_time() - start)
    return out


def measure(workers: int, repeats: int, stages: int) -> tuple[float, float]:
    """(median µs per call, µs per worker per call) on ``workers`` workers."""
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(workers)
        time.sleep(1.0)  # every worker heartbeated once
        name = install(client, sample_interval=0)
        try:
            times = client.run_on_scheduler(_time_samples, name=name, repeats=repeats,
                                            stages=stages)
        finally:
            uninstall(client, name)
    per_call = statistics.median(times) * 1e6
    return per_call, per_call / workers


def transfer_log_entry_bytes(entries: int = 100_000) -> float:
    """Bytes per entry of a full incoming-transfer log of ``entries`` one-key fetches."""
    import tracemalloc
    from collections import deque

    tracemalloc.start()
    log: deque[dict[str, Any]] = deque(maxlen=entries)
    for i in range(entries):
        now = time.time()
        log.append({"start": now, "stop": now + 0.01, "middle": now + 0.005,
                    "duration": 0.01, "keys": {("sum-partial-0123456789abcdef", i, 0): 8000},
                    "total": 8000, "bandwidth": 8e5, "who": "tcp://127.0.0.1:40001"})
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held / entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--stages", type=int, default=1)
    args = parser.parse_args()
    print("workers  µs per sample  µs per worker per sample  "
          "CPU per worker-second at 1 s (µs)")
    for n in args.workers:
        per_call, per_worker = measure(n, args.repeats, args.stages)
        print(f"{n:7d}  {per_call:13.1f}  {per_worker:24.2f}  {per_worker:33.2f}")
    print(f"one incoming-transfer log entry: {transfer_log_entry_bytes():.0f} bytes")


if __name__ == "__main__":
    main()
