"""A first night (a new pipeline: no history, no ETA) whose deadline has passed emits
``late``, read back from a real Prefect server: a real flow on a real LocalCluster.

The deadline is one second after the flow run's scheduled start, so it has passed long
before the flow's second stage, which waits (bounded) for the event to reach the server:
no timing assert, the run only has to get there.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from helpers.eta_flows import events_of, make_eta_flow
from prefect.events.worker import EventsWorker

from prefect_dask_profiling.forecast.live import AT_RISK_EVENT, LATE_EVENT, event_id
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server"),
              pytest.mark.timeout(600)]

PIPELINE = "eta-first-late"
CLUSTER = {"n_workers": 2, "threads_per_worker": 1, "processes": False,
           "dashboard_address": ":0"}


def test_a_first_night_without_an_eta_is_late_once_its_deadline_passed(tmp_path,
                                                                       prefect_server):
    store = RunStore(str(tmp_path / "store"))
    runner = ProfiledDaskTaskRunner(cluster_kwargs=CLUSTER, store=store.url,
                                    stage_reports=False, on_regression="warn",
                                    eta_interval=0.5, deadline=timedelta(seconds=1))
    flow = make_eta_flow(runner, PIPELINE)
    state = flow(0.1, api_url=prefect_server.api_url, await_event=LATE_EVENT,
                 expect_progress=False, return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    run = out["flow_run_id"]
    assert out["seen"] is True, "no late event reached the server while the run went on"
    EventsWorker.drain_all(timeout=10)
    [late] = events_of(prefect_server.api_url, run, LATE_EVENT)
    assert events_of(prefect_server.api_url, run, AT_RISK_EVENT) == []  # needs an ETA
    assert late["id"] == str(event_id(run, "late", 1))
    assert late["resource"]["prefect.resource.id"] == f"prefect.flow-run.{run}"
    payload = late["payload"]
    assert payload["eta"]["known"] is False and payload["eta"]["text"].startswith("no ETA")
    assert payload["judged"]["on"] == "clock" and payload["judged"]["finish"] is None
    assert datetime.fromisoformat(payload["judged"]["at"]) >= datetime.fromisoformat(
        payload["deadline"])
    [stored] = store.list_runs(PIPELINE)  # the night itself is stored as usual
    assert stored["run_id"] == payload["run_id"]
