"""Reading runs: the index, manifests and tables, accepted restarts, acknowledgements,
remembered reads.

Readers survive damaged runs: a run that cannot be read is skipped (or its index repaired)
with a warning naming the run and the file. Batch reads answer each run with its value or
the :class:`~prefect_dask_profiling.errors.StoreError` a single read would have raised.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import pandas as pd

from prefect_dask_profiling._util import InvalidInput, positive_int, validate_name
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
from prefect_dask_profiling.store.tables import TOTALS_COLUMNS, decode_table, decode_totals

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

    def list_runs(self, pipeline: str, version: str | None = None, *,
                  newest: int | None = None, oldest: int | None = None,
                  counting: Collection[str] | None = None, since: str | None = None,
                  before: str | None = None) -> list[dict]:
        """Runs of ``pipeline`` (of ``version``, if given), newest first:
        ``[{run_id, version, status}]``.

        From the index markers plus a listing of the run folders, without reading any
        manifest — except to repair damage, each with a warning naming the run and the file:

        * a malformed marker is skipped;
        * a marker whose run folder is gone is skipped;
        * a run folder whose manifest exists but whose marker was never written (its writer
          stopped between the two writes) is listed from its manifest, and its marker
          written again; a damaged manifest there makes the run skipped.

        Parameters
        ----------
        pipeline, version
            Whose runs.
        newest, oldest
            Only the newest runs down to the ``newest``-th one whose status is in
            ``counting`` (or the oldest up to the ``oldest``-th one); needs ``version``. Reads
            the version's index partitions (one per month) newest (oldest) first until the
            window is complete, so a long history costs O(the window), not O(stored runs);
            repairs look only at run folders of the window.
        counting
            Statuses that count towards ``newest``/``oldest`` (default: every status).
        since, before
            Only runs with ``since <= run_id < before``.
        """
        for value, what in ((version, "version"), (since, "since"), (before, "before")):
            if value is not None:
                validate_name(value, what)
        if newest is None and oldest is None:
            runs = self.memory.recall(("runs", pipeline), lambda: self._list_all_runs(pipeline))
            return [dict(r) for r in runs if (version is None or r["version"] == version)
                    and _within(r["run_id"], since, before)]
        if version is None or (newest is not None and oldest is not None):
            raise InvalidInput("newest= or oldest= (not both) needs a version")
        count = positive_int(newest if newest is not None else oldest,
                             "newest" if newest is not None else "oldest")
        window = _Window(count, newest is not None,
                         None if counting is None else frozenset(counting), since, before)
        return [dict(r) for r in self._list_window(pipeline, version, window)]

    def _list_window(self, pipeline: str, version: str, window: _Window) -> list[dict]:
        """The runs of ``window`` (see :meth:`list_runs`), newest first."""
        months, flat = self._version_index(pipeline, version)
        entries: dict[str, dict] = {}
        _add_markers(entries, flat, self.location)  # written before the partitions: all of them
        if layout.UNDATED in months:
            _add_markers(entries, self._index_partition(pipeline, version, layout.UNDATED),
                         self.location)
        dated = sorted((m for m in months if m != layout.UNDATED and window.may_hold(m)),
                       reverse=window.newest_first)
        for month in dated:
            cut, full = window.cut(entries.values())
            if full and window.beyond(cut[-1]["run_id"], month):
                break
            _add_markers(entries, self._index_partition(pipeline, version, month),
                         self.location)
        cut, _ = window.cut(entries.values())
        if not cut:
            return []
        ids = [e["run_id"] for e in cut]
        lo, hi = min(ids), (max(ids) if not window.newest_first else window.before)
        runs = {e["run_id"]: e for e in cut}
        folders = self._run_folders(pipeline, lo, hi)
        for run_id in sorted(set(runs) - folders):
            logger.warning("skipping run %s of pipeline %s: its index marker is in %s but its "
                           "folder %s is gone", run_id, pipeline,
                           self.location(layout.index_dir(pipeline, version)),
                           self.location(layout.run_dir(pipeline, run_id)))
            del runs[run_id]
        candidates = {r for r in folders - set(entries) if r >= lo}
        for run_id in sorted(candidates - self._indexed_elsewhere(pipeline, version, candidates)):
            entry = self._unindexed(pipeline, run_id)
            if entry is not None and entry["version"] == version \
                    and _within(run_id, window.since, window.before):
                runs[run_id] = entry
        return sorted(runs.values(), key=lambda r: r["run_id"], reverse=True)

    def _indexed_elsewhere(self, pipeline: str, version: str, run_ids: set[str]) -> set[str]:
        """Those of ``run_ids`` with an index marker of another version (read from the other
        versions' partitions of the same months only; nothing is listed for no runs)."""
        if not run_ids:
            return set()
        months = {layout.index_partition(r) for r in run_ids}
        found: dict[str, dict] = {}
        for other in self._children(layout.index_dir(pipeline)):
            if other == version or not layout.valid_names(other):
                continue
            listed, flat = self._version_index(pipeline, other)
            found.update(flat)
            for month in months & set(listed):
                found.update(self._index_partition(pipeline, other, month))
        entries: dict[str, dict] = {}
        _add_markers(entries, found, self.location)
        return run_ids & set(entries)

    def _version_index(self, pipeline: str, version: str) -> tuple[list[str], dict[str, dict]]:
        """One listing of ``index/<pipeline>/<version>/``: its partitions, and the markers
        written there before the partitions (``{path: info}``)."""
        def listed() -> tuple[list[str], dict[str, dict]]:
            rel = layout.index_dir(pipeline, version)
            months, flat = [], {}
            for name, info in self._listing(rel).items():
                if info.get("type") == "directory":
                    if layout.is_partition(name):
                        months.append(name)
                    else:
                        logger.warning("skipping %s: not an index partition (YYYY-MM)",
                                       self.location(f"{rel}/{name}"))
                else:
                    flat[f"{rel}/{name}"] = info
            return sorted(months), flat

        return self.memory.recall(("index", pipeline, version), listed)

    def _index_partition(self, pipeline: str, version: str, month: str) -> dict[str, dict]:
        """The markers of one index partition (``{path: info}``), remembered like listings."""
        rel = layout.index_partition_dir(pipeline, version, month)
        return self.memory.recall(("index", pipeline, version, month), lambda: self._find(rel))

    def _run_folders(self, pipeline: str, lo: str, hi: str | None) -> set[str]:
        """Run folders of ``pipeline`` named ``lo <= name <= hi`` (``hi=None``: no bound).

        Inside :meth:`remembering_reads` a listing answers every later window it covers: the
        baseline's newest runs and the drift series' mostly share their months.
        """
        covers = self.memory.get(("folders", pipeline)) or ()
        names = next((found for start, end, found in covers if start <= lo
                      and (end is None or (hi is not None and hi <= end))), None)
        if names is None:
            cover = self._list_run_folders(pipeline, lo, hi)
            self.memory.put(("folders", pipeline), (*covers, cover))
            names = cover[2]
        return {n for n in names if lo <= n and (hi is None or n <= hi)
                and layout.valid_names(n)}

    def _list_run_folders(self, pipeline: str, lo: str, hi: str | None
                          ) -> tuple[str, str | None, tuple[str, ...]]:
        """One listing of the run folders of ``pipeline`` covering ``lo``..``hi``: the names it
        covers from and to (``None``: no end), and the folder names it found (unchecked:
        only those of a window are checked, not 100,000 of a local store).

        On S3 one listing from the start of ``lo``'s month partition on (``StartAfter``),
        stopped past ``hi``: the folders of a window's months, not of the whole history.
        Elsewhere one listing of every folder, names only.
        """
        rel = layout.pipeline_runs(pipeline)
        if self.kind == "s3":
            start = layout.partition_start(lo)
            _, names = self._s3_list(rel, folders=True, start_after=start, stop=hi)
            return start, hi, tuple(names)
        if self._local:  # names only: no stat, no path handling per folder
            self._check_reachable()
            try:
                names = os.listdir(self._path(rel))
            except (FileNotFoundError, NotADirectoryError):
                names = []
            except OSError as exc:
                raise self._failure(exc, f"could not list {self.location(rel)}") from None
        else:
            names = self._children(rel)
        return "", None, tuple(names)

    def _list_all_runs(self, pipeline: str) -> list[dict]:
        """Every run of ``pipeline``, newest first (see :meth:`list_runs`)."""
        runs: dict[str, dict] = {}
        _add_markers(runs, self._find(layout.index_dir(pipeline)), self.location)
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


@dataclass(frozen=True)
class _Window:
    """Which runs :meth:`Reading.list_runs` answers with ``newest=``/``oldest=``."""

    count: int
    newest_first: bool
    counting: frozenset[str] | None
    since: str | None
    before: str | None

    def may_hold(self, month: str) -> bool:
        """Whether partition ``month`` may hold runs within ``since``/``before``."""
        key = layout.month_key(month)
        return ((self.since is None or key >= self.since[:6])
                and (self.before is None or key <= self.before[:6]))

    def cut(self, entries: Iterable[dict]) -> tuple[list[dict], bool]:
        """The known runs of the window, in window order, and whether it is full (its
        ``count``-th counting run is among them)."""
        ordered = sorted((e for e in entries if _within(e["run_id"], self.since, self.before)),
                         key=lambda e: e["run_id"], reverse=self.newest_first)
        seen = 0
        for i, entry in enumerate(ordered):
            if self.counting is None or entry["status"] in self.counting:
                seen += 1
                if seen == self.count:
                    return ordered[:i + 1], True
        return ordered, False

    def beyond(self, run_id: str, month: str) -> bool:
        """Whether every run of partition ``month`` lies past ``run_id`` (the window's last),
        so the window is complete without listing it."""
        key = layout.month_key(month)
        return run_id[:6] > key if self.newest_first else run_id < key


def _within(run_id: str, since: str | None, before: str | None) -> bool:
    return (since is None or run_id >= since) and (before is None or run_id < before)


def _add_markers(runs: dict[str, dict], found: dict[str, dict],
                 location: Callable[[str], str]) -> None:
    """Add the index markers in ``found`` (``{path: info}``) to ``runs`` (by run id): a final
    status replaces a provisional one; malformed markers are skipped with a warning."""
    for rel, info in sorted(found.items()):
        entry = layout.parse_marker(rel, STATUSES)
        if not isinstance(entry, str) and info.get("size") == 0:
            entry = "empty marker"
        if isinstance(entry, str):
            logger.warning("skipping malformed index marker %s: %s", location(rel), entry)
            continue
        previous = runs.get(entry.run_id)
        if previous is None or previous["status"] in _PROVISIONAL_STATUSES:
            runs[entry.run_id] = {"run_id": entry.run_id, "version": entry.version,
                                  "status": entry.status}


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
