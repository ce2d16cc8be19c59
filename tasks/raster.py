"""The nightly NDVI raster job: search the catalog, read COGs through GDAL, NDVI, median, write.

Each step has a plain function on lazy xarray/Dask objects (testable on any Dask client)
and a Prefect task that runs it on the flow's Dask cluster. A Prefect task running on a Dask
worker computes through the worker's own client (:func:`distributed.worker_client`, which
secedes while it waits, so the worker thread is free for the work it waits on; a plain
``future.result()`` there would deadlock a one-thread worker). Each task *persists* or
*writes* its output, so its stage is the window in which that work really runs, and hands
the persisted data to the next stage as a run-scoped published dataset.

The scenes are Cloud-Optimized GeoTIFFs with a static STAC catalog (:mod:`tasks.scenes`),
read through GDAL (rioxarray) from a local folder or an S3-compatible server (``/vsis3/``).
Injected slowdowns are the regressions these pipelines really meet, never a wrapper:

* ``more-tasks``: the catalogue search returns ``factor`` times as many scenes (its date
  window is only applied after the chosen stage), so that stage reads ``factor`` times as
  many chunks;
* ``slower-tasks``: ``read`` runs with GDAL's range merging off and multi-range reads sent as
  one request, which a store without multi-range support answers with whole objects
  (:data:`tasks.scenes.MERGE_OFF`: more requests per chunk, many more bytes); ``write``
  stores every output chunk as small objects (64 x 64 px at the default factor 3);
* ``misaligned-chunks``: the read stage's Dask chunks are not multiples of the COGs'
  internal tiles, so every chunk reads tiles its neighbours read again (corteva/rioxarray#567).

Outputs (the NDVI series and the median composite) are written as Zarr.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import dask.array as da
import distributed
import fsspec
import numpy as np
import xarray as xr
from prefect import task
from prefect.cache_policies import NO_CACHE
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from tasks import scenes
from tasks.synthetic import CubeSpec

STAGES = ("read", "ndvi", "reduce", "write")
SLOWDOWNS = ("none", "more-tasks", "slower-tasks", "misaligned-chunks")
SLOWER_TASKS_STAGES = ("read", "write")
# slower-tasks in write: output chunks of SMALL_WRITE_BASE / factor pixels (64 px at factor 3)
SMALL_WRITE_BASE = 192
LOCAL_ROUND_TRIP_S = 0.005  # emulated per-request latency on local folders (S3: ~10-30 ms)
CLOUD_BUFFER_PX = 2
DATA_URL_ENV = "NDVI_DATA_URL"
DEFAULT_DATA_URL = "./.ndvi-data"


@dataclass(frozen=True)
class JobSize:
    """How much one nightly run processes: ``dates`` scenes of ``size`` x ``size`` pixels.

    The COGs are tiled ``tile`` x ``tile``; the read's Dask chunks are ``chunk`` x ``chunk``
    pixels of one scene (a multiple of the tile: aligned).
    """

    dates: int
    size: int
    tile: int
    chunk: int
    scenes_per_chunk: int = 4


SIZES = {
    "tiny": JobSize(dates=6, size=512, tile=128, chunk=256),     # tests: seconds of work
    "small": JobSize(dates=12, size=1024, tile=256, chunk=512),  # default: a dozen scenes
    "large": JobSize(dates=24, size=2048, tile=256, chunk=512),  # ~8x small
}


@dataclass(frozen=True)
class Plan:
    """What one run reads and how: validated flow parameters.

    Attributes
    ----------
    catalogue
        The scenes the catalogue search returns (``factor`` times the window on
        ``more-tasks``).
    window
        How many of the latest scenes the composite uses.
    chunk
        Edge in pixels of the read stage's Dask chunks.
    trim_after
        Stage after which the date window is applied; ``None`` when nothing is extra.
    merge_off, write_pixels
        The ``slower-tasks`` variants: GDAL range merging off in the read stage, output
        chunk edge of the write stage (``None``: normal).
    """

    size: str
    catalogue: CubeSpec
    window: int
    chunk: int
    scenes_per_chunk: int = 4
    trim_after: str | None = None
    merge_off: bool = False
    write_pixels: int | None = None
    slowdown: str = "none"
    slowdown_stage: str = "read"
    factor: int = 1


def plan_run(size: str = "small", slowdown: str = "none", slowdown_stage: str = "read",
             slowdown_factor: int = 3) -> Plan:
    """Validate the flow's size and slowdown parameters.

    Raises
    ------
    ValueError
        Naming the bad parameter and the allowed values.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if slowdown not in SLOWDOWNS:
        raise ValueError(f"slowdown must be one of {SLOWDOWNS}, got {slowdown!r}")
    if slowdown_stage not in STAGES:
        raise ValueError(f"slowdown_stage must be one of {STAGES}, got {slowdown_stage!r}")
    if isinstance(slowdown_factor, bool) or not isinstance(slowdown_factor, int) or not (
            2 <= slowdown_factor <= 10):
        raise ValueError(f"slowdown_factor must be a whole number from 2 to 10, "
                         f"got {slowdown_factor!r}")
    job = SIZES[size]
    plan = Plan(size=size, catalogue=CubeSpec(dates=job.dates, size=job.size, tile=job.tile),
                window=job.dates, chunk=job.chunk, scenes_per_chunk=job.scenes_per_chunk,
                slowdown=slowdown, slowdown_stage=slowdown_stage)
    if slowdown == "more-tasks":
        catalogue = replace(plan.catalogue, dates=job.dates * slowdown_factor)
        return replace(plan, catalogue=catalogue, trim_after=slowdown_stage,
                       factor=slowdown_factor)
    if slowdown == "slower-tasks":
        if slowdown_stage not in SLOWER_TASKS_STAGES:
            raise ValueError(f"slowdown 'slower-tasks' applies to slowdown_stage "
                             f"{' or '.join(SLOWER_TASKS_STAGES)}, got {slowdown_stage!r}")
        if slowdown_stage == "read":
            return replace(plan, merge_off=True, factor=slowdown_factor)
        return replace(plan, write_pixels=SMALL_WRITE_BASE // slowdown_factor,
                       factor=slowdown_factor)
    if slowdown == "misaligned-chunks":
        if slowdown_stage != "read":
            raise ValueError(f"slowdown 'misaligned-chunks' applies to slowdown_stage read, "
                             f"got {slowdown_stage!r}")
        return replace(plan, chunk=job.chunk + job.tile // 2, factor=slowdown_factor)
    return plan


# -- storage ---------------------------------------------------------------------------------


def data_url_default(url: str | None = None) -> str:
    """``url``, else env ``NDVI_DATA_URL``, else ``./.ndvi-data``."""
    return url or os.environ.get(DATA_URL_ENV) or DEFAULT_DATA_URL


def _is_local(url: str) -> bool:
    return fsspec.utils.get_protocol(url) in ("file", "local")


def _local_path(url: str) -> str:
    return os.path.abspath(url.removeprefix("file://"))


class SmallRequests(WrapperStore):
    """A store that writes in many small objects, each paying a round trip.

    Every object written waits ``latency_s`` first: the round trip an object store charges.
    On a remote store the round trip is real and ``latency_s`` is 0; on a local folder,
    whose requests cost almost nothing, it is emulated.
    """

    def __init__(self, store: Any, latency_s: float = 0.0) -> None:
        super().__init__(store)
        self.latency_s = latency_s

    def _with_store(self, store: Any) -> SmallRequests:
        return type(self)(store, self.latency_s)

    async def set(self, key, value) -> None:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        await self._store.set(key, value)


def zarr_store(url: str, storage_options: dict | None = None, *, read_only: bool = True,
               small_requests: bool = False):
    """A Zarr store for a local path or any fsspec URL (``s3://...``).

    ``small_requests`` wraps it in :class:`SmallRequests` (with an emulated round trip of
    ``LOCAL_ROUND_TRIP_S`` per object written to a local folder).
    """
    if _is_local(url):
        if storage_options:
            raise ValueError("storage_options are only for remote data URLs (e.g. s3://...)")
        path = _local_path(url)
        if not read_only:
            os.makedirs(path, exist_ok=True)
        store = LocalStore(path, read_only=read_only)
    else:
        store = FsspecStore.from_url(url, storage_options=storage_options or {},
                                     read_only=read_only)
    if not small_requests:
        return store
    return SmallRequests(store, LOCAL_ROUND_TRIP_S if _is_local(url) else 0.0)


def catalog_url(data_url: str, spec: CubeSpec) -> str:
    """Where the static STAC catalog of ``spec`` is stored under ``data_url``."""
    return f"{scenes.archive_url(data_url, spec)}/catalog.json"


# -- the job's operations (lazy) -------------------------------------------------------------


def open_catalogue(catalog: str, plan: Plan, storage_options: dict | None = None
                   ) -> xr.Dataset:
    """Search the catalog and open what it returns through GDAL (lazy; reads headers).

    The search returns the whole catalogue (``factor`` times the window on ``more-tasks``);
    the date window is applied after ``plan.trim_after``.
    """
    found = scenes.search(catalog, plan.catalogue.dates, storage_options)
    return scenes.open_scenes(found, plan.chunk)


def latest(obj: xr.Dataset | xr.DataArray, window: int):
    """The ``window`` latest dates (the catalogue search's date window)."""
    return obj.isel(time=slice(-window, None)) if obj.sizes["time"] > window else obj


def mask_cloud_edges(block: np.ndarray, radius: int) -> np.ndarray:
    """Set pixels within ``radius`` pixels of a cloud (NaN) to NaN (a square buffer)."""
    cloud = np.isnan(block)
    grown = cloud.copy()
    for axis in (-2, -1):
        src = grown.copy()
        n = src.shape[axis]
        for shift in range(1, min(radius, n - 1) + 1):
            fwd = [slice(None)] * src.ndim
            bwd = [slice(None)] * src.ndim
            fwd[axis], bwd[axis] = slice(shift, None), slice(None, -shift)
            grown[tuple(fwd)] |= src[tuple(bwd)]
            grown[tuple(bwd)] |= src[tuple(fwd)]
    return np.where(grown, np.float32(np.nan), block)


def ndvi(scenes: xr.Dataset, cloud_buffer: int = CLOUD_BUFFER_PX) -> xr.DataArray:
    """NDVI = (NIR - red) / (NIR + red), with cloud edges (``cloud_buffer`` px) masked."""
    index = (scenes.nir - scenes.red) / (scenes.nir + scenes.red)
    if cloud_buffer > 0:
        depth = {0: 0, 1: cloud_buffer, 2: cloud_buffer}
        data = da.map_overlap(mask_cloud_edges, index.data, depth=depth, boundary="none",
                              radius=cloud_buffer, dtype=index.dtype)
        index = index.copy(data=data)
    return index.rename("ndvi")


def temporal_median(index: xr.DataArray) -> xr.Dataset:
    """NaN-aware median over time, and the number of clear observations per pixel."""
    index = index.chunk({"time": -1})
    return xr.Dataset({"ndvi_median": index.median("time", skipna=True),
                       "clear_count": index.count("time").astype("int16")})


def write_products(series: xr.DataArray, composite: xr.Dataset, url: str,
                   storage_options: dict | None = None, write_pixels: int | None = None) -> None:
    """Write the NDVI time series and the composite as Zarr groups under ``url`` (computes).

    ``write_pixels`` stores every Dask chunk as Zarr chunks of that edge: many small objects,
    each written in its own request.
    """
    outputs = {"ndvi-series.zarr": series.to_dataset(), "ndvi-median.zarr": composite}
    for name, ds in outputs.items():
        ds = ds.copy()
        encoding = {}
        for var in ds.data_vars:
            ds[var].encoding = {}
            if write_pixels:
                chunks = [min(write_pixels, n) if dim in ("y", "x") else c[0]
                          for dim, n, c in zip(ds[var].dims, ds[var].shape, ds[var].chunks,
                                               strict=True)]
                encoding[var] = {"chunks": tuple(chunks)}
        store = zarr_store(f"{url.rstrip('/')}/{name}", storage_options, read_only=False,
                           small_requests=bool(write_pixels))
        ds.to_zarr(store, mode="w", consolidated=False, encoding=encoding)


# -- running on the cluster ------------------------------------------------------------------


@contextlib.contextmanager
def cluster_client(secede: bool = True) -> Iterator[distributed.Client]:
    """The Dask client to compute with: the worker's own inside a worker task.

    ``secede=True`` (for ``persist`` + ``wait``, which block without seceding) leaves the
    worker's thread pool for the block. Blocks that only call ``compute()``/``to_zarr()``
    pass ``False``: ``Client.get`` secedes by itself, and seceding twice would let the
    worker run more tasks at once than it has threads.
    """
    try:
        distributed.get_worker()
    except ValueError:
        yield distributed.get_client()
        return
    if not secede:
        yield distributed.get_client()
        return
    with distributed.worker_client() as client:
        yield client


def persist_and_publish(client: distributed.Client, obj, name: str):
    """Persist ``obj``, wait until it is in memory, and publish it as ``name``."""
    obj = client.persist(obj)
    distributed.wait(distributed.futures_of(obj))
    client.publish_dataset(obj, name=name, override=True)
    return obj


def _describe(obj: xr.Dataset | xr.DataArray, name: str | None = None) -> dict[str, Any]:
    info = {"dims": dict(obj.sizes), "mbytes": round(obj.nbytes / 1e6, 1)}
    if name is not None:
        info["dataset"] = name
    return info


@task(cache_policy=NO_CACHE)
def prepare_scenes(data_url: str, catalogue: CubeSpec,
                   storage_options: dict | None = None) -> str:
    """Write the scene archive: COGs and a static STAC catalog (the data step)."""
    return scenes.write_scenes(catalogue, data_url, storage_options)


@task(cache_policy=NO_CACHE)
def read_scenes(catalog: str, plan: Plan, name: str,
                storage_options: dict | None = None) -> dict:
    """Search the catalog and read its scenes through GDAL into cluster memory (``read``).

    The workers' GDAL environment is set first (:func:`tasks.scenes.configure_workers`):
    the object store's endpoint, and range merging off on the ``slower-tasks`` read night.
    """
    with cluster_client() as client:
        scenes.configure_workers(client, scenes.gdal_options(storage_options, plan.merge_off))
        found = open_catalogue(catalog, plan, storage_options)
        persist_and_publish(client, found, name)
    return _describe(found, name)


@task(cache_policy=NO_CACHE)
def compute_ndvi(source: str, plan: Plan, name: str) -> dict:
    """NDVI per scene with cloud edges masked (stage ``ndvi``)."""
    with cluster_client() as client:
        scenes = client.get_dataset(source)
        if plan.trim_after == "read":
            scenes = latest(scenes, plan.window)
        index = persist_and_publish(client, ndvi(scenes), name)
    return _describe(index, name)


@task(cache_policy=NO_CACHE)
def reduce_median(source: str, plan: Plan, name: str) -> dict:
    """Temporal NaN-aware median of NDVI (stage ``reduce``)."""
    with cluster_client() as client:
        index = client.get_dataset(source)
        if plan.trim_after == "ndvi":
            index = latest(index, plan.window)
        composite = persist_and_publish(client, temporal_median(index), name)
    return _describe(composite, name)


@task(cache_policy=NO_CACHE)
def write_outputs(series: str, composite: str, plan: Plan, url: str,
                  storage_options: dict | None = None) -> dict:
    """Write the NDVI series and the median composite to Zarr (stage ``write``)."""
    with cluster_client(secede=False) as client:
        index = client.get_dataset(series)
        if plan.trim_after in ("ndvi", "reduce"):
            index = latest(index, plan.window)
        median = client.get_dataset(composite)
        write_products(index, median, url, storage_options, plan.write_pixels)
    return {"url": url, "series_dates": int(index.sizes["time"])}


def _stop_zarr_io_threads() -> None:
    # zarr's I/O loop thread would hold a worker process for 4 s at cluster shutdown; zarr
    # starts a new one if it is needed again
    from zarr.core import sync

    cleanup = getattr(sync, "cleanup_resources", None)
    if cleanup is not None:
        cleanup()


@task(cache_policy=NO_CACHE)
def release_datasets(names: list[str], stop_io_threads: bool = False) -> list[str]:
    """Free the run's cluster resources: its published datasets.

    ``stop_io_threads`` also stops zarr's I/O threads on every worker: only for a cluster
    that belongs to this run (another flow on a shared cluster may be reading right now).
    """
    released = []
    with cluster_client() as client:
        for name in names:
            with contextlib.suppress(KeyError):
                client.unpublish_dataset(name)
                released.append(name)
        if stop_io_threads:
            client.run(_stop_zarr_io_threads)
    return released
