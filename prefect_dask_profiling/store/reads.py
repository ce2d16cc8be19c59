"""Reading runs: the index, manifests and tables, accepted restarts, remembered reads.

Readers survive damaged runs: a run that cannot be read is skipped (or its index repaired)
with a warning naming the run and the file. Batch reads answer each run with its value or
the :class:`~prefect_dask_profiling.errors.StoreError` a single read would have raised.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Self

import pandas as pd

from prefect_dask_profiling._util import InvalidInput, validate_name
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.access import StoreAccess
from prefect_dask_profiling.store.errors import (
    DamagedRecord,
    StoreError,
    StoreNotFound,
)
from prefect_dask_profiling.store.manifest import (
    STATUSES,
    Manifest,
    dump,
    marker_doc,
    parse_manifest,
    sha256,
)
from prefect_dask_profiling.store.tables import decode_table

logger = logging.getLogger(__name__)

# Statuses a later marker of the same run replaces (the run's end wrote a final one).
_PROVISIONAL_STATUSES = ("incomplete", "unjudged")


class Reading(StoreAccess):
    """The read side of :class:`~prefect_dask_profiling.store.runs.RunStore`."""

    # ------------------------------------------------------------------ remembered reads
    @contextlib.contextmanager
    def remembering_reads(self) -> Iterator[Self]:
        """Within the block, answer a repeated listing or read from memory.

        Judging a run reads the history twice (the baseline, then the drift series) from
        the same listing and partly the same tables; with thousands of stored runs the
        listing is what costs (on S3 it pages through every index key). Any write or delete
        through this store forgets what was read; callers get copies, never the memory.
        """
        with self.memory.block():
            yield self

    # ------------------------------------------------------------------ the index
    def list_pipelines(self) -> list[str]:
        """Pipelines with at least one index marker or run folder."""
        names = {name for name in self._children(layout.INDEX) + self._children(layout.RUNS)
                 if layout.valid_names(name)}
        return sorted(names)

    def list_runs(self, pipeline: str, version: str | None = None) -> list[dict]:
        """Runs of ``pipeline`` (of ``version``, if given), newest first:
        ``[{run_id, version, status}]``.

        From the index markers plus one listing of the run folders, without reading any
        manifest — except to repair damage, each with a warning naming the run and the file:

        * a malformed marker is skipped;
        * a marker whose run folder is gone is skipped;
        * a run folder whose manifest exists but whose marker was never written (its writer
          stopped between the two writes) is listed from its manifest, and its marker
          written again; a damaged manifest there makes the run skipped.
        """
        if version is not None:
            validate_name(version, "version")
        runs = self.memory.recall(("runs", pipeline), lambda: self._list_all_runs(pipeline))
        return [dict(r) for r in runs if version is None or r["version"] == version]

    def _list_all_runs(self, pipeline: str) -> list[dict]:
        """Every run of ``pipeline``, newest first (see :meth:`list_runs`)."""
        base = layout.index_dir(pipeline)
        runs: dict[str, dict] = {}
        for rel, info in self._find(base).items():
            entry = layout.parse_marker(rel, STATUSES)
            if not isinstance(entry, str) and info.get("size") == 0:
                entry = "empty marker"
            if isinstance(entry, str):
                logger.warning("skipping malformed index marker %s: %s", self.location(rel),
                               entry)
                continue
            previous = runs.get(entry.run_id)
            if previous is None or previous["status"] in _PROVISIONAL_STATUSES:
                runs[entry.run_id] = {"run_id": entry.run_id, "version": entry.version,
                                      "status": entry.status}
        folders = {name for name in self._children(layout.pipeline_runs(pipeline))
                   if layout.valid_names(name)}
        for run_id in sorted(set(runs) - folders):
            logger.warning("skipping run %s of pipeline %s: its index marker is in %s but its "
                           "folder %s is gone", run_id, pipeline,
                           self.location(layout.index_dir(pipeline, runs[run_id]["version"])),
                           self.location(layout.run_dir(pipeline, run_id)))
            del runs[run_id]
        for run_id in sorted(folders - set(runs)):
            entry = self._unindexed(pipeline, run_id)
            if entry is not None:
                runs[run_id] = entry
        return sorted(runs.values(), key=lambda r: r["run_id"], reverse=True)

    def _unindexed(self, pipeline: str, run_id: str) -> dict | None:
        """A run folder without index marker: its entry from its manifest (marker repaired),
        or ``None`` when it has no manifest (still being written, or never completed)."""
        rel = layout.manifest_file(pipeline, run_id)
        try:
            data = self.fs.cat_file(self._path(rel), **self._kw)
        except FileNotFoundError:
            logger.debug("run folder %s has no manifest (yet)", self.location(rel))
            return None
        except Exception as exc:
            self.breaker.trip_if_unreachable(exc)
            logger.warning("skipping run %s of pipeline %s: could not read %s: %s", run_id,
                           pipeline, self.location(rel), self._describe(exc))
            return None
        try:
            doc = parse_manifest(data, pipeline, run_id, self.location(rel))
            layout.index_marker(pipeline, doc["version"], run_id, doc["status"])
        except (StoreError, ValueError) as exc:
            logger.warning("skipping run %s of pipeline %s: %s", run_id, pipeline, exc)
            return None
        marker = layout.index_marker(pipeline, doc["version"], run_id, doc["status"])
        try:
            self._put(marker, dump(marker_doc(doc)), False)
            done = f"wrote its index marker {self.location(marker)}"
        except Exception as exc:
            done = f"could not write its index marker ({self._describe(exc)})"
        logger.warning("run %s of pipeline %s has a manifest %s but no index marker (its writer "
                       "stopped between the two writes): listed from its manifest; %s", run_id,
                       pipeline, self.location(rel), done)
        return {"run_id": run_id, "version": doc["version"], "status": doc["status"]}

    # ------------------------------------------------------------------ one run's record
    def read_manifest(self, pipeline: str, run_id: str) -> Manifest:
        """The run's manifest; ``StoreError`` naming the file if missing, not UTF-8 JSON,
        malformed or of another schema."""
        return _or_raise(self.read_manifests(pipeline, [run_id])[run_id])

    def read_table(self, pipeline: str, run_id: str, name: str = "tasks") -> pd.DataFrame:
        """One of the run's CSV tables, checked against the size and sha256 in its manifest.

        ``StoreError`` naming the run and the file when the table is missing, truncated,
        changed, not UTF-8, not CSV, or (``tasks``) lacks columns or holds non-numbers.
        """
        return _or_raise(self.read_tables(pipeline, [run_id], name)[run_id])

    def read_tables(self, pipeline: str, run_ids: list[str], name: str = "tasks"
                    ) -> dict[str, pd.DataFrame | StoreError]:
        """:meth:`read_table` of several runs at once: their manifests in one wave of
        requests, then their tables in another (concurrent on S3, where reading a history
        one file after the other costs a round trip each).

        Returns
        -------
        dict
            Each run id's table, or the ``StoreError`` :meth:`read_table` would have raised.
        """
        validate_name(name, "table name")
        manifests = self.read_manifests(pipeline, run_ids)
        out: dict[str, pd.DataFrame | StoreError] = {}
        wanted: dict[str, tuple[str, Manifest]] = {}
        for run_id, manifest in manifests.items():
            remembered = self.memory.get(("table", pipeline, run_id, name))
            if isinstance(manifest, StoreError):
                out[run_id] = manifest
            elif remembered is not None:
                out[run_id] = remembered.copy()
            else:
                try:
                    wanted[run_id] = (self._table_entry(pipeline, run_id, name, manifest),
                                      manifest)
                except StoreError as exc:
                    out[run_id] = exc
        found = self._read_many({rel: f"table {name!r} of run {run_id!r}"
                                 for run_id, (rel, _) in wanted.items()})
        for run_id, (rel, manifest) in wanted.items():
            try:
                data = found[rel]
                if isinstance(data, StoreError):
                    raise data
                table = self._check_table(rel, name, data, manifest)
            except StoreError as exc:
                out[run_id] = exc
                continue
            self.memory.put(("table", pipeline, run_id, name), table)
            out[run_id] = table.copy() if self.memory.active else table
        return {run_id: out[run_id] for run_id in run_ids}

    def read_manifests(self, pipeline: str, run_ids: list[str]
                       ) -> dict[str, Manifest | StoreError]:
        """:meth:`read_manifest` of several runs at once (one wave of requests): each run id's
        manifest, or the ``StoreError`` :meth:`read_manifest` would have raised."""
        if isinstance(run_ids, str):
            raise InvalidInput(f"run_ids must be a list of run ids, got the string {run_ids!r}")
        out: dict[str, Manifest | StoreError] = {}
        wanted = {}
        for run_id in run_ids:
            remembered = self.memory.get(("manifest", pipeline, run_id))
            if remembered is not None:
                out[run_id] = copy.deepcopy(remembered)
            else:
                wanted[layout.manifest_file(pipeline, run_id)] = run_id
        found = self._read_many({rel: f"run {run_id!r} of pipeline {pipeline!r}"
                                 for rel, run_id in wanted.items()})
        for rel, run_id in wanted.items():
            try:
                data = found[rel]
                if isinstance(data, StoreError):
                    raise data
                doc = parse_manifest(data, pipeline, run_id, self.location(rel))
            except StoreError as exc:
                out[run_id] = exc
                continue
            self.memory.put(("manifest", pipeline, run_id), doc)
            out[run_id] = copy.deepcopy(doc) if self.memory.active else doc
        return {run_id: out[run_id] for run_id in run_ids}

    def _table_entry(self, pipeline: str, run_id: str, name: str, manifest: Manifest) -> str:
        """The table's path, if the manifest lists it."""
        rel = layout.table_file(pipeline, run_id, name)
        if not isinstance(manifest["files"].get(rel.rsplit("/", 1)[1]), dict):
            raise StoreNotFound(f"run {run_id!r} of pipeline {pipeline!r} has no table {name!r}")
        return rel

    def _check_table(self, rel: str, name: str, data: bytes, manifest: Manifest
                     ) -> pd.DataFrame:
        """The table from its bytes, checked against the size and sha256 in the manifest."""
        entry = manifest["files"][rel.rsplit("/", 1)[1]]
        where = self.location(rel)
        if len(data) != entry.get("size") or sha256(data) != entry.get("sha256"):
            raise DamagedRecord(f"{where} is truncated or changed: {len(data)} bytes, the "
                                f"manifest says {entry.get('size')} bytes with another checksum")
        return decode_table(data, name, where)

    # ------------------------------------------------------------------ baseline restarts
    def accept(self, pipeline: str, version: str, run_id: str) -> None:
        """Mark ``run_id`` as the run where the baseline of ``pipeline``/``version`` restarts."""
        marker = layout.accepted_marker(pipeline, version, run_id)
        if not self._exists(layout.manifest_file(pipeline, run_id)):
            raise StoreNotFound(f"unknown run {run_id!r} of pipeline {pipeline!r} in {self.url}")
        body = dump({"run_id": run_id, "accepted": datetime.now(UTC).isoformat()})
        try:
            self._put(marker, body, False)
        except Exception as exc:
            raise self._failure(exc, f"could not write to {self.url}") from None

    def accepted(self, pipeline: str, version: str) -> list[str]:
        """Accepted run ids of ``pipeline``/``version``, newest first."""
        def listed() -> list[str]:
            found = [layout.parse_accepted(rel)
                     for rel in self._find(layout.accepted_dir(pipeline, version))]
            return sorted((f[2] for f in found if f is not None), reverse=True)

        return list(self.memory.recall(("accepted", pipeline, version), listed))


def _or_raise(found: Any) -> Any:
    """``found``, unless it is the ``StoreError`` a batch read answered with."""
    if isinstance(found, StoreError):
        raise found
    return found
