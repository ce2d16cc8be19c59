"""Does a profiled run leave anything behind on the scheduler?

A long-lived cluster profiled night after night would slow down if each run left objects on
the scheduler. This runs stages of tiny tasks on a ``dask scheduler`` process and two
``dask worker`` processes in a given order, plain (``p`` absent: a stage only) or profiled
(``p``: ``install``, the stage, ``collect``, ``uninstall``), and after each run prints the
scheduler's CPU seconds for it, how many more objects its garbage collector tracks than
before the first run, its tasks, spans and plugins, and the types that grew most.

    PYTHONPATH=. .venv/bin/python benchmarks/investigations/scheduler_leftovers.py \
        [--order nnnppp] [--tasks 30000]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import dask.array as da  # noqa: E402
import psutil  # noqa: E402
from helpers.dask_processes import external_cluster  # noqa: E402

import prefect_dask_profiling as pdp  # noqa: E402
from prefect_dask_profiling.summary import collect  # noqa: E402


def census(dask_scheduler: Any = None) -> tuple[int, dict[str, int], int, int, list[str]]:
    """On the scheduler, after a full collection: (objects tracked, by type, tasks, spans,
    plugins)."""
    import collections
    import gc

    gc.collect()
    objects = gc.get_objects()
    spans = dask_scheduler.extensions.get("spans")
    return (len(objects), dict(collections.Counter(type(o).__name__ for o in objects)),
            len(dask_scheduler.tasks), len(spans.spans) if spans else -1,
            sorted(dask_scheduler.plugins))


def run(client: Any, profiled: bool, tasks: int) -> None:
    """One stage of about ``tasks`` tiny tasks, profiled or not."""
    total = (da.ones((tasks * 10,), chunks=10) + 1).sum()
    name = pdp.install(client) if profiled else None
    with pdp.stage("work"):
        total.compute()
    if name is not None:
        collect(client, name)
        pdp.uninstall(client, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", default="nnnppp", help="n: plain run, p: profiled run")
    parser.add_argument("--tasks", type=int, default=30000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, external_cluster(tmp) as cluster, \
            cluster.client() as client:
        scheduler = psutil.Process(cluster.scheduler.pid)
        run(client, False, 100)
        before, types_before, *_ = client.run_on_scheduler(census)
        for i, kind in enumerate(args.order):
            cpu = sum(scheduler.cpu_times()[:2])
            run(client, kind == "p", args.tasks)
            cpu = sum(scheduler.cpu_times()[:2]) - cpu
            objects, types, n_tasks, spans, plugins = client.run_on_scheduler(census)
            grew = collections.Counter(types)
            grew.subtract(types_before)
            print(f"{i} {'profiled' if kind == 'p' else 'plain':8s} CPU {cpu:6.2f} s  objects "
                  f"{objects - before:+,}  tasks {n_tasks}  spans {spans}  plugins {plugins}  "
                  f"grew {grew.most_common(4)}", flush=True)


if __name__ == "__main__":
    main()
