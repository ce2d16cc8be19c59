"""A run's live ETA from the healthy nights before it: pure functions and typed data, no
Prefect, no threads, no I/O (the method is in docs/eta.md).

:func:`history_stats` summarises the baseline per part (the *lead* before the first stage,
each stage, the *tail* after the last: :func:`night_layout`); :func:`estimate` projects the
finish as a range (p50s added, p90 spreads in quadrature); :func:`parse_deadline`,
:func:`resolve_deadline`, :func:`risk` and :class:`RiskTracker` judge it against a deadline."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from statistics import median
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from prefect_dask_profiling.errors import InvalidInput

if TYPE_CHECKING:  # the runner validates its options with this module in Dask workers too,
    import pandas as pd  # which must not load pandas: nothing here imports it at run time

__all__ = ["DEFAULT_ETA_INTERVAL_S", "LEAD", "TAIL", "Deadline", "Eta", "HistoryStats",
           "NightLayout", "RiskTracker", "RunProgress", "StageStats", "check_eta_interval",
           "check_margin", "estimate", "history_stats", "night_layout", "parse_deadline",
           "resolve_deadline", "risk", "unknown_text"]

DEFAULT_ETA_INTERVAL_S = 30.0
# Nights a stage needs in the baseline before its duration is trusted (the judge's
# RegressionRule.min_history by default).
MIN_NIGHTS = 3
# How much a stage's observed speed is trusted against its history, at a progress fraction
# f: weight f / (f + PRIOR_WEIGHT). A stage's first tasks finish late (start-up, a task's own
# length), so an early speed reads slow: 0.25 keeps that bias under 0.02 / 0.25 = 8 % for a
# stage whose first tasks need 2 % of it, and a stage a third done still moves the ETA by half.
PRIOR_WEIGHT = 0.25
# Below this share of its work done a stage's counts are start-up, not speed: time only.
MIN_FRACTION = 0.05
Risk = Literal["on-track", "at-risk", "late"]
# The parts of a run outside its stages (the allocation's "outside stages" row, split at
# the stages): from the run's start to the first stage, from the last stage to the run's end.
LEAD = "before the first stage"
TAIL = "after the last stage"
# Stage windows come from the scheduler's clock, the run's start and wall from the flow's:
# a night whose windows overrun its wall by more than this is read as having no windows.
CLOCK_SLACK_S = 1.0


# ---------------------------------------------------------------------- history
@dataclass(frozen=True)
class StageStats:
    """One stage of the baseline nights.

    Attributes
    ----------
    name
        The stage.
    nights
        Baseline nights that ran it.
    p50_s, p90_s
        Its duration's median and 90th percentile over those nights (seconds).
    windows
        How many times it is usually opened.
    tasks
        Usual (median) task count per prefix.
    weights
        Usual task seconds per prefix (weights a prefix's progress inside the stage).
    """

    name: str
    nights: int
    p50_s: float
    p90_s: float
    windows: int = 1
    tasks: Mapping[str, int] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def usual_tasks(self) -> int:
        """The stage's usual task count (all prefixes)."""
        return sum(self.tasks.values())


@dataclass(frozen=True)
class HistoryStats:
    """What the ETA knows of a pipeline version's healthy nights.

    Attributes
    ----------
    pipeline, version
        Whose nights.
    runs
        The baseline nights used, oldest to newest.
    stages
        Per stage, in the usual order of the stages (the newest night's, then stages only
        older nights ran).
    total_p50_s
        The median wall time of the nights (the naive estimate), ``None`` without nights.
    needed
        Nights a stage needs to be known.
    lead, tail
        The time before the first stage and after the last (:data:`LEAD`, :data:`TAIL`)
        over the nights whose stage windows are stored; ``None`` when no night has them
        (the stages then hold that time).
    """

    pipeline: str
    version: str
    runs: tuple[str, ...]
    stages: tuple[StageStats, ...]
    total_p50_s: float | None
    needed: int = MIN_NIGHTS
    lead: StageStats | None = None
    tail: StageStats | None = None

    @property
    def ready(self) -> bool:
        """Enough nights for an ETA."""
        return len(self.runs) >= self.needed

    def stage(self, name: str) -> StageStats | None:
        """The stage called ``name``, if the baseline has it."""
        return next((s for s in self.stages if s.name == name), None)


def history_stats(pipeline: str, version: str, manifests: Sequence[Mapping[str, Any]],
                  tasks: pd.DataFrame | None = None, needed: int = MIN_NIGHTS) -> HistoryStats:
    """Summarise the baseline nights for :func:`estimate`.

    Parameters
    ----------
    pipeline, version
        Whose nights (only manifests of this version count: another version's stages and
        prefixes are another pipeline's).
    manifests
        The time baseline's manifests (:attr:`~.judge.History.manifests`).
    tasks
        Their tasks tables, long (``run_id, stage, prefix, tasks, total_s``:
        :attr:`~.baseline.Baseline.history`); ``None``: no per-prefix counts, the stages'
        ETA then uses time only.
    needed
        Nights a stage needs to be known (>= 1).
    """
    if isinstance(needed, bool) or not isinstance(needed, int) or needed < 1:
        raise InvalidInput(f"needed must be an int >= 1, got {needed!r}")
    nights = sorted((m for m in manifests if str(m.get("version")) == version
                     and _wall(m) is not None), key=lambda m: str(m.get("run_id")))
    durations: dict[str, list[float]] = {}
    windows: dict[str, list[int]] = {}
    leads: list[float] = []
    tails: list[float] = []
    for night in nights:
        layout = night_layout(night)
        for name, seconds, count in layout.stages:
            durations.setdefault(name, []).append(seconds)
            windows.setdefault(name, []).append(count)
        if layout.lead_s is not None and layout.tail_s is not None:
            leads.append(layout.lead_s)
            tails.append(layout.tail_s)
    runs = tuple(str(m.get("run_id")) for m in nights)
    counts = _prefix_counts(tasks, runs)
    stages = tuple(
        StageStats(name=name, nights=len(values), p50_s=_quantile(values, 0.5),
                   p90_s=_quantile(values, 0.9),
                   windows=max(1, round(median(windows[name]))),
                   tasks=counts.get(name, ({}, {}))[0], weights=counts.get(name, ({}, {}))[1])
        for name, values in ((n, durations[n]) for n in _stage_order(nights)))
    total = float(median(_wall(m) for m in nights)) if nights else None
    return HistoryStats(pipeline, version, runs, stages, total, needed,
                        lead=_outside_stats(LEAD, leads), tail=_outside_stats(TAIL, tails))


def _outside_stats(name: str, values: Sequence[float]) -> StageStats | None:
    if not values:
        return None
    return StageStats(name=name, nights=len(values), p50_s=_quantile(values, 0.5),
                      p90_s=_quantile(values, 0.9))


@dataclass(frozen=True)
class NightLayout:
    """One stored night as the ETA reads it: lead, stages, tail.

    Attributes
    ----------
    lead_s, tail_s
        Seconds from the run's start to its first stage window, and from its last window's
        end to the run's end; ``None`` when the night's windows are not stored (its stages
        then hold that time).
    stages
        ``(stage, seconds, windows)`` in the night's order, a name opened several times once
        (its seconds summed), scaled to the span of the windows (to the wall without them).
    """

    lead_s: float | None
    stages: tuple[tuple[str, float, int], ...]
    tail_s: float | None

    @property
    def known(self) -> bool:
        """The lead and tail are known (the windows were stored)."""
        return self.lead_s is not None and self.tail_s is not None


def night_layout(manifest: Mapping[str, Any]) -> NightLayout:
    """A stored night's lead, stages and tail (the module docstring): the one rule that the
    baseline (:func:`history_stats`) and the replays of stored nights share."""
    entries = _entries(manifest)
    walls = [max(float(s.get("wall_s") or 0.0), 0.0) for s in entries]
    total, wall = sum(walls), _wall(manifest) or 0.0
    span = _span(manifest, entries, wall)
    lead = tail = None
    target = wall
    if span is not None:
        lead, first, last = span
        target = last - first
        tail = max(wall - lead - target, 0.0)
    scale = target / total if total > 0 and target > total else 1.0
    merged: dict[str, tuple[float, int]] = {}
    for entry, w in zip(entries, walls, strict=True):
        seconds, count = merged.get(str(entry["name"]), (0.0, 0))
        merged[str(entry["name"])] = (seconds + w * scale,
                                      count + int(entry.get("windows") or 1))
    return NightLayout(lead, tuple((n, sec, c) for n, (sec, c) in merged.items()), tail)


def _span(manifest: Mapping[str, Any], entries: Sequence[Mapping[str, Any]],
          wall: float) -> tuple[float, float, float] | None:
    """``(lead, first window start, last window end)`` of a night (instants in seconds since
    the epoch, from each stage's ``allocation`` window), ``None`` without windows, without a
    start, or when they do not fit in the night's wall (clocks that disagree)."""
    starts, stops = [], []
    for entry in entries:
        window = entry.get("allocation")
        start = window.get("start") if isinstance(window, Mapping) else None
        stop = window.get("stop") if isinstance(window, Mapping) else None
        if not isinstance(start, int | float) or not isinstance(stop, int | float) \
                or stop < start:
            return None
        starts.append(float(start))
        stops.append(float(stop))
    began = manifest.get("started")
    if not starts or not isinstance(began, str):
        return None
    try:
        t0 = datetime.fromisoformat(began).timestamp()
    except ValueError:
        return None
    first, last = min(starts), max(stops)
    lead = first - t0
    if lead < -CLOCK_SLACK_S or (last - t0) > wall + CLOCK_SLACK_S:
        return None
    return max(lead, 0.0), first, min(last, t0 + wall)


def _quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile, interpolated linearly (numpy's default)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (at - low))


def _wall(manifest: Mapping[str, Any]) -> float | None:
    value = manifest.get("wall_s")
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def _entries(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in manifest.get("stages") or [] if isinstance(s, Mapping) and s.get("name")]


def _stage_order(nights: Sequence[Mapping[str, Any]]) -> list[str]:
    """The newest night's stage order, with each stage only older nights ran (newest night
    first) put where that night ran it: before the first of its successors already placed,
    else after the last of its predecessors.

    An optional stage keeps its place: a ``prepare`` that runs first on the nights the data
    is missing must not sort after ``write``, or the night it runs again every stage still to
    come reads as "not run tonight (a later stage has started)".
    """
    order: list[str] = []
    for night in reversed(nights):
        names = list(dict.fromkeys(str(entry["name"]) for entry in _entries(night)))
        for i, name in enumerate(names):
            if name in order:
                continue
            after = next((n for n in names[i + 1:] if n in order), None)
            before = next((n for n in reversed(names[:i]) if n in order), None)
            if after is not None:
                order.insert(order.index(after), name)
            elif before is not None:
                order.insert(order.index(before) + 1, name)
            else:
                order.append(name)
    return order


def _prefix_counts(tasks: pd.DataFrame | None, runs: Iterable[str]
                   ) -> dict[str, tuple[dict[str, int], dict[str, float]]]:
    """Per stage: the median tasks and task seconds of each prefix over ``runs``."""
    if tasks is None or tasks.empty or not {"run_id", "stage", "prefix", "tasks"} <= set(tasks):
        return {}
    frame = tasks[tasks["run_id"].astype(str).isin(set(runs))]
    if "total_s" not in frame:
        frame = frame.assign(total_s=0.0)
    per_run = (frame.astype({"stage": str, "prefix": str})
               .groupby(["stage", "prefix", "run_id"])[["tasks", "total_s"]].sum())
    usual = per_run.groupby(level=["stage", "prefix"]).median()
    out: dict[str, tuple[dict[str, int], dict[str, float]]] = {}
    for (stage, prefix), row in usual.iterrows():
        counts, weights = out.setdefault(str(stage), ({}, {}))
        counts[str(prefix)] = int(round(float(row["tasks"])))
        weights[str(prefix)] = float(row["total_s"]) if math.isfinite(row["total_s"]) else 0.0
    return out


# ---------------------------------------------------------------------- tonight
@dataclass(frozen=True)
class RunProgress:
    """Where tonight's run is.

    Attributes
    ----------
    now
        The time of the estimate (aware).
    elapsed_s
        Seconds since the run started.
    completed
        Per closed stage: seconds spent in it so far (all its closed windows).
    windows
        Per stage: how many times it has been opened so far.
    current
        The stage open now (``None`` between stages).
    current_s
        Seconds the current stage's window has been open.
    done
        Per stage, per prefix: tasks finished so far (``None``: not read).
    since_stage_s
        Seconds since the last stage window closed, between stages and after the last one
        (``None``: not known; after the last stage the tail is then taken as just begun).
    """

    now: datetime
    elapsed_s: float
    completed: Mapping[str, float] = field(default_factory=dict)
    windows: Mapping[str, int] = field(default_factory=dict)
    current: str | None = None
    current_s: float = 0.0
    done: Mapping[str, Mapping[str, int]] | None = None
    since_stage_s: float | None = None


@dataclass(frozen=True)
class StageLag:
    """How far a stage is behind (or ahead of, negative) its usual duration."""

    stage: str
    behind_pct: float
    expected_s: float
    projected_s: float


@dataclass(frozen=True)
class Eta:
    """The run's estimated finish.

    Attributes
    ----------
    known
        An estimate could be made (else ``text`` says why not).
    remaining_s, remaining_low_s, remaining_high_s
        Expected seconds to the finish: the p50 estimate, and the range (low = remaining_s).
    finish_low, finish_high
        The finish range as instants (aware, UTC).
    percent_done
        Expected work done, 0-100 (stages weighted by their p50).
    unknown
        ``(stage, reason)`` of stages the estimate leaves out (``no history``, ``too little
        history``) or assumes skipped tonight.
    lag
        The stage most behind its usual duration (current or done), if any is.
    needs_runs
        Earlier healthy nights still needed for an ETA (0 when known).
    text
        One line for people.
    """

    known: bool
    text: str
    remaining_s: float | None = None
    remaining_low_s: float | None = None
    remaining_high_s: float | None = None
    finish_low: datetime | None = None
    finish_high: datetime | None = None
    percent_done: float | None = None
    unknown: tuple[tuple[str, str], ...] = ()
    lag: StageLag | None = None
    needs_runs: int = 0

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (events' payloads, the stored estimate): the fields but
        ``remaining_low_s``, instants as ISO text, ``unknown`` as ``{stage, reason}``."""
        return {"known": self.known, "text": self.text, "remaining_s": self.remaining_s,
                "remaining_high_s": self.remaining_high_s,
                "finish_low": self.finish_low.isoformat() if self.finish_low else None,
                "finish_high": self.finish_high.isoformat() if self.finish_high else None,
                "percent_done": self.percent_done,
                "unknown": [{"stage": s, "reason": r} for s, r in self.unknown],
                "lag": None if self.lag is None else dict(self.lag.__dict__),
                "needs_runs": self.needs_runs}


@dataclass(frozen=True)
class _Part:
    """One stage's part of the estimate."""

    low_s: float
    spread_s: float  # p90 - p50 still ahead
    expected_s: float  # p50 (weight of percent done)
    done_s: float  # expected seconds of it done
    lag: StageLag | None = None


def estimate(stats: HistoryStats, progress: RunProgress, zone: tzinfo | None = None) -> Eta:
    """Tonight's ETA from the baseline and the run's progress (pure).

    Parameters
    ----------
    stats
        The baseline (:func:`history_stats`).
    progress
        Where the run is.
    zone
        Time zone of the times in ``text`` (the deadline's; default UTC).
    """
    if not stats.ready:
        needs = stats.needed - len(stats.runs)
        return Eta(False, f"no ETA yet: needs {needs} earlier run{'s' * (needs != 1)} of "
                          f"{stats.pipeline} {stats.version} (has {len(stats.runs)})",
                   needs_runs=needs)
    seen = {*progress.completed, *progress.windows,
            *([progress.current] if progress.current else [])}
    order = [s.name for s in stats.stages]
    last_seen = max((order.index(n) for n in seen if n in order), default=-1)
    parts: list[_Part] = []
    unknown: list[tuple[str, str]] = []
    if progress.current and stats.stage(progress.current) is None:
        unknown.append((progress.current, "no history"))
    for i, st in enumerate(stats.stages):
        if st.nights < stats.needed:
            if st.name not in progress.completed or st.name == progress.current:
                unknown.append((st.name, f"too little history ({st.nights} of "
                                         f"{stats.needed} nights)"))
            continue
        if st.name not in seen and i < last_seen:
            unknown.append((st.name, "not run tonight (a later stage has started)"))
            continue
        parts.append(_stage_part(st, progress))
    parts += _outside_parts(stats, progress, seen, parts, unknown)
    return _combine(stats, progress, parts, unknown, zone or UTC)


def _outside_parts(stats: HistoryStats, progress: RunProgress, seen: set[str],
                   parts: list[_Part], unknown: list[tuple[str, str]]) -> list[_Part]:
    """The lead and the tail as parts of the estimate: the lead is being spent until a stage
    opens (then done), the tail is to come until every stage is done, then being spent
    (``since_stage_s``). Too few nights with windows: said unknown, left out."""
    out = []
    stages_done = progress.current is None and bool(seen) and all(
        p.low_s == 0.0 and p.spread_s == 0.0 for p in parts)
    for st, spent in ((stats.lead, None if seen else progress.elapsed_s),
                      (stats.tail, (progress.since_stage_s or 0.0) if stages_done else None)):
        if st is None:
            continue  # no night has windows: the stages hold this time
        if st.nights < stats.needed:
            if st is stats.tail or not seen:
                unknown.append((st.name, f"too little history ({st.nights} of {stats.needed} "
                                         "nights with stage windows)"))
            continue
        if st is stats.lead and seen:
            out.append(_Part(0.0, 0.0, st.p50_s, st.p50_s))
        elif spent is None:
            out.append(_Part(st.p50_s, st.p90_s - st.p50_s, st.p50_s, 0.0))
        else:
            # time only; no lag: the stage behind (events, logs) is a stage
            out.append(replace(_current_part(st, spent, None), lag=None))
    return out


def _stage_part(st: StageStats, progress: RunProgress) -> _Part:
    spent = progress.completed.get(st.name, 0.0)
    if st.name == progress.current:
        return _current_part(st, spent + progress.current_s, _fraction(st, progress))
    if st.name in progress.completed:
        if progress.windows.get(st.name, 1) >= st.windows:  # done
            return _Part(0.0, 0.0, st.p50_s, st.p50_s, _lag(st, spent, spent))
        low = max(st.p50_s - spent, 0.0)  # more windows to come
        return _Part(low, max(st.p90_s - spent, 0.0) - low, st.p50_s, st.p50_s - low)
    return _Part(st.p50_s, st.p90_s - st.p50_s, st.p50_s, 0.0)


def _fraction(st: StageStats, progress: RunProgress) -> float | None:
    """The current stage's share of its usual work done (task seconds weighting the
    prefixes), ``None`` when the counts are not read or the stage usually runs no tasks."""
    if progress.done is None or st.usual_tasks == 0:
        return None
    done = progress.done.get(st.name, {})
    total_w = sum(st.weights.get(p, 0.0) for p in st.tasks)
    share = 0.0
    for prefix, usual in st.tasks.items():
        if usual <= 0:
            continue
        weight = (st.weights.get(prefix, 0.0) / total_w) if total_w > 0 else usual / st.usual_tasks
        share += weight * min(done.get(prefix, 0) / usual, 1.0)
    return min(share, 1.0)


def _current_part(st: StageStats, spent: float, fraction: float | None) -> _Part:
    """The rest of the stage open now: its history's durations, scaled by its speed so far
    (the observed speed weighted by the progress fraction)."""
    speed = 1.0
    if fraction is not None and fraction >= MIN_FRACTION and st.p50_s > 0:
        observed = spent / fraction / st.p50_s
        speed = (fraction * observed + PRIOR_WEIGHT) / (fraction + PRIOR_WEIGHT)
    elif st.p50_s > 0 and spent > st.p90_s:  # past its p90 without counts: at least as slow
        speed = spent / st.p50_s
    if fraction is not None and fraction >= 1.0:
        low = high = 0.0
    elif fraction is not None and fraction >= MIN_FRACTION:  # the spread of what is left
        low = max(st.p50_s * speed - spent, 0.0)
        high = low + (st.p90_s - st.p50_s) * speed * (1.0 - fraction)
    else:
        low = max(st.p50_s * speed - spent, 0.0)
        high = max(st.p90_s * speed - spent, low)
    projected = spent + low
    done = st.p50_s * (fraction if fraction is not None else
                       (spent / projected if projected > 0 else 1.0))
    return _Part(low, high - low, st.p50_s, min(done, st.p50_s), _lag(st, spent, projected))


def _lag(st: StageStats, spent: float, projected: float) -> StageLag | None:
    if st.p50_s <= 0:
        return None
    return StageLag(st.name, 100.0 * (projected / st.p50_s - 1.0), st.p50_s, projected)


def _combine(stats: HistoryStats, progress: RunProgress, parts: list[_Part],
             unknown: list[tuple[str, str]], zone: tzinfo) -> Eta:
    low = sum(p.low_s for p in parts)
    high = low + math.sqrt(sum(p.spread_s ** 2 for p in parts))
    expected = sum(p.expected_s for p in parts)
    percent = 100.0 * sum(p.done_s for p in parts) / expected if expected > 0 else 100.0
    lags = [p.lag for p in parts if p.lag is not None and p.lag.behind_pct > 0]
    lag = max(lags, key=lambda g: g.projected_s - g.expected_s, default=None)
    now = progress.now.astimezone(UTC)
    finish_low, finish_high = now + timedelta(seconds=low), now + timedelta(seconds=high)
    text = f"ETA {_clock(finish_low, zone)}–{_clock(finish_high, zone)}"
    if unknown:
        text += ", not counting " + ", ".join(unknown_text(s, r) for s, r in unknown)
    return Eta(True, text, remaining_s=low, remaining_low_s=low, remaining_high_s=high,
               finish_low=finish_low, finish_high=finish_high,
               percent_done=max(0.0, min(percent, 100.0)), unknown=tuple(unknown), lag=lag)


def unknown_text(part: str, reason: str) -> str:
    """What an estimate leaves out, for people: "stage `publish`: no history", "the time
    before the first stage: too little history (...)"."""
    what = f"the time {part}" if part in (LEAD, TAIL) else f"stage `{part}`"
    return f"{what}: {reason}"


def _clock(at: datetime, zone: tzinfo) -> str:
    return at.astimezone(zone).strftime("%H:%M")


def boundary_text(stage: str, spent_s: float, stats: HistoryStats, eta: Eta, now: datetime,
                  zone: tzinfo | None = None) -> str:
    """The flow-run log line of a stage boundary ("stage ndvi done at 02:31, 12 % behind
    its usual; ETA 05:52 (05:40–06:10)")."""
    zone = zone or UTC
    head = f"stage {stage} done at {_clock(now, zone)}"
    st = stats.stage(stage)
    if st is not None and st.p50_s > 0 and st.nights >= stats.needed:
        pct = 100.0 * (spent_s / st.p50_s - 1.0)
        head += f", {abs(pct):.0f} % {'behind' if pct >= 0 else 'ahead of'} its usual"
    if not eta.known or eta.finish_low is None or eta.finish_high is None:
        return f"{head}; {eta.text}"
    mid = eta.finish_low + (eta.finish_high - eta.finish_low) / 2
    tail = eta.text.removeprefix(f"ETA {_clock(eta.finish_low, zone)}–"
                                 f"{_clock(eta.finish_high, zone)}")
    return (f"{head}; ETA {_clock(mid, zone)} ({_clock(eta.finish_low, zone)}–"
            f"{_clock(eta.finish_high, zone)}){tail}")


# ---------------------------------------------------------------------- deadline
@dataclass(frozen=True)
class Deadline:
    """A run's deadline: a time of day in a zone, or a duration from the scheduled start.

    Attributes
    ----------
    at
        The time of day (with ``zone``), or ``None``.
    zone
        IANA zone name of ``at``.
    after
        The duration from the flow run's scheduled start, or ``None``.
    """

    at: time | None = None
    zone: str | None = None
    after: timedelta | None = None

    def __str__(self) -> str:
        if self.after is not None:
            return f"{self.after} after the scheduled start"
        return f"{self.at:%H:%M} {self.zone}"

    @property
    def tz(self) -> tzinfo:
        """The zone to show times in (UTC for a duration)."""
        return ZoneInfo(self.zone) if self.zone else UTC


_TIME_OF_DAY = re.compile(r"^\s*(\d{1,2}):(\d{2})(?::(\d{2}))?\s+(\S+)\s*$")


def parse_deadline(value: object) -> Deadline | None:
    """The ``deadline=`` option: ``"06:00 Europe/Berlin"``, a ``timedelta`` from the flow
    run's scheduled start, a :class:`Deadline`, or ``None``.

    Raises
    ------
    InvalidInput
        (a ``ValueError``) naming ``deadline``: unparseable, unknown time zone, a duration
        that is not positive.
    """
    if value is None or isinstance(value, Deadline):
        return value
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise InvalidInput(f"deadline must be a positive duration, got {value!r}")
        return Deadline(after=value)
    if not isinstance(value, str):
        raise InvalidInput("deadline must be a time of day with a time zone (\"06:00 "
                           f"Europe/Berlin\") or a timedelta, got {value!r}")
    match = _TIME_OF_DAY.match(value)
    if match is None:
        raise InvalidInput(f"deadline {value!r} is not \"HH:MM Zone\" (e.g. \"06:00 "
                           "Europe/Berlin\"; a duration is a timedelta)")
    hour, minute, second, zone = match.groups()
    if int(hour) > 23 or int(minute) > 59 or int(second or 0) > 59:
        raise InvalidInput(f"deadline {value!r}: no such time of day")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"deadline {value!r}: unknown time zone {zone!r} (an IANA name "
                           "such as Europe/Berlin or UTC)") from exc
    return Deadline(at=time(int(hour), int(minute), int(second or 0)), zone=zone)


def resolve_deadline(deadline: Deadline, started: datetime,
                     scheduled: datetime | None = None) -> tuple[datetime, str | None]:
    """The deadline as an instant for a run, and a note when something else than asked was
    used.

    A time of day is its first occurrence after the run's scheduled start (its start
    without a schedule): a run scheduled at 23:00 with a 06:00 deadline has until 06:00 the
    next morning. The instants are compared in UTC, so a time of day in the hour the autumn
    clock change repeats is its first occurrence after the start (the summer-time one, or
    the winter-time one when the start is past it), never the next day's. A time of day
    the spring change skips is read with the offset before the change (02:30 is 03:30
    summer time). A duration counts from the scheduled start (``expected_start_time``), so
    a run that started late is judged against its schedule; without one, from the start.
    """
    started = _plain_utc(started)
    base = _plain_utc(scheduled) if scheduled is not None else started
    note = None
    if deadline.after is not None:
        if scheduled is None:
            note = (f"deadline {deadline}: the flow run has no scheduled start; counted from "
                    f"its start {started:%Y-%m-%d %H:%M:%S} UTC instead")
        return base + deadline.after, note
    zone = ZoneInfo(deadline.zone or "UTC")
    day = base.astimezone(zone).date()
    at = deadline.at or time(0)
    after = [c for d in (day, day + timedelta(days=1)) for c in _occurrences(d, at, zone)
             if c > base]
    return min(after), note


def _occurrences(day: date, at: time, zone: tzinfo) -> list[datetime]:
    """The instants (UTC) at which the clock in ``zone`` reads ``at`` on ``day``: two in
    the hour the autumn change repeats, one otherwise (a time the spring change skips: the
    instant the offset before the change gives it)."""
    first = datetime.combine(day, at, tzinfo=zone)
    second = first.replace(fold=1)
    out = [_plain_utc(first)]
    repeated = first.utcoffset() != second.utcoffset() and \
        _plain_utc(second).astimezone(zone).replace(tzinfo=None) == second.replace(tzinfo=None)
    if repeated:
        out.append(_plain_utc(second))
    return out


def _plain_utc(at: datetime) -> datetime:
    """``at`` as a plain aware ``datetime`` in UTC (naive: taken as UTC). Prefect's
    ``expected_start_time`` is a pendulum-like subclass whose arithmetic after
    ``astimezone(UTC)`` drops the zone."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return datetime.fromtimestamp(at.timestamp(), UTC)


def _seconds(value: object, option: str, *, allow_zero: bool) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidInput(f"{option} must be a number of seconds {bound} or a timedelta, "
                           f"got {value!r}")
    return float(value)


def check_margin(value: object) -> float:
    """The ``deadline_margin=`` option in seconds (>= 0; a number or a ``timedelta``)."""
    return _seconds(value, "deadline_margin", allow_zero=True)


def check_eta_interval(value: object) -> float:
    """The ``eta_interval=`` option in seconds (> 0; a number or a ``timedelta``)."""
    return _seconds(value, "eta_interval", allow_zero=False)


def risk(eta: Eta | None, deadline_at: datetime, margin_s: float, now: datetime,
         finished: bool = False) -> Risk | None:
    """Tonight against its deadline: ``late`` once the deadline passed with the run
    unfinished, with or without an estimate (``eta`` ``None``: no history read); with a
    known ETA, ``at-risk`` when its high end passes the deadline minus the margin,
    ``on-track`` otherwise; ``None`` when there is no ETA and the deadline is ahead."""
    if not finished and now >= deadline_at:
        return "late"
    if eta is None or not eta.known or eta.finish_high is None:
        return None
    return "at-risk" if eta.finish_high > deadline_at - timedelta(seconds=margin_s) \
        else "on-track"


class RiskTracker:
    """Which risk is news: ``at-risk`` when it starts, ``on-track`` when a run at risk
    recovers, ``late`` once; a healthy run emits nothing.

    Parameters
    ----------
    hold_s
        How long a run at risk must read ``on-track`` before its recovery is news. Inside a
        stage the ETA is a sawtooth (the counts move in steps, the time between them
        smoothly): without a hold, a run near its threshold would flap ``at-risk`` /
        ``on-track`` at every step. ``at-risk`` itself is news at once.
    """

    def __init__(self, hold_s: float = 0.0) -> None:
        if isinstance(hold_s, bool) or not isinstance(hold_s, int | float) or \
                not math.isfinite(hold_s) or hold_s < 0:
            raise InvalidInput(f"hold_s must be a number of seconds >= 0, got {hold_s!r}")
        self.hold_s = float(hold_s)
        self.state: Risk | None = None
        self.emitted: list[Risk] = []
        self._recovering_since: datetime | None = None

    def update(self, current: Risk | None, now: datetime | None = None) -> Risk | None:
        """The kind to emit now (``None``: nothing new); ``now`` times a recovery's hold
        (``None``: no hold)."""
        if current is None or self.state == "late":
            return None
        if current == "on-track" and self.state == "at-risk":
            if now is not None and self.hold_s > 0:
                since = self._recovering_since = self._recovering_since or now
                if (now - since).total_seconds() < self.hold_s:
                    return None  # still at risk until the recovery has held
            self._recovering_since = None
            return self._news("on-track")
        self._recovering_since = None
        if current == "at-risk" and self.state == "at-risk":
            return None
        if current == "at-risk" or current == "late":
            return self._news(current)
        self.state = current  # on-track, as before
        return None

    def _news(self, kind: Risk) -> Risk:
        self.state = kind
        self.emitted.append(kind)
        return kind
