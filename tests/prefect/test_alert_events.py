"""Alert episodes through the one judgement and a real Prefect server (issue 23).

Nights are finished through :func:`finish_run` on generated records (one real record scaled
per stage) with ``confirm="always"``, so every flagged prefix waits a night: an injected step
is suspected, then detected, then resolved once it is gone; a one-night blip is suspected,
then cleared; an acknowledged episode fails no later night. Events are emitted as the runner
does and read back from the server's events API; emitting a night twice (a retried flow
run) adds nothing, because every event has a stable id.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from helpers.run_records import record_stages, scaled

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.prefect.events import (
    EPISODE_KINDS,
    REGRESSION_EVENT,
    emit_detection_events,
)
from prefect_dask_profiling.regression.alert_history import acknowledge
from prefect_dask_profiling.regression.judge import judge_stored
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id

pytestmark = pytest.mark.slow

PIPELINE = "alerting"
EPISODE_EVENTS = [f"dask-profiling.regression.{kind}" for kind in EPISODE_KINDS]
SETTINGS = ProfilingOptions(check_options={"min_seconds": 0.0, "min_share": 0.0,
                                           "confirm": "always", "resolve_after": 3})


def read_episode_events(api_url: str, episode_id: str, expect: int,
                        wait_s: float = 60.0) -> list[str]:
    """Names of the events on the server that concern ``episode_id`` (its own events, and
    run-level regression events listing it); waits until ``expect`` arrived or time is up."""
    deadline = time.monotonic() + wait_s
    while True:
        response = httpx.post(f"{api_url}/events/filter", json={
            "filter": {"event": {"name": [REGRESSION_EVENT, *EPISODE_EVENTS]},
                       "order": "DESC"}, "limit": 50}, timeout=10)
        response.raise_for_status()
        names = [e["event"] for e in response.json()["events"]
                 if ((e.get("payload") or {}).get("episode") or {}).get("id") == episode_id
                 or episode_id in ((e.get("payload") or {}).get("episodes") or [])]
        if len(names) >= expect or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


def test_an_episode_lives_suspected_detected_resolved_and_a_blip_clears(
        record, tmp_path, prefect_server):
    from prefect import flow
    from prefect.events.worker import EventsWorker

    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    start = datetime(2026, 11, 1, 2, tzinfo=UTC)
    plan = [1, 1, 1, 1, 3, 3, 1, 1, 1, 3, 1, 3, 3, "ack", 3]

    @flow(name="alert-lifecycle")
    def nights() -> list:
        from prefect.runtime import flow_run

        out = []
        day = 0
        for step in plan:
            if step == "ack":
                for episode in out[-1].judgement.outcome.episodes:  # the morning after
                    acknowledge(store, PIPELINE, "1", episode,
                                at=start + timedelta(days=day - 1, hours=6))
                continue
            when = start + timedelta(days=day)
            day += 1
            ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="1",
                             started=when, flow_run_id=flow_run.id)
            result = finish_run(store, scaled(record, {"read": step}), ctx, [], SETTINGS,
                                ended=when + timedelta(hours=1))
            for _ in range(2):  # the second time is a retried run: nothing new on the server
                emit_detection_events(result, fail_on_regression=True)
            out.append(result)
        return out

    results = nights()
    EventsWorker.drain_all()
    statuses = [r.status for r in results]
    assert statuses == ["healthy"] * 4 + ["suspected", "regressed"] + ["healthy"] * 3 \
        + ["suspected", "healthy", "suspected", "regressed", "acknowledged"], statuses
    assert [r.regressed for r in results].count(True) == 2  # the acked night does not fail
    step, blip, acked = (results[4].judgement.outcome.events,
                         results[9].judgement.outcome.events,
                         results[11].judgement.outcome.events)
    assert step and [e.kind for e in step] == ["suspected"] * len(step)  # one per read prefix
    assert {e.episode.stage for e in step} == {"read"}
    episode_id = next(e.episode.id for e in step if e.episode.prefix == "sum")
    kinds = read_episode_events(prefect_server.api_url, episode_id, expect=3)
    assert sorted(kinds) == [REGRESSION_EVENT, "dask-profiling.regression.resolved",
                             "dask-profiling.regression.suspected"], kinds
    blip_id = next(e.episode.id for e in blip if e.episode.prefix == "sum")
    assert sorted(read_episode_events(prefect_server.api_url, blip_id, expect=2)) == [
        "dask-profiling.regression.cleared", "dask-profiling.regression.suspected"]
    assert {e.episode.id for e in acked}.isdisjoint({episode_id, blip_id})
    for result in results:  # check re-judges each night to what it stored
        again = judge_stored(store, PIPELINE, result.run_id)
        assert again.judgement.regressed == result.regressed, result.run_id
        assert again.judgement.outcome.suspected == (result.status == "suspected")
