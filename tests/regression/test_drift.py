"""Gradual drift: a steady slowdown is caught, stationary noise never is (pure + a real store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.regression.drift import (
    DRIFT_COLUMNS,
    describe_drift,
    detect_drift,
    drifted,
    load_series,
)
from prefect_dask_profiling.regression.rule import DriftRule, RegressionRule, Rules
from prefect_dask_profiling.store.runs import RunStore, new_run_id

T0 = datetime(2026, 10, 1, 2, 0, tzinfo=UTC)
ANY_SHARE = Rules(RegressionRule(min_share=0.0))
RUN_IDS = [new_run_id(T0 + timedelta(days=night)) for night in range(60)]


def history(series: dict[str, list[float]], other_s: float = 100.0) -> pd.DataFrame:
    """Long table of nights: each prefix's totals plus a steady ``other`` prefix."""
    nights = len(next(iter(series.values())))
    rows = []
    for night in range(nights):
        run_id = RUN_IDS[night]
        started = (T0 + timedelta(days=night)).isoformat()
        for prefix, values in {**series, "other": [other_s] * nights}.items():
            rows.append({"run_id": run_id, "started": started, "stage": "s", "prefix": prefix,
                         "tasks": 10, "total_s": values[night]})
    return pd.DataFrame(rows)


def row(frame: pd.DataFrame, prefix: str) -> pd.Series:
    return frame[frame["prefix"] == prefix].iloc[0]


def test_twelve_percent_a_night_is_drift_and_fails_after_ten_nights():
    values = [10 * 1.12 ** n for n in range(11)]  # night 10: 3.1x night 0
    verdicts = {}
    for nights in range(8, 12):
        out = detect_drift(history({"slow": values[:nights]}))
        verdicts[nights - 1] = row(out, "slow")
    assert list(out.columns) == DRIFT_COLUMNS
    assert verdicts[7]["verdict"] == "drift" and not verdicts[7]["fails"]  # 1.76x: reported
    assert verdicts[8]["verdict"] == "drift" and not verdicts[8]["fails"]  # 1.97x
    last = verdicts[10]
    assert last["verdict"] == "drift" and last["fails"]
    assert last["cumulative_ratio"] == pytest.approx(1.12 ** 8, rel=1e-6)
    assert last["start_run"] == RUN_IDS[2]
    assert last["start_started"] == (T0 + timedelta(days=2)).isoformat()
    assert last["series"][-1] == pytest.approx(values[-1], abs=1e-3)
    assert row(out, "other")["verdict"] == "ok"
    assert "s/slow 2.5x since" in describe_drift(drifted(out))
    assert drifted(out, failing_only=True)["prefix"].tolist() == ["slow"]


def test_noisy_drift_is_caught_by_night_ten():
    rng = np.random.default_rng(3)
    caught = 0
    for _ in range(40):
        values = 10 * 1.12 ** np.arange(11) * np.exp(rng.normal(0, 0.05, 11))
        r = row(detect_drift(history({"slow": list(values)})), "slow")
        caught += bool(r["verdict"] == "drift" and r["fails"])
    assert caught == 40


def test_sustained_step_below_the_regression_threshold_is_drift_but_does_not_fail():
    values = [20.0] * 6 + [36.0] * 6  # 1.8x since night 6: never "more than doubled"
    r = row(detect_drift(history({"step": values})), "step")
    assert r["verdict"] == "drift" and not r["fails"]
    assert r["start_run"] == RUN_IDS[6]


def test_nothing_is_said_below_one_and_a_half():
    ramp = [20.0 * min(1.04 ** n, 1.45) for n in range(30)]  # creeps to 1.45x, stays there
    step = [20.0] * 10 + [29.0] * 20
    out = detect_drift(history({"ramp": ramp, "step": step}))
    assert set(out["verdict"]) == {"ok"}
    assert row(out, "ramp")["cumulative_ratio"] < 1.5


def test_a_single_slow_night_and_tiny_prefixes_are_not_drift():
    spike = [20.0] * 11 + [80.0]
    tiny = [0.01 * 1.3 ** n for n in range(12)]  # 23x, but 0.2 s of a 100 s night
    out = detect_drift(history({"spike": spike, "tiny": tiny}))
    assert row(out, "spike")["verdict"] == "ok"
    assert row(out, "tiny")["verdict"] == "ok"


def test_short_series_are_insufficient_history():
    out = detect_drift(history({"slow": [10 * 1.5 ** n for n in range(5)]}))
    assert row(out, "slow")["verdict"] == "insufficient-history"


def test_stationary_noisy_histories_never_alarm():
    """Thousands of prefix-nights of stationary noise (log-normal and heavy-tailed)."""
    rng = np.random.default_rng(20261130)
    judged = 0
    for sigma in (0.05, 0.1, 0.2):
        for heavy in (False, True):
            series = {}
            for k in range(45):
                noise = rng.standard_t(3, 40) if heavy else rng.normal(0, 1, 40)
                series[f"p{k}"] = list(rng.uniform(5, 200) * np.exp(sigma * noise))
            frame = history(series, other_s=50.0)
            runs = sorted(frame["run_id"].unique())
            for end in range(8, 41, 2):
                out = detect_drift(frame[frame["run_id"].isin(runs[:end])], ANY_SHARE)
                judged += len(out)
                assert drifted(out).empty, (sigma, heavy, end, drifted(out))
    assert judged > 4500


def test_missing_nights_and_bad_values_are_absent_not_zero():
    frame = history({"slow": [10 * 1.12 ** n for n in range(12)]})
    frame = frame.drop(frame[(frame["prefix"] == "slow")].index[3])  # one night without it
    frame.loc[frame.index[0], "total_s"] = float("nan")
    r = row(detect_drift(frame), "slow")
    assert r["n_nights"] == 10 and r["verdict"] == "drift"


@pytest.mark.parametrize("make, needle", [
    (lambda: DriftRule(min_ratio=1.0), "min_ratio"),
    (lambda: DriftRule(z_threshold=-1), "z_threshold"),
    (lambda: DriftRule(min_nights=0), "min_nights"),
    (lambda: DriftRule(recent_nights=1.5), "recent_nights"),
    (lambda: RegressionRule(mad_floor=-0.1), "mad_floor"),
])
def test_settings_are_validated_by_the_rule(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()


def test_the_rule_must_be_a_rule():
    with pytest.raises(InvalidInput, match="Rules or a DriftRule"):
        detect_drift(history({"a": [1.0] * 8}), {"min_ratio": 1.2})


def test_a_threshold_below_min_ratio_lowers_min_ratio():
    """Drift is reported before it fails: ``Rules`` derives ``min_ratio`` from ``threshold``."""
    frame = history({"slow": [10 * 1.03 ** n for n in range(14)]})  # 1.38x in all
    quick = DriftRule(z_threshold=1.0)
    low = Rules(RegressionRule(threshold=1.3), quick)
    assert low.drift.min_ratio == 1.3
    r = row(detect_drift(frame, low), "slow")
    assert r["verdict"] == "drift" and r["fails"]
    assert row(detect_drift(frame, quick), "slow")["verdict"] == "ok"


def test_history_columns_are_checked():
    with pytest.raises(ValueError, match="total_s"):
        detect_drift(pd.DataFrame({"run_id": [], "stage": [], "prefix": []}))
    assert detect_drift(history({"a": [1.0]}).iloc[0:0]).empty


# ---------------------------------------------------------------------- the series loader
def put(store: RunStore, night: int, total: float, status: str = "healthy",
        version: str = "v1") -> str:
    run_id = new_run_id(T0 + timedelta(days=night))
    tasks = pd.DataFrame({"stage": ["s", "s"], "prefix": ["slow", "other"], "tasks": [10, 10],
                          "total_s": [total, 100.0], "p50_s": [0.1, 0.1], "p95_s": [0.2, 0.2],
                          "gb_out": [0.0, 0.0]})
    doc = {"version": version, "status": status, "state": "COMPLETED",
           "started": (T0 + timedelta(days=night)).isoformat()}
    assert not store.write_run("ndvi", run_id, {"tasks": tasks}, doc).spooled
    return run_id


def test_series_runs_from_the_last_accept_and_keeps_regressed_nights(tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    ids = [put(store, n, 10 * 1.12 ** n, status="regressed" if n == 9 else "healthy")
           for n in range(12)]
    put(store, 12, 1.0, status="failed")
    put(store, 13, 1.0, version="v2")
    series, note = load_series(store, "ndvi", "v1", exclude_run_id=ids[-1])
    assert sorted(series["run_id"].unique()) == ids[:-1]  # regressed kept, failed/v2 not
    assert "first run of version v1" in note
    assert {"started", "total_s"} <= set(series.columns)

    store.accept("ndvi", "v1", ids[4])
    series, note = load_series(store, "ndvi", "v1")
    assert sorted(series["run_id"].unique()) == ids[4:]
    assert ids[4] in note
    capped, _ = load_series(store, "ndvi", "v1", max_runs=5, keep_first=2)
    assert sorted(capped["run_id"].unique()) == ids[4:6] + ids[-3:]

    verdicts = detect_drift(load_series(store, "ndvi", "v1", before=ids[3])[0])
    assert row(verdicts, "slow")["verdict"] == "insufficient-history"
    with pytest.raises(ValueError, match="keep_first"):
        load_series(store, "ndvi", "v1", max_runs=3, keep_first=3)


def test_merge_and_flagged_series_for_the_artifacts():
    from prefect_dask_profiling.regression.drift import flagged_series, merge_drift

    drift = detect_drift(history({"slow": [10 * 1.12 ** n for n in range(11)],
                                  "jump": [10.0] * 10 + [30.0]}))
    verdicts = pd.DataFrame({"stage": ["s", "s", "s"], "prefix": ["slow", "jump", "other"],
                             "verdict": ["ok", "regression", "ok"], "cause": ["", "", ""],
                             "baseline_s": [24.8, 10.0, 100.0], "latest_s": [31.1, 30.0, 100.0],
                             "ratio": [1.25, 3.0, 1.0]})
    merged = merge_drift(verdicts, drift)
    assert merged["verdict"].tolist() == ["drift", "regression", "ok"]
    assert merged["cause"][0] == f"2.48x since {RUN_IDS[2]} (fails)"
    assert verdicts["verdict"][0] == "ok"  # the input is left alone
    rows = flagged_series(merged, drift, nights=4)
    assert [(r["prefix"], r["verdict"]) for r in rows] == [("slow", "drift"),
                                                           ("jump", "regression")]
    assert rows[0]["recent"] == pytest.approx([22.107, 24.760, 27.731, 31.058], abs=1e-3)
    assert rows[0]["ratio"] == pytest.approx(1.12 ** 8)
    assert rows[1]["recent"][-1] == 30.0 and rows[1]["ratio"] == 3.0
    assert flagged_series(merged, None)[1]["recent"] == [30.0]
    from prefect_dask_profiling.regression.drift import flagged_markdown

    lines = flagged_markdown(merged, drift, nights=3)
    assert lines[2].startswith("| prefix | verdict |")
    assert lines[4] == "| s/slow | drift 2.48x | 24.8 · 27.7 · **31.1** | 24.8 |"
    assert lines[5] == "| s/jump | regression 3.00x | 10 · 10 · **30** | 10 |"
    assert flagged_markdown(verdicts.assign(verdict="ok"), drift.iloc[0:0]) == []


def test_cli_drift_exit_codes(tmp_path):
    import json

    from typer.testing import CliRunner

    from prefect_dask_profiling.cli import app

    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    ids = [put(store, n, 10 * 1.12 ** n) for n in range(11)]
    runner = CliRunner()
    result = runner.invoke(app, ["drift", "--store", store.url, "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["run_id"] == ids[-1] and report["failing"]
    slow = [v for v in report["verdicts"] if v["prefix"] == "slow"][0]
    assert slow["verdict"] == "drift" and slow["start_run"] == ids[2]
    assert runner.invoke(app, ["drift", "--store", store.url, "--threshold", "3"]).exit_code == 0
    store.accept("ndvi", "v1", ids[-1])
    calm = runner.invoke(app, ["drift", "--store", store.url, "--pipeline", "ndvi"])
    assert calm.exit_code == 0 and "no drift" in calm.stdout
    bad = runner.invoke(app, ["drift", "--store", store.url, "--pipeline", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.stderr
