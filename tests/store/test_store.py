"""RunStore on a local folder, memory://, and moto's S3 server (real HTTP, no mocks)."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pandas as pd
import pytest
from helpers.s3_servers import (
    RefusedEndpoint,
    SilentServer,
    boto_client,
    closed_endpoint,
    moto_server,
    port_of,
    record_calls,
    reset_moto,
    restricted_moto_user,
    s3_options,
)
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.cli.store import parse_age
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.runs import (
    RunStore,
    StoreError,
    new_run_id,
)

BUCKET = "perf-bucket"
# a store that answers gets a generous timeout: beside a CPU hog, making a new S3 client and
# its first call took longer than 5 s once (the faults that never answer keep 2 s)
ANSWERING_TIMEOUT = 30.0
KEY, SECRET = "AKIDSTOREKEY0001", "store-secret-value-9f3"  # any keys work on moto


def tasks_frame(scale: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame({
        "stage": ["read", "reduce"], "prefix": ["open_dataset", "nanmedian"],
        "tasks": [40, 8], "total_s": [12.5 * scale, 3.25], "p50_s": [0.3, 0.4],
        "p95_s": [0.6, 0.5], "gb_out": [1.5, 0.01], "max_s": [0.7, 0.6],
        "errors": [0, 0], "reruns": [0, 1], "transfer_s": [0.1, 0.2],
        "disk_read_s": [0.0, 0.0], "disk_write_s": [0.0, 0.0], "share": [0.8, 0.2]})


def manifest(version: str = "v1", status: str = "healthy") -> dict:
    return {"version": version, "status": status, "state": "COMPLETED", "regressed": False,
            "started": "2026-11-29T18:00:00+00:00", "wall_s": 12.0,
            "stages": [{"name": "read", "wall_s": 10.0, "tasks": 40, "task_s": 12.5,
                        "report": None, "note": ""}]}


def write_sample(store: RunStore, pipeline: str = "ndvi", run_id: str | None = None,
                 version: str = "v1", status: str = "healthy"):
    run_id = run_id or new_run_id()
    result = store.write_run(pipeline, run_id,
                             {"tasks": tasks_frame(), "workers": pd.DataFrame({"w": ["a"]})},
                             manifest(version, status), extra_files={"trend.html": b"<p>t</p>"})
    return run_id, result


def spool_bytes(spool: Path) -> bytes:
    return b"".join(p.read_bytes() for p in spool.rglob("*") if p.is_file())


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def moto_endpoint():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_store(moto_endpoint, tmp_path):
    reset_moto(moto_endpoint)
    boto_client(moto_endpoint).create_bucket(Bucket=BUCKET)
    return RunStore(f"s3://{BUCKET}/pfx", s3_options(moto_endpoint, KEY, SECRET),
                    spool_dir=tmp_path / "spool", timeout=ANSWERING_TIMEOUT)


@pytest.fixture
def local_store(tmp_path):
    return RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")


# ---------------------------------------------------------------------- S3 (moto)
def test_s3_layout_manifest_last_and_readback(s3_store, moto_endpoint):
    puts = record_calls(s3_store, "PutObject")
    run_id, result = write_sample(s3_store)
    order = [p.rsplit("/", 1)[1] for p in puts]
    report = s3_store.write_report("ndvi", run_id, "read", "<html>read</html>")

    assert not result.spooled and result.location == f"s3://{BUCKET}/pfx/runs/ndvi/{run_id}"
    assert report.location == f"s3://{BUCKET}/pfx/reports/ndvi/{run_id}/read.html"
    assert order[-2:] == ["manifest.json", f"{run_id}.healthy"]
    assert set(order[:3]) == {"tasks.csv", "workers.csv", "trend.html"}

    client = boto_client(moto_endpoint)
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]}
    marker_key = f"pfx/{layout.index_marker('ndvi', 'v1', run_id, 'healthy')}"
    assert keys == {f"pfx/runs/ndvi/{run_id}/{n}"
                    for n in ("tasks.csv", "workers.csv", "trend.html", "manifest.json")} | {
        marker_key, f"pfx/reports/ndvi/{run_id}/read.html"}
    head = client.head_object(Bucket=BUCKET, Key=f"pfx/reports/ndvi/{run_id}/read.html")
    assert (head["ContentType"], head["ContentEncoding"]) == ("text/html; charset=utf-8", "gzip")
    marker = json.loads(client.get_object(
        Bucket=BUCKET, Key=marker_key)["Body"].read())
    assert marker["run_id"] == run_id and marker["status"] == "healthy"

    doc = s3_store.read_manifest("ndvi", run_id)
    assert doc["schema_version"] == 1 and doc["run_id"] == run_id
    assert set(doc["files"]) == {"tasks.csv", "workers.csv", "trend.html"}
    pd.testing.assert_frame_equal(s3_store.read_table("ndvi", run_id), tasks_frame())
    assert KEY not in json.dumps(doc) and SECRET not in json.dumps(doc)
    assert s3_store.url == f"s3://{BUCKET}/pfx"


def test_s3_run_is_never_overwritten(s3_store, moto_endpoint):
    run_id, _ = write_sample(s3_store)
    with pytest.raises(StoreError, match="never overwritten"):
        s3_store.write_run("ndvi", run_id, {"tasks": tasks_frame(scale=9)}, manifest())
    pd.testing.assert_frame_equal(s3_store.read_table("ndvi", run_id), tasks_frame())


def test_s3_concurrent_runs_of_one_pipeline_both_complete(s3_store):
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(write_sample(s3_store)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ids = [run_id for run_id, _ in results]
    assert len(set(ids)) == 2 and not any(r.spooled for _, r in results)
    assert sorted(r["run_id"] for r in s3_store.list_runs("ndvi")) == sorted(ids)


def test_s3_list_runs_newest_first_by_version(s3_store):
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    ids = [new_run_id(t0 + timedelta(hours=h)) for h in range(4)]
    for run_id, version, status in zip(ids, ["v1", "v2", "v1", "v1"],
                                       ["healthy", "healthy", "regressed", "failed"],
                                       strict=True):
        write_sample(s3_store, run_id=run_id, version=version, status=status)
    write_sample(s3_store, pipeline="other")
    write_sample(s3_store, pipeline="ndvi2", version="v1")  # shares the name's prefix

    v1 = s3_store.list_runs("ndvi", "v1")
    assert [r["run_id"] for r in v1] == [ids[3], ids[2], ids[0]]
    assert [r["status"] for r in v1] == ["failed", "regressed", "healthy"]
    assert [r["run_id"] for r in s3_store.list_runs("ndvi")] == ids[::-1]
    assert s3_store.list_runs("ndvi", "v9") == []
    assert s3_store.list_pipelines() == ["ndvi", "ndvi2", "other"]


def test_s3_list_runs_skips_malformed_markers(s3_store, moto_endpoint, caplog):
    run_id, _ = write_sample(s3_store)
    client = boto_client(moto_endpoint)
    for key, body in [("pfx/index/ndvi/v1/garbage", b"{}"), ("pfx/index/ndvi/v1/x.weird", b"{}"),
                      ("pfx/index/ndvi/v1/20261101T000000Z-aaaaaa.healthy", b""),
                      ("pfx/index/ndvi/v1/deeper/y.healthy", b"{}")]:
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
    with caplog.at_level(logging.WARNING, logger="prefect_dask_profiling.store.runs"):
        runs = s3_store.list_runs("ndvi", "v1")
    assert [r["run_id"] for r in runs] == [run_id]
    assert caplog.text.count("malformed index marker") == 4


def test_s3_lifecycle_merge_keeps_foreign_rule_and_is_idempotent(s3_store, moto_endpoint):
    client = boto_client(moto_endpoint)
    foreign = {"ID": "logs-team", "Status": "Enabled", "Filter": {"Prefix": "logs/"},
               "Expiration": {"Days": 7}}
    client.put_bucket_lifecycle_configuration(Bucket=BUCKET,
                                              LifecycleConfiguration={"Rules": [foreign]})
    puts = record_calls(s3_store, "PutBucketLifecycleConfiguration")

    assert s3_store.ensure_lifecycle(30) is None
    assert s3_store.ensure_lifecycle(30) is None
    assert len(puts) == 1  # the second call found the rules in place
    rules = {r["ID"]: r for r in client.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]}
    assert rules["logs-team"] == foreign
    ours = [r for r in rules.values() if r["ID"] != "logs-team"]
    expire = [r for r in ours if "Expiration" in r]
    abort = [r for r in ours if "AbortIncompleteMultipartUpload" in r]
    assert len(ours) == 2 and len(expire) == 1 and len(abort) == 1
    assert expire[0]["Filter"] == {"Prefix": "pfx/reports/"}
    assert expire[0]["Expiration"] == {"Days": 30}

    assert s3_store.ensure_lifecycle(14) is None
    rules = client.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]
    assert len(rules) == 3 and len(puts) == 2
    assert [r["Expiration"] for r in rules if r["ID"] == expire[0]["ID"]] == [{"Days": 14}]

    bare = RunStore(f"s3://{BUCKET}", s3_options(moto_endpoint, KEY, SECRET),
                    timeout=ANSWERING_TIMEOUT)
    assert bare.ensure_lifecycle(30) is None
    rules = client.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]
    assert len(rules) == 5
    assert {"Prefix": "reports/"} in [r["Filter"] for r in rules if "Expiration" in r]


def test_s3_lifecycle_access_denied_is_a_warning(moto_endpoint, tmp_path):
    reset_moto(moto_endpoint)
    try:
        key, secret = restricted_moto_user(moto_endpoint, BUCKET)
        store = RunStore(f"s3://{BUCKET}", s3_options(moto_endpoint, key, secret),
                         spool_dir=tmp_path, timeout=ANSWERING_TIMEOUT)
        warning = store.ensure_lifecycle(30)
        run_id, result = write_sample(store)  # PutObject is still allowed
    finally:
        reset_moto(moto_endpoint)
    assert warning is not None and "AccessDenied" in warning and "sweep" in warning
    assert key not in warning and secret not in warning
    assert not result.spooled


@pytest.mark.parametrize("endpoint_kind", ["closed port", "silent socket"])
def test_s3_endpoint_down_spools_then_uploads_byte_identical(
        endpoint_kind, tmp_path, caplog):
    spool = tmp_path / "spool"
    refused = RefusedEndpoint()
    dead = refused.endpoint
    if endpoint_kind == "silent socket":
        refused.release()
    with SilentServer(port_of(dead)) if endpoint_kind == "silent socket" \
            else contextlib.nullcontext():
        down = RunStore(f"s3://{BUCKET}/pfx", s3_options(dead, KEY, SECRET),
                        spool_dir=spool, timeout=2)
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="prefect_dask_profiling.store.runs"):
            run_id, result = write_sample(down)
            report = down.write_report("ndvi", run_id, "read", "<html>r</html>")
        elapsed = time.monotonic() - start
    print(f"{endpoint_kind}: write_run + write_report returned after {elapsed:.1f} s")
    assert elapsed < 30
    assert result.spooled and report.spooled
    assert "upload-pending" in result.warnings[0] and down.url in result.warnings[0]
    assert report.location == f"s3://{BUCKET}/pfx/reports/ndvi/{run_id}/read.html"
    for text in (caplog.text, spool_bytes(spool).decode(), " ".join(result.warnings)):
        assert KEY not in text and SECRET not in text

    refused.release()  # (again, for the closed port: idempotent)
    with moto_server(port_of(dead)) as endpoint:  # the same store, back up
        boto_client(endpoint).create_bucket(Bucket=BUCKET)
        back = RunStore(f"s3://{BUCKET}/pfx", s3_options(endpoint, KEY, SECRET),
                        spool_dir=spool, timeout=ANSWERING_TIMEOUT)
        puts = record_calls(back, "PutObject")
        uploaded = back.upload_pending()
        assert (uploaded.uploaded, uploaded.failed) == (6, 0)
        order = [p.rsplit("/", 1)[1] for p in puts]
        assert order.index("manifest.json") > max(order.index(n) for n in
                                                  ("tasks.csv", "workers.csv", "trend.html"))
        assert order[-1] == f"{run_id}.healthy"
        pd.testing.assert_frame_equal(back.read_table("ndvi", run_id), tasks_frame())
        got = boto_client(endpoint).get_object(
            Bucket=BUCKET, Key=f"pfx/reports/ndvi/{run_id}/read.html")
        assert got["ContentEncoding"] == "gzip"  # delivered from the spool as written live
        assert gzip.decompress(got["Body"].read()) == b"<html>r</html>"
        assert not any(p.is_file() for p in spool.rglob("*"))
        assert back.upload_pending().uploaded == 0


def test_spool_is_keyed_by_endpoint_too(moto_endpoint, tmp_path):
    """Two endpoints with the same bucket name never share a spool."""
    spool = tmp_path / "spool"
    dead = closed_endpoint()
    down = RunStore(f"s3://{BUCKET}/pfx", s3_options(dead, KEY, SECRET), spool_dir=spool,
                    timeout=2)
    run_id, result = write_sample(down)
    assert result.spooled
    reset_moto(moto_endpoint)
    boto_client(moto_endpoint).create_bucket(Bucket=BUCKET)
    other = RunStore(f"s3://{BUCKET}/pfx", s3_options(moto_endpoint, KEY, SECRET),
                     spool_dir=spool, timeout=ANSWERING_TIMEOUT)
    assert other.spool.dir != down.spool.dir
    assert other.upload_pending().uploaded == 0
    assert other.deliver_pending(5) is None
    assert other.list_runs("ndvi") == []
    [meta] = spool.rglob("store.json")
    assert json.loads(meta.read_text()) == {"url": f"s3://{BUCKET}/pfx",
                                            "where": {"endpoint_url": dead}}


def test_s3_presign(s3_store, moto_endpoint):
    run_id, _ = write_sample(s3_store)
    location = s3_store.write_report("ndvi", run_id, "read", "<html>x</html>").location
    url = s3_store.presign(location, 30 * 24 * 3600)
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Expires"] == ["604800"]  # clipped to 7 days
    response = httpx.get(url, timeout=10)  # it asks for gzip, and decodes it
    assert response.headers["Content-Encoding"] == "gzip"
    assert response.text == "<html>x</html>"

    with_token = RunStore(s3_store.url, {**s3_options(moto_endpoint, KEY, SECRET),
                                         "token": "SESSIONTOKEN123"}, timeout=ANSWERING_TIMEOUT)
    assert with_token.presign(location, 60) is None
    with pytest.raises(ValueError, match="not inside store"):
        s3_store.presign("s3://elsewhere/x.html", 60)
    with pytest.raises(ValueError, match="expires_s"):
        s3_store.presign(location, 0)


# ---------------------------------------------------------------------- local folder / memory
def test_local_layout_and_readback(local_store, tmp_path):
    run_id, result = write_sample(local_store)
    report = local_store.write_report("ndvi", run_id, "read", b"<html/>")
    root = tmp_path / "store"
    assert local_store.url == str(root) and result.location == str(root / "runs/ndvi" / run_id)
    assert report.location == str(root / "reports/ndvi" / run_id / "read.html")
    assert sorted(p.name for p in (root / "runs/ndvi" / run_id).iterdir()) == [
        "manifest.json", "tasks.csv", "trend.html", "workers.csv"]
    assert (root / layout.index_marker("ndvi", "v1", run_id, "healthy")).is_file()
    pd.testing.assert_frame_equal(local_store.read_table("ndvi", run_id), tasks_frame())
    assert local_store.ensure_lifecycle(30) is None
    assert local_store.presign(report.location, 60) is None
    again = write_sample(local_store, run_id=run_id)[1]  # a retry: identical bytes are fine
    assert not again.spooled and again.warnings == []
    with pytest.raises(StoreError, match="never overwritten"):
        write_sample(local_store, run_id=run_id, version="v2")

    local_store.accept("ndvi", "v1", run_id)
    assert local_store.accepted("ndvi", "v1") == [run_id]
    with pytest.raises(StoreError, match="unknown run"):
        local_store.accept("ndvi", "v1", "20990101T000000Z-000000")


def test_memory_store(tmp_path):
    store = RunStore("memory://store-test-" + os.urandom(4).hex(), spool_dir=tmp_path)
    run_id, result = write_sample(store)
    assert not result.spooled and store.url.startswith("memory://")
    assert [r["run_id"] for r in store.list_runs("ndvi")] == [run_id]
    pd.testing.assert_frame_equal(store.read_table("ndvi", run_id), tasks_frame())


def test_unknown_protocol_names_it():
    with pytest.raises(ValueError, match="'nosuchfs'"):
        RunStore("nosuchfs://bucket/x")


def test_url_attribute_has_no_credentials(tmp_path):
    store = RunStore("memory://user:pa55word@host/x?token=abc", spool_dir=tmp_path)
    assert "pa55word" not in store.url and "token" not in store.url and "user" not in store.url


def _age(paths, days: float) -> None:
    stamp = time.time() - days * 86400
    for path in paths:
        os.utime(path, (stamp, stamp))


def test_sweep_removes_only_old_reports(local_store, tmp_path):
    root = tmp_path / "store"
    old, new, mixed = (write_sample(local_store)[0] for _ in range(3))
    for run_id in (old, new, mixed):
        local_store.write_report("ndvi", run_id, "read", "<html/>")
        local_store.write_report("ndvi", run_id, "reduce", "<html/>")
    stray = root / "reports" / "stray.txt"
    stray.write_text("not ours")
    _age([p for p in root.rglob("*") if p.is_file()], 40)  # summaries and index too
    _age((root / "reports/ndvi" / new).iterdir(), 1)
    _age([root / "reports/ndvi" / mixed / "read.html"], 2)

    removed = local_store.sweep(30)

    assert removed == [str(root / "reports/ndvi" / old)]
    assert not (root / "reports/ndvi" / old).exists()
    assert (root / "reports/ndvi" / new / "read.html").exists()
    assert (root / "reports/ndvi" / mixed / "reduce.html").exists()
    assert stray.exists()
    for run_id in (old, new, mixed):
        assert (root / "runs/ndvi" / run_id / "manifest.json").exists()
    assert len(local_store.list_runs("ndvi")) == 3
    assert local_store.sweep(30) == []
    with pytest.raises(ValueError, match="older_than_days"):
        local_store.sweep(-1)


@pytest.mark.parametrize("call, field", [
    (lambda s: s.write_run("../up", "r1", {}, manifest()), "pipeline"),
    (lambda s: s.write_run("p", "a/b", {}, manifest()), "run_id"),
    (lambda s: s.write_report("p", "r1", "st\x00age", "<html/>"), "stage"),
    (lambda s: s.write_report("p", "r1", "..", "<html/>"), "stage"),
    (lambda s: s.write_run("p", "r1", {"t/x": tasks_frame()}, manifest()), "table name"),
    (lambda s: s.write_run("p", "r1", {}, manifest(version="v/../1")), "version"),
    (lambda s: s.list_runs("p", ".."), "version"),
    (lambda s: s.read_manifest("p", "r\n1"), "run_id"),
])
def test_names_that_escape_are_refused(local_store, tmp_path, call, field):
    with pytest.raises(ValueError, match=field):
        call(local_store)
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_malformed_content_is_a_store_error(local_store, tmp_path, caplog):
    run_dir = tmp_path / "store" / "runs" / "ndvi"
    with pytest.raises(StoreError, match="not found"):
        local_store.read_manifest("ndvi", "20990101T000000Z-000000")

    run_id, _ = write_sample(local_store)
    tasks = run_dir / run_id / "tasks.csv"
    tasks.write_bytes(tasks.read_bytes()[:-20])
    with pytest.raises(StoreError, match="truncated"):
        local_store.read_table("ndvi", run_id)
    with pytest.raises(StoreError, match="no table 'orchestration'"):
        local_store.read_table("ndvi", run_id, "orchestration")

    bad_columns, _ = write_sample(local_store)
    local_store_run = run_dir / bad_columns
    (local_store_run / "manifest.json").unlink()
    (local_store_run / "tasks.csv").unlink()
    local_store.write_run("ndvi", new_id := new_run_id(),
                          {"tasks": tasks_frame().drop(columns=["p95_s"])}, manifest())
    with pytest.raises(StoreError, match="p95_s"):
        local_store.read_table("ndvi", new_id)

    manifest_path = run_dir / run_id / "manifest.json"
    doc = json.loads(manifest_path.read_text())
    for content, message in [("{not json", "not valid JSON"), ("[1, 2]", "not a dask-profiling"),
                             (json.dumps({**doc, "schema_version": 2}), "schema_version 2"),
                             (json.dumps({"schema_version": 1}), "lacks")]:
        manifest_path.write_text(content)
        with pytest.raises(StoreError, match=message) as info:
            local_store.read_manifest("ndvi", run_id)
        assert "\n" not in str(info.value)


def test_local_failure_spools_and_upload_pending_recovers(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_PROFILING_SPOOL", str(tmp_path / "env-spool"))
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store folder should be")
    store = RunStore(str(blocker), {"key": "SECRETKEYVALUE"})
    run_id, result = write_sample(store)
    assert result.spooled and "env-spool" in result.warnings[0]
    other = RunStore(str(tmp_path / "other"))
    assert other.upload_pending().uploaded == 0  # spool is keyed by store URL
    meta = json.loads(next((tmp_path / "env-spool").rglob("store.json")).read_text())
    assert meta == {"url": str(blocker)}
    assert b"SECRETKEYVALUE" not in spool_bytes(tmp_path / "env-spool")

    blocker.unlink()
    counts: list[tuple[int, int]] = []
    uploaded = store.upload_pending(progress=lambda done, total: counts.append((done, total)))
    assert (uploaded.uploaded, uploaded.failed) == (5, 0) and counts[-1] == (5, 5)
    pd.testing.assert_frame_equal(store.read_table("ndvi", run_id), tasks_frame())
    assert not (tmp_path / "env-spool").exists() or not any(
        p.is_file() for p in (tmp_path / "env-spool").rglob("*"))


def test_upload_pending_keeps_a_clashing_run(tmp_path):
    blocker = tmp_path / "store"
    blocker.write_text("x")
    down = RunStore(str(blocker), spool_dir=tmp_path / "spool")
    run_id, result = write_sample(down)
    assert result.spooled
    blocker.unlink()
    write_sample(RunStore(str(blocker)), run_id=run_id, version="v2")  # same id, other content
    outcome = down.upload_pending()
    assert outcome.failed >= 1 and "different content" in " ".join(outcome.warnings)
    assert down.read_manifest("ndvi", run_id)["version"] == "v2"
    assert any(p.name == "manifest.json" for p in (tmp_path / "spool").rglob("*"))


def test_parse_age():
    assert parse_age("30d") == 30 and parse_age("12h") == 0.5 and parse_age("7") == 7
    for bad in ("", "3x", "-1d", "0", "d"):
        with pytest.raises(ValueError, match="older-than"):
            parse_age(bad)


# ---------------------------------------------------------------------- CLI
runner = CliRunner()


def test_cli_sweep(local_store, tmp_path):
    run_id, _ = write_sample(local_store)
    local_store.write_report("ndvi", run_id, "read", "<html/>")
    _age((tmp_path / "store/reports/ndvi" / run_id).iterdir(), 3)
    out = runner.invoke(app, ["sweep", "--store", local_store.url, "--older-than", "12h",
                              "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["removed"] == [
        str(tmp_path / "store/reports/ndvi" / run_id)]
    bad = runner.invoke(app, ["sweep", "--store", "nosuchfs://x", "--older-than", "3d"])
    assert bad.exit_code == 2 and bad.stderr.strip().count("\n") == 0
    assert "nosuchfs" in bad.stderr
    bad_age = runner.invoke(app, ["sweep", "--store", local_store.url, "--older-than", "soon"])
    assert bad_age.exit_code == 2 and "older-than" in bad_age.stderr


def test_cli_upload_pending(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_PROFILING_SPOOL", str(tmp_path / "spool"))
    blocker = tmp_path / "store"
    blocker.write_text("x")
    assert write_sample(RunStore(str(blocker)))[1].spooled
    still_down = runner.invoke(app, ["upload-pending", "--store", str(blocker)])
    assert still_down.exit_code == 1 and "failed 5" in still_down.stdout
    blocker.unlink()
    out = runner.invoke(app, ["upload-pending", "--store", str(blocker), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) | {"warnings": []} == {
        "store": str(blocker), "uploaded": 5, "failed": 0, "warnings": []}


def test_cli_report_local_and_s3(local_store, s3_store, moto_endpoint, monkeypatch):
    run_id, _ = write_sample(local_store)
    location = local_store.write_report("ndvi", run_id, "read", "<html/>").location
    out = runner.invoke(app, ["report", run_id, "read", "--store", local_store.url,
                              "--pipeline", "ndvi"])
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == location

    s3_run, _ = write_sample(s3_store)
    s3_store.write_report("ndvi", s3_run, "read", "<html>s3</html>")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    out = runner.invoke(app, ["report", s3_run, "read", "--store", s3_store.url,
                              "--pipeline", "ndvi", "--expires", "120", "--json"])
    assert out.exit_code == 0, out.output
    info = json.loads(out.stdout)
    assert info["signed"] and info["expires_s"] == 120
    assert httpx.get(info["url"], timeout=10).text == "<html>s3</html>"

    for args, message in [([run_id, "nostage"], "no report for stage"),
                          (["20990101T000000Z-000000", "read"], "not found"),
                          ([run_id, "../x"], "stage")]:
        bad = runner.invoke(app, ["report", *args, "--store", local_store.url,
                                  "--pipeline", "ndvi"])
        assert bad.exit_code == 2 and message in bad.stderr, bad.output
        assert bad.stderr.strip().count("\n") == 0


def test_cli_report_open_uses_the_browser(local_store, tmp_path):
    """Subprocess: ``webbrowser`` reads $BROWSER once per process."""
    import subprocess

    run_id, _ = write_sample(local_store)
    location = local_store.write_report("ndvi", run_id, "read", "<html/>").location
    opened = tmp_path / "opened.txt"
    browser = (f"{sys.executable} -c \"import sys; open(sys.argv[1], 'w')"
               f".write(sys.argv[2])\" {opened} %s")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dask-profiling"), "report", run_id, "read",
         "--store", local_store.url, "--pipeline", "ndvi", "--open"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "BROWSER": browser})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == location
    assert opened.read_text() == Path(location).as_uri()


def test_remembered_reads_list_once_copy_out_and_see_writes(s3_store, moto_endpoint,
                                                            tmp_path):
    day = datetime(2026, 11, 1, tzinfo=UTC)
    first, _ = write_sample(s3_store, run_id=new_run_id(day))
    write_sample(s3_store, run_id=new_run_id(day + timedelta(days=1)))
    listings = record_calls(s3_store, "ListObjectsV2")
    gets = record_calls(s3_store, "GetObject")
    other = RunStore(s3_store.url, s3_options(moto_endpoint, KEY, SECRET),
                     spool_dir=tmp_path / "other-spool", timeout=ANSWERING_TIMEOUT)
    with s3_store.remembering_reads():
        runs = s3_store.list_runs("ndvi", "v1")
        n = len(listings)
        assert len(runs) == 2 and s3_store.list_runs("ndvi", "v1") == runs
        assert len(listings) == n
        table = s3_store.read_table("ndvi", first)
        n_gets = len(gets)
        table.loc[0, "total_s"] = -1.0  # a copy: the memory keeps what was read
        assert s3_store.read_table("ndvi", first)["total_s"].iloc[0] == 12.5
        manifest = s3_store.read_manifest("ndvi", first)
        files = dict(manifest["files"])
        manifest["files"].clear()  # a deep copy too: nested values are the caller's own
        assert s3_store.read_manifest("ndvi", first)["files"] == files and files
        assert len(gets) == n_gets
        late = new_run_id(day + timedelta(days=2))
        with pytest.raises(StoreError):
            s3_store.read_table("ndvi", late)
        write_sample(other, run_id=late)  # another writer: this store's memory is not told
        assert s3_store.read_table("ndvi", late)["total_s"].iloc[0] == 12.5  # no failure kept
        write_sample(s3_store, run_id=new_run_id(day + timedelta(days=3)))  # forgets
        assert len(s3_store.list_runs("ndvi", "v1")) == 4 and len(listings) > n
    n = len(listings)
    assert len(s3_store.list_runs("ndvi", "v1")) == 4 and len(listings) > n  # listed again


def test_s3_read_tables_at_once_say_what_read_table_says(s3_store, moto_endpoint):
    day = datetime(2026, 11, 1, tzinfo=UTC)
    ids = [write_sample(s3_store, run_id=new_run_id(day + timedelta(days=i)))[0]
           for i in range(5)]
    s3 = boto_client(moto_endpoint)
    s3.put_object(Bucket=BUCKET, Key=f"pfx/runs/ndvi/{ids[1]}/tasks.csv", Body=b"stage,pr")
    s3.delete_object(Bucket=BUCKET, Key=f"pfx/runs/ndvi/{ids[2]}/manifest.json")
    s3.delete_object(Bucket=BUCKET, Key=f"pfx/runs/ndvi/{ids[3]}/tasks.csv")
    gets = record_calls(s3_store, "GetObject")
    heads = record_calls(s3_store, "HeadObject")
    missing = new_run_id(day + timedelta(days=9))
    found = s3_store.read_tables("ndvi", [*ids, missing])
    assert list(found) == [*ids, missing]
    # one wave: every manifest and every table once (the tables are checked afterwards)
    assert sorted(gets) == sorted({*gets}) and len(gets) == 6 + 6, gets
    assert heads == []  # one request per object: no HEAD before each GET
    for run_id in (ids[0], ids[4]):
        assert found[run_id].equals(s3_store.read_table("ndvi", run_id))
    for run_id in (ids[1], ids[2], ids[3], missing):
        with pytest.raises(StoreError) as one:
            s3_store.read_table("ndvi", run_id)
        assert isinstance(found[run_id], StoreError) and str(found[run_id]) == str(one.value)
    assert "truncated or changed" in str(found[ids[1]])
    assert f"{ids[3]}/tasks.csv" in str(found[ids[3]]) and "not found" in str(found[ids[3]])
    manifests = s3_store.read_manifests("ndvi", ids)
    assert manifests[ids[0]]["version"] == "v1" and isinstance(manifests[ids[2]], StoreError)


@pytest.mark.parametrize("endpoint_kind", ["closed port", "silent socket"])
def test_s3_read_tables_from_a_store_that_is_down_answers_for_every_run(endpoint_kind,
                                                                         tmp_path):
    refused = RefusedEndpoint()
    if endpoint_kind == "silent socket":
        refused.release()
    ids = [new_run_id(datetime(2026, 11, 1 + i, tzinfo=UTC)) for i in range(3)]
    try:
        with SilentServer(port_of(refused.endpoint)) if endpoint_kind == "silent socket" \
                else contextlib.nullcontext():
            down = RunStore(f"s3://{BUCKET}/pfx", s3_options(refused.endpoint, KEY, SECRET),
                            spool_dir=tmp_path / "spool", timeout=2)
            start = time.monotonic()
            found = down.read_tables("ndvi", ids)
            elapsed = time.monotonic() - start
            again = down.read_manifests("ndvi", ids)  # known down: answered at once
            totals = down.read_totals("ndvi", ids)
            second = time.monotonic() - start - elapsed
    finally:
        refused.release()
    print(f"{endpoint_kind}: read_tables of 3 runs answered after {elapsed:.2f} s, "
          f"then read_manifests and read_totals after {second:.3f} s")
    assert list(found) == ids and all(isinstance(v, StoreError) for v in found.values())
    assert all("could not" in str(v) and KEY not in str(v) for v in found.values()), found
    assert all(isinstance(v, StoreError) for v in again.values())
    assert list(totals) == ids and all(isinstance(v, StoreError) for v in totals.values())
    assert elapsed < 30


@pytest.mark.parametrize("run_ids", ["20261101T000000Z-abcdef", [1, 2], ["../x", "y"]])
def test_read_tables_refuses_what_is_not_a_list_of_run_ids(local_store, run_ids):
    with pytest.raises(ValueError, match="run_id"):
        local_store.read_tables("ndvi", run_ids)
