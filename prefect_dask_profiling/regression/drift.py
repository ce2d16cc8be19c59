"""Gradual drift: prefixes that get a little slower every night.

The one-night rule compares a night with the median of the last few healthy nights, so a
prefix 12% slower each night never trips it (the median moves with it) although after ten
nights it takes 3.1x as long. Here each (stage, prefix) series is read **since the baseline
start** — the version's first run, or the last run marked with ``dask-profiling accept`` —
and judged on the log scale, where a steady slowdown is a straight line and noise is
symmetric:

* ``y_t = log(total_s_t)``; the **start level** ``b`` is the median of the first
  ``start_nights`` (3) nights, the **current level** ``L`` the median of the last
  ``recent_nights`` (3): a single slow night moves neither;
* the **cumulative ratio** is ``exp(L - b)``;
* the **noise** ``sigma`` comes from the night-to-night differences ``diff(y)``: the larger
  of ``1.4826 * MAD`` and ``1.2533 * mean |d - median d|``, divided by ``sqrt(2)`` (differences
  of iid noise spread ``sqrt(2) sigma``), widened by ``1 + 2 / sqrt(nights - 1)`` for short
  series and floored at ``log(1 + mad_floor)``. A steady drift only shifts the differences
  (both estimates are centred on their median) and a step is one outlying difference;
* a one-sided **CUSUM** ``S_t = max(0, S_{t-1} + (y_t - b) / sigma - allowance)`` says
  whether the series left its start level for good and since which night: the drift started
  on the night after ``S`` was last zero before it first passed ``cusum_limit``.

A prefix is **drift** when all of the following hold (the same discipline as the one-night
rule: a ratio gate, a significance gate, persistence and a minimum effect):

1. the cumulative ratio is at least ``min_ratio`` (1.5): nothing is said below 1.5x;
2. the robust shift ``z = (L - b) / (sqrt(2) sigma)`` is at least ``z_threshold`` (3.5);
3. the CUSUM is above ``cusum_limit`` (5) on the latest night, and each of the last
   ``recent_nights`` nights is above ``b + 0.75 log(min_ratio)``: the change is sustained;
4. the level grew by at least ``min_seconds`` and the prefix carries at least ``min_share``
   of the latest night's task time.

A drifting prefix **fails** the run (like a regression, under the same ``on_regression``
switch) once its cumulative ratio reaches ``threshold`` (2.0); between ``min_ratio`` and
``threshold`` it is reported but does not fail.

Worked example: a prefix taking 10 s, then 12% slower every night (10, 11.2, 12.5, 14.0,
15.7, 17.6, 19.7, 22.1, 24.8, 27.7, 31.1 s). ``b = log 11.2``; on night 4 (15.7 s) ``L`` is
the median of 12.5, 14.0, 15.7 = 14.0 s, 1.25x: nothing. On night 7 (``min_nights`` = 8
nights seen) ``L`` = 19.7 s, 1.76x: **drift**, started on night 2 (the first night above the
start level), not failing. On night 8 ``L`` = 22.1 s, 1.97x; on night 9
``L`` = 24.8 s, **2.2x: fails**. On night 10 (31.1 s, 3.1x the first night) ``L`` = 27.7 s,
2.5x. A stationary prefix with 20% noise has ``sigma`` ~ 0.2: 1.5x is a 0.41 shift of
medians, ``z`` ~ 1.4, so it is not flagged. Measured on generated stationary histories (8 to
40 nights; log-normal and Student-t(5) noise of 10%, 20% and 30%): no alarm in 76,500
prefix-nights (with the much heavier tails of Student-t(3) noise: one in 76,500). The
price is sensitivity in noisy series: with 5% noise the 12%-a-night
prefix fails the run by night 10 in 99% of histories, with 10% noise in about 60% (it is
reported as drift earlier and fails a night or two later).

Libraries considered: ``apache-otava`` (Hunter's e-divisive, 0.8.0) and MongoDB's
``signal-processing-algorithms`` (2.1.6) both install here only by downgrading numpy (to 2.2
and 1.26) and pull in BigQuery/PostgreSQL/Slack clients or gevent; e-divisive also locates
step changes, while a steady slowdown has no single step. The rule above is a few lines of
numpy, deterministic, and gives the start night and the cumulative ratio directly.

Everything but :func:`load_series` is pure: pandas in, pandas out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import pandas as pd

from prefect_dask_profiling._util import InvalidInput
from prefect_dask_profiling.regression import stats
from prefect_dask_profiling.regression.alert_history import SkippedNight, damaged
from prefect_dask_profiling.regression.baseline import HistoryUnavailable
from prefect_dask_profiling.regression.rule import DriftRule, RegressionRule, Rules
from prefect_dask_profiling.store.runs import RunStore, StoreError

logger = logging.getLogger(__name__)

KEYS = ["stage", "prefix"]
SERIES_COLUMNS = ["run_id", "stage", "prefix", "total_s"]
DRIFT_COLUMNS = ["stage", "prefix", "verdict", "fails", "start_run", "start_started",
                 "start_s", "level_s", "latest_s", "cumulative_ratio", "z", "cusum",
                 "n_nights", "share", "series"]
DRIFT_VERDICTS = ("drift", "ok", "insufficient-history")
MEAN_AD_TO_SIGMA = math.sqrt(math.pi / 2)  # mean |x - mu| = sigma * sqrt(2 / pi) (normal)
# The MAD of a few night-to-night differences often underestimates the noise (it has about a
# third of the efficiency of the standard deviation): the estimate is widened by
# ``1 + SMALL_SAMPLE / sqrt(nights - 1)``, twice as wide with 5 differences, 1.3x with 60.
SMALL_SAMPLE = 2.0
# Each of the recent nights must be above this fraction of the ``min_ratio`` step (on the
# log scale): one or two slow nights in a noisy series are not a sustained shift.
PERSIST = 0.75
# Statuses whose nights belong to a series: a run flagged regressed or drifting is exactly
# the evidence of a drift; failed, incomplete and unjudged runs are not comparable.
SERIES_STATUSES = ("healthy", "regressed", "suspected", "acknowledged")


class DriftVerdict(TypedDict):
    """A row of :data:`DRIFT_COLUMNS` without ``series`` (:func:`detect_drift`): one
    (stage, prefix) of the newest night, whether it drifts and ``fails``, the night the
    drift started (``None``: no drift), the start and recent levels in seconds, their
    ``cumulative_ratio``, ``z`` and ``cusum`` over ``n_nights`` (NaN: too few nights)."""

    stage: str
    prefix: str
    verdict: str
    fails: bool
    start_run: str | None
    start_started: str | None
    start_s: float
    level_s: float
    latest_s: float
    cumulative_ratio: float
    z: float
    cusum: float
    n_nights: int
    share: float


def detect_drift(history: pd.DataFrame, rule: Rules | DriftRule | None = None, *,
                 judged_run: str | None = None) -> pd.DataFrame:
    """Judge every (stage, prefix) series of ``history`` for sustained drift.

    Parameters
    ----------
    history
        Long table ``run_id, stage, prefix, total_s`` (``started`` optional) of every night
        since the baseline start, the judged night included. Nights are ordered by
        ``started`` when present, else by ``run_id``; the newest night is the one judged
        (unless ``judged_run`` is given).
        Rows repeated for one (run, stage, prefix) are added up; a prefix absent from a
        night has no value that night.
    rule
        The settings, validated by the rule itself. A
        :class:`~prefect_dask_profiling.regression.rule.Rules`: its ``drift`` rule
        (``min_ratio``, ``z_threshold``, ``cusum_limit``, ``allowance``, ``start_nights``,
        ``recent_nights``, ``min_nights``) and, from its ``regression`` rule, ``threshold``
        (the cumulative ratio from which a drifting prefix fails the run), ``min_seconds``
        (smallest growth of the level, in seconds), ``min_share`` (smallest share of the
        newest night's task time) and ``mad_floor`` (floor of the noise as a relative
        change). A bare :class:`~prefect_dask_profiling.regression.rule.DriftRule` takes the
        default regression rule; ``None`` the defaults of both.
    judged_run
        The run being judged: its night is the last of every series whatever its ``started``
        (another run of the pipeline may have started later and finished first).

    Returns
    -------
    pandas.DataFrame
        One row per (stage, prefix) of the newest night, columns ``DRIFT_COLUMNS``, drift
        first then by cumulative ratio. ``fails`` is True for drift at or above
        ``threshold``; ``start_run``/``start_started`` name the night the drift started;
        ``series`` is the prefix's totals since the baseline start (a list, oldest first).

    Raises
    ------
    InvalidInput
        When ``rule`` is none of these.
    ValueError
        When ``history`` lacks a column, or ``judged_run`` is not in it.
    """
    rules = _rules(rule)
    missing = [c for c in SERIES_COLUMNS if c not in history.columns]
    if missing:
        raise InvalidInput(f"history lacks column(s) {', '.join(missing)}; it needs "
                           f"{', '.join(SERIES_COLUMNS)}")
    if history.empty:
        return pd.DataFrame(columns=DRIFT_COLUMNS)
    wide, started = _wide(history, judged_run)
    # plain arrays: a pandas call per prefix and night costs more than the judging itself
    values, nights = wide.to_numpy(dtype=float), wide.index.to_numpy()
    newest = values[-1]
    run_total = float(np.nansum(newest))
    rows = []
    for j in np.flatnonzero(~np.isnan(newest)):
        key, column = wide.columns[j], values[:, j]
        present = ~np.isnan(column)
        series, runs = column[present], nights[present]
        share = float(series[-1]) / run_total if run_total > 0 else 0.0
        row = _judge(series, rules.drift, rules.regression, share)
        start = row.pop("start_index")
        row["start_run"] = None if start is None else str(runs[start])
        row["start_started"] = None if start is None else started.get(runs[start])
        row.update(stage=key[0], prefix=key[1], share=share,
                   series=[round(float(v), 4) for v in series])
        rows.append(row)
    out = pd.DataFrame(rows, columns=DRIFT_COLUMNS)
    rank = out["verdict"].map({v: i for i, v in enumerate(DRIFT_VERDICTS)})
    out = out.assign(_rank=rank).sort_values(["_rank", "cumulative_ratio"],
                                             ascending=[True, False], kind="stable")
    return out.drop(columns="_rank").reset_index(drop=True)


def drifted(drift: pd.DataFrame, failing_only: bool = False) -> pd.DataFrame:
    """The rows of ``drift`` whose verdict is ``drift`` (and that fail, if asked)."""
    if drift.empty:
        return drift
    mask = drift["verdict"] == "drift"
    if failing_only:
        mask &= drift["fails"].astype(bool)
    return drift[mask].reset_index(drop=True)


def describe_drift(rows: pd.DataFrame) -> str:
    """One line naming the drifting prefixes, their cumulative ratio and start night."""
    if rows.empty:
        return "no drift"
    parts = [f"{r.stage}/{r.prefix} {r.cumulative_ratio:.1f}x since {r.start_run} "
             f"({r.start_s:.1f} s -> {r.level_s:.1f} s)" for r in rows.itertuples(index=False)]
    noun = "prefix" if len(parts) == 1 else "prefixes"
    return f"drift in {len(parts)} {noun}: " + "; ".join(parts)


@dataclass(frozen=True)
class SeriesRead:
    """What :func:`read_series` read: the series, where it starts, and the nights left out
    because they cannot be read."""

    series: pd.DataFrame
    note: str
    skipped: tuple[SkippedNight, ...] = ()


def load_series(store: RunStore, pipeline: str, version: str, *,
                exclude_run_id: str | None = None, before: str | None = None,
                max_runs: int = 60, keep_first: int = 3) -> tuple[pd.DataFrame, str]:
    """The series of :func:`read_series` and its note; each night left out is named in a
    warning."""
    found = read_series(store, pipeline, version, exclude_run_id=exclude_run_id,
                        before=before, max_runs=max_runs, keep_first=keep_first)
    for night in found.skipped:
        logger.warning("drift series of %s: %s", pipeline, night.line())
    return found.series, found.note


def read_series(store: RunStore, pipeline: str, version: str, *,
                exclude_run_id: str | None = None, before: str | None = None,
                max_runs: int = 60, keep_first: int = 3,
                exclude: Collection[str] = ()) -> SeriesRead:
    """Every night of ``pipeline``/``version`` since the baseline start, as a long table.

    Parameters
    ----------
    store
        Where the runs are.
    pipeline, version
        Whose runs.
    exclude_run_id
        A run never to include (the run being judged, added by the caller).
    before
        Only runs older than this run id count.
    max_runs
        Most runs read; beyond it the first ``keep_first`` runs (the start level) and the
        newest ones are kept, so a long series costs a bounded number of reads.
    keep_first
        Runs kept from the baseline start when the series is longer than ``max_runs``.
    exclude
        Nights the rest of the history left out (unreadable): the series leaves them out
        too, so every family is judged on the same nights.

    Returns
    -------
    SeriesRead
        ``run_id, started, stage, prefix, tasks, total_s`` of the runs with status healthy or
        regressed, from the newest accepted run (or the version's first run) on, oldest
        first; a note naming where the series starts; the nights left out because their
        totals cannot be read (damaged or gone). Each run costs one read, its manifest,
        which carries its totals per prefix
        (:meth:`~prefect_dask_profiling.store.runs.RunStore.read_totals`; runs stored before
        manifests carried them cost their tasks table too).

    Raises
    ------
    HistoryUnavailable
        When the store cannot be listed, or does not answer for a night
        (``StoreUnavailable``): never a series silently thinned by an outage.
    """
    for name, value in (("max_runs", max_runs), ("keep_first", keep_first)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name} must be a whole number >= 1, got {value!r}")
    if keep_first >= max_runs:
        raise InvalidInput(f"keep_first ({keep_first}) must be below max_runs ({max_runs})")
    try:
        accepted = [a for a in store.accepted(pipeline, version)
                    if before is None or a <= before]
        restart = max(accepted) if accepted else None
        window = {"counting": SERIES_STATUSES, "since": restart, "before": before}
        entries = (store.list_runs(pipeline, version, newest=max_runs - keep_first, **window)
                   + store.list_runs(pipeline, version, oldest=keep_first, **window))
    except StoreError as exc:
        raise HistoryUnavailable(f"the drift series of {pipeline} {version} could not be "
                                 f"listed: {exc}") from exc
    left_out = set(exclude)
    ids = sorted({e["run_id"] for e in entries
                 if e["status"] in SERIES_STATUSES and e["run_id"] != exclude_run_id
                 and (before is None or e["run_id"] < before)
                 and (restart is None or e["run_id"] >= restart)
                 and e["run_id"] not in left_out})
    if len(ids) > max_runs:
        ids = ids[:keep_first] + ids[-(max_runs - keep_first):]
    frames, runs, started, skipped = [], [], [], []
    with store.remembering_reads():  # the manifests read for the totals give the start times
        totals = store.read_totals(pipeline, ids)
        manifests = store.read_manifests(pipeline, ids)
    for run_id in ids:
        table = totals[run_id]
        bad = damaged(table, run_id, "its totals")
        if bad is not None:
            skipped.append(bad)
            continue
        frames.append(table)
        runs.append(run_id)
        manifest = manifests.get(run_id)
        started.append(manifest.get("started") if isinstance(manifest, dict) else None)
    note = (f"series since accepted run {restart}" if restart
            else f"series since the first run of version {version}")
    if not frames:
        return SeriesRead(empty_series(), note, tuple(skipped))
    lengths = [len(f) for f in frames]
    out = pd.concat(frames, ignore_index=True)
    out["run_id"] = np.repeat(np.array(runs, dtype=object), lengths)
    out["started"] = np.repeat(np.array(started, dtype=object), lengths)
    return SeriesRead(out[["run_id", "started", "stage", "prefix", "tasks", "total_s"]], note,
                      tuple(skipped))


def merge_drift(verdicts: pd.DataFrame, drift: pd.DataFrame) -> pd.DataFrame:
    """The one-night verdicts with each drifting prefix's verdict set to ``drift``.

    A prefix the one-night rule already calls ``regression`` keeps that verdict; for the
    others (ok, improved, insufficient-history) ``drift`` replaces it and ``cause`` says
    since when and how much. Both tables are left unchanged.
    """
    out = verdicts.copy()
    rows = drifted(drift)
    if rows.empty or out.empty:
        return out
    by_key = {(str(r.stage), str(r.prefix)): r for r in rows.itertuples(index=False)}
    for i, (stage, prefix, verdict) in enumerate(zip(out["stage"].astype(str),
                                                     out["prefix"].astype(str),
                                                     out["verdict"], strict=True)):
        r = by_key.get((stage, prefix))
        if r is None or verdict == "regression":
            continue
        out.iloc[i, out.columns.get_loc("verdict")] = "drift"
        if "cause" in out.columns:
            out.iloc[i, out.columns.get_loc("cause")] = (
                f"{r.cumulative_ratio:.2f}x since {r.start_run}"
                + (" (fails)" if r.fails else ""))
    return out


def flagged(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``verdicts`` (drift merged in) that regressed or drifted."""
    return verdicts[verdicts["verdict"].isin(["regression", "drift"])]


def flagged_series(verdicts: pd.DataFrame, drift: pd.DataFrame | None,
                   nights: int = 8) -> list[dict]:
    """Each flagged prefix's recent totals and baseline, for a compact inline row.

    Parameters
    ----------
    verdicts
        The verdict table (``stage, prefix, verdict, baseline_s, latest_s``, ``ratio``).
    drift
        The drift table (its ``series`` column holds each prefix's totals), or None.
    nights
        How many recent nights to keep (the judged night last).

    Returns
    -------
    list of dict
        ``{stage, prefix, verdict, recent, baseline_s, ratio}`` for each prefix whose verdict
        is regression or drift; ``recent`` is ``[latest_s]`` when no series is known.
    """
    if nights < 1:
        raise InvalidInput(f"nights must be >= 1, got {nights!r}")
    series: dict[tuple[str, str], list] = {}
    if drift is not None and not drift.empty and "series" in drift.columns:
        series = {(str(s), str(p)): v for s, p, v in
                  zip(drift["stage"], drift["prefix"], drift["series"], strict=True)
                  if isinstance(v, list)}
    if verdicts.empty:
        return []
    out = []
    for r in flagged(verdicts).itertuples(index=False):
        key = (str(r.stage), str(r.prefix))
        recent = series.get(key) or [getattr(r, "latest_s", math.nan)]
        ratio = getattr(r, "ratio", math.nan)
        if r.verdict == "drift" and drift is not None and key in series:
            match = drift[(drift["stage"].astype(str) == key[0])
                          & (drift["prefix"].astype(str) == key[1])]
            ratio = float(match["cumulative_ratio"].iloc[0])
        out.append({"stage": key[0], "prefix": key[1], "verdict": r.verdict,
                    "recent": [float(v) for v in recent[-nights:]],
                    "baseline_s": float(getattr(r, "baseline_s", math.nan)),
                    "ratio": float(ratio)})
    return out


def flagged_markdown(verdicts: pd.DataFrame, drift: pd.DataFrame | None,
                     nights: int = 8) -> list[str]:
    """Markdown lines: one compact row per flagged prefix (recent nights, baseline, ratio).

    Empty when nothing is flagged. The judged night is in bold, e.g.
    ``| read/open_dataset | regression 2.5x | 10.1 · 10.4 · 10.2 · **25.3** | 10.3 |``.
    """
    rows = flagged_series(verdicts, drift, nights)
    if not rows:
        return []
    lines = ["## Flagged prefixes: recent nights (seconds)", "",
             "| prefix | verdict | last nights, oldest first | baseline s |",
             "|---|---|---|---|"]
    for r in rows:
        values = [_short(v) for v in r["recent"]]
        values[-1] = f"**{values[-1]}**"
        ratio = f" {r['ratio']:.2f}x" if math.isfinite(r["ratio"]) else ""
        lines.append(f"| {r['stage']}/{r['prefix']} | {r['verdict']}{ratio} | "
                     f"{' · '.join(values)} | {_short(r['baseline_s'])} |")
    return lines


def _short(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


# ---------------------------------------------------------------------- internals
def _judge(x: np.ndarray, drift: DriftRule, one_night: RegressionRule, share: float) -> dict:
    """The verdict of one series (oldest first, the judged night last)."""
    start_nights, recent_nights = drift.start_nights, drift.recent_nights
    min_ratio, cusum_limit = drift.min_ratio, drift.cusum_limit
    row = {"verdict": "insufficient-history", "fails": False, "start_index": None,
           "start_s": math.nan, "level_s": math.nan, "latest_s": float(x[-1]),
           "cumulative_ratio": math.nan, "z": math.nan, "cusum": math.nan, "n_nights": len(x)}
    if len(x) < max(drift.min_nights, start_nights + recent_nights):
        return row
    y = np.log(np.maximum(x, 1e-6))  # a 0 s night is "very fast", not minus infinity
    base = float(np.median(y[:start_nights]))
    level = float(np.median(y[-recent_nights:]))
    diffs = np.diff(y)
    sigma = max(_noise(diffs), math.log1p(one_night.mad_floor))
    sigma *= 1.0 + SMALL_SAMPLE / math.sqrt(len(diffs))
    cusum, start = _cusum((y - base) / sigma, drift.allowance, cusum_limit)
    ratio = math.exp(level - base)
    row.update(start_s=math.exp(base), level_s=math.exp(level), cumulative_ratio=ratio,
               z=(level - base) / (math.sqrt(2.0) * sigma), cusum=float(cusum[-1]),
               verdict="ok")
    sustained = bool(cusum[-1] > cusum_limit
                     and (y[-recent_nights:] > base + PERSIST * math.log(min_ratio)).all())
    if (ratio >= min_ratio and row["z"] >= drift.z_threshold and sustained
            and math.exp(level) - math.exp(base) >= one_night.min_seconds
            and share >= one_night.min_share):
        row.update(verdict="drift", fails=ratio >= one_night.threshold, start_index=start)
    return row


def _noise(diffs: np.ndarray) -> float:
    """Night-to-night noise (log scale) from the differences of consecutive nights.

    The larger of two robust estimates: the MAD (ignores a step entirely, but varies a lot
    with few nights) and the mean absolute deviation (steadier with few nights; a step moves
    it by only ``step / nights``). Both are centred on the median difference, so a steady
    drift does not count as noise; both are scaled to a normal standard deviation.
    """
    median, mad = stats.median_mad(diffs)
    by_mad = stats.robust_spread(mad)
    by_mean = MEAN_AD_TO_SIGMA * float(np.mean(np.abs(diffs - median)))
    return max(by_mad, by_mean) / math.sqrt(2.0)


def _cusum(u: np.ndarray, allowance: float, limit: float) -> tuple[np.ndarray, int | None]:
    """One-sided CUSUM of ``u`` and the index where the first excursion past ``limit`` began."""
    s = np.zeros(len(u))
    last_zero, start, acc = 0, None, 0.0
    for i, value in enumerate(u):
        acc = max(0.0, acc + float(value) - allowance)
        s[i] = acc
        if acc == 0.0:
            last_zero = i + 1
        elif acc > limit and start is None:
            start = min(last_zero, i)
    return s, start


def _wide(history: pd.DataFrame, judged_run: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Nights x (stage, prefix) totals, oldest night first, and each night's start time.

    ``judged_run``, when given, is the last night whatever its start time: two overlapping
    runs of a pipeline must each be judged as themselves.
    """
    frame = history.copy()
    frame["run_id"] = frame["run_id"].astype(str)
    frame["stage"] = frame["stage"].astype(str)
    frame["prefix"] = frame["prefix"].astype(str)
    total = pd.to_numeric(frame["total_s"], errors="coerce")
    frame["total_s"] = total.where(np.isfinite(total) & (total >= 0))
    started: dict = {}
    if "started" in frame.columns:
        started = frame.groupby("run_id")["started"].first().to_dict()
        order = sorted(started, key=lambda r: (str(started[r]), r))
    else:
        order = sorted(frame["run_id"].unique())
    # a cell with no finite total stays absent (min_count=1), not 0
    wide = frame.groupby(["run_id", *KEYS])["total_s"].sum(min_count=1).unstack(KEYS)
    wide = wide.sort_index(axis=1)
    if judged_run is not None:
        judged_run = str(judged_run)
        if judged_run not in order:
            raise InvalidInput(f"judged_run {judged_run!r} is not in the history")
        order = [r for r in order if r != judged_run] + [judged_run]
    wide = wide.reindex(order)
    return wide, {r: (None if pd.isna(v) else str(v)) for r, v in started.items()}


def empty_series() -> pd.DataFrame:
    """A drift series with no nights (the columns of :func:`load_series`)."""
    return pd.DataFrame({"run_id": pd.Series(dtype=object), "started": pd.Series(dtype=object),
                         "stage": pd.Series(dtype=object), "prefix": pd.Series(dtype=object),
                         "tasks": pd.Series(dtype=float), "total_s": pd.Series(dtype=float)})


def _rules(rule: Rules | DriftRule | None) -> Rules:
    """``rule`` as the pair of rules drift reads (validated when they were made)."""
    if rule is None:
        return Rules()
    if isinstance(rule, DriftRule):
        return Rules(drift=rule)
    if not isinstance(rule, Rules):
        raise InvalidInput(f"rule must be a Rules or a DriftRule, got {type(rule).__name__}")
    return rule
