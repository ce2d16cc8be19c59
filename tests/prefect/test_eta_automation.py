"""The Automation of docs/eta.md, as its JSON reads, on a real Prefect server: created
through the API, its trigger fires on an ``at-risk`` event emitted by the live ETA's own code
(its forecast's news, told by the run's publisher) and its notification reaches a webhook."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from helpers.live_etas import live_eta

from prefect_dask_profiling.forecast.model import Eta, StageLag
from prefect_dask_profiling.prefect.runner import ProfilingOptions
from prefect_dask_profiling.store.manifest import RunContext

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

DOC = Path(__file__).resolve().parents[2] / "docs" / "eta.md"


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


def documented_automation() -> dict:
    [block] = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    return json.loads(block)


def test_the_documented_automation_fires_on_at_risk(prefect_server, webhook):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.events.worker import EventsWorker

    hook_url, bodies = webhook
    block_id = CustomWebhookNotificationBlock(
        name="dask-profiling-eta", url=hook_url, method="POST",
        json_data={"text": "{{subject}}: {{body}}"},
    ).save(f"dp-eta-{uuid.uuid4().hex[:8]}", overwrite=True)
    spec = documented_automation()
    spec["actions"][0]["block_document_id"] = str(block_id)
    spec["trigger"]["match_related"]["prefect.resource.id"] = \
        "dask-profiling.pipeline.eta-automation"
    created = httpx.post(f"{prefect_server.api_url}/automations/", json=spec, timeout=10)
    assert created.status_code == 201, created.text
    automation_id = created.json()["id"]
    try:
        time.sleep(2)  # the triggers service loads new automations as it is told of them
        live = live_eta(ProfilingOptions(deadline="06:00 UTC"), RunContext(
            run_id=f"20261203T010000Z-{uuid.uuid4().hex[:6]}", pipeline="eta-automation",
            version="1", flow_run_id=str(uuid.uuid4())))
        forecast = live.forecast
        forecast.deadline.at = datetime.now(UTC) + timedelta(minutes=5)
        eta = Eta(True, "ETA 06:10–06:25", remaining_s=600.0, remaining_low_s=600.0,
                  remaining_high_s=900.0, finish_low=datetime.now(UTC),
                  finish_high=datetime.now(UTC) + timedelta(minutes=15), percent_done=40.0,
                  lag=StageLag("ndvi", 95.0, 1800.0, 3510.0))
        assert forecast.judge_deadline(eta) == "at-risk"  # its finish is past the deadline
        assert forecast.sink.eta_events, "the event was not emitted"
        EventsWorker.drain_all(timeout=10)
        run_id = forecast.ctx.run_id
        deadline = time.monotonic() + 90
        while not any(run_id in b for b in bodies) and time.monotonic() < deadline:
            time.sleep(0.5)
        [body] = [b for b in bodies if run_id in b]
        assert "eta-automation at risk" in body and "ETA 06:10–06:25" in body, body
        assert "behind: ndvi" in body, body
    finally:
        httpx.delete(f"{prefect_server.api_url}/automations/{automation_id}", timeout=10)
