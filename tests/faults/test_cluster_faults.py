"""Cluster faults against real processes: a worker SIGKILLed mid-stage, the scheduler lost
mid-run, two flows sharing one cluster, and a forced internal error in the plugin."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from helpers.dask_processes import ROOT, TESTS, external_cluster

from faults.fault_flows import expected, make_fault_flow
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, _live_runner
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]


def stored_runs(store_url: str, pipeline: str) -> list[dict]:
    """Manifests of the complete runs of ``pipeline`` (readers ignore the rest)."""
    store = RunStore(store_url)
    return [store.read_manifest(pipeline, r["run_id"]) for r in store.list_runs(pipeline)]


def kill_when_busy(cluster, prefix: str, pids: dict[str, int], done: dict) -> None:
    """SIGKILL the first worker seen running a ``prefix`` task after one has finished."""
    with cluster.client() as client:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "pid" not in done:
            finished = client.run_on_scheduler(
                lambda dask_scheduler: sum(ts.state == "memory" and prefix in str(ts.key)
                                           for ts in dask_scheduler.tasks.values()))
            for worker, keys in client.processing().items():
                if finished and worker in pids and any(prefix in str(k) for k in keys):
                    os.kill(pids[worker], signal.SIGKILL)
                    done.update(pid=pids[worker], worker=worker, finished=finished)
                    return
            time.sleep(0.05)


def test_worker_killed_mid_stage_run_completes_and_counts_reruns(cluster, hooks, fault,
                                                                  tmp_path):
    store = str(tmp_path / "store")
    pids = cluster.worker_pids()
    done: dict = {}
    killer = threading.Thread(target=kill_when_busy, args=(cluster, "slow_block", pids, done))
    hooks["after_load"] = killer.start
    runner = ProfiledDaskTaskRunner(address=cluster.address, store=store, stage_reports=False)
    fault.inject("worker SIGKILLed mid-stage")
    fault.expect_summary()
    state = make_fault_flow(runner, "fault-worker-kill")(delay=0.3, blocks=12,
                                                          return_state=True)
    killer.join(60)
    assert "pid" in done, "no worker was killed: the fault was not injected"
    assert state.is_completed(), state.message
    assert state.result() == expected(12)
    [manifest] = stored_runs(store, "fault-worker-kill")
    tasks = RunStore(store).read_table("fault-worker-kill", manifest["run_id"])
    fault.recovered()
    slow = tasks[tasks["prefix"] == "slow_block"]
    assert slow["tasks"].sum() >= 12
    assert tasks["reruns"].sum() >= 1, tasks
    assert manifest["status"] == "healthy" and manifest["state"] == "COMPLETED"
    assert manifest["utilisation"]["run"] <= 1.05
    fault.survived()


def test_scheduler_lost_mid_run_fails_the_flow_and_keeps_the_summary(hooks, fault, tmp_path):
    store = str(tmp_path / "store")
    with external_cluster(tmp_path / "dask", n_workers=1) as doomed:
        killer = threading.Thread(target=lambda: (time.sleep(0.8), doomed.kill_scheduler()))
        hooks["after_load"] = killer.start
        runner = ProfiledDaskTaskRunner(address=doomed.address, store=store,
                                        stage_reports=False, client_kwargs={"timeout": "5s"})
        fault.inject("scheduler SIGKILLed mid-run")
        fault.expect_summary()
        start = time.monotonic()
        state = make_fault_flow(runner, "fault-scheduler-lost")(delay=0.5, blocks=12,
                                                                 return_state=True)
        elapsed = time.monotonic() - start
        killer.join(30)
    fault.timing(f"scheduler lost: the flow ended {state.type.value} after {elapsed:.1f} s")
    assert doomed.scheduler.returncode == -signal.SIGKILL
    assert not state.is_completed()
    assert "dask-profiling" not in (state.message or "")  # the flow's own failure, not ours
    [manifest] = stored_runs(store, "fault-scheduler-lost")
    fault.recovered()
    assert manifest["state"] != "COMPLETED"
    assert manifest["status"] in ("failed", "incomplete")
    stages = {s["name"]: s for s in manifest["stages"]}
    assert stages["load"]["tasks"] > 0  # collected when the stage closed, before the loss
    assert any("last stage boundary" in w for w in manifest["warnings"]), manifest["warnings"]
    fault.survived()


def test_two_flows_share_one_cluster_with_separate_complete_summaries(cluster, fault,
                                                                       tmp_path,
                                                                       prefect_server):
    store = str(tmp_path / "store")
    env = prefect_server.client_env()
    env["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS])
    barrier = str(tmp_path / "barrier")
    fault.inject("two flows of one pipeline at once on one cluster")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "faults.fault_flows", "--address", cluster.address,
         "--store", store, "--name", "fault-shared", "--blocks", str(blocks),
         "--delay", "0.2", "--barrier", barrier],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for blocks in (6, 9)]
    outputs = []
    for proc in procs:
        fault.expect_summary()
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    assert [o["state"] for o in outputs] == ["COMPLETED", "COMPLETED"]
    assert [o["result"] for o in outputs] == [expected(6), expected(9)]
    manifests = stored_runs(store, "fault-shared")
    assert len(manifests) == 2
    by_flow_run = {m["flow_run_id"]: m for m in manifests}
    run_store = RunStore(store)
    for output, blocks in zip(outputs, (6, 9), strict=True):
        manifest = by_flow_run[output["flow_run_id"]]
        assert manifest["status"] == "healthy"
        tasks = run_store.read_table("fault-shared", manifest["run_id"])
        fault.recovered()
        count = tasks.groupby("prefix")["tasks"].sum()
        assert count["slow_block"] == blocks, tasks  # its own tasks only
        assert manifest["utilisation"]["run"] <= 1.05
    a, b = manifests
    assert a["started"] < b["ended"] and b["started"] < a["ended"]  # really at the same time
    fault.survived()


def _break_plugin(dask_scheduler, name: str, prefix: str) -> None:
    """Make the run's plugin fail on every finished task of ``prefix`` (scheduler side)."""
    plugin = dask_scheduler.plugins[name]
    original = plugin.tasks.finished

    def finished(key, kwargs, erred):
        if prefix in str(key):
            raise RuntimeError(f"forced failure on {key}")
        return original(key, kwargs, erred)

    plugin.tasks.finished = finished


def test_plugin_internal_error_leaves_the_computation_alone_and_is_counted(cluster, hooks,
                                                                          fault, tmp_path):
    store = str(tmp_path / "store")

    def poison() -> None:
        session = _live_runner().session
        session.client.run_on_scheduler(_break_plugin, name=session.plugin_name,
                                        prefix="fragile_block")
        fault.inject("plugin internal error (forced on the scheduler)")

    hooks["after_load"] = poison
    runner = ProfiledDaskTaskRunner(address=cluster.address, store=store, stage_reports=False)
    fault.expect_summary()
    state = make_fault_flow(runner, "fault-plugin-error")(delay=0.05, blocks=4,
                                                           fragile_blocks=5,
                                                           return_state=True)
    assert fault.names, "the plugin was not broken: no fault injected"
    assert state.is_completed(), state.message
    assert state.result() == expected(4, fragile_blocks=5)
    [manifest] = stored_runs(store, "fault-plugin-error")
    tasks = RunStore(store).read_table("fault-plugin-error", manifest["run_id"])
    fault.recovered()
    assert tasks.groupby("prefix")["tasks"].sum()["slow_block"] == 4
    assert "fragile_block" not in set(tasks["prefix"])
    assert any("plugin hit 5 internal error(s)" in w for w in manifest["warnings"]), \
        manifest["warnings"]
    fault.survived()
