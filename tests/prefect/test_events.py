"""Prefect events on a regression or drift, read back from a real server; an Automation fires.

The server is the session's real ``prefect server start`` (tests/helpers/prefect_server.py); the
Automation's notification goes to a real HTTP endpoint on 127.0.0.1 that records requests.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid

import httpx
import pandas as pd
import pytest

from prefect_dask_profiling.prefect.events import (
    DRIFT_EVENT,
    REGRESSION_EVENT,
    emit_detection_events,
    event_payload,
    findings,
)
from prefect_dask_profiling.regression.judge import Judgement, Outcome
from prefect_dask_profiling.regression.rule import Rules
from prefect_dask_profiling.run.pipeline import FinishResult
from prefect_dask_profiling.store.manifest import RunKey

pytestmark = pytest.mark.slow


def result(flow_run_id: str | None, run_id: str, *, regression: bool = True,
           drift: bool = True, failed: bool = False) -> FinishResult:
    verdicts = pd.DataFrame({
        "stage": ["read", "reduce"], "prefix": ["open_dataset", "nanmedian"],
        "verdict": ["regression" if regression else "ok", "ok"], "cause": ["slower tasks", ""],
        "baseline_s": [10.0, 5.0], "latest_s": [25.0, 5.1], "ratio": [2.5, 1.02]})
    drift_rows = pd.DataFrame({
        "stage": ["reduce"], "prefix": ["nanmedian"], "verdict": ["drift" if drift else "ok"],
        "fails": [True], "cumulative_ratio": [2.3], "start_run": ["20261101T020000Z-aaaaaa"],
        "start_s": [5.0], "level_s": [11.5]})
    manifest = {"flow_run_id": flow_run_id, "flow_run_name": "nightly-ndvi-1",
                "state": "FAILED" if failed else "COMPLETED",
                "status": "failed" if failed else "regressed"}
    failing = ((("read", "open_dataset", "total_s"),) if regression else ()) \
        + ((("reduce", "nanmedian", "drift"),) if drift else ())
    outcome = Outcome(regressed=(regression or drift) and not failed,
                      reason="the run is failed: its regressed prefixes do not count"
                      if failed else "", failing=() if failed else failing,
                      episodes=() if failed else tuple(f"ep-{i:010x}"
                                                       for i in range(len(failing))))
    judgement = Judgement(run=RunKey(run_id, "ndvi", "v3"), rules=Rules(),
                          verdicts=verdicts, outcome=outcome, tables={"drift": drift_rows})
    return FinishResult(run_id=run_id, pipeline="ndvi", version="v3",
                        status=manifest["status"], summary=pd.DataFrame(),
                        utilisation=pd.DataFrame(), verdicts=verdicts, manifest=manifest,
                        location=f"/store/runs/ndvi/{run_id}", regressed=outcome.regressed,
                        warnings=[], judgement=judgement)


def test_payload_and_findings_are_pure_and_json_clean():
    r = result("0" * 32, "r1")
    found = findings(r)
    assert set(found) == {REGRESSION_EVENT, DRIFT_EVENT}
    payload = event_payload(r, found[REGRESSION_EVENT], {"read": "https://x/read.html"},
                            "https://x/trend.html", fails=True)
    assert payload["prefixes"] == [{"stage": "read", "prefix": "open_dataset",
                                    "verdict": "regression", "ratio": 2.5, "baseline_s": 10.0,
                                    "latest_s": 25.0, "cause": "slower tasks",
                                    "episode": "ep-0000000000"}]
    assert payload["episodes"] == ["ep-0000000000", "ep-0000000001"]
    assert payload["report_links"] == {"read": "https://x/read.html"}
    json.dumps(payload)
    assert findings(result("0" * 32, "r1", regression=False, drift=False)) == {}


def test_a_failed_run_has_no_findings():
    """A failed run's flagged prefixes do not count (its times are partial): no event says
    ``regression.detected``, let alone with ``fails: true`` (issue 19, item 6)."""
    assert findings(result("0" * 32, "r1", failed=True)) == {}
    events, warnings = emit_detection_events(result(None, "r1"))
    assert events == [] and "no Prefect flow run" in warnings[0]


class Recorder(http.server.BaseHTTPRequestHandler):
    """A notification endpoint: keeps each POST body."""

    bodies: list[str] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.bodies.append(self.rfile.read(length).decode(errors="replace"))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def webhook():
    Recorder.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", Recorder.bodies
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def read_events(api_url: str, name: str, run_id: str, wait_s: float = 60.0) -> list[dict]:
    """Events named ``name`` whose payload names ``run_id``, from the server's events API."""
    deadline = time.monotonic() + wait_s
    while True:
        response = httpx.post(f"{api_url}/events/filter", json={
            "filter": {"event": {"name": [name]}, "order": "DESC"}, "limit": 50}, timeout=10)
        response.raise_for_status()
        found = [e for e in response.json()["events"]
                 if (e.get("payload") or {}).get("run_id") == run_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_events_reach_the_server_and_an_automation_notifies(prefect_server, webhook):
    from prefect import flow
    from prefect.automations import Automation
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.worker import EventsWorker

    hook_url, bodies = webhook
    block_id = CustomWebhookNotificationBlock(
        name="dask-profiling-test", url=hook_url, method="POST",
        json_data={"text": "{{subject}}: {{body}}"},
    ).save(f"dp-hook-{uuid.uuid4().hex[:8]}", overwrite=True)
    automation = Automation(
        name=f"dask-profiling regression {uuid.uuid4().hex[:6]}",
        trigger=EventTrigger(expect={REGRESSION_EVENT}, posture=Posture.Reactive,
                             threshold=1, within=0),
        actions=[SendNotification(
            block_document_id=block_id, subject="dask-profiling regression",
            body="{{ event.payload.pipeline }} run {{ event.payload.run_id }}: "
                 "{{ event.payload.flagged }} prefix(es)")],
    ).create()
    time.sleep(2)  # the triggers service loads new automations as it is told of them
    run_id = f"20261130T020000Z-{uuid.uuid4().hex[:6]}"

    @flow(name="nightly-ndvi-events")
    def nightly() -> tuple[str, list[str]]:
        from prefect.runtime import flow_run

        events, warnings = emit_detection_events(
            result(flow_run.id, run_id), {"read": "https://example.org/read.html"},
            "https://example.org/trend.html", fail_on_regression=True)
        return flow_run.id, [e.event for e in events] + warnings

    try:
        flow_run_id, emitted = nightly()
        EventsWorker.drain_all()
        assert emitted == [REGRESSION_EVENT, DRIFT_EVENT]
        [event] = read_events(prefect_server.api_url, REGRESSION_EVENT, run_id)
        assert event["resource"]["prefect.resource.id"] == f"prefect.flow-run.{flow_run_id}"
        assert event["resource"]["dask-profiling.pipeline"] == "ndvi"
        roles = {r["prefect.resource.role"]: r["prefect.resource.id"]
                 for r in event["related"]}
        assert roles["flow"].startswith("prefect.flow.")
        payload = event["payload"]
        assert payload["fails"] is True and payload["prefixes"][0]["ratio"] == 2.5
        assert payload["report_links"]["read"] == "https://example.org/read.html"
        assert payload["trend_link"] == "https://example.org/trend.html"
        [drift] = read_events(prefect_server.api_url, DRIFT_EVENT, run_id)
        assert drift["payload"]["prefixes"][0]["cumulative_ratio"] == 2.3

        deadline = time.monotonic() + 90
        while not any(run_id in b for b in bodies) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert any(f"ndvi run {run_id}: 1 prefix(es)" in b for b in bodies), bodies
    finally:
        automation.delete()
