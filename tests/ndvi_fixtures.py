"""Session fixture: a short history of nightly NDVI runs on the real Prefect server.

Registered through ``pytest_plugins`` in conftest.py so that test_nightly_flow.py and
test_ui.py share one history (flow runs are the expensive part of these tests).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

HISTORY_RUNS = 3
# 4 KiB range requests, each a round trip: every read task is several times slower
SLOWED = {"slowdown": "slower-tasks", "slowdown_stage": "read", "slowdown_factor": 6}


@dataclass
class NdviHistory:
    """Three normal runs, then one with a slowdown injected into the read stage."""

    store: str
    data: str
    notify: Path
    normal: list
    slowed: object

    def notifications(self) -> list[dict]:
        if not self.notify.exists():
            return []
        return [json.loads(line) for line in self.notify.read_text().splitlines() if line]


def flow_run_id(state) -> str:
    return str(state.state_details.flow_run_id)


def artifacts_by_key(state) -> dict:
    """The flow run's keyed artifacts, read back from the server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    return {a.key: a for a in found if a.key}


@pytest.fixture(scope="session")
def ndvi_history(prefect_server, tmp_path_factory) -> NdviHistory:
    from flows.nightly_ndvi import nightly_ndvi  # imported here: plugins load for every test

    base = tmp_path_factory.mktemp("ndvi")
    store, data, notify = str(base / "store"), str(base / "data"), base / "notify.jsonl"
    common = {"size": "tiny", "store": store, "data_url": data,
              "notify_url": f"file://{notify}"}
    normal = [nightly_ndvi(**common, return_state=True) for _ in range(HISTORY_RUNS)]
    slowed = nightly_ndvi(**common, **SLOWED, return_state=True)
    return NdviHistory(store=store, data=data, notify=notify, normal=normal, slowed=slowed)
