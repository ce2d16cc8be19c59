"""The judgement of one run, made in one place.

A night is judged once, here, from three inputs: the run itself (:class:`Tonight`), its
history (:class:`History`: the healthy baseline runs of the same pipeline version, the series
since the baseline start, the baseline runs' manifests) and the rules (:class:`~.rule.Rules`).
The result, a :class:`Judgement`, holds everything a reader needs — the per-prefix verdicts
with drift merged in, the drift table, the run's outcome (does it fail, and why), and the
explanations of regressed stages — and the rules that made it, which are stored in the run's
manifest so that ``dask-profiling check`` re-judges a stored run exactly as it was judged.

Who uses it:

* :func:`~prefect_dask_profiling.run.pipeline.finish_run` (the end of every run) calls
  :func:`load_history` then :func:`judge`;
* ``dask-profiling check`` and ``dask-profiling drift`` call :func:`judge_stored`;
* the artifacts, the events and the exports read the :class:`Judgement` (or what it stored).

Nothing else calls the one-night rule (:mod:`.verdict`) or the drift rule (:mod:`.drift`):
``tests/test_architecture.py`` enforces it. :func:`judge` is pure (tables in, a judgement
out); the two loaders are the only I/O.

A history that cannot be listed, or a store that does not answer for a night of it, raises
:class:`~.baseline.HistoryUnavailable`: the caller stores the run ``unjudged`` with the
reason. It is never judged against "no history", which would call it healthy and let it
into later baselines. A stored night that is damaged or gone is left out of every family
and named (``skipped`` in the manifest): it never stops the judgement of later nights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypedDict, cast

import pandas as pd

from prefect_dask_profiling._util import InvalidInput, finite_number
from prefect_dask_profiling.regression import drift as drift_rule
from prefect_dask_profiling.regression.alert_history import (
    SkippedNight,
    damaged,
    load_acks,
    read_nights,
)
from prefect_dask_profiling.regression.alerts import (
    METRIC,
    Ack,
    AlertEvent,
    AlertEventDoc,
    Book,
    CarriedDoc,
    Key,
    Night,
    Signal,
    SignalRow,
    advance,
    failing,
    priors,
    replay,
    silenced,
)
from prefect_dask_profiling.regression.baseline import (
    Baseline,
    HistoryUnavailable,
    read_baseline,
    restart_of,
)
from prefect_dask_profiling.regression.confirm import (
    confirm_signals,
    confirm_verdicts,
    metric_threshold,
    noise_reach,
)
from prefect_dask_profiling.regression.cost import (
    COST_VERDICT_COLUMNS,
    CostVerdict,
    cost_flagged,
    describe_cost,
    detect_idle,
)
from prefect_dask_profiling.regression.explain import Explanation, explain_verdicts
from prefect_dask_profiling.regression.memory import (
    MEMORY_VERDICT_COLUMNS,
    MemoryVerdict,
    describe_memory,
    detect_memory,
    history_from_manifests,
    latest_from_manifest,
)
from prefect_dask_profiling.regression.requests import (
    REQUEST_VERDICT_COLUMNS,
    describe_requests,
    detect_requests,
    request_rows,
)
from prefect_dask_profiling.regression.rule import RegressionRule, Rules
from prefect_dask_profiling.regression.stats import MetricVerdict
from prefect_dask_profiling.regression.verdict import (
    PrefixVerdict,
    describe,
    detect_regressions,
    regressed,
    run_outcome,
)
from prefect_dask_profiling.store.runs import RunStore, StoreError

__all__ = ["History", "HistoryUnavailable", "Judgement", "Outcome", "StoredJudgement",
           "Tonight", "judge", "judge_stored", "load_history"]

# Stored statuses whose regressions do not count: the run stopped early or never finished.
NOT_COMPARABLE = {"failed": "failed", "incomplete": "incomplete"}
# Memory verdicts that fail the run (under the same on_regression switch as time).
MEMORY_FAILS = ("memory-regression", "near-oom")


class OutcomeDoc(TypedDict):
    """An :class:`Outcome` as stored (the manifest's ``outcome``): failing keys as
    ``stage/prefix/metric``, events as :meth:`AlertEvent.to_json`."""

    regressed: bool
    reason: str
    message: str
    suspected: bool
    acknowledged: bool
    episodes: list[str]
    failing: list[str]
    events: list[AlertEventDoc]


class DriftFlags(TypedDict):
    """The manifest's ``drift``: the series note and the drifting ``stage/prefix`` names
    (``failing``: those that fail the run)."""

    note: str
    failing: list[str]
    drifting: list[str]


class Flagged(TypedDict):
    """The manifest's ``memory`` and ``requests``: one line per flagged stage and metric."""

    flagged: list[str]


class CostFlags(Flagged):
    """The manifest's ``cost``: flagged idle texts, the ``cost_regression`` mode and the
    failing ``stage/metric`` names."""

    mode: str
    failing: list[str]


class JudgementManifest(TypedDict):
    """The judgement's part of a run's manifest (:meth:`Judgement.to_manifest`)."""

    rules: dict[str, Any]  # Rules.to_dict
    outcome: OutcomeDoc
    signals: list[SignalRow]
    carried: CarriedDoc
    drift: DriftFlags
    memory: Flagged
    requests: Flagged
    cost: CostFlags
    explanations: dict[str, Explanation]
    skipped: list[dict[str, str]]  # SkippedNight.to_json


class JudgedBaseline(TypedDict):
    """The runs a judgement compared with, and the note on them."""

    runs: list[str]
    note: str


class JudgementDoc(JudgementManifest):
    """``dask-profiling check --json`` (:meth:`Judgement.to_json`): the manifest part, the
    run, and each verdict table's rows as records (the confirmed tables, per prefix,
    memory and requests, also carry :data:`~.confirm.ALERT_COLUMNS`)."""

    run_id: str
    pipeline: str
    version: str
    regressed: bool
    baseline: JudgedBaseline
    verdicts: list[PrefixVerdict]
    memory_verdicts: list[MemoryVerdict]
    request_verdicts: list[MetricVerdict]
    cost_verdicts: list[CostVerdict]
    drift_verdicts: list[drift_rule.DriftVerdict]


class StoredJudgementDoc(TypedDict):
    """:meth:`StoredJudgement.to_json`: what the run stored beside the judgement made now;
    when one was made, every key of its :class:`JudgementDoc` comes first."""

    run_id: str | None
    pipeline: str | None
    version: str | None
    regressed: bool
    status: str
    stored_regressed: bool
    unjudged_reason: str | None
    error: str | None
    agrees: bool
    failing: bool


@dataclass(frozen=True)
class Tonight:
    """The run being judged.

    Attributes
    ----------
    run_id, pipeline, version
        Its identity.
    summary
        Its per-prefix table (``tasks.csv``: ``stage, prefix, tasks, total_s``, ...).
    started
        ISO start time (orders the drift series; the judged run is last whatever it says).
    failed
        The flow failed: its flagged prefixes do not count (its times are partial).
    incomplete
        Its record is incomplete (the final collection failed): the same.
    context
        What the explanations compare with the baseline runs' manifests: ``version``,
        ``source_hash``, ``workers``, ``threads``, ``environment``, ``stages`` (with their
        ``diagnosis``) — the run's manifest, or the same fields before it is written.
    """

    run_id: str
    pipeline: str
    version: str
    summary: pd.DataFrame
    started: str | None = None
    failed: bool = False
    incomplete: bool = False
    context: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], summary: pd.DataFrame) -> Tonight:
        """A stored run as it was judged: failed and incomplete runs stay so."""
        status = str(manifest.get("status") or "")
        return cls(run_id=str(manifest["run_id"]), pipeline=str(manifest["pipeline"]),
                   version=str(manifest["version"]), summary=summary,
                   started=manifest.get("started"), failed=status == "failed",
                   incomplete=status == "incomplete", context=manifest)


@dataclass(frozen=True)
class History:
    """What a run is judged against: loaded by :func:`load_history`.

    Attributes
    ----------
    baseline
        The healthy baseline runs of the same version (:func:`~.baseline.load_baseline`).
    series
        Every comparable night since the baseline start, ``run_id, started, stage, prefix,
        tasks, total_s`` (:func:`~.drift.load_series`); empty when drift is switched off.
    series_note
        Where the series starts.
    manifests
        The manifests of the time baseline's nights (for explanations).
    alerts
        The state after the nights before tonight (:func:`~.alerts.replay`: episodes and
        each night's standing, derived from the stored nights, nothing kept aside).
    acks
        The acknowledgements of the pipeline version.
    warnings
        What could not be read and was not needed.
    memory_manifests, request_manifests, cost_manifests
        The manifests of the nights whose standing counts in the memory, the requests and
        the cost (idle) baseline (a night flagged in time only still counts there).
    skipped
        The stored nights left out because they cannot be read (damaged or gone): every
        family is judged without them, and the judged night names them.
    """

    baseline: Baseline
    series: pd.DataFrame
    series_note: str = ""
    manifests: tuple[Mapping[str, Any], ...] = ()
    alerts: Book = field(default_factory=Book)
    acks: tuple[Ack, ...] = ()
    warnings: tuple[str, ...] = ()
    memory_manifests: tuple[Mapping[str, Any], ...] = ()
    request_manifests: tuple[Mapping[str, Any], ...] = ()
    cost_manifests: tuple[Mapping[str, Any], ...] = ()
    skipped: tuple[SkippedNight, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What the judgement means for the run as a whole.

    Attributes
    ----------
    regressed
        The run counts as regressed: a prefix regressed on this night or drifted past the
        threshold, and the run neither failed nor is incomplete. Only such a run fails a
        flow (``on_regression="fail"``) or makes ``dask-profiling check`` exit 1.
    reason
        Why flagged prefixes do not count (the run failed or is incomplete); empty otherwise.
    message
        One line naming what regressed and drifted (the failure message of the flow).
    suspected
        Prefixes flagged tonight wait for the next run to confirm them (the run does not
        fail; it is stored ``suspected`` and kept out of baselines).
    events
        What happened to alert episodes tonight (suspected, detected, cleared, resolved),
        each with a stable id.
    episodes
        The ids of the episodes that fail the run (in the order of ``failing``).
    failing
        The keys ``(stage, prefix, metric)`` that fail the run (``prefix`` is ``""`` for
        per-stage metrics): the rows to report as detected.
    acknowledged
        Only acknowledged episodes would have failed the run: it is stored
        ``acknowledged``, told apart from a healthy night (and kept out of the baselines of
        those episodes' families, as their flagged nights are).
    """

    regressed: bool
    reason: str = ""
    message: str = "no regression"
    suspected: bool = False
    events: tuple[AlertEvent, ...] = ()
    episodes: tuple[str, ...] = ()
    failing: tuple[Key, ...] = ()
    acknowledged: bool = False

    def episode_of(self, stage: str, prefix: str, metric: str) -> str | None:
        """The id of the episode that fails the run at this key (``None``: it does not)."""
        key = (stage, prefix, metric)
        return self.episodes[self.failing.index(key)] if key in self.failing else None


@dataclass(frozen=True)
class Judgement:
    """The one judgement of a run.

    Attributes
    ----------
    run_id, pipeline, version
        Whose judgement.
    rules
        The rules that made it (stored in the manifest: ``rules``).
    verdicts
        One row per (stage, prefix), ``verdict.OUTPUT_COLUMNS``: the one-night verdict, with
        ``drift`` where a prefix drifted (a one-night ``regression`` keeps its verdict).
    drift
        The drift table (``drift.DRIFT_COLUMNS``); empty when drift was not judged.
    outcome
        The run's outcome.
    memory
        Memory verdicts per stage and metric (``memory.MEMORY_VERDICT_COLUMNS``):
        ``memory-regression`` (peak or spilled bytes against the baseline runs' manifests)
        and ``near-oom`` (headroom under 10%, no history needed).
    requests
        Storage-request verdicts per stage and metric (``requests.REQUEST_VERDICT_COLUMNS``):
        ``request-regression`` when requests or bytes per chunk doubled.
    cost
        Idle verdicts per stage (``cost.COST_VERDICT_COLUMNS`` and ``alert``,
        ``alert_reason``): ``idle-regression`` when a stage's idle worker-hours grew against
        the baseline runs' manifests. Under ``cost_regression="warn"`` informational (never
        in the outcome; ``alert`` is empty); under ``"fail"`` confirmed like storage
        requests, and a confirmed one fails the run.
    explanations
        Per regressed stage: how its bottleneck and the run's context changed since the
        baseline runs (:func:`~.explain.explain_verdicts`).
    baseline_runs, baseline_note, series_note
        Which runs the night was compared with, and notes on them.
    carried
        The state the judgement started from (the history's :class:`~.alerts.Book`),
        stored with the night: a later replay whose window begins here starts from it.
    skipped
        The stored nights its history left out because they cannot be read (the
        manifest's ``skipped``).
    """

    run_id: str
    pipeline: str
    version: str
    rules: Rules
    verdicts: pd.DataFrame
    drift: pd.DataFrame
    outcome: Outcome
    memory: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=MEMORY_VERDICT_COLUMNS))
    requests: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=REQUEST_VERDICT_COLUMNS))
    cost: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=COST_VERDICT_COLUMNS))
    explanations: dict[str, Explanation] = field(default_factory=dict)
    baseline_runs: tuple[str, ...] = ()
    baseline_note: str = ""
    series_note: str = ""
    carried: Book = field(default_factory=Book)
    skipped: tuple[SkippedNight, ...] = ()

    @property
    def regressed(self) -> bool:
        """Shorthand for ``outcome.regressed``."""
        return self.outcome.regressed

    def flagged(self) -> pd.DataFrame:
        """The verdict rows that regressed or drifted."""
        return drift_rule.flagged(self.verdicts)

    def regressions(self) -> pd.DataFrame:
        """The rows the one-night rule calls ``regression``."""
        return regressed(self.verdicts)

    def drifting(self, failing_only: bool = False) -> pd.DataFrame:
        """The drift rows (that fail the run, if asked)."""
        return drift_rule.drifted(self.drift, failing_only=failing_only)

    def memory_flagged(self) -> pd.DataFrame:
        """The memory rows that are ``memory-regression`` or ``near-oom``."""
        return self.memory[self.memory["verdict"].isin(MEMORY_FAILS)]

    def requests_flagged(self) -> pd.DataFrame:
        """The storage-request rows that are ``request-regression``."""
        return self.requests[self.requests["verdict"] == "request-regression"]

    def cost_flagged(self) -> pd.DataFrame:
        """The idle rows that are ``idle-regression`` (failing or not)."""
        if self.cost.empty:
            return self.cost
        return self.cost[self.cost["verdict"] == "idle-regression"]

    def failing_rows(self, kind: str) -> pd.DataFrame:
        """The rows of one table that fail the run: ``kind`` is ``time``, ``drift``,
        ``memory``, ``requests`` or ``cost``. An acknowledged episode's rows, a suspicion and a
        chronic near-OOM after its first night are flagged but do not fail."""
        failing = set(self.outcome.failing)
        if kind == "time":
            rows, keys = self.regressions(), lambda r: (r.stage, r.prefix, METRIC)
        elif kind == "drift":
            rows, keys = self.drifting(), lambda r: (r.stage, r.prefix, "drift")
        elif kind in ("memory", "requests", "cost"):
            rows = {"memory": self.memory_flagged, "requests": self.requests_flagged,
                    "cost": self.cost_flagged}[kind]()
            keys = lambda r: (r.stage, "", r.metric)  # noqa: E731
        else:
            raise InvalidInput(f"kind must be time, drift, memory, requests or cost, got "
                               f"{kind!r}")
        if rows.empty:
            return rows
        mask = [tuple(map(str, keys(r))) in failing for r in rows.itertuples(index=False)]
        return rows[mask].reset_index(drop=True)

    def to_json(self) -> JudgementDoc:
        """Plain JSON form (``dask-profiling check --json``)."""
        return {**self.to_manifest(),
                "run_id": self.run_id, "pipeline": self.pipeline, "version": self.version,
                "regressed": self.outcome.regressed,
                "baseline": {"runs": list(self.baseline_runs), "note": self.baseline_note},
                "verdicts": self.verdicts.to_dict(orient="records"),
                "memory_verdicts": self.memory.to_dict(orient="records"),
                "request_verdicts": self.requests.to_dict(orient="records"),
                "cost_verdicts": self.cost.to_dict(orient="records"),
                "drift_verdicts": self.drift.drop(columns="series", errors="ignore")
                .to_dict(orient="records")}

    def to_manifest(self) -> JudgementManifest:
        """The judgement's part of the stored manifest."""
        return {
            "rules": self.rules.to_dict(),
            "outcome": {"regressed": self.outcome.regressed, "reason": self.outcome.reason,
                        "message": self.outcome.message, "suspected": self.outcome.suspected,
                        "acknowledged": self.outcome.acknowledged,
                        "episodes": list(self.outcome.episodes),
                        "failing": ["/".join(k) for k in self.outcome.failing],
                        "events": [e.to_json() for e in self.outcome.events]},
            "signals": signal_rows(self.drift, self.memory, self.requests,
                                   _judged_cost(self.cost, self.rules.regression)),
            "carried": self.carried.carried(),
            "drift": {"note": self.series_note,
                      "failing": _names(self.drifting(failing_only=True)),
                      "drifting": _names(self.drifting())},
            "memory": {"flagged": [f"{r.stage}/{r.metric}: {r.verdict}" for r in
                                   self.memory_flagged().itertuples(index=False)]},
            "requests": {"flagged": [f"{r.stage}/{r.metric}: {r.ratio:.2f}x" for r in
                                     self.requests_flagged().itertuples(index=False)]},
            "cost": {"flagged": cost_flagged(self.cost),
                     "mode": self.rules.regression.cost_regression,
                     "failing": [f"{r.stage}/{r.metric}" for r in
                                 self.failing_rows("cost").itertuples(index=False)]},
            "explanations": self.explanations,
            "skipped": [night.to_json() for night in self.skipped],
        }


def load_history(store: RunStore, pipeline: str, version: str, rules: Rules, *,
                 run_id: str, before: str | None = None, started: str | None = None,
                 flow_run_id: str | None = None, attempt: int | None = None,
                 acks_until: str | None = None) -> History:
    """Read what ``run_id`` is judged against: one replay of the nights before it.

    Parameters
    ----------
    store
        Where the runs are (wrap the call in ``store.remembering_reads()`` to read each
        stored file once).
    pipeline, version
        The run's pipeline and version: only runs of the same version count.
    rules
        How many baseline runs (``rules.regression.history``) and series nights
        (``rules.drift.max_runs``) to read.
    run_id
        The judged run: never part of its own history.
    before
        Only runs with a smaller run id are listed (re-judging a stored run).
    started
        The judged run's start (ISO): only nights that ended by then are its history; a
        night that ended after it overlaps it and is not, whichever finished first.
    flow_run_id, attempt
        The judged run's flow run and attempt: its other attempts are not its history.
    acks_until
        Only acknowledgements made up to this ISO time count (a stored run is judged again
        with the acknowledgements it was judged with, not later ones).

    Notes
    -----
    One read of the history serves every family: the replay's nights
    (:func:`~.alert_history.read_nights`), the time baseline's tables, the drift series and
    the memory, request and idle baselines' manifests all leave out the same nights, those
    that cannot be read (:attr:`History.skipped`, named in :attr:`History.warnings` and the
    baseline's note). A damaged night costs at most itself; nights older than the accepted
    run are not read at all.

    Raises
    ------
    HistoryUnavailable
        When the history cannot be listed, or the store does not answer for a night it
        needs (``StoreUnavailable``): the run is then stored ``unjudged``, naming the cause.
    """
    try:
        restart = restart_of(store.accepted(pipeline, version), before)
        acks = tuple(a for a in load_acks(store, pipeline, version)
                     if acks_until is None or not a.at or a.at <= acks_until)
    except StoreError as exc:
        raise HistoryUnavailable(f"the history of {pipeline} {version} could not be "
                                 f"listed: {exc}") from exc
    found = read_nights(store, pipeline, version, before=before, started=started,
                        flow_run_id=flow_run_id, attempt=attempt, since=restart)
    book, _ = replay([n for n in found.nights if n.run_id != run_id], acks, restart=restart)
    skipped = {night.run_id: night for night in found.skipped}
    while True:  # until every family leaves out the same nights (the reads are remembered)
        families = _read_families(store, pipeline, version, rules, book, run_id=run_id,
                                  before=before, exclude=frozenset(skipped))
        new = {s.run_id: s for s in families.skipped if s.run_id not in skipped}
        if not new:
            break
        skipped.update(new)
    left_out = tuple(skipped[r] for r in sorted(skipped))
    baseline = families.baseline
    elsewhere = [s.run_id for s in left_out if s.run_id not in dict(baseline.skipped)]
    if elsewhere:  # the baseline's note names the nights it left out itself
        named = f"left out unreadable night(s) {', '.join(elsewhere)}"
        baseline.note = "; ".join(p for p in (baseline.note, named) if p)
    return History(baseline, families.series, families.note, families.of("time"), book,
                   acks, (*[s.line() for s in left_out], *found.notes),
                   memory_manifests=families.of("memory"),
                   request_manifests=families.of("requests"), cost_manifests=families.of("cost"),
                   skipped=left_out)


@dataclass(frozen=True)
class _Families:
    """What every family reads of one replayed history, leaving out the same nights."""

    baseline: Baseline
    series: pd.DataFrame
    note: str
    manifests: dict[str, tuple[Mapping[str, Any], ...]]
    skipped: tuple[SkippedNight, ...]

    def of(self, family: str) -> tuple[Mapping[str, Any], ...]:
        return self.manifests[family]


def _read_families(store: RunStore, pipeline: str, version: str, rules: Rules, book: Book,
                   *, run_id: str, before: str | None, exclude: frozenset[str]) -> _Families:
    """The time baseline's tables, the drift series and each family's baseline manifests,
    all without the nights in ``exclude``; the nights found unreadable on the way.

    Raises
    ------
    HistoryUnavailable
        When the store does not answer for one of them (:func:`~.alert_history.damaged`).
    """
    if rules.drift.enabled:
        series = drift_rule.read_series(store, pipeline, version, exclude_run_id=run_id,
                                        before=before, max_runs=rules.drift.max_runs,
                                        keep_first=rules.drift.start_nights, exclude=exclude)
    else:
        series = drift_rule.SeriesRead(drift_rule.empty_series(), "drift is switched off")
    n = rules.regression.history
    baseline = read_baseline(store, pipeline, version, book, n, "time", exclude=exclude)
    skipped = [*series.skipped, *(SkippedNight(r, why) for r, why in baseline.skipped)]
    sizes = {"time": n, "memory": rules.regression.memory_history, "requests": n, "cost": n}
    left_out = exclude | {s.run_id for s in skipped}
    manifests = {}
    for family, k in sizes.items():
        candidates = [r for r in book.baseline_runs(family) if r not in left_out]
        if family == "time":
            candidates = [r for r in candidates if r in baseline.runs]
        docs, bad = _manifests(store, pipeline, candidates, k)
        skipped += bad
        left_out |= {s.run_id for s in bad}
        manifests[family] = tuple(docs[r] for r in sorted(docs))
    return _Families(baseline, series.series, series.note, manifests, tuple(skipped))


def _manifests(store: RunStore, pipeline: str, candidates: list[str], k: int
               ) -> tuple[dict[str, Mapping[str, Any]], list[SkippedNight]]:
    """The manifests of the newest ``k`` readable runs of ``candidates`` (newest first),
    and the runs left out on the way because theirs is damaged or gone."""
    docs: dict[str, Mapping[str, Any]] = {}
    skipped: list[SkippedNight] = []
    while candidates and len(docs) < k:
        batch, candidates = candidates[:k - len(docs)], candidates[k - len(docs):]
        found = store.read_manifests(pipeline, batch)
        for run in batch:
            bad = damaged(found.get(run), run, "its manifest")
            if bad is None:
                docs[run] = found[run]
            else:
                skipped.append(bad)
    return docs, skipped


def judge(tonight: Tonight, history: History, rules: Rules | None = None) -> Judgement:
    """Judge one night against its history (pure: no I/O).

    Parameters
    ----------
    tonight
        The run.
    history
        Its history (:func:`load_history`).
    rules
        The rules; default :class:`~.rule.Rules` ().

    Returns
    -------
    Judgement
    """
    rules = rules if rules is not None else Rules()
    if not isinstance(rules, Rules):
        raise InvalidInput(f"rules must be a Rules, got {type(rules).__name__}")
    one_night = detect_regressions(history.baseline.history, tonight.summary,
                                   rule=rules.regression)
    one_night = confirm_verdicts(one_night, priors(history.alerts), rules.regression,
                                 noise_reach(history.baseline.history))
    drift = _drift(tonight, history, rules)
    verdicts = drift_rule.merge_drift(one_night, drift)
    memory = detect_memory(history_from_manifests(history.memory_manifests),
                           latest_from_manifest(dict(tonight.context)), rules.regression)
    memory = _confirm_stage_rows(memory, history.alerts, rules.regression, MEMORY_POLICY)
    requests = detect_requests(request_rows(history.request_manifests),
                               request_rows([dict(tonight.context)]), rules.regression)
    requests = _confirm_stage_rows(requests, history.alerts, rules.regression,
                                   REQUEST_POLICY)
    cost = detect_idle(history.cost_manifests, tonight.context, rules.regression)
    if rules.regression.cost_regression == "fail":
        cost = _confirm_stage_rows(cost, history.alerts, rules.regression, COST_POLICY)
    else:  # informational: no confirmation, no episode, never in the outcome
        cost = cost.assign(alert="", alert_reason=[
            "informational (cost_regression='warn')" if v == "idle-regression" else ""
            for v in cost["verdict"]])
    outcome = _outcome(tonight, one_night, drift, memory, requests,
                       _judged_cost(cost, rules.regression), history, rules)
    explanations = explain_verdicts(one_night, tonight.context, list(history.manifests)) \
        if not regressed(one_night).empty else {}
    return Judgement(run_id=tonight.run_id, pipeline=tonight.pipeline, version=tonight.version,
                     rules=rules, verdicts=verdicts, drift=drift, outcome=outcome,
                     memory=memory, requests=requests, cost=cost,
                     explanations=explanations, baseline_runs=tuple(history.baseline.runs),
                     baseline_note=history.baseline.note, series_note=history.series_note,
                     carried=history.alerts, skipped=history.skipped)


@dataclass(frozen=True)
class StoredJudgement:
    """A stored run judged again (``dask-profiling check``), beside what it stored.

    Attributes
    ----------
    judgement
        The judgement made now, with the rules the run was judged with unless overridden;
        ``None`` when the run's history can no longer be read (``error`` says why).
    manifest
        The run's stored manifest.
    error
        Why no judgement could be made now.
    """

    judgement: Judgement | None
    manifest: Mapping[str, Any]
    error: str | None = None

    @property
    def status(self) -> str:
        """The stored status (``healthy``, ``regressed``, ``failed``, ``unjudged``...)."""
        return str(self.manifest.get("status") or "unjudged")

    @property
    def unjudged(self) -> bool:
        """The run was stored without a verdict: someone should look at why."""
        return self.status == "unjudged"

    @property
    def failing(self) -> bool:
        """``check`` exits non-zero: the run regressed, was stored unjudged, or cannot be
        judged now."""
        return self.unjudged or self.judgement is None or self.judgement.regressed

    @property
    def agrees(self) -> bool:
        """The judgement made now has the outcome the run stored."""
        if self.judgement is None or self.unjudged:
            return False
        return self.judgement.regressed == bool(self.manifest.get("regressed"))


    def to_json(self) -> StoredJudgementDoc:
        """Plain JSON form: the judgement made now beside what the run stored."""
        judged: Mapping[str, object] = {} if self.judgement is None else self.judgement.to_json()
        return cast(StoredJudgementDoc, {**judged, "run_id": self.manifest.get("run_id"),
                "pipeline": self.manifest.get("pipeline"),
                "version": self.manifest.get("version"),
                "regressed": self.judgement is not None and self.judgement.regressed,
                "status": self.status, "stored_regressed": bool(self.manifest.get("regressed")),
                "unjudged_reason": self.manifest.get("unjudged_reason"),
                "error": self.error, "agrees": self.agrees, "failing": self.failing})


def judge_stored(store: RunStore, pipeline: str, run_id: str | None = None,
                 version: str | None = None, rules: Rules | None = None,
                 overrides: Mapping[str, Any] | None = None) -> StoredJudgement:
    """Judge a stored run again, against the runs that preceded it.

    Parameters
    ----------
    store, pipeline
        Where the run is.
    run_id
        The run; default the newest one (of ``version`` if given).
    version
        Only runs of this version (and the run must be of it).
    rules
        The rules; default the ones stored in the run's manifest (:class:`~.rule.Rules` ()
        for runs stored before rules were).
    overrides
        Single regression settings to change in those rules (``threshold``, ``history``,
        ``min_seconds``...), e.g. from the command line.

    Raises
    ------
    StoreError
        When the run, its manifest or its table cannot be read.
    InvalidInput
        For stored or overriding rules that are not valid.
    """
    with store.remembering_reads():  # manifests and listings are read more than once
        if run_id is None:
            runs = store.list_runs(pipeline, version)
            if not runs:
                what = f"pipeline {pipeline!r}" + (f" version {version!r}" if version else "")
                raise StoreError(f"no runs of {what} in {store.url}")
            run_id = runs[0]["run_id"]
        manifest = store.read_manifest(pipeline, run_id)
        if version is not None and version != manifest["version"]:
            raise StoreError(f"run {run_id} is version {manifest['version']!r}, "
                             f"not {version!r}")
        rules = _stored_rules(manifest, rules, overrides)
        tonight = Tonight.from_manifest(manifest, store.read_table(pipeline, run_id, "tasks"))
        try:
            history = load_history(store, pipeline, tonight.version, rules, run_id=run_id,
                                   before=run_id, started=manifest.get("started"),
                                   flow_run_id=manifest.get("flow_run_id"),
                                   attempt=manifest.get("attempt"),
                                   acks_until=manifest.get("ended"))
        except HistoryUnavailable as exc:
            return StoredJudgement(None, manifest, str(exc))
        return StoredJudgement(judge(tonight, history, rules), manifest)


# ---------------------------------------------------------------------- internals
def _drift(tonight: Tonight, history: History, rules: Rules) -> pd.DataFrame:
    """The drift table of the night; empty when drift is off or the run is not comparable."""
    if not rules.drift.enabled or tonight.failed or tonight.incomplete:
        return pd.DataFrame(columns=drift_rule.DRIFT_COLUMNS)
    latest = tonight.summary.assign(run_id=tonight.run_id, started=tonight.started)
    series = pd.concat([history.series, latest], ignore_index=True) \
        if not history.series.empty else latest
    return drift_rule.detect_drift(series, rules, judged_run=tonight.run_id)


def _judged_cost(cost: pd.DataFrame, rule: RegressionRule) -> pd.DataFrame:
    """The idle rows that count in the outcome: all under ``cost_regression="fail"``,
    none otherwise (informational)."""
    return cost if rule.cost_regression == "fail" else cost.iloc[0:0]


def _outcome(tonight: Tonight, one_night: pd.DataFrame, drift: pd.DataFrame,
             memory: pd.DataFrame, requests: pd.DataFrame, cost: pd.DataFrame,
             history: History, rules: Rules) -> Outcome:
    """Does the run fail: what the state machine says tonight's signals do, if the run is
    comparable; what happened to the episodes tonight."""
    counted = run_outcome(one_night, failed=tonight.failed, incomplete=tonight.incomplete)
    if tonight.failed or tonight.incomplete:  # its times are partial: nothing it says counts
        why = "failed" if tonight.failed else "incomplete"
        return Outcome(regressed=False, reason=counted.reason or (
            f"the run is {why}: its verdicts do not count"), message=_message(
            regressed(one_night), drift_rule.drifted(drift, failing_only=True),
            memory[memory["verdict"].isin(MEMORY_FAILS)],
            requests[requests["verdict"] == "request-regression"],
            _idle_flagged(cost)))
    night = Night(tonight.run_id, tonight.pipeline, tonight.version,
                  night_signals(one_night, drift, memory, requests, cost), rules.regression,
                  started=tonight.started or "")
    book, events = advance(history.alerts, night, history.acks)
    fails = sorted(failing(book, night), key=lambda ep: ep.key)
    keys = tuple(ep.key for ep in fails)

    def kept(rows: pd.DataFrame, key) -> pd.DataFrame:
        if rows.empty:
            return rows
        return rows[[key(r) in keys for r in rows.itertuples(index=False)]]

    message = _message(
        kept(regressed(one_night), lambda r: (str(r.stage), str(r.prefix), METRIC)),
        kept(drift_rule.drifted(drift), lambda r: (str(r.stage), str(r.prefix), "drift")),
        kept(memory[memory["verdict"].isin(MEMORY_FAILS)],
             lambda r: (str(r.stage), "", str(r.metric))),
        kept(requests[requests["verdict"] == "request-regression"],
             lambda r: (str(r.stage), "", str(r.metric))),
        kept(_idle_flagged(cost), lambda r: (str(r.stage), "", str(r.metric))))
    suspected = any(sig.alert == "suspected" for sig in night.signals.values())
    return Outcome(regressed=bool(fails), message=message,
                   suspected=suspected and not fails, events=tuple(events),
                   episodes=tuple(ep.id for ep in fails), failing=keys,
                   acknowledged=bool(silenced(book, night)) and not fails)


# How the per-stage tables go through the lifecycle: (metric, verdicts that flag it, one
# night conclusive under confirm="auto").
MEMORY_POLICY = (("peak_bytes", ("memory-regression",), False),
                 ("spilled_bytes", ("memory-regression",), False),
                 ("headroom", ("near-oom",), True))
REQUEST_POLICY = (("requests_per_chunk", ("request-regression",), False),
                  ("bytes_per_chunk", ("request-regression",), False))
COST_POLICY = (("idle_hours", ("idle-regression",), False),)


def _confirm_stage_rows(rows: pd.DataFrame, book: Book, rule: RegressionRule,
                        policy: tuple[tuple[str, tuple[str, ...], bool], ...]
                        ) -> pd.DataFrame:
    """A per-stage verdict table with its ``alert`` column, metric by metric."""
    if rows.empty:
        return rows.assign(alert=pd.Series(dtype=str), alert_reason=pd.Series(dtype=str))
    parts = []
    for metric, flagged, conclusive in policy:
        part = rows[rows["metric"] == metric]
        if part.empty:
            continue
        prior = {(stage, metric): p for (stage, _), p in priors(book, metric).items()}
        parts.append(confirm_signals(part, prior, rule, flagged=flagged,
                                     conclusive=conclusive,
                                     threshold=metric_threshold(metric, rule)))
    return pd.concat(parts).loc[rows.index] if parts else rows.assign(alert="",
                                                                      alert_reason="")


def night_signals(one_night: pd.DataFrame, drift: pd.DataFrame, memory: pd.DataFrame,
                  requests: pd.DataFrame, cost: pd.DataFrame | None = None
                  ) -> dict[Key, Signal]:
    """Tonight's signals for the state machine, from the judgement's tables (``cost``: the
    idle rows that count, under ``cost_regression="fail"`` only)."""
    night = Night.from_tables("", "", "", one_night,
                              signal_rows(drift, memory, requests, cost))
    return dict(night.signals)


def signal_rows(drift: pd.DataFrame, memory: pd.DataFrame, requests: pd.DataFrame,
                cost: pd.DataFrame | None = None) -> list[SignalRow]:
    """The non-time signals of a night as stored in its manifest (``signals``): failing
    drift, every memory, storage-request and (judged) idle row with its confirmation
    decision."""
    out: list[SignalRow] = [{"stage": str(r.stage), "prefix": str(r.prefix), "metric": "drift",
            "verdict": "drift", "ratio": finite_number(r.cumulative_ratio), "alert": "regression"}
           for r in drift_rule.drifted(drift, failing_only=True).itertuples(index=False)]
    for table in (memory, requests, cost if cost is not None else memory.iloc[0:0]):
        if table.empty:
            continue
        alerts = table["alert"] if "alert" in table else pd.Series("", index=table.index)
        for r, alert in zip(table.itertuples(index=False), alerts, strict=True):
            out.append({"stage": str(r.stage), "prefix": "", "metric": str(r.metric),
                        "verdict": str(r.verdict), "ratio": finite_number(r.ratio),
                        "alert": str(alert or "")})
    return out




def _idle_flagged(cost: pd.DataFrame) -> pd.DataFrame:
    return cost[cost["verdict"] == "idle-regression"] if not cost.empty else cost


def _message(rows: pd.DataFrame, failing_drift: pd.DataFrame, memory_rows: pd.DataFrame,
             request_rows_: pd.DataFrame, cost_rows: pd.DataFrame | None = None) -> str:
    cost_rows = cost_rows if cost_rows is not None else pd.DataFrame()
    parts = ([describe(rows)] if not rows.empty else []) \
        + ([drift_rule.describe_drift(failing_drift)] if not failing_drift.empty else []) \
        + ([describe_memory(memory_rows)] if not memory_rows.empty else []) \
        + ([describe_requests(request_rows_)] if not request_rows_.empty else []) \
        + ([describe_cost(cost_rows)] if not cost_rows.empty else [])
    return "; ".join(parts) or "no regression"


def _stored_rules(manifest: Mapping[str, Any], rules: Rules | None,
                  overrides: Mapping[str, Any] | None) -> Rules:
    """The rules to re-judge with: given, else stored, else defaults; then the overrides."""
    if rules is None:
        stored = manifest.get("rules")
        rules = Rules.from_dict(stored) if stored is not None else Rules()
    if overrides:
        unknown = sorted(set(overrides) - {f.name for f in fields(RegressionRule)}, key=str)
        if unknown:
            raise InvalidInput(f"unknown regression setting(s) {unknown}")
        rules = Rules(replace(rules.regression, **dict(overrides)), rules.drift)
    return rules


def _names(rows: pd.DataFrame) -> list[str]:
    return [f"{r.stage}/{r.prefix}" for r in rows.itertuples(index=False)]

