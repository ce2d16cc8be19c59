"""Idle worker-hours per stage against the baseline (informational verdict), on manifests."""

from __future__ import annotations

import pytest

from prefect_dask_profiling.regression.cost import cost_flagged, detect_idle
from prefect_dask_profiling.regression.rule import RegressionRule


def _manifest(run_id: str, idle_share: float, workers: float, wall_s: float = 3600.0) -> dict:
    alloc = {"worker_s": workers * wall_s, "wall_s": wall_s, "idle_share": idle_share}
    return {"run_id": run_id, "stages": [{"name": "write", "allocation": alloc},
                                         {"name": "read"}]}


HISTORY = [_manifest(f"r{i}", 0.4, 1.0) for i in range(3)]


def test_idle_that_grew_is_flagged_with_its_figures() -> None:
    verdicts = detect_idle(HISTORY, _manifest("now", 0.775, 4.0))
    [row] = verdicts.to_dict("records")
    assert row["verdict"] == "idle-regression" and row["metric"] == "idle_hours"
    assert row["latest"] == pytest.approx(3.1) and row["baseline"] == pytest.approx(0.4)
    assert row["ratio"] == pytest.approx(3.1 / 0.4) and row["robust_z"] > 3.5
    [text] = cost_flagged(verdicts)
    assert text.startswith("stage write: 3.10 worker-hours idle, was 0.40")
    assert "adaptive scale-down" in text


def test_a_steady_night_and_a_short_history() -> None:
    assert detect_idle(HISTORY, _manifest("now", 0.45, 1.0))["verdict"].tolist() == ["ok"]
    short = detect_idle(HISTORY[:1], _manifest("now", 0.9, 4.0))
    assert short["verdict"].tolist() == ["no-history"] and cost_flagged(short) == []


def test_small_growth_stays_quiet() -> None:
    tiny = [_manifest(f"r{i}", 0.1, 1.0, wall_s=10.0) for i in range(3)]
    assert detect_idle(tiny, _manifest("now", 0.9, 1.0, wall_s=10.0))["verdict"].tolist() \
        == ["ok"]


def test_noisy_idle_is_held_back_by_the_z_and_off_judges_nothing() -> None:
    noisy = [_manifest(f"r{i}", share, 1.0) for i, share in enumerate((0.2, 0.9, 0.3, 0.8))]
    assert detect_idle(noisy, _manifest("now", 0.95, 1.2))["verdict"].tolist() == ["ok"]
    off = RegressionRule(cost_regression="off")
    assert detect_idle(HISTORY, _manifest("now", 0.775, 4.0), off).empty


def test_runs_stored_before_allocations_give_no_rows() -> None:
    assert detect_idle([], {"stages": [{"name": "write"}]}).empty
