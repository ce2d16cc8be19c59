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
from prefect_dask_profiling.store.errors import StoreConflict, StoreError
from prefect_dask_profiling.store.manifest import Manifest, complete_manifest, dump, marker_doc
from prefect_dask_profiling.store.tables import encode_files

logger = logging.getLogger(__name__)
# The status of the manifest a run stores before its verdict (complete_run replaces it)
PROVISIONAL_STATUS = "unjudged"


@dataclass
class WriteResult:
    """Outcome of a write: where it is (or will be, once uploaded) and whether it was spooled.

    Attributes
    ----------
    location
        The run folder or report (a URL or local path), where it is or will be once uploaded.
    spooled
        Whether any file did not reach the store.
    warnings
        One line per problem met (the store failed, the run folder could not be listed...).
    spooled_files
        Paths (relative to the store root) of the files kept in the spool for delivery.
    lost_files
        Paths of files neither stored nor spooled (the spool itself was unwritable).
    """

    location: str | None
    spooled: bool
    warnings: list[str] = field(default_factory=list)
    spooled_files: list[str] = field(default_factory=list)
    lost_files: list[str] = field(default_factory=list)


class Writing(StoreAccess):
    """The write side of :class:`~prefect_dask_profiling.store.runs.RunStore`."""

    def write_run(self, pipeline: str, run_id: str, tables: dict[str, pd.DataFrame],
                  manifest: Manifest, extra_files: dict[str, bytes] | None = None) -> WriteResult:
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
                     manifest: Manifest, extra_files: dict[str, bytes] | None = None
                     ) -> WriteResult:
        """Complete a run stored by :meth:`write_run` with a provisional manifest (status
        :data:`PROVISIONAL_STATUS`).

        Writes the tables and files not stored yet, replaces the provisional manifest by
        ``manifest`` (whose ``files`` then lists every file of the run) and the run's index
        marker by one with the final status.

        Fails closed: no store error raises, at any point — the listing of the run's folder,
        any PUT, a 403, a 503, a timeout. What was not written is spooled (and delivered by
        the next run's :meth:`deliver_pending`); the result's ``spooled_files`` name those
        files and its ``warnings`` say why. When the folder cannot be listed every file is
        written again: exclusive creates accept the identical bytes the provisional write
        stored. Only bad input raises (names, a manifest that is not one).
        """
        run_dir = layout.run_dir(pipeline, run_id)
        files = encode_files(tables, extra_files)
        doc = complete_manifest(pipeline, run_id, manifest, files)
        stored, warnings = self._stored_run_files(run_dir)
        items = [(rel, data, True) for name, data in files.items()
                 if (rel := layout.run_file(pipeline, run_id, name)) not in stored]
        items.append((layout.manifest_file(pipeline, run_id), dump(doc), False))
        items.append((layout.index_marker(pipeline, doc["version"], run_id, doc["status"]),
                      dump(marker_doc(doc)), False))
        result = self._write_items(items, self.location(run_dir), conflicts="spool")
        result.warnings[:0] = warnings
        if doc["status"] != PROVISIONAL_STATUS:
            self._forget_marker(layout.index_marker(pipeline, doc["version"], run_id,
                                                    PROVISIONAL_STATUS), result.spooled)
        return result

    def _stored_run_files(self, run_dir: str) -> tuple[set[str], list[str]]:
        """Files of ``run_dir`` already stored (so they are not sent again), and a warning
        when the folder could not be listed (then none count as stored)."""
        if self.breaker.down():
            return set(), []
        try:
            return set(self._find(run_dir)), []
        except StoreError as exc:  # a 403 (no s3:ListBucket), a 503, a timeout...
            message = (f"{exc}; writing every file of the run again (identical files "
                       "already stored are accepted)")
            logger.warning(message)
            return set(), [message]

    def write_report(self, pipeline: str, run_id: str, stage: str,
                     html: str | bytes) -> WriteResult:
        """Write one stage's performance report to ``reports/<pipeline>/<run_id>/<stage>.html``."""
        rel = layout.report_file(pipeline, run_id, stage)
        data = html.encode() if isinstance(html, str) else bytes(html)
        return self._write_items([(rel, data, False)], self.location(rel))

    def write_view(self, pipeline: str, run_id: str, name: str,
                   data: str | bytes) -> WriteResult:
        """Write a view of a stored run (its trend page) into the run's folder.

        Views are drawn from what the run stored, after its manifest (which does not list
        them): drawn again, a view replaces the old one. Spooled like every write.
        """
        rel = layout.run_file(pipeline, run_id, name)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        return self._write_items([(rel, payload, False)], self.location(rel))

    def write_ack(self, pipeline: str, version: str, target: str, body: bytes) -> str:
        """Write the ack marker of ``target`` (an episode id or a run id); its location.

        Unlike a run's files, an acknowledgement is never spooled: it is a user's command,
        answered now. The write is bounded by the store's timeout and refused at once while
        the breaker holds the store down; a failure raises the ``StoreError`` leaf
        (``StoreUnreachable``, ``StoreAccessDenied``...) naming the marker.
        """
        rel = layout.ack_marker(pipeline, version, target)
        self._check_reachable()
        try:
            self._put(rel, bytes(body), False)
        except Exception as exc:
            raise self._failure(exc, f"could not write {self.location(rel)}") from None
        return self.location(rel)

    def _forget_marker(self, rel: str, spooled: bool) -> None:
        """Remove a superseded index marker (best effort: readers prefer the final one)."""
        try:
            self.spool.forget(rel)
            if not spooled:
                self.memory.forget()
                self.fs.rm_file(self._path(rel))
        except Exception as exc:
            logger.debug("superseded marker %s not removed: %r", rel, exc)

    def _write_items(self, items: list[tuple[str, bytes, bool]], location: str, *,
                     conflicts: str = "raise") -> WriteResult:
        """Put ``items`` (path, bytes, exclusive) in order; spool the rest at the first failure.

        ``conflicts="raise"``: an exclusive create that meets other bytes raises
        :class:`~prefect_dask_profiling.errors.StoreConflict` (a new run must not overwrite
        one); ``"spool"``: it is one more failure (the rest is spooled and the spooled copy
        is kept, never overwriting the stored one).
        """
        done = 0
        if self.breaker.down():
            reason = "it failed moments ago"
        else:
            try:
                for rel, data, exclusive in items:
                    self._put_checked(rel, data, exclusive)
                    done += 1
                return WriteResult(location, False, [])
            except StoreConflict as exc:
                if conflicts == "raise":
                    raise StoreConflict(f"{self.location(items[done][0])} already exists: "
                                        "runs are never overwritten (use a new run id)") \
                        from None
                reason = str(exc)
            except Exception as exc:
                reason = self._describe(exc)
                self.breaker.trip()
        return self._spool_items(items[done:], location, reason)

    def _spool_items(self, pending: list[tuple[str, bytes, bool]], location: str,
                     reason: str) -> WriteResult:
        """Keep ``pending`` in the spool; the result names them and says so (or that they are
        lost, when the spool itself cannot be written)."""
        rels = [rel for rel, _, _ in pending]
        try:
            where = self.spool.write([(rel, data) for rel, data, _ in pending])
        except OSError as exc:
            message = self._redact(f"could not write {len(pending)} file(s) to {self.url} "
                                   f"({reason}) nor to the spool ({exc}); they are lost: "
                                   f"{', '.join(rels)}")
            logger.warning(message)
            return WriteResult(location, True, [message], lost_files=rels)
        message = self._redact(
            f"could not write {len(pending)} file(s) to {self.url} ({reason}); kept them "
            f"in the spool {where}; upload later with `dask-profiling upload-pending "
            f"--store {self.url}`")
        logger.warning(message)
        return WriteResult(location, True, [message], spooled_files=rels)
