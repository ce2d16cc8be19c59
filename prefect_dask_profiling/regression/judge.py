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

The judge names no verdict family: it loops over the one registry
(:data:`~.families.REGISTRY`: time, drift, memory, storage requests, idle...), and each
family detects, confirms, describes and stores its own rows. Nothing but the judge and its
families calls the one-night rule (:mod:`.verdict`) or the drift rule (:mod:`.drift`):
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
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypedDict, cast

import pandas as pd

from prefect_dask_profiling._util import InvalidInput
from prefect_dask_profiling.regression.alert_history import (
    SkippedNight,
    damaged,
    load_acks,
    read_nights,
)
from prefect_dask_profiling.regression.alerts import (
    Book,
    CarriedDoc,
    Key,
    Night,
    Signal,
    SignalRow,
    advance,
    failing,
    replay,
    silenced,
)
from prefect_dask_profiling.regression.baseline import (
    Baseline,
    HistoryUnavailable,
    read_baseline,
    restart_of,
)
from prefect_dask_profiling.regression.explain import Explanation
from prefect_dask_profiling.regression.families import REGISTRY, Family
from prefect_dask_profiling.regression.families.base import HistoryQuery
from prefect_dask_profiling.regression.judged import (
    FamilyRead,
    History,
    Outcome,
    OutcomeDoc,
    Tonight,
)
from prefect_dask_profiling.regression.rule import RegressionRule, Rules
from prefect_dask_profiling.store.manifest import RunKey
from prefect_dask_profiling.store.runs import RunStore, StoreError

__all__ = ["History", "HistoryUnavailable", "Judgement", "Outcome", "StoredJudgement",
           "Tonight", "judge", "judge_stored", "load_history"]


class JudgementManifest(TypedDict):
    """The judgement's part of a run's manifest (:meth:`Judgement.to_manifest`); each
    family adds its own part under its name (:meth:`~.families.Family.manifest`:
    ``drift``, ``memory``, ``requests``, ``cost``...), before ``explanations``."""

    rules: dict[str, Any]  # Rules.to_dict
    outcome: OutcomeDoc
    signals: list[SignalRow]
    carried: CarriedDoc
    explanations: dict[str, Explanation]
    skipped: list[dict[str, str]]  # SkippedNight.to_json


class JudgedBaseline(TypedDict):
    """The runs a judgement compared with, and the note on them."""

    runs: list[str]
    note: str


class JudgementDoc(JudgementManifest):
    """``dask-profiling check --json`` (:meth:`Judgement.to_json`): the manifest part, the
    run, and each family's rows as records under its :attr:`~.families.Family.json_key`
    (``verdicts``, ``drift_verdicts``, ``memory_verdicts``, ``request_verdicts``,
    ``cost_verdicts``...; the confirmed tables also carry :data:`~.confirm.ALERT_COLUMNS`)."""

    run_id: str
    pipeline: str
    version: str
    regressed: bool
    baseline: JudgedBaseline
    verdicts: list[dict[str, Any]]


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
class Judgement:
    """The one judgement of a run.

    Attributes
    ----------
    run
        Whose judgement.
    rules
        The rules that made it (stored in the manifest: ``rules``).
    verdicts
        One row per (stage, prefix), ``verdict.OUTPUT_COLUMNS``: the primary family's
        (time's) verdicts with the other families' merged in (``drift`` where a prefix
        drifted; a one-night ``regression`` keeps its verdict).
    outcome
        The run's outcome.
    tables
        Each family's rows by its name (:data:`~.families.REGISTRY`), also read as
        attributes: ``judgement.drift``, ``judgement.memory``, ``judgement.requests``,
        ``judgement.cost`` (a family without rows here: its empty table).
    explanations
        Per regressed stage: how its bottleneck and the run's context changed since the
        baseline runs (:func:`~.explain.explain_verdicts`).
    baseline_runs, baseline_note
        Which runs the night was compared with, and a note on them.
    notes
        Per family that read history of its own (:meth:`~.families.Family.read`), a note on
        it (drift: where its series starts).
    carried
        The state the judgement started from (the history's :class:`~.alerts.Book`),
        stored with the night: a later replay whose window begins here starts from it.
    skipped
        The stored nights its history left out because they cannot be read (the
        manifest's ``skipped``).
    """

    run: RunKey
    rules: Rules
    verdicts: pd.DataFrame
    outcome: Outcome
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    explanations: dict[str, Explanation] = field(default_factory=dict)
    baseline_runs: tuple[str, ...] = ()
    baseline_note: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)
    carried: Book = field(default_factory=Book)
    skipped: tuple[SkippedNight, ...] = ()

    def __getattr__(self, name: str) -> pd.DataFrame:
        """A registered family's rows by its name (``judgement.memory``)."""
        if name.startswith("_") or name not in REGISTRY:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        return REGISTRY[name].rows(self)

    @property
    def regressed(self) -> bool:
        """Shorthand for ``outcome.regressed``."""
        return self.outcome.regressed

    def flagged(self) -> pd.DataFrame:
        """The per-prefix verdict rows that flag (regressed or drifted)."""
        return self.verdicts[self.verdicts["verdict"].isin(REGISTRY.flags)]

    def flagged_rows(self, family: str) -> pd.DataFrame:
        """The rows of ``family`` whose verdict flags, failing the run or not."""
        found = REGISTRY[family]
        return found.flagged(found.rows(self))

    def failing_rows(self, kind: str) -> pd.DataFrame:
        """The rows of family ``kind`` (``time``, ``drift``, ``memory``, ``requests``,
        ``cost``...) that fail the run. An acknowledged episode's rows, a suspicion and a
        chronic near-OOM after its first night are flagged but do not fail."""
        found = REGISTRY[kind]
        rows = self.flagged_rows(kind)
        if rows.empty:
            return rows
        failing = set(self.outcome.failing)
        mask = [found.key(r) in failing for r in rows.itertuples(index=False)]
        return rows[mask].reset_index(drop=True)

    def stored_tables(self) -> dict[str, pd.DataFrame]:
        """Each family's stored table by its name (``regression``, ``drift``,
        ``memory_verdicts``...): the run's csv files of the judgement."""
        out = {}
        for family in REGISTRY:
            table = family.stored(family.rows(self), self)
            if table is not None and family.table is not None:
                out[family.table] = table
        return out

    def warnings(self) -> list[str]:
        """The families' warnings of the run (an idle regression, informational or not)."""
        return [w for family in REGISTRY for w in family.warnings(family.rows(self), self)]

    def night_signals(self) -> dict[Key, Signal]:
        """Tonight's signals for the state machine, from the families' rows."""
        return _signals(self.tables, self.rules.regression)

    def to_json(self) -> JudgementDoc:
        """Plain JSON form (``dask-profiling check --json``)."""
        doc: dict[str, Any] = {
            **self.to_manifest(), **asdict(self.run), "regressed": self.outcome.regressed,
            "baseline": {"runs": list(self.baseline_runs), "note": self.baseline_note}}
        for family in REGISTRY:
            doc[family.json_key] = family.json_rows(family.rows(self))
        return cast(JudgementDoc, doc)

    def to_manifest(self) -> JudgementManifest:
        """The judgement's part of the stored manifest."""
        rule = self.rules.regression
        doc: dict[str, Any] = {
            "rules": self.rules.to_dict(),
            "outcome": {"regressed": self.outcome.regressed, "reason": self.outcome.reason,
                        "message": self.outcome.message, "suspected": self.outcome.suspected,
                        "acknowledged": self.outcome.acknowledged,
                        "episodes": list(self.outcome.episodes),
                        "failing": ["/".join(k) for k in self.outcome.failing],
                        "events": [e.to_json() for e in self.outcome.events]},
            "signals": [row for family in REGISTRY
                        for row in family.stored_signals(family.rows(self), rule)],
            "carried": self.carried.carried()}
        for family in REGISTRY:
            part = family.manifest(family.rows(self), self)
            if part is not None:
                doc[family.name] = part
        doc["explanations"] = self.explanations
        doc["skipped"] = [night.to_json() for night in self.skipped]
        return cast(JudgementManifest, doc)


def load_history(store: RunStore, run: RunKey, rules: Rules, *, before: str | None = None,
                 started: str | None = None, flow_run_id: str | None = None,
                 attempt: int | None = None, acks_until: str | None = None) -> History:
    """Read what ``run`` is judged against: one replay of the nights before it.

    Parameters
    ----------
    store
        Where the runs are (wrap the call in ``store.remembering_reads()`` to read each
        stored file once).
    run
        The judged run: never part of its own history; only runs of its pipeline and
        version count.
    rules
        How many baseline runs (``rules.regression.history``) and series nights
        (``rules.drift.max_runs``) to read.
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
    (:func:`~.alert_history.read_nights`), the time baseline's tables, what each family
    reads of its own (:meth:`~.families.Family.read`: the drift series) and each family's
    baseline manifests (:meth:`~.families.Family.history_size` of its
    :attr:`~.families.Family.baseline`'s nights) all leave out the same nights, those
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
        restart = restart_of(store.accepted(run.pipeline, run.version), before)
        acks = tuple(a for a in load_acks(store, run.pipeline, run.version)
                     if acks_until is None or not a.at or a.at <= acks_until)
    except StoreError as exc:
        raise HistoryUnavailable(f"the history of {run.pipeline} {run.version} could not be "
                                 f"listed: {exc}") from exc
    found = read_nights(store, run.pipeline, run.version, before=before, started=started,
                        flow_run_id=flow_run_id, attempt=attempt, since=restart)
    book, _ = replay([n for n in found.nights if n.run_id != run.run_id], acks, restart=restart)
    skipped = {night.run_id: night for night in found.skipped}
    while True:  # until every family leaves out the same nights (the reads are remembered)
        families = _read_families(store, run, rules, book, before=before,
                                  exclude=frozenset(skipped))
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
    return History(baseline, families.reads,
                   families.of(REGISTRY.primary.baseline), book, acks,
                   (*[s.line() for s in left_out], *found.notes),
                   baselines=families.manifests, skipped=left_out)


@dataclass(frozen=True)
class _Families:
    """What every family reads of one replayed history, leaving out the same nights."""

    baseline: Baseline
    reads: dict[str, FamilyRead]
    manifests: dict[str, tuple[Mapping[str, Any], ...]]
    skipped: tuple[SkippedNight, ...]

    def of(self, family: str | None) -> tuple[Mapping[str, Any], ...]:
        return self.manifests.get(str(family), ())


def _read_families(store: RunStore, run: RunKey, rules: Rules, book: Book, *,
                   before: str | None, exclude: frozenset[str]) -> _Families:
    """The time baseline's tables, what each family reads of its own (:meth:`~.families.
    Family.read`: the drift series) and each family's baseline manifests, all without the
    nights in ``exclude``; the nights found unreadable on the way.

    Raises
    ------
    HistoryUnavailable
        When the store does not answer for one of them (:func:`~.alert_history.damaged`).
    """
    query = HistoryQuery(store, run, rules, before, exclude)
    reads = {family.name: read for family in REGISTRY
             if (read := family.read(query)) is not None}
    baseline = read_baseline(store, run.pipeline, run.version, book, rules.regression.history,
                             str(REGISTRY.primary.baseline), exclude=exclude)
    skipped = [*(s for read in reads.values() for s in read.skipped),
               *(SkippedNight(r, why) for r, why in baseline.skipped)]
    left_out = exclude | {s.run_id for s in skipped}
    manifests = {}
    for family in _readers(rules):
        name = str(family.baseline)
        candidates = family.candidates(
            [r for r in book.baseline_runs(name) if r not in left_out], baseline)
        docs, bad = _manifests(store, run.pipeline, candidates, family.history_size(rules))
        skipped += bad
        left_out |= {s.run_id for s in bad}
        manifests[name] = tuple(docs[r] for r in sorted(docs))
    return _Families(baseline, reads, manifests, tuple(skipped))


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


def _readers(rules: Rules) -> list[Family]:
    """The first family of each baseline family that reads manifests (it reads them for
    every family of that baseline), in the registry's order."""
    readers: dict[str, Family] = {}
    for family in REGISTRY:
        if family.baseline is not None and family.history_size(rules) > 0:
            readers.setdefault(family.baseline, family)
    return list(readers.values())


def judge(tonight: Tonight, history: History, rules: Rules | None = None) -> Judgement:
    """Judge one night against its history (pure: no I/O).

    Every registered family (:data:`~.families.REGISTRY`) detects its rows; the primary
    family's rows, with the others merged in, are the run's verdicts; the state machine
    reads all their signals for the outcome.

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
    tables = {family.name: family.detect(tonight, history, rules) for family in REGISTRY}
    verdicts = tables[REGISTRY.primary.name]
    for family in REGISTRY:
        verdicts = family.merge(verdicts, tables[family.name])
    explanations: dict[str, Explanation] = {}
    for family in REGISTRY:
        explanations.update(family.explain(tables[family.name], tonight, history))
    return Judgement(run=tonight.run, rules=rules, verdicts=verdicts,
                     outcome=_outcome(tonight, tables, history, rules),
                     tables=tables, explanations=explanations,
                     baseline_runs=tuple(history.baseline.runs),
                     baseline_note=history.baseline.note,
                     notes={name: read.note for name, read in history.reads.items()},
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
            newest = store.newest_run(pipeline, version)
            if newest is None:
                what = f"pipeline {pipeline!r}" + (f" version {version!r}" if version else "")
                raise StoreError(f"no runs of {what} in {store.url}")
            run_id = newest["run_id"]
        manifest = store.read_manifest(pipeline, run_id)
        if version is not None and version != manifest["version"]:
            raise StoreError(f"run {run_id} is version {manifest['version']!r}, "
                             f"not {version!r}")
        rules = _stored_rules(manifest, rules, overrides)
        tonight = Tonight.from_manifest(manifest, store.read_table(pipeline, run_id, "tasks"))
        try:
            history = load_history(store, tonight.run, rules, before=run_id,
                                   started=tonight.started, attempt=manifest.get("attempt"),
                                   flow_run_id=manifest.get("flow_run_id"),
                                   acks_until=manifest.get("ended"))
        except HistoryUnavailable as exc:
            return StoredJudgement(None, manifest, str(exc))
        return StoredJudgement(judge(tonight, history, rules), manifest)


# ---------------------------------------------------------------------- internals
def _outcome(tonight: Tonight, tables: Mapping[str, pd.DataFrame], history: History,
             rules: Rules) -> Outcome:
    """Does the run fail: what the state machine says tonight's signals do, if the run is
    comparable; what happened to the episodes tonight."""
    rule = rules.regression
    if tonight.failed or tonight.incomplete:  # its times are partial: nothing it says counts
        why = "failed" if tonight.failed else "incomplete"
        reasons = [f.void_reason(tables[f.name], tonight) for f in REGISTRY]
        return Outcome(regressed=False, reason=next((r for r in reasons if r), (
            f"the run is {why}: its verdicts do not count")), message=_message(
            {f: f.message_rows(tables[f.name], rule, partial=True) for f in REGISTRY}))
    night = Night(tonight.run, _signals(tables, rule), rule, started=tonight.started or "")
    book, events = advance(history.alerts, night, history.acks)
    fails = sorted(failing(book, night), key=lambda ep: ep.key)
    keys = tuple(ep.key for ep in fails)
    message = _message({f: _kept(f, f.message_rows(tables[f.name], rule, partial=False), keys)
                        for f in REGISTRY})
    suspected = any(sig.alert == "suspected" for sig in night.signals.values())
    return Outcome(regressed=bool(fails), message=message,
                   suspected=suspected and not fails, events=tuple(events),
                   episodes=tuple(ep.id for ep in fails), failing=keys,
                   acknowledged=bool(silenced(book, night)) and not fails)


def _signals(tables: Mapping[str, pd.DataFrame], rule: RegressionRule) -> dict[Key, Signal]:
    """Tonight's signals of every family with rows in ``tables``, in the registry's order."""
    out: dict[Key, Signal] = {}
    for family in REGISTRY:
        if family.name in tables:
            out.update(family.signals(tables[family.name], rule))
    return out


def _kept(family: Family, rows: pd.DataFrame, keys: tuple[Key, ...]) -> pd.DataFrame:
    """The rows of ``family`` whose key fails the run."""
    if rows.empty:
        return rows
    return rows[[family.key(r) in keys for r in rows.itertuples(index=False)]]


def _message(rows: Mapping[Family, pd.DataFrame]) -> str:
    """One line naming what each family flagged (``"no regression"``: nothing)."""
    return "; ".join(family.describe(found) for family, found in rows.items()
                     if not found.empty) or "no regression"


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
        rules = replace(rules, regression=replace(rules.regression, **dict(overrides)))
    return rules

