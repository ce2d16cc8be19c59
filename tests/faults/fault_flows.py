"""Profiled flows for the fault suite (importable by the Dask workers of the test clusters).

The flow body runs in the test process; ``HOOKS`` lets a test act at a point of the run
(``after_load``, ``after_compute``, ``before_finish``, ``after_finish``): kill a process,
stop a server, break the plugin. Run as ``python -m faults.fault_flows`` for a flow in a
process of its own (prints a JSON line with the final state and result).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import dask.array as da
from prefect import flow
from prefect_dask import get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, finish, profiled

HOOKS: dict[str, Callable[[], None]] = {}
CHUNK = 10  # each block is CHUNK x 10 ones


def call_hook(name: str) -> None:
    hook = HOOKS.get(name)
    if hook is not None:
        hook()


def slow_block(block, delay: float):
    """A Dask block task that takes ``delay`` seconds."""
    time.sleep(delay)
    return block * 2.0


def fragile_block(block):
    """A Dask block task whose timings a test makes the plugin fail on."""
    return block + 1.0


def expected(blocks: int, fragile_blocks: int = 0) -> float:
    """The flow's result, whatever happens around it."""
    cells = CHUNK * 10
    return blocks * cells + 2.0 * blocks * cells + 2.0 * fragile_blocks * cells


def _barrier(folder: str, parties: int, timeout: float = 120) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, f"{os.getpid()}.ready").touch()
    deadline = time.monotonic() + timeout
    while len(list(Path(folder).glob("*.ready"))) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {folder}: the other flows never arrived")
        time.sleep(0.05)


def body(delay: float = 0.2, blocks: int = 8, fragile_blocks: int = 0,
         barrier: str | None = None, parties: int = 2) -> float:
    """``load`` (a quick sum), then ``compute`` (``blocks`` tasks of ``delay`` seconds)."""
    with stage("load"):
        with get_dask_client() as client:
            ones = da.ones((blocks * CHUNK, 10), chunks=(CHUNK, 10))
            total = float(client.compute(ones.sum()).result())
    call_hook("after_load")
    if barrier:
        _barrier(barrier, parties)
    with stage("compute"):
        with get_dask_client() as client:
            x = da.ones((blocks * CHUNK, 10), chunks=(CHUNK, 10))
            y = client.persist(x.map_blocks(slow_block, delay, dtype=float))
            total += float(client.compute(y.sum()).result())
            if fragile_blocks:
                f = da.ones((fragile_blocks * CHUNK, 10), chunks=(CHUNK, 10))
                z = client.persist(f.map_blocks(fragile_block, dtype=float))
                total += float(client.compute(z.sum()).result())
    call_hook("after_compute")
    return total


def explicit_body(delay: float = 0.2, blocks: int = 8, fragile_blocks: int = 0,
                  barrier: str | None = None, parties: int = 2) -> float:
    """``body``, then an explicit ``finish()`` between two hooks."""
    total = body(delay, blocks, fragile_blocks, barrier, parties)
    call_hook("before_finish")
    try:
        finish()
    finally:
        call_hook("after_finish")
    return total


def make_fault_flow(runner: ProfiledDaskTaskRunner, name: str, version: str = "1",
                    explicit: bool = False):
    """A profiled two-stage flow on ``runner``."""
    fn = explicit_body if explicit else profiled(body)
    return flow(name=name, version=version, task_runner=runner, log_prints=True)(fn)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--barrier")
    args = parser.parse_args()
    runner = ProfiledDaskTaskRunner(address=args.address, store=args.store,
                                    stage_reports=False)
    state = make_fault_flow(runner, args.name)(
        delay=args.delay, blocks=args.blocks, barrier=args.barrier, return_state=True)
    result = state.result(raise_on_failure=False)
    print(json.dumps({"state": state.type.value, "flow_run_id": str(
        state.state_details.flow_run_id), "result": result if isinstance(result, float)
        else repr(result)}))


if __name__ == "__main__":
    from faults.fault_flows import main as _main  # the importable module, not __main__

    _main()
