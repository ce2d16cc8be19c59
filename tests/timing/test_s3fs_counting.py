"""The s3fs counting of several counters in one process (workers with ``processes=False``
and the flow's own): a stopped counter counts no more, a running one keeps counting, and
s3fs's own method is back once the last one stops, in whatever order they stop.

Real parts only: moto's S3 server, real s3fs calls, a real in-process LocalCluster whose
two workers run the storage-requests plugin and are closed one after the other.
"""

from __future__ import annotations

import pytest
import s3fs
from distributed import Client, LocalCluster
from helpers.s3_servers import boto_client, moto_server, s3_options
from s3fs.core import S3FileSystem

from prefect_dask_profiling.timing import io_client, worker_io

BUCKET = "counted"


@pytest.fixture(scope="module")
def endpoint():
    with moto_server() as url:
        boto_client(url).create_bucket(Bucket=BUCKET)
        s3fs.S3FileSystem(skip_instance_cache=True, **s3_options(url)).pipe_file(
            f"{BUCKET}/a", b"x")
        yield url


def get_once(endpoint: str) -> None:
    """One GET through a user's s3fs filesystem (counted)."""
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options(endpoint))
    assert fs.cat_file(f"{BUCKET}/a") == b"x"


def gets(counts: dict[str, int]) -> int:
    return counts.get("GET", 0)


def assert_restored(original, ours: list) -> None:
    """None of ``ours`` (the test's counters' sinks) is called any more, and s3fs's own
    method is back unless a counter of another test in this process still counts (a test
    process runs many files: its wrapper then stays, with that counter's sink only)."""
    current = S3FileSystem.__dict__["_call_s3"]
    left = getattr(current, "sinks", ())
    assert not [s for s in left if any(s is o for o in ours)], "a stopped counter's sink"
    assert current is original or left, "a wrapper counting for nobody is installed"


@pytest.mark.parametrize("stop_first", ["first started", "last started"])
def test_two_counters_of_one_process_stop_in_either_order(endpoint, stop_first):
    original = S3FileSystem.__dict__["_call_s3"]
    original = getattr(original, "__wrapped__", original)  # another test's counter counts
    first, second = worker_io.StorageRequests(), worker_io.StorageRequests()
    first.attach()
    second.attach()
    try:
        counts = {"first": first.s3fs, "second": second.s3fs}
        get_once(endpoint)
        assert gets(counts["first"]) == gets(counts["second"]) == 1  # one process: both
        stopped, running = (first, second) if stop_first == "first started" else \
            (second, first)
        stopped.teardown(None)
        get_once(endpoint)
        assert gets(counts["first" if stopped is first else "second"]) == 1, \
            "a stopped counter still counts: its wrapper is installed"
        assert gets(running.counters(cpu=False)["s3fs"]) == 2, "the running one lost count"
        sinks = [first._s3fs_sink, second._s3fs_sink]
        running.teardown(None)
        get_once(endpoint)
        assert gets(counts["first"]) + gets(counts["second"]) == 3  # nobody counted it
        assert_restored(original, sinks)
    finally:
        first.teardown(None)
        second.teardown(None)


@pytest.mark.parametrize("close_first", [0, 1], ids=["first worker first", "last first"])
def test_in_process_workers_closed_in_either_order_leave_no_stopped_wrapper(endpoint,
                                                                          close_first):
    original = S3FileSystem.__dict__["_call_s3"]
    original = getattr(original, "__wrapped__", original)  # another test's counter counts
    with LocalCluster(n_workers=0, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        assert io_client.install(client)  # the flow's counter (this process) too
        try:
            workers = []
            for n in (1, 2):  # one after the other: the plugins start in this order
                cluster.scale(n)
                client.wait_for_workers(n, timeout=60)
                workers.append(next(w for w in cluster.workers.values()
                                    if w not in workers))
            plugins = [w.plugins[worker_io.PLUGIN_NAME] for w in workers]
            counts = [p.s3fs for p in plugins]
            sinks = [p._s3fs_sink for p in plugins]
            assert all(c is not None for c in counts)
            flow_before = gets(io_client.count_this_process().counters(cpu=False)["s3fs"])
            get_once(endpoint)
            assert [gets(c) for c in counts] == [1, 1]
            for worker in (workers[close_first], workers[1 - close_first]):
                cluster.sync(worker.close)
            get_once(endpoint)
            assert [gets(c) for c in counts] == [1, 1], "a closed worker's plugin counts"
            flow = io_client.count_this_process().counters(cpu=False)["s3fs"]
            assert gets(flow) == flow_before + 2  # the flow's counter counted throughout
        finally:
            io_client.uninstall(client)
    assert_restored(original, sinks)
