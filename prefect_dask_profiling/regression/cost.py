"""Idle resources against the baseline: an informational verdict per stage.

Reads the stages' ``allocation`` (:mod:`prefect_dask_profiling.summary.allocation`) of the
judged night and of its baseline runs' manifests. A stage whose idle worker-hours (idle share
x allocated worker-hours) exceed ``threshold`` x the baseline median, by more than
``min_seconds`` worker-seconds, is ``idle-regression``; its text names the figures ("stage
write: 3.10 worker-hours idle, was 0.40") and, when the stage held more workers on average
than before, says so (an adaptive scale-down that did not happen). Runs stored before
allocations were recorded give no history: the stage is ``no-history``.

Pure: no I/O. The verdict is informational (``cost_regression="warn"``): it never fails
the run or counts in its outcome.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

__all__ = ["COST_VERDICT_COLUMNS", "COST_VERDICTS", "cost_flagged", "detect_idle",
           "idle_rows"]

COST_VERDICT_COLUMNS = ["stage", "verdict", "baseline_idle_h", "latest_idle_h", "ratio",
                        "baseline_idle_share", "latest_idle_share", "baseline_workers",
                        "latest_workers", "n_history", "text"]
COST_VERDICTS = ("idle-regression", "ok", "no-history")


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
                threshold: float = 2.0, min_seconds: float = 60.0,
                min_history: int = 1) -> pd.DataFrame:
    """Idle verdicts per stage of ``tonight`` against the baseline runs' manifests.

    Parameters
    ----------
    history
        The baseline runs' manifests (their ``stages[].allocation``).
    tonight
        The judged run's manifest, or the same ``stages`` before it is written.
    threshold
        Ratio of idle worker-hours to the baseline median that counts as a regression.
    min_seconds
        Idle worker-seconds the stage must have grown by (small stages stay quiet).
    min_history
        Baseline runs with the stage needed for a verdict.

    Returns
    -------
    One row per stage of tonight with an allocation (:data:`COST_VERDICT_COLUMNS`).
    """
    past = [idle_rows(m) for m in history]
    rows = []
    for stage, latest in idle_rows(tonight).items():
        seen = [p[stage] for p in past if stage in p]
        if len(seen) < min_history:
            rows.append({"stage": stage, "verdict": "no-history",
                         "latest_idle_h": latest["idle_h"],
                         "latest_idle_share": latest["share"],
                         "latest_workers": latest["workers"], "n_history": len(seen),
                         "text": ""})
            continue
        base = {k: statistics.median(s[k] for s in seen) for k in ("idle_h", "share", "workers")}
        ratio = latest["idle_h"] / base["idle_h"] if base["idle_h"] > 0 else float("inf")
        grew = (latest["idle_h"] - base["idle_h"]) * 3600.0 > min_seconds
        verdict = "idle-regression" if grew and ratio >= threshold else "ok"
        rows.append({"stage": stage, "verdict": verdict, "baseline_idle_h": base["idle_h"],
                     "latest_idle_h": latest["idle_h"], "ratio": ratio,
                     "baseline_idle_share": base["share"], "latest_idle_share": latest["share"],
                     "baseline_workers": base["workers"], "latest_workers": latest["workers"],
                     "n_history": len(seen),
                     "text": _text(stage, latest, base) if verdict != "ok" else ""})
    return pd.DataFrame(rows, columns=COST_VERDICT_COLUMNS)


def cost_flagged(verdicts: pd.DataFrame) -> list[str]:
    """The texts of the stages whose idle resources regressed."""
    if verdicts.empty:
        return []
    return [str(t) for t in verdicts.loc[verdicts["verdict"] == "idle-regression", "text"]]
