"""The store breaks between a run's provisional record and its final write: nothing is lost.

A real moto S3 server behind a real HTTP proxy (:class:`s3_servers.FaultProxy`) that, once
the provisional record is stored, answers chosen requests itself — a listing that never
answers, a 403, a 503 SlowDown on the listing of the run's folder or on every PUT — and a
store whose credentials lack ``s3:ListBucket`` (moto's IAM). Each time ``complete_run``
returns (never raises), its result names what it spooled, and the next run's delivery brings
the final manifest and every extra file to the store, byte-identical.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers.run_records import record_stages, spooled
from helpers.s3_servers import (
    FaultProxy,
    S3Request,
    boto_client,
    http_post,
    moto_server,
    reset_moto,
    s3_options,
)

from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store.compression import page_bytes
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id

pytestmark = pytest.mark.timeout(180)

BUCKET, ROOT, PIPE = "final-write", "nightly", "ndvi"
URL = f"s3://{BUCKET}/{ROOT}"
TIMEOUT = 5.0  # the final write's store: a hung call costs this much
SETUP_TIMEOUT = 30.0  # everything before the fault: generous, so load cannot spool it
EXTRA = {"regression.csv": b"stage,prefix,verdict\nread,open,ok\n",
         "trend.html": b"<html>trend</html>"}


def tasks() -> pd.DataFrame:
    return pd.DataFrame({
        "stage": ["read"], "prefix": ["open_dataset"], "tasks": [4], "total_s": [2.0],
        "p50_s": [0.5], "p95_s": [0.6], "gb_out": [0.1], "max_s": [0.7], "errors": [0],
        "reruns": [0], "transfer_s": [0.0], "disk_read_s": [0.0], "disk_write_s": [0.0],
        "share": [1.0]})


def provisional() -> dict:
    return {"version": "v1", "status": "unjudged", "unjudged_reason": "verdict pending",
            "state": "COMPLETED"}


def final() -> dict:
    return {"version": "v1", "status": "healthy", "unjudged_reason": None,
            "state": "COMPLETED", "regressed": False}


def run_folder_listing(request: S3Request) -> bool:
    """The listing of one run's folder (``runs/<pipeline>/<run_id>``), as complete_run does."""
    parts = request.prefix.rstrip("/").split("/")
    return request.is_list and len(parts) == 4 and parts[1] == "runs"


def is_put(request: S3Request) -> bool:
    return request.method == "PUT"


FAULTS = {
    "listing never answers": lambda r: "hang" if run_folder_listing(r) else None,
    "listing 403": lambda r: 403 if run_folder_listing(r) else None,
    "listing 503 SlowDown": lambda r: 503 if run_folder_listing(r) else None,
    "final PUTs 403": lambda r: 403 if is_put(r) else None,
    "final PUTs 503 SlowDown": lambda r: 503 if is_put(r) else None,
    "final PUTs never answer": lambda r: "hang" if is_put(r) else None,
}


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def bucket(moto):
    reset_moto(moto)
    boto_client(moto).create_bucket(Bucket=BUCKET)
    return moto


def stored(endpoint: str, rel: str, options: dict | None = None) -> bytes | None:
    """The stored bytes at ``rel`` (read straight from moto, not through the proxy)."""
    client = boto_client(endpoint, **(options or {}))
    try:
        return client.get_object(Bucket=BUCKET, Key=f"{ROOT}/{rel}")["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def check_complete(proxy: FaultProxy, endpoint: str, spool, run_id: str) -> None:
    """The store answers again; the next run (same endpoint, so the same spool) delivers the
    spool; the run is stored complete with its final status."""
    proxy.rule = lambda request: None
    later = RunStore(URL, s3_options(proxy.endpoint), spool_dir=spool, timeout=SETUP_TIMEOUT)
    later.deliver_pending(budget_s=30)
    assert spooled(spool) == {}, sorted(spooled(spool))
    manifest = later.read_manifest(PIPE, run_id)
    assert manifest["status"] == "healthy" and set(EXTRA) <= set(manifest["files"])
    for name, data in EXTRA.items():
        assert page_bytes(stored(endpoint, f"runs/{PIPE}/{run_id}/{name}")) == data, name
    assert [(r["run_id"], r["status"]) for r in later.list_runs(PIPE)] == [(run_id, "healthy")]


@pytest.mark.slow  # > 10 s
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_store_that_breaks_before_the_final_write_loses_nothing(bucket, tmp_path, fault):
    spool = tmp_path / "spool"
    with FaultProxy(bucket) as proxy:
        setup = RunStore(URL, s3_options(proxy.endpoint), spool_dir=spool,
                         timeout=SETUP_TIMEOUT)
        run_id = new_run_id()
        first = setup.write_run(PIPE, run_id, {"tasks": tasks()}, provisional())
        assert not first.spooled, first.warnings
        # a fault that answers gets the generous timeout: at load 6 a 5 s timeout could fire
        # before the faulty listing reached the proxy (then nothing was injected)
        timeout = TIMEOUT if "never answer" in fault else SETUP_TIMEOUT
        store = RunStore(URL, s3_options(proxy.endpoint), spool_dir=spool, timeout=timeout)
        # its S3 client is made before the fault, outside the store's timeout: beside a CPU
        # hog making it took longer than 5 s once, and the listing never left the process
        store.fs.ls(f"{BUCKET}/{ROOT}/runs/{PIPE}")
        proxy.rule = FAULTS[fault]  # the store breaks between the two writes
        result = store.complete_run(PIPE, run_id, {"tasks": tasks()}, final(),
                                    extra_files=EXTRA)
        hit = [request for request, action in proxy.log if action is not None]
        assert hit, (f"the fault {fault!r} was never injected", proxy.log)
        waiting = spooled(spool)
        assert sorted(result.spooled_files) == sorted(waiting)  # the result says what
        assert result.spooled == bool(waiting) and not result.lost_files
        assert result.warnings  # and why
        manifest_rel = f"runs/{PIPE}/{run_id}/manifest.json"
        if manifest_rel in waiting:
            assert json.loads(waiting[manifest_rel])["status"] == "healthy"
            assert any("spool" in w for w in result.warnings)
        else:  # a listing fault: the files were written again, directly
            assert json.loads(stored(bucket, manifest_rel))["status"] == "healthy"
        check_complete(proxy, bucket, spool, run_id)


def test_a_store_that_refuses_listings_loses_nothing(bucket, tmp_path):
    """Credentials without ``s3:ListBucket`` (moto's IAM: a real 403 from the server)."""
    http_post(f"{bucket}/moto-api/reset-auth", b"3")
    iam = boto_client(bucket, "iam")
    iam.create_user(UserName="admin")
    iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    admin = iam.create_access_key(UserName="admin")["AccessKey"]
    admin_keys = {"key": admin["AccessKeyId"], "secret": admin["SecretAccessKey"]}
    admin_iam = boto_client(bucket, "iam", admin_keys["key"], admin_keys["secret"])
    admin_iam.create_user(UserName="writer")
    admin_iam.put_user_policy(UserName="writer", PolicyName="rw", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject"],
            "Resource": [f"arn:aws:s3:::{BUCKET}/*"]}]}))
    user = admin_iam.create_access_key(UserName="writer")["AccessKey"]
    options = s3_options(bucket, user["AccessKeyId"], user["SecretAccessKey"])
    spool = tmp_path / "spool"
    store = RunStore(URL, options, spool_dir=spool, timeout=SETUP_TIMEOUT)
    with pytest.raises(Exception, match="AccessDenied|Access Denied|Forbidden"):
        store.fs.ls(f"{BUCKET}/{ROOT}")  # the credentials really cannot list
    run_id = new_run_id()
    assert not store.write_run(PIPE, run_id, {"tasks": tasks()}, provisional()).spooled
    result = store.complete_run(PIPE, run_id, {"tasks": tasks()}, final(), extra_files=EXTRA)
    assert sorted(result.spooled_files) == sorted(spooled(spool))
    assert any("could not list" in w for w in result.warnings), result.warnings
    manifest = json.loads(store.fs.cat_file(f"{BUCKET}/{ROOT}/runs/{PIPE}/{run_id}/"
                                            "manifest.json"))
    assert manifest["status"] == "healthy"
    for name, data in EXTRA.items():
        assert page_bytes(store.fs.cat_file(f"{BUCKET}/{ROOT}/runs/{PIPE}/{run_id}/{name}")) \
            == data
    reset_moto(bucket)  # authentication off: "the next run" may list again
    boto_client(bucket).create_bucket(Bucket=BUCKET)


@pytest.mark.slow  # > 10 s
def test_finish_run_survives_a_listing_failure_at_the_final_write(bucket, tmp_path,
                                                                   inproc_client):
    """Through ``finish_run`` on a real cluster's record: the run folder's listing answers
    503 once the provisional record is stored; the run is not lost, the next run delivers."""
    spool = tmp_path / "spool"
    record = record_stages(inproc_client, {"read": 50})
    armed = {"on": False}

    def rule(request: S3Request) -> int | None:
        if request.method == "PUT" and request.key.endswith("/manifest.json"):
            armed["on"] = True  # the provisional manifest: break what follows
            return None
        return 503 if armed["on"] and run_folder_listing(request) else None

    with FaultProxy(bucket) as proxy:
        proxy.rule = rule
        store = RunStore(URL, s3_options(proxy.endpoint), spool_dir=spool,
                         timeout=SETUP_TIMEOUT)
        ctx = RunContext(run_id=new_run_id(), pipeline=PIPE, version="1")
        result = finish_run(store, record, ctx, [])
        assert any(r.is_list and action == 503 for r, action in proxy.log)
        assert result.run_id == ctx.run_id
        proxy.rule = lambda request: None
        later = RunStore(URL, s3_options(proxy.endpoint), spool_dir=spool, timeout=SETUP_TIMEOUT)
        later.deliver_pending(budget_s=30)
        assert spooled(spool) == {}
        manifest = later.read_manifest(PIPE, ctx.run_id)
    assert manifest["status"] == result.status != "unjudged" or manifest["unjudged_reason"]
    assert manifest["unjudged_reason"] != "verdict pending"  # the final manifest, not the first
    assert "regression.csv" in manifest["files"]
