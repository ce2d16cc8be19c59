"""Reading back the events a flow emitted, from the session's real Prefect server."""

from __future__ import annotations

import time
import uuid

import httpx

SENTINEL = "dask-profiling-test.sentinel"


def events_of_run(api_url: str, name: str, run_id: str, wait_s: float = 60.0) -> list[dict]:
    """The events called ``name`` whose payload names ``run_id``.

    A sentinel event is emitted and waited for first: everything this process emitted
    before it (one events worker, in order) has reached the server by then, so an empty
    answer means none was emitted, not that it is late.
    """
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    marker = uuid.uuid4().hex
    emit_event(SENTINEL, resource={"prefect.resource.id": f"dask-profiling-test.{marker}"},
               payload={"run_id": marker})
    EventsWorker.drain_all()

    def named(event: str, wanted: str) -> list[dict]:
        response = httpx.post(f"{api_url}/events/filter", json={
            "filter": {"event": {"name": [event]}, "order": "DESC"}, "limit": 50}, timeout=10)
        response.raise_for_status()
        return [e for e in response.json()["events"]
                if (e.get("payload") or {}).get("run_id") == wanted]

    deadline = time.monotonic() + wait_s
    while not named(SENTINEL, marker):
        assert time.monotonic() < deadline, "the sentinel event never reached the server"
        time.sleep(0.5)
    return named(name, run_id)
