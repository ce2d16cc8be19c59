"""The stages of one run as they open and close, flow side: :class:`StageBook`.

One manifest entry per stage name (a name opened again continues its entry: ``windows``
counts the openings), the storage requests between its boundaries, the Dask work that ran
on local threads inside it, and the scheduler's snapshot at its end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import distributed

from prefect_dask_profiling.environment import Environment, environment
from prefect_dask_profiling.reports import stage_reports as reports
from prefect_dask_profiling.run.storage_count import Counters, StorageCount
from prefect_dask_profiling.stages import LocalWorkWatch, open_stage_name
from prefect_dask_profiling.store.manifest import LocalWork, StageInfo
from prefect_dask_profiling.summary.io import io_frame
from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.timing import client as timing_client
from prefect_dask_profiling.timing import io_client

if TYPE_CHECKING:
    from collections.abc import Callable

    from distributed import Client

    from prefect_dask_profiling.cost.rates import CostRates
    from prefect_dask_profiling.timing.types import Snapshot


@dataclass
class OpenStage:
    """A stage block that is open in the flow body."""

    name: str
    window: reports.ReportWindow | None
    futures: list = field(default_factory=list)
    local: LocalWorkWatch | None = None
    io_before: Counters | None = None  # storage counters per worker at the start


class StageBook:
    """The run's stage entries (:attr:`stages`), kept as the session opens and closes them.

    Parameters
    ----------
    client, plugin_name
        The run's Dask client and its scheduler plugin.
    warnings
        The run's warnings (a snapshot or a boundary read that failed adds one).
    stage_reports
        The run's reports (a window's end is read with the boundary; a note is renewed).
    cost
        The runner's rates: workers they do not price are warned about at the first stage.
    log
        Where a stage's warnings are logged: ``log(level, message)`` (the session passes the
        flow run's logger, shown in the Prefect UI); default this module's logger.
    """

    def __init__(self, client: Client, plugin_name: str, warnings: list[str],
                 stage_reports: reports.StageReports, cost: CostRates | None,
                 log: Callable[[int, str], None] | None = None) -> None:
        self.client, self.plugin_name, self.warnings = client, plugin_name, warnings
        self.log = log or logging.getLogger(__name__).log
        self.reports, self.cost = stage_reports, cost
        self.open: dict[str, OpenStage] = {}
        self.stages: list[StageInfo] = []
        self._by_name: dict[str, StageInfo] = {}  # a name opened again: its entry
        self.io = StorageCount(client, False, warnings)
        self.last_snapshot: Snapshot | None = None  # the latest stage end's
        self.last_counts: dict[str, dict[str, int]] | None = None  # of the latest close's read
        self._pricing_checked = False

    def track(self, future) -> None:
        """Remember a Dask future submitted inside the current stage."""
        name = open_stage_name()
        if name is not None and name in self.open:
            self.open[name].futures.append(future)

    def opened(self, name: str, window: reports.ReportWindow | None) -> OpenStage:
        """Stage ``name`` opens (its report's ``window`` started): read its boundary."""
        before = self.io.opened(name, self.io.read())
        local = LocalWorkWatch()
        local.register()
        opened = self.open[name] = OpenStage(name=name, window=window, local=local,
                                             io_before=before)
        return opened

    def closed(self, name: str, token: OpenStage
               ) -> tuple[StageInfo, reports.WindowEnd | BaseException | None]:
        """Stage ``name`` closes: wait for its futures, read its boundary; its entry and
        the end of its report's window."""
        if token.local is not None:
            token.local.unregister()
        self.open.pop(name, None)
        if token.futures:
            with self.client.as_current():
                distributed.wait(token.futures)
        try:
            # kept in case the final collection fails, and read for the ETA's counts:
            # the workers' transfer logs are left to the final collection
            snapshot: Snapshot | BaseException = timing_client.snapshot(
                self.client, self.plugin_name, transfers=False)
        except Exception as exc:
            snapshot = exc
        io = self.io.read() if token.io_before is not None else None
        end = self.reports.end(token.window)
        alignment = self.io.closed(name, token.io_before, io, list(self.open))
        info = self._by_name.get(name)
        if info is None:
            info = self._by_name[name] = StageInfo(name=name)
            self.stages.append(info)
        else:
            info.windows += 1
        if token.local is not None:
            self._count_local_work(info, token.local)
        if alignment is not None:
            info.chunks_vs_blocks = alignment
        if isinstance(snapshot, BaseException):
            self.warnings.append(f"stage {name!r}: snapshot failed: {snapshot!r}")
            self.last_counts = None
        else:
            self.last_snapshot = snapshot
            self.last_counts = timing_client.counts_of(snapshot)
            self._check_pricing(snapshot)
        return info, end

    def _check_pricing(self, snap: Snapshot) -> None:
        """At the first stage: warn (once) about workers ``cost=`` rules do not price and
        rules that match no worker
        (:meth:`~prefect_dask_profiling.cost.rates.CostRates.warnings`)."""
        rates = self.cost
        if self._pricing_checked or rates is None or not rates.by_attribute:
            return
        self._pricing_checked = True
        workers = [(str(entry.get("name", "")), entry.get("resources"))
                   for entry in snap.get("lifetimes") or []]
        for message in rates.warnings(workers):
            self.warnings.append(message)
            self.log(logging.WARNING, f"dask-profiling: {message}")

    def _count_local_work(self, info: StageInfo, watch: LocalWorkWatch) -> None:
        """Add the Dask work that ran on local threads in this window to the stage's entry,
        and say so in the flow run's logs (it is not in the profile)."""
        count = watch.count()
        if count.tasks == 0:
            return
        before = info.local_work or LocalWork(tasks=0, seconds=0.0, computes=0)
        info.local_work = LocalWork(tasks=before["tasks"] + count.tasks,
                                    seconds=round(before["seconds"] + count.seconds, 4),
                                    computes=before["computes"] + count.computes)
        self.reports.renote(info)
        self.log(logging.WARNING, f"dask-profiling: {reports.local_work_text(info)}")

    def record(self) -> RunRecord:
        """The run's record: the scheduler's final snapshot (else the last stage end's,
        marked incomplete, with a warning) and the storage requests.

        Raises
        ------
        Exception
            What the final snapshot raised, when no stage end was read either.
        """
        try:
            snap = timing_client.snapshot(self.client, self.plugin_name)
        except Exception as exc:
            if self.last_snapshot is None:
                raise
            self.warnings.append(f"final collection failed ({exc!r}): the summary holds what "
                                 "was collected at the last stage boundary (without the "
                                 "workers' transfer bytes); run incomplete")
            snap = self.last_snapshot
            snap["incomplete"] = True
        workers, threads = timing_client.cluster_size(self.client, snap)
        record = RunRecord.from_snapshot(snap, workers=workers, threads=threads)
        record.incomplete = bool(snap.get("incomplete"))
        record.io = io_frame(self.io.rows)
        return record

    def environment(self) -> Environment:
        """The run's environment fingerprint: the workers' (this process's when the client
        is gone), with their raster stack when storage requests are counted."""
        alive = _alive(self.client)
        env = environment(self.client) if alive else environment()
        if self.io.counted and alive:
            raster = io_client.raster_fingerprint(self.client)
            if raster is not None:
                env["raster"] = raster
        return env


def _alive(client: Client) -> bool:
    try:
        return client.status == "running"
    except Exception:
        return False
