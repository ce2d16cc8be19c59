"""The baseline of a run: which stored runs it is compared against, and loading them.

One listing of ``index/<pipeline>/<version>/`` (and of ``accepted/``) finds the candidates;
only the tables of the runs actually used are read, newest first, so loading a baseline costs
the same with ten stored runs as with ten thousand.

Rules:

* same pipeline and version — prefixes change with the code, so other versions never count;
* complete runs only (index markers are written after the manifest) whose status is
  ``healthy``: regressed and failed runs would drag the median towards the regression;
* an accepted run (``dask-profiling accept RUN``) restarts the baseline: only it and newer
  runs count, and it counts even though it was flagged regressed;
* a run whose table is missing or unreadable is skipped with a warning, never a crash;
* a history that cannot be listed, or none of whose candidate runs can be read, raises
  :class:`HistoryUnavailable`: judging the run against "no history" would store it healthy
  and let it into later baselines, so the caller leaves it unjudged instead.

:func:`counts_in_baseline` is that rule for one run; :func:`load_baseline` applies it.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from prefect_dask_profiling._util import positive_int
from prefect_dask_profiling.errors import HistoryUnavailable
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, StoreError

logger = logging.getLogger(__name__)

HISTORY_COLUMNS = ["run_id", *TASKS_COLUMNS]
# The only status whose runs form a baseline: regressed, failed, incomplete and unjudged runs
# would drag the median towards what is being detected, or hold partial times.
BASELINE_STATUS = "healthy"


def counts_in_baseline(run_id: str, status: str, restart: str | None) -> bool:
    """Whether a stored run of the right pipeline and version belongs in a baseline.

    Parameters
    ----------
    run_id
        The candidate run.
    status
        Its index status (``healthy``, ``regressed``, ``failed``, ``incomplete``,
        ``unjudged``).
    restart
        The accepted run where the baseline restarts, if any: runs older than it never
        count, and it counts itself even though it was flagged regressed.
    """
    if restart is not None and run_id < restart:
        return False
    return status == BASELINE_STATUS or (run_id == restart and status == "regressed")


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
        ``(run_id, reason)`` of the runs skipped because their table could not be read.
    """

    history: pd.DataFrame
    runs: list[str]
    version: str
    note: str = ""
    skipped: list[tuple[str, str]] = field(default_factory=list)


def load_baseline(store: RunStore, pipeline: str, version: str,
                  n: int = RegressionRule.history, exclude_run_id: str | None = None,
                  before: str | None = None) -> Baseline:
    """The last ``n`` healthy runs of ``pipeline``/``version``, as a :class:`Baseline`.

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
        When the history cannot be listed, or when none of the runs it should use can be
        read. Single unreadable runs are skipped with a warning.
    """
    positive_int(n, "n")
    try:
        restart = _restart(store.accepted(pipeline, version), before)
        # the newest runs only (index partitions by month): spares for unreadable ones
        entries = store.list_runs(pipeline, version, newest=2 * n, since=restart,
                                  before=before, counting=(BASELINE_STATUS,))
    except StoreError as exc:
        raise HistoryUnavailable(f"the history of {pipeline} {version} could not be "
                                 f"listed: {exc}") from exc
    entries = [e for e in entries if e["run_id"] != exclude_run_id
               and (before is None or e["run_id"] < before)
               and (restart is None or e["run_id"] >= restart)]
    frames, skipped, left_out = _read_newest(store, pipeline, entries, restart, n)
    if skipped and not frames:
        raise HistoryUnavailable(f"none of the {len(skipped)} baseline run(s) of {pipeline} "
                                 f"{version} could be read; first: {skipped[0][1]}")
    runs = [run_id for run_id, _ in reversed(frames)]
    history = pd.concat([f.assign(run_id=r) for r, f in reversed(frames)], ignore_index=True) \
        if frames else _empty()
    history = history[[*HISTORY_COLUMNS, *[c for c in history if c not in HISTORY_COLUMNS]]]
    notes = _notes(store, pipeline, version, entries, restart, runs, n, left_out, skipped)
    return Baseline(history, runs, version, "; ".join(notes), skipped)


def _restart(accepted: list[str], before: str | None) -> str | None:
    """The newest accepted run id (up to ``before``), where the baseline restarts.

    An accepted run judged itself has an empty baseline: it is the new normal.
    """
    candidates = [a for a in accepted if before is None or a <= before]
    return max(candidates) if candidates else None


def _read_newest(store: RunStore, pipeline: str, entries: list[dict], restart: str | None,
                 n: int) -> tuple[list[tuple[str, pd.DataFrame]], list[tuple[str, str]],
                                  Counter]:
    """Tables of the newest usable runs (newest first), the skipped runs, statuses left out."""
    frames: list[tuple[str, pd.DataFrame]] = []
    skipped: list[tuple[str, str]] = []
    left_out: Counter = Counter()
    newest_first = iter(sorted(entries, key=lambda e: e["run_id"], reverse=True))
    while len(frames) < n:
        wanted = []  # as many runs as frames are missing, read at once
        for entry in newest_first:
            if not counts_in_baseline(entry["run_id"], entry["status"], restart):
                left_out[entry["status"]] += 1
                continue
            wanted.append(entry["run_id"])
            if len(wanted) == n - len(frames):
                break
        if not wanted:
            break
        for run_id, table in store.read_tables(pipeline, wanted, "tasks").items():
            if isinstance(table, StoreError):
                logger.warning("baseline of %s: skipping run %s: %s", pipeline, run_id, table)
                skipped.append((run_id, str(table)))
            else:
                frames.append((run_id, table))
    return frames, skipped, left_out


def _notes(store: RunStore, pipeline: str, version: str, entries: list[dict],
           restart: str | None, runs: list[str], n: int, left_out: Counter,
           skipped: list[tuple[str, str]]) -> list[str]:
    notes = []
    if not entries and restart is None:
        notes.append(_new_version_note(store, pipeline, version))
    if restart is not None:
        notes.append(f"baseline restarts at accepted run {restart}")
    if entries and len(runs) < n:
        notes.append(f"{len(runs)} of {n} baseline runs available")
    if left_out:
        parts = ", ".join(f"{count} {status}" for status, count in sorted(left_out.items()))
        notes.append(f"left out {parts} run(s)")
    if skipped:
        notes.append(f"skipped {len(skipped)} unreadable run(s): "
                     + ", ".join(run_id for run_id, _ in skipped))
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
