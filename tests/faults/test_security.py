"""No credential leaks: a profiled flow against S3 with distinctive credentials, then a
search of every stored object, artifact, API log line, captured log line, process log and
manifest for any part of them; and no object is ever made public."""

from __future__ import annotations

import logging
import re

import pytest
from helpers.s3_servers import boto_client
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.logging.handlers import APILogHandler

from faults.fault_flows import expected, make_fault_flow
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.store.compression import page_bytes

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]

KEY = "AKIAFAULTSCANKEY7Q2X"
SECRET = "fAuLtScAn+SeCrEt/9x8y7z6w5v4u3t2s1r0qPONMlk"
TOKEN = "FwoGZXIvYXdzEFAULTSCANTOKENwEaDJ3x9yTokenTail8zQ"
PUBLIC_GRANTEES = ("AllUsers", "AuthenticatedUsers", "LogDelivery")
# A SigV4 presigned link legitimately names the access key id in X-Amz-Credential.
PRESIGNED = re.compile(r"https?://[^\s)\"'\]]*X-Amz-Signature=[0-9a-f]+")


def needles(secret: str) -> list[str]:
    """The secret and a few of its 8-character pieces."""
    return [secret] + [secret[i:i + 8] for i in range(0, len(secret) - 8, 5)]


def scan(texts: dict[str, str], secrets: list[str], allow_presigned: bool) -> list[str]:
    found = []
    for where, text in texts.items():
        if allow_presigned:
            text = PRESIGNED.sub("<presigned link>", text)
        found += [f"{needle!r} in {where}" for s in secrets for needle in needles(s)
                  if needle in text]
    return found


def prefect_texts(flow_run_id) -> dict[str, str]:
    """The flow run, its artifacts and its log lines, as stored by the Prefect API."""
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        logs = client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    texts = {"flow run": run.model_dump_json()}
    texts.update({f"artifact {a.key}": f"{a.description}\n{a.data}" for a in artifacts})
    texts["API logs"] = "\n".join(log.message for log in logs)
    return texts, artifacts, logs


def bucket_texts(endpoint: str, bucket: str) -> tuple[dict[str, str], list[str]]:
    """Every object of ``bucket`` as text, and the objects that have a public ACL grant."""
    client = boto_client(endpoint)
    texts, public = {}, []
    for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        key = obj["Key"]
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        texts[f"s3 {key}"] = page_bytes(body).decode(errors="replace")  # pages are gzip
        grants = client.get_object_acl(Bucket=bucket, Key=key)["Grants"]
        if any(g["Grantee"].get("Type") == "Group" or any(
                p in str(g["Grantee"].get("URI", "")) for p in PUBLIC_GRANTEES)
                for g in grants):
            public.append(key)
    return texts, public


def spool_texts(spool) -> dict[str, str]:
    return {f"spool {p}": p.read_bytes().decode(errors="replace")
            for p in spool.rglob("*") if p.is_file()}


def test_no_credential_in_anything_stored_published_or_logged(cluster, moto_endpoint, spool,
                                                               fault, caplog, capfd):
    caplog.set_level(logging.DEBUG, logger="prefect_dask_profiling")
    caplog.set_level(logging.INFO)
    bucket = "fault-secrets"
    boto_client(moto_endpoint).create_bucket(Bucket=bucket)
    options = {"endpoint_url": moto_endpoint, "key": KEY, "secret": SECRET}

    # 1. long-lived key + secret, everything uploads, reports get presigned links
    runner = ProfiledDaskTaskRunner(address=cluster.address, store=f"s3://{bucket}/nightly",
                                    storage_options=options, store_timeout=30,
                                    stage_reports=True)  # short stages: a report each anyway
    state = make_fault_flow(runner, "fault-secret-scan")(delay=0.05, blocks=4,
                                                          return_state=True)
    assert state.is_completed(), state.message
    assert state.result() == expected(4)
    texts, artifacts, logs = prefect_texts(state.state_details.flow_run_id)
    links = [a.data for a in artifacts if "-report-" in (a.key or "")]
    assert links and all("X-Amz-Signature" in link for link in links)  # presigned
    objects, public = bucket_texts(moto_endpoint, bucket)
    assert any(k.endswith("/manifest.json") for k in objects)
    assert any(k.endswith(".html") and "/reports/" in k for k in objects)
    assert public == []  # nothing is ever made public

    # 2. temporary credentials (session token) and a bucket that does not exist: every
    #    error path and the spool are searched too
    token_options = {**options, "token": TOKEN}
    runner = ProfiledDaskTaskRunner(address=cluster.address, store="s3://no-such-bucket/x",
                                    storage_options=token_options, store_timeout=5)
    fault.inject("store refuses writes under temporary credentials")
    fault.expect_summary()
    state2 = make_fault_flow(runner, "fault-secret-token")(delay=0.05, blocks=4,
                                                            return_state=True)
    assert state2.is_completed(), state2.message
    texts2, artifacts2, _ = prefect_texts(state2.state_details.flow_run_id)
    spooled = spool_texts(spool)
    assert any(k.endswith("manifest.json") for k in spooled)
    fault.recovered()
    assert not any("X-Amz-Security-Token" in a.data for a in artifacts2)

    captured = capfd.readouterr()
    everything = {**texts, **{f"run2 {k}": v for k, v in texts2.items()}, **objects,
                  **spooled, "captured log records": caplog.text,
                  "stdout": captured.out, "stderr": captured.err,
                  "dask process logs": cluster.logs()}
    assert len(caplog.records) > 10 and logs  # the scan really covered log lines
    assert scan(texts, [KEY], allow_presigned=False)  # the scan does see a key in a link
    assert scan(everything, [SECRET, TOKEN], allow_presigned=False) == []
    assert scan(everything, [KEY], allow_presigned=True) == []
    fault.survived()
