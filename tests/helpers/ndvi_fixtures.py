"""Session fixture: a short history of nightly NDVI runs on the real Prefect server.

Registered through ``pytest_plugins`` in conftest.py so that test_nightly_flow.py and
test_ui.py share one history (flow runs are the expensive part of these tests).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

HISTORY_RUNS = 3
# the catalogue search returns ten times the scenes: the read stage runs 10x the chunks. The
# judge fails a first night only when it is conclusive (regression/confirm.py): 10x the tasks
# is, whatever the load does to the seconds (CI once measured the read stage under the 4x
# extreme bar; the machine's noise must not decide a count's verdict).
SLOWED = {"slowdown": "more-tasks", "slowdown_stage": "read", "slowdown_factor": 10}
# GDAL range merging off: more requests per chunk, whole objects (run after the history)
MERGE_OFF = {"slowdown": "slower-tasks", "slowdown_stage": "read", "slowdown_factor": 3}
BUCKET = "ndvi"


@dataclass
class NdviHistory:
    """Three normal runs, then one with a slowdown injected into the read stage."""

    store: str
    data: str
    data_options: dict
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
def scene_server():
    """A moto S3 server holding the scene archive (GDAL reads it through /vsis3/).

    Credentials go to the environment (GDAL and the Dask workers read them there).
    """
    from helpers.s3_servers import KEY, SECRET, boto_client, moto_server

    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    try:
        with moto_server() as endpoint:
            boto_client(endpoint).create_bucket(Bucket=BUCKET)
            yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def ndvi_history(prefect_server, scene_server, tmp_path_factory) -> NdviHistory:
    from flows.nightly_ndvi import nightly_ndvi  # imported here: plugins load for every test

    base = tmp_path_factory.mktemp("ndvi")
    store, notify = str(base / "store"), base / "notify.jsonl"
    data, options = f"s3://{BUCKET}/data", {"endpoint_url": scene_server}
    common = {"size": "tiny", "store": store, "data_url": data,
              "data_storage_options": options, "notify_url": f"file://{notify}"}
    normal = [nightly_ndvi(**common, return_state=True) for _ in range(HISTORY_RUNS)]
    slowed = nightly_ndvi(**common, **SLOWED, return_state=True)
    return NdviHistory(store=store, data=data, data_options=options, notify=notify,
                       normal=normal, slowed=slowed)
