"""The drift family: a slow climb of a prefix's seconds over many nights (:mod:`..drift`).

Judged from the series of comparable nights since the baseline start (read by
:meth:`DriftFamily.read` in the judge's one read of the history),
not on a failed or incomplete run; merged into the per-prefix verdicts (a one-night
``regression`` keeps its verdict). Only drift past the one-night ``threshold`` fails the run
and reaches the state machine; a drifting prefix is always named.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypedDict

import pandas as pd

from prefect_dask_profiling._util import finite_number
from prefect_dask_profiling.regression import drift as drift_rule
from prefect_dask_profiling.regression.alerts import Key, SignalRow
from prefect_dask_profiling.regression.families.base import (
    REGISTRY,
    Family,
    HistoryQuery,
    Judged,
)
from prefect_dask_profiling.regression.judged import FamilyRead, History, Tonight
from prefect_dask_profiling.regression.rule import RegressionRule, Rules

__all__ = ["DriftFamily", "DriftFlags"]


class DriftFlags(TypedDict):
    """The manifest's ``drift``: the series note and the drifting ``stage/prefix`` names
    (``failing``: those that fail the run)."""

    note: str
    failing: list[str]
    drifting: list[str]


class DriftFamily(Family):
    """Per-prefix drift (CUSUM on log seconds against the series' start nights)."""

    name: ClassVar[str] = "drift"
    metrics: ClassVar[dict[str, str | None]] = {"drift": "time"}
    table: ClassVar[str | None] = "drift"
    json_key: ClassVar[str] = "drift_verdicts"
    event: ClassVar[str | None] = "dask-profiling.drift.detected"
    flags: ClassVar[tuple[str, ...]] = ("drift",)
    settings: ClassVar[tuple[str, ...]] = ("threshold", "min_seconds", "min_share")
    columns: ClassVar[tuple[str, ...]] = tuple(drift_rule.DRIFT_COLUMNS)
    fails_by_row: ClassVar[bool] = True
    always_stored: ClassVar[bool] = True

    def read(self, query: HistoryQuery) -> FamilyRead:
        """The series of comparable nights since the baseline start (``run_id, started,
        stage, prefix, tasks, total_s``); empty when drift is switched off."""
        rules = query.rules.drift
        if not rules.enabled:
            return FamilyRead(drift_rule.empty_series(), "drift is switched off")
        found = drift_rule.read_series(query.store, query.run.pipeline, query.run.version,
                                       exclude_run_id=query.run.run_id, before=query.before,
                                       max_runs=rules.max_runs, keep_first=rules.start_nights,
                                       exclude=query.exclude)
        return FamilyRead(found.series, found.note, found.skipped)

    def detect(self, tonight: Tonight, history: History, rules: Rules) -> pd.DataFrame:
        """The drift table of the night; empty when drift is off or the run is not
        comparable (``rules.drift``)."""
        if not rules.drift.enabled or tonight.failed or tonight.incomplete:
            return self.empty()
        latest = tonight.summary.assign(run_id=tonight.run.run_id, started=tonight.started)
        read = history.reads.get(self.name)
        series = read.data if read is not None else drift_rule.empty_series()
        series = pd.concat([series, latest], ignore_index=True) if not series.empty \
            else latest
        return drift_rule.detect_drift(series, rules, judged_run=tonight.run.run_id)

    def merge(self, verdicts: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
        return drift_rule.merge_drift(verdicts, rows)

    def flagged(self, rows: pd.DataFrame) -> pd.DataFrame:
        return drift_rule.drifted(rows)

    def failing(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The drifting rows past the one-night threshold: those that may fail the run."""
        return drift_rule.drifted(rows, failing_only=True)

    def message_rows(self, rows: pd.DataFrame, rule: RegressionRule, *, partial: bool
                     ) -> pd.DataFrame:
        return self.failing(rows) if partial else self.flagged(rows)

    def key(self, row: Any) -> Key:
        return (str(row.stage), str(row.prefix), "drift")

    def stored_signals(self, rows: pd.DataFrame, rule: RegressionRule) -> list[SignalRow]:
        """The failing drift rows (a drift short of the threshold is no signal)."""
        return [{"stage": str(r.stage), "prefix": str(r.prefix), "metric": "drift",
                 "verdict": "drift", "ratio": finite_number(r.cumulative_ratio),
                 "alert": "regression"} for r in self.failing(rows).itertuples(index=False)]

    def describe(self, rows: pd.DataFrame) -> str:
        return drift_rule.describe_drift(rows)

    def manifest(self, rows: pd.DataFrame, judged: Judged) -> dict[str, Any] | None:
        doc: DriftFlags = {"note": judged.notes.get(self.name, ""),
                           "failing": _names(self.failing(rows)),
                           "drifting": _names(self.flagged(rows))}
        return dict(doc)

    def markdown(self, part: Any, judged: Judged | None) -> list[str]:
        """The flagged prefixes' recent nights (regressed or drifting), when judged here."""
        if judged is None:
            return []
        return drift_rule.flagged_markdown(judged.verdicts, self.rows(judged))

    def stored(self, rows: pd.DataFrame, judged: Judged) -> pd.DataFrame | None:
        return rows.drop(columns="series", errors="ignore")

    def json_rows(self, rows: pd.DataFrame) -> list[dict[str, Any]]:
        return rows.drop(columns="series", errors="ignore").to_dict(orient="records")


def _names(rows: pd.DataFrame) -> list[str]:
    return [f"{r.stage}/{r.prefix}" for r in rows.itertuples(index=False)]


REGISTRY.register(DriftFamily())
