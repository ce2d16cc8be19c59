"""The paired figures every benchmark quotes: ratios and differences of adjacent runs."""

from __future__ import annotations

import pytest

from prefect_dask_profiling.bench.report import paired_difference, paired_ratio


def test_paired_difference_is_the_median_added_amount_with_an_interval_around_it():
    plain = [10.0, 20.0, 30.0, 40.0, 50.0]
    profiled = [10.5, 20.4, 30.6, 40.5, 50.5]  # +0.5 s a run, whatever the drift
    added, low, high = paired_difference(profiled, plain)
    assert added == pytest.approx(0.5)
    assert low <= added <= high
    assert 0.4 - 1e-9 <= low and high <= 0.6 + 1e-9
    assert paired_difference(profiled, plain) == (added, low, high)  # fixed seed


def test_paired_ratio_and_difference_share_the_bootstrap():
    plain, same = [1.0, 2.0, 4.0], [1.0, 2.0, 4.0]
    assert paired_ratio(same, plain) == (1.0, 1.0, 1.0)
    assert paired_difference(same, plain) == (0.0, 0.0, 0.0)
