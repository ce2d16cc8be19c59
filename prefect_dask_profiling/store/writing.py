"""Writing runs and reports: files first, then the manifest, then the index marker.

Writes never raise for storage failures: what could not be written goes to the spool
(:mod:`~prefect_dask_profiling.store.spool`) and the :class:`WriteResult` says so. They
raise only for bad input (names) and for a run that already exists
(:class:`~prefect_dask_profiling.errors.StoreConflict`): runs are never overwritten.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pandas as pd

from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.access import StoreAccess
from prefect_dask_profiling.store.errors import StoreConflict
from prefect_dask_profiling.store.manifest import complete_manifest, dump, marker_doc
from prefect_dask_profiling.store.tables import encode_files

logger = logging.getLogger(__name__)


@dataclass
class WriteResult:
    """Outcome of a write: where it is (or will be, once uploaded) and whether it was spooled."""

    location: str | None
    spooled: bool
    warnings: list[str] = field(default_factory=list)


class Writing(StoreAccess):
    """The write side of :class:`~prefect_dask_profiling.store.runs.RunStore`."""

    def write_run(self, pipeline: str, run_id: str, tables: dict[str, pd.DataFrame],
                  manifest: dict, extra_files: dict[str, bytes] | None = None) -> WriteResult:
        """Write a run's tables (CSV) and extra files, then manifest.json, then its index marker.

        The manifest gains ``files`` (size and sha256 of each file) and is created exclusively:
        a run is never overwritten (``StoreConflict`` if the run already exists). Storage
        failures never raise: the unwritten files are spooled and ``spooled=True`` comes with a
        warning.
        """
        run_dir = layout.run_dir(pipeline, run_id)
        files = encode_files(tables, extra_files)
        doc = complete_manifest(pipeline, run_id, manifest, files)
        items = [(layout.run_file(pipeline, run_id, name), data, True)
                 for name, data in files.items()]
        items.append((layout.manifest_file(pipeline, run_id), dump(doc), True))
        items.append((layout.index_marker(pipeline, doc["version"], run_id, doc["status"]),
                      dump(marker_doc(doc)), False))
        return self._write_items(items, self.location(run_dir))

    def complete_run(self, pipeline: str, run_id: str, tables: dict[str, pd.DataFrame],
                     manifest: dict, extra_files: dict[str, bytes] | None = None,
                     provisional_status: str = "unjudged") -> WriteResult:
        """Complete a run stored by :meth:`write_run` with a provisional manifest.

        Writes the tables and files not stored yet, replaces the provisional manifest by
        ``manifest`` (whose ``files`` then lists every file of the run) and the run's index
        marker by one with the final status. Like :meth:`write_run`, storage failures spool.
        """
        run_dir = layout.run_dir(pipeline, run_id)
        files = encode_files(tables, extra_files)
        doc = complete_manifest(pipeline, run_id, manifest, files)
        stored = self._find(run_dir) if not self.breaker.down() else {}
        items = [(rel, data, True) for name, data in files.items()
                 if (rel := layout.run_file(pipeline, run_id, name)) not in stored]
        items.append((layout.manifest_file(pipeline, run_id), dump(doc), False))
        items.append((layout.index_marker(pipeline, doc["version"], run_id, doc["status"]),
                      dump(marker_doc(doc)), False))
        result = self._write_items(items, self.location(run_dir))
        if doc["status"] != provisional_status:
            self._forget_marker(layout.index_marker(pipeline, doc["version"], run_id,
                                                    provisional_status), result.spooled)
        return result

    def write_report(self, pipeline: str, run_id: str, stage: str,
                     html: str | bytes) -> WriteResult:
        """Write one stage's performance report to ``reports/<pipeline>/<run_id>/<stage>.html``."""
        rel = layout.report_file(pipeline, run_id, stage)
        data = html.encode() if isinstance(html, str) else bytes(html)
        return self._write_items([(rel, data, False)], self.location(rel))

    def _forget_marker(self, rel: str, spooled: bool) -> None:
        """Remove a superseded index marker (best effort: readers prefer the final one)."""
        try:
            self.spool.forget(rel)
            if not spooled:
                self.memory.forget()
                self.fs.rm_file(self._path(rel))
        except Exception as exc:
            logger.debug("superseded marker %s not removed: %r", rel, exc)

    def _write_items(self, items: list[tuple[str, bytes, bool]], location: str) -> WriteResult:
        """Put ``items`` (path, bytes, exclusive) in order; spool the rest at the first failure."""
        done = 0
        if self.breaker.down():
            reason = "it failed moments ago"
        else:
            try:
                for rel, data, exclusive in items:
                    self._put_checked(rel, data, exclusive)
                    done += 1
                return WriteResult(location, False, [])
            except StoreConflict:
                raise StoreConflict(f"{self.location(items[done][0])} already exists: runs "
                                    "are never overwritten (use a new run id)") from None
            except Exception as exc:
                reason = self._describe(exc)
                self.breaker.trip()
        return self._spool_items(items[done:], location, reason)

    def _spool_items(self, pending: list[tuple[str, bytes, bool]], location: str,
                     reason: str) -> WriteResult:
        """Keep ``pending`` in the spool; the result says so (or that they are lost)."""
        try:
            where = self.spool.write([(rel, data) for rel, data, _ in pending])
        except OSError as exc:
            message = self._redact(f"could not write {len(pending)} file(s) to {self.url} "
                                   f"({reason}) nor to the spool ({exc}); they are lost")
        else:
            message = self._redact(
                f"could not write {len(pending)} file(s) to {self.url} ({reason}); kept them "
                f"in the spool {where}; upload later with `dask-profiling upload-pending "
                f"--store {self.url}`")
        logger.warning(message)
        return WriteResult(location, True, [message])
