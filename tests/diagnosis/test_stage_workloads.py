"""The nightly classifier on workloads its rules were not tuned on, through a real flow.

One profiled Prefect flow on a 2-worker x 1-thread cluster of separate processes, one stage per
textbook bottleneck, run the ways users run Dask work (``client.compute`` in the flow body
through ``get_dask_client()``, and Prefect tasks that compute collections). Each stage's
stored diagnosis must name its class: short stages included (their process CPU comes from the
workers' counters at the stage's boundaries, not from heartbeat samples), a straggler that
waits leads as a straggler (and says io, issue 35), one that computes is a straggler, and a
graph of thousands of tiny tasks is scheduler-bound — also on a loaded 2-core machine, which
is where CI runs.
"""

from __future__ import annotations

import os
import time

import dask
import dask.array as da
import pytest
from distributed import LocalCluster
from helpers.tiers import starts_processes
from prefect import flow, task
from prefect_dask import get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]


def spin(steps: int, seed: int) -> int:
    """Pure-Python CPU work."""
    total = seed
    for i in range(steps):
        total = (total * 31 + i) % 1_000_003
    return total


def nap(seconds: float, seed: int) -> int:
    """A call to a slow service: the thread waits, the CPU idles."""
    time.sleep(seconds)
    return seed


@task
def computed(steps: list[int]) -> int:
    """A Prefect task that computes a Dask graph of ``spin`` tasks on the cluster."""
    parts = [dask.delayed(spin, pure=False)(n, i) for i, n in enumerate(steps)]
    return int(dask.compute(*parts).__len__())


# The host's load while the flow ran: the 1-minute load average per core, read as it ends.
HOST: dict[str, float] = {}


def waited(client, seconds: list[float]) -> None:
    parts = [dask.delayed(nap, pure=False)(s, i) for i, s in enumerate(seconds)]
    client.compute(dask.delayed(len)(parts)).result()


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def diagnoses(tmp_path_factory) -> dict[str, dict]:
    store = str(tmp_path_factory.mktemp("workloads-store"))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        runner = ProfiledDaskTaskRunner(address=cluster.scheduler_address, store=store,
                                        stage_reports=False)

        @flow(name="workloads", version="1", task_runner=runner)
        @profiled
        def workloads() -> None:
            with get_dask_client() as client:
                with stage("tiny-tasks"):
                    client.compute(da.random.default_rng(1).random(3000, chunks=1).sum()
                                   ).result()
                with stage("waiting-straggler"):
                    waited(client, [0.05] * 32 + [4.0])
                with stage("waits"):
                    waited(client, [0.1] * 60)
            with stage("computing-straggler"):
                computed.submit([100_000] * 32 + [30_000_000]).result()
            with stage("compute"):
                computed.submit([1_500_000] * 16).result()

        state = workloads(return_state=True)
        HOST["load_per_core"] = os.getloadavg()[0] / (os.cpu_count() or 1)
        assert state.is_completed(), state.message
    s = RunStore(store)
    manifest = s.read_manifest("workloads", s.list_runs("workloads")[0]["run_id"])
    found = {st["name"]: st["diagnosis"] for st in manifest["stages"]}
    for name, d in found.items():
        print(f"DIAGNOSIS {name}: {d['primary']} / {d['secondary']} / {d['confidence']}: "
              f"{d['note']}")
        for signal in d["signals"]:
            print(f"  {signal['signal']} = {signal['value']:.4g} [{signal['source']}]")
    return found


def sources(d: dict) -> set[str]:
    return {s["source"] for s in d["signals"] if s["supports"]}


def test_thousands_of_tiny_tasks_are_scheduler_bound(diagnoses):
    d = diagnoses["tiny-tasks"]
    assert d["primary"] == "scheduler", d["note"]
    assert {"scheduler load", "task records"} <= sources(d)


def test_a_straggler_that_waits_leads_and_says_io(diagnoses):
    # one 4 s wait among 0.05 s ones sets the stage's wall: split it first (issue 35)
    d = diagnoses["waiting-straggler"]
    assert d["primary"] == "straggler", d["note"]
    assert d["secondary"] == "io"
    assert any("one task spans" in x for x in d["disagreements"]), d["disagreements"]


def test_a_straggler_that_computes_is_a_straggler(diagnoses):
    d = diagnoses["computing-straggler"]
    assert d["primary"] == "straggler", d["note"]
    assert any(s["signal"] == "tasks.task_skew" and s["supports"] for s in d["signals"])


def test_tasks_that_wait_are_io(diagnoses):
    d = diagnoses["waits"]
    assert d["primary"] == "io", d["note"]
    assert {"process CPU", "task records"} <= sources(d)


def test_a_short_compute_stage_is_compute_from_the_workers_counters(diagnoses):
    d = diagnoses["compute"]
    cpu = [s for s in d["signals"] if s["signal"] == "monitor.cpu_per_busy_thread"]
    assert cpu, d["signals"]
    assert "CPU used, not CPU waited for" not in " ".join(d["disagreements"])
    if d["primary"] == "undetermined" and HOST["load_per_core"] > 1.0:
        # On an oversubscribed host the CPU the task threads use or wait in the run queue
        # for, per busy thread, falls: 1.0 calm, 0.66-0.72 beside 4-5 CPU hogs, and below
        # compute's 0.6 once in CI (2 hogs beside 3 pytest processes). Between io's 0.4 and
        # compute's 0.6 the classifier says it cannot tell; it must never say io.
        assert 0.4 < cpu[0]["value"] < 0.6, (cpu, HOST)
        return
    assert d["primary"] == "compute", (d["note"], HOST)
    assert cpu[0]["supports"]
