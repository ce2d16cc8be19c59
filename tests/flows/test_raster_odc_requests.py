"""odc-stac's storage requests: the stored count of a stage against a logging proxy's.

A real Prefect flow on ``ProfiledDaskTaskRunner`` (real Prefect server, the 2 x 2 LocalCluster
of worker processes of ``test_raster_requests``) searches the static STAC catalogue in the
flow body (s3fs), and **odc-stac** loads the COGs of its items (rio-cogeo, on moto's S3
server behind ``LoggingProxy``) in chunks of 2 x 2 of the files' 64 px tiles, so that every
chunk is a multi-range GDAL read (``VSICurlHandle::ReadMultiRange``) on a worker.

Nights: healthy (GDAL's default, ``GDAL_HTTP_MULTIRANGE=PARALLEL``: GDAL's statistics log
each chunk's batch of two parallel range requests as one GET, and ``ParallelRanges`` counts
the second from GDAL's debug lines), ``SERIAL`` (one statistic per HTTP request) and
injected (``tasks.scenes.MERGE_OFF``: merging off, every multi-range read one whole-object
GET). On every night the stored count must equal the proxy's (±1 %), unflagged.
"""

from __future__ import annotations

import os

import pytest
from distributed import wait
from helpers.s3_servers import LoggingProxy, boto_client, moto_server, s3_options, tag_process
from prefect import flow
from prefect.context import FlowRunContext
from test_raster_requests import CLUSTER

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.store.runs import RunStore
from tasks import scenes
from tasks.synthetic import CubeSpec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

SPEC = CubeSpec(dates=2, size=512, tile=64)
BUCKET = "odc"
CHUNK = 2 * SPEC.tile  # each chunk spans 2 x 2 tiles: two ranges per multi-range read
PIPELINE = "odc-stac-requests"
NIGHTS = {"healthy": {}, "serial": {"GDAL_HTTP_MULTIRANGE": "SERIAL"},
          "injected": scenes.MERGE_OFF}
PROXY: dict[str, LoggingProxy] = {}  # the module's proxy, for the flow


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
            options = scenes.gdal_options({"endpoint_url": proxy.endpoint})
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


def stac_items(found: list[scenes.Scene]) -> list:
    """pystac Items of the scenes, with their ``proj`` grid (odc-stac reads no header)."""
    import pystac
    from pystac.extensions.projection import ProjectionExtension

    transform = [scenes.PIXEL_M, 0.0, scenes.ORIGIN[0], 0.0, -scenes.PIXEL_M, scenes.ORIGIN[1]]
    items = []
    for scene in found:
        item = pystac.Item(id=scene.id, geometry=None, bbox=None,
                           datetime=scene.time.to_pydatetime(), properties={})
        for band, href in scene.hrefs.items():
            item.add_asset(band, pystac.Asset(href=href, media_type=pystac.MediaType.COG))
        ProjectionExtension.ext(item, add_if_missing=True).apply(
            epsg=scenes.EPSG, shape=[SPEC.size, SPEC.size], transform=transform)
        items.append(item)
    return items


@profiled
def odc_loaded(catalog: str, options: dict, store: str | None = None) -> dict:
    """Search in the flow body, load with odc-stac on the workers, in stage "read"."""
    import odc.stac

    proxy, seen = PROXY["proxy"], {}
    client = FlowRunContext.get().task_runner.client
    scenes.configure_workers(client, options)
    seen["worker_pids"] = sorted(set(client.run(tag_process).values()))
    seen["flow_pid"] = tag_process()
    seen["start"] = proxy.mark()
    with stage("read"):
        found = scenes.search(catalog, SPEC.dates, s3_options(proxy.endpoint))
        loaded = odc.stac.load(stac_items(found), bands=["red", "nir"],
                               chunks={"x": CHUNK, "y": CHUNK})
        data = client.persist([loaded.red.data, loaded.nir.data])
        with client.as_current():
            wait(data)
        seen["end"] = proxy.mark()  # before the stage's closing reading
    return seen


def run_night(served, night: str, store: str) -> tuple[dict, list, str]:
    """Run :func:`odc_loaded` with the night's GDAL options: its read stage's stored figures
    (with the workers' options), the proxy's requests in the stage and the flow's pid."""
    proxy = PROXY["proxy"] = served["proxy"]
    run = flow(name=PIPELINE, task_runner=ProfiledDaskTaskRunner(
        cluster_kwargs=CLUSTER, store=store, pipeline=PIPELINE, stage_reports=False,
        on_regression="warn"))(odc_loaded)
    options = {**served["options"], **NIGHTS[night]}
    state = run(served["catalog"], options, store=store, return_state=True)
    assert state.is_completed(), state.message
    seen = state.result()
    requests = proxy.since(seen["start"])[:seen["end"] - seen["start"]]
    runs = RunStore(store)
    manifest = runs.read_manifest(PIPELINE, runs.list_runs(PIPELINE)[0]["run_id"])
    read = {s["name"]: s for s in manifest["stages"]}["read"]
    raster = manifest["environment"]["raster"]
    io = {**read["io"], "options": raster["options"], "ranges_counted": raster["ranges_counted"]}
    return io, requests, seen["flow_pid"]


@pytest.mark.parametrize("night", sorted(NIGHTS))
def test_odc_stac_requests_stored_equal_the_proxys(served, night, tmp_path):
    io, requests, flow_pid = run_night(served, night, str(tmp_path))
    gdal = [q for q in requests if q.pid is not None]
    s3fs = [q for q in requests if q.pid is None]
    in_flow = sum(q.pid == flow_pid for q in gdal)
    stored_flow = (io.get("flow_process") or {}).get("requests", 0)
    print(f"{night}: proxy saw {len(gdal)} GDAL requests "
          f"(GET {sum(q.kind == 'GET' for q in gdal)}, flow process {in_flow}), s3fs "
          f"{len(s3fs)}; stored {io.get('requests')} (GET {io.get('get')}, flow process "
          f"{stored_flow}), s3fs {io.get('s3fs_requests')}; "
          f"GDAL_HTTP_MULTIRANGE={io['options'].get('GDAL_HTTP_MULTIRANGE')}")  # docs' figures
    assert stored_flow == in_flow, "odc-stac reads no header in the flow body (proj metadata)"
    assert gdal and all(q.pid != "" for q in gdal)
    assert io["s3fs_requests"] == len(s3fs) > 0
    assert io["chunks"] == 2 * SPEC.dates * (SPEC.size // CHUNK) ** 2
    if night == "healthy":
        assert io["options"]["GDAL_HTTP_MULTIRANGE"] == "PARALLEL", "GDAL's default recorded"
    assert "CPL_DEBUG" not in io["options"], "the counter's own setting is not the night's"
    assert io["ranges_counted"] is True
    assert "requests_lower_bound" not in io
    assert io["requests"] == pytest.approx(len(gdal), rel=0.01), (io, len(gdal))
    assert io["get"] == pytest.approx(sum(q.kind == "GET" for q in gdal), rel=0.01)
