"""Small profiled flows used by the runner and verdict tests (importable by Dask workers)."""

from __future__ import annotations

import time
from pathlib import Path

import dask.array as da
from prefect import flow, task
from prefect_dask import get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled


def slow_block(block, delay: float):
    """A real Dask operation whose per-task cost is ``delay`` seconds (sleep + work)."""
    time.sleep(delay)
    return block * 2.0


@task
def crunch(n: int, seed: int) -> float:
    """A Prefect task that computes a Dask collection inside (an orchestration wrapper)."""
    x = da.random.RandomState(seed).random((n, n), chunks=n // 4)
    return float((x @ x.T).sum().compute())


@task
def fails(message: str) -> None:
    """A Prefect task that raises: a flow returning its future ends Failed."""
    raise ValueError(message)


def write_hook_file(path: str):
    """An on_failure hook that records the exception it sees."""

    def hook(flow_, flow_run, state) -> None:
        try:
            state.result()
        except Exception as exc:  # the hook sees RegressionDetected
            Path(path).write_text(f"{type(exc).__name__}: {exc}")

    return hook


def make_flow(runner: ProfiledDaskTaskRunner, name: str = "profiled-test",
              version: str | None = "1", hook_file: str | None = None,
              decorate: bool = True):
    """A two-stage flow: ``prepare`` (a Prefect wrapper task) and ``compute`` (flow body)."""
    hooks = [write_hook_file(hook_file)] if hook_file else []

    def body(delay: float = 0.02, blocks: int = 16, store: str | None = None) -> float:
        with stage("prepare"):
            fut = crunch.submit(400, 1)
        with stage("compute"):
            with get_dask_client() as client:
                x = da.ones((blocks * 10, 10), chunks=(10, 10))
                y = client.persist(x.map_blocks(slow_block, delay, dtype=float))
                total = float(client.compute(y.sum()).result())
        return total + fut.result()

    fn = profiled(body) if decorate else body
    return flow(name=name, version=version, task_runner=runner, on_failure=hooks)(fn)
