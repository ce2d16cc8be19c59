"""Memory verdicts: each stage's peak memory and spilled bytes against the healthy baseline.

Judged like time (:mod:`~prefect_dask_profiling.regression.verdict`), with the memory
settings of the same :class:`~prefect_dask_profiling.regression.rule.RegressionRule`:

* ``memory-regression`` when, for a metric (``peak_bytes``: the stage's largest worker
  process memory; ``spilled_bytes``: bytes spilled to disk while it ran), all three hold:

  - **ratio** ``latest / median(history) >= memory_threshold`` (1.5);
  - **z** ``(latest - median) / spread >= memory_z_threshold`` (6), with
    ``spread = max(1.4826 * MAD, (max - min) / 2, memory_mad_floor * median, 16 MiB)`` of
    the history: eight nights give too unsteady a MAD on its own, and half the range makes
    a noisy (or once-spiking) history more cautious, never more eager; a quiet history
    leaves the 10% floor, so there a 1.5x jump is enough;
  - **minimum effect**: the increase is at least ``min(memory_min_fraction x the worker
    memory limit, memory_min_bytes)`` — 10% of the limit or 256 MiB, whichever is smaller —
    so a stage that went from 40 to 90 MiB on 16 GiB workers never fails a flow;

* an **onset** — a ``memory-regression`` of a metric none of whose baseline nights reached
  the minimum effect (a stage that has not spilled, spilling tonight) — needs more nights in
  a row to confirm than the usual two (:func:`onset_nights`): a few clean nights cannot
  tell a stage that never spills from one that spills on one night in ten;

* ``near-oom`` (metric ``headroom``) when tonight's headroom — min over workers of
  ``(limit - peak process) / limit`` — is under ``near_oom_headroom`` (10%). It needs no
  history: a stage that ran within 10% of the limit is one bad chunk from a killed worker.

The defaults were chosen on generated histories (``benchmarks/memory_rule.py``, and
``tests/regression/test_memory_rule.py``): peaks that vary by +-20% night to night plus late garbage
collections on 5% of nights (+10-25%), and spills that vary by +-30% (or +-50%), give no
alarm over 80,000 stage-metric-nights (with collections up to +35%: 4 in 80,000). On such
noisy histories a tripled peak is caught on 98.7% of nights, a doubled one on 49%: +-20%
noise hides part of a doubling. On the quiet histories of a real cluster (peaks repeat to
a few MiB) the 10% floor rules and a 1.5x jump is caught (``tests/summary/test_memory.py``: 150 MB
more per task on 1 GiB workers, 1.67x). Nothing is flagged while the increase is under the
minimum effect.

Everything here is pure: rows in, a DataFrame out (:data:`MEMORY_VERDICT_COLUMNS`), no I/O.
:func:`history_from_manifests` and :func:`latest_from_manifest` read the rows from stored
manifests (``stages[].memory``, :class:`~prefect_dask_profiling.summary.memory.StageMemory`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal, TypedDict, cast

import numpy as np
import pandas as pd

from prefect_dask_profiling._util import InvalidInput, finite_number
from prefect_dask_profiling.regression import stats
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store.manifest import Manifest

__all__ = ["MEMORY_METRICS", "MEMORY_VERDICTS", "MEMORY_VERDICT_COLUMNS", "MemoryRow",
           "MemoryVerdict", "describe_memory", "detect_memory", "history_from_manifests",
           "latest_from_manifest", "min_effect", "onset_nights"]

MEMORY_METRICS: tuple[Literal["peak_bytes", "spilled_bytes"], ...] = ("peak_bytes",
                                                                     "spilled_bytes")
MEMORY_VERDICTS = ("memory-regression", "near-oom", "insufficient-history", "ok")
MEMORY_VERDICT_COLUMNS = ["stage", "metric", "verdict", "baseline", "latest", "delta",
                          "ratio", "robust_z", "min_effect", "memory_limit", "headroom",
                          "n_history", "nights_needed", "note"]
ABS_FLOOR_BYTES = 16 * 2**20  # no process memory repeats to better than a few MiB


class MemoryRow(TypedDict, total=False):
    """One stage of one run, as the memory judge reads it.

    ``run_id`` only in history rows. ``memory_limit`` is the smallest worker limit (0 or
    missing when unknown); ``headroom`` is ``None`` without a limit.
    """

    run_id: str
    stage: str
    peak_bytes: float
    spilled_bytes: float
    memory_limit: float
    headroom: float | None


class MemoryVerdict(stats.MetricVerdict):
    """A row of :data:`MEMORY_VERDICT_COLUMNS`: the stage's smallest worker
    ``memory_limit`` (``None``: unknown), its ``headroom``, the flagged nights in a row that
    confirm it (:func:`onset_nights` for an onset) and the verdict in words."""

    memory_limit: float | None
    headroom: float | None
    nights_needed: int
    note: str


def min_effect(memory_limit: float | None, rule: RegressionRule) -> float:
    """The smallest increase that can be a memory regression: ``min(fraction x limit, bytes)``.

    Without a known limit, ``memory_min_bytes``.
    """
    if not memory_limit or memory_limit <= 0 or not math.isfinite(memory_limit):
        return float(rule.memory_min_bytes)
    return float(min(rule.memory_min_fraction * memory_limit, rule.memory_min_bytes))


def onset_nights(n_history: int, rule: RegressionRule) -> int:
    """Flagged nights in a row an onset needs to confirm, after ``n_history`` clean nights.

    An onset is a metric none of whose baseline nights reached the minimum effect (a stage
    that has not spilled). ``n`` clean nights cannot rule out an occasional rate of
    ``1 / (n + 2)`` (Laplace's rule of succession), so ``k`` flagged nights in a row confirm
    it when ``(1 / (n + 2)) ** k <= rule.memory_onset_chance``; never fewer than the two
    nights of any other memory verdict.
    """
    rate, nights = 1.0 / (max(n_history, 0) + 2), 2
    while rate ** nights > rule.memory_onset_chance * (1 + 1e-9):  # 1e-9: float rounding
        nights += 1
    return nights


def detect_memory(history: Iterable[MemoryRow] | pd.DataFrame,
                  latest: Iterable[MemoryRow] | pd.DataFrame,
                  rule: RegressionRule | None = None) -> pd.DataFrame:
    """Memory verdicts per stage and metric for tonight's stages.

    Parameters
    ----------
    history
        The baseline: one row per (healthy run, stage) with ``run_id``, ``stage``,
        ``peak_bytes``, ``spilled_bytes`` (and ``memory_limit``). Stages missing from a run
        simply have fewer history points.
    latest
        Tonight: one row per stage with ``stage``, ``peak_bytes``, ``spilled_bytes``,
        ``memory_limit`` and ``headroom``.
    rule
        The settings (``memory_*``, ``near_oom*``, ``min_history``); default
        :class:`RegressionRule`.

    Returns
    -------
    pandas.DataFrame
        :data:`MEMORY_VERDICT_COLUMNS`, one row per (stage, metric) that is switched on:
        ``peak_bytes`` and ``spilled_bytes`` when ``rule.memory_regression``, ``headroom``
        when ``rule.near_oom``. ``verdict`` is one of :data:`MEMORY_VERDICTS`; ``baseline``
        is the history median (bytes; for ``headroom`` the median headroom), ``latest``
        tonight's value, ``ratio`` ``latest / baseline`` (inf from zero), ``robust_z`` as
        in the module docstring, ``min_effect`` the bytes the increase had to reach,
        ``n_history`` the number of baseline runs that had the stage, ``nights_needed``
        the flagged nights in a row that confirm it (:func:`onset_nights` for an onset,
        else 2).

    Raises
    ------
    InvalidInput
        When a table lacks a required column or holds a negative or non-numeric value.
    """
    rule = rule or RegressionRule()
    hist = _frame(history, "history", ["run_id", "stage", *MEMORY_METRICS])
    now = _frame(latest, "latest", ["stage", *MEMORY_METRICS])
    rows: list[MemoryVerdict] = []
    # numpy arrays indexed per stage: pandas' per-call overhead would dominate otherwise
    index = hist.groupby("stage", sort=False).indices
    values = {m: hist[m].to_numpy(dtype=float) for m in MEMORY_METRICS}
    headrooms = pd.to_numeric(hist["headroom"], errors="coerce").to_numpy(dtype=float) \
        if "headroom" in hist else np.full(len(hist), np.nan)
    none = np.array([], dtype=int)
    for rec in cast(list[MemoryRow], now.to_dict("records")):
        stage = str(rec["stage"])
        limit = finite_number(rec.get("memory_limit"))
        at = index.get(stage, none)
        if rule.memory_regression:
            for metric in MEMORY_METRICS:
                rows.append(_judge_metric(stage, metric, float(rec[metric]),
                                          values[metric][at], limit,
                                          finite_number(rec.get("headroom")), rule))
        if rule.near_oom:
            rows.append(_judge_headroom(stage, rec, headrooms[at], limit, rule))
    frame = pd.DataFrame(rows, columns=MEMORY_VERDICT_COLUMNS)
    return frame.astype({"n_history": "int64", "nights_needed": "int64"}) \
        if not frame.empty else frame


def _judge_metric(stage: str, metric: str, latest: float, past: np.ndarray,
                  limit: float | None, headroom: float | None,
                  rule: RegressionRule) -> MemoryVerdict:
    past = past[np.isfinite(past)]
    effect = min_effect(limit, rule)
    row: MemoryVerdict = {
        "stage": stage, "metric": metric, "verdict": "", "latest": latest,
        "min_effect": effect, "memory_limit": limit, "headroom": headroom,
        "n_history": int(past.size), "baseline": math.nan, "delta": math.nan,
        "ratio": math.nan, "robust_z": math.nan, "nights_needed": 2, "note": ""}
    if past.size < rule.min_history:
        row.update({"verdict": "insufficient-history",
                    "note": f"{past.size} baseline run(s) with this stage, "
                            f"{rule.min_history} needed"})
        return row
    median, mad = stats.median_mad(past)
    half_range = float(past.max() - past.min()) / 2
    spread = stats.robust_spread(mad, half_range, rule.memory_mad_floor * median,
                                 ABS_FLOOR_BYTES)
    delta = latest - median
    ratio = stats.ratio(latest, median)
    z = stats.robust_z(latest, median, spread)
    row.update({"baseline": median, "delta": delta, "ratio": ratio, "robust_z": z})
    hit = (ratio >= rule.memory_threshold and z >= rule.memory_z_threshold
           and delta >= effect)
    if hit:
        row.update({"verdict": "memory-regression",
                    "note": f"{_what(metric)} {_ratio(ratio)}: {_gib(median)} -> "
                            f"{_gib(latest)}"})
        if float(past.max()) < effect:  # an onset: the baseline never reached the effect
            needed = onset_nights(int(past.size), rule)
            row.update({"nights_needed": needed,
                        "note": f"{row['note']} (new in {past.size} nights: confirms after "
                                f"{needed} nights in a row)"})
    else:
        row["verdict"] = "ok"
    return row


def _judge_headroom(stage: str, rec: MemoryRow, past: np.ndarray,
                    limit: float | None, rule: RegressionRule) -> MemoryVerdict:
    headroom = finite_number(rec.get("headroom"))
    was = past[np.isfinite(past)]
    row: MemoryVerdict = {
        "stage": stage, "metric": "headroom", "latest": headroom,
        "baseline": float(np.median(was)) if was.size else math.nan,
        "delta": math.nan, "ratio": math.nan, "robust_z": math.nan, "min_effect": math.nan,
        "memory_limit": limit, "headroom": headroom, "n_history": int(past.size),
        "nights_needed": 1, "verdict": "ok", "note": ""}
    if headroom is None:
        row["note"] = "no worker memory limit known"
    elif headroom < rule.near_oom_headroom:
        row.update({"verdict": "near-oom",
                    "note": f"peak {_gib(rec.get('peak_bytes'))} of {_gib(limit)}: "
                            f"{headroom:.0%} headroom (under {rule.near_oom_headroom:.0%})"})
    return row


def describe_memory(verdicts: pd.DataFrame) -> str:
    """One line naming the stages with a memory verdict (for a failure message)."""
    flagged = verdicts[verdicts["verdict"].isin(("memory-regression", "near-oom"))]
    if flagged.empty:
        return "no memory regression"
    return "memory: " + "; ".join(f"{r.stage} {r.verdict} ({r.note})"
                                  for r in flagged.itertuples(index=False))


def history_from_manifests(manifests: Iterable[Manifest]) -> pd.DataFrame:
    """The history rows of stored runs: one per (run, stage with a ``memory`` entry)."""
    rows = []
    for manifest in manifests:
        for row in _manifest_rows(manifest):
            rows.append({"run_id": manifest.get("run_id"), **row})
    return pd.DataFrame(rows, columns=["run_id", "stage", *MEMORY_METRICS, "memory_limit",
                                       "headroom"])


def latest_from_manifest(manifest: Manifest) -> pd.DataFrame:
    """Tonight's rows from a run's manifest (its ``stages[].memory``)."""
    return pd.DataFrame(list(_manifest_rows(manifest)),
                        columns=["stage", *MEMORY_METRICS, "memory_limit", "headroom"])


def _manifest_rows(manifest: Manifest) -> Iterable[MemoryRow]:
    """The memory rows of one stored run.

    ``peak_bytes`` here is the stage's own figure: ``added_bytes``, what its workers'
    process memory rose above its level at the stage's start, so that memory carried in from
    the stage before (results not yet released, unmanaged memory not yet returned to the
    OS) is not judged as this stage's (issue 35). Runs stored before ``added_bytes`` existed
    give their process peak. ``headroom`` stays the process peak's, for near-OOM.
    """
    for stage in manifest.get("stages") or []:
        memory = stage.get("memory") if isinstance(stage, dict) else None
        if not isinstance(memory, dict) or not memory.get("workers"):
            continue  # old runs, or a stage no sample covered
        own = memory.get("added_bytes")
        yield {"stage": stage.get("name"),
               "peak_bytes": own if own is not None else memory.get("peak_bytes", 0),
               "spilled_bytes": memory.get("spilled_bytes", 0),
               "memory_limit": memory.get("memory_limit", 0),
               "headroom": memory.get("headroom")}


def _frame(rows: Iterable[MemoryRow] | pd.DataFrame, name: str,
           required: list[str]) -> pd.DataFrame:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if frame.empty:
        return pd.DataFrame(columns=[*required, "memory_limit", "headroom"])
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InvalidInput(f"memory {name} lacks column(s) {', '.join(missing)}")
    frame = frame.copy()
    frame["stage"] = frame["stage"].astype(str)
    for column in MEMORY_METRICS:
        values = pd.to_numeric(frame[column], errors="coerce")
        if values.isna().any() or (values < 0).any():
            raise InvalidInput(f"memory {name} column {column} must hold numbers >= 0")
        frame[column] = values.astype(float)
    return frame




def _what(metric: str) -> str:
    return "peak memory" if metric == "peak_bytes" else "spilled bytes"


def _ratio(ratio: float) -> str:
    return f"{ratio:.1f}x" if math.isfinite(ratio) else "from zero"


def _gib(value: Any) -> str:
    number = finite_number(value)
    return "n/a" if number is None else f"{number / 2**30:.2f} GiB"
