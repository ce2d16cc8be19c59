"""The baseline of a run: which stored nights it is compared against, and loading them.

Which nights count is the nights' **standing**, derived by the one state machine of a
pipeline version's history (:mod:`.alerts`: :meth:`~.alerts.Book.baseline_runs`); this
module reads the newest of them:

* same pipeline and version — prefixes change with the code, so other versions never count;
* judged nights whose standing counts in the family (``time`` here): a night flagged in a
  time metric is left out unless its suspicion was cleared; a memory-only night counts;
* an accepted run (``dask-profiling accept RUN``) restarts the baseline: only it and newer
  nights count, and it counts even though it was flagged regressed;
* a night whose table or manifest is damaged or gone is left out and named (it costs at
  most itself: the next older night takes its place); a history that cannot be listed, or
  a store that does not answer, raises :class:`HistoryUnavailable`: a judgement against a
  history thinned by an outage would be silently wrong, so the caller leaves the run
  unjudged, with the reason.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

import pandas as pd

from prefect_dask_profiling._util import positive_int
from prefect_dask_profiling.errors import HistoryUnavailable
from prefect_dask_profiling.regression.alert_history import damaged, load_acks, read_nights
from prefect_dask_profiling.regression.alerts import Book, replay
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, StoreError

logger = logging.getLogger(__name__)

HISTORY_COLUMNS = ["run_id", *TASKS_COLUMNS]


@dataclass
class Baseline:
    """The runs a new run is compared against.

    Attributes
    ----------
    history
        Long table: ``run_id`` plus the ``tasks.csv`` columns of every run used.
    runs
        The run ids used, oldest to newest.
    version
        The pipeline version the baseline belongs to.
    note
        Human-readable remarks (new version, restart at an accepted run, runs left out...).
    skipped
        ``(run_id, reason)`` of nights left out because they cannot be read (damaged or
        gone): named in the note and in the judged run's manifest (``skipped``).
    """

    history: pd.DataFrame
    runs: list[str]
    version: str
    note: str = ""
    skipped: list[tuple[str, str]] = field(default_factory=list)


def load_baseline(store: RunStore, pipeline: str, version: str,
                  n: int = RegressionRule.history, exclude_run_id: str | None = None,
                  before: str | None = None) -> Baseline:
    """The time baseline of a run of ``pipeline``/``version``: the newest ``n`` nights whose
    standing counts, read from the store.

    Parameters
    ----------
    store
        Where the runs are.
    pipeline, version
        Whose runs.
    n
        How many runs at most (:attr:`RegressionRule.history`).
    exclude_run_id
        A run never to include (the run being judged).
    before
        Only runs older than this run id count (to judge an older run against its own past).

    Raises
    ------
    HistoryUnavailable
        When the history cannot be listed, or the store does not answer for a night it
        needs. A damaged night is left out, named in :attr:`Baseline.skipped` and a warning.
    """
    positive_int(n, "n")
    try:
        restart = restart_of(store.accepted(pipeline, version), before)
        acks = load_acks(store, pipeline, version)
    except StoreError as exc:
        raise HistoryUnavailable(f"the history of {pipeline} {version} could not be "
                                 f"listed: {exc}") from exc
    found = read_nights(store, pipeline, version, before=before, since=restart)
    nights = [night for night in found.nights if night.run_id != exclude_run_id]
    book, _ = replay(nights, acks, restart=restart)
    baseline = read_baseline(store, pipeline, version, book, n,
                             exclude={s.run_id for s in found.skipped})
    baseline.skipped = [*((s.run_id, s.reason) for s in found.skipped), *baseline.skipped]
    for run_id, reason in baseline.skipped:
        logger.warning("%s %s: night %s left out of the baseline: %s", pipeline, version,
                       run_id, reason)
    return baseline


def restart_of(accepted: list[str], before: str | None) -> str | None:
    """The newest accepted run id (up to ``before``), where every baseline restarts.

    An accepted run judged itself has an empty baseline: it is the new normal.
    """
    candidates = [a for a in accepted if before is None or a <= before]
    return max(candidates) if candidates else None


def read_baseline(store: RunStore, pipeline: str, version: str, book: Book, n: int,
                  family: str = "time", exclude: Collection[str] = ()) -> Baseline:
    """The newest ``n`` readable nights of ``book`` that count in ``family``'s baseline,
    with their ``tasks`` tables.

    A night in ``exclude``, or whose table is damaged or gone, is left out (named in
    :attr:`Baseline.skipped` and the note) and the next older night that counts takes its
    place: a damaged night costs the baseline at most itself.

    Raises
    ------
    HistoryUnavailable
        When the store does not answer for one of those tables (``StoreUnavailable``).
    """
    positive_int(n, "n")
    left_out = set(exclude)
    candidates = [r for r in book.baseline_runs(family) if r not in left_out]
    tables: dict[str, pd.DataFrame] = {}
    skipped: list[tuple[str, str]] = []
    while candidates and len(tables) < n:
        batch, candidates = candidates[:n - len(tables)], candidates[n - len(tables):]
        found = store.read_tables(pipeline, batch, "tasks")
        for run_id in batch:
            bad = damaged(found.get(run_id), run_id, "its tasks table")
            if bad is None:
                tables[run_id] = found[run_id]
            else:
                skipped.append((bad.run_id, bad.reason))
    runs = sorted(tables)
    history = pd.concat([tables[r].assign(run_id=r) for r in runs], ignore_index=True) \
        if runs else _empty()
    history = history[[*HISTORY_COLUMNS, *[c for c in history if c not in HISTORY_COLUMNS]]]
    notes = _notes(store, pipeline, version, book, runs, n, family)
    if skipped:
        notes.append(f"left out unreadable night(s) {', '.join(r for r, _ in skipped)}")
    return Baseline(history, runs, version, "; ".join(notes), skipped)


def _notes(store: RunStore, pipeline: str, version: str, book: Book, runs: list[str],
           n: int, family: str) -> list[str]:
    notes = []
    if not book.runs and book.restart is None:
        notes.append(_new_version_note(store, pipeline, version))
    if book.restart is not None:
        notes.append(f"baseline restarts at accepted run {book.restart}")
    if book.runs and len(runs) < n:
        notes.append(f"{len(runs)} of {n} baseline runs available")
    counting = set(book.baseline_runs(family))
    left_out = Counter(status for run_id, status in book.runs.items()
                       if run_id not in counting
                       and (book.restart is None or run_id > book.restart))
    if left_out:
        parts = ", ".join(f"{count} {status}" for status, count in sorted(left_out.items()))
        notes.append(f"left out {parts} run(s) flagged in {family}")
    return notes


def _new_version_note(store: RunStore, pipeline: str, version: str) -> str:
    """Says the version starts a new baseline and how much history the previous one had."""
    try:
        others = [e for e in store.list_runs(pipeline) if e["version"] != version]
    except StoreError:
        others = []
    if not others:
        return f"no earlier runs of pipeline {pipeline}: a new baseline starts"
    previous = max(others, key=lambda e: e["run_id"])["version"]
    count = sum(e["version"] == previous for e in others)
    return (f"version {version} has no history yet: a new baseline starts (previous version "
            f"{previous} had {count} runs)")


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c in ("run_id", "stage", "prefix")
                                      else float) for c in HISTORY_COLUMNS})
