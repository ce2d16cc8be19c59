"""GDAL's requests under ``GDAL_HTTP_MULTIRANGE=PARALLEL`` are flagged as a lower bound
unless every worker counted the parallel ranges.

GDAL logs a batch of parallel range requests as one GET (``VSICurlHandle::ReadMultiRange``);
``timing.worker_io.ParallelRanges`` counts the rest from GDAL's debug lines. A run where a
worker ran with PARALLEL (GDAL's default) and did not count them (``ranges_counted`` false,
or a run stored before the counter) says its figures are a lower bound.
"""

from __future__ import annotations

from prefect_dask_profiling.summary.io import (
    LOWER_BOUND_NOTE,
    io_text,
    mark_lower_bound,
    requests_lower_bound,
)


def stack(multirange: str | None, counted: bool | None = None) -> dict:
    options = {} if multirange is None else {"GDAL_HTTP_MULTIRANGE": multirange}
    out = {"gdal": "3.10.3", "rasterio": "1.4.4", "libcurl": None, "options": options,
           "workers": 2}
    return out if counted is None else {**out, "ranges_counted": counted}


def test_counted_parallel_ranges_are_not_a_lower_bound():
    assert requests_lower_bound(stack("PARALLEL", counted=True)) is None
    assert requests_lower_bound(stack("PARALLEL", counted=False)) == LOWER_BOUND_NOTE
    assert requests_lower_bound(stack("PARALLEL")) == LOWER_BOUND_NOTE, "stored before it"


def test_parallel_on_any_worker_flags_the_requests_as_a_lower_bound():
    assert requests_lower_bound(stack("PARALLEL")) == LOWER_BOUND_NOTE
    assert requests_lower_bound(stack("SERIAL | parallel")) == LOWER_BOUND_NOTE
    for exact in ("SERIAL", "SINGLE_GET", None):
        assert requests_lower_bound(stack(exact)) is None, exact
    assert requests_lower_bound(None) is None, "no GDAL on the workers: nothing to flag"


def test_only_stages_with_gdal_requests_carry_the_flag_and_the_text_says_at_least():
    summaries = {"read": {"requests": 70, "get": 70, "bytes": 1_251_838},
                 "search": {"requests": 0, "s3fs_requests": 3}}
    mark_lower_bound(summaries, stack("PARALLEL"))
    assert summaries["read"]["requests_lower_bound"] == LOWER_BOUND_NOTE
    assert "requests_lower_bound" not in summaries["search"]
    assert io_text(summaries["read"]).startswith("at least 70 requests (GET 70)")
    exact = {"read": {"requests": 77, "get": 77}}
    mark_lower_bound(exact, stack("SERIAL"))
    assert "requests_lower_bound" not in exact["read"]
    assert io_text(exact["read"]).startswith("77 requests")
