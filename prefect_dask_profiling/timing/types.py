"""The shape of what the scheduler plugin hands back: plain data, typed for readers.

Standard library only. The plugin builds these dicts on a scheduler that may not have this
package installed, so it refers to these types for type checkers only; the client side
(:func:`~prefect_dask_profiling.timing.client.snapshot`,
:class:`~prefect_dask_profiling.summary.record.RunRecord`) reads them.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["ChunksVsBlocks", "ClusterSize", "Incident", "PrefixRow", "SketchData", "Snapshot",
           "StageScheduler", "StageSpill", "TransferLog", "TransferRow", "WorkerLifetime"]


class SketchData(TypedDict):
    """A :class:`~prefect_dask_profiling.timing.sketch.QuantileSketch` as plain data.

    ``counts`` are ``[bucket index, count]`` pairs.
    """

    alpha: float
    zeros: int
    n: int
    counts: list[list[int]]


class PrefixRow(TypedDict, total=False):
    """Per (stage, prefix): what its finished task runs cost."""

    stage: str
    prefix: str
    tasks: int
    errors: int
    reruns: int
    compute_s: float
    p50_s: float | None
    p95_s: float | None
    max_s: float
    nbytes: int
    max_nbytes: int
    transfer_s: float
    disk_read_s: float
    disk_write_s: float
    first_start: float | None
    last_stop: float | None
    sketch: SketchData


class TransferRow(TypedDict):
    """Transfers from one worker to another: how many and how long."""

    source: str
    destination: str
    count: int
    seconds: float


class StageSpill(TypedDict):
    """Bytes spilled to and read back from disk while one stage ran (all workers)."""

    disk_write_bytes: int
    disk_read_bytes: int


class StageScheduler(TypedDict):
    """The scheduler's event loop while one stage ran (stages that overlap share it).

    ``loop_cpu_s`` is the loop thread's CPU, ``loop_wait_s`` its run-queue wait (``None``
    where the kernel does not report it), ``seconds`` the sampled intervals in which the
    stage ran (whole intervals: CPU per second of them is the loop's load).
    """

    loop_cpu_s: float
    loop_wait_s: float | None
    seconds: float


class Incident(TypedDict):
    """A worker that left while tasks of the run were processing on it.

    ``kind`` is ``"suspected OOM"`` when the nanny restarted it for memory or its last
    sample was near its limit, else ``"worker lost"``; ``keys`` is bounded (``n_keys`` is
    the full count).
    """

    worker: str
    time: float
    stages: list[str]
    prefixes: list[str]
    keys: list[str]
    n_keys: int
    last_process: int | None
    last_sample_time: float | None
    memory_limit: int | None
    stimulus_id: str | None
    kind: str
    reason: str
    nanny_rss: int | None


class WorkerLifetime(TypedDict):
    """One worker's stay on the scheduler: from its arrival to its departure.

    ``departed`` is ``None`` while it is still connected. ``start_known`` is False for a
    worker connected before the plugin whose arrival had left the scheduler's event log:
    its ``arrived`` is the plugin's registration time. ``resources`` are the worker's Dask
    resource tags at its arrival (``{"GPU": 1.0}``; absent in snapshots recorded before
    them): what ``cost={"resources": ...}`` prices by.
    """

    worker: str
    name: str
    nthreads: int
    memory_limit: int
    arrived: float
    departed: float | None
    start_known: bool
    resources: dict[str, float]


class ClusterSize(TypedDict):
    """The workers connected when a snapshot was taken, and their threads."""

    workers: int
    threads: int


class TransferLog(TypedDict):
    """One worker's incoming transfers since the run started (from its transfer log).

    ``entries`` are ``(source, bytes, seconds)``; ``overflowed`` says the worker's log
    (a bounded deque) had already dropped some of them.
    """

    entries: list[tuple[str | None, int, float]]
    overflowed: bool


class ChunksVsBlocks(TypedDict):
    """Dask chunks read against the files' internal blocks (``timing.io_client.
    chunks_against_blocks``): the most common ``[rows, cols]`` of each, whether they align,
    the finding in words and, when not aligned, the fix."""

    chunk: list[int]
    block: list[int]
    aligned: bool
    text: str
    fix: str | None


class Snapshot(TypedDict, total=False):
    """Everything the plugin recorded so far.

    ``transfer_bytes`` is added on the client side by ``snapshot()`` (workers' incoming
    transfer logs; absent from a stage close's snapshot, read with ``transfers=False``);
    ``incomplete`` is set when the final collection failed and an earlier snapshot stands in
    for it.
    """

    name: str
    started: float
    collected: float
    tasks: list[PrefixRow]
    orchestration: list[PrefixRow]
    transfers: list[TransferRow]
    workers: dict[str, dict[str, Any]]  # timing.memory.WorkerStats.to_dict by address
    samples: list[tuple[float, str, int, int, int, float]]
    samples_dropped: int
    timeline: list[tuple[float, int]]
    stage_memory: list[dict[str, Any]]  # timing.memory.StageMemory.row per (stage, worker)
    stage_spill: dict[str, StageSpill]
    stage_scheduler: dict[str, StageScheduler]
    cluster: ClusterSize
    incidents: list[Incident]
    incidents_dropped: int
    lifetimes: list[WorkerLifetime]
    lifetimes_dropped: int
    warnings: list[str]
    internal_errors: int
    last_error: str | None
    transfer_bytes: dict[str, TransferLog]
    incomplete: bool
