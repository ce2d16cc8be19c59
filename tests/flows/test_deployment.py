"""prefect.yaml for real: deploy offline to a local server, run the deployment with a worker."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers.ndvi_fixtures import artifacts_by_key
from helpers.prefect_server import prefect_executable
from prefect.client.orchestration import get_client

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
POOL = "ndvi-process"
DEPLOYMENT = "nightly-ndvi/nightly-ndvi"


def prefect(server, *args: str, timeout: float = 120, cwd: Path = ROOT) -> str:
    env = server.client_env()
    env["PWD"] = str(ROOT)  # prefect.yaml's pull step directory is "{{ $PWD }}"
    done = subprocess.run([prefect_executable(), *args], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{output[-3000:]}"
    return output


def test_deploy_schedule_and_run_with_a_process_worker(prefect_server, tmp_path):
    prefect(prefect_server, "work-pool", "create", POOL, "--type", "process", "--overwrite")
    prefect(prefect_server, "--no-prompt", "deploy", "--all")
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
    assert deployment.work_pool_name == POOL
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in deployment.schedules] == [
        ("0 2 * * *", "UTC", True)]
    assert deployment.parameters == {"size": "small", "slowdown": "none"}
    assert deployment.pull_steps == [{"prefect.deployments.steps.set_working_directory": {
        "directory": str(ROOT)}}]

    store, data = tmp_path / "store", tmp_path / "data"
    output = prefect(prefect_server, "deployment", "run", DEPLOYMENT, "--param", "size=tiny",
                     "--param", f"store={store}", "--param", f"data_url={data}")
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", output).group(1)
    # the worker starts elsewhere: the pull step must bring the run back to the checkout
    prefect(prefect_server, "worker", "start", "--pool", POOL, "--run-once", timeout=400,
            cwd=tmp_path)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
    assert run.state.type.value == "COMPLETED", run.state
    assert run.deployment_id == deployment.id
    assert run.parameters["size"] == "tiny"
    arts = artifacts_by_key(run.state)
    assert {"nightly-ndvi-summary", "nightly-ndvi-run", "nightly-ndvi-regression"} <= set(arts)
    runs = list((store / "runs" / "nightly-ndvi").iterdir())
    assert len(runs) == 1 and (runs[0] / "manifest.json").exists()
    assert os.path.isdir(data / "products" / "tiny" / "ndvi-median.zarr")
