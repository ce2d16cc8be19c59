"""Idle resources against the baseline: a verdict per stage, judged like storage requests.

Reads the stages' ``allocation`` (:mod:`prefect_dask_profiling.cost.allocation`) of the
judged night and of its baseline runs' manifests. The metric is ``idle_hours``: idle
worker-hours (idle share x allocated worker-hours). A stage is ``idle-regression`` when,
with the rule's one-night settings (:class:`~.rule.RegressionRule`):

* **ratio** ``latest / median(history) >= threshold`` (2.0);
* **robust z** ``(latest - median) / spread >= z_threshold`` (3.5), with
  ``spread = max(1.4826 * MAD, MAD_FLOOR * median)`` (:mod:`.stats`, the one home of the
  test); the floor (10%) stands for the night-to-night jitter of a cluster's start;
* **minimum effect**: the idle grew by at least ``60 x min_seconds`` worker-seconds (one
  worker-minute at the default), so small stages stay quiet;
* at least ``min_history`` baseline runs have the stage's allocation (``no-history``
  otherwise; runs stored before allocations were recorded have none).

Its text names the figures ("stage write: 3.10 worker-hours idle, was 0.40") and, when the
stage held more workers on average than before, says so (an adaptive scale-down that did
not happen).

What the verdict does is ``cost_regression`` (:attr:`~.rule.RegressionRule.cost_regression`):
``"warn"`` — informational, never in the run's outcome; ``"fail"`` — through the same
lifecycle as storage requests (:func:`~.confirm.confirm_signals`: one night is never
conclusive, the next confirms or clears it; the episodes of :mod:`.alerts`), and a
confirmed idle regression fails the run. The judge (:mod:`.judge`) decides; this module is
pure: manifests in, a DataFrame out (:data:`COST_VERDICT_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from prefect_dask_profiling.regression import stats
from prefect_dask_profiling.regression.rule import RegressionRule

__all__ = ["COST_METRIC", "COST_VERDICT_COLUMNS", "COST_VERDICTS", "cost_flagged",
           "describe_cost", "detect_idle", "idle_rows"]

COST_METRIC = "idle_hours"
COST_VERDICT_COLUMNS = ["stage", "metric", "verdict", "baseline", "latest", "delta", "ratio",
                        "robust_z", "min_effect", "baseline_idle_share", "latest_idle_share",
                        "baseline_workers", "latest_workers", "n_history", "text"]
COST_VERDICTS = ("idle-regression", "ok", "no-history")
# Night-to-night jitter of a stage's idle worker-hours without a change (workers arriving
# a few seconds apart): the spread is never taken below 10% of the median.
MAD_FLOOR = 0.10


class CostVerdict(stats.MetricVerdict):
    """A row of :data:`COST_VERDICT_COLUMNS` (figures in worker-hours): the stage's idle
    share and mean workers, tonight and in the baseline (NaN without enough history), and
    the finding in words (``""`` unless it regressed)."""

    baseline_idle_share: float
    latest_idle_share: float
    baseline_workers: float
    latest_workers: float
    text: str


def idle_rows(manifest: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per stage of one run: idle worker-hours, idle share and mean workers held."""
    out = {}
    for stage in manifest.get("stages") or []:
        alloc = stage.get("allocation") if isinstance(stage, Mapping) else None
        if not isinstance(alloc, Mapping) or alloc.get("idle_share") is None:
            continue
        worker_s, wall_s = float(alloc.get("worker_s") or 0.0), float(alloc.get("wall_s") or 0.0)
        share = float(alloc["idle_share"])
        out[str(stage.get("name"))] = {"idle_h": worker_s * share / 3600.0, "share": share,
                                       "workers": worker_s / wall_s if wall_s > 0 else 0.0}
    return out


def _text(stage: str, latest: dict[str, float], base: dict[str, float]) -> str:
    text = (f"stage {stage}: {latest['idle_h']:.2f} worker-hours idle, was "
            f"{base['idle_h']:.2f} (idle share {latest['share']:.0%}, was {base['share']:.0%})")
    if latest["workers"] > 1.2 * base["workers"]:
        text += (f"; it held {latest['workers']:.1f} workers on average, was "
                 f"{base['workers']:.1f}: did the adaptive scale-down happen?")
    return text


def detect_idle(history: Iterable[Mapping[str, Any]], tonight: Mapping[str, Any],
                rule: RegressionRule | None = None) -> pd.DataFrame:
    """Idle verdicts per stage of ``tonight`` against the baseline runs' manifests.

    Parameters
    ----------
    history
        The baseline runs' manifests (their ``stages[].allocation``).
    tonight
        The judged run's manifest, or the same ``stages`` before it is written.
    rule
        ``threshold``, ``z_threshold``, ``min_seconds`` (x 60: the minimum growth in idle
        worker-seconds) and ``min_history``; ``cost_regression="off"`` judges nothing.

    Returns
    -------
    One row per stage of tonight with an allocation (:data:`COST_VERDICT_COLUMNS`); figures
    in worker-hours (``baseline``, ``latest``, ``delta``, ``min_effect``).
    """
    rule = rule if rule is not None else RegressionRule()
    if rule.cost_regression == "off":
        return pd.DataFrame(columns=COST_VERDICT_COLUMNS)
    past = [idle_rows(m) for m in history]
    effect = 60.0 * rule.min_seconds / 3600.0
    rows = []
    for stage, latest in idle_rows(tonight).items():
        seen = [p[stage] for p in past if stage in p]
        row: CostVerdict = {
            "stage": stage, "metric": COST_METRIC, "verdict": "no-history",
            "baseline": np.nan, "latest": latest["idle_h"], "delta": np.nan,
            "ratio": np.nan, "robust_z": np.nan, "min_effect": effect,
            "baseline_idle_share": np.nan, "latest_idle_share": latest["share"],
            "baseline_workers": np.nan, "latest_workers": latest["workers"],
            "n_history": len(seen), "text": ""}
        if len(seen) >= rule.min_history:
            _judge(row, latest, seen, rule)
        rows.append(row)
    return pd.DataFrame(rows, columns=COST_VERDICT_COLUMNS)


def _judge(row: CostVerdict, latest: dict[str, float], seen: list[dict[str, float]],
           rule: RegressionRule) -> None:
    """Fill in ``row``'s verdict of a stage with enough history: the robust ratio + z
    test."""
    median, mad = stats.median_mad(np.array([s["idle_h"] for s in seen]))
    spread = stats.robust_spread(mad, MAD_FLOOR * median)
    now = latest["idle_h"]
    ratio, z = stats.ratio(now, median), stats.robust_z(now, median, spread)
    flagged = (ratio >= rule.threshold and z >= rule.z_threshold
               and now - median >= row["min_effect"])
    base = {"idle_h": median,
            "share": float(np.median([s["share"] for s in seen])),
            "workers": float(np.median([s["workers"] for s in seen]))}
    row.update({"verdict": "idle-regression" if flagged else "ok", "baseline": median,
                "delta": now - median, "ratio": ratio, "robust_z": z,
                "baseline_idle_share": base["share"], "baseline_workers": base["workers"],
                "text": _text(row["stage"], latest, base) if flagged else ""})


def cost_flagged(verdicts: pd.DataFrame) -> list[str]:
    """The texts of the stages whose idle resources regressed."""
    if verdicts.empty:
        return []
    return [str(t) for t in verdicts.loc[verdicts["verdict"] == "idle-regression", "text"]]


def describe_cost(rows: pd.DataFrame) -> str:
    """One line naming the stages whose idle worker-hours regressed (the outcome's message
    under ``cost_regression="fail"``)."""
    texts = cost_flagged(rows)
    return "idle resources: " + "; ".join(texts) if texts else "no idle regression"
