"""Prefect tasks that drive Dask work from inside, on a real cluster through a real flow.

Every pattern prefect-dask users write is covered: ``get_dask_client()`` +
``compute().result()``, ``worker_client()`` (secedes), ``get_client()`` + ``wait()``,
``persist()`` + ``wait()`` and an ``async`` task with ``get_async_dask_client()``. Each runs
in its own stage of one flow on a LocalCluster of 2 workers x 2 threads, and each Prefect
task does a known amount of its own work (a busy loop) before and after it waits.

What must hold in every case: the inner Dask tasks belong to the stage the Prefect task was
submitted in; the time the Prefect task spent waiting on them is reported apart (the
orchestration table), never as task time; its own work is task time; per-stage utilisation
stays <= 1.05. Dask's own task stream is the reference for the wrapper's compute seconds,
and each inner task's own record of when it ran (``time.time()`` on this host, sent as a
worker event) for the span of its pattern's inner tasks, so the bounds below depend neither
on machine speed nor on the scheduler's per-worker clock corrections (a worker adds its
heartbeat-estimated offset to every timestamp it reports; under load that estimate moves by
seconds, and the stream's tasks from two workers then seem to overlap other patterns').
"""

from __future__ import annotations

import time

import dask
import dask.array as da
import distributed
import numpy as np
import pytest
from distributed import Client, LocalCluster, get_task_stream, wait, worker_client
from helpers.tiers import starts_processes
from prefect import flow, task
from prefect_dask import get_async_dask_client, get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(300)]

INNER = 6  # inner tasks per pattern
NAP = 0.4  # seconds each inner task sleeps: >= 6 * 0.4 / 4 threads = 0.6 s of waiting
OWN = 0.25  # seconds of busy work the Prefect task does before, and again after, waiting
CLOCK_SLACK = 0.05  # the scheduler clock against the host clock of the inner tasks' records
NAP_TOPIC = "orchestration-pattern-nap"


# -- work run on the workers (this module is importable by the worker processes) ----------


def busy(seconds: float) -> None:
    """Keep this thread busy for ``seconds`` (own work of known duration)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _record_nap(tag: str, start: float) -> None:
    """Send when this inner task of pattern ``tag`` ran, by the host's clock."""
    distributed.get_worker().log_event(NAP_TOPIC, {"tag": tag, "start": start,
                                                   "stop": time.time()})


def nap(i: int, delay: float, tag: str) -> int:
    start = time.time()
    time.sleep(delay)
    _record_nap(tag, start)
    return i


def nap_block(block, delay: float, tag: str):
    start = time.time()
    time.sleep(delay)
    _record_nap(tag, start)
    return block + 1


def _inner_sum(tag: str) -> dask.delayed:
    parts = [dask.delayed(nap, pure=False)(i, NAP, tag) for i in range(INNER)]
    return dask.delayed(sum, pure=False)(parts)


@task
def via_get_dask_client() -> int:
    busy(OWN)
    with get_dask_client() as client:
        total = client.compute(_inner_sum("get-dask-client")).result()  # no secede
    busy(OWN)
    return total


@task
def via_worker_client() -> int:
    busy(OWN)
    with worker_client() as client:  # secedes while it waits
        total = sum(client.gather(client.map(nap, range(INNER), delay=NAP,
                                             tag="worker-client", pure=False)))
    busy(OWN)
    return total


@task
def via_get_client_wait() -> int:
    busy(OWN)
    client = distributed.get_client()
    futures = client.map(nap, range(INNER), delay=NAP, tag="get-client-wait", pure=False)
    wait(futures)  # blocks without seceding
    total = sum(f.result() for f in futures)
    busy(OWN)
    return total


@task
def via_persist_wait() -> int:
    busy(OWN)
    # meta given: else map_blocks calls nap_block once on an empty array to infer it
    blocks = da.zeros((INNER * 10, 10), chunks=(10, 10)).map_blocks(
        nap_block, NAP, "persist-wait", meta=np.empty((0, 0), dtype=float))
    persisted = blocks.persist()
    wait(persisted)
    busy(OWN)
    return int(persisted.npartitions)


@task
async def via_async_client() -> int:
    busy(OWN)
    async with get_async_dask_client() as client:
        total = await client.compute(_inner_sum("async-client"))
    busy(OWN)
    return total


PATTERNS = {
    "get-dask-client": via_get_dask_client,
    "worker-client": via_worker_client,
    "get-client-wait": via_get_client_wait,
    "persist-wait": via_persist_wait,
    "async-client": via_async_client,
}
WRAPPER_PREFIX = {name: t.fn.__name__ for name, t in PATTERNS.items()}


# -- one flow, one stage per pattern, on one shared cluster ----------------------------------


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def patterns_run(tmp_path_factory):
    """Run the flow once; return the stored tables, the manifest and Dask's task stream."""
    store_url = str(tmp_path_factory.mktemp("store"))
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        runner = ProfiledDaskTaskRunner(address=cluster.scheduler_address, store=store_url,
                                        stage_reports=False, sample_interval=0.2)

        @flow(name="orchestration-patterns", version="1", task_runner=runner)
        @profiled
        def patterns() -> dict[str, int]:
            results = {}
            for name, prefect_task in PATTERNS.items():  # one at a time: no thread starvation
                with stage(name):
                    results[name] = prefect_task.submit().result()
            return results

        with get_task_stream(client=client) as stream:
            state = patterns(return_state=True)
        rows = stream.data
        naps = [msg for _, msg in client.get_events(NAP_TOPIC)]
    assert state.is_completed(), state.message
    assert state.result() == {"get-dask-client": sum(range(INNER)), "worker-client":
                              sum(range(INNER)), "get-client-wait": sum(range(INNER)),
                              "persist-wait": INNER, "async-client": sum(range(INNER))}
    store = RunStore(store_url)
    [run] = store.list_runs("orchestration-patterns")
    manifest = store.read_manifest("orchestration-patterns", run["run_id"])
    tasks = store.read_table("orchestration-patterns", run["run_id"], "tasks")
    orchestration = store.read_table("orchestration-patterns", run["run_id"], "orchestration")
    return {"tasks": tasks, "orchestration": orchestration, "manifest": manifest,
            "stream": rows, "naps": naps}


def _compute_interval(row: dict) -> tuple[float, float]:
    spans = [(s["start"], s["stop"]) for s in row["startstops"] if s["action"] == "compute"]
    return min(a for a, _ in spans), max(b for _, b in spans)


def _wrapper_and_inner(run: dict, pattern: str) -> tuple[float, float]:
    """The wrapper's compute seconds (its worker's own duration), and the span in which its
    inner tasks ran (their own records, by the host's clock)."""
    prefix = WRAPPER_PREFIX[pattern]
    [wrapper] = [r for r in run["stream"] if distributed.utils.key_split(r["key"]) == prefix]
    start, stop = _compute_interval(wrapper)
    inner = [(n["start"], n["stop"]) for n in run["naps"] if n["tag"] == pattern]
    assert len(inner) >= INNER, f"{pattern}: {len(inner)} inner tasks recorded"
    return stop - start, max(b for _, b in inner) - min(a for a, _ in inner)


def _timeline(stream: list[dict], prefix: str) -> list[tuple]:
    """What ran while the wrapper ran (key, worker, compute start/stop from its start): the
    evidence a failing bound below is explained by."""
    [wrapper] = [r for r in stream if distributed.utils.key_split(r["key"]) == prefix]
    start, stop = _compute_interval(wrapper)
    rows = [(r["key"], r["worker"], *(round(t - start, 3) for t in _compute_interval(r)))
            for r in stream if start <= _compute_interval(r)[1] and _compute_interval(r)[0] <= stop]
    return sorted(rows, key=lambda row: row[2])


def test_every_pattern_ran_in_its_own_stage(patterns_run) -> None:
    tasks = patterns_run["tasks"]
    assert set(tasks["stage"]) == set(PATTERNS), "work outside the pattern stages"
    assert patterns_run["manifest"]["status"] == "healthy"
    assert not [w for w in patterns_run["manifest"]["warnings"] if "internal error" in w]


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_inner_tasks_belong_to_the_submitting_stage(patterns_run, pattern: str) -> None:
    tasks = patterns_run["tasks"]
    rows = tasks[tasks["stage"] == pattern]
    inner = rows[rows["prefix"] != WRAPPER_PREFIX[pattern]]
    assert inner["tasks"].sum() >= INNER
    assert inner["total_s"].sum() >= INNER * NAP  # every nap is task time of this stage


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_waiting_is_orchestration_and_own_work_is_task_time(patterns_run,
                                                            pattern: str) -> None:
    prefix = WRAPPER_PREFIX[pattern]
    tasks, orchestration = patterns_run["tasks"], patterns_run["orchestration"]
    own_rows = tasks[(tasks["stage"] == pattern) & (tasks["prefix"] == prefix)]
    wait_rows = orchestration[orchestration["stage"] == pattern]
    assert list(own_rows["tasks"]) == [1]
    assert list(zip(wait_rows["prefix"], wait_rows["tasks"], strict=True)) == [(prefix, 1)]
    own, waited = float(own_rows["total_s"].sum()), float(wait_rows["compute_s"].sum())

    compute_s, inner_span = _wrapper_and_inner(patterns_run, pattern)
    assert own + waited == pytest.approx(compute_s, abs=1e-3)  # the interval, split
    assert waited >= inner_span - CLOCK_SLACK, (  # the whole wait is orchestration ...
        waited, _timeline(patterns_run["stream"], prefix))
    assert own <= compute_s - inner_span + CLOCK_SLACK  # ... and none of it task time
    assert own >= 2 * OWN * 0.9  # the busy loops before and after the wait are counted


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_stage_utilisation_stays_at_most_one(patterns_run, pattern: str) -> None:
    utilisation = patterns_run["manifest"]["utilisation"]
    assert 0 < utilisation["stages"][pattern] <= 1.05
    assert utilisation["run"] <= 1.05
