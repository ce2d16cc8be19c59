"""RunStore against a real SeaweedFS server: lifecycle expiry, link expiry, exclusive create.

moto stores lifecycle rules but never deletes anything and does not enforce presigned-link
expiry; SeaweedFS does both (expiry triggered with ``weed shell s3.lifecycle.run-shard``).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

import httpx
import pandas as pd
import pytest
from helpers.s3_servers import boto_client, s3_options, seaweedfs
from helpers.tiers import starts_processes

from prefect_dask_profiling.cli.store import report_link
from prefect_dask_profiling.store import layout, s3
from prefect_dask_profiling.store.runs import RunStore, StoreError, new_run_id

pytestmark = pytest.mark.slow
BUCKET = "perf-weed"


@pytest.fixture(scope="session")
@starts_processes("SeaweedFS")
def weed():
    with seaweedfs() as server:
        boto_client(server.endpoint, key=server.key, secret=server.secret).create_bucket(
            Bucket=BUCKET)
        yield server


def make_store(weed, prefix: str, tmp_path) -> RunStore:
    return RunStore(f"s3://{BUCKET}/{prefix}", s3_options(weed.endpoint, weed.key, weed.secret),
                    spool_dir=tmp_path / "spool", timeout=10)


def write_run(store: RunStore) -> str:
    run_id = new_run_id()
    frame = pd.DataFrame({"stage": ["read"], "prefix": ["open"], "tasks": [3], "total_s": [1.5],
                          "p50_s": [0.5], "p95_s": [0.6], "gb_out": [0.1]})
    stages = [{"name": "read", "report": None}]
    result = store.write_run("ndvi", run_id, {"tasks": frame},
                             {"version": "v1", "status": "healthy", "stages": stages})
    assert not result.spooled, result.warnings
    assert not store.write_report("ndvi", run_id, "read", "<html>r</html>").spooled
    return run_id


def test_lifecycle_rule_expires_reports_and_keeps_summaries(weed, tmp_path):
    store = make_store(weed, "pfx", tmp_path)
    neighbour = make_store(weed, "neighbour", tmp_path)  # same bucket, other prefix
    run_id, other_run = write_run(store), write_run(neighbour)

    assert store.ensure_lifecycle(30) is None
    client = boto_client(weed.endpoint, key=weed.key, secret=weed.secret)
    rules = client.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]
    expire = [r for r in rules if r.get("Expiration")]
    assert [(r["Filter"]["Prefix"], r["Expiration"]) for r in expire] == [
        ("pfx/reports/", {"Days": 30})]

    # Days cannot elapse in a test: the same rule (same ID and filter) with a date in the past.
    dated = s3.lifecycle_rules("pfx", 30)
    dated[0]["Expiration"] = {"Date": datetime(2020, 1, 1, tzinfo=UTC)}
    assert s3.merge_lifecycle(store.fs, BUCKET, dated)
    assert len(client.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]) == 2

    report = f"pfx/reports/ndvi/{run_id}/read.html"
    deadline = time.monotonic() + 30
    while report in _keys(client) and time.monotonic() < deadline:
        weed.shell(f"s3.lifecycle.run-shard -shards 0-15 -s3 {weed.s3_grpc} -runtime 10s")
    keys = _keys(client)
    assert report not in keys
    assert f"neighbour/reports/ndvi/{other_run}/read.html" in keys
    assert f"pfx/runs/ndvi/{run_id}/manifest.json" in keys
    assert f"pfx/{layout.index_marker('ndvi', 'v1', run_id, 'healthy')}" in keys
    assert store.read_table("ndvi", run_id)["tasks"].tolist() == [3]
    with pytest.raises(StoreError, match="expired or never written"):
        report_link(store, run_id, "read", "ndvi")


def test_expired_presigned_link_is_refused(weed, tmp_path):
    store = make_store(weed, "links", tmp_path)
    run_id = write_run(store)
    url = store.presign(store.location(f"reports/ndvi/{run_id}/read.html"), 2)
    response = httpx.get(url, timeout=10)  # asks for gzip and decodes it, as a browser
    assert response.status_code == 200 and response.headers["Content-Encoding"] == "gzip"
    assert response.text == "<html>r</html>"
    time.sleep(3)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 403


def test_run_is_never_overwritten(weed, tmp_path):
    """SeaweedFS reports the exclusive-create clash as OSError(EINVAL), not FileExistsError."""
    store = make_store(weed, "clash", tmp_path)
    run_id = write_run(store)
    frame = pd.DataFrame({"stage": ["x"], "prefix": ["y"], "tasks": [99], "total_s": [9.0],
                          "p50_s": [1.0], "p95_s": [1.0], "gb_out": [0.0]})
    with pytest.raises(StoreError, match="never overwritten"):
        store.write_run("ndvi", run_id, {"tasks": frame}, {"version": "v1"})
    assert store.read_table("ndvi", run_id)["tasks"].tolist() == [3]


def _keys(client) -> set[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    return {obj["Key"] for page in pages for obj in page.get("Contents", [])}
