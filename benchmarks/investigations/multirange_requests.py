"""GDAL's network statistics against the HTTP requests a logging proxy saw, per multi-range mode.

One process, no Dask cluster: moto's S3 server behind ``tests/s3_servers.LoggingProxy``, two
scenes of 512 px COGs with 64 px tiles (rio-cogeo, :func:`tasks.scenes.write_scenes`), and
GDAL's statistics read through the project's reader (:class:`Gdal`, the ``ctypes`` call of
``VSINetworkStatsGetAsSerializedJSON``). ``rio`` reads 128 px windows of the red band with
rasterio (each window spans 2 x 2 tiles: a ``ReadMultiRange`` of two ranges); ``odc`` loads
both bands with odc-stac in 128 px chunks on Dask's threaded scheduler. Prints, per mode, the
GETs the proxy saw, GDAL's count, its ``ReadMultiRange`` action count, and the GETs the
product stores (a :class:`StorageRequests` counter of the process: GDAL's count plus the
parallel ranges :class:`ParallelRanges` read from GDAL's debug lines).

    .venv/bin/python benchmarks/investigations/multirange_requests.py \
        [--reader rio|odc] [--modes ...]

Under ``PARALLEL`` (GDAL's default) GDAL logs a batch of parallel range requests as one GET,
so its count is below the proxy's; under ``SERIAL`` and ``SINGLE_GET`` the two are equal. The
stored count equals the proxy's in every mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

SIZE, TILE, WINDOW = 512, 64, 128


def read_rio(found: list) -> None:
    """128 px windows of every scene's red band, every other column of windows."""
    import rasterio
    from rasterio.windows import Window

    for scene in found:
        with rasterio.open(scene.hrefs["red"]) as ds:
            for y in range(0, SIZE, WINDOW):
                for x in range(0, SIZE, 2 * WINDOW):
                    ds.read(1, window=Window(x, y, WINDOW, WINDOW))


def read_odc(found: list) -> None:
    """Both bands of every scene with odc-stac, 128 px chunks, two threads."""
    import dask
    import odc.stac
    import pystac
    from pystac.extensions.projection import ProjectionExtension

    from tasks import scenes

    transform = [scenes.PIXEL_M, 0.0, scenes.ORIGIN[0], 0.0, -scenes.PIXEL_M, scenes.ORIGIN[1]]
    items = []
    for scene in found:
        item = pystac.Item(id=scene.id, geometry=None, bbox=None,
                           datetime=scene.time.to_pydatetime(), properties={})
        for band, href in scene.hrefs.items():
            item.add_asset(band, pystac.Asset(href=href, media_type=pystac.MediaType.COG))
        ProjectionExtension.ext(item, add_if_missing=True).apply(
            epsg=scenes.EPSG, shape=[SIZE, SIZE], transform=transform)
        items.append(item)
    loaded = odc.stac.load(items, bands=["red", "nir"], chunks={"x": WINDOW, "y": WINDOW})
    with dask.config.set(scheduler="threads", num_workers=2):
        loaded.load()


def one_mode(mode: str, reader: str) -> dict:
    """Write the scenes, read them under ``mode``; the proxy's and GDAL's counts."""
    from helpers.s3_servers import LoggingProxy, boto_client, moto_server, s3_options, tag_process

    from prefect_dask_profiling.timing.worker_io import (
        Gdal,
        StorageRequests,
        gdal_counts,
        loaded_gdal_path,
    )
    from tasks import scenes
    from tasks.synthetic import CubeSpec

    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    spec = CubeSpec(dates=2, size=SIZE, tile=TILE)
    with moto_server() as endpoint, LoggingProxy(endpoint) as proxy:
        boto_client(endpoint).create_bucket(Bucket="multirange")
        catalog = scenes.write_scenes(spec, "s3://multirange/data", s3_options(endpoint))
        options = {**scenes.gdal_options({"endpoint_url": proxy.endpoint}),
                   "CPL_VSIL_NETWORK_STATS_ENABLED": "YES"}
        if mode != "DEFAULT":
            options["GDAL_HTTP_MULTIRANGE"] = mode
        scenes.set_gdal_environment(options)
        tag_process()
        found = scenes.search(catalog, spec.dates, s3_options(proxy.endpoint))
        import rasterio  # noqa: F401  (loads GDAL before the reader attaches)

        gdal = Gdal(loaded_gdal_path())
        gdal.enable_stats()
        counter = StorageRequests()
        counter.start_counting()  # resets GDAL's statistics too
        start = proxy.mark()
        (read_odc if reader == "odc" else read_rio)(found)
        seen = [q for q in proxy.since(start) if q.pid is not None]
        text = gdal.stats_text()
        stored = (counter.counters(cpu=False).get("gdal") or {}).get("GET", 0)
        counter.teardown(None)
    batches = sum(
        int(((entry.get("actions") or {}).get("ReadMultiRange") or {}).get(
            "methods", {}).get("GET", {}).get("count", 0))
        for handler in (json.loads(text or "{}").get("handlers") or {}).values()
        for entry in (handler.get("files") or {}).values())
    return {"mode": mode, "reader": reader, "proxy_get": sum(q.kind == "GET" for q in seen),
            "gdal_get": gdal_counts(text).get("GET", 0), "read_multi_range_gets": batches,
            "stored_get": stored}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", choices=("rio", "odc"), default="rio")
    parser.add_argument("--modes", nargs="+", default=["DEFAULT", "PARALLEL", "SERIAL",
                                                       "SINGLE_GET"])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # one mode per process: GDAL reads its options once
        print(json.dumps(one_mode(args.one, args.reader)))
        return
    for mode in args.modes:
        out = subprocess.run([sys.executable, __file__, "--reader", args.reader, "--one", mode],
                             capture_output=True, text=True, check=True)
        print(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
