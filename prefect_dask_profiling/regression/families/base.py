"""A verdict family, and the one registry of them.

A **family** judges one kind of evidence of a night — time per prefix, drift, memory,
storage requests, idle resources — against its history, and says everything the rest of
the package needs to know about it: its name, the metrics it signals to the state machine
(:mod:`..alerts`) with the baseline each counts in, how it reads its history, ``detect``
(tonight + history → verdict rows, confirmed), which rows flag and which may fail the run,
its lines in the outcome's message, the run's manifest, the run's markdown and the
warnings, its stored table and its event. The judge (:mod:`..judge`) names no family: it
loops over :data:`REGISTRY`, and so do the manifest, the stored tables, ``check``, the
run's markdown and the events.

In the spirit of a transport base class: :class:`Family` holds the defaults, one file per
family overrides what differs (:class:`StageFamily` for the per-stage ones, whose rows are
``stage, metric, verdict, ratio``). A new family is one file of the package ending with its
:meth:`Registry.register` call (or :meth:`Registry.registered` in a test).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pandas as pd

from prefect_dask_profiling._util import InvalidInput, finite_number
from prefect_dask_profiling.regression import alerts
from prefect_dask_profiling.regression.alerts import (
    Book,
    Key,
    Signal,
    SignalRow,
    priors,
    signals_from_tables,
)
from prefect_dask_profiling.regression.baseline import Baseline
from prefect_dask_profiling.regression.confirm import confirm_signals, metric_threshold
from prefect_dask_profiling.regression.explain import Explanation
from prefect_dask_profiling.regression.judged import FamilyRead, History, Outcome, Tonight
from prefect_dask_profiling.regression.rule import RegressionRule, Rules

if TYPE_CHECKING:
    from prefect_dask_profiling.store.manifest import RunKey
    from prefect_dask_profiling.store.runs import RunStore

__all__ = ["REGISTRY", "Family", "HistoryQuery", "Judged", "Registry", "StageFamily"]


@dataclass(frozen=True)
class HistoryQuery:
    """Which history a family reads (:meth:`Family.read`): of the judged ``run``'s pipeline
    and version in ``store``, its rules, the nights before ``before`` (re-judging a stored
    run), never ``run`` itself nor the nights in ``exclude`` (found unreadable so far)."""

    store: RunStore
    run: RunKey
    rules: Rules
    before: str | None
    exclude: frozenset[str]


class Judged(Protocol):
    """What a family reads of a made judgement (:class:`~..judge.Judgement`, read-only)."""

    @property
    def rules(self) -> Rules: ...

    @property
    def verdicts(self) -> pd.DataFrame: ...

    @property
    def outcome(self) -> Outcome: ...

    @property
    def notes(self) -> Mapping[str, str]: ...

    @property
    def tables(self) -> Mapping[str, pd.DataFrame]: ...


class Family:
    """One verdict family: the defaults; one subclass per family, one file each.

    Attributes
    ----------
    name
        Its name: the key of its rows in :attr:`~..judge.Judgement.tables` (and an
        attribute of the judgement), of its part of the manifest and of ``failing_rows``.
    metrics
        The metrics it signals to the state machine, each with the baseline family its
        flagged nights are kept out of (``None``: judged without a baseline).
    baseline
        The baseline family whose nights' manifests it reads (:meth:`history_size` of
        them); ``None``: it reads none.
    table
        The stored table of its rows (``<table>.csv``); ``None``: not stored.
    json_key
        The key of its rows in ``dask-profiling check --json``.
    event
        The Prefect event its failing rows are emitted under; ``None``: none.
    flags
        The verdicts that flag a row.
    settings
        The :class:`~..rule.RegressionRule` settings it reads (documentation, and what a
        test family may assert on).
    columns
        The columns of its (empty) table.
    """

    name: ClassVar[str] = ""
    metrics: ClassVar[Mapping[str, str | None]] = {}
    baseline: ClassVar[str | None] = None
    table: ClassVar[str | None] = None
    json_key: ClassVar[str] = ""
    event: ClassVar[str | None] = None
    flags: ClassVar[tuple[str, ...]] = ()
    settings: ClassVar[tuple[str, ...]] = ()
    columns: ClassVar[tuple[str, ...]] = ()
    # The event says ``fails`` by its rows' own ``fails`` column (not for every row).
    fails_by_row: ClassVar[bool] = False
    # Its table is stored even when empty.
    always_stored: ClassVar[bool] = False
    # The heading of its flagged lines in the run's markdown (``None``: not shown there).
    title: ClassVar[str | None] = None

    # ------------------------------------------------------------ history and detection
    def read(self, query: HistoryQuery) -> FamilyRead | None:
        """What it reads of the history besides its baseline's manifests, in the judge's
        one read (``None``, the default: nothing). A night it finds unreadable goes in the
        result's ``skipped``, and every family is then judged without it.

        Raises
        ------
        HistoryUnavailable
            When the store does not answer for a night it needs.
        """
        return None

    def history_size(self, rules: Rules) -> int:
        """How many baseline manifests it reads (0: none)."""
        return 0

    def candidates(self, runs: list[str], baseline: Baseline) -> list[str]:
        """The runs, newest first, whose manifests it may read (default all of ``runs``)."""
        return runs

    def detect(self, tonight: Tonight, history: History, rules: Rules) -> pd.DataFrame:
        """Tonight's verdict rows against ``history``, with the confirmation decision."""
        raise NotImplementedError

    def empty(self) -> pd.DataFrame:
        """Its table without rows."""
        return pd.DataFrame(columns=list(self.columns))

    def merge(self, verdicts: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
        """The run's per-prefix verdict table with its rows merged in (default unchanged)."""
        return verdicts

    def explain(self, rows: pd.DataFrame, tonight: Tonight, history: History
                ) -> dict[str, Explanation]:
        """Explanations per stage of what it flagged (default none)."""
        return {}

    def void_reason(self, rows: pd.DataFrame, tonight: Tonight) -> str:
        """Why its flagged rows do not count on a failed or incomplete run ("" : no word)."""
        return ""

    # ------------------------------------------------------------ rows and signals
    def rows(self, judged: Judged) -> pd.DataFrame:
        """Its rows in a made judgement."""
        return judged.tables.get(self.name, self.empty())

    def flagged(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The rows whose verdict flags (failing or not)."""
        return rows if rows.empty else rows[rows["verdict"].isin(self.flags)]

    def message_rows(self, rows: pd.DataFrame, rule: RegressionRule, *, partial: bool
                     ) -> pd.DataFrame:
        """The flagged rows the outcome's message may name (``partial``: of a run that
        failed or is incomplete, whose rows are named though they do not count)."""
        return self.flagged(rows)

    def key(self, row: Any) -> Key:
        """The state machine's key of a row: ``(stage, prefix, metric)``."""
        return (str(row.stage), "", str(row.metric))

    def stored_signals(self, rows: pd.DataFrame, rule: RegressionRule) -> list[SignalRow]:
        """Its rows as the manifest's ``signals`` keep them (every row, its decision)."""
        if rows.empty:
            return []
        alert = rows["alert"] if "alert" in rows else pd.Series("", index=rows.index)
        return [{"stage": str(r.stage), "prefix": "", "metric": str(r.metric),
                 "verdict": str(r.verdict), "ratio": finite_number(r.ratio),
                 "alert": str(a or "")}
                for r, a in zip(rows.itertuples(index=False), alert, strict=True)]

    def signals(self, rows: pd.DataFrame, rule: RegressionRule) -> dict[Key, Signal]:
        """Tonight's signals for the state machine."""
        return signals_from_tables(None, self.stored_signals(rows, rule))

    # ------------------------------------------------------------ what it says
    def describe(self, rows: pd.DataFrame) -> str:
        """One phrase naming the rows (a part of the outcome's message)."""
        return f"{self.name}: " + "; ".join(f"{k[0]} {k[2]}" for k in map(
            self.key, rows.itertuples(index=False)))

    def manifest(self, rows: pd.DataFrame, judged: Judged) -> dict[str, Any] | None:
        """Its part of the run's manifest (under :attr:`name`; ``None``: none)."""
        return {"flagged": [self.line(r) for r in self.flagged(rows).itertuples(index=False)]}

    def line(self, row: Any) -> str:
        """One flagged row in words (the manifest's ``flagged``)."""
        return f"{row.stage}/{row.metric}: {row.verdict}"

    def markdown(self, part: Mapping[str, Any], judged: Judged | None) -> list[str]:
        """Its lines of the run's markdown, from its stored manifest ``part`` (and the
        judgement, when the run was judged in this process); default: the flagged lines
        under :attr:`title` (none without a title)."""
        flagged = list(part.get("flagged") or [])
        if not flagged or self.title is None:
            return []
        return [f"**{self.title}:**", "", *[f"- {text}" for text in flagged]]

    def warnings(self, rows: pd.DataFrame, judged: Judged) -> list[str]:
        """Warnings of the run about its rows (default none)."""
        return []

    def stored(self, rows: pd.DataFrame, judged: Judged) -> pd.DataFrame | None:
        """The table to store as :attr:`table` (``None``: none tonight)."""
        if self.table is None or (rows.empty and not self.always_stored):
            return None
        return rows

    def json_rows(self, rows: pd.DataFrame) -> list[dict[str, Any]]:
        """Its rows in ``check --json``."""
        return rows.to_dict(orient="records")


class StageFamily(Family):
    """A per-stage family: rows ``stage, metric, verdict, ratio`` judged from the baseline
    runs' manifests, confirmed metric by metric through the lifecycle.

    Attributes
    ----------
    policy
        Per metric: (metric, the verdicts that flag it, one night conclusive under
        ``confirm="auto"``).
    """

    policy: ClassVar[tuple[tuple[str, tuple[str, ...], bool], ...]] = ()

    def judge_rows(self, manifests: tuple[Mapping[str, Any], ...],
                   tonight: Mapping[str, Any], rule: RegressionRule) -> pd.DataFrame:
        """Tonight's rows (``tonight``: the run's manifest or its fields) against the
        baseline runs' ``manifests``, before confirmation."""
        raise NotImplementedError

    def threshold(self, metric: str, rule: RegressionRule) -> float | None:
        """The ratio ``rule`` flags ``metric`` at (``None``: the rule's ``threshold``)."""
        return metric_threshold(metric, rule)

    def detect(self, tonight: Tonight, history: History, rules: Rules) -> pd.DataFrame:
        rows = self.judge_rows(history.manifests_of(self.baseline), tonight.context,
                               rules.regression)
        return self.confirm(rows, history.alerts, rules.regression)

    def confirm(self, rows: pd.DataFrame, book: Book, rule: RegressionRule) -> pd.DataFrame:
        """``rows`` with their ``alert`` column, metric by metric (:data:`policy`)."""
        if rows.empty:
            return rows.assign(alert=pd.Series(dtype=str), alert_reason=pd.Series(dtype=str))
        parts = []
        for metric, flagged, conclusive in self.policy:
            part = rows[rows["metric"] == metric]
            if part.empty:
                continue
            prior = {(stage, metric): p for (stage, _), p in priors(book, metric).items()}
            parts.append(confirm_signals(part, prior, rule, flagged=flagged,
                                         conclusive=conclusive,
                                         threshold=self.threshold(metric, rule)))
        if not parts:
            return rows.assign(alert="", alert_reason="")
        return pd.concat(parts).loc[rows.index]


class Registry:
    """The verdict families, in the order they are judged, described and stored.

    The first registered family is the run's primary one: its rows are the run's per-prefix
    verdict table (``verdicts``), which the others may :meth:`~Family.merge` into.
    Registering a family also tells the state machine its metrics (:data:`..alerts.FAMILIES`),
    so stored signals of them are replayed.
    """

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self._metrics: dict[str, tuple[str, ...]] = {}

    def register(self, family: Family) -> Family:
        """Add ``family`` (last); its name and metrics must be new, or mean the same."""
        if not family.name or family.name in self._families:
            raise InvalidInput(f"a verdict family needs a new name, got {family.name!r}")
        added = []
        for metric, baseline in family.metrics.items():
            if metric in alerts.FAMILIES and alerts.FAMILIES[metric] != baseline:
                raise InvalidInput(f"metric {metric!r} already counts in "
                                   f"{alerts.FAMILIES[metric]!r}, not {baseline!r}")
            if metric not in alerts.FAMILIES:
                alerts.FAMILIES[metric] = baseline
                added.append(metric)
        self._families[family.name] = family
        self._metrics[family.name] = tuple(added)
        return family

    def unregister(self, name: str) -> None:
        """Remove the family ``name`` and the metrics it added."""
        self._families.pop(name)
        for metric in self._metrics.pop(name, ()):
            alerts.FAMILIES.pop(metric, None)

    @contextlib.contextmanager
    def registered(self, family: Family) -> Iterator[Family]:
        """``family`` registered for the ``with`` block (a test's family), then removed."""
        self.register(family)
        try:
            yield family
        finally:
            self.unregister(family.name)

    @property
    def primary(self) -> Family:
        """The first family: its rows are the run's per-prefix verdicts."""
        return next(iter(self._families.values()))

    @property
    def flags(self) -> tuple[str, ...]:
        """Every verdict that flags, in any family."""
        return tuple(dict.fromkeys(v for f in self for v in f.flags))

    def __iter__(self) -> Iterator[Family]:
        return iter(tuple(self._families.values()))

    def __getitem__(self, name: str) -> Family:
        try:
            return self._families[name]
        except KeyError:
            raise InvalidInput(f"no verdict family {name!r}; known: "
                               f"{', '.join(self._families)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._families

    def names(self) -> tuple[str, ...]:
        """The families' names, in order."""
        return tuple(self._families)


# The one registry (its built-in families are registered by the package's ``__init__``).
REGISTRY = Registry()
