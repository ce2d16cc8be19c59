"""Storage-request verdicts: each stage's requests and bytes per output chunk against the
healthy baseline.

The regressions raster teams meet are request blow-ups (range merging switched off, chunks
cut across a COG's tiles, a GDAL upgrade issuing 25x the range requests): they show in the
requests a stage makes per chunk before its time moves, since a fast object store hides
them on a quiet night. Judged like time (:mod:`~.verdict`), with the same
:class:`~.rule.RegressionRule`:

* ``request-regression`` for a metric (``requests_per_chunk``, ``bytes_per_chunk``) when
  **ratio** ``latest / median(history) >= requests_threshold`` (2.0: "doubled") and
  **robust z** ``(latest - median) / spread >= z_threshold`` (3.5), with
  ``spread = max(1.4826 * MAD, mad_floor_requests * median)``; the floor (10%) stands for
  the jitter of parallel reads on a night without change;
* **minimum effect**: the increase is at least ``requests_min_per_chunk`` requests per
  chunk (and that many half-MiB per chunk for ``bytes_per_chunk``);
* at least ``min_history`` baseline runs must have the stage's figure
  (``insufficient-history`` otherwise).

One night is never conclusive: a flagged night is ``suspected`` and the next night confirms
or clears it (:func:`~.confirm.confirm_signals`, the lifecycle of :mod:`.alerts`).

Both figures are per chunk, so a night that reads twice the catalogue items is not a
request regression (its time verdict says "more tasks"). Runs stored without storage
figures (no GDAL, older versions) simply have none: the metric is absent, never zero.

Pure: manifests' ``stages[].io`` in, a DataFrame out (:data:`REQUEST_VERDICT_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from prefect_dask_profiling._util import finite_number
from prefect_dask_profiling.regression import stats
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store.manifest import Manifest

__all__ = ["REQUEST_METRICS", "REQUEST_VERDICT_COLUMNS", "describe_requests",
           "detect_requests", "request_rows"]

REQUEST_METRICS = ("requests_per_chunk", "bytes_per_chunk")
REQUEST_VERDICT_COLUMNS = ["stage", "metric", "verdict", "baseline", "latest", "delta",
                           "ratio", "robust_z", "min_effect", "n_history"]
# Night-to-night jitter of per-chunk request counts without any change (parallel range reads
# are counted per batch by GDAL): the spread is never taken below 10% of the median.
MAD_FLOOR = 0.10
# The minimum effect of bytes_per_chunk per request of requests_min_per_chunk: half a MiB
# (a COG tile of 512 x 512 16-bit pixels, compressed, is about this size).
BYTES_PER_REQUEST = 2**19


def request_rows(manifests: Iterable[Manifest]) -> pd.DataFrame:
    """``run_id, stage`` and the per-chunk figures of every stage with storage figures."""
    rows = []
    for manifest in manifests:
        for stage in manifest.get("stages") or []:
            io = stage.get("io") if isinstance(stage, dict) else None
            if not isinstance(io, dict):
                continue
            row = {"run_id": manifest.get("run_id"), "stage": str(stage.get("name"))}
            row.update({m: io.get(m) for m in REQUEST_METRICS})
            rows.append(row)
    return pd.DataFrame(rows, columns=["run_id", "stage", *REQUEST_METRICS])


def detect_requests(history: pd.DataFrame, latest: pd.DataFrame,
                    rule: RegressionRule | None = None) -> pd.DataFrame:
    """Request verdicts per (stage, metric) of tonight's stages with storage figures.

    Parameters
    ----------
    history
        :func:`request_rows` of the baseline runs.
    latest
        :func:`request_rows` of tonight's run.
    rule
        ``requests_regression``, ``requests_threshold``, ``z_threshold``, ``min_history``.
    """
    rule = rule if rule is not None else RegressionRule()
    out = []
    if not rule.requests_regression:
        return pd.DataFrame(columns=REQUEST_VERDICT_COLUMNS)
    for row in latest.itertuples(index=False):
        past = history[history["stage"] == row.stage]
        for metric in REQUEST_METRICS:
            now = finite_number(getattr(row, metric), minimum=0)
            if now is None:
                continue
            values = np.array([v for v in (finite_number(x, minimum=0) for x in past[metric])
                               if v is not None])
            out.append(_judge(row.stage, metric, now, values, rule))
    return pd.DataFrame(out, columns=REQUEST_VERDICT_COLUMNS)


def describe_requests(rows: pd.DataFrame) -> str:
    """One line naming the stages whose requests per chunk regressed."""
    flagged = rows[rows["verdict"] == "request-regression"]
    if flagged.empty:
        return "no request regression"
    return "storage requests: " + "; ".join(
        f"{r.stage} {r.metric.replace('_', ' ')} {r.ratio:.1f}x ({r.baseline:.3g} -> "
        f"{r.latest:.3g})" for r in flagged.itertuples(index=False))


def _judge(stage: str, metric: str, now: float, past: np.ndarray,
           rule: RegressionRule) -> stats.MetricVerdict:
    effect = rule.requests_min_per_chunk * (BYTES_PER_REQUEST if metric == "bytes_per_chunk"
                                            else 1.0)
    row: stats.MetricVerdict = {"stage": stage, "metric": metric, "verdict": "insufficient-history",
           "baseline": np.nan, "latest": now, "delta": np.nan, "ratio": np.nan,
           "robust_z": np.nan, "min_effect": effect, "n_history": len(past)}
    if len(past) < rule.min_history:
        return row
    median, mad = stats.median_mad(past)
    spread = stats.robust_spread(mad, MAD_FLOOR * median)
    ratio = stats.ratio(now, median)
    z = stats.robust_z(now, median, spread)
    flagged = (ratio >= rule.requests_threshold and z >= rule.z_threshold
               and now - median >= effect)
    row.update({"baseline": median, "delta": now - median, "ratio": ratio, "robust_z": z,
                "verdict": "request-regression" if flagged else "ok"})
    return row

