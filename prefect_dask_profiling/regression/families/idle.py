"""The idle family: idle worker-hours per stage against the cost baseline (:mod:`..cost`).

Stored as ``cost`` (manifest key, ``cost_verdicts.csv``, baseline family). What a verdict
does is ``cost_regression``: ``"warn"`` — informational, never in the outcome, no
confirmation and no episode (a warning of the run names it); ``"fail"`` — confirmed like
storage requests, and a confirmed idle regression fails the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd

from prefect_dask_profiling.regression.alerts import Book, SignalRow
from prefect_dask_profiling.regression.cost import (
    COST_METRIC,
    COST_VERDICT_COLUMNS,
    cost_flagged,
    describe_cost,
    detect_idle,
)
from prefect_dask_profiling.regression.families.base import REGISTRY, Judged, StageFamily
from prefect_dask_profiling.regression.rule import RegressionRule, Rules

__all__ = ["IdleFamily"]

INFORMATIONAL = "informational (cost_regression='warn')"


class IdleFamily(StageFamily):
    """``idle-regression`` when a stage's idle worker-hours grew against its baseline."""

    name: ClassVar[str] = "cost"
    metrics: ClassVar[dict[str, str | None]] = {COST_METRIC: "cost"}
    baseline: ClassVar[str | None] = "cost"
    table: ClassVar[str | None] = "cost_verdicts"
    json_key: ClassVar[str] = "cost_verdicts"
    flags: ClassVar[tuple[str, ...]] = ("idle-regression",)
    settings: ClassVar[tuple[str, ...]] = (
        "cost_regression", "threshold", "z_threshold", "min_seconds", "min_history",
        "history")
    columns: ClassVar[tuple[str, ...]] = tuple(COST_VERDICT_COLUMNS)
    policy: ClassVar[tuple[tuple[str, tuple[str, ...], bool], ...]] = (
        (COST_METRIC, ("idle-regression",), False),)

    def history_size(self, rules: Rules) -> int:
        return rules.regression.history

    def judge_rows(self, manifests: tuple[Mapping[str, Any], ...],
                   tonight: Mapping[str, Any], rule: RegressionRule) -> pd.DataFrame:
        return detect_idle(manifests, tonight, rule)

    def confirm(self, rows: pd.DataFrame, book: Book, rule: RegressionRule) -> pd.DataFrame:
        """Confirmed under ``cost_regression="fail"``; informational otherwise."""
        if rule.cost_regression == "fail":
            return super().confirm(rows, book, rule)
        return rows.assign(alert="", alert_reason=[
            INFORMATIONAL if v == "idle-regression" else "" for v in rows["verdict"]])

    def judged(self, rows: pd.DataFrame, rule: RegressionRule) -> pd.DataFrame:
        """The rows that count in the outcome: all under ``"fail"``, none otherwise."""
        return rows if rule.cost_regression == "fail" else rows.iloc[0:0]

    def message_rows(self, rows: pd.DataFrame, rule: RegressionRule, *, partial: bool
                     ) -> pd.DataFrame:
        return self.flagged(self.judged(rows, rule))

    def stored_signals(self, rows: pd.DataFrame, rule: RegressionRule) -> list[SignalRow]:
        return super().stored_signals(self.judged(rows, rule), rule)

    def describe(self, rows: pd.DataFrame) -> str:
        return describe_cost(rows)

    def manifest(self, rows: pd.DataFrame, judged: Judged) -> dict[str, Any] | None:
        """``flagged`` texts, the ``cost_regression`` mode and the failing
        ``stage/metric`` names."""
        failing = set(judged.outcome.failing)
        return {"flagged": cost_flagged(rows), "mode": judged.rules.regression.cost_regression,
                "failing": [f"{r.stage}/{r.metric}" for r in self.flagged(rows).itertuples(
                    index=False) if self.key(r) in failing]}

    def markdown(self, part: Mapping[str, Any], judged: Judged | None) -> list[str]:
        """The stages whose idle grew, those that fail the run in bold."""
        idle = part.get("flagged") or []
        if not idle:
            return []
        how = ("cost_regression='fail': a confirmed idle regression fails the run"
               if part.get("mode") == "fail" else "informational")
        failing = {str(key).split("/", 1)[0] for key in part.get("failing") or []}
        return [f"**Idle grew against the baseline ({how}):**", "",
                *[f"- {text}" + (" — **fails the run**" if text.split(":", 1)[0]
                                 .removeprefix("stage ") in failing else "")
                  for text in idle]]

    def warnings(self, rows: pd.DataFrame, judged: Judged) -> list[str]:
        """One warning per stage whose idle grew: informational, suspected or failing."""
        if judged.rules.regression.cost_regression != "fail":
            return [f"idle grew (informational): {text}" for text in cost_flagged(rows)]
        failing = set(judged.outcome.failing)
        out = []
        for row in self.flagged(rows).itertuples(index=False):
            what = "fails the run" if self.key(row) in failing else (
                row.alert_reason or "does not fail the run")
            out.append(f"idle grew ({what}): {row.text}")
        return out


REGISTRY.register(IdleFamily())
