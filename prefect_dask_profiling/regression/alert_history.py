"""Alert episodes from a store: the judged runs' verdict tables, the ack markers, the stats.

The pure lifecycle is :mod:`.alerts`; this module reads what it needs from a
:class:`~prefect_dask_profiling.store.runs.RunStore` and writes acknowledgements:

* **nights**: the ``regression`` table of the newest ``runs`` judged runs (status
  ``healthy``, ``regressed`` or ``suspected``; failed, incomplete and unjudged runs hold
  partial times and are skipped) of one pipeline and version, read in one wave;
* **acks**: one small JSON marker per acknowledgement at
  ``acks/<pipeline>/<version>/<target>``, ``target`` an episode id or a run id. The path is
  built by :func:`~prefect_dask_profiling.store.layout.ack_marker`; markers are read and
  written through the store's own timed, breaker-guarded calls
  (:meth:`~prefect_dask_profiling.store.reads.Reading.ack_markers`,
  :meth:`~prefect_dask_profiling.store.writing.Writing.write_ack`), so a store that is down
  fails them as it fails every other read: ``StoreUnreachable``, not a generic error.
"""

from __future__ import annotations

import getpass
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import pandas as pd

from prefect_dask_profiling.regression.alerts import (
    Ack,
    AlertEvent,
    Book,
    Night,
    replay,
)
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.errors import StoreUnavailable
from prefect_dask_profiling.store.runs import RunStore, StoreError

logger = logging.getLogger(__name__)

__all__ = ["ACKS", "JUDGED_STATUSES", "LOOKBACK_RUNS", "Stats", "ack_marker", "acknowledge",
           "episodes_frame", "episodes_of", "load_acks", "load_nights", "stats"]

ACKS = layout.ACKS
# Runs whose verdicts say something: a failed or incomplete run holds partial times.
JUDGED_STATUSES = ("healthy", "regressed", "suspected")
# How many judged runs are replayed by default: an episode open longer than this is seen
# from the window's first run (a new id); two months of nightly runs.
LOOKBACK_RUNS = 60


def ack_marker(pipeline: str, version: str, target: str) -> str:
    """``acks/<pipeline>/<version>/<target>``: one acknowledgement (episode or run id)."""
    return layout.ack_marker(pipeline, version, target)


def load_acks(store: RunStore, pipeline: str, version: str) -> list[Ack]:
    """Every acknowledgement of ``pipeline``/``version``, by target.

    Read through the store's timed, breaker-guarded reads
    (:meth:`~prefect_dask_profiling.store.reads.Reading.ack_markers`): a store that cannot
    be used raises its ``StoreUnavailable`` leaf (the command line's exit 4), for the
    listing and for any marker. A marker that is damaged, or gone since the listing, still
    names its target and counts (with a warning).
    """
    acks = []
    for target, found in store.ack_markers(pipeline, version).items():
        if isinstance(found, StoreUnavailable):
            raise found
        doc = _ack_doc(found)
        if doc is None:
            logger.warning("ack marker %s unreadable (%s): counted by its name",
                           store.location(ack_marker(pipeline, version, target)), found)
            doc = {}
        acks.append(Ack(target=target, at=str(doc.get("at", "")), by=str(doc.get("by", ""))))
    return acks


def _ack_doc(found: bytes | StoreError) -> dict | None:
    """The marker's JSON object, or ``None`` when it cannot be read as one."""
    if isinstance(found, StoreError):
        return None
    try:
        doc = json.loads(found)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def acknowledge(store: RunStore, pipeline: str, version: str, target: str,
                note: str = "") -> Ack:
    """Write an ack marker for ``target`` (an episode id ``ep-…`` or a run id).

    Through the store's timed, breaker-guarded write
    (:meth:`~prefect_dask_profiling.store.writing.Writing.write_ack`); a failure raises the
    ``StoreError`` leaf naming the marker (never spooled).
    """
    ack_marker(pipeline, version, target)  # bad names fail before anything is sent
    try:
        by = getpass.getuser()
    except Exception:  # no user name in some containers
        by = ""
    ack = Ack(target=target, at=datetime.now(UTC).isoformat(), by=by)
    body = json.dumps({"target": target, "at": ack.at, "by": by, "note": note}).encode()
    store.write_ack(pipeline, version, target, body)
    return ack


def load_nights(store: RunStore, pipeline: str, version: str,
                runs: int = LOOKBACK_RUNS) -> list[Night]:
    """The newest ``runs`` judged runs of ``pipeline``/``version`` with a verdict table,
    oldest first; runs whose table cannot be read are skipped with a warning."""
    entries = [e for e in store.list_runs(pipeline, version, newest=runs,
                                          counting=JUDGED_STATUSES)
               if e["status"] in JUDGED_STATUSES][:runs]
    ids = sorted(e["run_id"] for e in entries)
    nights = []
    for run_id, table in store.read_tables(pipeline, ids, "regression").items():
        if isinstance(table, StoreError):
            logger.warning("alerts of %s: skipping run %s: %s", pipeline, run_id, table)
            continue
        nights.append(Night(run_id, pipeline, version, table))
    return nights


def episodes_of(store: RunStore, pipeline: str, version: str,
                rule: RegressionRule | None = None, runs: int = LOOKBACK_RUNS
                ) -> tuple[Book, list[AlertEvent]]:
    """The episodes of ``pipeline``/``version`` recomputed from the store, and every event."""
    rule = rule if rule is not None else RegressionRule()
    return replay(load_nights(store, pipeline, version, runs),
                  load_acks(store, pipeline, version), rule)


@dataclass(frozen=True)
class Stats:
    """How a pipeline's episodes ended: the precision of the rule on this pipeline.

    Attributes
    ----------
    confirmed
        Episodes that failed a run (confirmed or conclusive), whatever happened next.
    cleared
        Suspicions that did not persist: alarms that confirmation kept from failing a run.
    acknowledged
        Episodes someone acknowledged.
    resolved
        Confirmed episodes that went back to the baseline on their own.
    open
        Episodes still open.
    """

    pipeline: str
    version: str
    runs: int
    confirmed: int
    cleared: int
    acknowledged: int
    resolved: int
    open: int

    @property
    def suspected_precision(self) -> float:
        """Share of flagged prefixes that were real: confirmed / (confirmed + cleared)."""
        total = self.confirmed + self.cleared
        return self.confirmed / total if total else float("nan")


def stats(book: Book, pipeline: str, version: str, runs: int) -> Stats:
    """Count ``book``'s episodes by how they ended."""
    eps = book.episodes
    return Stats(pipeline, version, runs,
                 confirmed=sum(e.confirmed_run is not None for e in eps),
                 cleared=sum(e.state == "cleared" for e in eps),
                 acknowledged=sum(e.acknowledged for e in eps),
                 resolved=sum(e.state == "resolved" for e in eps),
                 open=sum(e.open for e in eps))


def episodes_frame(book: Book) -> pd.DataFrame:
    """The episodes as a table, newest first (for the CLI)."""
    columns = ["id", "pipeline", "state", "stage", "prefix", "metric", "start_run", "last_run",
               "confirmed_run", "ended_run", "acknowledged", "nights", "peak_ratio",
               "last_ratio", "version"]
    rows = [e.to_json() for e in sorted(book.episodes, key=lambda e: e.start_run,
                                         reverse=True)]
    return pd.DataFrame(rows, columns=columns)
