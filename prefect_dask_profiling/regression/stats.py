"""The robust ratio + z test, in one place, for every rule that judges a night.

Each rule (the one-night verdict, drift, memory, storage requests) compares tonight's value
with the median of a healthy history and asks two questions: how many times the median is
it (:func:`ratio`), and how many robust standard deviations away is it (:func:`robust_z`)?
The standard deviation is estimated from the median absolute deviation (MAD): for normal
noise ``sigma = MAD_TO_SIGMA * MAD``, and unlike the standard deviation one outlier night
does not move it. Each rule puts its own floors under that estimate (:func:`robust_spread`).

The functions take scalars or numpy arrays; for scalars they return Python floats.
"""

from __future__ import annotations

import warnings
from typing import TypedDict, overload

import numpy as np

__all__ = ["MAD_TO_SIGMA", "MetricVerdict", "median_mad", "ratio", "robust_spread", "robust_z"]


class MetricVerdict(TypedDict):
    """One stage's verdict on one metric (memory, storage requests, idle resources: a row of
    their verdict tables): tonight's ``latest`` against the ``baseline`` median of
    ``n_history`` runs, the ``delta``, :func:`ratio` and :func:`robust_z` (NaN without
    enough history) and the ``min_effect`` the increase had to reach."""

    stage: str
    metric: str
    verdict: str
    baseline: float
    latest: float | None
    delta: float
    ratio: float
    robust_z: float
    min_effect: float
    n_history: int


# 1 / Phi^-1(3/4): makes the MAD estimate sigma for normal noise.
MAD_TO_SIGMA = 1.4826

ArrayLike = float | np.ndarray


@overload
def median_mad(values: np.ndarray, axis: None = None) -> tuple[float, float]: ...
@overload
def median_mad(values: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]: ...
def median_mad(values: np.ndarray, axis: int | None = None) -> tuple[ArrayLike, ArrayLike]:
    """The median of ``values`` and their median absolute deviation from it.

    Parameters
    ----------
    values
        The history. NaN stands for "absent" and is ignored; a slice with no finite value
        gives NaN for both (no warning).
    axis
        ``None``: all of ``values`` (two floats returned); else the axis to reduce (two
        arrays returned).

    Returns
    -------
    tuple
        ``(median, mad)``.
    """
    values = np.asarray(values, dtype=float)
    with warnings.catch_warnings():  # all-NaN slices -> NaN, as documented
        warnings.simplefilter("ignore", RuntimeWarning)
        if axis is None:
            median = float(np.nanmedian(values))
            return median, float(np.nanmedian(np.abs(values - median)))
        median = np.nanmedian(values, axis=axis)
        centred = np.abs(values - np.expand_dims(median, axis))
        return median, np.nanmedian(centred, axis=axis)


@overload
def robust_spread(mad: float, *floors: float) -> float: ...
@overload
def robust_spread(mad: np.ndarray, *floors: ArrayLike) -> np.ndarray: ...
def robust_spread(mad: ArrayLike, *floors: ArrayLike) -> ArrayLike:
    """The robust standard deviation ``MAD_TO_SIGMA * mad``, never below any of ``floors``.

    A NaN (a key absent from the history) is ignored by the maximum: with no MAD the spread
    is the largest floor.
    """
    spread = MAD_TO_SIGMA * np.asarray(mad, dtype=float)
    for floor in floors:
        spread = np.fmax(spread, floor)
    return _out(spread)


@overload
def robust_z(latest: float, centre: float, spread: float) -> float: ...
@overload
def robust_z(latest: ArrayLike, centre: ArrayLike, spread: ArrayLike) -> ArrayLike: ...
def robust_z(latest: ArrayLike, centre: ArrayLike, spread: ArrayLike) -> ArrayLike:
    """``(latest - centre) / spread``: how many robust sigmas tonight is from the median.

    A zero spread (a history with no variation and no floor) gives 0 for a value equal to
    the median and +-inf for any other; NaN in gives NaN out.
    """
    delta = np.asarray(latest, dtype=float) - np.asarray(centre, dtype=float)
    spread = np.asarray(spread, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        flat = np.where(delta == 0, 0.0, np.sign(delta) * np.inf)
        z = np.where(spread == 0, flat, delta / spread)
    return _out(z)


@overload
def ratio(latest: float, baseline: float) -> float: ...
@overload
def ratio(latest: ArrayLike, baseline: ArrayLike) -> ArrayLike: ...
def ratio(latest: ArrayLike, baseline: ArrayLike) -> ArrayLike:
    """``latest / baseline`` with 0 / 0 = 1 (nothing before, nothing now) and x / 0 = inf for
    x > 0 (so is a ratio past the float range); NaN in gives NaN out."""
    num = np.asarray(latest, dtype=float)
    den = np.asarray(baseline, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = num / den
    return _out(np.where((num == 0) & (den == 0), 1.0, out))


def _out(value: np.ndarray) -> ArrayLike:
    """A 0-d result as a Python float, an array as it is."""
    return float(value) if np.ndim(value) == 0 else value
