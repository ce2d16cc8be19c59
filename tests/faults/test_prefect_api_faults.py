"""The Prefect API goes away exactly while the run's artifacts are created.

The run talks to the session's Prefect server through a TCP relay; the relay stops just
before ``finish()`` (every connection closed, new ones refused, as when the server goes
down) and listens again on the same port right after it: artifact creation fails with a
warning, the summaries are stored anyway, and the regression verdict still fails the flow
run once Prefect can record it again. (A server of its own, stopped and started, cost four
server starts; the client cannot tell the two apart.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from datetime import UTC, datetime

import pandas as pd
import pytest
from helpers.prefect_server import use_server
from helpers.s3_servers import TcpRelay
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from faults.fault_flows import make_fault_flow
from prefect_dask_profiling._util import artifact_key
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.regression.verdict import RegressionDetected
from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, new_run_id

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]

PIPELINE = "fault-api-down"


def seed_fast_history(store: RunStore, pipeline: str, runs: int = 3) -> None:
    """Healthy earlier runs in which ``compute/slow_block`` took a tenth of a second."""
    for second in range(runs):
        tasks = pd.DataFrame([{"stage": "compute", "prefix": "slow_block", "tasks": 8,
                               "total_s": 0.1, "p50_s": 0.0125, "p95_s": 0.0125,
                               "gb_out": 0.0}], columns=TASKS_COLUMNS)
        run_id = new_run_id(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC))  # in the past
        store.write_run(pipeline, run_id, {"tasks": tasks},
                        {"version": "1", "status": "healthy", "state": "COMPLETED"})


@pytest.mark.parametrize("stage_reports", [False, True], ids=["no-reports", "reports"])
def test_api_down_while_artifacts_are_created(tmp_path, prefect_server, cluster, hooks, fault,
                                              caplog, stage_reports):
    """Nothing ``finish()`` posts is created, and the verdict is not held up. With reports,
    the background service posts each stage's link as soon as its report is stored,
    possibly before the API stops (the last one too, when the hook that stops it is slower
    than the report): those links may be the only artifacts made."""
    pipeline = f"{PIPELINE}-{'reports' if stage_reports else 'plain'}"
    store_url = str(tmp_path / "store")
    store = RunStore(store_url)
    seed_fast_history(store, pipeline)
    upstream = ("127.0.0.1", prefect_server.port)
    relays = contextlib.ExitStack()
    relay = relays.enter_context(TcpRelay(upstream))
    server = dataclasses.replace(prefect_server, api_url=f"{relay.endpoint}/api",
                                 port=relay.port)
    outage = {}

    def stop_api() -> None:
        relays.close()
        fault.inject("Prefect API down while artifacts are created")
        outage["start"] = time.monotonic()

    def restart_api() -> None:
        outage["finish_s"] = time.monotonic() - outage["start"]
        relays.enter_context(TcpRelay(upstream, port=relay.port))

    hooks["before_finish"] = stop_api
    hooks["after_finish"] = restart_api
    runner = ProfiledDaskTaskRunner(address=cluster.address, store=store_url,
                                    stage_reports=stage_reports)
    fault.expect_summary()
    try:
        with use_server(server), caplog.at_level(logging.WARNING, "prefect_dask_profiling"):
            state = make_fault_flow(runner, pipeline, explicit=True)(
                delay=0.2, blocks=8, return_state=True)
            with get_client(sync_client=True) as client:
                recorded = client.read_flow_run(state.state_details.flow_run_id)
                artifacts = client.read_artifacts(  # the session's server holds others too
                    artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_=pipeline)))
    finally:
        relays.close()
    fault.timing(f"Prefect API down: finish() took {outage['finish_s']:.2f} s without it")
    assert any("artifact not created" in r.getMessage() for r in caplog.records)
    made = {a.key for a in artifacts if a.key and a.key.startswith(pipeline)}
    links = {artifact_key(pipeline, "report", name) for name in ("load", "compute")}
    assert made <= (links if stage_reports else set())  # nothing finish() posted
    [latest] = store.list_runs(pipeline)[:1]
    manifest = store.read_manifest(pipeline, latest["run_id"])
    fault.recovered()
    assert manifest["flow_run_id"] == str(state.state_details.flow_run_id)
    assert manifest["regressed"] is True and manifest["status"] == "regressed"
    reported = [s["name"] for s in manifest["stages"] if s.get("report")]
    assert bool(reported) == stage_reports, manifest["stages"]
    # the verdict still applies: the run failed on it, and Prefect recorded that
    assert state.is_failed()
    with pytest.raises(RegressionDetected):
        state.result()
    assert recorded.state.type.value == "FAILED"
    assert "Regression" in (recorded.state.message or "")
    fault.survived()
