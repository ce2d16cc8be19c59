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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from prefect_dask_profiling._util import InvalidInput
from prefect_dask_profiling.errors import HistoryUnavailable
from prefect_dask_profiling.regression.alerts import (
    JUDGED_STATUSES,
    PAGES,
    Ack,
    AlertEvent,
    Book,
    Key,
    Night,
    instant,
    replay,
)
from prefect_dask_profiling.regression.rule import RegressionRule, Rules
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.errors import DamagedRecord, StoreNotFound, StoreUnavailable
from prefect_dask_profiling.store.manifest import RunKey
from prefect_dask_profiling.store.runs import RunStore, StoreError

logger = logging.getLogger(__name__)

__all__ = ["ACKS", "JUDGED_STATUSES", "LOOKBACK_RUNS", "NightsRead", "Replayed", "SkippedNight",
           "Stats", "ack_marker", "acknowledge", "damaged", "episodes_frame", "episodes_of",
           "load_acks", "load_nights", "read_nights", "replayed", "stats"]

ACKS = layout.ACKS
# How many judged runs are replayed by default (two months of nightly runs); an episode
# open longer than this comes in with the state the window's first night stored.
LOOKBACK_RUNS = 60
REGRESSION_FILE = "regression.csv"
# Older judged nights read besides the replay window, to find one still running when the
# window's first night started (overlapping runs: its stored state does not hold them).
STRADDLE_LOOKBACK = 3


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
        nights = doc.get("nights")
        acks.append(Ack(target=target, at=str(doc.get("at", "")), by=str(doc.get("by", "")),
                        nights=nights if isinstance(nights, int) and nights >= 1 else None))
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
                note: str = "", nights: int | None = None, at: datetime | None = None) -> Ack:
    """Write an ack marker for ``target`` (an episode id ``ep-…`` or a run id), silencing
    it from the first night that starts after ``at`` (default now) until it resolves or,
    with ``nights``, for that many nights.

    Through the store's timed, breaker-guarded write
    (:meth:`~prefect_dask_profiling.store.writing.Writing.write_ack`); a failure raises the
    ``StoreError`` leaf naming the marker (never spooled).

    Raises
    ------
    StoreNotFound
        When ``target`` matches nothing: an episode id that no episode of the version's
        replayed history was paged under (:meth:`~.alerts.Book.find`: its own id or an
        alias), or a run id the pipeline does not hold. A marker that silences nothing
        would only hide that the page is still unanswered.
    InvalidInput
        When the run ``target`` is of another version.
    """
    ack_marker(pipeline, version, target)  # bad names fail before anything is sent
    _check_target(store, pipeline, version, target)
    try:
        by = getpass.getuser()
    except Exception:  # no user name in some containers
        by = ""
    ack = Ack(target=target, at=(at or datetime.now(UTC)).astimezone(UTC).isoformat(), by=by,
              nights=nights)
    body = json.dumps({"target": target, "at": ack.at, "by": by, "note": note,
                       "nights": nights}).encode()
    store.write_ack(pipeline, version, target, body)
    return ack


@dataclass(frozen=True)
class SkippedNight:
    """A stored night left out of a history because it cannot be read: its manifest, its
    verdict table or its tasks table is damaged or gone. It costs at most itself: the
    nights around it are judged and replayed without it."""

    run_id: str
    reason: str

    def to_json(self) -> dict[str, str]:
        """Plain JSON form (the manifest's ``skipped``)."""
        return {"run_id": self.run_id, "reason": self.reason}

    def line(self) -> str:
        """One line naming the night and why (for warnings and notes)."""
        return f"night {self.run_id} left out of the history: {self.reason}"


@dataclass(frozen=True)
class NightsRead:
    """What :func:`read_nights` read: the nights to replay, oldest first, the nights left
    out because they cannot be read, and notes (a damaged ``carried`` that moved the start
    of the replay, or that was not needed)."""

    nights: tuple[Night, ...]
    skipped: tuple[SkippedNight, ...] = ()
    notes: tuple[str, ...] = ()


def damaged(found: Any, run_id: str, what: str) -> SkippedNight | None:
    """Whether a night's read result ``found`` (``what``: which file) leaves it out.

    ``None`` for a readable result. A damaged or missing file (:class:`DamagedRecord`,
    :class:`StoreNotFound`, or nothing read) leaves the night out: it is the night's own
    fault, and it costs at most itself.

    Raises
    ------
    HistoryUnavailable
        For any other ``StoreError`` (``StoreUnavailable``, a 503, an error of unknown
        cause): it says nothing about the night, so the run is left unjudged, naming the
        cause, rather than judged on a history thinned by an outage.
    """
    if isinstance(found, DamagedRecord | StoreNotFound) or found is None:
        return SkippedNight(run_id, f"{what}: {found or 'missing'}")
    if isinstance(found, StoreError):
        raise HistoryUnavailable(f"night {run_id} could not be read ({what}: {found}); the "
                                 "store did not answer as asked, so no judgement is made "
                                 "on a lighter history") from found
    return None


def _check_target(store: RunStore, pipeline: str, version: str, target: str) -> None:
    """Refuse an ack ``target`` that matches nothing (see :func:`acknowledge`)."""
    if target.startswith("ep-"):
        book, _ = episodes_of(store, pipeline, version)
        if book.find(target) is None:
            raise StoreNotFound(f"no alert episode {target} of {pipeline} {version} in store "
                                f"{store.url}: no episode of its newest {LOOKBACK_RUNS} "
                                "judged runs was paged under that id (see `dask-profiling "
                                "alerts --all`)")
        return
    stored = store.read_manifest(pipeline, target).get("version")
    if str(stored) != str(version):
        raise InvalidInput(f"run {target} of {pipeline} is of version {stored}, not {version}")


def load_nights(store: RunStore, pipeline: str, version: str,
                runs: int | None = None, *, before: str | None = None,
                started: str | None = None, flow_run_id: str | None = None,
                attempt: int | None = None, since: str | None = None) -> list[Night]:
    """The nights of :func:`read_nights`, each night left out named in a warning."""
    found = read_nights(store, pipeline, version, runs, before=before, started=started,
                        flow_run_id=flow_run_id, attempt=attempt, since=since)
    for line in (*[s.line() for s in found.skipped], *found.notes):
        logger.warning("%s %s: %s", pipeline, version, line)
    return list(found.nights)


def read_nights(store: RunStore, pipeline: str, version: str,
                runs: int | None = None, *, before: str | None = None,
                started: str | None = None, flow_run_id: str | None = None,
                attempt: int | None = None, since: str | None = None) -> NightsRead:
    """The judged nights of ``pipeline``/``version`` the state machine replays, oldest first.

    Parameters
    ----------
    store, pipeline, version
        Whose nights.
    runs
        The replay window (default :data:`LOOKBACK_RUNS`, read when called): the newest
        ``runs`` judged nights of tonight's history (a night that overlaps tonight takes no
        place in it), and before them any of the :data:`STRADDLE_LOOKBACK` older ones
        still running when the first of them started (with the nights between): the first
        night's stored state (``carried``) does not hold a night that had not ended when it
        started, so the replay folds it.
    before
        Only nights with a smaller run id (tonight's history: nights before tonight).
    started
        Tonight's start (ISO): a night that ended after it overlaps tonight and is not part
        of its history, whichever of the two finished first.
    flow_run_id, attempt
        Tonight's flow run and attempt: its other attempts are not part of its history.
    since
        Only nights from this run id on (the accepted run, where every replay restarts:
        nothing older is read, so no older night can stop a judgement).

    Of several stored attempts of one flow run only the newest counts. A night whose
    manifest or verdict table cannot be read is left out and named (:class:`SkippedNight`);
    it keeps its place in the window. Only the first night's ``carried`` is read for the
    replay's start: when it is damaged, the window reaches back (doubling) to an older
    night whose ``carried`` can be read, or to the first night there is.

    Raises
    ------
    HistoryUnavailable
        When the nights cannot be listed, or the store does not answer for one of them
        (``StoreUnavailable``): a judgement against a history thinned by an outage would be
        silently wrong.
    """
    window = LOOKBACK_RUNS if runs is None else runs
    while (found := _read_window(store, pipeline, version, window, before=before,
                                 started=started, flow_run_id=flow_run_id, attempt=attempt,
                                 since=since)) is None:
        window = max(2 * window, 1)
    return found


def _read_window(store: RunStore, pipeline: str, version: str, runs: int, *,
                 before: str | None, started: str | None, flow_run_id: str | None,
                 attempt: int | None, since: str | None) -> NightsRead | None:
    """One window of :func:`read_nights`; ``None`` when its first night's ``carried`` is
    damaged and older nights are listed (read a wider window)."""
    wanted = runs + STRADDLE_LOOKBACK
    try:
        entries = [e for e in store.list_runs(pipeline, version, newest=wanted, before=before,
                                              counting=JUDGED_STATUSES, since=since)
                   if e["status"] in JUDGED_STATUSES][:wanted]
        listed_ids = sorted(e["run_id"] for e in entries)
        manifests = store.read_manifests(pipeline, listed_ids)
    except StoreError as exc:
        raise HistoryUnavailable(f"the history of {pipeline} {version} could not be "
                                 f"listed: {exc}") from exc
    complete = len(entries) < wanted
    # the window counts tonight's history only: a night that overlaps tonight, or another
    # attempt of its flow run, takes no place in it (else which of two overlapping runs
    # finished first would move the window's edge); an unreadable night keeps its place
    readable = {r: d for r, d in manifests.items() if isinstance(d, Mapping)}
    history = _history_of(readable, started, flow_run_id, attempt)
    candidates = [r for r in listed_ids if r in history or r not in readable]
    ids = _window(candidates, runs, manifests)
    skipped: list[SkippedNight] = []
    docs = {}
    for run_id in ids:
        found = manifests.get(run_id)
        bad = damaged(found, run_id, "its manifest")
        if bad is None:
            docs[run_id] = found
        else:
            skipped.append(bad)
    listed = [r for r in sorted(docs) if REGRESSION_FILE in (docs[r].get("files") or {})]
    try:
        tables = store.read_tables(pipeline, listed, "regression")
    except StoreError as exc:
        raise HistoryUnavailable(f"the history of {pipeline} {version} could not be "
                                 f"read: {exc}") from exc
    nights, broken = [], {}
    for run_id in sorted(docs):
        table = None  # judged with no prefixes: no verdict table
        if run_id in tables or run_id in listed:
            table = tables.get(run_id)
            bad = damaged(table, run_id, "its verdict table")
            if bad is not None:
                skipped.append(bad)
                continue
        night, why = _night_of(docs[run_id], table)
        if why:
            broken[run_id] = why
        nights.append(night)
    ordered = sorted(_with_attempts(nights, readable), key=lambda n: n.order)
    notes = []
    first = ordered[0].run_id if ordered else None
    if first in broken:
        if not complete:
            return None
        notes.append(f"night {first} holds a damaged carried state ({broken[first]}): the "
                     "replay starts from the first night there is")
    notes += [f"night {r} holds a damaged carried state ({why}): not needed, the replay "
              f"starts at {first}" for r, why in sorted(broken.items()) if r != first]
    return NightsRead(tuple(ordered), tuple(sorted(skipped, key=lambda s: s.run_id)),
                      tuple(notes))


def _with_attempts(nights: list[Night], docs: Mapping[str, Mapping[str, Any]]
                   ) -> list[Night]:
    """``nights``, each with the pages raised by its flow run's attempts that are not
    replayed (:attr:`~.alerts.Night.paged`): a retried attempt's judge could not see them,
    so the ids they paged become aliases of the episode it folds them into."""
    replayed = {n.run_id for n in nights}
    by_flow_run: dict[str, list[Mapping[str, Any]]] = {}
    for run_id, doc in docs.items():
        if run_id not in replayed and doc.get("flow_run_id"):
            by_flow_run.setdefault(str(doc["flow_run_id"]), []).append(doc)
    if not by_flow_run:
        return nights
    out = []
    for night in nights:
        doc = docs.get(night.run_id, {})
        flow_run, attempt = str(doc.get("flow_run_id") or ""), doc.get("attempt")
        # only earlier attempts: nights of one flow run that are not attempts of each
        # other (a flow that finishes several runs) page for themselves
        others = [d for d in by_flow_run.get(flow_run, []) if isinstance(attempt, int)
                  and isinstance(d.get("attempt"), int) and d["attempt"] < attempt]
        paged = [page for d in sorted(others, key=lambda d: str(d.get("run_id")))
                 for page in paged_in(d)]
        out.append(replace(night, paged=(*night.paged, *paged)) if paged else night)
    return out


def paged_in(manifest: Mapping[str, Any]) -> list[tuple[Key, str]]:
    """``(key, episode id)`` of each page (suspected, detected) a stored night's judge
    raised (its manifest's ``outcome.events``); what cannot be read as one is skipped."""
    outcome = manifest.get("outcome")
    events = outcome.get("events") if isinstance(outcome, Mapping) else None
    out: list[tuple[Key, str]] = []
    for event in events if isinstance(events, list) else ():
        episode = event.get("episode") if isinstance(event, Mapping) else None
        name = str(event.get("event") or "") if isinstance(event, Mapping) else ""
        if not isinstance(episode, Mapping) or name.rpartition(".")[2] not in PAGES \
                or not episode.get("id"):
            continue
        key = (str(episode.get("stage")), str(episode.get("prefix") or ""),
               str(episode.get("metric")))
        out.append((key, str(episode["id"])))
    return out


def _window(listed: list[str], runs: int, manifests: Mapping[str, Any]) -> list[str]:
    """The run ids to replay, oldest first: the newest ``runs`` of ``listed``, and from the
    older ones every night since the oldest that was still running when the window's first
    night started. An older night whose manifest cannot be read is taken as ended."""
    window, older = listed[-runs:] if runs else [], listed[:-runs] if runs else listed
    if not window:
        return window
    first = _start_of(manifests.get(window[0]))
    oldest = None
    for run_id in reversed(older):
        doc = manifests.get(run_id)
        ended = doc.get("ended") if isinstance(doc, Mapping) else None
        if first is not None and ended and instant(str(ended)) > first:
            oldest = run_id
            first = min(first, _start_of(doc) or first)
    return [r for r in older if oldest is not None and r >= oldest] + window


def _start_of(doc: Any) -> datetime | None:
    started = doc.get("started") if isinstance(doc, Mapping) else None
    return instant(str(started)) if started else None


def night_from_manifest(manifest: Mapping[str, Any], table: pd.DataFrame | None) -> Night:
    """A stored night for the state machine: its verdict table, its other signals, the rules
    and status its manifest holds, and the state its judge started from (``carried``).

    Raises
    ------
    HistoryUnavailable
        When its ``carried`` is damaged (:func:`read_nights` reads it leniently: only the
        replay's first night needs it).
    """
    night, why = _night_of(manifest, table)
    if why:
        raise HistoryUnavailable(f"night {night.run_id} holds a damaged carried state "
                                 f"({why})")
    return night


def _night_of(manifest: Mapping[str, Any], table: pd.DataFrame | None
              ) -> tuple[Night, str]:
    """The night of :func:`night_from_manifest` and why its ``carried`` could not be read
    (empty: it could; the night then has none)."""
    stored = manifest.get("rules")
    try:
        rule = Rules.from_dict(stored).regression if stored is not None else RegressionRule()
    except InvalidInput:  # rules of a newer version: judge its transitions by today's
        rule = RegressionRule()
    carried, why = manifest.get("carried"), ""
    try:
        state = Book.from_carried(carried) if carried is not None else None
    except InvalidInput as exc:
        state, why = None, str(exc) or type(exc).__name__
    return Night.from_tables(RunKey.of(manifest), table, manifest.get("signals") or (),
                             rule=rule,
                             status=str(manifest.get("status") or ""),
                             started=str(manifest.get("started") or ""),
                             ended=str(manifest.get("ended") or ""), carried=state), why


def _history_of(docs: dict[str, Mapping[str, Any]], started: str | None,
                flow_run_id: str | None, attempt: int | None
                ) -> dict[str, Mapping[str, Any]]:
    """The nights that are tonight's history: not overlapping tonight, not an earlier
    attempt of tonight's flow run, and of each flow run's attempts the newest.

    Attempts are told apart by the manifest's ``attempt`` (Prefect's ``run_count``): nights
    of one flow run with the same attempt (a flow that finishes several runs) all count.
    """
    newest: dict[str, int] = {}
    for doc in docs.values():
        flow_run, tried = doc.get("flow_run_id"), doc.get("attempt")
        if flow_run and isinstance(tried, int):
            newest[str(flow_run)] = max(newest.get(str(flow_run), tried), tried)
    out = {}
    for run_id, doc in docs.items():
        flow_run, tried = str(doc.get("flow_run_id") or ""), doc.get("attempt")
        if flow_run and isinstance(tried, int):
            if flow_run == flow_run_id and attempt is not None and tried != attempt:
                continue  # another attempt of tonight's own flow run: the same night
            if tried < newest[flow_run]:
                continue  # a retried attempt: only the newest counts
        if started and doc.get("ended") and instant(str(doc["ended"])) > instant(started):
            continue
        out[run_id] = doc
    return out


@dataclass(frozen=True)
class Replayed:
    """The state of one pipeline version after its stored nights (:func:`replayed`), every
    event, and the nights the replay left out because they cannot be read, named with why:
    ``alerts`` shows them, so a damaged night is never only a log line."""

    book: Book
    events: list[AlertEvent]
    skipped: tuple[SkippedNight, ...] = ()
    notes: tuple[str, ...] = ()


def replayed(store: RunStore, pipeline: str, version: str, runs: int | None = None
             ) -> Replayed:
    """The state of ``pipeline``/``version`` after its stored nights, and every event:
    each night replayed with the rules it was judged with, as the judge does.

    The nights replayed are the newest judged night and the ``runs`` (default
    :data:`LOOKBACK_RUNS`) judged nights before it, starting from the state the first of
    them stored (:attr:`~.alerts.Night.carried`): the state and the events ``alerts``
    derives for the newest night are the ones its judge derived, also for an episode older
    than the window.
    """
    runs = LOOKBACK_RUNS if runs is None else runs
    accepted = store.accepted(pipeline, version)
    restart = max(accepted) if accepted else None
    found = read_nights(store, pipeline, version, runs + 1, since=restart)
    book, events = replay(list(found.nights), load_acks(store, pipeline, version),
                          restart=restart)
    return Replayed(book, events, found.skipped, found.notes)


def episodes_of(store: RunStore, pipeline: str, version: str, runs: int | None = None
                ) -> tuple[Book, list[AlertEvent]]:
    """The book and events of :func:`replayed`, each night left out named in a warning."""
    found = replayed(store, pipeline, version, runs)
    for line in (*[s.line() for s in found.skipped], *found.notes):
        logger.warning("%s %s: %s", pipeline, version, line)
    return found.book, found.events


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
               "last_ratio", "note", "aliases", "version"]
    rows = [e.to_json() for e in sorted(book.episodes, key=lambda e: e.start_run,
                                         reverse=True)]
    return pd.DataFrame(rows, columns=columns)
