"""Regression verdicts: each prefix's latest total time against the median of its history.

The basic rule — flag prefixes whose time more than doubled against the median of the last
few runs — made robust for nightly use on shared cloud machines:

* **ratio** ``latest / median(history) >= threshold`` (2.0: "more than doubled");
* **robust z** ``(latest - median) / spread >= z_threshold`` (3.5, Iglewicz & Hoaglin's
  modified-z cut-off), where ``spread = max(1.4826 * MAD, mad_floor * median, abs_floor_s)``.
  1.4826 * MAD estimates the standard deviation of normal noise while ignoring outliers in the
  history. The floors keep z finite and honest when the history is (nearly) constant: no
  nightly timing is truly repeatable to better than a few percent (``mad_floor`` = 5% of the
  median), and sub-second prefixes are dominated by timer and scheduling jitter
  (``abs_floor_s`` = 0.1 s);
* **minimum effect**: the increase is at least ``min_seconds`` and the prefix carries at least
  ``min_share`` of the latest run's task time, or tonight's seconds are at least
  ``min_share`` of the usual run's (the baseline medians' sum: a regression in another
  stage that inflates tonight's total does not hide this one), so tiny prefixes never fail
  a flow.

With 20 prefixes checked per night, a plain one-sided 3-sigma rule would alarm on ~3% of
nights; the ratio gate and the robust z together leave noise of +-20% practically no way to
alarm, while a 2.2x slowdown of a prefix carrying 5% of the run always does (see the tests).
Improvements mirror the rule (``ratio <= 1 / threshold``, ``z <= -z_threshold``, share of the
baseline). The cause splits ``log(ratio) = log(tasks ratio) + log(per-task ratio)``: "more
tasks" (e.g. a catalogue returning twice the items), "slower tasks" (e.g. a dependency that
lost range-request merging) or "both".

The settings, their defaults and their ranges live in :class:`~.rule.RegressionRule`;
whether a whole run counts as regressed is :func:`run_outcome`.

Everything here is pure: pandas in, pandas out, no I/O. The tables are small (prefixes x
runs), so the work is done on numpy arrays indexed by a (stage, prefix) code: pandas'
per-call overhead would otherwise dominate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TypedDict, Unpack

import numpy as np
import pandas as pd

from prefect_dask_profiling._util import InvalidInput
from prefect_dask_profiling.errors import VerdictFailed
from prefect_dask_profiling.regression import stats
from prefect_dask_profiling.regression.rule import (
    CHECK_OPTION_KEYS,
    RegressionRule,
    RuleSettings,
)

KEYS = ["stage", "prefix"]
HISTORY_COLUMNS = ["run_id", "stage", "prefix", "tasks", "total_s"]
LATEST_COLUMNS = ["stage", "prefix", "tasks", "total_s"]
VERDICTS = ("regression", "improved", "new", "vanished", "insufficient-history", "ok")
OUTPUT_COLUMNS = ["stage", "prefix", "baseline_s", "latest_s", "delta_s", "ratio", "robust_z",
                  "baseline_tasks", "latest_tasks", "tasks_ratio", "per_task_ratio", "share",
                  "n_history", "verdict", "cause", "note"]
# Share of log(ratio) explained by the task count above which "more tasks" is the cause,
# below (1 - this) "slower tasks", in between "both".
CAUSE_SPLIT = 0.75


class PrefixVerdict(TypedDict):
    """A row of :data:`OUTPUT_COLUMNS` (:func:`detect_regressions`): one (stage, prefix),
    tonight's seconds and tasks against the baseline medians of ``n_history`` runs, the
    ``verdict``, its ``cause`` and a ``note`` on values ignored (NaN: not measured)."""

    stage: str
    prefix: str
    baseline_s: float
    latest_s: float
    delta_s: float
    ratio: float
    robust_z: float
    baseline_tasks: float
    latest_tasks: float
    tasks_ratio: float
    per_task_ratio: float
    share: float
    n_history: int
    verdict: str
    cause: str
    note: str


class RegressionDetected(VerdictFailed):
    """Raised (by the runner) when at least one prefix regressed.

    Attributes
    ----------
    verdicts
        The full verdict table from :func:`detect_regressions`.
    """

    def __init__(self, verdicts: pd.DataFrame, message: str | None = None) -> None:
        self.verdicts = verdicts
        super().__init__(message or describe(regressed(verdicts)))


def regressed(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``verdicts`` whose verdict is ``"regression"``."""
    return verdicts[verdicts["verdict"] == "regression"].reset_index(drop=True)


def describe(rows: pd.DataFrame) -> str:
    """One line naming the regressed prefixes, their ratio, seconds and cause."""
    if rows.empty:
        return "no regression"
    parts = []
    for r in rows.itertuples(index=False):
        ratio = f"{r.ratio:.1f}x" if math.isfinite(r.ratio) else "from zero"
        cause = f", {r.cause}" if r.cause else ""
        parts.append(f"{r.stage}/{r.prefix} {ratio} ({r.baseline_s:.1f} s -> "
                     f"{r.latest_s:.1f} s{cause})")
    noun = "prefix" if len(parts) == 1 else "prefixes"
    return f"regression in {len(parts)} {noun}: " + "; ".join(parts)


@dataclass(frozen=True)
class RunOutcome:
    """What a run's verdicts mean for the run as a whole.

    Attributes
    ----------
    regressed
        The run counts as regressed: judged, not failed or incomplete, and at least one
        prefix regressed. Only such a run fails a flow (``on_regression="fail"``) or makes
        ``dask-profiling check`` exit 1.
    judged
        A verdict table exists for the run.
    reason
        Why the run is not judged regressed although prefixes regressed, or why it is not
        judged; empty otherwise.
    """

    regressed: bool
    judged: bool
    reason: str = ""


def run_outcome(verdicts: pd.DataFrame | None, *, failed: bool = False,
                incomplete: bool = False) -> RunOutcome:
    """Whether a run counts as regressed, from its verdicts and how the run ended.

    A run that failed or whose record is incomplete is never judged regressed: its times
    are partial, so a "regression" would only say that it stopped early (the failure is
    reported on its own). A run without verdicts (the check could not run) is unjudged.

    Parameters
    ----------
    verdicts
        The output of :func:`detect_regressions`, or ``None`` when it could not be computed.
    failed
        The flow body raised, or the flow run ended in a failed state for another reason.
    incomplete
        The run's record is incomplete (the final collection failed).
    """
    if verdicts is None:
        return RunOutcome(regressed=False, judged=False, reason="the verdict was not computed")
    flagged = bool((verdicts["verdict"] == "regression").any()) if len(verdicts) else False
    if flagged and (failed or incomplete):
        why = "failed" if failed else "incomplete"
        return RunOutcome(regressed=False, judged=True,
                          reason=f"the run is {why}: its regressed prefixes do not count")
    return RunOutcome(regressed=flagged, judged=True)


def detect_regressions(history: pd.DataFrame, latest: pd.DataFrame, *,
                       rule: RegressionRule | None = None,
                       **settings: Unpack[RuleSettings]) -> pd.DataFrame:
    """Compare the latest run's per-prefix times against the baseline runs.

    Parameters
    ----------
    history
        Long table of the baseline runs: ``run_id, stage, prefix, tasks, total_s`` (other
        columns are ignored). Rows repeated for one (run, stage, prefix) are added up.
    latest
        The latest run's summary: ``stage, prefix, tasks, total_s`` (the ``tasks.csv`` columns).
    rule
        The settings of the check; default :class:`~.rule.RegressionRule` ().
    **settings
        Single settings by name, overriding ``rule``: ``threshold`` (minimum
        ``latest / baseline`` ratio, > 1; an improvement needs ``ratio <= 1 / threshold``),
        ``z_threshold`` (minimum robust z), ``min_seconds`` (minimum absolute change),
        ``min_share`` (minimum share of the run's task time: of the latest run for a
        regression, of the baseline for an improvement), ``min_history`` (minimum number of
        baseline runs, overall and for the prefix), ``mad_floor`` (floor of the spread as a
        fraction of the median), ``abs_floor_s`` (absolute floor of the spread, seconds).
        Defaults, ranges and reasons: :class:`~.rule.RegressionRule`.

    Returns
    -------
    One row per (stage, prefix) with the columns in ``OUTPUT_COLUMNS``: regressions first,
    then by share. ``verdict`` is one of regression, improved, new, vanished,
    insufficient-history, ok; ``cause`` is "more tasks", "slower tasks" or "both" for
    regressions ("fewer tasks", "faster tasks" or "both" for improvements), else empty.
    Non-finite or negative times are treated as missing; ``note`` says so.

    Raises
    ------
    ValueError
        For a setting out of range or unknown (``InvalidInput``), or a table that lacks a
        column.
    """
    rule = _rule(rule, settings)
    _require(history, HISTORY_COLUMNS, "history")
    _require(latest, LATEST_COLUMNS, "latest")
    codes = _Codes()
    hist = _Rows.read(history, codes, "history")
    last = _Rows.read(latest, codes, "latest")
    runs = _Codes()
    hist_runs = np.array([runs.code(str(r)) for r in history["run_id"]], dtype=np.intp)
    out = _baseline(hist, hist_runs[hist.kept], len(codes), len(runs), rule.mad_floor,
                    rule.abs_floor_s)
    out.update(_latest(last, len(codes)))
    _measure(out)
    n_runs_ok = len(np.unique(hist_runs[hist.kept])) >= rule.min_history
    out["verdict"] = _verdicts(out, n_runs_ok, rule)
    out["cause"] = _causes(out)
    out["stage"] = np.array([k[0] for k in codes.keys], dtype=object)
    out["prefix"] = np.array([k[1] for k in codes.keys], dtype=object)
    out["note"] = np.array(["; ".join(hist.notes.get(i, []) + last.notes.get(i, []))
                            for i in range(len(codes))], dtype=object)
    rank = {v: i for i, v in enumerate(VERDICTS)}
    order = np.lexsort((-np.nan_to_num(out["baseline_s"], nan=0.0), -out["share"],
                        np.array([rank[v] for v in out["verdict"]])))
    return pd.DataFrame({c: out[c][order] for c in OUTPUT_COLUMNS})


class _Codes:
    """Dense integer codes for hashable keys, in first-seen order."""

    def __init__(self) -> None:
        self.index: dict = {}
        self.keys: list = []

    def code(self, key) -> int:
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.keys)
            self.keys.append(key)
        return found

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class _Rows:
    """One input table as arrays: key codes, seconds, task counts, and notes per key."""

    key: np.ndarray
    seconds: np.ndarray
    tasks: np.ndarray
    kept: np.ndarray
    notes: dict[int, list[str]]

    @classmethod
    def read(cls, frame: pd.DataFrame, codes: _Codes, name: str) -> _Rows:
        """Codes for every row; rows with a non-finite or negative time are dropped (noted),
        a non-finite or negative task count becomes NaN (the cause is then left empty)."""
        key = np.array([codes.code((str(s), str(p)))
                        for s, p in zip(frame["stage"], frame["prefix"], strict=True)],
                       dtype=np.intp)
        seconds = pd.to_numeric(frame["total_s"], errors="coerce").to_numpy(float, na_value=np.nan)
        tasks = pd.to_numeric(frame["tasks"], errors="coerce").to_numpy(float, na_value=np.nan)
        tasks = np.where(np.isfinite(tasks) & (tasks >= 0), tasks, np.nan)
        with np.errstate(invalid="ignore"):
            kept = np.isfinite(seconds) & (seconds >= 0)
        notes: dict[int, list[str]] = {}
        bad_keys, counts = np.unique(key[~kept], return_counts=True)
        for k, n in zip(bad_keys.tolist(), counts.tolist(), strict=True):
            what = "value" if n == 1 else "values"
            notes[k] = [f"{n} non-finite or negative {name} total_s {what} ignored"]
        return cls(key[kept], seconds[kept], tasks[kept], kept, notes)


def _baseline(hist: _Rows, run: np.ndarray, n_keys: int, n_runs: int, mad_floor: float,
              abs_floor_s: float) -> dict[str, np.ndarray]:
    """Per key: median seconds and tasks over the runs, robust spread, number of runs."""
    seconds = _matrix(hist.key, run, hist.seconds, n_keys, n_runs)
    tasks = _matrix(hist.key, run, hist.tasks, n_keys, n_runs)
    if n_runs:  # keys only in the latest run: all-NaN rows -> NaN
        median, mad = stats.median_mad(seconds, axis=1)
        median_tasks, _ = stats.median_mad(tasks, axis=1)
    else:
        median = mad = median_tasks = np.full(n_keys, np.nan)
    spread = stats.robust_spread(mad, mad_floor * median, abs_floor_s)
    return {"baseline_s": median, "spread_s": spread, "baseline_tasks": median_tasks,
            "n_history": (~np.isnan(seconds)).sum(axis=1)}


def _matrix(key: np.ndarray, run: np.ndarray, values: np.ndarray, n_keys: int,
            n_runs: int) -> np.ndarray:
    """A keys x runs matrix of summed values, NaN where a key is absent from a run."""
    total = np.zeros((n_keys, n_runs))
    count = np.zeros((n_keys, n_runs), dtype=np.intp)
    np.add.at(total, (key, run), values)
    np.add.at(count, (key, run), 1)
    total[count == 0] = np.nan
    return total


def _latest(last: _Rows, n_keys: int) -> dict[str, np.ndarray]:
    """Per key: the latest run's seconds and tasks (NaN where absent)."""
    matrix = _matrix(last.key, np.zeros_like(last.key), last.seconds, n_keys, 1)
    tasks = _matrix(last.key, np.zeros_like(last.key), last.tasks, n_keys, 1)
    return {"latest_s": matrix[:, 0], "latest_tasks": tasks[:, 0]}


def _measure(out: dict[str, np.ndarray]) -> None:
    """Add the change columns (delta, ratios, robust z, shares) to ``out`` in place."""
    latest, baseline = out["latest_s"], out["baseline_s"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out["delta_s"] = latest - baseline
        out["ratio"] = stats.ratio(latest, baseline)
        out["robust_z"] = stats.robust_z(latest, baseline, out["spread_s"])
        out["tasks_ratio"] = stats.ratio(out["latest_tasks"], out["baseline_tasks"])
        out["per_task_ratio"] = out["ratio"] / out["tasks_ratio"]
    out["share"] = _fraction(latest)
    # an improvement is judged by the share the prefix had in the baseline
    out["baseline_share"] = _fraction(baseline)
    # tonight's seconds against the usual run's total: a regression elsewhere inflates
    # tonight's total and must not push a prefix under the floor
    usual = float(np.nansum(baseline))
    with np.errstate(over="ignore"):  # a subnormal total: the share is inf, not an error
        out["usual_share"] = np.nan_to_num(latest, nan=0.0) / usual if usual > 0 else \
            np.zeros_like(latest)


def _fraction(values: np.ndarray) -> np.ndarray:
    values = np.nan_to_num(values, nan=0.0)
    total = values.sum()
    with np.errstate(over="ignore"):  # a subnormal total (Hypothesis found 2.2e-311 s)
        return values / total if total > 0 else np.zeros_like(values)


def _rule(rule: RegressionRule | None, settings: RuleSettings) -> RegressionRule:
    """``rule`` (default settings when None) with single ``settings`` replaced, validated."""
    if rule is not None and not isinstance(rule, RegressionRule):
        raise InvalidInput(f"rule must be a RegressionRule, got {type(rule).__name__}")
    unknown = sorted(set(settings) - {"threshold", *CHECK_OPTION_KEYS})
    if unknown:
        raise InvalidInput(f"unknown regression setting(s) {unknown}; allowed: "
                           f"{['threshold', *CHECK_OPTION_KEYS]}")
    base = rule if rule is not None else RegressionRule()
    return replace(base, **settings) if settings else base


def _require(frame: pd.DataFrame, columns: list[str], name: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise InvalidInput(f"{name} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InvalidInput(f"{name} is missing column(s): {', '.join(missing)}")


def _verdicts(out: dict[str, np.ndarray], n_runs_ok: bool, rule: RegressionRule) -> np.ndarray:
    """The verdict of each key; the first matching condition wins."""
    threshold, z_threshold = rule.threshold, rule.z_threshold
    min_seconds, min_share, min_history = rule.min_seconds, rule.min_share, rule.min_history
    has_latest, n = ~np.isnan(out["latest_s"]), out["n_history"]
    ratio, z, delta = out["ratio"], out["robust_z"], out["delta_s"]
    with np.errstate(invalid="ignore"):
        up = ((ratio >= threshold) & (z >= z_threshold) & (delta >= min_seconds)
              & ((out["share"] >= min_share) | (out["usual_share"] >= min_share)))
        down = ((ratio <= 1 / threshold) & (z <= -z_threshold) & (-delta >= min_seconds)
                & (out["baseline_share"] >= min_share))
    conditions = [np.full(len(n), not n_runs_ok), (n == 0) & has_latest, n == 0,
                  ~has_latest, n < min_history, up, down]
    choices = ["insufficient-history", "new", "insufficient-history", "vanished",
               "insufficient-history", "regression", "improved"]
    return np.select(conditions, choices, default="ok").astype(object)


def _causes(out: dict[str, np.ndarray]) -> np.ndarray:
    """Which factor explains the change: the task count, the time per task, or both.

    ``log(ratio) = log(tasks_ratio) + log(per_task_ratio)``: the fraction explained by the
    task count decides (>= CAUSE_SPLIT: tasks; <= 1 - CAUSE_SPLIT: per-task time; else both).
    A task count going from or to zero is all "tasks"; an unknown task count gives no cause.
    """
    up, down = out["verdict"] == "regression", out["verdict"] == "improved"
    ratio, tasks_ratio = out["ratio"], out["tasks_ratio"]
    with np.errstate(divide="ignore", invalid="ignore"):
        explained = np.log(tasks_ratio) / np.log(ratio)
    all_tasks = (tasks_ratio == 0) | np.isposinf(tasks_ratio)
    by_tasks = all_tasks | (explained >= CAUSE_SPLIT)
    by_time = ~all_tasks & ((explained <= 1 - CAUSE_SPLIT) | np.isnan(explained))
    known = (up | down) & ~np.isnan(tasks_ratio)
    return np.select(
        [~known, by_tasks & up, by_tasks, by_time & up, by_time],
        ["", "more tasks", "fewer tasks", "slower tasks", "faster tasks"],
        default="both").astype(object)
