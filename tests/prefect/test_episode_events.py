"""One Automation filter pairs every page of an episode with its resolution (issue 56).

Nights are finished through :func:`finish_run` inside a real flow (one real record scaled
per stage, ``confirm="always"``: a flagged prefix waits a night) and their events emitted as
the runner does; the events are read back from the session's real Prefect server with the
server's own filter on the related resource ``dask-profiling.episode.<id>`` — the filter an
Automation's ``match_related`` applies (docs/alerts.md).

Two overlapping nights (A 02:00-04:00, B 03:00-03:30) both flag a 3x read: each judge cannot
see the other, so each pages its own episode ids. The replay folds B into A's episode; the
next night confirms it (``detected``), three quiet nights resolve it, and the ``resolved``
event names both A's and B's ids. A one-night blip is suspected, then cleared.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from helpers.run_records import record_stages, scaled

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.prefect.events import emit_detection_events
from prefect_dask_profiling.run.pipeline import FinishResult, finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id

pytestmark = pytest.mark.slow

PIPELINE = "pairing"
SETTINGS = ProfilingOptions(check_options={"min_seconds": 0.0, "min_share": 0.0,
                                           "confirm": "always", "resolve_after": 3})
PREFIX = "dask-profiling.regression."
# The field every lifecycle event names its episode in (spelled out as docs/alerts.md
# gives it to an Automation; prefect.events.EPISODE_RESOURCE and EPISODE_ROLE)
EPISODE_RESOURCE, EPISODE_ROLE = "dask-profiling.episode.", "episode"


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


def events_of_episode(api_url: str, episode_id: str, expect: int,
                      wait_s: float = 60.0) -> list[str]:
    """Names of the server's events whose related resource of role ``episode`` is
    ``episode_id`` (the server filters: the Automation's ``match_related``), oldest first;
    waits until ``expect`` arrived or time is up."""
    deadline = time.monotonic() + wait_s
    while True:
        response = httpx.post(f"{api_url}/events/filter", json={"filter": {
            "related": {"resources_in_roles": [[EPISODE_RESOURCE + episode_id,
                                                EPISODE_ROLE]]},
            "order": "ASC"}, "limit": 50}, timeout=10)
        response.raise_for_status()
        names = [e["event"].removeprefix(PREFIX) for e in response.json()["events"]]
        if len(names) >= expect or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


def paged(result: FinishResult, kind: str) -> set[str]:
    """The ids of ``result``'s ``kind`` events on the read stage's main prefix."""
    return {e.episode.id for e in result.judgement.outcome.events
            if e.kind == kind and (e.episode.stage, e.episode.prefix) == ("read", "sum")}


def test_every_lifecycle_event_names_its_episode_in_one_field(record, tmp_path,
                                                              prefect_server):
    from prefect import flow
    from prefect.events.worker import EventsWorker

    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    day0 = datetime(2026, 10, 1, tzinfo=UTC)
    # (day, read factor, start hour, hours run)
    plan = [(0, 1, 2, 1), (1, 1, 2, 1), (2, 1, 2, 1), (3, 1, 2, 1), (4, 3, 3, 0.5),
            (4, 3, 2, 2), (5, 3, 2, 1), (6, 1, 2, 1), (7, 1, 2, 1), (8, 1, 2, 1),
            (9, 3, 2, 1), (10, 1, 2, 1)]

    @flow(name="episode-pairing")
    def nights() -> list[FinishResult]:
        from prefect.runtime import flow_run

        out = []
        for day, factor, hour, hours in plan:
            when = day0 + timedelta(days=day, hours=hour)
            ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="1",
                             started=when, flow_run_id=flow_run.id)
            result = finish_run(store, scaled(record, {"read": factor}), ctx, [], SETTINGS,
                                ended=when + timedelta(hours=hours))
            emit_detection_events(result, fail_on_regression=True)
            out.append(result)
        return out

    results = nights()
    EventsWorker.drain_all()
    statuses = [r.status for r in results]
    assert statuses == ["healthy"] * 4 + ["suspected", "suspected", "regressed"] \
        + ["healthy"] * 3 + ["suspected", "healthy"], statuses
    (b_id,), (a_id,) = paged(results[4], "suspected"), paged(results[5], "suspected")
    assert a_id != b_id  # neither judge saw the other night
    assert paged(results[6], "detected") == {a_id}, results[6].judgement.outcome.events
    (blip,) = paged(results[10], "suspected")
    api = prefect_server.api_url
    assert events_of_episode(api, a_id, 3) == ["suspected", "detected", "resolved"]
    assert events_of_episode(api, b_id, 2) == ["suspected", "resolved"]
    assert events_of_episode(api, blip, 2) == ["suspected", "cleared"]
