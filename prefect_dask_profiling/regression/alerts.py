"""The history of a pipeline version as one state machine: signals, episodes, standing.

Everything a verdict carries from night to night lives here, and nowhere else: which
suspicions are open, which episodes are confirmed, acknowledged or resolved, and which
stored nights count in which baseline (their **standing**). None of it is stored: it is
derived by :func:`replay` — one fold of the stored nights of a pipeline version in run-id
order, each with the rules stored in its manifest — so replaying the same store always gives
the same state, and the judge, ``dask-profiling check``, ``alerts``, ``ack`` and the exports
all see the same history.

**Signals.** Each judged night yields, per key ``(stage, prefix, metric)``, a
:class:`Signal`: its one-night verdict, its ratio to the baseline and the confirmation
decision (``alert``, :data:`.confirm.ALERTS`). The metrics (:data:`FAMILIES`):

========================  ===============  =========================================
metric                    baseline family  one night conclusive (``confirm="auto"``)
========================  ===============  =========================================
``total_s`` (per prefix)  time             extreme jump or calm pipeline (:mod:`.confirm`)
``drift`` (per prefix)    time             yes: drift is many nights of evidence
``peak_bytes``            memory           no: the next night confirms or clears
``spilled_bytes``         memory           no
``requests_per_chunk``    requests         no
``bytes_per_chunk``       requests         no
``idle_hours`` [0]_       cost             no
``headroom`` (near-OOM)   none             yes: absolute, needs no history
========================  ===============  =========================================

.. [0] Idle worker-hours per stage (:mod:`.cost`): a signal only under
   ``cost_regression="fail"``; with ``"warn"`` the verdict is informational and never
   reaches the state machine.

**Episodes** (one per key; :func:`advance`, the transition table):

==============  =======================================  ==============  ==================
from            tonight                                  to              event, run
==============  =======================================  ==============  ==================
(none)          flagged, conclusive                      confirmed       detected, fails
(none)          flagged, not conclusive                  suspected       suspected
suspected       still there (``alert == "regression"``)  confirmed       detected, fails
suspected       still there, an onset not yet confirmed  suspected       none [3]_
suspected       gone                                     cleared         cleared
confirmed       still flagged                            confirmed       fails [1]_
confirmed       back for ``resolve_after`` nights        resolved        resolved
open            acknowledged (``ack``)                   acknowledged    none, never fails
acknowledged    the ack's ``nights`` ran out             confirmed       detected again [2]_
any open        the night is ``accept``-ed               (restart)       --
any open        its stage did not run (:func:`ran`)      unchanged [4]_  none
==============  =======================================  ==============  ==================

.. [1] Relative metrics (all but ``headroom``) fail every night they stay flagged: they are
   judged against the healthy baseline, which keeps their nights out. ``headroom`` is
   absolute: a chronic near-OOM fails **once per episode** and is reported every night.
.. [2] On the next flagged night, with an event id of its own (a new round).
.. [3] A memory metric its baseline never saw reach the minimum effect (a stage that has
   not spilled) confirms after more nights in a row than two
   (:func:`.memory.onset_nights`): its nights stay out of the memory baseline meanwhile,
   and return to it if the onset clears.
.. [4] Marked ``stage absent`` (:attr:`Episode.note`): no calm night is counted and
   nothing clears or resolves, so a conditional stage that did not run is no all-clear, and
   its return continues the episode rather than paging it again as new.

**Ids paged by judges that could not see each other** (overlapping nights, a retried
attempt judged without its earlier one, back-to-back runs with skewed clocks): each opened
the key anew and paged its own id. The replay folds them into one episode, which keeps the
others as :attr:`Episode.aliases` (:func:`adopt`): ``ack`` finds it by any of them
(:meth:`Book.find`), and its ``cleared`` / ``resolved`` event names them all.

A prefix's drift while its time episode is open is that episode's condition, not a new one:
it opens no drift episode (a step acknowledged on its first nights would otherwise page
again as "drift" a night later).

**Standing.** A stored night counts in the baseline of family ``F`` when it was judged
(``healthy``, ``suspected`` or ``regressed``), is not older than the newest accepted run
(``accept`` restarts every baseline; the accepted night counts even though it regressed),
and no episode of family ``F`` that flagged it is still counted against it: a suspicion
that was **cleared** gives its night back; confirmed, acknowledged and resolved episodes
keep their flagged nights out; an open suspicion keeps its night out until the next night
decides. A memory-only or near-OOM-only night stays in the time baseline.

**Carried state.** The replay reads a window of stored nights (the newest 60 by default),
not the whole history. Each judged night stores the state its judge started from — the
open episodes and the previous night's ratios (:class:`CarriedDoc`, the manifest's
``carried``) — and a replay starts from the state its first night stored. So an episode
open longer than the window keeps its id, its ack and its count of nights, and every
window that ends at the same night derives the same state (``alerts --runs N`` agrees
with the judge whatever ``N``). A night stored without it starts from an empty state.

Feeding a night that is already folded in changes nothing and emits nothing, and every
:class:`AlertEvent` id is a deterministic UUID, so a retried emission adds nothing.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

import pandas as pd

from prefect_dask_profiling._util import InvalidInput, float_or_nan
from prefect_dask_profiling.regression.confirm import Prior, metric_threshold, nearer
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store.manifest import RunKey

__all__ = ["ABSOLUTE", "CARRIED_RUNS", "EVENT_KINDS", "EVENT_PREFIX", "FAMILIES",
           "JUDGED_STATUSES", "METRIC", "OPEN_STATES", "PAGES", "STATES", "Ack", "AlertEvent",
           "Book", "CarriedDoc", "CarriedRatio", "Episode", "Key", "Night",
           "Signal", "adopt", "advance", "episode_id", "failing", "instant", "keep_carried_ids",
           "resync",
           "overlaps",
           "pages", "priors", "replay", "run_status", "silenced"]

METRIC = "total_s"
# Baseline family of each metric: a night flagged in a metric is kept out of that family's
# baseline only. ``headroom`` is judged without a baseline. The built-in families' metrics;
# the registry of verdict families (:mod:`.families`) adds those of any other family it
# registers (and removes them with it).
FAMILIES: dict[str, str | None] = {
    "total_s": "time", "drift": "time", "peak_bytes": "memory", "spilled_bytes": "memory",
    "requests_per_chunk": "requests", "bytes_per_chunk": "requests", "idle_hours": "cost",
    "headroom": None}
# Metrics judged against no baseline: a persisting condition fails once per episode.
ABSOLUTE = frozenset({"headroom"})
STATES = ("suspected", "confirmed", "acknowledged", "resolved", "cleared")
OPEN_STATES = ("suspected", "confirmed", "acknowledged")
EVENT_KINDS = ("suspected", "detected", "cleared", "resolved")
EVENT_PREFIX = "dask-profiling.regression."
# Stored statuses of nights whose verdicts say something (failed, incomplete and unjudged
# runs hold partial times or none); ``acknowledged``: a night an acknowledged episode would
# have failed (told apart from healthy nights in ``runs`` and the fleet view).
JUDGED_STATUSES = ("healthy", "regressed", "suspected", "acknowledged")
FLAGGED = ("regression", "suspected")
# Namespace of the deterministic event ids (uuid5 of episode id and kind).
_EVENT_NAMESPACE = uuid.UUID("6f1d7c8e-3b0a-5d52-9a41-2f5e0c7b9d13")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# How many of an episode's flagged nights a stored carried state keeps: a replay starting
# at that night reads none of the earlier ones (they are before its window).
CARRIED_RUNS = 60

Key = tuple[str, str, str]  # (stage, prefix, metric); prefix "" for per-stage metrics


def episode_id(pipeline: str, version: str, stage: str, prefix: str, metric: str,
               start_run: str) -> str:
    """The episode's stable id: ``ep-`` and 10 hex digits of a hash of what it is about."""
    text = "\0".join((pipeline, version, stage, prefix, metric, start_run))
    return "ep-" + hashlib.sha256(text.encode()).hexdigest()[:10]


class SignalRow(TypedDict):
    """A non-time signal of a night as stored in its manifest (``signals``; the ``other``
    rows of :meth:`Night.from_tables`): the key, the one-night verdict, tonight's ratio
    (``None``: not finite) and the confirmation decision (``alert``)."""

    stage: str
    prefix: str
    metric: str
    verdict: str
    ratio: float | None
    alert: str


@dataclass(frozen=True)
class Signal:
    """One key on one night: the one-night verdict and the confirmation decision.

    Attributes
    ----------
    alert
        ``regression`` (fails unless acknowledged), ``suspected``, ``cleared`` or ``""``.
    ratio
        Tonight's value over the baseline's (NaN when unknown; headroom: NaN).
    verdict
        The one-night verdict (``regression``, ``memory-regression``, ``near-oom``, ``ok``...).
    """

    alert: str
    ratio: float = math.nan
    verdict: str = ""

    @property
    def flagged(self) -> bool:
        return self.alert in FLAGGED


@dataclass(frozen=True)
class Episode:
    """One alert of one key, from the night that opened it.

    Attributes
    ----------
    id
        :func:`episode_id`.
    state
        One of :data:`STATES`.
    start_run, last_run
        The night that opened it; the last night that saw it open (or ended it).
    confirmed_run, ended_run
        The night that confirmed it; the night that cleared or resolved it.
    acknowledged
        An ack silences it: no failure, no ``detected``.
    ack_left
        Nights the ack still silences (``None``: until resolved).
    acks
        The ack targets already applied (an expired ack is not applied again).
    detected_run
        The last night a ``detected`` event was raised for it.
    rounds
        How many times it was detected (a new round after an ack ran out).
    rearmed
        Its ack ran out: the next flagged night detects it again.
    calm_runs
        Consecutive nights back within the baseline (``resolve_after`` resolves it).
    nights
        Nights on which the one-night rule flagged it.
    flagged_runs
        The nights it flagged (kept out of its family's baseline unless it was cleared).
    peak_ratio, last_ratio
        Its largest and latest ratio while open.
    aliases
        Other ids paged for it: by the judge of a night that could not see it (an
        overlapping night, a retried attempt, a clock skewed back-to-back run), which
        opened the key anew. ``ack`` accepts them and ``resolved`` names them
        (:attr:`ids`), so every page can be acknowledged and closed.
    absent
        Nights in a row on which its stage did not run at all (its episode stays open,
        marked ``stage absent``: a conditional stage that did not run is no all-clear).
    """

    id: str
    pipeline: str
    version: str
    stage: str
    prefix: str
    metric: str
    state: str
    start_run: str
    last_run: str
    confirmed_run: str | None = None
    ended_run: str | None = None
    acknowledged: bool = False
    ack_left: int | None = None
    acks: tuple[str, ...] = ()
    detected_run: str | None = None
    rounds: int = 0
    rearmed: bool = False
    calm_runs: int = 0
    nights: int = 1
    flagged_runs: tuple[str, ...] = ()
    peak_ratio: float = math.nan
    last_ratio: float = math.nan
    aliases: tuple[str, ...] = ()
    absent: int = 0

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    @property
    def ids(self) -> tuple[str, ...]:
        """Every id paged for it: its own first, then its :attr:`aliases`."""
        return (self.id, *self.aliases)

    @property
    def note(self) -> str:
        """``stage absent`` while its stage has not run for a night or more, else ``""``."""
        return "stage absent" if self.absent and self.open else ""

    @property
    def key(self) -> Key:
        return (self.stage, self.prefix, self.metric)

    @property
    def family(self) -> str | None:
        return FAMILIES.get(self.metric)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["acks"] = list(self.acks)
        out["flagged_runs"] = list(self.flagged_runs)
        out["aliases"] = list(self.aliases)
        out["note"] = self.note
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Episode:
        """The episode :meth:`to_json` wrote (a stored night's :class:`CarriedDoc`).

        Raises
        ------
        InvalidInput
            When ``doc`` is not such an episode (a field missing or of the wrong kind).
        """
        if not isinstance(doc, Mapping):
            raise InvalidInput(f"an episode must be a JSON object, got {type(doc).__name__}")
        try:
            fields = {name: doc[name] for name in _EPISODE_REQUIRED}
        except KeyError as exc:
            raise InvalidInput(f"episode {doc.get('id')!r} has no {exc.args[0]!r}") from None
        if any(not isinstance(v, str) for v in fields.values()) \
                or fields["state"] not in STATES:
            raise InvalidInput(f"episode {doc.get('id')!r} is not an episode: {fields}")
        optional = {name: doc.get(name) for name in ("confirmed_run", "ended_run",
                                                      "detected_run")}
        ack_left = doc.get("ack_left")
        return cls(**fields, **{k: str(v) if v is not None else None
                                for k, v in optional.items()},
                   acknowledged=bool(doc.get("acknowledged")),
                   ack_left=int(ack_left) if ack_left is not None else None,
                   acks=tuple(str(a) for a in doc.get("acks") or ()),
                   rounds=int(doc.get("rounds") or 0), rearmed=bool(doc.get("rearmed")),
                   calm_runs=int(doc.get("calm_runs") or 0),
                   nights=int(doc.get("nights") or 1),
                   flagged_runs=tuple(str(r) for r in doc.get("flagged_runs") or ()),
                   peak_ratio=float_or_nan(doc.get("peak_ratio")),
                   last_ratio=float_or_nan(doc.get("last_ratio")),
                   aliases=tuple(str(a) for a in doc.get("aliases") or ()),
                   absent=int(doc.get("absent") or 0))


# The fields an episode's JSON must have (the rest have defaults).
_EPISODE_REQUIRED = ("id", "pipeline", "version", "stage", "prefix", "metric", "state",
                     "start_run", "last_run")


class CarriedRatio(TypedDict):
    """One key's ratio on the newest night folded in (``None``: not finite)."""

    stage: str
    prefix: str
    metric: str
    ratio: float | None


class CarriedDoc(TypedDict):
    """The state a night's judge started from, as stored in its manifest (``carried``).

    ``after`` is the newest night folded in before it (``None``: none), ``episodes`` the
    open episodes then (:meth:`Episode.to_json`; each episode's ``flagged_runs`` cut to the
    newest :data:`CARRIED_RUNS`), ``ratios`` that night's ratios (the symmetric
    confirmation reads them). A replay whose first night stored it starts from it
    (:func:`replay`), so an episode older than the replay window keeps its id, its ack and
    its count of nights.
    """

    after: str | None
    episodes: list[dict[str, Any]]
    ratios: list[CarriedRatio]
    owed: NotRequired[list[AlertEventDoc]]


class AlertEventDoc(TypedDict):
    """An :class:`AlertEvent` as plain JSON (the Prefect event's payload, the manifest's
    ``outcome.events``): the event name, its id, the night and the episode after it."""

    event: str
    id: str
    run_id: str
    episode: dict[str, Any]  # Episode.to_json: the episode's fields


@dataclass(frozen=True)
class AlertEvent:
    """Something that happened to an episode on one night.

    Attributes
    ----------
    kind
        One of :data:`EVENT_KINDS`.
    episode
        The episode after the night.
    run_id
        The night where it happened.
    round
        ``detected`` after an expired ack: 1, 2, ... (0 otherwise).
    """

    kind: str
    episode: Episode
    run_id: str
    round: int = 0

    @property
    def event(self) -> str:
        """The Prefect event name, e.g. ``dask-profiling.regression.detected``."""
        return EVENT_PREFIX + self.kind

    @property
    def id(self) -> str:
        """Deterministic: the same episode, kind and round always give the same id."""
        name = f"{self.episode.id}/{self.kind}" + (f"/{self.round}" if self.round else "")
        return str(uuid.uuid5(_EVENT_NAMESPACE, name))

    def to_json(self) -> AlertEventDoc:
        return {"event": self.event, "id": self.id, "run_id": self.run_id,
                "episode": self.episode.to_json()}


@dataclass(frozen=True)
class Ack:
    """An acknowledgement: of one episode (``ep-…``) or of every episode open at a run.

    Attributes
    ----------
    target
        An episode id or a run id.
    at
        When it was made (ISO): it silences nights that started at or after it.
    by
        Who made it.
    nights
        How many nights it silences (``None``: until the episode resolves).
    """

    target: str
    at: str = ""
    by: str = ""
    nights: int | None = None

    def __post_init__(self) -> None:
        if self.nights is not None and (isinstance(self.nights, bool)
                                        or not isinstance(self.nights, int)
                                        or self.nights < 1):
            raise InvalidInput(f"ack nights must be a whole number >= 1, got {self.nights!r}")

    @property
    def is_episode(self) -> bool:
        return self.target.startswith("ep-")

    def applies_to(self, started: str) -> bool:
        """Whether the ack was made by the time a night started at ``started``."""
        if not self.at or not started:
            return True
        return instant(self.at) <= instant(started)


@dataclass(frozen=True)
class Night:
    """One judged night as the state machine reads it.

    Attributes
    ----------
    run
        Which run it is (:class:`~prefect_dask_profiling.store.manifest.RunKey`).
    signals
        ``{(stage, prefix, metric): Signal}``.
    rule
        The rule it was judged with (its manifest's ``rules``).
    status
        Its stored status.
    started
        When it started (ISO): which acks had been made by then.
    ended
        When it ended (ISO; ``""`` when unknown): a night that ended after another started
        overlaps it and is not part of that night's history.
    carried
        The state its judge started from (its manifest's ``carried``, :class:`CarriedDoc`;
        ``None`` for nights stored before it was): a replay that begins with this night
        starts from it.
    paged
        ``((stage, prefix, metric), episode id)`` pages raised by judges that are not
        replayed for this night: the earlier attempts of its flow run (a retry under
        ``retry_on_regression=True`` is judged without them). Folding the night makes
        each id an alias of the episode that holds its key tonight
        (:attr:`Episode.aliases`).
    """

    run: RunKey
    signals: Mapping[Key, Signal] = field(default_factory=dict)
    rule: RegressionRule = field(default_factory=RegressionRule)
    status: str = "healthy"
    started: str = ""
    ended: str = ""
    carried: Book | None = None
    paged: tuple[tuple[Key, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.rule, RegressionRule):
            raise InvalidInput(f"rule must be a RegressionRule, got {type(self.rule).__name__}")

    @property
    def run_id(self) -> str:
        """Its run id (``run.run_id``): what episodes and the book name nights by."""
        return self.run.run_id

    @property
    def order(self) -> tuple[datetime, str]:
        """Where the night stands in its history: by start, then run id (run ids are
        stamped to the second; nights that do not overlap start in the order they end)."""
        return (instant(self.started) if self.started else _EPOCH, self.run_id)

    @classmethod
    def from_tables(cls, run: RunKey, time_rows: pd.DataFrame | None = None,
                    other: Iterable[Mapping[str, Any]] = (), *,
                    rule: RegressionRule | None = None, status: str = "healthy",
                    started: str = "", ended: str = "", carried: Book | None = None,
                    paged: Iterable[tuple[Key, str]] = ()) -> Night:
        """A night from its stored verdict table and its other signals
        (:func:`signals_from_tables`)."""
        return cls(run, signals_from_tables(time_rows, other),
                   RegressionRule() if rule is None else rule, status, started, ended,
                   carried, tuple(paged))


def signals_from_tables(time_rows: pd.DataFrame | None = None,
                        other: Iterable[Mapping[str, Any]] = ()) -> dict[Key, Signal]:
    """A night's signals from its stored verdict table and its other signals.

    Parameters
    ----------
    time_rows
        The time verdict table (``regression.csv``: ``stage, prefix, verdict, ratio``
        and ``alert``). Without ``alert`` (runs stored before confirmation) a
        ``regression`` row counts as ``regression``: it failed on its first night.
    other
        Rows ``stage, prefix, metric, verdict, ratio, alert`` of the other metrics
        (the manifest's ``signals``); rows of a metric no family judges are left out.

    Returns
    -------
    dict
        ``{(stage, prefix, metric): Signal}``.
    """
    signals: dict[Key, Signal] = {}
    if time_rows is not None and not time_rows.empty:
        signals.update(_time_signals(time_rows))
    for row in other:
        metric = str(row.get("metric") or "")
        if metric not in FAMILIES:
            continue
        key = (str(row.get("stage")), str(row.get("prefix") or ""), metric)
        signals[key] = Signal(str(row.get("alert") or ""), float_or_nan(row.get("ratio")),
                              str(row.get("verdict") or ""))
    return signals


@dataclass(frozen=True)
class Book:
    """The state after some nights: every episode, the newest night, the nights' statuses.

    Attributes
    ----------
    episodes
        Every episode of the folded nights.
    last_run
        The newest night folded in.
    ratios
        Each key's ratio on the newest night (the symmetric confirmation reads it).
    runs
        ``{run_id: status}`` of the folded nights, in the order they were folded.
    last
        :attr:`Night.order` of the newest night folded in.
    restart
        The accepted run where every baseline restarts (``None``: none).
    opaque
        Nights stored ``regressed`` or ``suspected`` whose signals do not say what was
        flagged (stored before signals were, or written by hand): out of every baseline.
    owed
        ``cleared`` / ``resolved`` events of episodes that an overlapping night closed
        while its judge could not see them (it did not know they were open): the next
        night's judge emits them, so every page is closed by an event.
    """

    episodes: tuple[Episode, ...] = ()
    last_run: str | None = None
    ratios: Mapping[Key, float] = field(default_factory=dict)
    runs: Mapping[str, str] = field(default_factory=dict)
    restart: str | None = None
    opaque: frozenset[str] = frozenset()
    last: tuple[datetime, str] | None = None
    owed: tuple[AlertEvent, ...] = ()

    def open(self) -> list[Episode]:
        return [e for e in self.episodes if e.open]

    def find(self, episode: str) -> Episode | None:
        """The episode ``episode`` was paged for (its own id or an alias; ``None``: none)."""
        return next((e for e in self.episodes if episode in e.ids), None)

    def carried(self) -> CarriedDoc:
        """What the next night's state needs of this one (:class:`CarriedDoc`): stored
        with that night, it is where a later replay whose window begins there starts."""
        return {"after": self.last_run,
                "episodes": [replace(e, flagged_runs=e.flagged_runs[-CARRIED_RUNS:]).to_json()
                             for e in self.open()],
                "ratios": [{"stage": k[0], "prefix": k[1], "metric": k[2],
                            "ratio": r if math.isfinite(r) else None}
                           for k, r in self.ratios.items()],
                "owed": [e.to_json() for e in self.owed]}

    @classmethod
    def from_carried(cls, doc: Mapping[str, Any]) -> Book:
        """The state :meth:`carried` stored: its open episodes and ratios, no folded nights
        (the replay folds them).

        Raises
        ------
        InvalidInput
            When ``doc`` is not a :class:`CarriedDoc`.
        """
        if not isinstance(doc, Mapping) or not isinstance(doc.get("episodes"), list) \
                or not isinstance(doc.get("ratios"), list):
            raise InvalidInput("the carried state must be an object with 'episodes' and "
                               f"'ratios' lists, got {str(doc)[:80]!r}")
        episodes = tuple(Episode.from_json(e) for e in doc["episodes"])
        if any(not e.open for e in episodes):
            raise InvalidInput("the carried state holds an episode that is not open")
        try:
            ratios = {(str(r["stage"]), str(r["prefix"]), str(r["metric"])):
                      float_or_nan(r.get("ratio")) for r in doc["ratios"]}
        except (KeyError, TypeError) as exc:
            raise InvalidInput(f"a carried ratio is not stage/prefix/metric/ratio: {exc!r}"
                               ) from None
        after = doc.get("after")
        return cls(episodes, str(after) if after else None, ratios,
                   owed=tuple(_owed_event(e) for e in doc.get("owed") or ()))

    def excluded(self) -> dict[str, frozenset[str]]:
        """``{run_id: families}`` each folded night is kept out of (standing's negative)."""
        out: dict[str, set[str]] = {}
        for ep in self.episodes:
            if ep.state == "cleared" or ep.family is None:
                continue
            for run in ep.flagged_runs:
                out.setdefault(run, set()).add(ep.family)
        every = {f for f in FAMILIES.values() if f is not None}
        for run in self.opaque:
            out.setdefault(run, set()).update(every)
        return {run: frozenset(families) for run, families in out.items()}

    def baseline_runs(self, family: str) -> list[str]:
        """The folded nights that count in ``family``'s baseline, newest first."""
        excluded = self.excluded()
        out = []
        for run_id in reversed(list(self.runs)):
            if self.runs[run_id] not in JUDGED_STATUSES:
                continue
            if self.restart is not None and run_id <= self.restart:
                if run_id == self.restart:
                    out.append(run_id)
                break
            if family not in excluded.get(run_id, frozenset()):
                out.append(run_id)
        return out


def priors(book: Book, metric: str = METRIC) -> dict[tuple[str, str], Prior]:
    """What the confirmation of ``metric`` needs from the previous night, per
    ``(stage, prefix)``: the open episode's state and the previous ratio."""
    out = {(s, p): Prior(ratio=ratio) for (s, p, m), ratio in book.ratios.items()
           if m == metric}
    for ep in book.open():
        if ep.metric == metric:
            out[(ep.stage, ep.prefix)] = Prior(
                episode=ep.state, ratio=book.ratios.get(ep.key, math.nan), nights=ep.nights,
                level=ep.peak_ratio)
    return out


def advance(book: Book, night: Night, acks: Iterable[Ack] = ()
            ) -> tuple[Book, list[AlertEvent]]:
    """Fold one judged night into the state (the transition table of the module).

    Parameters
    ----------
    book
        The state after the previous nights.
    night
        Tonight, its signals carrying the confirmation decisions and its rule.
    acks
        Every acknowledgement of the pipeline and version (those made after tonight
        started are not applied yet).

    Returns
    -------
    (Book, list[AlertEvent])
        The state after tonight and what happened to the episodes tonight. A night at or
        before ``book.last_run`` (already folded in) changes nothing and emits nothing.
    """
    if not isinstance(night, Night):
        raise InvalidInput(f"night must be a Night, got {type(night).__name__}")
    if book.last is not None and night.order <= book.last:
        return book, []
    runs = {**book.runs, night.run_id: night.status}
    opaque = book.opaque | ({night.run_id} if night.status in ("regressed", "suspected")
                            and not any(s.flagged for s in night.signals.values())
                            else set())
    if book.restart is not None and night.run_id == book.restart:
        # the accepted night is the new normal: every earlier episode ends with it
        return Book((), night.run_id, {}, runs, book.restart, opaque, night.order), []
    live = [a for a in acks if a.applies_to(night.started)]
    # closings an earlier overlapping night's judge could not announce: announced tonight
    events: list[AlertEvent] = [replace(e, run_id=night.run_id) for e in book.owed]
    episodes = [e for e in book.episodes if not e.open]
    seen: set[Key] = set()
    for ep in book.open():
        seen.add(ep.key)
        ep = _expire(_acknowledge(ep, live), night.run_id)
        if not ran(night, ep.stage):  # no all-clear: it stays open, marked stage absent
            episodes.append(replace(ep, last_run=night.run_id, absent=ep.absent + 1))
            continue
        ep, event = _step(ep, night.signals.get(ep.key), night)
        episodes.append(_spend(ep))
        if event is not None:
            events.append(event)
    timed = {(ep.stage, ep.prefix) for ep in book.open() if ep.metric == METRIC}
    for key, signal in night.signals.items():
        if key in seen or not signal.flagged:
            continue
        if key[2] == "drift" and key[:2] in timed:
            # the same condition as the prefix's open time episode, not a new one: the
            # night is that episode's (kept out of the time baseline with it)
            episodes = [_flag_night(e, night.run_id) if e.open and e.key == (*key[:2], METRIC)
                        else e for e in episodes]
            continue
        ep = _acknowledge(_open(night, key, signal), live)
        if signal.alert == "regression" and not ep.acknowledged:
            ep = replace(ep, detected_run=night.run_id, rounds=1)
            events.append(AlertEvent("detected", ep, night.run_id))
        elif signal.alert == "suspected":
            events.append(AlertEvent("suspected", ep, night.run_id))
        episodes.append(_spend(ep))
    ratios = {key: signal.ratio for key, signal in night.signals.items()}
    episodes = adopt(episodes, night.paged, night.run_id)
    return (Book(tuple(episodes), night.run_id, ratios, runs, book.restart, opaque,
                 night.order), events)


def failing(book: Book, night: Night) -> list[Episode]:
    """The episodes that fail ``night``: flagged ``regression`` tonight, not acknowledged,
    and — for an absolute metric — detected tonight. ``book`` is :func:`advance`'s."""
    out = []
    for ep in book.open():
        signal = night.signals.get(ep.key)
        if ep.last_run != night.run_id or ep.acknowledged or signal is None \
                or signal.alert != "regression":
            continue
        if ep.metric in ABSOLUTE and ep.detected_run != night.run_id:
            continue  # a chronic condition fails once per episode
        out.append(ep)
    return out


def silenced(book: Book, night: Night) -> list[Episode]:
    """The acknowledged episodes that would have failed ``night``: open, acknowledged, and
    flagged ``regression`` tonight. ``book`` is :func:`advance`'s."""
    return [ep for ep in book.open() if ep.acknowledged and ep.last_run == night.run_id
            and (signal := night.signals.get(ep.key)) is not None
            and signal.alert == "regression"]


def run_status(book: Book, night: Night) -> str:
    """The night's stored status: ``regressed`` (something fails it), ``acknowledged``
    (only acknowledged episodes would have), ``suspected`` (something waits for the next
    night), else ``healthy``."""
    if failing(book, night):
        return "regressed"
    if silenced(book, night):
        return "acknowledged"
    if any(s.alert == "suspected" for s in night.signals.values()):
        return "suspected"
    return "healthy"


def replay(nights: Iterable[Night], acks: Iterable[Ack] = (), *, restart: str | None = None,
           book: Book | None = None) -> tuple[Book, list[AlertEvent]]:
    """Fold judged nights, oldest first, into the state: the derivation from history.

    Parameters
    ----------
    nights
        The stored nights (any order: they are folded by :attr:`Night.order`).
    acks
        Every acknowledgement of the pipeline and version.
    restart
        The newest accepted run: nights before it are not folded, it is folded as the new
        normal.
    book
        A state to continue from (default: the state the first night folded stored,
        :attr:`Night.carried`, else empty).

    Returns
    -------
    (Book, list[AlertEvent])
        The final state and every event in order. The state folds every night; a night's
        events are what its judge derived, from the nights that had ended when it started
        (:func:`overlaps`), so ``alerts`` and the judge agree on overlapping nights too.
    """
    acks = list(acks)
    ordered = [n for n in sorted(nights, key=lambda n: n.order)
               if restart is None or n.run_id >= restart]
    start = book if book is not None else _start(ordered[0] if ordered else None, restart)
    if restart is not None and start.restart != restart:
        start = replace(start, restart=restart)
    book, events, folded = start, [], []
    for night in ordered:
        if folded:
            book = resync(book, night.carried)
        overlapped = {m.run_id for m in folded if overlaps(m, night)}
        if overlapped:
            # tonight's judge saw only the nights that had ended when it started: its
            # events come from that view; the state carried on folds every night
            view, _ = replay([m for m in folded if m.run_id not in overlapped], acks,
                             restart=restart, book=start)
            _, new = advance(view, night, acks)
            book, folded_new = advance(book, night, acks)
            # what tonight's judge paged names the episode the state folded tonight into;
            # what the state closed tonight unseen by tonight's judge, the next one announces
            said = {e.id for e in new}
            book = replace(book, episodes=tuple(adopt(book.episodes, pages(new),
                                                      night.run_id)),
                           owed=tuple(e for e in folded_new if e.kind in CLOSINGS
                                      and e.id not in said))
        else:
            book, new = advance(book, night, acks)
        if folded:
            book = keep_carried_ids(book, night.carried)
        events.extend(new)
        folded.append(night)
    return book, events


def resync(book: Book, carried: Book | None) -> Book:
    """``book`` continued from ``carried`` (the state the next night's judge started from)
    when that judge folded a newer night than the replay could (a night left out since,
    damaged or unreadable).

    That judge's open episodes are the ones it paged, counted and closed: the replay takes
    them (each flagged night the replay knew kept), instead of folding the key anew a night
    later under an id nobody was paged with, or opening beside a time episode the drift
    the judge folded into it. Closed episodes the replay folded stay listed. A judge that
    started before a night the replay folded (an overlap, a window's edge) is not followed.
    """
    if carried is None or carried.last_run is None or carried.last_run in book.runs \
            or (book.last_run is not None and carried.last_run < book.last_run):
        return book
    known = {i: e for e in book.episodes for i in e.ids}
    taken: list[Episode] = []
    for seen in carried.open():
        if book.restart is not None and seen.start_run <= book.restart:
            continue  # an accepted run ended it
        mine = next((known[i] for i in seen.ids if i in known), None)
        flagged = seen.flagged_runs if mine is None else \
            tuple(sorted({*mine.flagged_runs, *seen.flagged_runs}))
        taken.append(replace(seen, flagged_runs=flagged))
    ids = {i for e in taken for i in e.ids}
    closed = tuple(e for e in book.episodes if not e.open and not ids.intersection(e.ids))
    return replace(book, episodes=(*closed, *taken), ratios=carried.ratios)


def keep_carried_ids(book: Book, carried: Book | None) -> Book:
    """``book`` with each id a night's judge started from (its ``carried`` state) that the
    replay does not know given to the open episode that holds its key.

    The replay leaves out a night that cannot be read any more; when that night opened an
    episode and paged its id, the next night folds the key anew under its own id. The next
    night's stored state still holds the id its judge saw, so it stays answerable: ``ack``
    finds the episode by it, and its ``cleared`` / ``resolved`` event names it. When the
    carried episode started first, its id (the one paged) stays the episode's own and its
    first night the episode's start, as in a window that starts after the lost night; the
    replay's id becomes an alias (:func:`_carried_first`).
    """
    if carried is None:
        return book
    known = {i for e in book.episodes for i in e.ids}
    episodes, changed = list(book.episodes), False
    for seen in carried.open():
        missing = tuple(i for i in seen.ids if i not in known)
        hit = next((k for k, e in enumerate(episodes) if e.open and e.key == seen.key), None)
        if missing and hit is not None:
            episodes[hit] = _carried_first(episodes[hit], seen, missing)
            known.update(missing)
            changed = True
    return replace(book, episodes=tuple(episodes)) if changed else book


def _carried_first(episode: Episode, seen: Episode, missing: tuple[str, ...]) -> Episode:
    """``episode`` answering also to ``missing`` (ids of ``seen``, the carried episode of
    its key): under ``seen``'s id and start when ``seen`` started first, else as aliases."""
    if seen.start_run >= episode.start_run or seen.id not in missing:
        return replace(episode, aliases=(*episode.aliases, *missing))
    ids = (*missing, *episode.ids)  # ``seen.id`` first: ``missing`` keeps its order
    return replace(episode, id=ids[0], aliases=ids[1:], start_run=seen.start_run)


def _start(first: Night | None, restart: str | None) -> Book:
    """Where a replay begins: the state the first night's judge started from (so an episode
    that opened before the window keeps its id), less the episodes an accepted run after
    them ended; empty for a night stored without it."""
    if first is None or first.carried is None:
        return Book(restart=restart)
    episodes = tuple(e for e in first.carried.episodes
                     if restart is None or e.start_run > restart)
    return replace(first.carried, episodes=episodes, restart=restart)


def overlaps(earlier: Night, night: Night) -> bool:
    """Whether ``earlier`` was still running when ``night`` started (so it is not part of
    ``night``'s history, whichever of the two finished first)."""
    if not (earlier.ended and night.started):
        return False
    return instant(earlier.ended) > instant(night.started)


PAGES = ("suspected", "detected")  # the events that page someone
CLOSINGS = ("cleared", "resolved")  # the events that close a page


def _owed_event(doc: Any) -> AlertEvent:
    """An owed event as :meth:`AlertEvent.to_json` stored it (a carried state's ``owed``).

    Raises
    ------
    InvalidInput
        When ``doc`` is not such an event.
    """
    kind = str(doc.get("event") or "").removeprefix(EVENT_PREFIX) \
        if isinstance(doc, Mapping) else ""
    if kind not in CLOSINGS:
        raise InvalidInput(f"an owed event must be cleared or resolved, got {str(doc)[:80]!r}")
    return AlertEvent(kind, Episode.from_json(doc.get("episode")), str(doc.get("run_id")))


def pages(events: Iterable[AlertEvent]) -> list[tuple[Key, str]]:
    """``(key, episode id)`` of each event that paged someone (suspected, detected)."""
    return [(e.episode.key, e.episode.id) for e in events if e.kind in PAGES]


def adopt(episodes: Iterable[Episode], paged: Iterable[tuple[Key, str]], run_id: str
          ) -> list[Episode]:
    """``episodes`` with each paged id that none of them holds made an alias of the episode
    that holds its key on night ``run_id`` (a drift page: the prefix's time episode, which
    a drift opens no episode beside).

    A judge that could not see an earlier night (it overlapped it, it was another attempt
    of its flow run, a host clock was skewed) opened the key anew and paged that id; the
    replay folds the night into the earlier night's episode, which from then on answers to
    both ids: ``ack`` finds it by either, and its ``resolved`` event names both.
    """
    out = list(episodes)
    for key, ep_id in paged:
        if any(ep_id in e.ids for e in out):
            continue
        keys = (key, (*key[:2], METRIC)) if key[2] == "drift" else (key,)
        hit = next((i for k in keys for i, e in enumerate(out)
                    if e.key == k and e.last_run == run_id), None)
        if hit is not None:
            out[hit] = replace(out[hit], aliases=(*out[hit].aliases, ep_id))
    return out


# ---------------------------------------------------------------------- transitions
def _open(night: Night, key: Key, signal: Signal) -> Episode:
    stage, prefix, metric = key
    confirmed = signal.alert == "regression"
    return Episode(
        id=episode_id(night.run.pipeline, night.run.version, stage, prefix, metric,
                      night.run_id),
        pipeline=night.run.pipeline, version=night.run.version, stage=stage, prefix=prefix,
        metric=metric, state="confirmed" if confirmed else "suspected",
        start_run=night.run_id, last_run=night.run_id,
        confirmed_run=night.run_id if confirmed else None, flagged_runs=(night.run_id,),
        peak_ratio=signal.ratio, last_ratio=signal.ratio)


def _step(ep: Episode, signal: Signal | None, night: Night
          ) -> tuple[Episode, AlertEvent | None]:
    """One open episode through one night: the episode after it, and its event."""
    signal = signal if signal is not None else Signal("", math.nan, "vanished")
    run_id, ratio = night.run_id, signal.ratio
    peak = max(ep.peak_ratio, ratio) if math.isfinite(ratio) else ep.peak_ratio
    flagged = ep.flagged_runs + ((run_id,) if signal.flagged else ())
    ep = replace(ep, last_run=run_id, last_ratio=ratio, peak_ratio=peak,
                 nights=ep.nights + signal.flagged, flagged_runs=flagged, absent=0)
    if ep.state == "suspected":
        if signal.alert == "regression":
            ep = replace(ep, state="acknowledged" if ep.acknowledged else "confirmed",
                         confirmed_run=run_id)
            return _detect(ep, run_id) if not ep.acknowledged else (ep, None)
        if signal.alert == "suspected":
            # an onset not yet confirmed (it needs more nights in a row), or flagged again
            # by a night that overlapped the suspecting one (its judge did not know of it):
            # still open, a later night confirms or clears it
            return ep, None
        ep = replace(ep, state="cleared", ended_run=run_id)
        return ep, AlertEvent("cleared", ep, run_id)
    if signal.alert == "regression" and ep.rearmed and not ep.acknowledged:
        return _detect(replace(ep, calm_runs=0, rearmed=False), run_id)
    if not _back(ep.metric, signal, night.rule):
        return replace(ep, calm_runs=0), None
    calm = ep.calm_runs + 1
    if calm >= night.rule.resolve_after:
        ep = replace(ep, state="resolved", calm_runs=calm, ended_run=run_id)
        return ep, AlertEvent("resolved", ep, run_id)
    return replace(ep, calm_runs=calm), None


def ran(night: Night, stage: str) -> bool:
    """Whether ``stage`` ran on ``night``: one of its signals is more than ``vanished`` (a
    prefix the baseline knows and tonight lacks). A conditional stage that did not run says
    nothing about its episodes: they neither count a calm night nor clear."""
    return any(key[0] == stage and signal.verdict != "vanished"
               for key, signal in night.signals.items())


def _flag_night(ep: Episode, run_id: str) -> Episode:
    """``ep`` with ``run_id`` among the nights it flagged."""
    return ep if run_id in ep.flagged_runs else replace(ep, flagged_runs=(*ep.flagged_runs,
                                                                         run_id))


def _detect(ep: Episode, run_id: str) -> tuple[Episode, AlertEvent]:
    ep = replace(ep, detected_run=run_id, rounds=ep.rounds + 1)
    return ep, AlertEvent("detected", ep, run_id, round=ep.rounds - 1)


def _back(metric: str, signal: Signal, rule: RegressionRule) -> bool:
    """Whether tonight is back within the baseline for ``metric``: not flagged, and (for
    ratio metrics) nearer the baseline than the threshold."""
    if signal.flagged or signal.alert == "regression":
        return False
    if metric in ABSOLUTE or metric == "drift":
        return True
    threshold = metric_threshold(metric, rule)
    return not nearer(signal.ratio, rule.threshold if threshold is None else threshold)


def _acknowledge(ep: Episode, acks: list[Ack]) -> Episode:
    """Apply the acks that name ``ep`` (by id, or a run it was open at) and were not yet
    applied to it."""
    for ack in acks:
        if ack.target in ep.acks:
            continue
        hit = ack.target in ep.ids if ack.is_episode \
            else ep.start_run <= ack.target <= ep.last_run
        if hit and ep.open:
            state = "acknowledged" if ep.state == "confirmed" else ep.state
            ep = replace(ep, acknowledged=True, state=state, ack_left=ack.nights,
                         acks=(*ep.acks, ack.target), rearmed=False)
    return ep


def _expire(ep: Episode, run_id: str) -> Episode:
    """An ack whose nights ran out stops silencing before tonight is judged."""
    if ep.acknowledged and ep.ack_left is not None and ep.ack_left <= 0:
        state = "confirmed" if ep.state == "acknowledged" else ep.state
        return replace(ep, acknowledged=False, ack_left=None, state=state, rearmed=True)
    return ep


def _spend(ep: Episode) -> Episode:
    """A bounded ack silenced one more night."""
    if ep.acknowledged and ep.ack_left is not None and ep.open:
        return replace(ep, ack_left=ep.ack_left - 1)
    return ep


def _time_signals(rows: pd.DataFrame) -> dict[Key, Signal]:
    if "alert" in rows:
        alert = rows["alert"].fillna("").astype(str)
    else:
        alert = rows["verdict"].where(rows["verdict"] == "regression", "").astype(str)
    ratio = pd.to_numeric(rows["ratio"], errors="coerce")
    return {(str(s), str(p), METRIC): Signal(a, float(r), str(v)) for s, p, a, r, v in zip(
        rows["stage"].to_numpy(), rows["prefix"].to_numpy(), alert.to_numpy(),
        ratio.to_numpy(), rows["verdict"].to_numpy(), strict=True)}




def instant(text: str) -> datetime:
    """An ISO time as an aware datetime (naive ones are UTC)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
