"""Alert episodes: suspected → confirmed → resolved, or cleared, or acknowledged.

An alert is an **episode** of one (pipeline, version, stage, prefix, metric), opened by the
run where it was first flagged; its id is a short hash of those and the start run, so it is
stable however often it is recomputed. The life of an episode, one judged run at a time
(:func:`advance`):

* a prefix the confirmation rule (:mod:`.confirm`) calls ``suspected`` opens a
  **suspected** episode (event ``suspected``); one it calls ``regression`` opens a
  **confirmed** one at once (event ``detected``: a conclusive night);
* a suspected episode is **confirmed** by the next run (event ``detected``) or **cleared**
  (event ``cleared``);
* a confirmed episode is **resolved** (event ``resolved``) once the prefix has been back
  within its baseline — not flagged, and nearer the baseline than the threshold
  (``ratio < sqrt(threshold)``), or absent — for ``resolve_after`` consecutive runs;
* an **acknowledged** episode (``dask-profiling ack EPISODE_OR_RUN``) fails no more runs and
  emits no ``detected``; it still resolves. The baseline is not restarted (``accept`` keeps
  meaning "this is the new normal").

Nothing here is state kept between runs: episodes are recomputed from the stored per-run
verdict tables (their ``alert`` column, written by the judge) and the ack markers, with
:func:`replay`, so nothing can be lost. Feeding a run that is already folded in changes
nothing and emits nothing: a retried flow run (same run id) never emits twice, and every
event's :attr:`AlertEvent.id` is a deterministic UUID so a consumer can deduplicate too.

Runs stored before confirmation existed have no ``alert`` column: their ``regression``
rows failed on the first night, and are replayed so (``confirm="never"``).
"""

from __future__ import annotations

import functools
import hashlib
import math
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from prefect_dask_profiling._util import InvalidInput
from prefect_dask_profiling.regression.confirm import Prior, nearer
from prefect_dask_profiling.regression.rule import RegressionRule

__all__ = ["EVENT_KINDS", "EVENT_PREFIX", "METRIC", "OPEN_STATES", "STATES", "Ack",
           "AlertEvent", "Book", "Episode", "Night", "advance", "episode_id", "failing",
           "priors", "replay", "run_status"]

METRIC = "total_s"  # the metric judged today; memory and requests get their own later
STATES = ("suspected", "confirmed", "acknowledged", "resolved", "cleared")
OPEN_STATES = ("suspected", "confirmed", "acknowledged")
EVENT_KINDS = ("suspected", "detected", "cleared", "resolved")
EVENT_PREFIX = "dask-profiling.regression."
# Namespace of the deterministic event ids (uuid5 of episode id and kind).
_EVENT_NAMESPACE = uuid.UUID("6f1d7c8e-3b0a-5d52-9a41-2f5e0c7b9d13")


def episode_id(pipeline: str, version: str, stage: str, prefix: str, metric: str,
               start_run: str) -> str:
    """The episode's stable id: ``ep-`` and 10 hex digits of a hash of what it is about."""
    text = "\0".join((pipeline, version, stage, prefix, metric, start_run))
    return "ep-" + hashlib.sha256(text.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Episode:
    """One alert of one prefix, from the run that opened it.

    Attributes
    ----------
    id
        :func:`episode_id`.
    state
        One of :data:`STATES`.
    start_run, last_run
        The run that opened it; the last run that saw it open (or ended it).
    confirmed_run, ended_run
        The run that confirmed it; the run that cleared or resolved it.
    acknowledged
        Someone acknowledged it: it fails no more runs.
    calm_runs
        Consecutive runs back within the baseline (``resolve_after`` resolves it).
    nights
        Runs on which the one-night rule flagged it.
    peak_ratio, last_ratio
        Its largest and latest ratio to the baseline median while open.
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
    calm_runs: int = 0
    nights: int = 1
    peak_ratio: float = math.nan
    last_ratio: float = math.nan

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES

    @property
    def key(self) -> tuple[str, str]:
        return (self.stage, self.prefix)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AlertEvent:
    """Something that happened to an episode on one run.

    Attributes
    ----------
    kind
        One of :data:`EVENT_KINDS`.
    episode
        The episode after the run.
    run_id
        The run where it happened.
    """

    kind: str
    episode: Episode
    run_id: str

    @property
    def event(self) -> str:
        """The Prefect event name, e.g. ``dask-profiling.regression.detected``."""
        return EVENT_PREFIX + self.kind

    @property
    def id(self) -> str:
        """Deterministic: the same episode and kind always give the same id."""
        return str(uuid.uuid5(_EVENT_NAMESPACE, f"{self.episode.id}/{self.kind}"))

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "id": self.id, "run_id": self.run_id,
                "episode": self.episode.to_json()}


@dataclass(frozen=True)
class Ack:
    """An acknowledgement: of one episode (``ep-…``) or of every episode open at a run."""

    target: str
    at: str = ""
    by: str = ""

    @property
    def is_episode(self) -> bool:
        return self.target.startswith("ep-")


@dataclass(frozen=True)
class Night:
    """One judged run: its id and its verdict table with the ``alert`` column.

    Attributes
    ----------
    rows
        ``stage, prefix, verdict, ratio, delta_s`` and ``alert`` (:data:`.confirm.ALERTS`);
        without ``alert`` (runs stored before confirmation) a ``regression`` row counts as
        ``regression``.
    """

    run_id: str
    pipeline: str
    version: str
    rows: pd.DataFrame

    @functools.cached_property
    def _alerts(self) -> dict[tuple[str, str], tuple[str, float, str]]:
        """``{(stage, prefix): (alert, ratio, verdict)}``, computed once."""
        rows = self.rows
        if "alert" in rows:
            alert = rows["alert"].fillna("").astype(str)
        else:
            alert = rows["verdict"].where(rows["verdict"] == "regression", "").astype(str)
        ratio = pd.to_numeric(rows["ratio"], errors="coerce")
        return {(str(s), str(p)): (a, float(r), str(v)) for s, p, a, r, v in zip(
            rows["stage"].to_numpy(), rows["prefix"].to_numpy(), alert.to_numpy(),
            ratio.to_numpy(), rows["verdict"].to_numpy(), strict=True)}

    def alerts(self) -> dict[tuple[str, str], tuple[str, float, str]]:
        """``{(stage, prefix): (alert, ratio, verdict)}`` (a copy)."""
        return dict(self._alerts)


@dataclass(frozen=True)
class Book:
    """Every episode after some runs, and the newest run folded in."""

    episodes: tuple[Episode, ...] = ()
    last_run: str | None = None
    ratios: dict[tuple[str, str], float] = field(default_factory=dict)

    def open(self) -> list[Episode]:
        return [e for e in self.episodes if e.open]


def priors(book: Book) -> dict[tuple[str, str], Prior]:
    """What :func:`.confirm.confirm_verdicts` needs from the previous run, per prefix."""
    out = {key: Prior(ratio=ratio) for key, ratio in book.ratios.items()}
    for ep in book.open():
        out[ep.key] = Prior(episode=ep.state, ratio=book.ratios.get(ep.key, math.nan))
    return out


def advance(book: Book, night: Night, acks: Iterable[Ack], rule: RegressionRule
            ) -> tuple[Book, list[AlertEvent]]:
    """Fold one judged run into the episodes.

    Parameters
    ----------
    book
        The episodes after the previous runs.
    night
        Tonight's run, its verdict table carrying the ``alert`` column.
    acks
        Every acknowledgement of the pipeline and version.
    rule
        The rule (``threshold``, ``resolve_after``).

    Returns
    -------
    (Book, list[AlertEvent])
        The episodes after tonight and what happened to them tonight. A run at or before
        ``book.last_run`` (already folded in: a retried flow run) changes nothing and emits
        nothing.
    """
    if not isinstance(rule, RegressionRule):
        raise InvalidInput(f"rule must be a RegressionRule, got {type(rule).__name__}")
    if book.last_run is not None and night.run_id <= book.last_run:
        return _acknowledge(book, list(acks)), []
    acks = list(acks)
    book = _acknowledge(book, acks)
    rows = night.alerts()
    events: list[AlertEvent] = []
    episodes = [e for e in book.episodes if not e.open]
    seen = set()
    for ep in book.open():
        seen.add(ep.key)
        ep, kind = _step(ep, rows.get(ep.key), night.run_id, rule)
        episodes.append(ep)
        if kind:
            events.append(AlertEvent(kind, ep, night.run_id))
    for key, (alert, ratio, _) in rows.items():
        if key in seen or alert not in ("suspected", "regression"):
            continue
        ep = _open(night, key, alert, ratio)
        ep = _acknowledge(Book((ep,)), acks).episodes[0]
        episodes.append(ep)
        if not (ep.acknowledged and alert == "regression"):
            events.append(AlertEvent("suspected" if alert == "suspected" else "detected",
                                     ep, night.run_id))
    ratios = {key: ratio for key, (_, ratio, _) in rows.items()}
    return Book(tuple(episodes), night.run_id, ratios), events


def _open(night: Night, key: tuple[str, str], alert: str, ratio: float) -> Episode:
    stage, prefix = key
    confirmed = alert == "regression"
    return Episode(
        id=episode_id(night.pipeline, night.version, stage, prefix, METRIC, night.run_id),
        pipeline=night.pipeline, version=night.version, stage=stage, prefix=prefix,
        metric=METRIC, state="confirmed" if confirmed else "suspected",
        start_run=night.run_id, last_run=night.run_id,
        confirmed_run=night.run_id if confirmed else None, peak_ratio=ratio,
        last_ratio=ratio)


def _step(ep: Episode, row: tuple[str, float, str] | None, run_id: str,
          rule: RegressionRule) -> tuple[Episode, str]:
    """One open episode through one run: the episode after it, and the event (or "")."""
    alert, ratio, verdict = row if row is not None else ("", math.nan, "vanished")
    peak = max(ep.peak_ratio, ratio) if math.isfinite(ratio) else ep.peak_ratio
    ep = replace(ep, last_run=run_id, last_ratio=ratio, peak_ratio=peak,
                 nights=ep.nights + (verdict == "regression"))
    if ep.state == "suspected":
        if alert == "regression":
            state = "acknowledged" if ep.acknowledged else "confirmed"
            return replace(ep, state=state, confirmed_run=run_id), \
                ("" if ep.acknowledged else "detected")
        return replace(ep, state="cleared", ended_run=run_id), "cleared"
    back = verdict != "regression" and not nearer(ratio, rule.threshold)
    if not back:
        return replace(ep, calm_runs=0), ""
    calm = ep.calm_runs + 1
    if calm >= rule.resolve_after:
        return replace(ep, state="resolved", calm_runs=calm, ended_run=run_id), "resolved"
    return replace(ep, calm_runs=calm), ""


def _acknowledge(book: Book, acks: list[Ack]) -> Book:
    """Mark the open episodes an ack names (by id, or by a run they were open at)."""
    ids = {a.target for a in acks if a.is_episode}
    runs = [a.target for a in acks if not a.is_episode]
    if not ids and not runs:
        return book
    out = []
    for ep in book.episodes:
        hit = ep.id in ids or any(ep.start_run <= r <= ep.last_run for r in runs)
        if ep.open and hit and not ep.acknowledged:
            state = "acknowledged" if ep.state == "confirmed" else ep.state
            ep = replace(ep, acknowledged=True, state=state)
        out.append(ep)
    return replace(book, episodes=tuple(out))


def failing(book: Book, night: Night) -> list[Episode]:
    """The episodes that fail ``night``'s run: ``regression`` tonight and not acknowledged.

    ``book`` is the result of :func:`advance` for that night.
    """
    rows = night.alerts()
    return [e for e in book.open() if e.last_run == night.run_id and not e.acknowledged
            and rows.get(e.key, ("",))[0] == "regression"]


def run_status(book: Book, night: Night) -> str:
    """The run's stored status from its alerts: ``regressed`` (something fails it),
    ``suspected`` (something waits for the next run), else ``healthy``.

    A ``suspected`` run is kept out of baselines until the next run clears its suspicions
    (then it counts as healthy again); see docs/alerts.md.
    """
    if failing(book, night):
        return "regressed"
    alerts = night.alerts()
    if any(a == "suspected" for a, _, _ in alerts.values()):
        return "suspected"
    return "healthy"


def replay(nights: Iterable[Night], acks: Iterable[Ack], rule: RegressionRule,
           book: Book | None = None) -> tuple[Book, list[AlertEvent]]:
    """Fold judged runs, oldest first, into episodes: the stateless derivation from history.

    Returns the final :class:`Book` and every event in order.
    """
    acks = list(acks)
    book = book if book is not None else Book()
    events: list[AlertEvent] = []
    for night in sorted(nights, key=lambda n: n.run_id):
        book, new = advance(book, night, acks, rule)
        events.extend(new)
    return book, events
