"""The nightly NDVI raster job: read scenes, compute NDVI, take the temporal median, write.

Each step has a plain function on lazy xarray/Dask objects (testable on any Dask client)
and a Prefect task that runs it on the flow's Dask cluster. A Prefect task running on a Dask
worker computes through the worker's own client (:func:`distributed.worker_client`, which
secedes while it waits, so the worker thread is free for the work it waits on; a plain
``future.result()`` there would deadlock a one-thread worker). Each task *persists* or
*writes* its output, so its stage is the window in which that work really runs, and hands
the persisted data to the next stage as a run-scoped published dataset.

Injected slowdowns change a real Dask operation, never a wrapper:

* ``more-tasks``: the catalogue search returns ``factor`` times as many scenes (its date
  window is only applied after the chosen stage), so that stage runs the same operation on
  ``factor`` times as many chunks;
* ``slower-tasks``: each task of the stage is slower — ``read`` fetches every chunk in
  8 KiB range requests one after another (range-request merging disabled), ``write`` stores
  every output chunk as 64 x 64-pixel objects (a mis-set output chunking); sizes given for
  the default factor 3, they shrink as the factor grows. Every request pays the store's
  round trip, emulated (5 ms) on a local folder where it would otherwise be free.
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
import zarr
from prefect import task
from prefect.cache_policies import NO_CACHE
from zarr.abc.store import RangeByteRequest
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from tasks.synthetic import CubeSpec, synthetic_cube

STAGES = ("read", "ndvi", "reduce", "write")
SLOWDOWNS = ("none", "more-tasks", "slower-tasks")
SLOWER_TASKS_STAGES = ("read", "write")
# slower-tasks: range requests of SMALL_READ_BASE / factor bytes, output chunks of
# SMALL_WRITE_BASE / factor pixels (8 KiB and 64 px at the default factor 3)
SMALL_READ_BASE = 24 * 1024
SMALL_WRITE_BASE = 192
LOCAL_ROUND_TRIP_S = 0.005  # emulated per-request latency on local folders (S3: ~10-30 ms)
CLOUD_BUFFER_PX = 2
DATA_URL_ENV = "NDVI_DATA_URL"
DEFAULT_DATA_URL = "./.ndvi-data"


@dataclass(frozen=True)
class JobSize:
    """How much one nightly run processes: ``dates`` scenes of ``size`` x ``size`` pixels.

    Dask chunks are ``scenes_per_chunk`` scenes by ``tile`` x ``tile`` pixels.
    """

    dates: int
    size: int
    tile: int
    scenes_per_chunk: int = 4


SIZES = {
    "tiny": JobSize(dates=8, size=512, tile=256),      # tests: a few seconds of work
    "small": JobSize(dates=24, size=1024, tile=512),   # default: well under a minute
    "large": JobSize(dates=48, size=2048, tile=512),   # ~16x small
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
    trim_after
        Stage after which the date window is applied; ``None`` when nothing is extra.
    read_bytes, write_pixels
        The ``slower-tasks`` variants: range-request size of the read stage, output chunk
        edge of the write stage (``None``: normal).
    """

    size: str
    catalogue: CubeSpec
    window: int
    scenes_per_chunk: int = 4
    trim_after: str | None = None
    read_bytes: int | None = None
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
                window=job.dates, scenes_per_chunk=job.scenes_per_chunk, slowdown=slowdown,
                slowdown_stage=slowdown_stage)
    if slowdown == "more-tasks":
        catalogue = replace(plan.catalogue, dates=job.dates * slowdown_factor)
        return replace(plan, catalogue=catalogue, trim_after=slowdown_stage,
                       factor=slowdown_factor)
    if slowdown == "slower-tasks":
        if slowdown_stage not in SLOWER_TASKS_STAGES:
            raise ValueError(f"slowdown 'slower-tasks' applies to slowdown_stage "
                             f"{' or '.join(SLOWER_TASKS_STAGES)}, got {slowdown_stage!r}")
        if slowdown_stage == "read":
            return replace(plan, read_bytes=SMALL_READ_BASE // slowdown_factor,
                           factor=slowdown_factor)
        return replace(plan, write_pixels=SMALL_WRITE_BASE // slowdown_factor,
                       factor=slowdown_factor)
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
    """A store that talks to storage in many small requests, each paying a round trip.

    ``read_bytes`` fetches every chunk in range requests of that size, one after another:
    what reading looks like when range-request merging is disabled. Every request (each
    range, and each object written) waits ``latency_s`` first: the round trip an object
    store charges. On a remote store the round trip is real and ``latency_s`` is 0; on a
    local folder, whose requests cost almost nothing, it is emulated.
    """

    def __init__(self, store: Any, read_bytes: int | None = None,
                 latency_s: float = 0.0) -> None:
        super().__init__(store)
        self.read_bytes = read_bytes
        self.latency_s = latency_s

    def _with_store(self, store: Any) -> SmallRequests:
        return type(self)(store, self.read_bytes, self.latency_s)

    async def _round_trip(self) -> None:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)

    async def get(self, key, prototype, byte_range=None):
        if byte_range is not None or not self.read_bytes or key.endswith("zarr.json"):
            await self._round_trip()
            return await self._store.get(key, prototype, byte_range)
        if not await self._store.exists(key):
            return None
        size = await self._store.getsize(key)
        parts = []
        for start in range(0, size, self.read_bytes):
            await self._round_trip()
            request = RangeByteRequest(start, min(size, start + self.read_bytes))
            part = await self._store.get(key, prototype, request)
            parts.append(part.to_bytes())
        return prototype.buffer.from_bytes(b"".join(parts))

    async def set(self, key, value) -> None:
        await self._round_trip()
        await self._store.set(key, value)


def zarr_store(url: str, storage_options: dict | None = None, *, read_only: bool = True,
               read_bytes: int | None = None, small_requests: bool = False):
    """A Zarr store for a local path or any fsspec URL (``s3://...``).

    ``read_bytes`` or ``small_requests`` wrap it in :class:`SmallRequests` (with an emulated
    round trip of ``LOCAL_ROUND_TRIP_S`` per request on a local folder).
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
    if not (read_bytes or small_requests):
        return store
    return SmallRequests(store, read_bytes, LOCAL_ROUND_TRIP_S if _is_local(url) else 0.0)


def cube_url(data_url: str, spec: CubeSpec) -> str:
    """Where the catalogue ``spec`` is stored under ``data_url``."""
    return f"{data_url.rstrip('/')}/scenes/{spec.token}.zarr"


def cube_exists(url: str, spec: CubeSpec, storage_options: dict | None = None) -> bool:
    """True if a complete cube of ``spec`` is stored at ``url``."""
    try:
        group = zarr.open_group(zarr_store(url, storage_options), mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError, ValueError):
        return False
    return group.attrs.get("spec") == spec.token and group.attrs.get("complete") is True


def write_cube(spec: CubeSpec, url: str, storage_options: dict | None = None) -> None:
    """Generate the synthetic catalogue ``spec`` and write it as Zarr (computes)."""
    ds = synthetic_cube(spec)
    store = zarr_store(url, storage_options, read_only=False)
    ds.to_zarr(store, mode="w", consolidated=False)
    group = zarr.open_group(store, mode="r+")
    group.attrs["complete"] = True  # written last: a half-written cube is regenerated


# -- the job's operations (lazy) -------------------------------------------------------------


def open_scenes(url: str, spec: CubeSpec, storage_options: dict | None = None,
                read_bytes: int | None = None, scenes_per_chunk: int = 1) -> xr.Dataset:
    """Open the stored catalogue lazily: Dask chunks of ``scenes_per_chunk`` scene tiles."""
    store = zarr_store(url, storage_options, read_bytes=read_bytes)
    chunks = {"time": scenes_per_chunk, "y": spec.tile, "x": spec.tile}
    return xr.open_zarr(store, chunks=chunks, consolidated=False)


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
def prepare_scenes(url: str, catalogue: CubeSpec, storage_options: dict | None = None) -> str:
    """Generate and store the synthetic catalogue (the stand-in for the scene archive)."""
    with cluster_client(secede=False):
        write_cube(catalogue, url, storage_options)
    return url


@task(cache_policy=NO_CACHE)
def read_scenes(url: str, plan: Plan, name: str, storage_options: dict | None = None) -> dict:
    """Read the scenes the catalogue returned into cluster memory (stage ``read``)."""
    with cluster_client() as client:
        scenes = open_scenes(url, plan.catalogue, storage_options, plan.read_bytes,
                             plan.scenes_per_chunk)
        persist_and_publish(client, scenes, name)
    return _describe(scenes, name)


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
