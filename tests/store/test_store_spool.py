"""The spool delivered by the next run, safely; lost answers; no credentials in text.

Real stores only: a local folder made unwritable then writable, moto's S3 server stopped and
started again on the same port, and a TCP proxy that loses one answer on the way back.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import traceback

import pandas as pd
import pytest
from helpers.run_records import record_stages, spooled
from helpers.s3_servers import (
    SilentServer,
    TcpRelay,
    boto_client,
    closed_endpoint,
    moto_server,
    port_of,
    reset_moto,
    s3_options,
)

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.compression import page_bytes
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.store.url import (
    check_store_url,
    location_options,
    public_url,
    redact,
    redacted_options,
)

pytestmark = pytest.mark.timeout(180)
BUCKET = "spool-bucket"


def tasks_frame() -> pd.DataFrame:
    return pd.DataFrame({"stage": ["read"], "prefix": ["load"], "tasks": [4], "total_s": [2.0],
                         "p50_s": [0.5], "p95_s": [0.6], "gb_out": [0.1]})


def write_sample(store: RunStore, pipeline: str = "nightly") -> tuple[str, object]:
    run_id = new_run_id()
    return run_id, store.write_run(pipeline, run_id, {"tasks": tasks_frame()},
                                   {"version": "1", "status": "healthy", "state": "COMPLETED"},
                                   extra_files={"trend.html": b"<p>trend</p>"})


def stored(store: RunStore, rels) -> dict[str, bytes]:
    """The bytes stored at ``rels``, pages decompressed (S3 keeps them gzip)."""
    return {rel: page_bytes(store.fs.cat_file(store._path(rel))) for rel in rels}


@pytest.fixture(scope="module")
def record(inproc_client):
    """A real run record (one stage)."""
    return record_stages(inproc_client, {"read": 100})


# ---------------------------------------------------------------------- delivery
def test_next_run_delivers_the_spool_byte_identical(record, tmp_path):
    folder, spool = tmp_path / "store", tmp_path / "spool"
    folder.write_text("a file where the store's folder should be")  # the store is down
    first = finish_run(RunStore(str(folder), spool_dir=spool), record,
                       RunContext(run_id=new_run_id(), pipeline="nightly", version="1"), [])
    waiting = spooled(spool)
    assert any(r.endswith(f"{first.run_id}/manifest.json") for r in waiting)

    folder.unlink()  # the store is back; the next run (another pipeline) delivers
    store = RunStore(str(folder), spool_dir=spool)
    second = finish_run(store, record,
                        RunContext(run_id=new_run_id(), pipeline="other", version="1"), [],
                        ProfilingOptions(on_regression="warn", store_timeout=10))
    assert stored(store, waiting) == waiting  # byte-identical
    assert spooled(spool) == {}
    delivery = store.read_manifest("other", second.run_id)["spool_delivery"]
    assert delivery["delivered"] == len(waiting) and delivery["left"] == 0
    assert delivery["runs"] == [first.run_id] and delivery["note"] is None
    assert [r["run_id"] for r in store.list_runs("nightly")] == [first.run_id]
    assert store.read_manifest("nightly", first.run_id)["status"] == first.status


def test_s3_store_stopped_then_restarted_gets_the_spool(tmp_path):
    spool = tmp_path / "spool"
    with moto_server() as endpoint:
        reset_moto(endpoint)  # moto keeps buckets per process, across servers
        boto_client(endpoint).create_bucket(Bucket=BUCKET)
        url, options = f"s3://{BUCKET}/p", s3_options(endpoint)
    # the server is stopped: this run spools
    down = RunStore(url, options, spool_dir=spool, timeout=2)
    run_id, result = write_sample(down)
    assert result.spooled
    waiting = spooled(spool)
    assert down.deliver_pending(5)["note"] == "the store did not answer moments ago"
    assert spooled(spool) == waiting
    with moto_server(port_of(endpoint)) as again:  # same endpoint, state kept in-process
        # it answers: a generous timeout (beside a CPU hog a new client took over 5 s once)
        store = RunStore(url, s3_options(again), spool_dir=spool, timeout=30)
        report = store.deliver_pending(30)
        assert report["delivered"] == len(waiting) and report["left"] == 0
        assert report["runs"] == [run_id]
        assert stored(store, waiting) == waiting
        assert store.deliver_pending(5) is None  # nothing left
        pd.testing.assert_frame_equal(store.read_table("nightly", run_id), tasks_frame())


def test_delivery_to_a_still_dead_store_leaves_everything(tmp_path, capsys):
    spool = tmp_path / "spool"
    with SilentServer() as silent:
        url, options = f"s3://{BUCKET}/p", s3_options(silent)
        run_id, result = write_sample(RunStore(url, options, spool_dir=spool, timeout=1))
        assert result.spooled
        waiting = spooled(spool)
        fresh = RunStore(url, options, spool_dir=spool, timeout=1)  # a new run, not warned
        report = fresh.deliver_pending(1)
    assert report["delivered"] == 0 and report["left"] == len(waiting)
    assert report["note"] and report["warnings"]
    assert spooled(spool) == waiting
    with capsys.disabled():
        print(f"\ndelivery to a silent store gave up after {report['seconds']:.2f} s "
              "(budget 1 s, timeout 1 s)")


def test_two_runs_delivering_at_once(tmp_path):
    folder, spool = tmp_path / "store", tmp_path / "spool"
    folder.write_text("x")
    down = RunStore(str(folder), spool_dir=spool)
    ids = [write_sample(down)[0] for _ in range(3)]
    waiting = spooled(spool)
    folder.unlink()
    stores = [RunStore(str(folder), spool_dir=spool) for _ in range(2)]
    reports: list = [None, None]
    barrier = threading.Barrier(2)

    raised: list[str] = []

    def deliver(i: int) -> None:
        barrier.wait()
        try:
            reports[i] = stores[i].deliver_pending(10)
        except BaseException:
            raised.append(traceback.format_exc())

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not raised, "\n".join(raised)
    done = [r for r in reports if r is not None]  # None: it found nothing left to deliver
    assert sum(r["delivered"] for r in done) == len(waiting)
    assert all("different content" not in " ".join(r["warnings"]) for r in done)
    assert stored(stores[0], waiting) == waiting
    assert sorted(r["run_id"] for r in stores[0].list_runs("nightly")) == sorted(ids)
    assert spooled(spool) == {}


def test_delivery_without_the_lock_compares_bytes(tmp_path):
    """Files already stored byte-identical (another deliverer got there first) count as
    delivered; a file stored with other bytes keeps its run in the spool."""
    folder, spool = tmp_path / "store", tmp_path / "spool"
    folder.write_text("x")
    down = RunStore(str(folder), spool_dir=spool)
    same, _ = write_sample(down)
    clash, _ = write_sample(down)
    waiting = spooled(spool)
    folder.unlink()
    folder.mkdir()
    for rel, data in waiting.items():  # someone else uploaded some of it already
        if same in rel and not rel.startswith("index/"):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
    other = layout.table_file("nightly", clash, "tasks")
    (folder / other).parent.mkdir(parents=True, exist_ok=True)
    (folder / other).write_bytes(b"stage,prefix\nsomething,else\n")
    store = RunStore(str(folder), spool_dir=spool)
    report = store.deliver_pending(10)
    assert "different content" in " ".join(report["warnings"])
    assert report["runs"] == [same]
    assert [r["run_id"] for r in store.list_runs("nightly")] == [same]
    left = spooled(spool)
    assert left and all(clash in rel for rel in left)


# ---------------------------------------------------------------------- lost answers
class LosingProxy(TcpRelay):
    """A TCP proxy to ``127.0.0.1:<port>`` that forwards everything, except that it swallows
    the answer to the first request whose first line contains ``needle`` and closes the
    connection — the request did reach the server (a lost answer, not a lost request)."""

    def __init__(self, port: int, needle: bytes) -> None:
        super().__init__(("127.0.0.1", port))
        self.needle = needle
        self.lost = threading.Event()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        drop = threading.Event()

        def forward() -> None:
            try:
                while data := client.recv(65536):
                    first = data.split(b"\r\n", 1)[0]
                    if not self.lost.is_set() and self.needle in first:
                        drop.set()
                    upstream.sendall(data)
            except OSError:
                pass

        self._spawn(forward)
        try:
            while data := upstream.recv(65536):
                if drop.is_set() and not self.lost.is_set():
                    self.lost.set()
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):  # shutdown: the FIN goes out even while the
                try:                         # other thread still blocks in recv()
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


def test_lost_answer_to_an_exclusive_create_is_not_a_lost_run(tmp_path):
    """The manifest's PUT succeeds but its answer is lost; the retry finds the object (412)
    with the same bytes: the run is stored, not dropped nor reported as a clash."""
    with moto_server() as endpoint:
        reset_moto(endpoint)  # moto keeps buckets per process, across servers
        boto_client(endpoint).create_bucket(Bucket=BUCKET)
        with LosingProxy(port_of(endpoint), b"/manifest.json HTTP/1.1") as proxy:
            store = RunStore(f"s3://{BUCKET}/p", s3_options(proxy.endpoint),
                             spool_dir=tmp_path / "spool", timeout=5)
            run_id, result = write_sample(store)
            assert proxy.lost.is_set(), "the proxy never lost an answer"
        assert not result.spooled and result.warnings == []
        back = RunStore(f"s3://{BUCKET}/p", s3_options(endpoint), spool_dir=tmp_path / "s2")
        assert [r["run_id"] for r in back.list_runs("nightly")] == [run_id]
        pd.testing.assert_frame_equal(back.read_table("nightly", run_id), tasks_frame())


# ---------------------------------------------------------------------- no secrets
def test_store_url_errors_do_not_echo_credentials():
    for url in ("nosuchfs://admin:hunter22@host/x?token=abcd1234",
                "s3://AKIAXX:hunter22@/?X-Amz-Signature=abcd1234"):
        with pytest.raises(ValueError) as info:
            check_store_url(url)
        assert "hunter22" not in str(info.value) and "abcd1234" not in str(info.value)
    with pytest.raises(ValueError, match="non-empty"):
        check_store_url("")
    assert check_store_url("s3://bucket/prefix") == "s3://bucket/prefix"
    assert public_url("s3://k:s@bucket/p?sig=1") == "s3://bucket/p"


def test_redaction_helpers():
    options = {"key": "AKIA1234", "secret": "s3cr3t-value", "endpoint_url": "http://u:pw@h:9",
               "client_kwargs": {"aws_session_token": "tok-abcdef", "region_name": "eu"}}
    shown = repr(redacted_options(options))
    for secret in ("AKIA1234", "s3cr3t-value", "tok-abcdef", "pw@"):
        assert secret not in shown
    assert "eu" in shown and "h:9" in shown
    text = redact("get https://h/x?X-Amz-Credential=AK%2F1&X-Amz-Signature=ff00 with s3cr3t-value",
                  ["s3cr3t-value"])
    assert "AK%2F1" not in text and "ff00" not in text and "s3cr3t-value" not in text
    assert location_options({"client_kwargs": {"endpoint_url": "http://k:s@h:1"}}, "s3") == {
        "endpoint_url": "http://h:1"}


def test_profiling_options_repr_redacts_storage_options():
    options = ProfilingOptions(store="s3://bucket/p", storage_options={
        "key": "AKIAREPRKEY", "secret": "repr-secret-value", "endpoint_url": "http://h:1"})
    text = repr(options)
    assert "AKIAREPRKEY" not in text and "repr-secret-value" not in text
    assert "http://h:1" in text and "s3://bucket/p" in text
    assert options.storage_options["secret"] == "repr-secret-value"  # only the text changes


def test_spool_meta_names_the_endpoint_without_credentials(tmp_path):
    dead = closed_endpoint()
    store = RunStore(f"s3://{BUCKET}/p", {**s3_options(dead), "key": "AKIAMETAKEY"},
                     spool_dir=tmp_path / "spool", timeout=1)
    assert write_sample(store)[1].spooled
    [meta] = (tmp_path / "spool").rglob("store.json")
    assert json.loads(meta.read_text()) == {"url": f"s3://{BUCKET}/p",
                                            "where": {"endpoint_url": dead}}
    assert b"AKIAMETAKEY" not in b"".join(p.read_bytes() for p in
                                          (tmp_path / "spool").rglob("*") if p.is_file())


def test_warnings_are_logged(tmp_path, caplog):
    folder = tmp_path / "store"
    folder.write_text("x")
    with caplog.at_level(logging.WARNING, logger="prefect_dask_profiling.store.runs"):
        write_sample(RunStore(str(folder), spool_dir=tmp_path / "spool"))
    assert "kept them in the spool" in caplog.text
