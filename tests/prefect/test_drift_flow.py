"""A drifting pipeline end to end: real flow, LocalCluster and Prefect server.

One run gives the per-prefix table of the pipeline; ten earlier nights are that table with
the ``compute`` stage scaled down by 12% a night (stored with ``RunStore.write_run``). The
next real run is then judged: the drift fails the flow, a Prefect event names it, the
markdown artifact shows the flagged prefix's recent nights, the trend page is linked, only
the flagged stages have their reports, and the fleet view has the run.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import pandas as pd
import pytest
from helpers.profiled_flows import make_flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.events.worker import EventsWorker

from prefect_dask_profiling.prefect.events import DRIFT_EVENT
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.store.runs import RunStore, new_run_id

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

LOCAL = {"n_workers": 2, "threads_per_worker": 1, "processes": True, "dashboard_address": ":0"}
OPTIONS = {"min_seconds": 0.0, "min_share": 0.0}


def artifacts_of(flow_run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: a for a in found if a.key}


def seed_drifting_history(store: RunStore, pipeline: str, tasks: pd.DataFrame) -> None:
    now = datetime.now(UTC)
    for back in range(10, 0, -1):
        started = now - timedelta(days=back, hours=1)
        factor = (tasks["stage"] == "compute").map({True: 1.12 ** back, False: 1.0})
        scaled = tasks.assign(total_s=tasks["total_s"] / factor)  # only compute drifts
        doc = {"version": "1", "status": "healthy", "state": "COMPLETED",
               "started": started.isoformat(), "utilisation": {"run": 0.5, "stages": {}}}
        assert not store.write_run(pipeline, new_run_id(started), {"tasks": scaled},
                                   doc).spooled


def test_drift_fails_the_flow_emits_an_event_and_shows_in_the_artifacts(prefect_server,
                                                                           tmp_path):
    first = RunStore(str(tmp_path / "first"))
    runner = ProfiledDaskTaskRunner(cluster_kwargs=LOCAL, store=first.url,
                                    check_options=OPTIONS)
    assert make_flow(runner, name="drifting")(delay=0.05, return_state=True).is_completed()
    [run] = first.list_runs("drifting")
    tasks = first.read_table("drifting", run["run_id"], "tasks")

    store = RunStore(str(tmp_path / "store"))
    seed_drifting_history(store, "drifting", tasks)
    hook_file = tmp_path / "hook.txt"
    runner = ProfiledDaskTaskRunner(cluster_kwargs=LOCAL, store=store.url,
                                    check_options=OPTIONS, stage_reports="auto")
    state = make_flow(runner, name="drifting", hook_file=str(hook_file))(
        delay=0.05, return_state=True)
    assert state.is_failed()
    message = hook_file.read_text()
    assert message.startswith("RegressionDetected: ") and "drift in" in message
    assert "slow_block" in message

    newest = store.list_runs("drifting")[0]
    manifest = store.read_manifest("drifting", newest["run_id"])
    assert newest["status"] == "regressed" and any(
        "slow_block" in p for p in manifest["drift"]["failing"])
    stages = {s["name"]: s for s in manifest["stages"]}
    drifted = {p.split("/", 1)[0] for p in manifest["drift"]["drifting"]}
    assert drifted == {"compute"}, manifest["drift"]
    # the history's other stages are ten copies of one run: on a loaded machine tonight's
    # prepare stage can also be a one-night regression, and then it is flagged too
    verdicts = store.read_table("drifting", newest["run_id"], "regression")
    flagged = drifted | set(verdicts.loc[verdicts["verdict"] == "regression", "stage"])
    for name, info in stages.items():  # stage_reports="auto": only a flagged stage's report
        assert (info["report"] is not None) == (name in flagged), (name, info)
    assert "report not" not in str(manifest["warnings"]), manifest["warnings"]
    fleet = pd.read_parquet(tmp_path / "store" / "fleet")
    assert set(fleet["run_id"]) == {newest["run_id"]}

    flow_run_id = state.state_details.flow_run_id
    found = artifacts_of(flow_run_id)
    markdown = found["drifting-run"].data
    assert "Flagged prefixes" in markdown and "slow_block | drift" in markdown
    assert "drifting-trend" in found, (sorted(found), manifest["warnings"])
    # the drifted stage's report is drawn after the judgement: its link posted with the rest
    assert {k for k in found if "-report-" in k} == {f"drifting-report-{s}" for s in flagged}
    assert found["drifting-trend"].data.endswith("trend.html)")

    EventsWorker.drain_all()
    events = []
    for _ in range(120):
        response = httpx.post(f"{prefect_server.api_url}/events/filter", json={
            "filter": {"event": {"name": [DRIFT_EVENT]},
                       "any_resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}}},
            timeout=10)
        response.raise_for_status()
        events = response.json()["events"]
        if events:
            break
        time.sleep(0.5)
    [event] = events
    assert event["payload"]["run_id"] == newest["run_id"] and event["payload"]["fails"]
    assert any(p["prefix"].startswith("slow_block") for p in event["payload"]["prefixes"])
