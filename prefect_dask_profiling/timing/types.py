"""The shape of what the scheduler plugin hands back: plain data, typed for readers.

Standard library only. The plugin builds these dicts on a scheduler that may not have this
package installed, so it refers to these types for type checkers only; the client side
(:func:`~prefect_dask_profiling.timing.plugin.snapshot`,
:class:`~prefect_dask_profiling.summary.record.RunRecord`) reads them.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["PrefixRow", "Snapshot", "TransferRow", "WorkerAggregate"]


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
    transfer_s: float
    disk_read_s: float
    disk_write_s: float
    first_start: float | None
    last_stop: float | None
    sketch: dict[str, Any]


class TransferRow(TypedDict):
    """Transfers from one worker to another: how many and how long."""

    source: str
    destination: str
    count: int
    seconds: float


class WorkerAggregate(TypedDict, total=False):
    """One worker's memory and CPU over the periodic samples."""

    host: str
    nthreads: int
    samples: int
    peak_managed: int
    sum_managed: float
    peak_unmanaged: int
    sum_unmanaged: float
    peak_spilled: int
    peak_cpu: float
    sum_cpu: float
    memory_limit: int


class Snapshot(TypedDict, total=False):
    """Everything the plugin recorded so far.

    ``transfer_bytes`` is added on the client side by ``snapshot()`` (workers' incoming
    transfer logs); ``incomplete`` is set when the final collection failed and an earlier
    snapshot stands in for it.
    """

    name: str
    started: float
    collected: float
    tasks: list[PrefixRow]
    orchestration: list[PrefixRow]
    transfers: list[TransferRow]
    workers: dict[str, WorkerAggregate]
    samples: list[tuple[float, str, int, int, int, float]]
    samples_dropped: int
    timeline: list[tuple[float, int]]
    warnings: list[str]
    internal_errors: int
    last_error: str | None
    transfer_bytes: dict[str, Any]
    incomplete: bool
