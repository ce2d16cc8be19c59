"""The storage requests of a run's stages, counted at their boundaries.

The workers' storage counters (:mod:`~prefect_dask_profiling.timing.worker_io`) are read
when a stage opens and when it closes; the stage's requests are the change per worker, and
its chunks are compared with the blocks of the files it read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_dask_profiling.timing import io_client

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.store.manifest import ChunksVsBlocks
    from prefect_dask_profiling.timing.worker_io import WorkerCounters

Counters = dict[str, "WorkerCounters"]  # storage counters per worker


class StorageCount:
    """The run's storage requests per (stage, worker), for its ``io`` table.

    Parameters
    ----------
    client
        The run's Dask client.
    counted
        Whether the workers count storage requests (the plugin is installed).
    warnings
        The run's warnings: a boundary whose counters could not be read adds one.
    """

    def __init__(self, client: Client, counted: bool, warnings: list[str]) -> None:
        self.client = client
        self.counted = counted
        self.warnings = warnings
        self.rows: list[dict[str, Any]] = []  # storage requests per (stage, worker)

    def read(self) -> Counters | BaseException | None:
        """The workers' counters now (the exception when unreadable; None when not
        counted)."""
        if not self.counted:
            return None
        try:
            return io_client.io_counters(self.client)
        except Exception as exc:
            return exc

    def opened(self, name: str, read: Counters | BaseException | None) -> Counters | None:
        """The counters a stage starts from (None when not counted or unreadable: said in a
        warning)."""
        if isinstance(read, BaseException):
            self.warnings.append(f"stage {name!r}: storage requests not read: {read!r}")
            return None
        return read

    def closed(self, name: str, before: Counters | None,
               read: Counters | BaseException | None,
               still_open: list[str]) -> ChunksVsBlocks | None:
        """Add the stage's requests (the change per worker since ``before``); its chunks
        against the files' blocks (None when not compared).

        Counts are per process, so a stage open while others (``still_open``) run shares
        its requests with them: said in the stage's warning.
        """
        if before is None:
            return None
        after = self.opened(name, read)
        if after is None:
            return None
        rows = io_client.stage_deltas(name, before, after)
        if still_open:
            self.warnings.append(
                f"stage {name!r} overlapped stage(s) {', '.join(sorted(still_open))}: "
                "storage requests are counted per worker process, so overlapping stages "
                "share them")
        self.rows.extend(rows)
        try:
            return io_client.check_alignment(self.client, before, after)
        except Exception as exc:
            self.warnings.append(f"stage {name!r}: chunks not compared with blocks: {exc!r}")
            return None
