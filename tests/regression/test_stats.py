"""The statistics helper matches a direct numpy computation of the robust ratio + z test."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from prefect_dask_profiling.regression import stats

values = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)
histories = hnp.arrays(float, st.integers(1, 40), elements=values)


@settings(max_examples=200, deadline=None)
@given(histories, values, st.floats(0.0, 1.0), st.floats(0.0, 1e3))
def test_the_helper_matches_numpy_on_one_history(past, latest, mad_floor, abs_floor):
    median = float(np.median(past))
    mad = float(np.median(np.abs(past - median)))
    spread = max(1.4826 * mad, mad_floor * median, abs_floor)

    got_median, got_mad = stats.median_mad(past)
    assert (got_median, got_mad) == (median, mad)
    got_spread = stats.robust_spread(got_mad, mad_floor * got_median, abs_floor)
    assert isinstance(got_spread, float) and got_spread == spread
    z = stats.robust_z(latest, median, spread)
    if spread > 0:
        assert z == (latest - median) / spread
    else:
        assert z == (0.0 if latest == median else math.copysign(math.inf, latest - median))
    r = stats.ratio(latest, median)
    if median > 0:
        assert r == latest / median
    else:
        assert r == (1.0 if latest == 0 else math.inf)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(float, st.tuples(st.integers(1, 6), st.integers(1, 12)),
                  elements=values | st.just(math.nan)), st.floats(0.0, 1.0),
       st.floats(1e-3, 1e3))
def test_the_helper_matches_numpy_per_key(matrix, mad_floor, abs_floor):
    """Keys x runs with absent cells (NaN): per key as the one-night verdict computes it."""
    median, mad = stats.median_mad(matrix, axis=1)
    spread = stats.robust_spread(mad, mad_floor * median, abs_floor)
    for row, m, d, s in zip(matrix, median, mad, spread, strict=True):
        present = row[~np.isnan(row)]
        if present.size == 0:
            assert math.isnan(m) and math.isnan(d) and s == abs_floor
            continue
        want_m = float(np.median(present))
        want_d = float(np.median(np.abs(present - want_m)))
        assert (m, d) == (want_m, want_d)
        assert s == max(1.4826 * want_d, mad_floor * want_m, abs_floor)


def test_flat_and_absent_values():
    assert stats.ratio(0.0, 0.0) == 1.0
    assert stats.ratio(2.0, 0.0) == math.inf
    assert math.isnan(stats.ratio(math.nan, 1.0))
    assert stats.robust_z(3.0, 3.0, 0.0) == 0.0
    assert stats.robust_z(4.0, 3.0, 0.0) == math.inf
    assert math.isnan(stats.robust_z(math.nan, 3.0, 1.0))
    assert stats.robust_spread(math.nan, 0.1) == 0.1
    ratios = stats.ratio(np.array([0.0, 1.0, math.nan]), np.array([0.0, 0.0, 1.0]))
    assert ratios[0] == 1.0 and ratios[1] == math.inf and math.isnan(ratios[2])
