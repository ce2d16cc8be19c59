"""Reading the run index: which runs a store holds, per pipeline and version, in windows.

The index is one small marker per run (``index/<pipeline>/<version>/<month>/...``); a run
folder with no marker (its end was never recorded) is found and its index repaired. The
read side of :class:`~prefect_dask_profiling.store.runs.RunStore` builds on it
(:class:`~prefect_dask_profiling.store.reads.Reading`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from prefect_dask_profiling._util import InvalidInput, positive_int, validate_name
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.access import StoreAccess
from prefect_dask_profiling.store.errors import StoreError
from prefect_dask_profiling.store.manifest import STATUSES, dump, marker_doc, parse_manifest

logger = logging.getLogger(__name__)

# Statuses a later marker of the same run replaces (the run's end wrote a final one).
_PROVISIONAL_STATUSES = ("incomplete", "unjudged")


class IndexReading(StoreAccess):
    """Listing the runs of a store: the index side of :class:`~.reads.Reading`."""

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

    def run_entry(self, pipeline: str, run_id: str) -> dict | None:
        """The entry of ``run_id`` that :meth:`list_runs` of ``pipeline`` holds, or ``None``.

        What the full listing says of this one run, from the run's month only: one listing
        of the pipeline's versions, each version's listing (and its flat markers) and its
        partition of the run's month, and the run folders of that month; so finding a run
        costs O(versions) requests, not O(stored runs). Damage is handled as there: a marker
        whose run folder is gone is skipped, a folder whose marker was never written is
        listed from its manifest (and its marker written again), each with a warning.
        """
        validate_name(run_id, "run_id")
        month = layout.index_partition(run_id)
        found: dict[str, dict] = {}
        for version in self._children(layout.index_dir(pipeline)):
            if not layout.valid_names(version):
                continue
            months, flat = self._version_index(pipeline, version)
            found.update(flat)
            if month in months:
                found.update(self._index_partition(pipeline, version, month))
        entries: dict[str, dict] = {}
        _add_markers(entries, {rel: info for rel, info in found.items()
                               if _marker_run(rel) == run_id}, self.location)
        entry = entries.get(run_id)
        folder = run_id in self._run_folders(pipeline, run_id, run_id)
        if entry is not None and not folder:
            logger.warning("skipping run %s of pipeline %s: its index marker is in %s but its "
                           "folder %s is gone", run_id, pipeline,
                           self.location(layout.index_dir(pipeline, entry["version"])),
                           self.location(layout.run_dir(pipeline, run_id)))
            return None
        if entry is None and folder:
            return self._unindexed(pipeline, run_id)
        return entry

    def newest_run(self, pipeline: str, version: str | None = None) -> dict | None:
        """The first entry of :meth:`list_runs` (``pipeline``, ``version``), or ``None``.

        The newest run through the index window (:meth:`list_runs` with ``newest=1``: the
        newest partitions, the run folders of their months) of ``version``, or of each
        version whose index reaches the newest month (the others hold older runs only), so
        it costs O(versions) requests, not O(stored runs). Where the window cannot answer
        for the whole listing — the newest marker's folder is gone, or a run folder is newer
        than the newest run (its marker never written: the full listing repairs it) — the
        full listing answers, as before.
        """
        if version is not None:
            validate_name(version, "version")
        newest: dict | None = None
        for name in [version] if version is not None else self._newest_versions(pipeline):
            window = self.list_runs(pipeline, name, newest=1)
            if not window:  # no markers, or the newest one's folder is gone
                newest = None
                break
            if newest is None or window[0]["run_id"] > newest["run_id"]:
                newest = window[0]
        if newest is not None and (version is not None or not any(
                name > newest["run_id"]
                for name in self._run_folders(pipeline, newest["run_id"], None))):
            return newest
        runs = self.list_runs(pipeline, version)
        return runs[0] if runs else None

    def _newest_versions(self, pipeline: str) -> list[str]:
        """The versions of ``pipeline`` that may hold its newest indexed run: those with a
        partition of the newest month, and any with markers outside dated partitions
        (written before the partitions, or undated run ids). One listing of each version."""
        latest: dict[str, str] = {}
        for name in self._children(layout.index_dir(pipeline)):
            if not layout.valid_names(name):
                continue
            months, flat = self._version_index(pipeline, name)
            dated = [m for m in months if m != layout.UNDATED]
            latest[name] = "~" if flat or layout.UNDATED in months else max(dated, default="")
        top = max((m for m in latest.values() if m != "~"), default="")
        return [name for name, month in latest.items() if month == "~" or month == top]

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

        A backend that lists from a name on (S3's ``StartAfter``) lists from the start of
        ``lo``'s month partition, stopped past ``hi``: the folders of a window's months, not
        of the whole history. Elsewhere one listing of every folder, names only.
        """
        start = layout.partition_start(lo)
        folders = self._listed(layout.pipeline_runs(pipeline),
                               lambda rel: self.backend.folders(rel, start, hi))
        if folders.bounded:
            return start, hi, tuple(folders.names)
        return "", None, tuple(folders.names)

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


def _marker_run(rel: str) -> str:
    """The run id an index marker's path names (its file name without the status)."""
    return rel.rpartition("/")[2].rpartition(".")[0]


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
