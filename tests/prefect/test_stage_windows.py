"""Stages as users write them in a flow body, through real flows on a real cluster.

* A stage name reused in a loop (``for tile in tiles: with stage("process"):``) is one stage:
  one manifest entry with the name's totals and how many windows it had, and one report.
* Dask work that ran on local threads of the flow process inside a stage (a bare
  ``.compute()``: prefect-dask's clients are not the default client) is not profiled; the
  run says so in the flow-run logs, the manifest stage entry and the markdown artifact.
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import pytest
from helpers import dask_processes
from helpers.profiled_flows import crunch
from helpers.tiers import starts_processes
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.logging.handlers import APILogHandler
from prefect_dask import get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.store.runs import RunStore

pytestmark = pytest.mark.usefixtures("prefect_server")

TILES = 3


@pytest.fixture(scope="module")
@starts_processes("dask scheduler and worker processes")
def external_cluster(tmp_path_factory):
    """A scheduler and two worker processes that can import the test flows' module."""
    with dask_processes.external_cluster(tmp_path_factory.mktemp("dask")) as cluster:
        yield cluster.address


def only_manifest(store_url: str, pipeline: str) -> dict:
    store = RunStore(store_url)
    [run] = store.list_runs(pipeline)
    return store.read_manifest(pipeline, run["run_id"])


def flow_run_texts(flow_run_id) -> tuple[str, dict[str, str]]:
    """The flow run's log lines and its artifacts (key -> data), as the Prefect API has them."""
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs), {a.key: str(a.data) for a in artifacts}


# -- a stage name reused in a loop ------------------------------------------------------------


@pytest.fixture(scope="module")
def loop_run(external_cluster, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store"))
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=store, stage_reports=True)

    @flow(name="stage-loop", version="1", task_runner=runner)
    @profiled
    def tiles() -> float:
        total = 0.0
        for tile in range(TILES):
            with stage("read"):
                total += crunch.submit(80, tile).result()
            with stage("process"), get_dask_client() as client:
                total += client.compute(da.ones(40, chunks=4).sum()).result()
        return total

    state = tiles(return_state=True)
    assert state.is_completed(), state.message
    return store, only_manifest(store, "stage-loop")


def test_a_stage_name_reused_in_a_loop_is_one_entry_with_its_windows(loop_run):
    store, manifest = loop_run
    assert [s["name"] for s in manifest["stages"]] == ["read", "process"]
    tasks = RunStore(store).read_table("stage-loop", manifest["run_id"], "tasks")
    for entry in manifest["stages"]:
        assert entry["windows"] == TILES
        assert entry["tasks"] == tasks.loc[tasks["stage"] == entry["name"], "tasks"].sum() > 0


def test_a_stage_name_reused_in_a_loop_has_one_report_covering_every_window(loop_run):
    store, manifest = loop_run
    process = next(s for s in manifest["stages"] if s["name"] == "process")
    report = process["report"]
    assert report and report["location"].endswith("process.html")
    assert report["tasks"] >= process["tasks"]  # all windows, not the last one only
    html = Path(report["location"]).read_text()
    assert f"number of tasks: {report['tasks']}" in html
    assert "read" in process["note"] and f"{TILES} windows" in process["note"]
    reports = sorted(p.name for p in Path(report["location"]).parent.glob("*.html"))
    assert reports == ["process.html", "read.html"]


# -- Dask work that ran on local threads, not on the cluster ---------------------------------


@pytest.fixture(scope="module")
def local_run(external_cluster, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store"))
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=store)

    @flow(name="stage-local", version="1", task_runner=runner)
    @profiled
    def local_work() -> float:
        with stage("work"):
            a = da.ones((64, 64), chunks=8).sum().compute()  # local threads
        with stage("helper"), get_dask_client():
            b = da.ones((64, 64), chunks=8).sum().compute()  # local threads too
        with stage("cluster"), get_dask_client() as client:
            c = client.compute(da.ones((64, 64), chunks=8).sum()).result()  # the cluster
        return float(a + b + c)

    state = local_work(return_state=True)
    assert state.is_completed(), state.message
    return state, only_manifest(store, "stage-local")


def test_local_work_is_counted_in_the_manifest_stage_entry(local_run):
    _, manifest = local_run
    stages = {s["name"]: s for s in manifest["stages"]}
    for name in ("work", "helper"):
        local = stages[name]["local_work"]
        assert local["tasks"] >= 64 and local["seconds"] > 0, stages[name]
        note = stages[name]["note"]
        assert f"stage {name!r}: {local['tasks']} Dask tasks ran on local threads" in note
        assert "client.compute" in note and "Prefect task" in note
        assert stages[name]["tasks"] == 0  # what the cluster recorded of it: nothing
    assert stages["cluster"]["local_work"] is None and stages["cluster"]["tasks"] > 0
    assert "local threads" not in (stages["cluster"]["note"] or "")


def test_local_work_is_said_in_the_flow_run_logs_and_the_markdown_artifact(local_run):
    state, manifest = local_run
    logs, artifacts = flow_run_texts(state.state_details.flow_run_id)
    markdown = artifacts["stage-local-run"]
    assert "## Work the profile did not see" in markdown
    for name in ("work", "helper"):
        tasks = next(s for s in manifest["stages"] if s["name"] == name)["local_work"]["tasks"]
        said = f"stage {name!r}: {tasks} Dask tasks ran on local threads"
        assert said in logs
        assert said in markdown
    assert "stage 'cluster'" not in logs
