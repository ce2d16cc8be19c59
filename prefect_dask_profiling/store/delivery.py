"""Delivering the spool: files earlier runs could not write reach the store, byte-identical.

The order and the per-run rules live in :func:`~prefect_dask_profiling.store.spool.deliver`;
this part binds them to the store: its exclusive put, its timeout, its breaker, its redaction.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.access import StoreAccess
from prefect_dask_profiling.store.errors import StoreConflict
from prefect_dask_profiling.store.manifest import DeliveryReport
from prefect_dask_profiling.store.spool import UploadResult, deliver

logger = logging.getLogger(__name__)


class Delivery(StoreAccess):
    """The spool side of :class:`~prefect_dask_profiling.store.runs.RunStore`."""

    def upload_pending(self, progress: Callable[[int, int], None] | None = None
                       ) -> UploadResult:
        """Upload this store's spooled files, byte-identical; manifest and index marker last.

        A run's manifest is uploaded only after all its spooled files, and its index marker
        only after the manifest. Uploaded files leave the spool; the others stay for next time.
        ``progress(done, total)`` is called after each file.
        """
        return self._deliver(None, progress)

    def deliver_pending(self, budget_s: float | None = None) -> DeliveryReport | None:
        """Deliver what earlier runs left in this store's spool, within ``budget_s`` seconds.

        Called at the end of every run, so the spool reaches the store with the next run
        (of any pipeline) once the store answers again. Bounded: nothing is tried while the
        store is known to be down, no file is started after the budget (default: the store's
        timeout), and each call has the store's timeout. Safe when two runs deliver at once:
        one holds the spool's lock, the other leaves the spool alone; exclusive creates that
        find identical bytes count as delivered.

        Returns
        -------
        DeliveryReport or None
            ``None`` when nothing was pending; else what was delivered and what was left,
            for the run's manifest and logs.
        """
        budget = self.timeout if budget_s is None else budget_s
        if isinstance(budget, bool) or not isinstance(budget, int | float) \
                or not math.isfinite(budget) or budget < 0:
            raise InvalidInput(f"budget_s must be a number of seconds >= 0, got {budget_s!r}")
        pending = self.spool.pending()
        if not pending:
            return None
        start = time.monotonic()
        if self.breaker.down():
            result, note = UploadResult(failed=len(pending)), "the store did not answer moments ago"
        else:
            result = self._deliver(start + budget, None)
            note = ("another process is delivering them" if result.busy
                    else "out of time" if result.out_of_time
                    else "the store failed" if result.failed and result.warnings
                    and not result.uploaded else None)
        report = DeliveryReport(delivered=result.uploaded, left=result.failed, runs=result.runs,
                                pipelines=result.pipelines,
                                seconds=round(time.monotonic() - start, 3), note=note,
                                warnings=result.warnings)
        if result.uploaded:
            logger.info("dask-profiling: delivered %d spooled file(s) of run(s) %s to %s",
                        result.uploaded, ", ".join(result.runs) or "-", self.url)
        if result.failed:
            logger.warning("dask-profiling: %d spooled file(s) still wait for %s%s",
                           result.failed, self.url, f" ({note})" if note else "")
        return report

    def _deliver(self, deadline: float | None,
                 progress: Callable[[int, int], None] | None) -> UploadResult:
        with self.spool.locked() as mine:
            if not mine:
                result = UploadResult(failed=len(self.spool.pending()), busy=True)
                result.warnings.append(f"the spool {self.spool.dir} is being delivered by "
                                       "another process; try again when it is done")
            else:
                result = deliver(self.spool, self._send_spooled, deadline=deadline,
                                 progress=progress, describe=self._describe)
        result.warnings = [self._redact(w) for w in result.warnings]
        failed = any(w.startswith("could not upload") for w in result.warnings)
        if result.uploaded and not failed:
            self.breaker.reset()
        elif failed:
            self.breaker.trip()
        for message in result.warnings:
            logger.warning(message)
        return result

    def _send_spooled(self, rel: str, data: bytes, left: float | None) -> None:
        exclusive = rel.startswith(layout.RUNS + "/")
        timeout = None if left is None else max(0.5, min(self.timeout, left))
        try:
            self._put_checked(rel, data, exclusive, timeout)
        except StoreConflict as exc:
            raise StoreConflict(f"{exc}; the spooled copy stays at {self.spool.dir / rel}") \
                from None
