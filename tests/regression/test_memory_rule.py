"""The memory rule on generated histories: no false alarms under realistic noise, nothing
under the minimum effect, clear regressions and near-OOM stages caught; bad input refused."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest

from prefect_dask_profiling._util import InvalidInput
from prefect_dask_profiling.regression.confirm import Prior, confirm_signals
from prefect_dask_profiling.regression.memory import (
    MEMORY_VERDICT_COLUMNS,
    describe_memory,
    detect_memory,
    history_from_manifests,
    latest_from_manifest,
    min_effect,
    onset_nights,
)
from prefect_dask_profiling.regression.rule import RegressionRule

GiB, MiB = 2**30, 2**20
_spec = importlib.util.spec_from_file_location(
    "memory_rule", Path(__file__).parents[2] / "benchmarks" / "memory_rule.py")
memory_rule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(memory_rule)


def flagged(verdicts: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    rows = verdicts if metric is None else verdicts[verdicts["metric"] == metric]
    return rows[rows["verdict"] == "memory-regression"]


@pytest.mark.parametrize("seed", [1, 2])
def test_no_false_alarm_over_thousands_of_noisy_stage_nights(seed):
    history, latest = memory_rule.generate(3000, seed=seed)
    verdicts = detect_memory(history, latest)
    assert list(verdicts.columns) == MEMORY_VERDICT_COLUMNS
    assert len(verdicts) == 3000 * 3  # peak, spill, headroom per stage
    assert flagged(verdicts).empty, flagged(verdicts).head()
    assert (verdicts["verdict"] != "near-oom").all()  # generated peaks stay under 66% of limit


def test_nothing_is_flagged_while_the_increase_is_under_the_minimum_effect():
    history, latest = memory_rule.generate(3000, seed=3, factor=3.0, small=True)
    verdicts = detect_memory(history, latest)
    peaks = verdicts[verdicts["metric"] == "peak_bytes"]
    assert (peaks["ratio"] >= 1.5).mean() > 0.9  # the ratio gate alone would fire
    assert (peaks["delta"] < peaks["min_effect"]).all()
    assert flagged(verdicts).empty


def test_a_tripled_peak_above_the_minimum_effect_is_caught_and_only_there():
    history, latest = memory_rule.generate(2000, seed=4, factor=3.0)
    verdicts = detect_memory(history, latest)
    peaks = verdicts[verdicts["metric"] == "peak_bytes"]
    big = peaks[peaks["delta"] >= peaks["min_effect"]]
    # misses only where a late GC in the history widened its spread (half its range)
    assert len(big) > 1500 and (big["verdict"] == "memory-regression").mean() > 0.98
    assert flagged(verdicts, "spilled_bytes").empty
    assert "peak memory" in describe_memory(verdicts)


def test_spill_from_zero_to_gigabytes_is_a_regression():
    history = pd.DataFrame({"run_id": [f"r{i}" for i in range(5)], "stage": "reduce",
                            "peak_bytes": 2 * GiB, "spilled_bytes": 0.0,
                            "memory_limit": 8 * GiB})
    latest = pd.DataFrame([{"stage": "reduce", "peak_bytes": 2.1 * GiB,
                            "spilled_bytes": 3.1 * GiB, "memory_limit": 8 * GiB,
                            "headroom": 0.74}])
    verdicts = detect_memory(history, latest).set_index("metric")
    assert verdicts.loc["spilled_bytes", "verdict"] == "memory-regression"
    assert math.isinf(verdicts.loc["spilled_bytes", "ratio"])
    assert verdicts.loc["peak_bytes", "verdict"] == "ok"
    assert verdicts.loc["headroom", "verdict"] == "ok"


def test_near_oom_needs_no_history_and_both_checks_switch_off_separately():
    latest = [{"stage": "warp", "peak_bytes": 0.95 * GiB, "spilled_bytes": 0,
               "memory_limit": GiB, "headroom": 0.05}]
    verdicts = detect_memory([], latest)
    by_metric = verdicts.set_index("metric")["verdict"]
    assert by_metric["headroom"] == "near-oom"
    assert by_metric["peak_bytes"] == by_metric["spilled_bytes"] == "insufficient-history"
    only_time = detect_memory([], latest, RegressionRule(near_oom=False,
                                                         memory_regression=False))
    assert only_time.empty
    no_oom = detect_memory([], latest, RegressionRule(near_oom=False))
    assert set(no_oom["metric"]) == {"peak_bytes", "spilled_bytes"}


def test_min_effect_is_ten_percent_of_the_limit_or_256_mib():
    rule = RegressionRule()
    assert min_effect(GiB, rule) == pytest.approx(0.1 * GiB)
    assert min_effect(16 * GiB, rule) == 256 * MiB
    assert min_effect(0, rule) == 256 * MiB


@pytest.mark.parametrize("options, field", [
    ({"memory_threshold": 1.0}, "memory_threshold"),
    ({"memory_min_fraction": 1.5}, "memory_min_fraction"),
    ({"near_oom": "yes"}, "near_oom"),
    ({"memory_regression": 1}, "memory_regression"),
    ({"near_oom_headroom": -0.1}, "near_oom_headroom"),
    ({"memory_onset_chance": 0}, "memory_onset_chance"),
    ({"memory_onset_chance": 1}, "memory_onset_chance"),
    ({"memory_onset_chance": "often"}, "memory_onset_chance"),
])
def test_bad_memory_settings_are_refused_by_name(options, field):
    with pytest.raises(InvalidInput, match=field):
        RegressionRule.from_options(check_options=options)


def test_an_onset_needs_more_nights_the_shorter_the_clean_history():
    """n clean nights allow an occasional rate of 1/(n+2): k nights in a row confirm when
    that rate makes them a 1-in-10,000 chance (never fewer than two)."""
    rule = RegressionRule()
    assert [onset_nights(n, rule) for n in (3, 5, 8, 19, 20, 30, 97, 98)] == \
        [6, 5, 4, 4, 3, 3, 3, 2]
    assert all((1 / (n + 2)) ** onset_nights(n, rule) <= 1e-4 * (1 + 1e-9)
               for n in range(3, 200))
    assert all((1 / (n + 2)) ** (onset_nights(n, rule) - 1) > 1e-4
               for n in range(3, 98))
    assert onset_nights(30, RegressionRule(memory_onset_chance=0.5)) == 2


def _spill_rows(history_spills: list[float], tonight: float) -> pd.DataFrame:
    history = [{"run_id": f"r{i}", "stage": "reduce", "peak_bytes": 400 * MiB,
                "spilled_bytes": s, "memory_limit": GiB} for i, s in enumerate(history_spills)]
    latest = [{"stage": "reduce", "peak_bytes": 400 * MiB, "spilled_bytes": tonight,
               "memory_limit": GiB, "headroom": 0.6}]
    verdicts = detect_memory(history, latest)
    return verdicts[verdicts["metric"] == "spilled_bytes"]


def test_a_spill_onset_is_marked_and_a_known_spiller_is_not():
    onset = _spill_rows([0.0] * 10, 450 * MiB).iloc[0]
    assert onset["verdict"] == "memory-regression" and onset["nights_needed"] == 4
    assert "confirms after 4 nights in a row" in onset["note"]
    # a baseline that once spilled above the minimum effect: no onset (and, here, no flag)
    known = _spill_rows([0.0] * 9 + [300 * MiB], 450 * MiB).iloc[0]
    assert known["verdict"] == "ok" and known["nights_needed"] == 2
    # spilling a little in the baseline (under the 102 MiB effect) is still an onset
    little = _spill_rows([0.0] * 9 + [20 * MiB], 450 * MiB).iloc[0]
    assert little["verdict"] == "memory-regression" and little["nights_needed"] == 4


@pytest.mark.parametrize("nights_so_far, alert", [(1, "suspected"), (2, "suspected"),
                                                  (3, "regression")])
def test_an_onset_stays_suspected_until_its_nights_in_a_row(nights_so_far, alert):
    rows = _spill_rows([0.0] * 10, 450 * MiB)
    prior = {("reduce", "spilled_bytes"): Prior("suspected", math.inf, nights=nights_so_far)}
    out = confirm_signals(rows, prior, RegressionRule(), flagged=("memory-regression",),
                          conclusive=False)
    assert out["alert"].tolist() == [alert], out["alert_reason"].tolist()
    cleared = confirm_signals(_spill_rows([0.0] * 10, 0.0), prior, RegressionRule(),
                              flagged=("memory-regression",), conclusive=False)
    assert cleared["alert"].tolist() == ["cleared"]
    first = confirm_signals(rows, {}, RegressionRule(), flagged=("memory-regression",),
                            conclusive=False)
    assert first["alert"].tolist() == ["suspected"]
    assert "4 nights in a row" in first["alert_reason"].iloc[0]


def test_bad_rows_are_refused_by_name():
    with pytest.raises(InvalidInput, match="lacks column"):
        detect_memory([{"stage": "a", "peak_bytes": 1}], [])
    with pytest.raises(InvalidInput, match="peak_bytes"):
        detect_memory([], [{"stage": "a", "peak_bytes": -1, "spilled_bytes": 0}])


def test_rows_come_from_stored_manifests():
    def manifest(run_id, peak):
        return {"run_id": run_id, "stages": [
            {"name": "read", "memory": {"workers": 2, "peak_bytes": peak, "spilled_bytes": 0,
                                        "memory_limit": GiB, "headroom": 1 - peak / GiB}},
            {"name": "old"}]}
    history = history_from_manifests([manifest(f"r{i}", 200 * MiB) for i in range(4)])
    latest = latest_from_manifest(manifest("tonight", 500 * MiB))
    assert list(history["stage"]) == ["read"] * 4 and list(latest["stage"]) == ["read"]
    verdicts = detect_memory(history, latest).set_index("metric")
    assert verdicts.loc["peak_bytes", "verdict"] == "memory-regression"
    assert verdicts.loc["peak_bytes", "n_history"] == 4
