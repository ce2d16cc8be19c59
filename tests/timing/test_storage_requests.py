"""Storage requests per stage against what a request-logging server in front of S3 saw.

Real parts only: moto's S3 server on 127.0.0.1, a logging HTTP proxy in front of it, COGs
written by rasterio/rio-cogeo, a LocalCluster of two one-thread worker processes running the
storage-requests worker plugin, GDAL reading through ``/vsis3/``. Every GDAL request carries
its worker's pid (``GDAL_HTTP_HEADERS``) so the proxy's log splits per worker process.
"""

from __future__ import annotations

import ctypes.util
import os
import time

import dask.array as da
import pandas as pd
import pytest
from distributed import Client, LocalCluster, wait
from helpers.s3_servers import LoggingProxy, boto_client, moto_server, s3_options, tag_process

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.summary.io import (
    io_frame,
    io_text,
    stage_io_metrics,
    stage_io_summaries,
    stage_io_summary,
)
from prefect_dask_profiling.timing import io_client, worker_io
from tasks import scenes
from tasks.synthetic import CubeSpec

SPEC = CubeSpec(dates=6, size=256, tile=64)
BUCKET = "scenes"
# GDAL counts one GET per *parallel* multi-range batch (GDAL 3.10), one per HTTP request in
# SERIAL mode: the four variants compare request by request in SERIAL mode
SERIAL = {"GDAL_HTTP_MULTIRANGE": "SERIAL"}
MERGE_OFF = {"GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "NO"}
VARIANTS = {"merge-on-aligned": ({}, 128), "merge-on-misaligned": ({}, 96),
            "merge-off-aligned": (MERGE_OFF, 128), "merge-off-misaligned": (MERGE_OFF, 96)}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def archive():
    """Scenes on moto, a logging proxy in front, a 2-process cluster with the plugin."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    try:
        with moto_server() as endpoint, LoggingProxy(endpoint) as proxy:
            boto_client(endpoint).create_bucket(Bucket=BUCKET)
            catalog = scenes.write_scenes(SPEC, f"s3://{BUCKET}/data", s3_options(endpoint))
            found = scenes.search(catalog, SPEC.dates, s3_options(endpoint))
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                              dashboard_address=":0") as cluster, Client(cluster) as client:
                assert io_client.install(client)
                pids = client.run(tag_process)
                yield {"client": client, "proxy": proxy, "pids": pids, "found": found,
                       "endpoint": endpoint, "catalog": catalog}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def read_stage(archive, name: str, options: dict, chunk: int):
    """Run one read stage; return its io rows and the proxy's requests during it."""
    client, proxy = archive["client"], archive["proxy"]
    scenes.configure_workers(client, {**scenes.gdal_options(
        {"endpoint_url": proxy.endpoint}), **options})
    before, mark = io_client.io_counters(client), proxy.mark()
    ds = client.submit(scenes.open_scenes, archive["found"], chunk, pure=False).result()
    ds = ds.persist()
    wait(ds)
    rows = io_client.stage_deltas(name, before, io_client.io_counters(client))
    # the files were opened on a worker: this (the flow) process made no request
    flow = [r for r in rows if r["process"] == "flow"]
    assert len(flow) == 1 and not any(v for k, v in flow[0].items()
                                      if k.startswith(("gdal_", "s3fs_"))), flow
    return [r for r in rows if r["process"] == "worker"], proxy.since(mark), ds


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gdal_requests_per_worker_equal_what_the_server_saw(archive, variant):
    options, chunk = VARIANTS[variant]
    rows, seen, ds = read_stage(archive, variant, {**SERIAL, **options}, chunk)
    assert {r["worker"] for r in rows} == set(archive["pids"])
    for row in rows:
        pid = archive["pids"][row["worker"]]
        mine = [q for q in seen if q.pid == pid]
        assert mine, f"worker {row['worker']} made no requests"
        assert row["gdal_get"] == sum(q.kind == "GET" for q in mine), (variant, row)
        assert row["gdal_head"] == sum(q.kind == "HEAD" for q in mine), (variant, row)
        assert row["gdal_list"] == sum(q.kind == "LIST" for q in mine), (variant, row)
        assert row["gdal_bytes"] == sum(q.body_bytes for q in mine), (variant, row)
    assert all(q.pid is not None for q in seen), "every request came from a tagged worker"
    # every Dask chunk of the two bands is one array chunk read
    metrics = stage_io_metrics(io_frame(rows)).loc[variant]
    assert metrics["chunks"] == ds.red.data.npartitions + ds.nir.data.npartitions, metrics
    assert metrics["requests"] == len(seen)
    assert metrics["read_amplification"] > 0


def test_parallel_multirange_bytes_are_exact_and_gets_are_per_batch(archive):
    """GDAL's default PARALLEL strategy logs one GET per batch of parallel range requests."""
    rows, seen, _ = read_stage(archive, "parallel", {}, 128)
    for row in rows:
        mine = [q for q in seen if q.pid == archive["pids"][row["worker"]]]
        assert row["gdal_bytes"] == sum(q.body_bytes for q in mine)
        assert 0 < row["gdal_get"] <= len(mine)


def test_whole_object_answers_show_as_read_amplification(archive):
    """Multi-range reads sent as one GET: moto answers with whole objects (exact counts)."""
    healthy = read_stage(archive, "healthy", SERIAL, 128)[0]  # its data released here
    rows, seen, _ = read_stage(archive, "single-get", scenes.MERGE_OFF, 128)
    assert sum(r["gdal_get"] for r in rows) == sum(q.kind == "GET" for q in seen)
    before = stage_io_metrics(io_frame(healthy)).loc["healthy"]
    after = stage_io_metrics(io_frame(rows)).loc["single-get"]
    assert after["read_amplification"] > 3 * before["read_amplification"]
    assert after["requests_per_chunk"] > before["requests_per_chunk"]


def test_s3fs_requests_are_counted_on_the_worker_that_made_them(archive):
    client, proxy = archive["client"], archive["proxy"]
    worker = sorted(archive["pids"])[0]
    options = s3_options(proxy.endpoint)
    catalog = archive["catalog"]
    client.submit(scenes.search, catalog, 2, options, workers=[worker], pure=False).result()
    before, mark = io_client.io_counters(client), proxy.mark()
    found = client.submit(scenes.search, catalog, 3, options, workers=[worker],
                          pure=False).result()
    rows = io_client.stage_deltas("search", before, io_client.io_counters(client))
    seen = proxy.since(mark)
    assert len(found) == 3
    mine = {r["worker"]: r for r in rows}[worker]
    assert mine["s3fs_get"] == sum(q.kind == "GET" for q in seen) == SPEC.dates + 1
    assert mine["s3fs_head"] + mine["s3fs_list"] == sum(q.kind != "GET" for q in seen)


def spin(steps: int) -> int:
    total = 0
    for i in range(steps):
        total = (total * 31 + i) % 1_000_003
    return total


def test_workers_without_gdal_have_no_gdal_columns():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        assert io_client.install(client)
        before = io_client.io_counters(client)
        da.ones((100, 100), chunks=50).sum().compute()
        every = io_client.stage_deltas("compute", before, io_client.io_counters(client))
    # this (the flow) process has its own row, with GDAL when this process loaded rasterio
    assert [r["process"] for r in every] == ["worker", "flow"]
    rows = [r for r in every if r["process"] == "worker"]
    assert rows and all(not any(k.startswith("gdal_") for k in r) for r in rows)
    metrics = stage_io_metrics(io_frame(rows))
    assert "requests" not in metrics.columns and "requests_per_chunk" not in metrics.columns
    assert stage_io_summary(io_frame(rows), "compute") is None or "requests" not in (
        stage_io_summary(io_frame(rows), "compute") or {})


def timed_spin(steps: int) -> dict[str, float]:
    """``spin`` measuring its own thread: CPU (``time.thread_time``) and, on Linux, its
    run-queue wait read straight from the kernel."""
    def wait_s() -> float:
        try:
            with open("/proc/thread-self/schedstat") as fh:
                return int(fh.read().split()[1]) / 1e9
        except OSError:
            return 0.0

    cpu, wait = time.thread_time(), wait_s()
    spin(steps)
    return {"cpu_s": time.thread_time() - cpu, "wait_s": wait_s() - wait}


def test_a_stage_gets_its_worker_processes_cpu_and_run_queue_wait():
    """The busy worker's stage counts hold at least what its task thread measured itself;
    compared with the task's own figures, not with the wall (which on a loaded host also
    holds scheduling and GIL handovers)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        assert io_client.install(client)
        before = io_client.io_counters(client)
        busy = sorted(client.nthreads())[0]
        own = client.submit(timed_spin, 3_000_000, workers=[busy], pure=False).result()
        rows = {r["worker"]: r for r in io_client.stage_deltas(
            "compute", before, io_client.io_counters(client))}
    idle = next(w for w in rows if w != busy)
    spun = rows[busy]
    assert own["cpu_s"] > 0.1, own
    # process CPU comes in clock ticks (10 ms): a little under the thread's own figure
    assert spun["cpu_s"] >= own["cpu_s"] - 0.05, (spun, own)
    assert own["wait_s"] - 0.01 <= spun["task_wait_s"] <= spun["seconds"], (spun, own)
    assert rows[idle]["cpu_s"] < 0.5 * spun["cpu_s"], rows  # the other process idled
    assert rows[idle]["task_wait_s"] >= 0


class SlowCounters(worker_io.StorageRequests):
    """The plugin, on a worker whose event loop is held for a while at every reading."""

    def counters(self, cpu: bool = True):
        time.sleep(20)
        return super().counters(cpu)


def test_io_counters_gives_up_after_its_timeout():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.register_plugin(SlowCounters(), name=worker_io.PLUGIN_NAME)
        with pytest.raises(TimeoutError):
            io_client.io_counters(client, timeout=1.0)
        with pytest.raises(InvalidInput, match="timeout"):
            io_client.io_counters(client, timeout=0)


def load_rasterio() -> str:
    import rasterio

    return rasterio.__gdal_version__


def attach_attempts(dask_worker) -> int:
    return dask_worker.plugins[worker_io.PLUGIN_NAME].attach_attempts


def test_a_gdal_without_network_statistics_is_tried_once_per_process():
    """A real library without ``VSINetworkStatsGetAsSerializedJSON`` (the C library: what
    the plugin finds in a GDAL older than 3.2) given as the plugin's GDAL: one attempt, its
    reason kept, no error per task end."""
    no_stats = ctypes.util.find_library("c")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.run(load_rasterio)
        client.register_plugin(worker_io.StorageRequests(gdal_library=no_stats),
                               name=worker_io.PLUGIN_NAME)
        da.ones((100, 100), chunks=10).map_blocks(lambda b: b + 1).sum().compute()
        readings = io_client.io_counters(client)
        attempts = client.run(attach_attempts)
    worker = next(w for w in readings if w != io_client.FLOW_PROCESS)
    assert readings[worker]["gdal"] is None
    assert "network statistics unavailable" in readings[worker]["gdal_error"]
    assert readings[worker]["errors"] == 1, readings[worker]
    assert attempts == {worker: 1}


def test_the_run_stores_own_s3fs_calls_are_not_counted():
    import s3fs

    from prefect_dask_profiling.store.s3 import make_s3fs

    with moto_server() as endpoint:
        boto_client(endpoint).create_bucket(Bucket="own")
        counter = worker_io.StorageRequests()
        counter.attach()
        try:
            store_fs = make_s3fs(s3_options(endpoint), 10.0)
            store_fs.pipe_file("own/a", b"x")
            assert store_fs.cat_file("own/a") == b"x"
            assert counter.counters(cpu=False)["s3fs"].get("GET", 0) == 0
            user = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options(endpoint))
            assert user.cat_file("own/a") == b"x"
            assert counter.counters(cpu=False)["s3fs"]["GET"] == 1
        finally:
            counter._unpatch_s3fs()


# -- pure parts ----------------------------------------------------------------------------------


def reading(pid: int, gdal_get: int, sources: dict, readers: list, process: str = "worker"):
    return {"pid": pid, "instance": str(pid), "time": 0.0, "process": process,
            "gdal": {"GET": gdal_get, "bytes": 10 * gdal_get}, "s3fs": None,
            "chunks": 0, "decoded_bytes": 0, "sources": sources, "readers": readers,
            "errors": 0}


def test_chunks_are_the_source_chunks_of_prefixes_any_process_found_reading():
    before = {"a": reading(1, 0, {}, []), "b": reading(2, 0, {}, [])}
    # "a" found getitem reading; "b"'s first checks were cache hits: its chunks count too
    after = {"a": reading(1, 30, {"getitem": [10, 1000], "random": [4, 400]}, ["getitem"]),
             "b": reading(2, 20, {"getitem": [6, 600]}, [])}
    rows = {r["worker"]: r for r in io_client.stage_deltas("read", before, after)}
    assert (rows["a"]["chunks"], rows["a"]["decoded_bytes"]) == (10, 1000)
    assert (rows["b"]["chunks"], rows["b"]["decoded_bytes"]) == (6, 600)
    assert stage_io_metrics(io_frame(list(rows.values()))).loc[
        "read", "requests_per_chunk"] == 50 / 16


def test_workers_in_one_process_and_the_flow_process_are_counted_once_each():
    shared = reading(7, 12, {"getitem": [3, 30]}, ["getitem"])
    after = {"tcp://w1": shared, "tcp://w2": {**shared, "instance": "other",
                                              "sources": {"getitem": [1, 10]}},
             io_client.FLOW_PROCESS: reading(9, 4, {}, [], process="flow")}
    rows = io_client.stage_deltas("read", {}, after)
    assert [r.get("gdal_get") for r in rows] == [12, None, 4], "one process, counted once"
    assert [r["process"] for r in rows] == ["worker", "worker", "flow"]
    io = stage_io_summaries(io_frame(rows))["read"]
    assert io["requests"] == 16 and io["chunks"] == 4 and io["requests_per_chunk"] == 4.0
    assert io["workers"] == {"requests": 12, "get": 12, "head": 0, "list": 0, "bytes": 120}
    assert io["flow_process"] == {"requests": 4, "get": 4, "head": 0, "list": 0, "bytes": 40}
    assert "of which 4 in the flow process" in io_text(io)
    older = stage_io_summaries(io_frame([{k: v for k, v in r.items() if k != "process"}
                                         for r in rows[:2]]))["read"]
    assert "workers" not in older and older["requests"] == 12, "an older table: no split"




def test_cpu_deltas_only_between_readings_of_one_process():
    def reading(pid, cpu, waits, at):
        return {"pid": pid, "instance": f"{pid}", "time": at, "gdal": None, "s3fs": None,
                "chunks": 0, "decoded_bytes": 0, "errors": 0, "cpu_s": cpu,
                "task_waits": waits}

    # thread 7 ran tasks throughout; 8 started during the stage; 6 left the pool (seceded)
    before = {"a": reading(1, 10.0, {6: 5.0, 7: 2.0}, 100.0), "b": reading(2, 10.0, None, 100.0),
              "d": reading(4, 1.0, {}, 100.0)}
    after = {"a": reading(1, 12.5, {7: 2.5, 8: 0.25}, 103.0), "b": reading(2, 11.0, None, 103.0),
             "c": reading(3, 40.0, {9: 1.0}, 103.0), "d": reading(4, 1.5, {}, 103.0)}
    rows = {r["worker"]: r for r in io_client.stage_deltas("s", before, after)}
    assert rows["a"]["cpu_s"] == pytest.approx(2.5) and rows["a"]["seconds"] == 3.0
    assert rows["a"]["task_wait_s"] == pytest.approx(0.75)  # 0.5 + a new thread's 0.25
    assert rows["b"]["cpu_s"] == 1.0 and "task_wait_s" not in rows["b"]  # no schedstat
    assert "cpu_s" not in rows["c"]  # joined: its CPU since start is not this stage's
    assert rows["d"]["task_wait_s"] == 0  # no task ran there: no task thread waited
    old = {k: v for k, v in before["a"].items() if k not in ("cpu_s", "task_waits")}
    assert io_client.cpu_delta(old, after["a"]) == {}  # an older plugin's reading


def test_gdal_counts_split_listings_from_gets():
    text = ('{"methods": {"GET": {"count": 5, "downloaded_bytes": 100}, "HEAD": {"count": 2}},'
            ' "handlers": {"vsis3": {"actions": {"ReadDir": {"methods": {"GET": {"count": 2,'
            ' "downloaded_bytes": 10}}}}}}}')
    assert worker_io.gdal_counts(text) == {"GET": 3, "LIST": 2, "HEAD": 2, "bytes": 100}
    assert worker_io.gdal_counts("") == {}


def test_stage_deltas_count_a_restarted_worker_from_zero():
    def reading(pid, get):
        return {"pid": pid, "time": 0.0, "gdal": {"GET": get, "bytes": 10 * get},
                "s3fs": None, "chunks": get, "decoded_bytes": 100 * get, "errors": 0}

    before = {"a": reading(1, 5), "b": reading(2, 5)}
    after = {"a": reading(1, 8), "b": reading(3, 2), "c": reading(4, 1)}
    rows = {r["worker"]: r for r in io_client.stage_deltas("read", before, after)}
    assert rows["a"]["gdal_get"] == 3 and rows["a"]["gdal_bytes"] == 30
    assert rows["b"]["gdal_get"] == 2, "another process: counted from zero"
    assert rows["c"]["chunks"] == 1, "joined during the stage"
    assert "s3fs_get" not in rows["a"], "s3fs never loaded: absent, not zero"
    metrics = stage_io_metrics(io_frame(list(rows.values())))
    assert metrics.loc["read", "requests"] == 6
    assert metrics.loc["read", "requests_per_chunk"] == 1.0
    assert metrics.loc["read", "read_amplification"] == pytest.approx(0.1)


def test_a_stage_on_workers_without_gdal_has_no_gdal_metrics_beside_one_with():
    rows = [{"stage": "read", "worker": "a", "chunks": 4, "decoded_bytes": 400, "gdal_get": 8,
             "gdal_head": 1, "gdal_list": 0, "gdal_bytes": 80},
            {"stage": "reduce", "worker": "b", "chunks": 0, "decoded_bytes": 0}]
    metrics = stage_io_metrics(io_frame(rows))
    assert metrics.loc["read", "requests"] == 9 and metrics.loc["read", "chunks"] == 4
    assert metrics.loc["reduce", ["requests", "get", "chunks", "bytes"]].isna().all()
    assert stage_io_summary(io_frame(rows), "reduce") is None  # absent, never zero


def test_effective_options_never_record_secret_values():
    options = worker_io.effective_options(
        {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_ACCESS_KEY_ID": "AKIA", "HOME": "/root",
         "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES", "AWS_SESSION_TOKEN": "t"},
        {"GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "NO", "CPL_DEBUG": "OFF"})
    assert options == {"AWS_ACCESS_KEY_ID": "<set>", "AWS_SECRET_ACCESS_KEY": "<set>",
                       "AWS_SESSION_TOKEN": "<set>", "CPL_DEBUG": "OFF",
                       "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "NO"}


def test_io_frame_of_nothing_is_empty_with_base_columns():
    frame = io_frame([])
    assert frame.empty and list(frame.columns) == ["stage", "worker", "chunks", "decoded_bytes"]
    assert stage_io_metrics(frame).empty
    assert isinstance(stage_io_metrics(frame), pd.DataFrame)



@pytest.mark.parametrize("chunk, aligned", [(128, True), (96, False)])
def test_chunks_are_compared_with_the_cogs_blocks(archive, chunk, aligned):
    client = archive["client"]
    scenes.configure_workers(client, scenes.gdal_options(
        {"endpoint_url": archive["proxy"].endpoint}))
    before = io_client.io_counters(client)
    ds = client.submit(scenes.open_scenes, archive["found"], chunk, pure=False).result()
    wait(ds.persist())
    found = io_client.check_alignment(client, before, io_client.io_counters(client))
    assert found["block"] == [SPEC.tile, SPEC.tile]
    assert found["chunk"] == [chunk, chunk]
    assert found["aligned"] is aligned
    if not aligned:
        assert "chunks={'y': 128, 'x': 128}" in found["fix"]


def test_chunks_against_blocks_judges_the_usual_chunk_not_the_edges():
    found = io_client.chunks_against_blocks({"512x512": 12, "100x512": 3},
                                             {"/vsis3/b/a.tif": [256, 256]})
    assert found["aligned"] and found["fix"] is None
    found = io_client.chunks_against_blocks({"600x600": 4}, {"a": [256, 256], "b": [256, 256]})
    assert not found["aligned"] and "'y': 512" in found["fix"]
    assert io_client.chunks_against_blocks({}, {"a": [1, 1]}) is None


def test_a_gdal_option_change_ranks_first_in_the_explanation():
    from prefect_dask_profiling.regression.explain import explain_stage

    def manifest(merge: str, gdal: str = "3.10.3") -> dict:
        return {"version": "1", "workers": 2, "threads": 2,
                "stages": [{"name": "read", "tasks": 50}],
                "environment": {"python": "3.11.7", "dask": "2026.8.0", "raster": {
                    "gdal": gdal, "rasterio": "1.4.4", "libcurl": "libcurl/8.14.1",
                    "options": {"GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": merge,
                                "AWS_SECRET_ACCESS_KEY": "<set>"}}}}

    tonight = manifest("NO")
    tonight["environment"]["dask"] = "2026.9.0"
    why = explain_stage("read", tonight, [manifest("YES") for _ in range(3)])
    first = why["context"][0]
    assert (first["what"], first["was"], first["now"]) == (
        "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES", "YES", "NO")
    assert "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES YES → NO" in why["text"]
    upgrade = explain_stage("read", manifest("YES", gdal="3.11.0"),
                            [manifest("YES") for _ in range(3)])
    assert upgrade["context"][0]["what"] == "gdal (workers)"


def test_io_text_reads_like_the_tables():
    io = {"requests": 56, "get": 56, "bytes": 1_054_468, "chunks": 48,
          "requests_per_chunk": 1.17, "read_amplification": 0.33}
    assert io_client and "56 requests (GET 56), 1.2 per chunk, 1.05 MB" in io_text(io)
    assert io_text(None) == "" and io_text({"chunks": 0}) == ""
    assert io_text({"requests": 0, "chunks": 4, "bytes": 0}) == "", "no request, no line"
    assert io_text({"requests": 0, "s3fs_requests": 29}) == "s3fs 29 requests"
