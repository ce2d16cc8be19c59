"""Overhead of the TaskTimings scheduler plugin (printed figures, no asserts).

Three measurements:

1. Direct ``transition(key, "processing", "memory", ...)`` calls on a plugin with no scheduler,
   for the seed's list-of-dicts plugin (copied below) and for ours: microseconds per call
   (without tracemalloc) and bytes per task after N finished tasks over 50 prefixes
   (tracemalloc, in a second pass).
1b. The same calls as **paired repeats**: per repeat, the seed's plugin and ours each drive
   ``--pair-transitions`` calls, in alternating order, timed in the thread's CPU seconds
   (a loaded machine moves walls far more than CPU time); the figure to quote is the median
   of the per-repeat ratios ours / seed with its 90% bootstrap interval.
2. End to end: tasks/s for many tiny tasks on one LocalCluster with and without the plugin,
   order rotated, repeated; the median of the per-repeat ratios is the figure to quote.
   Task queuing is off (``worker-saturation: inf``) so the scheduler is the bottleneck.

Run with ``make bench`` or::

    .venv/bin/python benchmarks/plugin_overhead.py [--transitions 1000000] [--tasks 20000]
"""

from __future__ import annotations

import argparse
import gc
import operator
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import dask
from dask.utils import key_split
from distributed import Client, LocalCluster, SchedulerPlugin, wait

from prefect_dask_profiling.bench.report import paired_ratio
from prefect_dask_profiling.summary import collect
from prefect_dask_profiling.timing.client import install, uninstall
from prefect_dask_profiling.timing.plugin import TaskTimings

PREFIXES = 50
WORKERS = [f"tcp://127.0.0.1:{4000 + i}" for i in range(4)]


class ListTimings(SchedulerPlugin):
    """The seed's plugin: one dict per finished task (copied verbatim, but for the name)."""

    name = "task-timings-list"

    def __init__(self):
        self.rows = []

    def transition(self, key, start, finish, *args, **kwargs):
        if start == "processing" and finish == "memory":
            startstops = kwargs.get("startstops") or []
            compute = sum(s["stop"] - s["start"] for s in startstops if s["action"] == "compute")
            self.rows.append({"prefix": key_split(key), "seconds": compute,
                              "nbytes": kwargs.get("nbytes", 0), "worker": kwargs.get("worker")})


class NoOp(SchedulerPlugin):
    """The cost of the call itself."""

    def transition(self, key, start, finish, *args, **kwargs):
        pass


def _keys(n: int) -> list:
    """Distinct task keys, half dask-array style tuples, half future-style strings."""
    return [(f"op{i % PREFIXES}-0123456789abcdef0123456789abcdef", i) if i % 2
            else f"op{i % PREFIXES}-{i:032x}" for i in range(n)]


def _startstops(n: int) -> list[tuple]:
    out = []
    for i in range(n):
        t = 1.8e9 + i * 1e-3
        compute = {"action": "compute", "start": t, "stop": t + 1e-4 * (1 + (i * 7919) % 1000)}
        if i % 5:
            out.append((compute,))
        else:
            out.append(({"action": "transfer", "start": t - 0.01, "stop": t,
                         "source": WORKERS[(i + 1) % 4]}, compute))
    return out


def _drive(plugin, keys: list, pool: list[tuple],
           clock: Callable[[], float] = time.perf_counter) -> float:
    transition = plugin.transition
    size = len(pool)
    t0 = clock()
    for i, key in enumerate(keys):
        transition(key, "processing", "memory", startstops=pool[i % size], nbytes=8000,
                   worker=WORKERS[i & 3], stimulus_id="task-finished-1800000000.0")
    return clock() - t0


def paired(n: int, repeats: int) -> list[tuple[float, float]]:
    """(seed, ours) CPU seconds of ``n`` direct calls per repeat, the order alternating."""
    keys, pool = _keys(n), _startstops(10_000)
    plugins: list[tuple[str, Callable[[], object]]] = [
        ("seed", ListTimings), ("ours", lambda: TaskTimings("bench", sample_interval=0))]
    out = []
    for rep in range(repeats):
        cpu = {}
        for label, factory in (plugins if rep % 2 == 0 else plugins[::-1]):
            key_split.cache_clear()
            gc.collect()
            cpu[label] = _drive(factory(), keys, pool, clock=time.thread_time)
        out.append((cpu["seed"], cpu["ours"]))
        print(f"  pair {rep}: seed {cpu['seed'] / n * 1e6:.2f} us, ours "
              f"{cpu['ours'] / n * 1e6:.2f} us per call", file=sys.stderr, flush=True)
    key_split.cache_clear()
    return out


def micro(n: int) -> list[tuple[str, float, float | None]]:
    """(plugin, µs per call, bytes per task) for ``n`` direct processing→memory calls."""
    keys, pool = _keys(n), _startstops(10_000)
    factories: list[tuple[str, Callable[[], object]]] = [
        ("no-op (call cost)", NoOp), ("seed ListTimings", ListTimings),
        ("TaskTimings (ours)", lambda: TaskTimings("bench", sample_interval=0))]
    rows = []
    for label, factory in factories:
        key_split.cache_clear()
        gc.collect()
        seconds = _drive(factory(), keys, pool)
        per_task = None
        if label != "no-op (call cost)":
            key_split.cache_clear()
            plugin = factory()
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            _drive(plugin, keys, pool)
            gc.collect()
            per_task = (tracemalloc.get_traced_memory()[0] - before) / n
            tracemalloc.stop()
            del plugin
        rows.append((label, seconds / n * 1e6, per_task))
        print(f"  {label:<20} done", file=sys.stderr, flush=True)
    key_split.cache_clear()
    return rows


def _n_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def _one_run(client: Client, n: int, with_plugin: bool) -> float:
    while client.run_on_scheduler(_n_tasks):
        time.sleep(0.05)
    name = install(client, sample_interval=1.0) if with_plugin else None
    t0 = time.perf_counter()
    futures = client.map(operator.pos, range(n), pure=False)
    wait(futures)
    elapsed = time.perf_counter() - t0
    del futures
    if name is not None:
        record = collect(client, name)
        uninstall(client, name)
        counted = int(record.tasks["tasks"].sum())
        if counted != n:
            print(f"  warning: plugin counted {counted} of {n} tasks", file=sys.stderr)
    return n / elapsed


def end_to_end(n: int, repeats: int) -> list[tuple[float, float]]:
    """(tasks/s without, tasks/s with) per repeat, order rotated."""
    results = []
    # No task queuing: every task goes to a worker at once, so the scheduler (where the
    # plugin runs) is the bottleneck rather than round trips -- the stricter measurement.
    with dask.config.set({"distributed.scheduler.worker-saturation": float("inf")}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        _one_run(client, min(n, 2000), False)  # warm-up
        for rep in range(repeats):
            order = [False, True] if rep % 2 == 0 else [True, False]
            speed = {flag: _one_run(client, n, flag) for flag in order}
            results.append((speed[False], speed[True]))
            print(f"  repeat {rep}: without {speed[False]:.0f}/s, with {speed[True]:.0f}/s",
                  file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pair-transitions", type=int, default=200_000)
    parser.add_argument("--pair-repeats", type=int, default=11)
    args = parser.parse_args()
    command = " ".join([".venv/bin/python", "benchmarks/plugin_overhead.py", *sys.argv[1:]])
    started = time.perf_counter()

    rows = micro(args.transitions)
    pairs = paired(args.pair_transitions, args.pair_repeats)
    speeds = end_to_end(args.tasks, args.repeats)
    ratios = [with_ / without for without, with_ in speeds]

    print(f"\n$ {command}")
    print(f"\n1) {args.transitions:,} direct processing->memory transitions, {PREFIXES} prefixes, "
          "no scheduler")
    print(f"   {'plugin':<20} {'us/call':>8} {'bytes/task':>11} {'MiB total':>10}")
    for label, us, per_task in rows:
        if per_task is None:
            print(f"   {label:<20} {us:>8.2f} {'-':>11} {'-':>10}")
        else:
            total = per_task * args.transitions / 2**20
            print(f"   {label:<20} {us:>8.2f} {per_task:>11.1f} {total:>10.1f}")
    ratio, low, high = paired_ratio([o for _, o in pairs], [s for s, _ in pairs])
    seed_us = statistics.median(s for s, _ in pairs) / args.pair_transitions * 1e6
    ours_us = statistics.median(o for _, o in pairs) / args.pair_transitions * 1e6
    print(f"\n1b) paired: {args.pair_repeats} repeats of {args.pair_transitions:,} calls each, "
          "order alternating, thread CPU seconds")
    print(f"   seed {seed_us:.2f} us/call, ours {ours_us:.2f} us/call (medians); ratio ours / "
          f"seed {ratio:.3f} (90% CI {low:.3f}-{high:.3f})")
    print(f"\n2) end to end: {args.tasks:,} tiny tasks (client.map), LocalCluster 2 workers x 1 "
          f"thread, worker-saturation=inf, {args.repeats} repeats, order rotated")
    print(f"   {'repeat':<8} {'without/s':>10} {'with/s':>10} {'ratio':>7}")
    for i, ((without, with_), ratio) in enumerate(zip(speeds, ratios, strict=True)):
        print(f"   {i:<8} {without:>10.0f} {with_:>10.0f} {ratio:>7.3f}")
    print(f"   median ratio (with / without): {statistics.median(ratios):.3f}  (target >= 0.97)")
    print(f"\n   total benchmark time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
