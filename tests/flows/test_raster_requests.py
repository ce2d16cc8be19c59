"""Every storage request of a stage is counted, in the flow process as on the workers.

A real Prefect flow on ``ProfiledDaskTaskRunner`` (real Prefect server, a 2 x 2 LocalCluster
of worker processes) opens real COGs (rio-cogeo, on moto's S3 server) with rioxarray **in
the flow body** inside ``with stage("read")`` (GDAL reads each file's header in the flow
process), searches the static STAC catalogue there through s3fs, and reads every chunk on
the workers. A logging proxy in front of moto sees every request; GDAL tags its requests
with the pid of the process that made them (``GDAL_HTTP_HEADERS``), s3fs's carry no tag.
The stored figures must equal what the proxy saw in the stage: in total, and apart for the
flow process and the workers.
"""

from __future__ import annotations

import os

import pytest
import xarray as xr
from distributed import wait
from helpers.s3_servers import LoggingProxy, boto_client, moto_server, s3_options, tag_process
from prefect import flow
from prefect.context import FlowRunContext

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.store.runs import RunStore
from prefect_dask_profiling.summary.io import stage_io_metrics
from tasks import scenes
from tasks.synthetic import CubeSpec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

SPEC = CubeSpec(dates=2, size=256, tile=64)
BUCKET = "opened"
CHUNK = 64
READ_CHUNKS = SPEC.dates * 2 * (SPEC.size // CHUNK) ** 2
PIPELINE = "open-in-flow"
CLUSTER = {"n_workers": 2, "threads_per_worker": 2, "processes": True,
           "dashboard_address": ":0"}
# one GDAL statistic per HTTP request (PARALLEL counts a batch of ranges as one GET)
SERIAL = {"GDAL_HTTP_MULTIRANGE": "SERIAL"}


@pytest.fixture(scope="module")
def served():
    """The scenes on moto behind a logging proxy; this process's GDAL pointed at the proxy."""
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "GDAL_HTTP_HEADERS")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    try:
        with moto_server() as endpoint, LoggingProxy(endpoint) as proxy:
            boto_client(endpoint).create_bucket(Bucket=BUCKET)
            catalog = scenes.write_scenes(SPEC, f"s3://{BUCKET}/data", s3_options(endpoint))
            options = {**scenes.gdal_options({"endpoint_url": proxy.endpoint}), **SERIAL}
            set_here = scenes.set_gdal_environment(options)
            try:
                yield {"proxy": proxy, "catalog": catalog, "options": options}
            finally:
                for name in [*set_here, "NDVI_GDAL_OPTIONS_SET"]:
                    os.environ.pop(name, None)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


PROXY: dict[str, LoggingProxy] = {}  # the module's proxy, for the flow (pickled by name)


@profiled
def opened(catalog: str, options: dict, store: str | None = None) -> dict:
    """Search and open in the flow body, read on the workers, in stage "read"."""
    proxy, seen = PROXY["proxy"], {}
    client = FlowRunContext.get().task_runner.client  # the runner's: flow body work
    scenes.configure_workers(client, options)
    seen["worker_pids"] = sorted(set(client.run(tag_process).values()))
    seen["flow_pid"] = tag_process()
    seen["start"] = proxy.mark()
    with stage("read"):
        found = scenes.search(catalog, SPEC.dates, s3_options(proxy.endpoint))
        bands = [scenes.open_band(s.hrefs[name], CHUNK) for s in found
                 for name in ("red", "nir")]  # headers read here, in the flow process
        data = client.persist([band.data for band in bands])
        with client.as_current():
            wait(data)
        seen["end"] = proxy.mark()  # before the stage's closing reading
    with stage("reduce"):
        seen["total"] = float(client.compute(xr.concat(bands, "file").sum()).result())
    return seen


def open_in_flow_body(served, store: str):
    """Run :func:`opened` on the profiled runner; the proxy's requests in its read stage."""
    proxy = PROXY["proxy"] = served["proxy"]
    run = flow(name=PIPELINE, task_runner=ProfiledDaskTaskRunner(
        cluster_kwargs=CLUSTER, store=store, pipeline=PIPELINE, stage_reports=False,
        on_regression="warn"))(opened)
    state = run(served["catalog"], served["options"], store=store, return_state=True)
    assert state.is_completed(), state.message
    seen = state.result()
    requests = proxy.since(seen["start"])[:seen["end"] - seen["start"]]
    return requests, seen


def test_the_stored_requests_of_a_stage_equal_what_the_store_saw(served, tmp_path):
    requests, seen = open_in_flow_body(served, str(tmp_path))
    store = RunStore(str(tmp_path))
    run_id = store.list_runs(PIPELINE)[0]["run_id"]
    io = {s["name"]: s for s in store.read_manifest(PIPELINE, run_id)["stages"]}["read"]["io"]

    def gdal(pids: set[str]) -> int:
        return sum(q.pid in pids and q.kind in ("GET", "HEAD", "LIST") for q in requests)

    flow_seen, workers_seen = gdal({seen["flow_pid"]}), gdal(set(seen["worker_pids"]))
    print(f"read stage: proxy saw {len(requests)} requests (GDAL flow process {flow_seen}, "
          f"GDAL workers {workers_seen}, s3fs {sum(q.pid is None for q in requests)}); "
          f"stored {io}")  # the figures docs/raster-io.md quotes (pytest -s)
    assert flow_seen > 0, "rioxarray read the headers in the flow process"
    assert workers_seen > 0
    assert io["flow_process"]["requests"] == flow_seen, (io, flow_seen)
    assert io["workers"]["requests"] == workers_seen, (io, workers_seen)
    assert io["requests"] == flow_seen + workers_seen
    for method in ("get", "head"):
        assert io.get(method, 0) == sum(q.pid is not None and q.kind == method.upper()
                                        for q in requests), (method, io)
    untagged = [q for q in requests if q.pid is None]  # s3fs: the catalogue and its items
    assert untagged and io["s3fs_requests"] == len(untagged), (io, len(untagged))
    assert io["flow_process"]["s3fs_requests"] == len(untagged)
    assert io["chunks"] == READ_CHUNKS
    assert io["requests_per_chunk"] == pytest.approx(io["requests"] / READ_CHUNKS, abs=1e-3)
    table = store.read_table(PIPELINE, run_id, "io")
    assert set(table[table["stage"] == "read"]["process"]) == {"flow", "worker"}
    assert stage_io_metrics(table).loc["read", "requests"] == io["requests"]
