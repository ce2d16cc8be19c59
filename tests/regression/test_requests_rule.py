"""The storage-request rule (``regression/requests.py``) and its place in the judgement, on
generated nights: per-chunk figures jitter by up to ±20% without a change; a 2.6x jump is a
regression even when time did not move (range merging switched off gave 3.3x in the demo);
more chunks at the same per-chunk cost is not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from prefect_dask_profiling.regression.alerts import Night, advance
from prefect_dask_profiling.regression.baseline import Baseline
from prefect_dask_profiling.regression.judge import History, Tonight, judge
from prefect_dask_profiling.regression.requests import detect_requests, request_rows
from prefect_dask_profiling.regression.rule import RegressionRule, Rules
from prefect_dask_profiling.store.manifest import RunKey


def manifest(run_id: str, per_chunk: float | None, chunks: int = 48,
             bytes_per_chunk: float = 80_000.0) -> dict:
    stages = [{"name": "reduce", "tasks": 10}]
    if per_chunk is not None:
        stages.append({"name": "read", "tasks": chunks, "io": {
            "requests": per_chunk * chunks, "chunks": chunks,
            "requests_per_chunk": per_chunk, "bytes_per_chunk": bytes_per_chunk}})
    return {"run_id": run_id, "version": "1", "stages": stages}


def nights(rng, n: int, level: float = 1.4) -> list[dict]:
    return [manifest(f"r{i:03d}", level * rng.uniform(0.8, 1.2),
                     bytes_per_chunk=80_000 * rng.uniform(0.8, 1.2)) for i in range(n)]


@pytest.mark.slow  # > 10 s
def test_no_alarm_on_jittery_nights_and_a_doubling_is_caught():
    rng = np.random.default_rng(3)
    false_alarms = caught = 0
    for _ in range(400):
        history = request_rows(nights(rng, 8))
        quiet = request_rows([manifest("now", 1.4 * rng.uniform(0.8, 1.2))])
        false_alarms += (detect_requests(history, quiet)["verdict"]
                         == "request-regression").sum()
        doubled = request_rows([manifest("now", 1.4 * 2.6 * rng.uniform(0.9, 1.1))])
        rows = detect_requests(history, doubled)
        caught += int((rows[rows["metric"] == "requests_per_chunk"]["verdict"]
                       == "request-regression").all())
    assert false_alarms == 0
    assert caught == 400


def test_more_chunks_at_the_same_cost_and_missing_figures_are_not_regressions():
    rng = np.random.default_rng(4)
    history = request_rows(nights(rng, 8))
    twice_the_items = request_rows([manifest("now", 1.4, chunks=96)])
    assert set(detect_requests(history, twice_the_items)["verdict"]) == {"ok"}
    no_gdal = request_rows([manifest("now", None)])
    assert no_gdal.empty and detect_requests(history, no_gdal).empty
    short = request_rows(nights(rng, 2))
    assert set(detect_requests(short, request_rows([manifest("n", 5.0)]))["verdict"]) == {
        "insufficient-history"}
    off = RegressionRule(requests_regression=False)
    assert detect_requests(history, request_rows([manifest("n", 5.0)]), off).empty


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="requests_threshold"):
        RegressionRule(requests_threshold=1.0)
    with pytest.raises(ValueError, match="requests_regression"):
        RegressionRule(requests_regression="yes")


def test_the_judgement_fails_a_night_whose_requests_doubled_before_its_time_moved():
    rng = np.random.default_rng(5)
    baseline_manifests = nights(rng, 6)
    times = pd.DataFrame([{"run_id": m["run_id"], "stage": "read", "prefix": "getitem",
                           "tasks": 48, "total_s": 10.0 * rng.uniform(0.95, 1.05)}
                          for m in baseline_manifests])
    history = History(Baseline(times, [m["run_id"] for m in baseline_manifests], "1"),
                      manifests=tuple(baseline_manifests),
                      baselines={"requests": tuple(baseline_manifests)})
    summary = pd.DataFrame([{"stage": "read", "prefix": "getitem", "tasks": 48,
                             "total_s": 10.2}])
    merge_off = Tonight(RunKey("r999", "p", "1"), summary=summary,
                        context=manifest("r999", 4.6, bytes_per_chunk=840_000))
    judgement = judge(merge_off, history, Rules())
    assert set(judgement.verdicts["verdict"]) == {"ok"}  # time did not move
    assert set(judgement.flagged_rows("requests")["metric"]) == {"requests_per_chunk",
                                                           "bytes_per_chunk"}
    # one night is never conclusive for requests: suspected, and the next night confirms
    assert not judgement.regressed and judgement.outcome.suspected
    night = Night(RunKey("r999", "p", "1"), judgement.night_signals())
    book, events = advance(history.alerts, night)
    assert [e.kind for e in events] == ["suspected", "suspected"]
    second = judge(replace(merge_off, run=RunKey("r9991", "p", "1")),
                   replace(history, alerts=book), Rules())
    assert second.regressed and "storage requests: read" in second.outcome.message
    healthy = Tonight(RunKey("r998", "p", "1"), summary=summary,
                      context=manifest("r998", 1.45))
    assert not judge(healthy, history, Rules()).regressed
