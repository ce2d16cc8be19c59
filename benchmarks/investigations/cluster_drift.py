"""Does a long-lived cluster's CPU per run drift with the runs before it?

``benchmarks/cost_per_task.py`` alternates plain and profiled runs on one ``dask scheduler``
and two ``dask worker`` processes that live across the runs. At 96,997 tasks of the stack
shape its plain runs used more CPU the later they ran (docs/scaling.md, (E)). This runs the
same one-stage flow in a given order on one such cluster, and prints each run's CPU seconds
per process, so the drift can be told from the profiler's cost.

    PYTHONPATH=. .venv/bin/python benchmarks/investigations/cluster_drift.py \
        [--tasks 98000] [--order plain,plain,plain,plain] [--warmup-tasks 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from prefect_dask import DaskTaskRunner  # noqa: E402

from benchmarks.cost_per_task import (  # noqa: E402
    PROCESSES,
    Processes,
    bench_cluster,
    graph_of,
    make_flow,
    timed_run,
)
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=98_000)
    parser.add_argument("--graph", choices=("tiny", "stack"), default="stack")
    parser.add_argument("--order", default="plain,plain,plain,plain",
                        help="runs in order, each plain or profiled")
    parser.add_argument("--warmup-tasks", type=int, default=2_000)
    args = parser.parse_args()
    order = args.order.split(",")
    with bench_cluster() as (tmp, cluster, client):
        procs = Processes(client, cluster.scheduler.pid)
        runners = {"plain": DaskTaskRunner(address=cluster.address),
                   "profiled": ProfiledDaskTaskRunner(address=cluster.address,
                                                      store=tmp + "/store")}
        _, tasks = graph_of(args.graph, args.tasks)
        print(f"{args.graph} graph: {tasks:,} tasks; runs in order {order} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
        for name in sorted(set(order)):
            timed_run(make_flow(runners[name], f"drift-{name}", args.graph,
                                min(args.tasks, args.warmup_tasks)), procs)
        for i, name in enumerate(order, 1):
            row = timed_run(make_flow(runners[name], f"drift-{name}", args.graph, args.tasks),
                            procs)
            print(f"  run {i} {name:<9} wall {row['wall']:7.1f} s  "
                  + "  ".join(f"{p} {row[p]:7.2f}" for p in PROCESSES)
                  + f"  (load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
