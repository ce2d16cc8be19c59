"""The live ETA end to end: real flows on a real LocalCluster and a real Prefect server.

Three real nights of one two-stage flow (tests/helpers/eta_flows.py), sharing one store:

1. a first night, no history: the run says "no ETA yet", no progress artifact, no event;
2. its stored night copied four times to earlier dates (the baseline), then a healthy
   night with a deadline hours away: the progress artifact moves monotonically to 100 %,
   one log line per stage boundary, no event; its estimate is in the store while stage
   ``one`` runs (read by the flow body, as ``dask-profiling eta`` reads it) and gone when
   the run has ended;
3. a night whose stage ``one`` runs 3x slow, with a deadline it will miss: ``at-risk``
   (read back from the server's events API) before stage ``two`` ends, then ``late`` while
   the run is still going (stage ``two`` waits for it, bounded); emitted again with its
   stable id, the server still has one event.

No timing assert: a night's length is sleeps; the deadline of night 3 is 30 s after its
scheduled start (its first estimate comes long before) and the run waits for ``late``.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from helpers.eta_flows import ONE_TASKS, events_of, make_eta_flow, progress_percent
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.events import emit_event
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker

from prefect_dask_profiling.forecast.live import AT_RISK_EVENT, LATE_EVENT, ON_TRACK_EVENT, event_id
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.run.background import Background
from prefect_dask_profiling.store.runs import RunStore, new_run_id

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server"),
              pytest.mark.timeout(600)]

PIPELINE = "eta-night"
CLUSTER = {"n_workers": 2, "threads_per_worker": 1, "processes": False,
           "dashboard_address": ":0"}
ONE_S = 0.75  # a healthy night's nap in stage one: 8 naps on 2 threads, ~3 s
KINDS = (AT_RISK_EVENT, ON_TRACK_EVENT, LATE_EVENT)


def runner(store: str, **options) -> ProfiledDaskTaskRunner:
    return ProfiledDaskTaskRunner(cluster_kwargs=CLUSTER, store=store, stage_reports=False,
                                  on_regression="warn", eta_interval=0.5,
                                  check_options={"min_seconds": 0.0, "min_share": 0.0},
                                  **options)


def all_events(api_url: str, flow_run_id: str) -> dict[str, list[dict]]:
    EventsWorker.drain_all(timeout=10)
    return {kind: events_of(api_url, flow_run_id, kind) for kind in KINDS}


def run_markdown(flow_run_id: str) -> str:
    """The run's markdown artifact (``<pipeline>-run``)."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
            key=ArtifactFilterKey(any_=[f"{PIPELINE}-run"])))
    assert len(found) == 1, found
    return found[0].data


def run_logs(flow_run_id: str, *wanted: str, wait_s: float = 60.0) -> list[str]:
    """The flow run's log messages, once each of ``wanted`` starts one (bounded wait: the
    ETA's lines are written by the background service, the last after the flow body)."""
    deadline = time.monotonic() + wait_s
    while True:
        APILogWorker.drain_all(timeout=10)
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        messages = [entry.message for entry in logs]
        if all(any(m.startswith(w) for m in messages) for w in wanted) or \
                time.monotonic() > deadline:
            return messages
        time.sleep(0.5)


def seed_history(store: RunStore, nights: int = 4) -> None:
    """The first night copied to ``nights`` earlier dates (as healthy nights)."""
    [first] = store.list_runs(PIPELINE)
    manifest = store.read_manifest(PIPELINE, first["run_id"])
    tables = {"tasks": store.read_table(PIPELINE, first["run_id"], "tasks")}
    started = datetime.fromisoformat(manifest["started"])
    for back in range(nights, 0, -1):
        at = started - timedelta(days=back)
        doc = {k: v for k, v in manifest.items() if k not in ("files", "run_id", "pipeline")}
        doc.update(started=at.isoformat(), status="healthy",
                   ended=(at + timedelta(seconds=manifest["wall_s"])).isoformat(),
                   stages=[_shifted(entry, at - started) for entry in manifest["stages"]])
        assert not store.write_run(PIPELINE, new_run_id(at), tables, doc).spooled


def _shifted(entry: dict, by: timedelta) -> dict:
    """A stage entry whose window (``allocation`` start / stop, the scheduler's clock) moved
    with its night's start: the ETA reads the lead and tail from them."""
    window = dict(entry.get("allocation") or {})
    for key in ("start", "stop"):
        if isinstance(window.get(key), int | float):
            window[key] += by.total_seconds()
    return {**entry, "allocation": window} if window else dict(entry)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> RunStore:
    return RunStore(str(tmp_path_factory.mktemp("eta-store")))


@pytest.fixture(scope="module")
def first_night(store, prefect_server):
    state = make_eta_flow(runner(store.url, deadline=timedelta(hours=2)), PIPELINE)(
        ONE_S, expect_progress=False, return_state=True)
    assert state.is_completed(), state.message
    out = state.result()
    seed_history(store)
    return out


@pytest.fixture(scope="module")
def healthy_night(first_night, store, prefect_server):
    state = make_eta_flow(runner(store.url, deadline=timedelta(hours=2)), PIPELINE)(
        ONE_S, store_url=store.url, return_state=True)
    assert state.is_completed(), state.message
    return state.result()


@pytest.fixture(scope="module")
def slow_night(healthy_night, store, prefect_server):
    flow = make_eta_flow(runner(store.url, deadline=timedelta(seconds=30),
                                deadline_margin=18.0), PIPELINE)
    state = flow(3 * ONE_S, api_url=prefect_server.api_url, await_event=LATE_EVENT,
                 return_state=True)
    assert state.is_completed(), state.message
    return state.result()


def test_without_history_the_run_says_so_and_emits_nothing(first_night, prefect_server):
    run = first_night["flow_run_id"]
    assert first_night["samples"] == [] and progress_percent(run) is None
    assert all(not found for found in all_events(prefect_server.api_url, run).values())
    logs = run_logs(run, "dask-profiling: no ETA yet")
    assert any("no ETA yet: needs 3 earlier runs" in m for m in logs), logs
    assert "- **ETA**: no ETA yet: needs 3 earlier runs" in run_markdown(run)


def test_a_healthy_night_moves_its_progress_to_100_and_emits_nothing(healthy_night,
                                                                    prefect_server):
    run = healthy_night["flow_run_id"]
    samples = healthy_night["samples"]
    assert samples and samples[0] < 100.0, samples
    assert samples == sorted(samples), samples  # never backwards
    deadline = time.monotonic() + 60  # the last update (100 %) is queued at the run's end
    while progress_percent(run) != 100.0 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert progress_percent(run) == 100.0
    assert all(not found for found in all_events(prefect_server.api_url, run).values())
    markdown = run_markdown(run)
    assert "- **ETA** at the start: ETA " in markdown
    assert "; ETA events: none" in markdown
    assert "- how the ETA fared (predicted finish minus actual, in % of the run's" in markdown
    logs = run_logs(run, *(f"dask-profiling: stage {n} done at " for n in ("one", "two")))
    for name in ("one", "two"):
        assert any(m.startswith(f"dask-profiling: stage {name} done at ") and "ETA" in m
                   for m in logs), logs


def test_a_running_night_stores_its_estimate_and_removes_it_at_its_end(healthy_night, store):
    live = healthy_night["live"]
    assert live is not None, "no stored estimate seen while stage one ran"
    assert live["flow_run_id"] == healthy_night["flow_run_id"]
    assert live["pipeline"] == PIPELINE and live["version"] == "1"
    assert live["stage"] == "one" and live["known"] is True
    assert 0.0 <= live["done_fraction"] < 1.0
    assert live["remaining_p50_s"] <= live["remaining_p90_s"]
    assert datetime.fromisoformat(live["finish_p50"]) <= datetime.fromisoformat(
        live["finish_p90"])
    assert datetime.fromisoformat(live["deadline"]) > datetime.fromisoformat(
        live["computed_at"])
    assert live["risk"] in (None, "on-track") and live["unknown"] == []
    assert live["text"].startswith("ETA ")
    assert store.list_runs(PIPELINE)[0]["run_id"] == live["run_id"]  # the run, stored
    Background.instance().drain(timeout=60)  # the removal is queued when the run ends
    assert store.live_estimates(PIPELINE) == {}
    assert not (Path(store.url) / "live" / PIPELINE / f"{live['run_id']}.json").exists()


def test_a_slow_first_stage_is_at_risk_before_stage_two_ends_then_late(slow_night,
                                                                      prefect_server):
    run = slow_night["flow_run_id"]
    assert slow_night["seen"] is True  # late came while stage two was still running
    found = all_events(prefect_server.api_url, run)
    [at_risk], [late] = found[AT_RISK_EVENT], found[LATE_EVENT]
    two_ended = datetime.fromisoformat(slow_night["two_ended"])
    assert datetime.fromisoformat(at_risk["occurred"]) < two_ended
    assert datetime.fromisoformat(at_risk["occurred"]) <= datetime.fromisoformat(
        late["occurred"])
    assert datetime.fromisoformat(late["occurred"]) < two_ended
    payload = at_risk["payload"]
    deadline = datetime.fromisoformat(payload["deadline"])
    assert datetime.fromisoformat(payload["eta"]["finish_high"]) > deadline - timedelta(
        seconds=payload["deadline_margin_s"])
    behind = payload["stage_behind"]
    assert behind is None or (behind["stage"] == "one" and behind["behind_pct"] > 0), behind
    assert at_risk["resource"]["prefect.resource.id"] == f"prefect.flow-run.{run}"
    roles = {r["prefect.resource.role"]: r["prefect.resource.id"] for r in at_risk["related"]}
    assert roles["pipeline"] == f"dask-profiling.pipeline.{PIPELINE}"
    assert roles["version"] == f"dask-profiling.pipeline.{PIPELINE}.version.1"
    assert at_risk["id"] == str(event_id(run, "at-risk", 1))
    assert late["id"] == str(event_id(run, "late", 1))
    assert ("ETA events: `dask-profiling.run.at-risk`, `dask-profiling.run.late`"
            in run_markdown(run))


def test_a_retried_emission_adds_no_second_event(slow_night, prefect_server):
    run = slow_night["flow_run_id"]
    [first] = all_events(prefect_server.api_url, run)[AT_RISK_EVENT]
    again = emit_event(AT_RISK_EVENT, resource=first["resource"], related=first["related"],
                       payload=first["payload"], id=event_id(run, "at-risk", 1))
    assert again is not None
    EventsWorker.drain_all(timeout=10)
    time.sleep(1.0)  # not a timing assert: a second event, if any, has had time to land
    assert len(all_events(prefect_server.api_url, run)[AT_RISK_EVENT]) == 1


def test_the_slow_stage_is_counted_in_tasks(slow_night, store):
    newest = store.list_runs(PIPELINE)[0]
    tasks = store.read_table(PIPELINE, newest["run_id"], "tasks")
    assert int(tasks[tasks["stage"] == "one"]["tasks"].sum()) == ONE_TASKS
