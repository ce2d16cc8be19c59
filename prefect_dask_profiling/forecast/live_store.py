"""The live estimate's object in the store: ``live/<pipeline>/<run_id>.json``, its document,
parsed and aged here (written, read and swept by :class:`~prefect_dask_profiling.store.live.Live`).
Stdlib only.

It is not part of the run's record and never spooled: a stale estimate is worth nothing.
:func:`is_stale` (:data:`STALE_INTERVALS`, :data:`STALE_GRACE_S`) and
:data:`UNREADABLE_AFTER_S` decide which leftovers ``sweep_live`` removes (docs/eta.md)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, TypedDict

from prefect_dask_profiling.errors import DamagedRecord

LIVE_KIND = "dask-profiling.live-eta"
LIVE_SCHEMA = 1
# Fields a reader needs; the rest may be null (no ETA yet, no deadline, between stages).
_REQUIRED = ("kind", "schema", "pipeline", "run_id", "computed_at")
# An estimate not replaced for this many of its intervals, and a minute, is stale: its run
# has stopped without ending (no manifest, no removal), or cannot reach the store.
STALE_INTERVALS = 3
STALE_GRACE_S = 60.0
# An object under live/ that cannot be read says no interval: a leftover once it is a day old.
UNREADABLE_AFTER_S = 86400.0


class UnknownStage(TypedDict):
    """A stage the estimate leaves out, and why (``no history``, ``too little history``)."""

    stage: str
    reason: str


class LiveEstimate(TypedDict):
    """The current ETA of one run in progress, as stored at ``live/<pipeline>/<run_id>.json``.

    Times are ISO 8601 in UTC; seconds are floats. ``finish_p50``/``finish_p90`` are the ETA
    range (the stages' p50 added; their p90 spreads added in quadrature); all ETA fields are
    null while ``known`` is false (``text`` then says why: "no ETA yet: needs 2 earlier
    runs").
    """

    kind: str  # LIVE_KIND
    schema: int  # LIVE_SCHEMA
    pipeline: str
    version: str
    run_id: str
    flow_run_id: str | None
    started: str | None
    computed_at: str
    interval_s: float
    stage: str | None  # the stage running when it was computed (None: between stages)
    stages_done: list[str]
    known: bool
    done_fraction: float | None  # expected work done, 0..1
    remaining_p50_s: float | None
    remaining_p90_s: float | None
    finish_p50: str | None
    finish_p90: str | None
    deadline: str | None
    risk: str | None  # on-track, at-risk, late (None: no deadline or no ETA)
    unknown: list[UnknownStage]
    text: str


def parse_live(data: bytes, where: str) -> LiveEstimate:
    """The estimate stored as ``data`` at ``where``.

    Raises
    ------
    DamagedRecord
        Naming ``where``: not UTF-8 JSON, not a live estimate, of another schema, or
        missing a field a reader needs.
    """
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DamagedRecord(f"{where} is not valid JSON ({reason})") from None
    if not isinstance(doc, dict) or doc.get("kind") != LIVE_KIND:
        raise DamagedRecord(f"{where} is not a dask-profiling live estimate (no kind "
                            f"{LIVE_KIND!r})")
    if doc.get("schema") != LIVE_SCHEMA:
        raise DamagedRecord(f"{where} has schema {doc.get('schema')!r}; this version of "
                            f"dask-profiling reads {LIVE_SCHEMA}")
    missing = [k for k in _REQUIRED if not doc.get(k)]
    if missing:
        raise DamagedRecord(f"{where} lacks {', '.join(missing)}")
    return doc  # type: ignore[return-value]


def estimate_age(estimate: LiveEstimate, now: datetime) -> float | None:
    """Seconds since ``estimate`` was computed at ``now``; ``None`` when its ``computed_at``
    is not an ISO 8601 time with a zone."""
    try:
        computed = datetime.fromisoformat(str(estimate["computed_at"]))
    except (TypeError, ValueError):
        return None
    if computed.tzinfo is None:
        return None
    return (now - computed).total_seconds()


def is_stale(estimate: LiveEstimate, now: datetime) -> bool | None:
    """Whether ``estimate`` was not replaced for :data:`STALE_INTERVALS` of its intervals
    and :data:`STALE_GRACE_S` at ``now`` (its run has stopped without ending); ``None``
    when its age cannot be told."""
    age = estimate_age(estimate, now)
    if age is None:
        return None
    interval = estimate.get("interval_s")
    interval = float(interval) if isinstance(interval, int | float) and interval > 0 else 0.0
    return age > STALE_INTERVALS * interval + STALE_GRACE_S


def estimate_doc(**fields: Any) -> LiveEstimate:
    """A :class:`LiveEstimate` with ``kind`` and ``schema`` filled in (the rest given)."""
    return {"kind": LIVE_KIND, "schema": LIVE_SCHEMA, **fields}  # type: ignore[typeddict-item]


__all__ = ["LIVE_KIND", "LIVE_SCHEMA", "STALE_GRACE_S", "STALE_INTERVALS", "UNREADABLE_AFTER_S",
           "LiveEstimate", "UnknownStage", "estimate_age", "estimate_doc", "is_stale",
           "parse_live"]
