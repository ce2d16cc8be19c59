"""Object store faults: down at start, lost between two reports, answering never.

Each time the flow's result is unchanged, everything is spooled, no store call blocks much
longer than the configured timeout, and ``dask-profiling upload-pending`` later uploads the
spool byte-identical.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.run_records import spooled
from helpers.s3_servers import (
    RefusedEndpoint,
    SilentServer,
    boto_client,
    moto_server,
    port_of,
    s3_options,
)
from moto.server import ThreadedMotoServer
from typer.testing import CliRunner

from faults.conftest import Stopwatch
from faults.fault_flows import expected, make_fault_flow
from prefect_dask_profiling.cli import app
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.store.compression import page_bytes
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]

TIMEOUT = 2.0
TIMED = ("write_report", "write_run", "ensure_lifecycle", "list_runs", "accepted",
         "read_table", "presign")


def upload_pending(url: str, endpoint: str, spool: Path):
    """Run ``dask-profiling upload-pending`` against ``endpoint``."""
    env = {"DASK_PROFILING_STORAGE_OPTIONS": json.dumps(s3_options(endpoint)),
           "DASK_PROFILING_SPOOL": str(spool)}
    return CliRunner().invoke(app, ["upload-pending", "--store", url], env=env)


def assert_uploaded_identical(files: dict[str, bytes], endpoint: str, bucket: str,
                              prefix: str) -> None:
    client = boto_client(endpoint)
    for rel, data in files.items():
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{rel}")["Body"].read()
        assert page_bytes(body) == data, rel  # a page is stored gzip (the same page)


def timed_store(monkeypatch) -> Stopwatch:
    """Time every RunStore call the run makes (instrumentation only; nothing is faked)."""
    watch = Stopwatch()
    for name in TIMED:
        monkeypatch.setattr(RunStore, name, watch.wrap(name, getattr(RunStore, name)))
    return watch


# The timeout of a run whose store answers (it is what the run delivers, not how fast a
# dead store fails): a loaded machine can keep moto's answer past TIMEOUT, and the breaker
# would then spool the whole run.
ANSWERING_TIMEOUT = 30.0


def run_flow(cluster, url: str, endpoint: str, name: str, timeout: float = TIMEOUT):
    runner = ProfiledDaskTaskRunner(address=cluster.address, store=url,
                                    storage_options=s3_options(endpoint),
                                    store_timeout=timeout,
                                    stage_reports=True)  # the faults hit report uploads too
    start = time.monotonic()
    state = make_fault_flow(runner, name)(delay=0.05, blocks=4, return_state=True)
    return state, time.monotonic() - start


def check_spooled_run(files: dict[str, bytes], pipeline: str, reports: set[str],
                      maybe: frozenset[str] = frozenset(), read_early: bool = False) -> str:
    """The spool holds the whole run (manifest, tables, index marker) and ``reports`` (plus
    any of ``maybe``: reports written in the background may or may not have made it).

    ``read_early``: the store answered at the run's start, so the history may have been read
    then (in the background, while the first stage ran) and the run judged against it."""
    [manifest_rel] = [r for r in files if r.endswith("/manifest.json")]
    run_id = manifest_rel.split("/")[2]
    manifest = json.loads(files[manifest_rel])
    assert manifest["state"] == "COMPLETED"
    if read_early and manifest["history_read"]["when"] == "run start":
        assert manifest["status"] == "healthy", manifest["unjudged_reason"]
        assert manifest["history_read"]["at"] <= manifest["ended"]
    else:
        # the history could not be listed either: the run is unjudged with the reason,
        # never judged on "no history" and stored healthy (issue 19, item 2)
        assert manifest["status"] == "unjudged"
        assert manifest["history_read"]["when"] == "finish"
        assert "could not be listed" in manifest["unjudged_reason"]
    for name in manifest["files"]:
        assert f"runs/{pipeline}/{run_id}/{name}" in files, name
    assert any(r.startswith(f"index/{pipeline}/") for r in files)
    assert {r.rsplit("/", 1)[1] for r in files if r.startswith("reports/")} - maybe == reports
    return run_id


def test_store_down_at_start(cluster, spool, fault, monkeypatch):
    bucket, url = "fault-down-start", "s3://fault-down-start/nightly"
    watch = timed_store(monkeypatch)
    fault.inject("object store down at start")
    fault.expect_summary()
    dead = RefusedEndpoint()
    state, elapsed = run_flow(cluster, url, dead.endpoint, "fault-store-down")
    assert state.is_completed(), state.message
    assert state.result() == expected(4)
    files = spooled(spool)
    run_id = check_spooled_run(files, "fault-store-down", {"load.html", "compute.html"})
    name, longest = watch.longest
    fault.timing(f"store down at start: flow {elapsed:.1f} s, longest store call {name} "
                 f"{longest:.2f} s (timeout {TIMEOUT:g} s)")
    assert longest < 5 * TIMEOUT
    with moto_server(dead.release()) as endpoint:  # the same endpoint, back up
        boto_client(endpoint).create_bucket(Bucket=bucket)
        result = upload_pending(url, endpoint, spool)
        assert result.exit_code == 0, result.output
        assert f"uploaded {len(files)}, failed 0" in result.output
        assert_uploaded_identical(files, endpoint, bucket, "nightly")
        store = RunStore(url, s3_options(endpoint))
        assert store.read_manifest("fault-store-down", run_id)["run_id"] == run_id
        assert [r["run_id"] for r in store.list_runs("fault-store-down")] == [run_id]
    fault.recovered()
    assert spooled(spool) == {}
    fault.survived()


def test_store_lost_between_two_reports(cluster, hooks, spool, fault, monkeypatch):
    bucket, url = "fault-mid-upload", "s3://fault-mid-upload/nightly"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto_client(endpoint).create_bucket(Bucket=bucket)
    watch = timed_store(monkeypatch)

    def stop_store() -> None:
        server.stop()
        fault.inject("object store stopped after the first stage's report")

    hooks["after_load"] = stop_store
    fault.expect_summary()
    try:
        state, elapsed = run_flow(cluster, url, endpoint, "fault-store-mid")
        assert fault.names, "the store was never stopped"
        assert state.is_completed(), state.message
        assert state.result() == expected(4)
        files = spooled(spool)
        run_id = check_spooled_run(files, "fault-store-mid", {"compute.html"},
                                   maybe=frozenset({"load.html"}), read_early=True)
        name, longest = watch.longest
        fault.timing(f"store lost mid-run: flow {elapsed:.1f} s, longest store call {name} "
                     f"{longest:.2f} s (timeout {TIMEOUT:g} s)")
        assert longest < 5 * TIMEOUT
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()  # the same store back (moto keeps its state in the process)
        keys = [o["Key"] for o in boto_client(endpoint).list_objects_v2(
            Bucket=bucket).get("Contents", [])]
        load = f"reports/fault-store-mid/{run_id}/load.html"
        assert keys == ([] if load in files else [f"nightly/{load}"])  # stored xor spooled
        result = upload_pending(url, endpoint, spool)
        assert result.exit_code == 0, result.output
        assert_uploaded_identical(files, endpoint, bucket, "nightly")
        store = RunStore(url, s3_options(endpoint))
        manifest = store.read_manifest("fault-store-mid", run_id)
        fault.recovered()
        assert {s["name"] for s in manifest["stages"]} == {"load", "compute"}
        assert spooled(spool) == {}
    finally:
        server.stop()
    fault.survived()


def test_store_that_never_answers(cluster, spool, fault, monkeypatch):
    bucket, url = "fault-silent", "s3://fault-silent/nightly"
    watch = timed_store(monkeypatch)
    fault.inject("object store accepts connections and never answers")
    fault.expect_summary()
    with SilentServer() as silent:
        state, elapsed = run_flow(cluster, url, silent, "fault-store-silent")
    assert state.is_completed(), state.message
    assert state.result() == expected(4)
    files = spooled(spool)
    run_id = check_spooled_run(files, "fault-store-silent", {"load.html", "compute.html"})
    name, longest = watch.longest
    fault.timing(f"silent store: flow {elapsed:.1f} s, longest store call {name} "
                 f"{longest:.2f} s (timeout {TIMEOUT:g} s), "
                 f"{sum(d for _, d in watch.calls):.2f} s in {len(watch.calls)} store calls")
    assert longest < 5 * TIMEOUT  # generous: the figure above is what matters
    with moto_server(port_of(silent)) as endpoint:  # the same endpoint, answering again
        boto_client(endpoint).create_bucket(Bucket=bucket)
        result = upload_pending(url, endpoint, spool)
        assert result.exit_code == 0, result.output
        assert_uploaded_identical(files, endpoint, bucket, "nightly")
        assert RunStore(url, s3_options(endpoint)).read_manifest(
            "fault-store-silent", run_id)["status"] == "unjudged"
    fault.recovered()
    fault.survived()


def test_next_flow_run_delivers_what_the_last_one_spooled(cluster, spool, fault):
    """Store down during one night's run; the next night's run (store back) delivers the
    spooled run byte-identical, and says so in its manifest — no upload-pending needed."""
    bucket, url = "fault-next-run", "s3://fault-next-run/nightly"
    dead = RefusedEndpoint()
    fault.inject("object store down for a whole run; the next run delivers its spool")
    fault.expect_summary()
    state, _ = run_flow(cluster, url, dead.endpoint, "fault-next-run")
    assert state.is_completed(), state.message
    files = spooled(spool)
    first = check_spooled_run(files, "fault-next-run", {"load.html", "compute.html"})
    with moto_server(dead.release()) as endpoint:  # the same endpoint, back for the next run
        boto_client(endpoint).create_bucket(Bucket=bucket)
        state, elapsed = run_flow(cluster, url, endpoint, "fault-next-run",
                                  timeout=ANSWERING_TIMEOUT)
        assert state.is_completed(), state.message
        assert state.result() == expected(4)
        assert_uploaded_identical(files, endpoint, bucket, "nightly")
        store = RunStore(url, s3_options(endpoint))
        runs = store.list_runs("fault-next-run")
        assert len(runs) == 2 and first in [r["run_id"] for r in runs]
        second = max(r["run_id"] for r in runs)
        delivery = store.read_manifest("fault-next-run", second)["spool_delivery"]
        assert delivery["delivered"] == len(files) and delivery["left"] == 0
        assert delivery["runs"] == [first]
        fault.timing(f"next run delivered {len(files)} spooled files in "
                     f"{delivery['seconds']:.2f} s (flow {elapsed:.1f} s)")
    fault.recovered()
    assert spooled(spool) == {}
    fault.survived()
