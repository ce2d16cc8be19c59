"""The scene archive: Sentinel-2-like Cloud-Optimized GeoTIFFs and a static STAC catalog.

The data step (:func:`write_scenes`) writes one COG per scene and band (``red``, ``nir``;
uint16 reflectance x 10000, 0 = cloud / no data, internally tiled, deflate, with overviews)
with rasterio and rio-cogeo, and a self-contained static STAC catalog (pystac; ``proj`` and
``raster`` extensions) next to them, to a local folder or an ``s3://`` prefix.

The flow then does what a user's nightly job does: :func:`search` the catalog (read through
fsspec) for the latest scenes, and :func:`open_scenes` loads them **through GDAL** with
rioxarray: every Dask chunk is one GDAL window read over HTTP range requests (``/vsis3/``).
rioxarray rather than odc-stac: its Dask chunks map one to one onto windows of the source
file (no reprojection or regridding path), so the chunks-against-blocks comparison and the
"misaligned chunks" variant are exactly what GDAL is asked for; odc-stac would be the choice
for mixed grids.

GDAL options reach the workers as process environment (:func:`configure_workers`): that is
where a deployment sets them, and where the run's environment fingerprint reads them back.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import xarray as xr

from tasks.synthetic import BANDS, CubeSpec, _days, acquisition_dates, scene_tile

SCALE = 10_000  # reflectance x SCALE as uint16; 0 is no data (clouds)
EPSG = 32633
PIXEL_M = 10.0
ORIGIN = (500_000.0, 6_000_000.0)
COMPLETE_MARKER = "complete.txt"
# variants of the GDAL settings a night runs with (what the workers' environment holds)
MERGE_OFF = {"GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "NO", "GDAL_HTTP_MULTIRANGE": "SINGLE_GET"}
_OURS = "NDVI_GDAL_OPTIONS_SET"  # names this module set in a worker's environment


@dataclass(frozen=True)
class Scene:
    """One catalogue item: its date and a GDAL path per band."""

    id: str
    time: pd.Timestamp
    hrefs: dict[str, str]


# -- where things are ---------------------------------------------------------------------------


def archive_url(data_url: str, spec: CubeSpec) -> str:
    """The folder of the catalogue ``spec`` under ``data_url``."""
    return f"{data_url.rstrip('/')}/scenes/{spec.token}"


def is_remote(url: str) -> bool:
    return fsspec.utils.get_protocol(url) not in ("file", "local")


def gdal_path(url: str) -> str:
    """The path GDAL opens for ``url``: ``/vsis3/bucket/key`` for ``s3://``, else local."""
    if url.startswith("s3://"):
        return "/vsis3/" + url.removeprefix("s3://")
    if is_remote(url):
        raise ValueError(f"scenes must be local or on s3://, got {url!r}")
    return os.path.abspath(url.removeprefix("file://"))


def gdal_options(storage_options: dict | None = None, merge_off: bool = False) -> dict[str, str]:
    """GDAL configuration for reading the archive (endpoint of an S3-compatible server).

    ``storage_options`` are the fsspec ones of the data URL; its ``endpoint_url`` (or
    ``client_kwargs.endpoint_url``) becomes ``AWS_S3_ENDPOINT`` with path-style addressing.
    Credentials stay in the environment. ``merge_off`` is the regression of the nightly
    flow's ``slower-tasks`` read variant: range merging off and multi-range reads sent as
    one request, which a store without multi-range support answers with whole objects.
    """
    options = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
               "CPL_VSIL_CURL_ALLOWED_EXTENSIONS": ".tif"}
    storage_options = storage_options or {}
    endpoint = storage_options.get("endpoint_url") or (
        storage_options.get("client_kwargs") or {}).get("endpoint_url")
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        options.update({"AWS_S3_ENDPOINT": host.rstrip("/"),
                        "AWS_HTTPS": "NO" if scheme == "http" else "YES",
                        "AWS_VIRTUAL_HOSTING": "FALSE"})
    if merge_off:
        options.update(MERGE_OFF)
    return options


def set_gdal_environment(options: dict[str, str]) -> list[str]:
    """Make ``options`` this process's GDAL environment (run on every worker).

    Names this function set before and ``options`` no longer has are removed, so a
    long-lived worker does not keep the settings of an earlier night. GDAL's cache of
    remote file contents is cleared: each night reads scenes it has not seen. Returns the
    names set.
    """
    for name in filter(None, os.environ.get(_OURS, "").split(",")):
        if name not in options:
            os.environ.pop(name, None)
    os.environ.update(options)
    os.environ[_OURS] = ",".join(sorted(options))
    clear_gdal_cache()
    return sorted(options)


def clear_gdal_cache() -> None:
    """Forget GDAL's cached remote file properties and ranges (when GDAL is loaded)."""
    from prefect_dask_profiling.timing.worker_io import loaded_gdal_path

    path = loaded_gdal_path()
    if path is not None:
        import ctypes

        ctypes.CDLL(path).VSICurlClearCache()


def configure_workers(client: Any, options: dict[str, str]) -> None:
    """:func:`set_gdal_environment` on every worker of ``client``'s cluster."""
    client.run(set_gdal_environment, options)


# -- the data step ------------------------------------------------------------------------------


def _fs(url: str, storage_options: dict | None):
    if not is_remote(url) and storage_options:
        raise ValueError("storage_options are only for remote data URLs (e.g. s3://...)")
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs, path


def scenes_exist(data_url: str, spec: CubeSpec, storage_options: dict | None = None) -> bool:
    """True if a complete archive of ``spec`` is stored under ``data_url``."""
    fs, path = _fs(archive_url(data_url, spec), storage_options)
    try:
        return fs.exists(f"{path}/{COMPLETE_MARKER}")
    except (FileNotFoundError, PermissionError):
        return False


def write_cog(path: str, band: np.ndarray, spec: CubeSpec) -> None:
    """One band of one scene as a COG: ``spec.tile`` px tiles, deflate, with overviews."""
    import rasterio
    from rasterio.transform import from_origin
    from rio_cogeo.cogeo import cog_translate
    from rio_cogeo.profiles import cog_profiles

    profile = {"driver": "GTiff", "width": spec.size, "height": spec.size, "count": 1,
               "dtype": "uint16", "nodata": 0, "crs": f"EPSG:{EPSG}",
               "transform": from_origin(*ORIGIN, PIXEL_M, PIXEL_M)}
    cog = cog_profiles.get("deflate")
    cog.update(blockxsize=spec.tile, blockysize=spec.tile)
    with rasterio.MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(band, 1)
        cog_translate(memory, path, cog, overview_level=2, overview_resampling="average",
                      quiet=True, in_memory=True)


def _scene_bands(spec: CubeSpec, day: int) -> dict[str, np.ndarray]:
    """The scene of ``day`` as uint16 bands, tile by tile as :func:`synthetic_cube` makes it."""
    reflectance = np.empty((len(BANDS), spec.size, spec.size), dtype="float32")
    for y0 in range(0, spec.size, spec.tile):
        for x0 in range(0, spec.size, spec.tile):
            ny, nx = min(spec.tile, spec.size - y0), min(spec.tile, spec.size - x0)
            reflectance[:, y0:y0 + ny, x0:x0 + nx] = scene_tile(spec, day, y0, x0, ny, nx)
    scaled = np.clip(np.nan_to_num(reflectance * SCALE, nan=0.0), 0, 65535)
    scaled = np.where(np.isnan(reflectance), 0, np.maximum(scaled, 1)).astype("uint16")
    return dict(zip(BANDS, scaled, strict=True))


def write_scenes(spec: CubeSpec, data_url: str, storage_options: dict | None = None) -> str:
    """Write the catalogue ``spec``: COGs per scene and band plus a static STAC catalog.

    Written in a local temporary folder, then uploaded; the ``complete.txt`` marker last,
    so a half-written archive is written again. Returns the catalog's URL.
    """
    import pystac
    from pystac.extensions.projection import ProjectionExtension

    target = archive_url(data_url, spec)
    fs, path = _fs(target, storage_options)
    transform = [PIXEL_M, 0.0, ORIGIN[0], 0.0, -PIXEL_M, ORIGIN[1]]
    with tempfile.TemporaryDirectory(prefix="ndvi-scenes-") as tmp:
        catalog = pystac.Catalog(id=f"ndvi-{spec.token}", description=(
            "Synthetic Sentinel-2-like scenes (red, nir) for the nightly NDVI flow"))
        for date, day in zip(acquisition_dates(spec.dates), _days(acquisition_dates(
                spec.dates)), strict=True):
            item_id = f"S2X_{date:%Y%m%d}"
            os.makedirs(os.path.join(tmp, item_id), exist_ok=True)
            item = pystac.Item(id=item_id, geometry=None, bbox=None,
                               datetime=datetime(date.year, date.month, date.day, tzinfo=UTC),
                               properties={})
            for name, band in _scene_bands(spec, day).items():
                write_cog(os.path.join(tmp, item_id, f"{name}.tif"), band, spec)
                item.add_asset(name, pystac.Asset(
                    href=f"./{name}.tif", media_type=pystac.MediaType.COG, roles=["data"],
                    extra_fields={"raster:bands": [{"nodata": 0, "data_type": "uint16",
                                                    "scale": 1 / SCALE}]}))
            projection = ProjectionExtension.ext(item, add_if_missing=True)
            projection.apply(epsg=EPSG, shape=[spec.size, spec.size], transform=transform)
            catalog.add_item(item)
        catalog.normalize_hrefs(tmp)
        catalog.make_all_asset_hrefs_relative()
        catalog.save(catalog_type=pystac.CatalogType.SELF_CONTAINED)
        if is_remote(target):
            fs.put(tmp.rstrip("/") + "/", path, recursive=True)
        else:
            fs.makedirs(path, exist_ok=True)
            fs.put(tmp.rstrip("/") + "/", path, recursive=True)
    fs.pipe_file(f"{path}/{COMPLETE_MARKER}", b"complete\n")
    return f"{target}/catalog.json"


# -- the flow's operations ------------------------------------------------------------------------


def search(catalog_url: str, window: int, storage_options: dict | None = None) -> list[Scene]:
    """The ``window`` latest scenes of the static catalog, oldest first (read via fsspec)."""
    import json

    fs, path = _fs(catalog_url, storage_options)
    root = path.rsplit("/", 1)[0]
    catalog = json.loads(fs.cat_file(path))
    links = [link["href"] for link in catalog.get("links", []) if link.get("rel") == "item"]
    if not links:
        raise ValueError(f"the catalog {catalog_url} lists no items")
    base = catalog_url.rsplit("/", 1)[0]
    scenes = []
    for href in links:
        rel = href.removeprefix("./")
        item = json.loads(fs.cat_file(f"{root}/{rel}"))
        folder = rel.rsplit("/", 1)[0]
        assets = {band: item["assets"][band]["href"].removeprefix("./") for band in BANDS}
        hrefs = {band: gdal_path(f"{base}/{folder}/{name}") for band, name in assets.items()}
        when = pd.Timestamp(item["properties"]["datetime"]).tz_convert(None)
        scenes.append(Scene(id=item["id"], time=when, hrefs=hrefs))
    scenes.sort(key=lambda s: s.time)
    return scenes[-window:] if window < len(scenes) else scenes


def open_band(href: str, chunk: int) -> xr.DataArray:
    """One band of one scene, lazily, in Dask chunks of ``chunk`` x ``chunk`` pixels.

    Reflectance as float32 with no data (clouds) as NaN.
    """
    import rioxarray

    band = rioxarray.open_rasterio(href, chunks={"band": 1, "y": chunk, "x": chunk},
                                   lock=False, masked=True, cache=False)
    return (band.squeeze("band", drop=True) / np.float32(SCALE)).astype("float32")


def open_scenes(scenes: Sequence[Scene], chunk: int) -> xr.Dataset:
    """The scenes as a lazy ``(time, y, x)`` Dataset of ``red`` and ``nir`` through GDAL.

    Opening reads each file's header (GDAL requests of this process); the pixels are read
    by the Dask tasks, one window of ``chunk`` x ``chunk`` pixels per chunk.
    """
    if not scenes:
        raise ValueError("no scenes to open")
    times = pd.DatetimeIndex([s.time for s in scenes], name="time")
    bands = {name: xr.concat([open_band(s.hrefs[name], chunk) for s in scenes],
                             dim=times, join="override", coords="minimal",
                             compat="override")
             for name in BANDS}
    return xr.Dataset(bands).drop_vars("spatial_ref", errors="ignore")


def block_shapes(href: str) -> list[tuple[int, int]]:
    """The internal block (tile) shape of each band of the file at ``href`` (GDAL)."""
    import rasterio

    with rasterio.open(href) as ds:
        return list(ds.block_shapes)
