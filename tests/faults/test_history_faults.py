"""Damaged history: every reader skips or repairs a damaged run, and the new run is still
stored and judged. Each damage on a real local store and on moto's S3 server.

The history is written by ``RunStore.write_run``; the damage is done to the stored bytes
through the store's own filesystem (what a crash, a full disk or a hand edit leaves); the new
run goes through ``finish_run`` with a record from a real LocalCluster.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest
from helpers.run_records import record_stages
from helpers.s3_servers import FaultProxy, boto_client, reset_moto, s3_options

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.regression.baseline import load_baseline
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.manifest import RunContext, sha256
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary import summarise

pytestmark = pytest.mark.timeout(300)

PIPELINE, VERSION, BUCKET = "damaged", "1", "history-faults"
HISTORY = 4


@pytest.fixture(scope="module")
def record(inproc_client):
    """One real run record (2 stages), reused by every run here."""
    return record_stages(inproc_client, {"read": 200, "reduce": 200})


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, moto_endpoint) -> Iterator[RunStore]:
    if request.param == "local":
        yield RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
        return
    reset_moto(moto_endpoint)
    boto_client(moto_endpoint).create_bucket(Bucket=BUCKET)
    # no request here is meant to hang: a generous timeout, so that a write under a loaded
    # machine (load 13-15 on 2 cores timed out three 5 s writes) is not taken for an outage
    yield RunStore(f"s3://{BUCKET}/h", s3_options(moto_endpoint), spool_dir=tmp_path / "spool",
                   timeout=30)


def history(store: RunStore, record) -> list[str]:
    """``HISTORY`` healthy runs of the record's own summary, oldest first."""
    tasks = summarise(record)
    ids = []
    for _ in range(HISTORY):
        run_id = new_run_id()
        result = store.write_run(PIPELINE, run_id, {"tasks": tasks},
                                 {"version": VERSION, "status": "healthy",
                                  "state": "COMPLETED"})
        assert not result.spooled, result.warnings
        ids.append(run_id)
    return sorted(ids)


def put(store: RunStore, rel: str, data: bytes) -> None:
    store.fs.pipe_file(store._path(rel), data)


def rm(store: RunStore, rel: str) -> None:
    store.fs.rm(store._path(rel), recursive=True)


def rewrite_table(store: RunStore, run_id: str, data: bytes) -> None:
    """Replace tasks.csv and make the manifest vouch for it (a buggy writer, not a crash)."""
    put(store, layout.table_file(PIPELINE, run_id, "tasks"), data)
    rel = layout.manifest_file(PIPELINE, run_id)
    doc = json.loads(store.fs.cat_file(store._path(rel)))
    doc["files"]["tasks.csv"] = {"size": len(data), "sha256": sha256(data)}
    put(store, rel, json.dumps(doc).encode())


def manifest_bytes(store: RunStore, run_id: str) -> bytes:
    return store.fs.cat_file(store._path(layout.manifest_file(PIPELINE, run_id)))


def marker(run_id: str) -> str:
    return layout.index_marker(PIPELINE, VERSION, run_id, "healthy")


# Each damage: (what it does to the newest history run, the file a warning must name, and
# whether the run is repaired (still counts) rather than skipped).
DAMAGES: dict[str, tuple[Callable[[RunStore, str], None], str, bool]] = {
    "truncated manifest.json": (
        lambda s, r: put(s, layout.manifest_file(PIPELINE, r), manifest_bytes(s, r)[:40]),
        "manifest.json", False),
    "non-UTF-8 manifest.json": (
        lambda s, r: put(s, layout.manifest_file(PIPELINE, r),
                         manifest_bytes(s, r).replace(b'"healthy"', b'"h\xe9\xffy"')),
        "manifest.json", False),
    "garbage tasks.csv": (
        lambda s, r: put(s, layout.table_file(PIPELINE, r, "tasks"), b"\x00\x01garbage\n\xff"),
        "tasks.csv", False),
    "empty tasks.csv": (lambda s, r: rewrite_table(s, r, b""), "tasks.csv", False),
    "non-UTF-8 tasks.csv": (
        lambda s, r: rewrite_table(s, r, b"stage,prefix\n\xff\xfe,\xe9\n"), "tasks.csv", False),
    "tasks.csv with wrong column types": (
        lambda s, r: rewrite_table(
            s, r, b"stage,prefix,tasks,total_s,p50_s,p95_s,gb_out\n"
                  b"read,sum,many,slow,x,y,z\n"), "tasks.csv", False),
    "manifest without its tables": (
        lambda s, r: rm(s, layout.table_file(PIPELINE, r, "tasks")), "tasks.csv", False),
    "index marker whose run folder is gone": (
        lambda s, r: rm(s, layout.run_dir(PIPELINE, r)), "index", False),
    "manifest without index marker": (lambda s, r: rm(s, marker(r)), "manifest.json", True),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_run_is_left_out_named_or_repaired(damage, store, record, fault, caplog):
    """A night that is in the store but cannot be read is left out of the new run's
    history and named (a warning, the manifest's ``skipped``): it costs at most itself, and
    the new run is judged (issue 56: it used to leave every later run unjudged). A night
    whose folder is gone is not in the store any more; one whose index marker is missing is
    repaired and still counts. Either way nothing of the new run is lost."""
    do, named, repaired = DAMAGES[damage]
    ids = history(store, record)
    damaged = ids[-1]
    gone = damage == "index marker whose run folder is gone"
    fault.inject(f"{damage} ({store.kind} store)")
    do(store, damaged)
    fault.expect_summary()
    with caplog.at_level(logging.WARNING):
        listed = [r["run_id"] for r in store.list_runs(PIPELINE, VERSION)]
        base = load_baseline(store, PIPELINE, VERSION, n=HISTORY)
        ctx = RunContext(run_id=new_run_id(), pipeline=PIPELINE, version=VERSION)
        result = finish_run(store, record, ctx, [],
                            ProfilingOptions(on_regression="warn", history=HISTORY))
    warned = [r.message for r in caplog.records if r.name.startswith("prefect_dask_profiling")
              and r.levelno >= logging.WARNING and damaged in r.message and named in r.message]
    assert warned, f"no warning names run {damaged} and {named}: {caplog.messages}"
    manifest = store.read_manifest(PIPELINE, ctx.run_id)
    assert manifest["status"] == result.status
    assert (damaged in listed and damaged in base.runs) if repaired \
        else damaged not in base.runs
    if repaired:
        assert store.fs.exists(store._path(marker(damaged)))  # the index was repaired
    assert base.runs == [r for r in ids if r != damaged or repaired]
    assert result.judged, result.manifest.get("unjudged_reason")
    assert result.status in ("healthy", "regressed")
    if not (repaired or gone):
        skipped = {s["run_id"]: s["reason"] for s in manifest["skipped"]}
        assert damaged in skipped and named in skipped[damaged], manifest["skipped"]
    assert store.read_table(PIPELINE, ctx.run_id)["tasks"].sum() > 0
    assert ctx.run_id in [r["run_id"] for r in store.list_runs(PIPELINE)]
    fault.recovered()
    fault.survived()


def test_a_503_on_one_baseline_manifest_leaves_the_night_unjudged_naming_it(
        record, tmp_path, moto_endpoint):
    """Issue 56, item 6: S3 answering ``503 SlowDown`` for one baseline night's manifest
    (through a real proxy in front of moto, every retry of s3fs included) says nothing about
    that night, so it is not left out of one family while the others use it: tonight is
    stored ``unjudged``, naming the night and the store's answer, and the next night, with
    the store answering again, is judged with that night back in its baseline."""
    reset_moto(moto_endpoint)
    boto_client(moto_endpoint).create_bucket(Bucket=BUCKET)
    with FaultProxy(moto_endpoint) as proxy:
        store = RunStore(f"s3://{BUCKET}/h", s3_options(proxy.endpoint),
                         spool_dir=tmp_path / "spool", timeout=30)
        ids = history(store, record)
        hit = ids[-2]
        key = f"{BUCKET}/h/{layout.manifest_file(PIPELINE, hit)}"
        proxy.rule = lambda r: 503 if r.method == "GET" and r.key == key else None
        options = ProfilingOptions(on_regression="warn", history=HISTORY)
        tonight = RunContext(run_id=new_run_id(), pipeline=PIPELINE, version=VERSION)
        result = finish_run(store, record, tonight, [], options)
        assert any(r.key == key and action == 503 for r, action in proxy.log)
        assert result.status == "unjudged", result.manifest.get("skipped")
        reason = result.manifest["unjudged_reason"]
        assert hit in reason and "did not answer" in reason, reason
        assert not result.manifest.get("skipped")  # an outage is not damage
        proxy.rule = lambda r: None
        nxt = RunContext(run_id=new_run_id(), pipeline=PIPELINE, version=VERSION)
        later = finish_run(store, record, nxt, [], options)
    assert later.judged, later.manifest.get("unjudged_reason")
    assert hit in later.manifest["baseline"]["runs"], later.manifest["baseline"]
    assert tonight.run_id not in later.manifest["baseline"]["runs"]  # unjudged never counts
