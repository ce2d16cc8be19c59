"""Ack markers when the store fails: ``alerts`` and ``ack`` exit 4 in one line.

The store is a real moto server behind a real HTTP proxy (:class:`s3_servers.FaultProxy`)
that stops answering (or refuses) only the requests for ``acks/``: everything else the
commands read first still works, so the failure reaches the ack markers' own reads and
writes. They go through the store's timed, breaker-guarded calls like every other read:
a store that does not answer is ``StoreUnreachable`` (exit 4, "retry later"), not a bad
record (exit 2), and no call waits much past the store's timeout.
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
from helpers.s3_servers import FaultProxy, boto_client, moto_server, s3_options
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.regression import alert_history
from prefect_dask_profiling.regression.alerts import Ack
from prefect_dask_profiling.store.errors import StoreUnreachable
from prefect_dask_profiling.store.runs import RunStore, new_run_id

pytestmark = pytest.mark.timeout(180)

BUCKET = "acks-down"
URL = f"s3://{BUCKET}/store"
runner = CliRunner()


def acks_only(action: str):
    """A proxy rule: ``action`` for every request about ``acks/``, the rest forwarded."""
    def rule(request):
        about_acks = "/acks/" in f"/{request.key}" or "/acks/" in f"/{request.prefix}"
        return action if about_acks else None
    return rule


@pytest.fixture
def store_behind_proxy(tmp_path):
    """A store of two healthy runs on moto, reached through a :class:`FaultProxy`."""
    with moto_server() as endpoint, FaultProxy(endpoint) as proxy:
        boto_client(endpoint).create_bucket(Bucket=BUCKET)
        store = RunStore(URL, s3_options(proxy.endpoint), spool_dir=tmp_path / "spool")
        tasks = pd.DataFrame({"stage": ["read"], "prefix": ["open"], "tasks": [4],
                              "total_s": [2.0], "p50_s": [0.5], "p95_s": [0.6],
                              "gb_out": [0.1], "share": [1.0]})
        runs = [new_run_id() for _ in range(2)]
        for run_id in runs:
            result = store.write_run("nightly", run_id, {"tasks": tasks},
                                     {"version": "v1", "status": "healthy",
                                      "state": "COMPLETED"})
            assert not result.spooled, result.warnings
        env = {"DASK_PROFILING_STORAGE_OPTIONS": json.dumps(s3_options(proxy.endpoint)),
               "DASK_PROFILING_SPOOL": str(tmp_path / "spool")}
        yield proxy, store, runs, env


def one_error_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.mark.slow  # > 10 s
def test_acks_read_when_the_store_stops_answering_is_exit_4(store_behind_proxy, fault):
    proxy, store, runs, env = store_behind_proxy
    assert runner.invoke(app, ["alerts", "--store", URL], env=env).exit_code == 0
    proxy.rule = acks_only("hang")
    fault.inject("store does not answer the ack listing")
    start = time.monotonic()
    result = runner.invoke(app, ["alerts", "--store", URL], env=env)
    took = time.monotonic() - start
    line = one_error_line(result, 4)
    assert line.startswith("error: could not list") and "acks/nightly/v1" in line, line
    assert took < 60, took  # bounded by the store's timeout (10 s), not a hang
    assert any("/acks/" in f"/{r.prefix}" for r, action in proxy.log if action == "hang")
    fault.timing(f"alerts with the ack listing unanswered: exit 4 after {took:.1f} s")
    fault.survived()


def test_acks_listing_refused_is_exit_4_not_bad_input(store_behind_proxy, fault):
    proxy, store, runs, env = store_behind_proxy
    proxy.rule = acks_only(403)
    fault.inject("store refuses the ack listing (403)")
    line = one_error_line(runner.invoke(app, ["alerts", "--store", URL], env=env), 4)
    assert "Access Denied" in line and "acks/nightly/v1" in line, line
    fault.survived()


@pytest.mark.slow  # > 10 s
def test_ack_write_when_the_store_stops_answering_is_exit_4(store_behind_proxy, fault):
    proxy, store, runs, env = store_behind_proxy
    proxy.rule = acks_only("hang")
    fault.inject("store does not answer the ack marker's PUT")
    start = time.monotonic()
    result = runner.invoke(app, ["ack", runs[-1], "--store", URL], env=env)
    took = time.monotonic() - start
    line = one_error_line(result, 4)
    assert line.startswith("error: could not write") and f"acks/nightly/v1/{runs[-1]}" in line
    assert took < 60, took
    assert any(r.method == "PUT" for r, action in proxy.log if action == "hang")
    proxy.rule = acks_only(None)  # the store is back: the same command succeeds unchanged
    assert runner.invoke(app, ["ack", runs[-1], "--store", URL], env=env).exit_code == 0
    assert [a.target for a in alert_history.load_acks(store, "nightly", "v1")] == [runs[-1]]
    fault.survived()


@pytest.mark.slow  # > 10 s
def test_load_acks_fails_at_once_while_the_breaker_holds_the_store_down(store_behind_proxy):
    """After the store did not answer, the next ack read fails at once (the breaker), as
    every other read does, instead of waiting for the timeout again."""
    proxy, store, runs, env = store_behind_proxy
    alert_history.acknowledge(store, "nightly", "v1", runs[0])
    proxy.rule = acks_only("hang")
    with pytest.raises(StoreUnreachable):
        alert_history.load_acks(store, "nightly", "v1")
    hung = sum(action == "hang" for _, action in proxy.log)
    with pytest.raises(StoreUnreachable, match="did not answer moments ago"):
        alert_history.load_acks(store, "nightly", "v1")
    assert sum(action == "hang" for _, action in proxy.log) == hung  # nothing was sent


def test_a_damaged_ack_marker_still_counts_by_its_name(tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    # markers written as acknowledge() writes them (it refuses ids no episode was paged
    # under, and this store holds no runs: the markers are what is tested here)
    first = Ack("ep-0000000001", at="2026-12-01T06:00:00+00:00", by="me")
    for target in ("ep-0000000001", "ep-0000000002", "ep-0000000003"):
        store.write_ack("nightly", "v1", target, json.dumps(
            {"target": target, "at": first.at, "by": first.by, "note": "why",
             "nights": None}).encode())
    marker = tmp_path / "store" / alert_history.ack_marker("nightly", "v1", "ep-0000000002")
    marker.write_bytes(b"{truncated")
    listed = tmp_path / "store" / alert_history.ack_marker("nightly", "v1", "ep-0000000003")
    listed.write_bytes(b"[1, 2]")
    acks = alert_history.load_acks(store, "nightly", "v1")
    assert [a.target for a in acks] == ["ep-0000000001", "ep-0000000002", "ep-0000000003"]
    assert acks[0] == first and acks[1].at == "" and acks[2].at == ""
    assert alert_history.load_acks(store, "nightly", "v2") == []
