"""The end of one profiled run, without Prefect: a record in, a stored run and a verdict out.

Used by the Prefect session (:mod:`prefect_dask_profiling.prefect.session`), by plain
``distributed.Client`` users and by tests. The order is what keeps a night's record safe:

Three seams, each returning what the next takes (:func:`finish_run` calls them in order; the
Prefect session does its own work between them):

1. :func:`store_record` — **summarise** the record (pure; if even that fails, the raw
   per-stage table is kept) and **store the record first**: tables and a provisional
   manifest with status ``unjudged``, or spooled when the store does not answer;
2. :func:`judge_run` — each later **step** on its own (:data:`STEPS`): deliver what earlier
   runs left in the spool, lifecycle rule, per-stage diagnosis, the history, **the
   judgement** (the one :func:`~prefect_dask_profiling.regression.judge.judge`). A step
   that raises leaves the others done; its failure becomes a warning in the manifest and
   in the logs;
3. :func:`complete_run` — **complete** the stored run: the judgement's tables, the final
   manifest (with the rules that judged the run) and the views (:data:`FINAL`): the trend
   page and the run's rows of the fleet view, drawn from what the run stores, are left to
   the caller as jobs (:attr:`FinishResult.views`, :func:`draw_views`): plain
   :func:`finish_run` draws them before it returns, the Prefect session in its background
   service, so neither the flow nor its artifacts wait for Bokeh or Parquet. One path: the
   artifacts link the trend page where it is being written.
   A run whose history could not be read or whose judgement could not be made keeps status
   ``unjudged``: it stays out of every baseline and ``dask-profiling check`` exits non-zero
   for it, with the reason.

Every write after the record fails closed: a store error at the final write (a listing, a
PUT, 403, 503, a timeout) spools what was not written and never loses the judgement, which
the caller applies to the flow all the same.

Nothing here changes the flow's own outcome: deciding to fail the flow on a regression is
the caller's (:attr:`FinishResult.regressed`; the runner's ``on_regression``, read from the
options only to store the state the flow will end in).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from prefect_dask_profiling.cost.allocation import allocation
from prefect_dask_profiling.environment import Environment, RasterStack
from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.regression.blind import blindness
from prefect_dask_profiling.regression.rule import Rules
from prefect_dask_profiling.store.manifest import (
    Baseline,
    Manifest,
    ManifestExtra,
    RunContext,
    RunKey,
    StageInfo,
    build_manifest,
    environment,
)
from prefect_dask_profiling.summary import RunRecord, summarise, utilisation
from prefect_dask_profiling.summary.io import mark_lower_bound, stage_io_summaries
from prefect_dask_profiling.summary.memory import stage_memory_info

if TYPE_CHECKING:
    from prefect_dask_profiling.diagnosis.stages import Diagnosis
    from prefect_dask_profiling.regression.judge import History, Judgement
    from prefect_dask_profiling.store.runs import RunStore

logger = logging.getLogger("prefect_dask_profiling")

UNJUDGED = "unjudged"
TREND_FILE = "trend.html"
VERDICT_COLUMNS = ["stage", "prefix", "verdict", "cause", "baseline_s", "latest_s", "delta_s",
                   "ratio", "robust_z", "tasks_ratio", "share", "n_history"]


#: What :func:`finish_run` judges by when it is given no options: the defaults of
#: :class:`~prefect_dask_profiling.options.ProfilingOptions`, with ``on_regression="warn"``:
#: whether a regression fails the flow is the caller's to say (``"fail"`` stores the
#: regressed run's state as ``FAILED``).
DEFAULT_OPTIONS = ProfilingOptions(on_regression="warn")


@dataclass
class FinishResult:
    """What finishing the run produced.

    Attributes
    ----------
    status
        The stored status: ``unjudged`` when no judgement could be made.
    judgement
        The run's judgement (:class:`~prefect_dask_profiling.regression.judge.Judgement`),
        ``None`` when unjudged.
    regressed
        The run counts as regressed (the judgement's outcome).
    diagnoses
        The bottleneck verdict of each stage.
    trend_location, fleet_location
        Where the trend page and the run's rows of the fleet view are written (being
        written, while :attr:`views_pending`).
    views
        The views left to draw and store once the run is complete: ``(name, job)``, each
        job returning its warnings; :func:`draw_views` draws them. None when the run's
        record went to the spool: the run that delivers it writes its fleet rows.
    views_pending
        The views being drawn and stored (by :func:`finish_run`, done; the Prefect session
        queues them on its background service); :meth:`wait_views` waits for them.
    """

    run_id: str
    pipeline: str
    version: str
    status: str
    summary: pd.DataFrame
    utilisation: pd.DataFrame
    verdicts: pd.DataFrame
    manifest: Manifest
    location: str | None
    regressed: bool
    warnings: list[str]
    trend_location: str | None = None
    judgement: Judgement | None = None
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    fleet_location: str | None = None
    views: list[tuple[str, Callable[[], list[str]]]] = field(default_factory=list, repr=False)
    views_pending: Future[list[str]] | None = None

    def wait_views(self, timeout: float | None = None) -> list[str]:
        """Wait for the views being drawn; what went wrong (``[]`` at once when there were
        none)."""
        return [] if self.views_pending is None else self.views_pending.result(timeout)

    @property
    def judged(self) -> bool:
        return self.status != UNJUDGED

    @property
    def failure_message(self) -> str:
        """One line naming what regressed and drifted (the flow's failure message)."""
        return self.judgement.outcome.message if self.judgement is not None \
            else "no regression"


@dataclass
class RunEnd:
    """Everything a step reads and writes while the run is being finished.

    Steps communicate through these attributes only; ``manifest_extra`` keys are added to the
    stored manifest, ``files`` are stored next to the tables.
    """

    store: RunStore
    record: RunRecord
    ctx: RunContext
    stages: list[StageInfo]
    options: ProfilingOptions
    state: str | None
    error: BaseException | None
    env: Environment
    warnings: list[str]
    ended: datetime | None = None
    summary: pd.DataFrame | None = None
    util: pd.DataFrame | None = None
    history: History | None = None
    judgement: Judgement | None = None
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    unjudged_reason: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    manifest_extra: ManifestExtra = field(default_factory=lambda: ManifestExtra())
    manifest: Manifest | None = None
    fleet_location: str | None = None
    # views drawn after the run is complete: (name, job -> warnings)
    views: list[tuple[str, Callable[[], list[str]]]] = field(default_factory=list)
    step_seconds: dict[str, float] = field(default_factory=dict)
    early_history: EarlyHistory | None = None
    log_warnings: bool = True  # False: the caller logs FinishResult.warnings (once each)
    first: Any = None  # what the record's write returned (its location, its warnings)

    @property
    def flow_failed(self) -> bool:
        """The flow itself did not complete: it raised (``error``), or its final state is
        not ``COMPLETED`` (``FAILED``, ``CRASHED``, ``CANCELLED``, a retried attempt still
        ``RUNNING``, ``UNKNOWN``...). Its timings are partial: no verdict of it counts.

        On the runner's exit path Prefect has caught the flow's exception, so ``error`` is
        None and only ``state`` says the flow failed.
        """
        return self.error is not None or (self.state is not None and self.state != "COMPLETED")

    @property
    def failed_otherwise(self) -> bool:
        """The run failed or is incomplete: a regression verdict would not be meaningful."""
        return self.flow_failed or self.record.incomplete

    @property
    def judged(self) -> bool:
        return self.judgement is not None

    @property
    def regressed(self) -> bool:
        """The judgement's outcome; never for a flow that failed (its timings are partial)."""
        return self.judgement is not None and self.judgement.regressed and not self.flow_failed

    @property
    def flagged_stages(self) -> set[str]:
        """The stages that regressed or drifted (none before the judgement)."""
        if self.judgement is None:
            return set()
        return set(self.judgement.flagged()["stage"].astype(str))

    def step(self, name: str, step: Step) -> None:
        """Run ``step(self)`` on its own, timed under ``name`` in the manifest's
        ``finish_seconds``: one that raises is a warning (a failing judging step leaves the
        run unjudged), never an error."""
        started = time.perf_counter()
        try:
            step(self)
        except Exception as exc:
            message = f"{name} step failed: {type(exc).__name__}: {exc}"
            self.warnings.append(message)
            if name in JUDGING_STEPS:
                self.unjudged_reason = self.unjudged_reason or message
            # the traceback always; the warning itself once: here, or by the caller
            logger.log(logging.WARNING if self.log_warnings else logging.DEBUG,
                       "dask-profiling: %s", message, exc_info=True)
        finally:
            self.step_seconds[name] = time.perf_counter() - started


Step = Callable[["RunEnd"], None]


def _deliver_spool(end: RunEnd) -> None:
    """Deliver what earlier runs left in the spool, and write the fleet rows of the runs
    whose manifest it delivered (their own finish could not)."""
    from prefect_dask_profiling.export.fleet import write_fleet

    deliver = getattr(end.store, "deliver_pending", None)
    if deliver is None:
        return
    report = deliver(end.options.store_timeout)
    if not report:
        return
    end.manifest_extra["spool_delivery"] = report
    for run_id, pipeline in (report.get("pipelines") or {}).items():
        try:
            write_fleet(end.store, end.store.read_manifest(pipeline, run_id),
                        end.store.read_table(pipeline, run_id, "tasks"))
        except Exception as exc:  # one delivered run's view must not cost the others
            end.warnings.append(f"fleet view of delivered run {run_id} not written: {exc}")


def _lifecycle(end: RunEnd) -> None:
    warning = end.store.ensure_lifecycle(end.options.report_retention_days)
    if warning:
        end.warnings.append(warning)


def _history(end: RunEnd) -> None:
    """The run's history: the one read while the run computed (:func:`read_history_early`)
    when it is still the right one, else read now; one that cannot be read leaves the run
    unjudged."""
    from prefect_dask_profiling.regression.judge import load_history

    early = end.early_history
    stale = early is not None and early.stale_for(end)
    if early is not None and stale is None:
        try:
            end.history = early.future.result()
        except Exception as exc:  # read it again now: the store may be back
            logger.info("dask-profiling: the history read while the run computed failed "
                        "(%r); reading it again", exc)
        else:
            end.manifest_extra["history_read"] = {"at": early.started, "when": "run start"}
            end.warnings.extend(end.history.warnings)
            return
    end.manifest_extra["history_read"] = {"at": _now(), "when": "finish",
                                          **({"why": stale} if stale else {})}
    end.history = load_history(end.store, end.ctx.key, end.options.rules,
                               started=end.ctx.started.isoformat(),
                               flow_run_id=end.ctx.flow_run_id,
                               attempt=end.ctx.attempt)
    end.warnings.extend(end.history.warnings)


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class EarlyHistory:
    """A run's history being read in the background while the run computes.

    Reading the history is the costliest read of a run's end (one listing per folder, the
    baseline's tables, the drift series, the alert history: on S3 a round trip each);
    started when the run starts (:func:`read_history_early`), the judgement does not wait
    for it. :func:`finish_run` reads it again when it is not the right one any more
    (:meth:`stale_for`) or its read failed.

    Attributes
    ----------
    location
        The store it is read from.
    run
        The run it is read for.
    rules
        The rules it is read for (how many baseline runs and series nights).
    started
        When the read began (ISO, UTC): runs stored after it are not in it.
    future
        The :class:`~prefect_dask_profiling.regression.judge.History`, or its failure.
    """

    location: str
    run: RunKey
    rules: Rules
    started: str
    future: Future[History]

    def stale_for(self, end: RunEnd) -> str | None:
        """Why this history is not ``end``'s (``None`` when it is): another store, run or
        rules, or earlier runs of the pipeline delivered from the spool since."""
        if (self.location, self.run) != (end.store.url, end.ctx.key):
            return "read for another store or run"
        if self.rules != end.options.rules:
            return "read for other rules"
        delivered = (end.manifest_extra.get("spool_delivery") or {}).get("pipelines") or {}
        if end.ctx.pipeline in delivered.values():
            return "runs of the pipeline delivered from the spool since"
        return None


def read_history_early(store: RunStore, ctx: RunContext, rules: Rules,
                       submit: Callable[[Callable[[], History]], Future] | None = None,
                       ) -> EarlyHistory:
    """Read the history ``ctx``'s run will be judged against, now or (``submit``) in the
    background (pass the result to :func:`finish_run` or :func:`store_record`).

    ``submit`` queues a call and returns its future (the Prefect session passes its
    process's background service); without it the history is read before this returns.
    ``store`` should be a store of its own (the same URL and options as the run's): reads
    remembered in it must not meet the run's writes, made from another thread.
    """
    from prefect_dask_profiling.regression.judge import load_history

    run, flow_run_id, attempt = ctx.key, ctx.flow_run_id, ctx.attempt
    started = ctx.started.isoformat()

    def read() -> History:
        with store.remembering_reads():
            return load_history(store, run, rules, started=started, flow_run_id=flow_run_id,
                                attempt=attempt)

    started_at = _now()
    if submit is not None:
        future = submit(read)
    else:
        future = Future()
        try:
            future.set_result(read())
        except Exception as exc:  # judged at finish: read again then
            future.set_exception(exc)
    return EarlyHistory(location=store.url, run=run, rules=rules, started=started_at,
                        future=future)


def _judge(end: RunEnd) -> None:
    """The one judgement of the night (:func:`~prefect_dask_profiling.regression.judge.judge`)."""
    from prefect_dask_profiling.regression.judge import Tonight, judge

    if end.history is None:  # the history step failed and said why: the run is unjudged
        return
    if end.summary is None:
        # not user input: the summary step failed (and said why); this isolated step fails
        # too, so the run is stored unjudged (JUDGING_STEPS). Never reaches the caller.
        raise RuntimeError("no summary could be computed")
    tonight = Tonight.from_manifest(_manifest(end, provisional=False), end.summary,
                                    failed=end.flow_failed, incomplete=end.record.incomplete)
    end.judgement = judge(tonight, end.history, end.options.rules)
    end.warnings.extend(end.judgement.warnings())  # each verdict family's, in order
    end.tables.update(end.judgement.stored_tables())
    end.manifest_extra.update(end.judgement.to_manifest())


def _trend(end: RunEnd) -> None:
    """The trend page, as a view (drawn once the run is complete): every night with
    ``stage_reports=True``, else only on a night that flags (:func:`wants_trend`)."""
    if end.history is None or end.summary is None or end.judgement is None or _spooled(end):
        return
    if not wants_trend(end.options.stage_reports, end.judgement):
        return
    draw = functools.partial(_trend_page, end.history.baseline.history, end.summary,
                             end.judgement.verdicts,
                             f"{end.ctx.pipeline} {end.ctx.version}: total seconds per prefix")
    store, pipeline, run_id = end.store, end.ctx.pipeline, end.ctx.run_id

    def view() -> list[str]:
        return store.write_view(pipeline, run_id, TREND_FILE, draw()).warnings

    end.views.append((TREND_FILE, view))


def wants_trend(stage_reports: bool | str, judgement: Judgement) -> bool:
    """Whether the run's trend page is drawn: every night when every stage gets its report
    (``stage_reports=True``, Bokeh is loaded anyway), else only on a night whose judgement
    flags a prefix or regressed. A healthy night of ``"auto"`` or ``False`` imports no
    Bokeh, which a new process per night pays ~1.3 CPU-s for (docs/scaling.md, cold runs).
    """
    return stage_reports is True or judgement.regressed or not judgement.flagged().empty


def _trend_page(history: pd.DataFrame, summary: pd.DataFrame, verdicts: pd.DataFrame,
                title: str) -> bytes:
    from prefect_dask_profiling.regression.trend import trend_html

    return trend_html(history, summary, verdicts, title=title).encode()


def draw_views(views: list[tuple[str, Callable[[], list[str]]]]) -> list[str]:
    """Draw and store each view (:attr:`FinishResult.views`); never raises: a failure is a
    warning (logged, returned)."""
    warnings: list[str] = []
    for name, view in views:
        try:
            warnings.extend(view())
        except Exception as exc:
            message = f"{name} not stored: {type(exc).__name__}: {exc}"
            logger.warning("dask-profiling: %s", message, exc_info=True)
            warnings.append(message)
    return warnings


def _diagnose(end: RunEnd) -> None:
    """A bottleneck verdict per stage (same classifier as ``bench``), kept in the manifest;
    before the judgement, whose explanations compare tonight's bottleneck with the
    baseline's."""
    from prefect_dask_profiling.diagnosis.stages import diagnose_run

    diagnoses, warnings = diagnose_run(end.record)
    end.warnings.extend(warnings)
    for info in end.stages:
        if info.name in diagnoses:
            info.diagnosis = diagnoses[info.name].to_dict()
            _note_misaligned_chunks(info)
    end.diagnoses = diagnoses


def _note_misaligned_chunks(info: StageInfo) -> None:
    """Chunks that cut the files' blocks: a note and the fix in the stage's diagnosis."""
    found = info.chunks_vs_blocks
    if not found or found.get("aligned") or info.diagnosis is None:
        return
    note = info.diagnosis.get("note") or ""
    info.diagnosis["note"] = f"{note}; {found['text']}" if note else found["text"]
    info.diagnosis["actions"] = [found["fix"], *(info.diagnosis.get("actions") or [])]


def _fleet(end: RunEnd) -> None:
    """The run's rows of the fleet-wide Parquet view (``<store>/fleet/``), from the final
    manifest, as a view (drawn once the run is complete; ``dask-profiling fleet
    --rebuild`` draws it again)."""
    from prefect_dask_profiling.export.fleet import fleet_location, write_fleet

    tasks = end.tables.get("tasks")
    if end.manifest is None or tasks is None or _spooled(end):
        return
    store, manifest = end.store, end.manifest

    def view() -> list[str]:
        write_fleet(store, manifest, tasks)
        return []

    end.views.append(("fleet view", view))
    end.fleet_location = fleet_location(store, end.ctx.pipeline, end.ctx.run_id)


def _spooled(end: RunEnd) -> bool:
    """The record went to the spool: no view is drawn from a run the store does not hold
    (the run that delivers the spool writes its fleet rows)."""
    return end.first is not None and bool(end.first.spooled)


# The steps after the record is stored, up to the judgement (:func:`judge_run`), in order.
# Each one is isolated: add new ones here.
STEPS: list[tuple[str, Step]] = [
    ("spool delivery", _deliver_spool),
    ("lifecycle", _lifecycle),
    ("diagnosis", _diagnose),
    ("history", _history),
    ("judgement", _judge),
]
# The steps of the completion (:func:`complete_run`), once the final manifest is built (not
# yet written): the views drawn from the run.
FINAL: list[tuple[str, Step]] = [("trend", _trend), ("fleet", _fleet)]
# A failing step of these names leaves the run unjudged.
JUDGING_STEPS = ("summary", "history", "judgement")


def finish_run(store: RunStore, record: RunRecord, ctx: RunContext, stages: list[StageInfo],
               options: ProfilingOptions | None = None, *, state: str | None = None,
               error: BaseException | None = None, env: Environment | None = None,
               warnings: list[str] | None = None,
               early_history: EarlyHistory | None = None,
               ended: datetime | None = None, log_warnings: bool = True) -> FinishResult:
    """Summarise, store, judge and complete one run; never raises for a failing step.

    The three seams in order, for a caller that has nothing to do between them:
    :func:`store_record`, :func:`judge_run`, :func:`complete_run`; then the views are
    drawn and stored before this returns
    (:attr:`FinishResult.views_pending` is done).

    Parameters
    ----------
    store
        Where the run is kept.
    record
        The run's task, worker and transfer record (:func:`~prefect_dask_profiling.collect`).
    ctx
        The run's identity (run id, pipeline, version, flow run...).
    stages
        The stages the run opened (reports already stored are listed in them).
    options
        The runner's options, as they are: the rules the run is judged by
        (:attr:`~prefect_dask_profiling.options.ProfilingOptions.rules`), ``cost``,
        ``cost_regression``, ``report_retention_days``, ``store_timeout`` (the longest spent
        delivering what earlier runs left in the spool) and ``on_regression`` (``"fail"``:
        a regressed run is stored ``FAILED``, the state the caller gives the flow); default
        :data:`DEFAULT_OPTIONS`.
    state
        The flow's final state (``COMPLETED``, ``FAILED``...) when it is already known (the
        runner's exit path); default from ``error`` and the verdict. Any state other than
        ``COMPLETED`` is a failed flow: stored ``failed``, its flagged prefixes do not count
        (never ``regressed``, no detection event).
    error
        The exception the flow body raised, if any: the run is stored but not judged regressed.
    env
        The environment fingerprint; default this process's.
    warnings
        Warnings collected before finishing (stage reports, snapshots...).
    early_history
        The history read while the run computed (:func:`read_history_early`): used when it
        is still the run's (:meth:`EarlyHistory.stale_for`) and its read succeeded, else
        the history is read now. The manifest's ``history_read`` says which.
    ended
        When the flow's work ended (UTC); default now. A run that ended after another run
        started overlaps it and is not part of that run's history.
    log_warnings
        Log the warnings of failed steps and of the final write here (default). ``False``
        when the caller logs :attr:`FinishResult.warnings` itself (the Prefect session, to
        the flow run's logger): each warning is then logged once, by the caller (a failed
        step's traceback still goes to this module's logger, at DEBUG).

    Returns
    -------
    FinishResult
        Its ``status`` is ``unjudged`` when the verdict could not be computed.

    Raises
    ------
    StoreError
        Only when the run id already exists in the store (runs are never overwritten).
    """
    end = store_record(store, record, ctx, stages, options, state=state, error=error,
                       env=env, warnings=warnings, early_history=early_history, ended=ended,
                       log_warnings=log_warnings)
    judge_run(end)
    result = complete_run(end)
    if result.views:
        done: Future[list[str]] = Future()
        done.set_result(draw_views(result.views))
        result.views_pending = done
    return result


def store_record(store: RunStore, record: RunRecord, ctx: RunContext,
                 stages: list[StageInfo], options: ProfilingOptions | None = None, *,
                 state: str | None = None, error: BaseException | None = None,
                 env: Environment | None = None, warnings: list[str] | None = None,
                 early_history: EarlyHistory | None = None, ended: datetime | None = None,
                 log_warnings: bool = True) -> RunEnd:
    """The first seam: summarise the run and store its record (status ``unjudged``).

    Takes the parameters of :func:`finish_run`. The summary is in the returned
    :class:`RunEnd` (``summary``; ``None`` if even that failed, the raw per-stage table is
    then stored). Pass it on to :func:`judge_run`.

    Raises
    ------
    StoreError
        Only when the run id already exists in the store (runs are never overwritten).
    """
    end = RunEnd(store=store, record=record, ctx=ctx, stages=stages,
                 options=options if options is not None else DEFAULT_OPTIONS, state=state,
                 error=error,
                 env=env if env is not None else environment(),
                 warnings=[*(warnings or []), *record.warnings],
                 early_history=early_history, ended=ended, log_warnings=log_warnings)
    end.step("summary", _summarise)
    end.first = _store_record(end)
    return end


def judge_run(end: RunEnd) -> Judgement | None:
    """The second seam: the steps up to the judgement (:data:`STEPS`: spool delivery,
    lifecycle, diagnosis, history, judgement), each on its own; the judgement (``None``:
    the run stays unjudged, ``end.unjudged_reason`` says why)."""
    with end.store.remembering_reads():  # the baseline and the drift series share the history
        for name, step in STEPS:
            end.step(name, step)
    if not end.judged:
        end.unjudged_reason = end.unjudged_reason or "the verdict was not computed"
        if not end.failed_otherwise:  # a failed night is never judged: no blind gate
            _blindness(end)
    return end.judgement


def _blindness(end: RunEnd) -> None:
    """Tonight went unjudged: count the streak, and say so once the gate is blind."""
    blind = blindness(end.store, end.ctx.key, end.unjudged_reason)
    end.manifest_extra["unjudged"] = blind.to_json()
    if blind.alerting:
        end.warnings.append(blind.message(end.ctx.pipeline, end.ctx.version))


def complete_run(end: RunEnd) -> FinishResult:
    """The third seam: the final manifest, the views (:data:`FINAL`) and the final write;
    never raises.

    What the caller adds between :func:`judge_run` and this (the reports of flagged stages,
    in ``end.stages``; their warnings, in ``end.warnings``) is in the final manifest. With
    The views are not drawn here: they are in :attr:`FinishResult.views`, for the caller
    to draw (:func:`draw_views`) once the run is published.
    """
    end.manifest = _manifest(end, provisional=False)
    for name, step in FINAL:
        end.step(name, step)
    final_warnings, location = _complete(end)
    first = end.first
    location = location or (first.location if first is not None else None)
    if end.log_warnings:
        for w in final_warnings:
            logger.warning("dask-profiling: %s", w)
    judgement = end.judgement
    return FinishResult(
        run_id=end.ctx.run_id, pipeline=end.ctx.pipeline, version=end.ctx.version,
        status=end.manifest["status"], summary=_or_empty(end.summary),
        utilisation=_or_empty(end.util),
        verdicts=judgement.verdicts if judgement is not None
        else pd.DataFrame(columns=VERDICT_COLUMNS),
        manifest=end.manifest, location=location, regressed=end.regressed,
        warnings=[*end.warnings, *(first.warnings if first is not None else []),
                  *final_warnings],
        trend_location=_join(location, TREND_FILE) if any(
            name == TREND_FILE for name, _ in end.views) else None,
        views=list(end.views),
        judgement=judgement, diagnoses=end.diagnoses, fleet_location=end.fleet_location)


def _summarise(end: RunEnd) -> None:
    end.util = utilisation(end.record)
    _stage_totals(end.stages, end.record, end.util, (end.env or {}).get("raster"))
    _allocation(end)
    if end.record.incidents:  # workers that died with work on them
        end.manifest_extra["incidents"] = end.record.incidents
    end.summary = summarise(end.record)


def _manifest(end: RunEnd, *, provisional: bool) -> Manifest:
    """The run's manifest: provisional (``unjudged``, verdict pending) or final."""
    state = end.state
    if state is None:
        fails = end.error is not None or (end.regressed and end.options.on_regression == "fail")
        state = "FAILED" if fails else "COMPLETED"
    if end.record.incomplete and state == "COMPLETED":
        state = "CRASHED"
    judged = end.judged and not provisional
    baseline: Baseline | None = None
    if end.history is not None:  # the judgement's, when there is one (it is judged against it)
        baseline = {"runs": list(end.history.baseline.runs), "version": end.ctx.version,
                    "note": end.history.baseline.note}
    manifest = build_manifest(
        end.ctx, state=state, regressed=end.regressed and not provisional, judged=judged,
        utilisation=_or_empty(end.util, ["utilisation", "wall_s", "task_s"]),
        stages=end.stages, workers=end.record.n_workers, threads=end.record.threads,
        env=end.env, warnings=list(end.warnings), baseline=baseline, ended=end.ended,
        unjudged_reason=None if judged else (end.unjudged_reason or "verdict pending"),
        suspected=judged and end.judgement.outcome.suspected,
        acknowledged=judged and end.judgement.outcome.acknowledged)
    if not provisional:
        manifest.update(end.manifest_extra)
    if end.step_seconds:
        manifest["finish_seconds"] = {k: round(v, 4) for k, v in end.step_seconds.items()}
    return manifest


def _store_record(end: RunEnd):
    """Store the record and a provisional manifest (spooled when the store does not
    answer). Raises ``StoreError`` only when the run id is already taken."""
    end.tables = _record_tables(end)
    return end.store.write_run(end.ctx.pipeline, end.ctx.run_id, end.tables,
                               _manifest(end, provisional=True))


def _complete(end: RunEnd) -> tuple[list[str], str | None]:
    """Write the judgement's tables, files and the final manifest; never raises.

    The store spools what it cannot write. Should it raise all the same, the judgement is
    kept (the caller still applies it to the flow) and the failure is a warning.
    """
    manifest = end.manifest
    manifest["warnings"] = list(end.warnings)
    if end.step_seconds:
        manifest["finish_seconds"] = {k: round(v, 4) for k, v in end.step_seconds.items()}
    try:
        result = end.store.complete_run(end.ctx.pipeline, end.ctx.run_id, end.tables,
                                        manifest, extra_files=end.files)
    except Exception as exc:
        message = (f"the final write of run {end.ctx.run_id} failed: {type(exc).__name__}: "
                   f"{exc}; the run stays stored as provisional (unjudged)")
        return [message], None  # the manifest was not written: its warnings are moot
    return list(result.warnings), result.location


def _record_tables(end: RunEnd) -> dict[str, pd.DataFrame]:
    record = end.record
    tables: dict[str, pd.DataFrame] = {}
    tables["tasks"] = end.summary if end.summary is not None else record.tasks
    tables["orchestration"] = record.orchestration.drop(
        columns=["first_start", "last_stop"], errors="ignore")
    tables["workers"] = record.workers
    tables["transfers"] = record.transfers
    if not record.io.empty:
        tables["io"] = record.io
    tables["memory"] = record.memory
    if end.util is not None:
        tables["utilisation"] = end.util.reset_index()
    return tables


def _stage_totals(stages: list[StageInfo], record: RunRecord, util: pd.DataFrame,
                  raster: RasterStack | None = None) -> None:
    """Fill each stage's task count, task seconds and wall; add stages only the record knows.

    Each stage's storage figures carry ``requests_lower_bound`` when the workers' ``raster``
    stack says GDAL counted parallel range requests in batches.
    """
    by_name = {s.name: s for s in stages}
    memory = stage_memory_info(record)
    io = stage_io_summaries(record.io)
    mark_lower_bound(io, raster)
    for name in record.stages:
        if name not in by_name:
            by_name[name] = StageInfo(name=name)
            stages.append(by_name[name])
    for info in stages:
        t = record.stage_rows("tasks", info.name)
        info.tasks = int(t["tasks"].sum())
        info.task_s = float(t["compute_s"].sum())
        info.wall_s = float(util.loc[info.name, "wall_s"]) if info.name in util.index else 0.0
        info.memory = dict(memory[info.name]) if info.name in memory else info.memory
        if info.tasks == 0 and info.note is None:
            info.note = "no tasks ran in this stage"
        info.io = io.get(info.name)


def _allocation(end: RunEnd) -> None:
    """What the cluster allocated per stage, outside the stages and for the run (priced
    when rates were given): each stage's ``allocation``, the manifest's ``allocation``."""
    alloc = allocation(end.record, end.options.cost)
    by_stage = {row.scope: row for row in alloc.stages}
    for info in end.stages:
        row = by_stage.get(info.name)
        info.allocation = row.to_dict() if row is not None else None
    end.manifest_extra["allocation"] = alloc.to_dict()


def _or_empty(frame: pd.DataFrame | None, columns: list[str] | None = None) -> pd.DataFrame:
    return frame if frame is not None else pd.DataFrame(columns=columns or [])




def _join(location: str | None, name: str) -> str | None:
    return None if location is None else location.rstrip("/") + "/" + name
