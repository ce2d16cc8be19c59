"""The shared number readers of ``_util``: one home for "is this a usable figure"."""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefect_dask_profiling._util import finite_number, float_or_nan


@pytest.mark.parametrize("value, expected", [
    (1, 1.0), (2.5, 2.5), ("3", 3.0), (np.float64(4.0), 4.0), (0, 0.0), (-1.0, -1.0),
    (None, None), (True, None), ("x", None), ([], None),
    (math.nan, None), (math.inf, None), (-math.inf, None),
])
def test_finite_number(value, expected):
    assert finite_number(value) == expected


def test_finite_number_with_a_minimum():
    assert finite_number(0, minimum=0) == 0.0
    assert finite_number(-0.5, minimum=0) is None


def test_float_or_nan_keeps_infinities():
    assert float_or_nan("2") == 2.0 and float_or_nan(math.inf) == math.inf
    assert math.isnan(float_or_nan(None)) and math.isnan(float_or_nan("x"))
