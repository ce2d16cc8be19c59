"""What a night costs, through a real flow on an adaptive LocalCluster (1 -> 4 -> 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cost_flows import make_adaptive_flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server"),
              pytest.mark.timeout(600)]

CLUSTER = {"n_workers": 1, "threads_per_worker": 1, "processes": True,
           "dashboard_address": ":0"}
# scale up fast (any queued work wants more workers), scale down only after ~20 s of
# recommendations: the idle stage keeps its 4 workers whatever the machine's load
ADAPT = {"minimum": 1, "maximum": 4, "target_duration": "0.1s", "interval": "0.5s",
         "wait_count": 40}


def own_lifetimes(folder: Path) -> list[tuple[str, float, float]]:
    """Each worker's (address, start, stop) as the worker itself wrote it, in order per
    address (an address may be reused); stop is +inf for a worker still alive or killed."""
    events: dict[str, list[tuple[float, str]]] = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            events.setdefault(entry["worker"], []).append((entry["time"], entry["event"]))
    spans = []
    for worker, seen in events.items():
        start = None
        for stamp, event in sorted(seen):
            if event == "start":
                if start is not None:
                    spans.append((worker, start, float("inf")))
                start = stamp
            elif start is not None:
                spans.append((worker, start, stamp))
                start = None
        if start is not None:
            spans.append((worker, start, float("inf")))
    return spans


def overlap(span: tuple[str, float, float], start: float, stop: float) -> float:
    return max(0.0, min(span[2], stop) - max(span[1], start))


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store"))
    folder = tmp_path_factory.mktemp("lifetimes")
    runner = ProfiledDaskTaskRunner(cluster_class="distributed.LocalCluster",
                                    cluster_kwargs=CLUSTER, adapt_kwargs=ADAPT, store=store,
                                    stage_reports=False, on_regression="warn",
                                    cost={"worker_hour": 0.5})
    state = make_adaptive_flow(runner, str(folder), "cost-adaptive")(return_state=True)
    assert state.is_completed(), state.message
    run_store = RunStore(store)
    [entry] = run_store.list_runs("cost-adaptive")
    manifest = run_store.read_manifest("cost-adaptive", entry["run_id"])
    return manifest, own_lifetimes(folder), state


def test_allocated_worker_seconds_match_the_workers_own_lifetimes(adaptive_run):
    manifest, lives, _ = adaptive_run
    assert len(lives) >= 4  # the cluster did scale up
    stages = {row["scope"]: row for row in manifest["allocation"]["stages"]}
    assert set(stages) == {"burst", "idle", "tail"}
    for name, row in stages.items():
        truth = sum(overlap(span, row["start"], row["stop"]) for span in lives)
        print(f"cost-figures {name}: allocated {row['worker_s']:.3f} worker-s, workers' own "
              f"{truth:.3f} (ratio {row['worker_s'] / truth:.4f}), idle share "
              f"{row['idle_share']:.3f}")
        assert row["worker_s"] == pytest.approx(truth, rel=0.02), (
            name, row, lives, manifest["allocation"]["workers"])
    assert stages["idle"]["worker_s"] / stages["idle"]["wall_s"] == pytest.approx(4, rel=0.02)
    assert stages["tail"]["worker_s"] / stages["tail"]["wall_s"] == pytest.approx(1, rel=0.02)


def test_stages_and_outside_add_up_to_the_whole(adaptive_run):
    alloc = adaptive_run[0]["allocation"]
    parts = sum(row["worker_s"] for row in alloc["stages"]) + alloc["outside"]["worker_s"]
    print(f"cost-figures run: {alloc['run']['worker_s']:.3f} worker-s = stages "
          f"{parts - alloc['outside']['worker_s']:.3f} + outside "
          f"{alloc['outside']['worker_s']:.3f}; estimate {alloc['run']['cost']:.5f} USD")
    assert alloc["overlap_worker_s"] == pytest.approx(0.0, abs=1e-6)
    assert parts == pytest.approx(alloc["run"]["worker_s"], rel=1e-9)
    assert alloc["outside"]["worker_s"] > 0  # scaling waits and the flow's own Python


def test_four_workers_waiting_on_one_task_are_mostly_idle(adaptive_run):
    stages = {row["scope"]: row for row in adaptive_run[0]["allocation"]["stages"]}
    assert stages["idle"]["idle_share"] >= 0.70


def test_the_rate_turns_into_an_estimate_in_the_manifest_and_artifact(adaptive_run):
    manifest, _, state = adaptive_run
    alloc = manifest["allocation"]
    assert alloc["rates"]["text"] == "0.5 USD per worker-hour"
    assert alloc["run"]["cost"] == pytest.approx(0.5 * alloc["run"]["worker_s"] / 3600)
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    [run_md] = [a for a in found if a.key == "cost-adaptive-run"]
    assert "estimate" in run_md.data and "0.5 USD per worker-hour" in run_md.data


def test_rates_by_resource_tag_and_cluster_class_through_a_flow(tmp_path):
    """A worker started with ``resources={"GPU": 1}`` is priced by the resource rule (first
    match), the cluster class is the runner's; rules that priced no worker are named in a
    warning at the first stage."""
    from helpers.cost_flows import nap
    from prefect import flow

    from prefect_dask_profiling import stage
    from prefect_dask_profiling.prefect.runner import profiled

    cost = {"resources": {"GPU": {"worker_hour": 2.0}},
            "clusters": {"LocalCluster": {"worker_hour": 0.5}}}
    runner = ProfiledDaskTaskRunner(
        cluster_kwargs={"n_workers": 1, "threads_per_worker": 1, "processes": False,
                        "resources": {"GPU": 1}, "dashboard_address": ":0"},
        store=str(tmp_path / "store"), stage_reports=False, on_regression="warn", cost=cost)

    def body() -> float:
        with stage("gpu"):
            return nap.submit(0.2).result()

    state = flow(name="cost-tags", version="1", task_runner=runner)(profiled(body))(
        return_state=True)
    assert state.is_completed(), state.message
    store = RunStore(str(tmp_path / "store"))
    [entry] = store.list_runs("cost-tags")
    manifest = store.read_manifest("cost-tags", entry["run_id"])
    alloc = manifest["allocation"]
    assert alloc["rates"]["cluster"] == "LocalCluster"
    [worker] = alloc["workers"]
    assert worker["resources"] == {"GPU": 1.0}
    assert alloc["run"]["cost"] == pytest.approx(2.0 * alloc["run"]["worker_s"] / 3600)
    assert alloc["unpriced_workers"] == []
    assert "cost: clusters 'LocalCluster' matched no worker (cluster class " \
           "'LocalCluster')" in manifest["warnings"]
