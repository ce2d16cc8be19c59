"""The store's side of a run in progress: its live estimate under ``live/`` written, read,
removed and swept (the estimate's document: :mod:`prefect_dask_profiling.forecast.live_store`).

Like an acknowledgement, each write or removal is one call bounded by the store's timeout
and refused at once while the store's breaker holds it down; a failure raises the
:class:`~prefect_dask_profiling.errors.StoreError` leaf, which the caller (a background
job) logs and forgets.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from prefect_dask_profiling.forecast.live_store import (
    UNREADABLE_AFTER_S,
    LiveEstimate,
    is_stale,
    parse_live,
)
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.access import StoreAccess
from prefect_dask_profiling.store.errors import DamagedRecord, StoreError
from prefect_dask_profiling.store.manifest import dump

logger = logging.getLogger(__name__)


class Live(StoreAccess):
    """The live-estimate side of :class:`~prefect_dask_profiling.store.runs.RunStore`."""

    def write_live(self, estimate: LiveEstimate) -> str:
        """Replace the run's stored estimate by ``estimate``; its location.

        One put within the store's timeout, refused at once while the breaker holds the
        store down; never spooled. Raises the ``StoreError`` leaf on failure, ``ValueError``
        for a bad pipeline or run id.
        """
        rel = layout.live_file(estimate["pipeline"], estimate["run_id"])
        body = dump(estimate)
        self._check_reachable()
        try:
            self._put(rel, body, False)
        except Exception as exc:
            raise self._failure(exc, f"could not write {self.location(rel)}") from None
        return self.location(rel)

    def remove_live(self, pipeline: str, run_id: str) -> None:
        """Remove the run's stored estimate (the run ended); nothing there is fine.

        Bounded and behind the breaker like :meth:`write_live`; raises the ``StoreError``
        leaf on failure (a leftover estimate is ignored by readers once the run's manifest
        exists).
        """
        rel = layout.live_file(pipeline, run_id)
        self._check_reachable()
        try:
            self.memory.forget()
            self.fs.rm_file(self._path(rel), **self._kw)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._failure(exc, f"could not remove {self.location(rel)}") from None

    def live_estimates(self, pipeline: str) -> dict[str, LiveEstimate | StoreError]:
        """The stored estimates of ``pipeline``'s runs in progress: ``{run_id: its estimate,
        or the StoreError reading it (DamagedRecord: not an estimate)}``, by run id.

        One listing, one existence check per estimate found (a run whose manifest exists
        has ended: its leftover estimate, if its removal failed, is skipped) and one wave of
        reads. The listing's failure raises.
        """
        rels = sorted(rel for rel in self._find(layout.live_dir(pipeline))
                      if (found := layout.parse_live(rel)) is not None
                      and not self._exists(layout.manifest_file(*found)))
        found = self._read_many(dict.fromkeys(rels, "live estimate"))
        out: dict[str, LiveEstimate | StoreError] = {}
        for rel in rels:
            _, run_id = layout.parse_live(rel)  # type: ignore[misc]
            data = found[rel]
            if isinstance(data, StoreError):
                out[run_id] = data
                continue
            try:
                doc = parse_live(data, self.location(rel))
                if doc["run_id"] != run_id or doc["pipeline"] != pipeline:
                    raise DamagedRecord(f"{self.location(rel)} holds the estimate of run "
                                        f"{doc['pipeline']}/{doc['run_id']}")
                out[run_id] = doc
            except DamagedRecord as exc:
                out[run_id] = exc
        return out


    def sweep_live(self, pipeline: str | None = None, now: datetime | None = None,
                   keep: str | None = None) -> list[str]:
        """Remove leftover estimates (the module docstring) of ``pipeline`` (``None``: of
        every pipeline) at ``now`` (default the current time), all but the run ``keep``'s;
        the locations removed.

        One listing, one existence check per estimate, one wave of reads, one removal per
        leftover. An estimate that could not be read for a transient reason is kept (it is
        judged again at the next sweep), and so is one whose removal failed (a warning).
        The listing's failure raises the ``StoreError`` leaf.
        """
        from prefect_dask_profiling.store.retention import mtime

        now = now or datetime.now(UTC)
        where = layout.live_dir(pipeline) if pipeline is not None else layout.LIVE
        listed = {rel: info for rel, info in self._find(where).items()
                  if (found := layout.parse_live(rel)) is not None and found[1] != keep}
        ended = {rel for rel in listed if self._exists(layout.manifest_file(
            *layout.parse_live(rel)))}  # type: ignore[misc]
        running = [rel for rel in sorted(listed) if rel not in ended]
        found = self._read_many(dict.fromkeys(running, "live estimate"))
        leftover = sorted(ended)
        for rel in running:
            data = found[rel]
            if isinstance(data, StoreError) and not isinstance(data, DamagedRecord):
                continue  # not read now: judged at the next sweep
            try:
                if isinstance(data, DamagedRecord):
                    raise data
                stale = is_stale(parse_live(data, self.location(rel)), now)
            except DamagedRecord:
                stale = None
            if stale is None:  # no age to tell: the object's own
                modified = mtime(listed[rel])
                stale = modified is not None and \
                    (now - modified).total_seconds() > UNREADABLE_AFTER_S
            if stale:
                leftover.append(rel)
        removed = []
        for rel in sorted(leftover):
            try:
                self.remove_live(*layout.parse_live(rel))  # type: ignore[misc]
            except StoreError as exc:
                logger.warning("dask-profiling: leftover estimate not removed: %s", exc)
                continue
            removed.append(self.location(rel))
        return removed


__all__ = ["Live"]
