"""The time family: total seconds per (stage, prefix) against the healthy baseline runs.

The one-night rule is :mod:`..verdict` (:func:`~..verdict.detect_regressions`), confirmed by
:func:`~..confirm.confirm_verdicts`. It is the registry's primary family: its rows are the
run's per-prefix verdict table (``regression.csv``, ``check``'s ``verdicts``), into which
drift is merged; its regressed stages are explained (:mod:`..explain`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pandas as pd

from prefect_dask_profiling.regression.alerts import (
    METRIC,
    Key,
    Signal,
    SignalRow,
    priors,
    signals_from_tables,
)
from prefect_dask_profiling.regression.baseline import Baseline
from prefect_dask_profiling.regression.confirm import confirm_verdicts, noise_reach
from prefect_dask_profiling.regression.explain import Explanation, explain_verdicts
from prefect_dask_profiling.regression.families.base import REGISTRY, Family, Judged
from prefect_dask_profiling.regression.judged import History, Tonight
from prefect_dask_profiling.regression.rule import RegressionRule, Rules
from prefect_dask_profiling.regression.verdict import (
    OUTPUT_COLUMNS,
    describe,
    detect_regressions,
    regressed,
    run_outcome,
)

__all__ = ["TimeFamily"]


class TimeFamily(Family):
    """Per-prefix total seconds: ``regression`` when a prefix ran ``threshold`` times its
    baseline median (and the z test, minimum seconds and share agree)."""

    name: ClassVar[str] = "time"
    metrics: ClassVar[dict[str, str | None]] = {METRIC: "time"}
    baseline: ClassVar[str | None] = "time"
    table: ClassVar[str | None] = "regression"
    json_key: ClassVar[str] = "verdicts"
    event: ClassVar[str | None] = "dask-profiling.regression.detected"
    flags: ClassVar[tuple[str, ...]] = ("regression",)
    settings: ClassVar[tuple[str, ...]] = (
        "threshold", "z_threshold", "min_seconds", "min_share", "min_history", "mad_floor",
        "abs_floor_s", "history", "confirm", "resolve_after")
    columns: ClassVar[tuple[str, ...]] = tuple(OUTPUT_COLUMNS)
    always_stored: ClassVar[bool] = True

    def history_size(self, rules: Rules) -> int:
        return rules.regression.history

    def candidates(self, runs: list[str], baseline: Baseline) -> list[str]:
        """Only the time baseline's own runs (their manifests explain a regression)."""
        return [r for r in runs if r in baseline.runs]

    def detect(self, tonight: Tonight, history: History, rules: Rules) -> pd.DataFrame:
        rows = detect_regressions(history.baseline.history, tonight.summary,
                                  rule=rules.regression)
        return confirm_verdicts(rows, priors(history.alerts), rules.regression,
                                noise_reach(history.baseline.history))

    def explain(self, rows: pd.DataFrame, tonight: Tonight, history: History
                ) -> dict[str, Explanation]:
        if regressed(rows).empty:
            return {}
        return explain_verdicts(rows, tonight.context, list(history.manifests))

    def void_reason(self, rows: pd.DataFrame, tonight: Tonight) -> str:
        return run_outcome(rows, failed=tonight.failed, incomplete=tonight.incomplete).reason

    def rows(self, judged: Judged) -> pd.DataFrame:
        """The run's verdict table (drift merged in: its ``regression`` rows are kept)."""
        return judged.verdicts

    def flagged(self, rows: pd.DataFrame) -> pd.DataFrame:
        return regressed(rows)

    def key(self, row: Any) -> Key:
        return (str(row.stage), str(row.prefix), METRIC)

    def stored_signals(self, rows: pd.DataFrame, rule: RegressionRule) -> list[SignalRow]:
        """None: time's signals are its stored table (``regression.csv``)."""
        return []

    def signals(self, rows: pd.DataFrame, rule: RegressionRule) -> dict[Key, Signal]:
        return signals_from_tables(rows)

    def describe(self, rows: pd.DataFrame) -> str:
        return describe(rows)

    def manifest(self, rows: pd.DataFrame, judged: Judged) -> dict[str, Any] | None:
        return None

    def stored(self, rows: pd.DataFrame, judged: Judged) -> pd.DataFrame | None:
        return judged.verdicts


REGISTRY.register(TimeFamily())
