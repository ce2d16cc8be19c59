"""Regression verdicts on generated nightly histories (fixed seeds) and edge cases."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefect_dask_profiling.regression.verdict import (
    OUTPUT_COLUMNS,
    VERDICTS,
    RegressionDetected,
    detect_regressions,
    regressed,
)

N_PREFIXES = 20
WINDOW = 8
NIGHTS = 30


# ---- generated histories -------------------------------------------------------------------

def _uniform(rng, n):
    return rng.uniform(-0.2, 0.2, n)


def _normal(rng, n):  # +-20% is two standard deviations
    return rng.normal(0.0, 0.1, n)


def _laplace(rng, n):  # heavy-tailed: double exponential
    return rng.laplace(0.0, 0.1, n)


def _student_t(rng, n):  # heavy-tailed: Student's t with 4 degrees of freedom
    return 0.08 * rng.standard_t(4, n)


def _lognormal(rng, n):  # skewed: slow nights are slower than fast nights are fast
    return rng.lognormal(0.0, 0.15, n) - 1.0


NOISES = {"uniform": _uniform, "normal": _normal, "laplace": _laplace,
          "student_t": _student_t, "lognormal": _lognormal}


class Nights:
    """A pipeline of 20 prefixes (one dominant, several minor) run night after night."""

    def __init__(self, noise: str, seed: int, minor_spikes: bool = False,
                 varying_input: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.noise = NOISES[noise]
        weights = np.sort(self.rng.pareto(1.5, N_PREFIXES) + 0.05)[::-1]
        self.mean_s = 2000.0 * weights / weights.sum()
        self.tasks = self.rng.integers(20, 2000, N_PREFIXES)
        self.stages = ["read", "reduce", "write", "read"] * (N_PREFIXES // 4)
        self.prefixes = [f"prefix-{i:02d}" for i in range(N_PREFIXES)]
        self.minor_spikes = minor_spikes
        self.varying_input = varying_input

    def night(self, run_id: str) -> pd.DataFrame:
        seconds = self.mean_s * (1.0 + self.noise(self.rng, N_PREFIXES))
        tasks = self.tasks.astype(float)
        if self.varying_input:  # the scene count varies nightly; time follows the work
            scale = self.rng.uniform(0.8, 1.2)
            seconds, tasks = seconds * scale, np.round(tasks * scale)
        if self.minor_spikes:  # noisy neighbours hit the small prefixes hard now and then
            minor = self.mean_s / self.mean_s.sum() < 0.008
            spikes = minor & (self.rng.uniform(size=N_PREFIXES) < 0.1)
            seconds = np.where(spikes, seconds * self.rng.uniform(3, 6, N_PREFIXES), seconds)
        return pd.DataFrame({"run_id": run_id, "stage": self.stages, "prefix": self.prefixes,
                             "tasks": tasks.astype(int), "total_s": seconds})

    def history(self, n_nights: int) -> list[pd.DataFrame]:
        return [self.night(f"2026110{i // 10}T{i % 10:02d}") for i in range(n_nights)]


def _windows(nights: list[pd.DataFrame], first: int = WINDOW):
    """(history, latest) pairs, the history being the previous WINDOW nights."""
    for t in range(first, len(nights)):
        yield pd.concat(nights[max(0, t - WINDOW):t], ignore_index=True), nights[t]


def _slow_down(latest: pd.DataFrame, history: pd.DataFrame, prefix: str, factor: float,
               cause: str) -> pd.DataFrame:
    """Latest night with ``prefix`` at ``factor`` x its baseline median, for ``cause``."""
    latest = latest.copy()
    row = latest["prefix"] == prefix
    past = history[history["prefix"] == prefix]
    median_s, median_tasks = past["total_s"].median(), past["tasks"].median()
    tasks_factor = {"more tasks": factor, "slower tasks": 1.0, "both": math.sqrt(factor)}[cause]
    latest.loc[row, "total_s"] = factor * median_s
    latest.loc[row, "tasks"] = int(math.ceil(tasks_factor * median_tasks))
    return latest


SCENARIOS = [(noise, 1, False, False) for noise in NOISES]
SCENARIOS += [("uniform", 2, False, False), ("laplace", 3, True, False),
              ("normal", 4, False, True)]


@pytest.mark.parametrize(("noise", "seed", "spikes", "varying"), SCENARIOS)
def test_30_noisy_nights_no_false_alarm_and_every_slowdown_flagged(noise, seed, spikes,
                                                                    varying):
    """Each night as measured must not alarm; the same night with one prefix carrying >= 5%
    of the run slowed to 2.2-4x its baseline median must alarm on that prefix only, with the
    right cause. Histories grow from 3 to 8 runs, then roll."""
    pipeline = Nights(noise, seed, minor_spikes=spikes, varying_input=varying)
    rng = np.random.default_rng(seed + 100)
    causes = ["more tasks", "slower tasks", "both"]
    nights = pipeline.history(NIGHTS + 3)
    for t, (history, latest) in enumerate(_windows(nights, first=3)):
        verdicts = detect_regressions(history, latest.drop(columns="run_id"))
        assert set(verdicts["verdict"]) <= {"ok", "improved"}, verdicts.head()
        shares = latest.set_index("prefix")["total_s"] / latest["total_s"].sum()
        candidates = shares[shares >= 0.05].index
        prefix, factor = candidates[t % len(candidates)], rng.uniform(2.2, 4.0)
        # with a varying input the task count moves nightly: only "slower tasks" is exact
        cause = "slower tasks" if varying else causes[t % 3]
        slow = _slow_down(latest, history, prefix, factor, cause)
        flagged = regressed(detect_regressions(history, slow.drop(columns="run_id")))
        assert flagged["prefix"].tolist() == [prefix], (t, factor)
        assert flagged["cause"].iloc[0] == cause, (t, factor, flagged)
    assert t + 1 == NIGHTS


def test_slowdown_of_a_minor_prefix_is_not_a_regression():
    nights = Nights("uniform", 7).history(WINDOW + 1)
    history, latest = pd.concat(nights[:WINDOW]), nights[WINDOW]
    shares = latest.set_index("prefix")["total_s"] / latest["total_s"].sum()
    minor = shares.idxmin()
    assert shares[minor] < 0.01
    verdicts = detect_regressions(history, _slow_down(latest, history, minor, 3.0,
                                                      "slower tasks"))
    row = verdicts.set_index("prefix").loc[minor]
    assert row["verdict"] == "ok" and row["ratio"] == pytest.approx(3.0)
    # the same slowdown counts once the share gate is lowered
    lowered = detect_regressions(history, _slow_down(latest, history, minor, 3.0,
                                                     "slower tasks"), min_share=0.0)
    assert regressed(lowered)["prefix"].tolist() == [minor]


# ---- small hand-made cases -----------------------------------------------------------------

def _history(values: dict[str, list[float]], tasks: int = 10) -> pd.DataFrame:
    rows = [{"run_id": f"r{i}", "stage": "s", "prefix": p, "tasks": tasks, "total_s": v}
            for p, vs in values.items() for i, v in enumerate(vs)]
    return pd.DataFrame(rows)


def _latest(values: dict[str, float], tasks: dict[str, int] | None = None) -> pd.DataFrame:
    tasks = tasks or {}
    return pd.DataFrame([{"stage": "s", "prefix": p, "tasks": tasks.get(p, 10), "total_s": v}
                         for p, v in values.items()])


def _row(verdicts: pd.DataFrame, prefix: str) -> pd.Series:
    return verdicts.set_index("prefix").loc[prefix]


def test_output_columns_and_verdict_values():
    v = detect_regressions(_history({"a": [10, 11, 9, 10], "b": [5, 5, 5, 5]}),
                           _latest({"a": 30, "c": 4}))
    assert list(v.columns) == OUTPUT_COLUMNS
    assert set(v["verdict"]) <= set(VERDICTS)
    assert _row(v, "a")["verdict"] == "regression"
    assert _row(v, "b")["verdict"] == "vanished"
    assert _row(v, "c")["verdict"] == "new"
    assert v["verdict"].iloc[0] == "regression"  # regressions come first
    a = _row(v, "a")
    assert a["baseline_s"] == 10 and a["latest_s"] == 30 and a["ratio"] == 3
    assert a["n_history"] == 4 and a["share"] == pytest.approx(30 / 34)


def test_constant_history_gives_finite_z_and_no_alarm_on_wobble():
    history = _history({"a": [100.0] * 6, "b": [50.0] * 6})
    v = detect_regressions(history, _latest({"a": 110.0, "b": 50.0}))
    a = _row(v, "a")
    assert math.isfinite(a["robust_z"]) and a["robust_z"] == pytest.approx(10 / 5)
    assert set(v["verdict"]) == {"ok"}
    v = detect_regressions(history, _latest({"a": 210.0, "b": 50.0}))
    assert _row(v, "a")["verdict"] == "regression"
    assert _row(v, "a")["robust_z"] == pytest.approx(110 / 5)


def test_zero_baseline():
    history = _history({"a": [0.0, 0.0, 0.0, 0.0], "b": [100.0, 100.0, 98.0, 102.0]})
    v = detect_regressions(history, _latest({"a": 20.0, "b": 100.0}))
    a = _row(v, "a")
    assert a["verdict"] == "regression" and a["ratio"] == math.inf
    # zero before and zero now is no change
    v = detect_regressions(history, _latest({"a": 0.0, "b": 100.0}))
    assert _row(v, "a")["ratio"] == 1.0 and _row(v, "a")["verdict"] == "ok"
    # below the minimum effect it is not a regression
    v = detect_regressions(history, _latest({"a": 0.5, "b": 100.0}))
    assert _row(v, "a")["verdict"] == "ok"


def test_zero_baseline_tasks_cause_is_more_tasks():
    history = _history({"a": [0.0] * 4, "b": [100.0] * 4}, tasks=0)
    v = detect_regressions(history, _latest({"a": 50.0, "b": 100.0}, tasks={"a": 10}))
    assert _row(v, "a")["cause"] == "more tasks"


def test_single_prefix():
    history = _history({"only": [60.0, 62.0, 58.0]})
    assert detect_regressions(history, _latest({"only": 61.0}))["verdict"].tolist() == ["ok"]
    v = detect_regressions(history, _latest({"only": 200.0}))
    assert v["verdict"].tolist() == ["regression"] and v["cause"].tolist() == ["slower tasks"]


def test_improvement_and_its_cause():
    history = _history({"a": [100.0, 101.0, 99.0, 100.0], "b": [100.0, 100.0, 101.0, 99.0]})
    v = detect_regressions(history, _latest({"a": 20.0, "b": 100.0}, tasks={"a": 2}))
    assert _row(v, "a")["verdict"] == "improved"
    assert _row(v, "a")["cause"] == "fewer tasks"
    v = detect_regressions(history, _latest({"a": 20.0, "b": 100.0}))
    assert _row(v, "a")["cause"] == "faster tasks"
    assert regressed(v).empty


def test_too_few_runs_is_insufficient_history_never_regression():
    history = _history({"a": [10.0, 10.0]})
    v = detect_regressions(history, _latest({"a": 100.0, "new": 50.0}))
    assert set(v["verdict"]) == {"insufficient-history"}
    v = detect_regressions(history.iloc[:0], _latest({"a": 100.0}))
    assert v["verdict"].tolist() == ["insufficient-history"]
    assert detect_regressions(history, _latest({"a": 100.0}), min_history=2)[
        "verdict"].tolist() == ["regression"]


def test_prefix_seen_in_too_few_runs_is_insufficient_history():
    history = pd.concat([_history({"a": [10.0] * 6}),
                         _history({"rare": [5.0, 5.0]})])
    v = detect_regressions(history, _latest({"a": 10.0, "rare": 50.0}))
    assert _row(v, "rare")["verdict"] == "insufficient-history"
    assert _row(v, "rare")["n_history"] == 2


def test_nan_and_inf_are_treated_as_missing():
    history = _history({"a": [10.0, np.nan, 11.0, 9.0, np.inf], "b": [20.0] * 5})
    v = detect_regressions(history, _latest({"a": 10.0, "b": np.nan}))
    a, b = _row(v, "a"), _row(v, "b")
    assert a["verdict"] == "ok" and a["n_history"] == 3 and a["baseline_s"] == 10.0
    assert "2 non-finite or negative history total_s values ignored" in a["note"]
    assert b["verdict"] == "vanished"
    assert b["note"] == "1 non-finite or negative latest total_s value ignored"
    # a NaN task count leaves the cause empty instead of crashing
    latest = _latest({"a": 40.0, "b": 20.0})
    latest["tasks"] = [np.nan, 10]
    v = detect_regressions(history, latest)
    assert _row(v, "a")["verdict"] == "regression" and _row(v, "a")["cause"] == ""


def test_negative_and_unparsable_values_are_treated_as_missing():
    history = _history({"a": [10.0, -5.0, 11.0, 9.0], "b": [20.0] * 4})
    history["total_s"] = history["total_s"].astype(object)
    history.loc[history.index[-1], "total_s"] = "n/a"
    v = detect_regressions(history, _latest({"a": 10.0, "b": 20.0}))
    assert _row(v, "a")["n_history"] == 3 and _row(v, "b")["n_history"] == 3
    assert set(v["verdict"]) == {"ok"}


def test_prefix_with_only_non_finite_values_keeps_its_note():
    history = pd.concat([_history({"a": [10.0] * 4}), _history({"z": [np.nan] * 4})])
    v = detect_regressions(history, _latest({"a": 10.0}))
    z = _row(v, "z")
    assert z["verdict"] == "insufficient-history" and z["n_history"] == 0
    assert "4 non-finite" in z["note"]


def test_repeated_rows_are_added_up():
    history = pd.concat([_history({"a": [5.0, 5.0, 5.0]})] * 2)
    latest = pd.concat([_latest({"a": 5.0})] * 2)
    a = _row(detect_regressions(history, latest), "a")
    assert a["baseline_s"] == 10.0 and a["latest_s"] == 10.0 and a["baseline_tasks"] == 20


def test_same_prefix_in_two_stages_is_judged_separately():
    history = pd.concat([_history({"a": [10.0] * 4}),
                         _history({"a": [10.0] * 4}).assign(stage="t")])
    latest = pd.concat([_latest({"a": 10.0}), _latest({"a": 40.0}).assign(stage="t")])
    flagged = regressed(detect_regressions(history, latest))
    assert flagged[["stage", "prefix"]].values.tolist() == [["t", "a"]]


@pytest.mark.parametrize("threshold", [1.0, 0.5, 0, -2, float("nan"), float("inf")])
def test_threshold_must_exceed_one(threshold):
    with pytest.raises(ValueError, match="threshold"):
        detect_regressions(_history({"a": [1.0] * 3}), _latest({"a": 1.0}), threshold=threshold)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"z_threshold": 0}, "z_threshold"), ({"min_seconds": -1}, "min_seconds"),
    ({"min_share": 2}, "min_share"), ({"min_history": 0}, "min_history"),
    ({"mad_floor": -0.1}, "mad_floor"), ({"abs_floor_s": 0}, "abs_floor_s")])
def test_other_arguments_are_validated(kwargs, name):
    with pytest.raises(ValueError, match=name):
        detect_regressions(_history({"a": [1.0] * 3}), _latest({"a": 1.0}), **kwargs)


def test_missing_columns_are_named():
    history = _history({"a": [1.0] * 3})
    with pytest.raises(ValueError, match="history is missing column.*run_id.*total_s"):
        detect_regressions(history.drop(columns=["run_id", "total_s"]), _latest({"a": 1.0}))
    with pytest.raises(ValueError, match="latest is missing column.*tasks"):
        detect_regressions(history, _latest({"a": 1.0}).drop(columns="tasks"))
    with pytest.raises(ValueError, match="latest must be a pandas DataFrame"):
        detect_regressions(history, {"a": 1.0})


def test_regression_detected_carries_verdicts_and_names_prefixes():
    history = _history({"read": [10.0, 11.0, 9.0], "write": [20.0, 20.0, 21.0]})
    verdicts = detect_regressions(history, _latest({"read": 35.0, "write": 20.0}))
    exc = RegressionDetected(verdicts)
    assert exc.verdicts is verdicts
    assert str(exc).startswith("regression in 1 prefix: s/read 3.5x (10.0 s -> 35.0 s")
    assert "write" not in str(exc)
    with pytest.raises(RegressionDetected, match="s/read"):
        raise exc


_value = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                   st.floats(0, 1e4))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abc"), st.integers(-1, 100),
                          _value), max_size=30),
       st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 100), _value), max_size=5))
@example(hist_rows=[(0, "a", 0, 2.225073858507e-311)], latest_rows=[("a", 0, 1.0)])  # overflow
def test_any_input_gives_a_verdict_per_prefix(hist_rows, latest_rows):
    history = pd.DataFrame(hist_rows, columns=["run_id", "prefix", "tasks", "total_s"])
    history = history.assign(stage="s", run_id=history["run_id"].astype(str))
    latest = pd.DataFrame(latest_rows, columns=["prefix", "tasks", "total_s"]).assign(stage="s")
    v = detect_regressions(history, latest)
    assert set(v["verdict"]) <= set(VERDICTS)
    assert not v.duplicated(["stage", "prefix"]).any()
    assert set(v["prefix"]) == set(history["prefix"]) | set(latest["prefix"])


# ---- the rule, and what the verdicts mean for a run ----------------------------------------

def test_the_rule_holds_every_setting_with_its_default():
    from prefect_dask_profiling.regression.rule import CHECK_OPTION_KEYS, RegressionRule

    rule = RegressionRule()
    assert (rule.threshold, rule.z_threshold, rule.min_seconds, rule.min_share,
            rule.min_history, rule.mad_floor, rule.abs_floor_s, rule.history, rule.confirm,
            rule.resolve_after) == (2.0, 3.5, 1.0, 0.05, 3, 0.05, 0.1, 8, "auto", 3)
    assert set(CHECK_OPTION_KEYS) == set(rule.check_options()) == {
        "z_threshold", "min_seconds", "min_share", "min_history", "mad_floor", "abs_floor_s",
        "confirm", "resolve_after",
        "memory_regression", "memory_history", "memory_threshold", "memory_z_threshold",
        "memory_mad_floor", "memory_onset_chance",
        "memory_min_fraction", "memory_min_bytes", "near_oom", "near_oom_headroom",
        "requests_regression", "requests_threshold", "requests_min_per_chunk"}
    history, latest = _history({"a": [10.0, 11, 9, 10], "b": [5.0] * 4}), _latest({"a": 25.0})
    strict = RegressionRule(threshold=3.0, min_history=4)
    by_rule = detect_regressions(history, latest, rule=strict)
    by_keywords = detect_regressions(history, latest, threshold=3.0, min_history=4)
    pd.testing.assert_frame_equal(by_rule, by_keywords)
    overridden = detect_regressions(history, latest, rule=strict, threshold=2.0)
    assert regressed(overridden)["prefix"].tolist() == ["a"] and regressed(by_rule).empty


def test_the_stored_rule_documents_name_every_setting():
    """The stored rules (``rules`` in a manifest) and the runner's ``check_options``
    TypedDict name exactly the dataclasses' fields: a setting added to a rule must be added
    to ``CheckOptions`` too, and is stored."""
    from dataclasses import fields

    from prefect_dask_profiling.regression.rule import (
        CHECK_OPTION_KEYS,
        CheckOptions,
        DriftRule,
        RegressionRule,
        Rules,
    )

    assert set(CheckOptions.__annotations__) == set(CHECK_OPTION_KEYS)
    stored = Rules().to_dict()
    assert set(stored) == {"regression", "drift"}
    assert set(stored["regression"]) == {f.name for f in fields(RegressionRule)}
    assert set(stored["drift"]) == {f.name for f in fields(DriftRule)}
    assert Rules.from_dict(stored) == Rules()


@pytest.mark.parametrize(("settings", "message"), [
    ({"z_threshold": -1}, "z_threshold must be a finite number > 0, got -1"),
    ({"min_share": 5}, "min_share must be a finite number between 0 and 1, got 5"),
    ({"min_history": 0}, "min_history must be a whole number >= 1, got 0"),
    ({"min_seconds": -3}, "min_seconds must be a finite number >= 0, got -3"),
    ({"min_history": 2.5}, "min_history must be a whole number"),
    ({"min_seconds": True}, "min_seconds must be a finite number >= 0, got True"),
    ({"threshold": "2"}, "threshold must be a finite number > 1"),
    ({"history": 0}, "history must be a whole number >= 1"),
    ({"abs_floor_s": float("inf")}, "abs_floor_s"),
    ({"confirm": "sometimes"}, "confirm must be one of 'auto', 'never', 'always', got 'sometimes'"),
    ({"resolve_after": 0}, "resolve_after must be a whole number >= 1, got 0"),
])
def test_the_rule_refuses_bad_values_naming_the_key_and_range(settings, message):
    from prefect_dask_profiling._util import InvalidInput
    from prefect_dask_profiling.regression.rule import RegressionRule

    with pytest.raises(InvalidInput) as info:
        RegressionRule(**settings)
    assert message in str(info.value)


def test_options_build_the_rule_and_unknown_keys_are_named():
    from prefect_dask_profiling.regression.rule import RegressionRule

    rule = RegressionRule.from_options(3.0, 5, {"min_share": 0.1})
    assert (rule.threshold, rule.history, rule.min_share) == (3.0, 5, 0.1)
    with pytest.raises(ValueError, match=r"unknown keys \['bogus'\].*z_threshold"):
        RegressionRule.from_options(check_options={"bogus": 1})
    with pytest.raises(ValueError, match="check_options must be a dict"):
        RegressionRule.from_options(check_options=[("min_share", 0.1)])
    with pytest.raises(ValueError, match="unknown regression setting.*bogus"):
        detect_regressions(_history({"a": [1.0] * 3}), _latest({"a": 1.0}), bogus=1)


def test_run_outcome_counts_only_judged_runs_that_ended_normally():
    from prefect_dask_profiling.regression.verdict import run_outcome

    history = _history({"a": [10.0, 11, 9, 10]})
    slow = detect_regressions(history, _latest({"a": 40.0}))
    fine = detect_regressions(history, _latest({"a": 10.0}))
    assert run_outcome(slow).regressed and run_outcome(slow).judged
    assert not run_outcome(fine).regressed and run_outcome(fine).reason == ""
    failed = run_outcome(slow, failed=True)
    assert not failed.regressed and failed.judged and "failed" in failed.reason
    assert "incomplete" in run_outcome(slow, incomplete=True).reason
    unjudged = run_outcome(None)
    assert not unjudged.regressed and not unjudged.judged and unjudged.reason


@pytest.mark.parametrize(("run_id", "status", "restart", "counts"), [
    ("r2", "healthy", None, True),
    ("r2", "regressed", None, False),  # stored regressed, no signal says why: out
    ("r2", "failed", None, False),
    ("r2", "incomplete", None, False),
    ("r2", "unjudged", None, False),
    ("r1", "healthy", "r2", False),    # older than the accepted run
    ("r2", "regressed", "r2", True),   # the accepted run itself
    ("r3", "healthy", "r2", True),
    ("r3", "regressed", "r2", False),
])
def test_which_runs_count_in_a_baseline(run_id, status, restart, counts):
    """The standing of one stored night among r1 < r2 < r3 (the rest healthy)."""
    from prefect_dask_profiling.regression.alerts import Night, replay
    from prefect_dask_profiling.store.manifest import RunKey

    day = {"r1": "2026-11-01", "r2": "2026-11-02", "r3": "2026-11-03"}
    nights = [Night(RunKey(r, "p", "v"), status=status if r == run_id else "healthy",
                    started=f"{day[r]}T02:00:00+00:00") for r in ("r1", "r2", "r3")]
    book, _ = replay([n for n in nights if n.status in ("healthy", "regressed")], [],
                     restart=restart)
    for family in ("time", "memory", "requests"):
        assert (run_id in book.baseline_runs(family)) is counts


def test_a_regression_elsewhere_does_not_hide_a_step_under_the_share_floor():
    """A prefix carrying 10 % of the usual run steps 3.4x on a night when another prefix
    runs 100x slow: it is under 5 % of tonight's inflated total, but its seconds are a
    third of the usual run's, so it regresses; a prefix that is small in both is not judged
    on its ratio alone."""
    history = _history({"big": [90.0, 92, 88, 91, 89], "step": [10.0, 10.2, 9.8, 10.1, 9.9],
                        "tiny": [1.0, 1.02, 0.98, 1.01, 0.99]})
    latest = _latest({"big": 9000.0, "step": 34.0, "tiny": 3.0})
    v = detect_regressions(history, latest)
    assert _row(v, "step")["share"] < 0.05  # of tonight's total: the old floor hid it
    assert _row(v, "step")["verdict"] == "regression"
    assert _row(v, "big")["verdict"] == "regression"
    assert _row(v, "tiny")["verdict"] == "ok"  # 3 s is 3 % of the usual 101 s
