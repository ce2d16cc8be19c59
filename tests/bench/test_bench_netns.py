"""``dask-profiling bench`` across network hosts: the netns cluster's workers are separate
hosts behind rate-limited links (``../shared/tools/netns-cluster``), so moving bytes costs
what it costs between machines. Skipped where netns is not available.
"""

from __future__ import annotations

import pytest
from bench_runs import assert_verdict, run
from helpers.bench_fixtures import address_host, netns_cluster, netns_unavailable

pytestmark = pytest.mark.slow


@pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))
def test_transfer_bound_between_network_hosts(tmp_path):
    with netns_cluster(workers=2, nthreads=1, rate="100mbit") as address:
        s = run(tmp_path, "synthetic_transfer", n=[4000], seeds=[1], scheduler=address,
                local=False)
    failing = {e["signal"] for e in s["remote"]["bottleneck"]["signals"] if not e["supports"]}
    # beside a CPU hog and three other test processes the threads stayed busy longer with what
    # they received (busy fraction 0.67 once; the rule wants <= 0.6): the task records then do
    # not agree, and two sources make the verdict medium, as the classifier says
    assert_verdict(s["remote"], "transfer",
                   min_sources=2 if "tasks.busy_fraction" in failing else 3)
    warnings = s["remote"]["warnings"]
    # honest: separate network hosts, not loopback — but the same machine
    assert not any("loopback" in w for w in warnings)
    assert any("same host" in w or "hostname" in w for w in warnings)


@pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))
def test_io_bound_reading_real_s3_across_slow_links(tmp_path, monkeypatch):
    from helpers.bench_fixtures import moto_on

    from prefect_dask_profiling.bench.workloads import S3_ENDPOINT_ENV

    with netns_cluster(workers=2, nthreads=1, rate="20mbit") as address, \
            moto_on(address_host(address), size=4 * 1024 * 1024) as spec:
        monkeypatch.setenv(S3_ENDPOINT_ENV, spec)
        s = run(tmp_path, "s3_read_ranges", n=[6], seeds=[1], scheduler=address, local=False)
    b = s["remote"]["bottleneck"]
    if b["primary"] == "io":
        assert_verdict(s["remote"], "io")
    else:
        # beside a CPU hog and three other test processes the workers' CPU per busy thread
        # read 0.48 once (io needs <= 0.4): then io must still have its sources, and the
        # verdict must say why it is not io and lower its confidence rather than pick silently
        assert b["confidence"] == "low", b["note"]
        assert any(d.startswith("io-bound has ") and "necessary condition fails: "
                   "monitor.cpu_per_busy_thread" in d for d in b["disagreements"]), \
            b["disagreements"]
    signals = s["remote"]["signals"]
    assert signals["host.external_mb"] >= 4  # the object's bytes came from outside Dask
    assert signals["transfer.mb_moved"] < 1  # and not between workers
    assert s["remote"]["bottleneck"]["scores"]["transfer"]["gate"]
