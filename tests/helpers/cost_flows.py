"""A profiled flow on an adaptive cluster (1 -> 4 -> 1 workers) that has every worker write
its own lifetime (:class:`worker_lifetimes.LifetimeFile`); importable by Dask workers."""

from __future__ import annotations

import time

from prefect import flow, task
from prefect_dask import get_dask_client

from helpers.worker_lifetimes import LifetimeFile
from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled


@task
def nap(seconds: float) -> float:
    """A Prefect task that holds one thread for ``seconds``."""
    time.sleep(seconds)
    return seconds


def _wait_for(client, n: int, timeout: float = 120.0) -> None:
    """Wait until exactly ``n`` workers are connected (adaptive scaling), bounded."""
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info(n_workers=-1)["workers"]) != n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster did not reach {n} workers in {timeout} s")
        time.sleep(0.2)


def make_adaptive_flow(runner: ProfiledDaskTaskRunner, folder: str, name: str):
    """Stages ``burst`` (16 naps: the cluster scales to 4), ``idle`` (one nap while 4 workers
    wait) and ``tail`` (one short nap on the last worker, after scale-down)."""

    def body() -> float:
        with get_dask_client() as client:
            client.register_plugin(LifetimeFile(folder))
        with stage("burst"):
            total = sum(f.result() for f in [nap.submit(1.5) for _ in range(16)])
        with get_dask_client() as client:
            _wait_for(client, 4)
        with stage("idle"):
            total += nap.submit(3.0).result()
        with get_dask_client() as client:
            _wait_for(client, 1)
        with stage("tail"):
            total += nap.submit(0.5).result()
        return total

    return flow(name=name, version="1", task_runner=runner)(profiled(body))
