"""Runs in the flow process (the Dask client): the storage requests of a run read from there.

:func:`install` puts the :class:`~prefect_dask_profiling.timing.worker_io.StorageRequests`
plugin on every worker and the same counters in this process; :func:`io_counters` reads
them at a stage boundary and :func:`stage_deltas` turns two readings into the stage's
``io`` rows. What is counted, and how: :mod:`~prefect_dask_profiling.timing.worker_io`."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.timing.worker_io import (
    METHODS,
    PLUGIN_NAME,
    StorageRequests,
    _block_shapes,
    _raster_environment,
    _read_counters,
)

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.timing.types import ChunksVsBlocks
    from prefect_dask_profiling.timing.worker_io import SourceCounts, WorkerCounters

FLOW_PROCESS = "flow-process"  # io_counters' key of the calling (flow) process's reading
ALIGNMENT_FILES = 1  # files check_alignment opens to read their internal blocks


_flow_counter: StorageRequests | None = None  # this process's counters (the flow's)


def install(client: Client) -> bool:
    """Register :class:`StorageRequests` on every worker (and future ones) and count this
    (the flow) process's requests too; never raises.

    Returns whether the workers' plugin was registered.
    """
    count_this_process()
    try:
        client.register_plugin(StorageRequests(), name=PLUGIN_NAME)
        return True
    except Exception:
        return False


def count_this_process() -> StorageRequests:
    """This process's counters, started on first use (GDAL's statistics reset only then)."""
    global _flow_counter
    if _flow_counter is None:
        _flow_counter = StorageRequests()
        _flow_counter.start_counting()
    else:
        _flow_counter.attach()  # s3fs again after an uninstall
    return _flow_counter


def uninstall(client: Client) -> None:
    """Remove the plugin from the workers, restoring s3fs there and here; never raises."""
    with contextlib.suppress(Exception):
        client.unregister_worker_plugin(PLUGIN_NAME)
    if _flow_counter is not None:
        with contextlib.suppress(Exception):
            _flow_counter._unpatch_s3fs()


def io_counters(client: Client, timeout: float = 10.0) -> dict[str, WorkerCounters]:
    """Every process's cumulative counters: ``{worker address: counters}`` (may raise).

    The flow process's (this one's, after :func:`install`) are under :data:`FLOW_PROCESS`,
    unless a worker runs in this process: its counters are process-wide and hold them.

    Raises
    ------
    TimeoutError
        When the workers have not all answered within ``timeout`` seconds (a worker whose
        event loop is blocked must not hold a stage boundary).
    """
    if not timeout > 0:
        raise InvalidInput(f"timeout must be a positive number of seconds, got {timeout!r}")
    out = client.run(_read_counters, on_error="return", callback_timeout=timeout)
    readings = {w: c for w, c in out.items() if isinstance(c, dict)}
    if _flow_counter is not None and all(c.get("pid") != os.getpid()
                                         for c in readings.values()):
        readings[FLOW_PROCESS] = _flow_counter.counters(cpu=False)
    return readings


def raster_environment(client: Client | None = None) -> dict[str, Any]:
    """Per worker: GDAL/rasterio/libcurl versions and effective options; never raises.

    Without a client, this process's.
    """
    try:
        if client is None:
            return {"local": _raster_environment()}
        out = client.run(_raster_environment, on_error="return")
        return {w: v for w, v in out.items() if isinstance(v, dict)}
    except Exception:
        return {}


def raster_fingerprint(client: Client | None = None) -> dict[str, Any] | None:
    """The workers' raster stack for the run's environment, or None when no GDAL is loaded.

    ``{gdal, rasterio, libcurl, options: {name: value}, workers, ranges_counted}``: a value
    the workers disagree on is their distinct values joined by `` | ``; secrets are
    ``"<set>"``; ``ranges_counted`` when every worker counted GDAL's parallel ranges.
    Read at the end of the run, so options a stage set on the workers are in it.
    """
    per_worker = [v for v in raster_environment(client).values() if v.get("gdal")]
    if not per_worker:
        return None

    def agreed(values: list[Any]) -> Any:
        distinct = sorted({str(v) for v in values if v is not None})
        return distinct[0] if len(distinct) == 1 else (" | ".join(distinct) or None)

    names = sorted({n for v in per_worker for n in v["options"]})
    return {"gdal": agreed([v["gdal"] for v in per_worker]),
            "rasterio": agreed([v["rasterio"] for v in per_worker]),
            "libcurl": agreed([v["libcurl"] for v in per_worker]),
            "options": {n: agreed([v["options"].get(n) for v in per_worker]) for n in names},
            "workers": len(per_worker),
            "ranges_counted": all(v.get("ranges_counted") for v in per_worker)}


def stage_reads(before: dict[str, WorkerCounters], after: dict[str, WorkerCounters]
                ) -> tuple[dict[str, int], list[str]]:
    """Chunk shapes read during a stage and the files it made requests to (pure)."""
    shapes: dict[str, int] = {}
    files: dict[str, int] = {}
    for worker, end in after.items():
        if worker == FLOW_PROCESS:
            continue  # headers read while the graph was built: not the chunks read
        start = before.get(worker) or {}
        if not _same_counters(start, end):
            start = {}
        for name, n in (end.get("shapes") or {}).items():
            d = n - (start.get("shapes") or {}).get(name, 0)
            if d > 0:
                shapes[name] = shapes.get(name, 0) + d
        for name, n in (end.get("files") or {}).items():
            d = n - (start.get("files") or {}).get(name, 0)
            if d > 0:
                files[name] = files.get(name, 0) + d
    return shapes, sorted(files, key=lambda f: -files[f])


def chunks_against_blocks(shapes: dict[str, int], blocks: dict[str, list[int]]
                          ) -> ChunksVsBlocks | None:
    """Whether the chunks read are whole multiples of the files' blocks (pure).

    Parameters
    ----------
    shapes
        ``{"rows x cols": chunks}`` read in the stage (:func:`stage_reads`).
    blocks
        ``{file: [block rows, block cols]}`` of files the stage read.

    Returns
    -------
    ``{chunk, block, aligned, text, fix}`` for the most common chunk shape against the most
    common block shape (edge chunks are smaller and not judged), or None without both.
    """
    if not shapes or not blocks:
        return None
    chunk_name = max(shapes, key=lambda k: shapes[k])
    rows, cols = (int(v) for v in chunk_name.split("x"))
    block = max({tuple(b) for b in blocks.values()},
                key=lambda b: sum(tuple(v) == b for v in blocks.values()))
    aligned = rows % block[0] == 0 and cols % block[1] == 0
    fit = [max(block[0], round(rows / block[0]) * block[0]),
           max(block[1], round(cols / block[1]) * block[1])]
    if aligned:
        text = f"chunks {rows}x{cols} px are whole multiples of the files' {block[0]}x" \
               f"{block[1]} px blocks"
    else:
        text = (f"chunks {rows}x{cols} px are not multiples of the files' {block[0]}x"
                f"{block[1]} px blocks: every chunk reads blocks its neighbours read again "
                f"(more requests and bytes per chunk); chunk by the blocks, e.g. "
                f"chunks={{'y': {fit[0]}, 'x': {fit[1]}}} (from the files' block_shapes; "
                "rioxarray: chunks=True)")
    fix = (f"chunk the read by the files' {block[0]}x{block[1]} px blocks, e.g. "
           f"chunks={{'y': {fit[0]}, 'x': {fit[1]}}}")
    return {"chunk": [rows, cols], "block": list(block), "aligned": aligned, "text": text,
            "fix": None if aligned else fix}


def check_alignment(client: Client, before: dict[str, WorkerCounters],
                    after: dict[str, WorkerCounters]) -> ChunksVsBlocks | None:
    """:func:`chunks_against_blocks` for a stage that read files through GDAL (may raise).

    Opens up to :data:`ALIGNMENT_FILES` of the files the stage read on the worker that read
    the most (GDAL has their headers cached there), after the stage's counters were read.
    """
    shapes, files = stage_reads(before, after)
    if not shapes or not files:
        return None
    workers = [w for w in after if w != FLOW_PROCESS]
    busiest = max(workers, key=lambda w: sum((after[w].get("files") or {}).values()))
    blocks = client.run(_block_shapes, files[:ALIGNMENT_FILES], workers=[busiest])
    return chunks_against_blocks(shapes, blocks.get(busiest) or {})


def _same_counters(start: WorkerCounters, end: WorkerCounters) -> bool:
    """Whether two readings come from the same process and plugin instance."""
    return start.get("pid") == end.get("pid") and start.get("instance") == end.get("instance")


def _source_delta(before: SourceCounts | None, after: SourceCounts | None) -> SourceCounts | None:
    if after is None:
        return None
    before = before or {}
    return {k: int(after.get(k, 0)) - int(before.get(k, 0))  # type: ignore[misc]
            for k in set(after) | set(before)}


def cpu_delta(start: WorkerCounters, end: WorkerCounters) -> dict[str, float]:
    """A worker process's CPU between two readings of the same process (pure).

    ``seconds`` between the readings; ``cpu_s``, the CPU of all its threads (tasks, and the
    worker's own event loop and communications: exited threads included); ``task_wait_s``,
    the run-queue wait of the threads running tasks at the end (Linux): their change since
    the start, or all of it for a thread started since (thread pools start threads on first
    use, and a task that secedes hands its place to a new one). Only the task threads'
    wait: on a loaded host the event loop and the worker's other threads wake many times a
    second and wait for a core each time, which says nothing about what the tasks wanted.
    Readings without CPU (an older plugin) give ``{}``.
    """
    if start.get("cpu_s") is None or end.get("cpu_s") is None:
        return {}
    out = {"seconds": max(end["time"] - start["time"], 0.0),
           "cpu_s": max(end["cpu_s"] - start["cpu_s"], 0.0)}
    before, after = start.get("task_waits") or {}, end.get("task_waits")
    if after is not None:  # None: the kernel does not report waits (not Linux)
        out["task_wait_s"] = sum(max(wait - before.get(tid, 0.0), 0.0)
                                 for tid, wait in after.items())
    return out


def stage_deltas(stage: str, before: dict[str, WorkerCounters],
                 after: dict[str, WorkerCounters]) -> list[dict[str, Any]]:
    """The ``io`` rows of one stage: one per process seen at its end (pure).

    A worker absent at the start counts from zero (it joined during the stage); a worker whose
    process changed (restarted), or whose plugin was registered again (another run on a
    shared cluster), is counted from zero too. GDAL columns are present only when
    GDAL was loaded in that process, s3fs columns only when s3fs was; workers sharing one
    process (``processes=False``) share its counters, which go on the first of them only.
    The CPU columns (:func:`cpu_delta`) only where both readings come from the same process.
    ``process`` is ``"flow"`` for :data:`FLOW_PROCESS`'s row, else ``"worker"``.

    ``chunks``/``decoded_bytes`` are the source chunks of the prefixes that any process
    found reading by the stage's end (one process's reading prefix is every process's): the
    same chunks whichever task or thread revealed it.
    """
    readers = {p for end in after.values() for p in (end.get("readers") or ())}
    rows = []
    seen_pids: set[Any] = set()
    for worker, end in sorted(after.items(), key=lambda kv: (kv[0] == FLOW_PROCESS, kv[0])):
        start = before.get(worker)
        if start is not None and not _same_counters(start, end):
            start = None
        row: dict[str, Any] = {"stage": stage, "worker": worker,
                               "process": end.get("process") or (
                                   "flow" if worker == FLOW_PROCESS else "worker")}
        if start is not None:
            row.update(cpu_delta(start, end))
        start = start or {}
        row.update(_chunk_delta(start, end, readers))
        shared = end.get("pid") in seen_pids
        seen_pids.add(end.get("pid"))
        for source in ("gdal", "s3fs"):
            delta = _source_delta(start.get(source), end.get(source))
            if delta is None or shared:
                continue
            for method in METHODS:
                row[f"{source}_{method.lower()}"] = delta.get(method, 0)
            row[f"{source}_bytes"] = delta.get("bytes", 0)
        rows.append(row)
    return rows


def _chunk_delta(start: WorkerCounters, end: WorkerCounters, readers: set[str]
                 ) -> dict[str, int]:
    """Chunks and decoded bytes of the reading prefixes between two readings (pure)."""
    if "sources" not in end:  # an older plugin: its own count of reading tasks
        return {"chunks": end["chunks"] - start.get("chunks", 0),
                "decoded_bytes": end["decoded_bytes"] - start.get("decoded_bytes", 0)}
    chunks = decoded = 0
    before = start.get("sources") or {}
    for prefix, (n, nbytes) in (end.get("sources") or {}).items():
        if prefix in readers:
            was = before.get(prefix) or (0, 0)
            chunks += n - was[0]
            decoded += nbytes - was[1]
    return {"chunks": chunks, "decoded_bytes": decoded}
