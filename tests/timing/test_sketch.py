"""QuantileSketch: relative error, merging, plain-data round trip, bounded size."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefect_dask_profiling.timing.sketch import DEFAULT_ALPHA, QuantileSketch

durations = st.lists(st.floats(min_value=1e-6, max_value=1e4, allow_nan=False), min_size=1,
                     max_size=400)
quantiles = st.sampled_from([0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0])


def _sketch(values: list[float], alpha: float = DEFAULT_ALPHA) -> QuantileSketch:
    sketch = QuantileSketch(alpha)
    for v in values:
        sketch.add(v)
    return sketch


def _within(value: float, exact: float, alpha: float) -> bool:
    return exact * (1 - alpha) * (1 - 1e-12) <= value <= exact * (1 + alpha) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(values=durations, q=quantiles)
def test_quantile_within_alpha_of_nearest_rank(values: list[float], q: float) -> None:
    exact = float(np.quantile(np.asarray(values), q, method="lower"))
    assert _within(_sketch(values).quantile(q), exact, DEFAULT_ALPHA)


@settings(max_examples=100, deadline=None)
@given(a=durations, b=durations, q=quantiles)
def test_merge_equals_sketch_of_union(a: list[float], b: list[float], q: float) -> None:
    merged = _sketch(a)
    merged.merge(_sketch(b))
    whole = _sketch(a + b)
    assert merged.n == whole.n == len(a) + len(b)
    assert merged.quantile(q) == whole.quantile(q)


@pytest.mark.parametrize("alpha", [0.001, 0.005, 0.01, 0.05])
def test_alpha_is_honoured_on_a_wide_distribution(alpha: float) -> None:
    values = np.random.default_rng(0).lognormal(-3, 2, 20_000)
    sketch = _sketch(values.tolist(), alpha)
    for q in (0.01, 0.5, 0.95, 0.999):
        exact = float(np.quantile(values, q, method="lower"))
        assert _within(sketch.quantile(q), exact, alpha), q


def test_zeros_and_negatives_count_as_zero() -> None:
    sketch = _sketch([0.0, -1.0, 0.0, 2.0])
    assert sketch.n == 4 and sketch.zeros == 3
    assert sketch.quantile(0.5) == 0.0
    assert _within(sketch.quantile(1.0), 2.0, DEFAULT_ALPHA)


def test_empty_sketch_is_nan() -> None:
    assert math.isnan(QuantileSketch().quantile(0.5))


def test_round_trip_through_json() -> None:
    sketch = _sketch([0.0, 0.001, 0.5, 0.5, 3.0, 120.0])
    again = QuantileSketch.from_dict(json.loads(json.dumps(sketch.to_dict())))
    assert again.n == sketch.n and again.zeros == sketch.zeros
    assert again.counts == sketch.counts
    for q in (0.0, 0.3, 0.5, 0.95, 1.0):
        assert again.quantile(q) == sketch.quantile(q)


def test_size_depends_on_spread_not_count() -> None:
    rng = np.random.default_rng(1)
    small = _sketch(rng.uniform(0.01, 1.0, 20_000).tolist())
    large = _sketch(rng.uniform(0.01, 1.0, 200_000).tolist())
    # two decades at alpha=0.005: at most 2 * 230 buckets whatever the count
    bound = 2 * math.log(10) / math.log(1.005 / 0.995) + 2
    assert len(small.counts) <= len(large.counts) <= bound


@pytest.mark.parametrize("alpha", [0, 1, -0.1, 1.5])
def test_bad_alpha_is_rejected(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        QuantileSketch(alpha)


@pytest.mark.parametrize("q", [-0.1, 1.01])
def test_bad_quantile_is_rejected(q: float) -> None:
    with pytest.raises(ValueError, match="q must be"):
        _sketch([1.0]).quantile(q)


def test_merging_different_alpha_is_rejected() -> None:
    with pytest.raises(ValueError, match="alpha"):
        QuantileSketch(0.01).merge(QuantileSketch(0.02))
