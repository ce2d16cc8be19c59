"""Reading runs: manifests and tables, pages, accepted restarts, acknowledgements, remembered
reads, on top of the index (:mod:`.index`).

Readers survive damaged runs: a run that cannot be read is skipped (or its index repaired)
with a warning naming the run and the file. Batch reads answer each run with its value or
the :class:`~prefect_dask_profiling.errors.StoreError` a single read would have raised.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Self

import pandas as pd

from prefect_dask_profiling._util import InvalidInput, validate_name
from prefect_dask_profiling.store import compression, layout
from prefect_dask_profiling.store.errors import (
    DamagedRecord,
    StoreError,
    StoreNotFound,
)
from prefect_dask_profiling.store.index import IndexReading
from prefect_dask_profiling.store.manifest import (
    Manifest,
    dump,
    parse_manifest,
    sha256,
)
from prefect_dask_profiling.store.tables import TOTALS_COLUMNS, decode_table, decode_totals

logger = logging.getLogger(__name__)

class Reading(IndexReading):
    """The read side of :class:`~prefect_dask_profiling.store.runs.RunStore`: one run's
    record, accepted restarts and acknowledgements, on top of the index (:mod:`.index`)."""

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

    # ------------------------------------------------------------------ pages
    def read_page(self, location: str) -> str:
        """The stored page at ``location`` (a stage's report, a run's trend page) as HTML:
        decompressed when it is gzip (S3 keeps pages so), as it is otherwise (a local store,
        reports stored before). ``StoreNotFound`` when it expired or was never written,
        ``DamagedRecord`` when it is damaged gzip or not UTF-8."""
        rel = self._relative(location)
        data = compression.page_bytes(self._read(rel, "page"), self.location(rel))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DamagedRecord(f"{self.location(rel)} is not a UTF-8 page: {exc}") from None

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
        """:meth:`read_table` of several runs at once: their manifests and tables in one wave
        of requests (concurrent on S3, where reading a history one file after the other
        costs a round trip each); the tables are checked against the manifests afterwards.

        Returns
        -------
        dict
            Each run id's table, or the ``StoreError`` :meth:`read_table` would have raised.
        """
        validate_name(name, "table name")
        _check_run_ids(run_ids)
        out, unread = self._remembered_tables(pipeline, run_ids, name)
        known, reads = self._manifest_reads(pipeline, unread)
        found = self._read_many({**reads, **self._table_reads(pipeline, unread, name)})
        manifests = self._manifests(pipeline, unread, known, found, copies=False)
        out.update(self._checked_tables(pipeline, unread, name, manifests, found))
        return {run_id: out[run_id] for run_id in run_ids}

    def read_totals(self, pipeline: str, run_ids: list[str]
                    ) -> dict[str, pd.DataFrame | StoreError]:
        """Each run's tasks per prefix: the ``stage, prefix, tasks, total_s`` columns of its
        tasks table, all a drift series reads of a run.

        From the ``totals`` its manifest carries: one request per run (none when the
        manifest is remembered), where its manifest and its table would be two. A run stored
        before manifests carried them is read from its table, checked as by
        :meth:`read_tables`, in a second wave; so is one whose totals are malformed (with a
        warning naming the manifest).

        Returns
        -------
        dict
            Each run id's totals, or the ``StoreError`` reading its manifest (or its table)
            raised.
        """
        _check_run_ids(run_ids)
        known, reads = self._manifest_reads(pipeline, run_ids)
        manifests = self._manifests(pipeline, run_ids, known, self._read_many(reads),
                                    copies=False)
        out: dict[str, pd.DataFrame | StoreError] = {}
        older = []
        for run_id, manifest in manifests.items():
            if isinstance(manifest, StoreError):
                out[run_id] = manifest
                continue
            try:
                out[run_id] = decode_totals(manifest["totals"], self.location(
                    layout.manifest_file(pipeline, run_id)))
            except KeyError:  # stored before manifests carried the totals
                older.append(run_id)
            except DamagedRecord as exc:
                logger.warning("run %s of pipeline %s: %s; reading its tasks table instead",
                               run_id, pipeline, exc)
                older.append(run_id)
        tables, unread = self._remembered_tables(pipeline, older, "tasks")
        found = self._read_many(self._table_reads(pipeline, unread, "tasks"))
        tables.update(self._checked_tables(pipeline, unread, "tasks", manifests, found))
        for run_id, table in tables.items():
            out[run_id] = table if isinstance(table, StoreError) else table[TOTALS_COLUMNS]
        return {run_id: out[run_id] for run_id in run_ids}

    def _remembered_tables(self, pipeline: str, run_ids: list[str], name: str
                           ) -> tuple[dict[str, pd.DataFrame | StoreError], list[str]]:
        """Copies of the remembered tables ``name`` of ``run_ids``, and the runs to read."""
        out: dict[str, pd.DataFrame | StoreError] = {}
        unread = []
        for run_id in run_ids:
            remembered = self.memory.get(("table", pipeline, run_id, name))
            if remembered is not None:
                out[run_id] = remembered.copy()
            else:
                unread.append(run_id)
        return out, unread

    def _table_reads(self, pipeline: str, run_ids: list[str], name: str) -> dict[str, str]:
        """``{path: what it is}`` of the tables ``name`` of ``run_ids``."""
        return {layout.table_file(pipeline, run_id, name): f"table {name!r} of run {run_id!r}"
                for run_id in run_ids}

    def _checked_tables(self, pipeline: str, run_ids: list[str], name: str,
                        manifests: dict[str, Manifest | StoreError],
                        found: dict[str, bytes | StoreError]
                        ) -> dict[str, pd.DataFrame | StoreError]:
        """Each run's table ``name`` from what a batch read ``found``, checked against its
        manifest (and remembered), or the ``StoreError`` :meth:`read_table` would raise."""
        out: dict[str, pd.DataFrame | StoreError] = {}
        for run_id in run_ids:
            rel = layout.table_file(pipeline, run_id, name)
            try:
                manifest = _or_raise(manifests[run_id])
                self._table_entry(pipeline, run_id, name, manifest)
                table = self._check_table(rel, name, _or_raise(found[rel]), manifest)
            except StoreError as exc:
                out[run_id] = exc
                continue
            self.memory.put(("table", pipeline, run_id, name), table)
            out[run_id] = table.copy() if self.memory.active else table
        return out

    def read_manifests(self, pipeline: str, run_ids: list[str]
                       ) -> dict[str, Manifest | StoreError]:
        """:meth:`read_manifest` of several runs at once (one wave of requests): each run id's
        manifest, or the ``StoreError`` :meth:`read_manifest` would have raised."""
        _check_run_ids(run_ids)
        known, reads = self._manifest_reads(pipeline, run_ids)
        return self._manifests(pipeline, run_ids, known, self._read_many(reads))

    def _manifest_reads(self, pipeline: str, run_ids: list[str]
                        ) -> tuple[dict[str, Manifest], dict[str, str]]:
        """The remembered manifests of ``run_ids`` (by run id), and ``{path: what it is}`` of
        the others, to read."""
        known, reads = {}, {}
        for run_id in run_ids:
            remembered = self.memory.get(("manifest", pipeline, run_id))
            if remembered is not None:
                known[run_id] = remembered
            else:
                reads[layout.manifest_file(pipeline, run_id)] = (f"run {run_id!r} of pipeline "
                                                                 f"{pipeline!r}")
        return known, reads

    def _manifests(self, pipeline: str, run_ids: list[str], known: dict[str, Manifest],
                   found: dict[str, bytes | StoreError], copies: bool = True
                   ) -> dict[str, Manifest | StoreError]:
        """Each run id's manifest: the ``known`` one, or parsed from what a batch read
        ``found`` (and remembered). ``copies``: never the remembered objects themselves (for
        manifests handed to callers)."""
        out: dict[str, Manifest | StoreError] = {}
        for run_id in run_ids:
            if run_id in known:
                out[run_id] = _copied(known[run_id]) if copies else known[run_id]
                continue
            rel = layout.manifest_file(pipeline, run_id)
            try:
                doc = parse_manifest(_or_raise(found[rel]), pipeline, run_id,
                                     self.location(rel))
            except StoreError as exc:
                out[run_id] = exc
                continue
            self.memory.put(("manifest", pipeline, run_id), doc)
            out[run_id] = _copied(doc) if copies and self.memory.active else doc
        return out

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

    # ------------------------------------------------------------------ acknowledgements
    def ack_markers(self, pipeline: str, version: str) -> dict[str, bytes | StoreError]:
        """The ack markers of ``pipeline``/``version``: ``{target: the marker's bytes, or the
        StoreError reading it}``, by target.

        One listing and one wave of reads, each within the store's timeout and behind its
        breaker like every other read. The listing's failure raises (``StoreUnreachable``
        when the store did not answer): without it no acknowledgement is known.
        """
        def listed() -> list[str]:
            return sorted(rel for rel in self._find(layout.ack_dir(pipeline, version))
                          if layout.parse_ack(rel) is not None)

        rels = self.memory.recall(("acks", pipeline, version), listed)
        found = self._read_many(dict.fromkeys(rels, "ack marker"))
        return {layout.parse_ack(rel)[2]: found[rel] for rel in rels}  # type: ignore[index]


def _check_run_ids(run_ids: list[str]) -> None:
    """``InvalidInput`` for a string where a list of run ids belongs (it would be read as
    one run id per character)."""
    if isinstance(run_ids, str):
        raise InvalidInput(f"run_ids must be a list of run ids, got the string {run_ids!r}")


def _or_raise(found: Any) -> Any:
    """``found``, unless it is the ``StoreError`` a batch read answered with."""
    if isinstance(found, StoreError):
        raise found
    return found


def _copied(manifest: Manifest) -> Manifest:
    """A deep copy of a remembered manifest, for a caller that may change it.

    Through pickle, not :func:`copy.deepcopy`: a manifest is plain parsed JSON, which pickle
    copies about four times faster (deepcopy's memo and dispatch run in Python for each of
    its thousands of values; a judgement copies every manifest of its history window).
    """
    return pickle.loads(pickle.dumps(manifest, protocol=pickle.HIGHEST_PROTOCOL))
