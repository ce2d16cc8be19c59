"""Regression verdicts through a real Prefect server: Failed runs, hooks, warn mode, baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distributed import LocalCluster
from helpers.prefect_events import events_of_run
from helpers.profiled_flows import make_flow
from helpers.tiers import starts_processes
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.regression.verdict import RegressionDetected
from prefect_dask_profiling.store.runs import RunStore

pytestmark = pytest.mark.usefixtures("prefect_server")

NORMAL, SLOW = 0.02, 0.12  # seconds per slow_block task: 16 tasks, 0.3 s -> 1.9 s


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def run(address: str, store: Path, delay: float, *, version: str = "1",
        on_regression: str = "fail", hook_file: Path | None = None, name: str = "verdicts"):
    runner = ProfiledDaskTaskRunner(address=address, store=str(store),
                                    on_regression=on_regression)
    flow = make_flow(runner, name=name, version=version,
                     hook_file=str(hook_file) if hook_file else None)
    return flow(delay=delay, return_state=True)


def latest_manifest(store: Path, pipeline: str) -> dict:
    s = RunStore(str(store))
    return s.read_manifest(pipeline, s.list_runs(pipeline)[0]["run_id"])


def regression_artifact(state) -> list[dict]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    [artifact] = [a for a in found if a.key and a.key.endswith("-regression")]
    return json.loads(artifact.data)


@pytest.fixture(scope="module")
def history(cluster, tmp_path_factory):
    """Three normal nights: none may fail, the first ones have insufficient history."""
    store = tmp_path_factory.mktemp("verdict-store")
    states = [run(cluster, store, NORMAL) for _ in range(3)]
    return store, states


def test_first_runs_never_fail(history):
    store, states = history
    assert all(s.is_completed() for s in states), [s.message for s in states]
    verdicts = regression_artifact(states[0])
    assert {row["verdict"] for row in verdicts} == {"insufficient-history"}
    assert all(m["status"] == "healthy" for m in
               [RunStore(str(store)).read_manifest("verdicts", r["run_id"])
                for r in RunStore(str(store)).list_runs("verdicts")])


def test_slowdown_after_normal_history_fails_the_run_and_fires_the_hook(cluster, history,
                                                                        tmp_path):
    store, _ = history
    hook_file = tmp_path / "hook.txt"
    state = run(cluster, store, SLOW, hook_file=hook_file)
    assert state.is_failed()
    assert "slow_block" in state.message
    with pytest.raises(RegressionDetected) as info:
        state.result()
    flagged = info.value.verdicts
    assert "slow_block" in set(flagged.loc[flagged["verdict"] == "regression", "prefix"])
    assert hook_file.read_text().startswith("RegressionDetected")
    manifest = latest_manifest(store, "verdicts")
    assert manifest["state"] == "FAILED" and manifest["status"] == "regressed"
    assert len(manifest["baseline"]["runs"]) == 3
    rows = {(r["stage"], r["prefix"]): r for r in regression_artifact(state)}
    slow = [r for (stage, prefix), r in rows.items() if "slow_block" in prefix]
    assert slow and slow[0]["verdict"] == "regression" and slow[0]["cause"] == "slower tasks"
    with get_client(sync_client=True) as client:
        server_state = client.read_flow_run(state.state_details.flow_run_id).state
    assert server_state.is_failed()


def test_regressed_run_stays_out_of_the_baseline(cluster, history):
    store, _ = history
    # the regressed night above must not become the median: a second slow night still fails
    state = run(cluster, store, SLOW)
    assert state.is_failed()
    assert len(latest_manifest(store, "verdicts")["baseline"]["runs"]) == 3


def test_warn_mode_completes_and_reports(cluster, history, tmp_path):
    store, _ = history
    hook_file = tmp_path / "hook.txt"
    state = run(cluster, store, SLOW, on_regression="warn", hook_file=hook_file)
    assert state.is_completed()
    assert not hook_file.exists(), "warn mode: no failure, so no on_failure hook"
    verdicts = regression_artifact(state)
    flagged = {row["prefix"] for row in verdicts if row["verdict"] == "regression"}
    assert any("slow_block" in prefix for prefix in flagged), verdicts
    assert latest_manifest(store, "verdicts")["status"] == "regressed"


def test_version_change_resets_the_baseline(cluster, history):
    store, _ = history
    state = run(cluster, store, SLOW, version="2")
    assert state.is_completed(), state.message
    manifest = latest_manifest(store, "verdicts")
    assert manifest["version"] == "2" and manifest["baseline"]["runs"] == []
    assert "new baseline" in manifest["baseline"]["note"]
    assert {row["verdict"] for row in regression_artifact(state)} == {"insufficient-history"}


def run_markdown_artifact(state) -> str:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    [artifact] = [a for a in found if a.key and a.key.endswith("-run")]
    return artifact.data


def test_a_broken_verdict_step_never_changes_the_flow_and_is_visible(cluster, history,
                                                                     monkeypatch):
    from prefect_dask_profiling.run import pipeline as finishing

    def broken(end) -> None:
        raise RuntimeError("verdict bug for the test")

    monkeypatch.setattr(finishing, "STEPS", [(n, broken if n == "judgement" else s)
                                             for n, s in finishing.STEPS])
    store, _ = history
    state = run(cluster, store, SLOW)  # would regress; the verdict cannot be computed
    assert state.is_completed(), state.message
    assert isinstance(state.result(), float)  # the flow's own result is untouched
    manifest = latest_manifest(store, "verdicts")
    assert manifest["status"] == "unjudged"
    assert "verdict bug for the test" in manifest["unjudged_reason"]
    markdown = run_markdown_artifact(state)
    assert "not judged" in markdown and "verdict bug for the test" in markdown


def test_a_pipeline_unjudged_two_nights_running_says_its_gate_is_blind(cluster, tmp_path,
                                                                        monkeypatch,
                                                                        prefect_server):
    """Issue 56, target 3: the verdict cannot be computed two nights running. The first
    night is a notice; the second says the gate is blind: a line at the top of the run's
    markdown, a warning, the manifest's streak, and ``dask-profiling.judgement.unjudged``
    (read back from the real server) with the streak, the cause and the command."""
    from prefect_dask_profiling.regression.blind import UNJUDGED_EVENT
    from prefect_dask_profiling.run import pipeline as finishing

    def broken(end) -> None:
        raise RuntimeError("verdict bug for the test")

    monkeypatch.setattr(finishing, "STEPS", [(n, broken if n == "judgement" else s)
                                             for n, s in finishing.STEPS])
    store = tmp_path / "store"
    states = [run(cluster, store, NORMAL, name="verdicts-blind") for _ in range(2)]
    assert all(state.is_completed() for state in states)
    s = RunStore(str(store))
    first, second = (s.read_manifest("verdicts-blind", r["run_id"])
                     for r in reversed(s.list_runs("verdicts-blind")))
    assert first["status"] == second["status"] == "unjudged"
    assert (first["unjudged"]["streak"], first["unjudged"]["blind"]) == (1, False)
    assert (second["unjudged"]["streak"], second["unjudged"]["blind"]) == (2, True)
    assert any("regression gate is blind" in w for w in second["warnings"])
    assert "the regression gate is blind" in run_markdown_artifact(states[1])
    assert "the regression gate is blind" not in run_markdown_artifact(states[0])
    assert events_of_run(prefect_server.api_url, UNJUDGED_EVENT, first["run_id"]) == []
    [event] = events_of_run(prefect_server.api_url, UNJUDGED_EVENT, second["run_id"])
    payload = event["payload"]
    assert payload["streak"] == 2 and "verdict bug for the test" in payload["cause"]
    assert payload["fix"] == ("dask-profiling check --pipeline verdicts-blind --run "
                              f"{second['run_id']}")
