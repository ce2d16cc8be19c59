"""ProfiledDaskTaskRunner against a real Prefect server and real Dask clusters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distributed import Client
from helpers import dask_processes
from helpers.profiled_flows import crunch, make_flow
from helpers.tiers import starts_processes
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect_dask import DaskTaskRunner, get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.store.runs import RunStore

pytestmark = pytest.mark.usefixtures("prefect_server")

LOCAL = {"n_workers": 2, "threads_per_worker": 1, "processes": True, "dashboard_address": ":0"}


def artifacts_of(flow_run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: a for a in found if a.key}


def manifests(store_url: str, pipeline: str) -> list[dict]:
    store = RunStore(store_url)
    return [store.read_manifest(pipeline, r["run_id"]) for r in store.list_runs(pipeline)]


# -- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, field", [
    ({"report_retention_days": -1}, "report_retention_days"),
    ({"report_retention_days": 0}, "report_retention_days"),
    ({"threshold": 1.0}, "threshold"),
    ({"threshold": 0.5}, "threshold"),
    ({"on_regression": "explode"}, "on_regression"),
    ({"retry_on_regression": "yes"}, "retry_on_regression"),
    ({"retry_on_regression": 1}, "retry_on_regression"),
    ({"store": "nosuchproto://bucket/x"}, "unknown protocol"),
    ({"pipeline": "../etc"}, "pipeline"),
    ({"version": "a/b"}, "version"),
    ({"history": 0}, "history"),
    ({"stage_reports": "yes"}, "stage_reports"),
    ({"stage_reports": 1}, "stage_reports"),
    ({"report_min_seconds": -1}, "report_min_seconds"),
    ({"report_renderer": "scheduler"}, "report_renderer"),
    ({"check_options": {"bogus": 1}}, "check_options"),
    ({"address": "tcp://127.0.0.1:1", "cluster_class": "distributed.LocalCluster"}, "address"),
])
def test_bad_arguments_fail_before_any_cluster(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ProfiledDaskTaskRunner(**kwargs)


def test_duplicate_keeps_profiling_options_and_base_arguments():
    runner = ProfiledDaskTaskRunner(cluster_kwargs={"n_workers": 1}, store="memory://x",
                                    pipeline="p", version="2", report_retention_days=7,
                                    on_regression="warn", threshold=3.0, stage_reports=False,
                                    retry_on_regression=True)
    copy = runner.duplicate()
    assert type(copy) is ProfiledDaskTaskRunner
    assert copy.profiling == runner.profiling
    assert copy.profiling.retry_on_regression is True
    assert copy.cluster_kwargs == {"n_workers": 1}
    assert copy == runner
    assert copy != DaskTaskRunner(cluster_kwargs={"n_workers": 1})


# -- a real run on the default LocalCluster ----------------------------------------------------


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def local_run(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store"))
    runner = ProfiledDaskTaskRunner(cluster_kwargs=LOCAL, store=store, stage_reports=True)
    state = make_flow(runner, name="runner-local")(return_state=True)
    return store, state


def test_local_cluster_run_completes_and_stores_layout(local_run):
    store_url, state = local_run
    assert state.is_completed(), state.message
    [manifest] = manifests(store_url, "runner-local")
    assert manifest["state"] == "COMPLETED" and manifest["status"] == "healthy"
    assert manifest["version"] == "1" and manifest["source_hash"]
    run_dir = Path(store_url, "runs", "runner-local", manifest["run_id"])
    for name in ("tasks.csv", "workers.csv", "transfers.csv", "utilisation.csv",
                 "orchestration.csv", "manifest.json", "trend.html"):
        assert (run_dir / name).exists(), name
    assert set(manifest["files"]) >= {"tasks.csv", "workers.csv"}
    assert manifest["workers"] == 2 and manifest["threads"] == 2


def test_two_stages_give_two_nonempty_reports(local_run):
    store_url, _ = local_run
    [manifest] = manifests(store_url, "runner-local")
    stages = {s["name"]: s for s in manifest["stages"]}
    assert {"prepare", "compute"} <= set(stages)
    for name in ("prepare", "compute"):
        report = stages[name]["report"]
        assert report and report["tasks"] > 0, stages[name]
        html = Path(report["location"]).read_text()
        assert "number of tasks" in html and len(html) > 10_000


def test_wrapper_task_work_is_attributed_to_its_stage_not_counted_twice(local_run):
    store_url, _ = local_run
    [manifest] = manifests(store_url, "runner-local")
    store = RunStore(store_url)
    tasks = store.read_table("runner-local", manifest["run_id"], "tasks")
    orchestration = store.read_table("runner-local", manifest["run_id"], "orchestration")
    prepare = tasks[tasks["stage"] == "prepare"]
    # crunch's inner matmul ran on the cluster under the wrapper's stage; the time crunch
    # waited on it is orchestration, only its own work is task time
    assert prepare["tasks"].sum() > 10
    assert prepare.loc[prepare["prefix"] == "crunch", "tasks"].tolist() == [1]
    assert orchestration.loc[orchestration["prefix"] == "crunch", "tasks"].tolist() == [1]
    compute = tasks[tasks["stage"] == "compute"]
    assert compute.loc[compute["prefix"].str.contains("slow_block"), "tasks"].sum() == 16
    assert manifest["utilisation"]["run"] <= 1.05


def test_artifacts_are_attached_to_the_flow_run(local_run):
    _, state = local_run
    found = artifacts_of(state.state_details.flow_run_id)
    assert {"runner-local-summary", "runner-local-run", "runner-local-regression"} <= set(found)
    summary = json.loads(found["runner-local-summary"].data)
    assert {row["stage"] for row in summary} >= {"prepare", "compute"}
    assert all(isinstance(row["total_s"], float) for row in summary)
    verdicts = json.loads(found["runner-local-regression"].data)
    assert {row["verdict"] for row in verdicts} == {"insufficient-history"}
    assert "Utilisation" in found["runner-local-run"].data
    assert {"runner-local-report-prepare", "runner-local-report-compute"} <= set(found)


# -- address= of real scheduler and worker processes ---------------------------------------------


@pytest.fixture(scope="module")
@starts_processes("dask scheduler and worker processes")
def external_cluster(tmp_path_factory):
    """Workers that can import the test flows' module."""
    with dask_processes.external_cluster(tmp_path_factory.mktemp("dask")) as cluster:
        yield cluster.address


def test_flow_on_external_cluster_address(external_cluster, tmp_path):
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=str(tmp_path))
    state = make_flow(runner, name="runner-address")(return_state=True)
    assert state.is_completed(), state.message
    [manifest] = manifests(str(tmp_path), "runner-address")
    store = RunStore(str(tmp_path))
    tasks = store.read_table("runner-address", manifest["run_id"], "tasks")
    assert set(tasks["stage"]) >= {"prepare", "compute"}
    assert tasks.loc[tasks["prefix"].str.contains("slow_block"), "tasks"].sum() == 16
    assert manifest["utilisation"]["run"] <= 1.05


def test_the_history_is_read_while_the_flow_computes(external_cluster, tmp_path):
    """Read at the run's start in the background, it holds the runs stored before it."""
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=str(tmp_path))
    for _ in range(2):
        state = make_flow(runner, name="runner-early-history")(blocks=4, return_state=True)
        assert state.is_completed(), state.message
    first, second = sorted(manifests(str(tmp_path), "runner-early-history"),
                           key=lambda m: m["run_id"])
    for manifest in (first, second):
        read = manifest["history_read"]
        assert read["when"] == "run start", read
        assert manifest["started"] <= read["at"] <= manifest["ended"]
    assert second["baseline"]["runs"] == [first["run_id"]]


def test_a_report_link_is_posted_while_the_flow_runs(external_cluster, tmp_path):
    """The report thread posts a stored report's link artifact during the next stage;
    finish() posts only the links not posted yet (here the last stage's), each once."""
    import time

    from prefect.context import FlowRunContext

    from prefect_dask_profiling._util import artifact_key

    runner = ProfiledDaskTaskRunner(address=external_cluster, store=str(tmp_path))
    seen_in_body: list[str] = []

    def link_keys() -> list[str]:
        run_id = FlowRunContext.get().flow_run.id
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
        return sorted(a.key for a in found if a.key and "-report-" in a.key)

    @flow(name="runner-links-early", version="1", task_runner=runner)
    @profiled
    def body() -> float:
        with stage("first"):
            total = crunch.submit(200, 1).result()
        with stage("second"):
            total += crunch.submit(200, 2).result()
            deadline = time.monotonic() + 60  # a condition, not a duration: waits for it
            while not seen_in_body and time.monotonic() < deadline:
                seen_in_body.extend(link_keys())
                time.sleep(0.2)
        return total

    state = body(return_state=True)
    assert state.is_completed(), state.message
    first = artifact_key("runner-links-early", "report", "first")
    second = artifact_key("runner-links-early", "report", "second")
    assert seen_in_body == [first]  # posted before finish(), the second not yet drawn
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    keys = [a.key for a in found if a.key and "-report-" in a.key]
    assert sorted(keys) == [first, second]  # each link once


def test_forgetting_finish_is_visible(external_cluster, tmp_path, caplog):
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=str(tmp_path))
    state = make_flow(runner, name="runner-forgot", decorate=False)(return_state=True)
    assert state.is_completed()
    [manifest] = manifests(str(tmp_path), "runner-forgot")
    assert any("finish() was never called" in w for w in manifest["warnings"])
    assert manifest["state"] == "COMPLETED"
    assert "finish() was never called" in caplog.text


def _dask_recorder(client: Client) -> tuple[int, int] | None:
    """(id, append counter) of Dask's task-stream recorder, ``None`` when not installed."""

    def read(dask_scheduler) -> tuple[int, int] | None:  # nested: sent by value
        plugin = dask_scheduler.plugins.get("task-stream")
        return None if plugin is None else (id(plugin), plugin.index)

    return client.run_on_scheduler(read)


def test_no_stage_means_one_default_stage_and_no_plugin_left(external_cluster, tmp_path):
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=str(tmp_path))

    @flow(name="runner-nostage", version="1", task_runner=runner)
    @profiled
    def plain() -> float:
        return crunch.submit(200, 2).result()

    assert plain(return_state=True).is_completed()
    [manifest] = manifests(str(tmp_path), "runner-nostage")
    assert [s["name"] for s in manifest["stages"]] == ["default"]
    with Client(external_cluster) as client:
        plugins = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    assert "task-stream" not in plugins  # the run never installs Dask's recorder
    assert not [p for p in plugins if p.startswith("task-timings")]


def test_a_run_leaves_dask_s_task_stream_recorder_to_the_dashboard(external_cluster,
                                                                    tmp_path):
    """The run's reports draw the task records its own plugin keeps: a Dask task-stream
    recorder the dashboard (or a user's ``get_task_stream``) starts while the run goes on is
    still there after it, still recording (the runner used to install that recorder for
    its reports and remove it at the run's end, from under whoever used it since)."""
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=str(tmp_path))

    @flow(name="runner-dashboard", version="1", task_runner=runner)
    @profiled
    def staged() -> float:
        with stage("crunch"):
            out = crunch.submit(200, 2).result()
            with get_dask_client() as client:  # the dashboard is opened mid-run
                client.run_on_scheduler(
                    lambda dask_scheduler: dask_scheduler.get_task_stream_index())
        return out

    with Client(external_cluster) as client:
        assert _dask_recorder(client) is None
        try:
            assert staged(return_state=True).is_completed()
            after = _dask_recorder(client)
            client.submit(sum, [1, 2], pure=False).result()
            later = _dask_recorder(client)
            plugins = client.run_on_scheduler(
                lambda dask_scheduler: list(dask_scheduler.plugins))
        finally:
            client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.plugins.pop("task-stream", None) and None)
    assert after is not None and later is not None, "the run removed Dask's recorder"
    assert later[0] == after[0] and later[1] == after[1] + 1  # the same one, recording
    assert not [p for p in plugins if p.startswith("task-timings")]
    [manifest] = manifests(str(tmp_path), "runner-dashboard")
    [info] = manifest["stages"]
    assert info["report"]["tasks"] >= 1 and not info["report"]["truncated"]


def test_auto_reports_skip_a_short_stage_but_not_one_that_raised(external_cluster, tmp_path):
    runner = ProfiledDaskTaskRunner(address=external_cluster, store=str(tmp_path),
                                    stage_reports="auto")

    @flow(name="runner-raised", version="1", task_runner=runner)
    @profiled
    def broken() -> None:
        with stage("fine"):
            crunch.submit(200, 2).result()
        with stage("broken"):
            crunch.submit(200, 3).result()
            raise RuntimeError("the stage broke")

    state = broken(return_state=True)
    assert state.is_failed() and "the stage broke" in state.message
    [manifest] = manifests(str(tmp_path), "runner-raised")
    stages = {s["name"]: s for s in manifest["stages"]}
    assert stages["fine"]["report"] is None
    assert stages["fine"]["note"].startswith("no report: the stage ran"), stages["fine"]
    report = stages["broken"]["report"]
    assert report and report["tasks"] >= 1, stages["broken"]
    assert "number of tasks" in Path(report["location"]).read_text()


def test_workers_that_cannot_load_the_flow_fail_it_cleanly(tmp_path_factory, tmp_path):
    """Workers without the flow's module would hang the flow; we fail it with the fix."""
    bare = tmp_path_factory.mktemp("dask-bare")
    with dask_processes.external_cluster(bare, pythonpath=(dask_processes.ROOT,)) as cluster:
        runner = ProfiledDaskTaskRunner(address=cluster.address, store=str(tmp_path))
        state = make_flow(runner, name="runner-unloadable")(return_state=True)
    assert state.is_failed()
    assert "cannot load this flow" in state.message
    assert "No module named 'helpers'" in state.message  # helpers.profiled_flows' package


def test_pickled_runner_leaves_store_credentials_behind():
    import pickle

    runner = ProfiledDaskTaskRunner(store="s3://bucket/x",
                                    storage_options={"key": "AKIAEXAMPLE", "secret": "s3cr3t"})
    blob = pickle.dumps(runner)
    assert b"s3cr3t" not in blob and b"AKIAEXAMPLE" not in blob
    assert pickle.loads(blob).profiling.store == "s3://bucket/x"
    assert runner.profiling.storage_options == {"key": "AKIAEXAMPLE", "secret": "s3cr3t"}


@pytest.mark.parametrize("is_async", [False, True])
def test_profiled_function_carries_only_the_flow_function(is_async, caplog):
    """Prefect pickles the flow with every task it sends to Dask and nested functions
    travel by value: the decorated function closes over the flow function and the
    parameter name only, and keeps the flow function's name, signature and kind."""
    import asyncio
    import inspect

    if is_async:
        async def body(store: str | None = None) -> int:
            return 7
    else:
        def body(store: str | None = None) -> int:
            return 7
    wrapped = profiled(body)
    assert {id(c.cell_contents) for c in wrapped.__closure__} == {id(body), id("store")}
    assert inspect.iscoroutinefunction(wrapped) is is_async
    assert wrapped.__name__ == "body"
    assert inspect.signature(wrapped) == inspect.signature(body)
    # outside a profiled flow run: the value, and a warning that nothing is recorded
    value = asyncio.run(wrapped()) if is_async else wrapped()
    assert value == 7
    assert "nothing is recorded" in caplog.text
