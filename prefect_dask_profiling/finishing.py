"""The end of one profiled run, without Prefect: a record in, a stored run and a verdict out.

Used by the Prefect session (:mod:`prefect_dask_profiling.prefect.session`), by plain
``distributed.Client`` users and by tests. The order is what keeps a night's record safe:

1. **summarise** the record (pure; if even that fails, the raw per-stage table is kept);
2. **store the record first** — tables and a provisional manifest with status ``unjudged``
   — or spool it when the store does not answer;
3. run each later **step** on its own (:data:`STEPS`): deliver what earlier runs left in the
   spool, lifecycle rule, baseline, verdict, per-stage diagnosis, trend... A step that raises
   leaves the others done; its failure becomes a warning in the manifest and in the logs;
4. **complete** the stored run: the verdict's tables and the final manifest. A run whose
   verdict could not be computed keeps status ``unjudged``: it stays out of every baseline
   and ``dask-profiling check`` exits non-zero for it, with the reason.

Nothing here changes the flow's own outcome: deciding to fail the flow on a regression is
the caller's (:attr:`FinishResult.regressed` and :attr:`FinishSettings.on_regression`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.store.manifest import (
    RunContext,
    StageInfo,
    build_manifest,
    environment,
)
from prefect_dask_profiling.summary import RunRecord, summarise, utilisation
from prefect_dask_profiling.summary.memory import stage_memory_info

if TYPE_CHECKING:
    from prefect_dask_profiling.store.runs import RunStore

logger = logging.getLogger("prefect_dask_profiling")

UNJUDGED = "unjudged"
VERDICT_COLUMNS = ["stage", "prefix", "verdict", "cause", "baseline_s", "latest_s", "delta_s",
                   "ratio", "robust_z", "tasks_ratio", "share", "n_history"]


@dataclass(frozen=True)
class FinishSettings:
    """How a run is judged and kept; built from the runner's options.

    Parameters
    ----------
    threshold
        Ratio to the baseline median that counts as a regression.
    history
        How many earlier healthy runs form the baseline.
    check_options
        Further settings of the regression rule (``min_seconds``, ``z_threshold``, ...).
    report_retention_days
        Days the per-stage reports are kept (S3 lifecycle rule).
    spool_budget_s
        Longest time spent delivering files that earlier runs left in the local spool.
    fail_on_regression
        Whether the caller fails the flow on a regression: the stored state then says
        ``FAILED``.
    """

    threshold: float = RegressionRule.threshold
    history: int = RegressionRule.history
    check_options: dict[str, Any] = field(default_factory=dict)
    report_retention_days: int = 30
    spool_budget_s: float = 10.0
    fail_on_regression: bool = False


@dataclass
class FinishResult:
    """What finishing the run produced."""

    run_id: str
    pipeline: str
    version: str
    status: str
    summary: pd.DataFrame
    utilisation: pd.DataFrame
    verdicts: pd.DataFrame
    manifest: dict[str, Any]
    location: str | None
    regressed: bool
    warnings: list[str]
    trend_location: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def judged(self) -> bool:
        return self.status != UNJUDGED


@dataclass
class RunEnd:
    """Everything a step reads and writes while the run is being finished.

    Steps communicate through these attributes only; ``manifest_extra`` keys are added to the
    stored manifest, ``files`` are stored next to the tables, ``extras`` reach the caller.
    """

    store: RunStore
    record: RunRecord
    ctx: RunContext
    stages: list[StageInfo]
    settings: FinishSettings
    state: str | None
    error: BaseException | None
    env: dict[str, Any]
    warnings: list[str]
    summary: pd.DataFrame | None = None
    util: pd.DataFrame | None = None
    baseline: Any = None
    verdicts: pd.DataFrame | None = None
    judged: bool = False
    unjudged_reason: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)
    flagged_reports: Callable[[set[str]], list[str]] | None = None

    @property
    def failed_otherwise(self) -> bool:
        """The run failed or is incomplete: a regression verdict would not be meaningful."""
        return self.error is not None or self.record.incomplete

    @property
    def regressed(self) -> bool:
        from prefect_dask_profiling.regression.verdict import run_outcome

        return run_outcome(self.verdicts if self.judged else None,
                           failed=self.error is not None,
                           incomplete=self.record.incomplete).regressed \
            or bool(self.extras.get("drift_fails"))


Step = Callable[[RunEnd], None]


def _deliver_spool(end: RunEnd) -> None:
    deliver = getattr(end.store, "deliver_pending", None)
    if deliver is None:
        return
    report = deliver(end.settings.spool_budget_s)
    if report:
        end.manifest_extra["spool_delivery"] = report


def _lifecycle(end: RunEnd) -> None:
    warning = end.store.ensure_lifecycle(end.settings.report_retention_days)
    if warning:
        end.warnings.append(warning)


def _baseline(end: RunEnd) -> None:
    from prefect_dask_profiling.regression.baseline import load_baseline

    end.baseline = load_baseline(end.store, end.ctx.pipeline, end.ctx.version,
                                 n=end.settings.history, exclude_run_id=end.ctx.run_id)
    end.warnings.extend(f"baseline: skipped run {r}: {why}" for r, why in end.baseline.skipped)


def _verdict(end: RunEnd) -> None:
    from prefect_dask_profiling.regression.verdict import detect_regressions

    if end.baseline is None:
        raise RuntimeError("no baseline could be loaded")
    if end.summary is None:
        raise RuntimeError("no summary could be computed")
    rule = RegressionRule.from_options(end.settings.threshold, end.settings.history,
                                       end.settings.check_options)
    end.verdicts = detect_regressions(end.baseline.history, end.summary, rule=rule)
    end.judged = True
    end.tables["regression"] = end.verdicts


def _trend(end: RunEnd) -> None:
    from prefect_dask_profiling.regression.trend import trend_html

    if end.baseline is None or end.summary is None or end.verdicts is None:
        return
    title = f"{end.ctx.pipeline} {end.ctx.version}: total seconds per prefix"
    end.files["trend.html"] = trend_html(end.baseline.history, end.summary, end.verdicts,
                                         title=title).encode()


def _diagnose(end: RunEnd) -> None:
    """A bottleneck verdict per stage (same classifier as ``bench``), kept in the manifest."""
    from prefect_dask_profiling.diagnosis.stages import diagnose_run

    diagnoses, warnings = diagnose_run(end.record)
    end.warnings.extend(warnings)
    for info in end.stages:
        if info.name in diagnoses:
            info.diagnosis = diagnoses[info.name].to_dict()
    end.extras["diagnoses"] = diagnoses


def _explain(end: RunEnd) -> None:
    """For regressed stages: how the bottleneck and the run's context changed since the
    baseline runs (their manifests; unreadable ones are left out)."""
    from prefect_dask_profiling.regression.explain import explain_verdicts

    if end.baseline is None or end.verdicts is None or end.verdicts.empty:
        return
    if not (end.verdicts["verdict"] == "regression").any():
        return
    manifests = []
    for run_id in end.baseline.runs:
        try:
            manifests.append(end.store.read_manifest(end.ctx.pipeline, run_id))
        except Exception as exc:  # one unreadable manifest must not cost the others
            end.warnings.append(f"explanation: baseline run {run_id} skipped: {exc}")
    tonight = {"version": end.ctx.version, "source_hash": end.ctx.source_hash,
               "workers": end.record.n_workers, "threads": end.record.threads,
               "environment": end.env, "stages": [s.__dict__ for s in end.stages]}
    explanations = explain_verdicts(end.verdicts, tonight, manifests)
    if explanations:
        end.manifest_extra["explanations"] = explanations
        end.extras["explanations"] = explanations


def _flagged_reports(end: RunEnd) -> None:
    """Ask the caller for the reports of stages that regressed or drifted (when it deferred
    them), before the stored run is completed so its manifest lists them."""
    from prefect_dask_profiling.regression.drift import flagged

    if end.flagged_reports is None or end.verdicts is None or end.verdicts.empty:
        return
    stages = set(flagged(end.verdicts)["stage"].astype(str))
    if stages:
        end.warnings.extend(end.flagged_reports(stages))


def _drift(end: RunEnd) -> None:
    """Judge each prefix's series since the baseline start; failing drift fails the run."""
    from prefect_dask_profiling.regression import drift as rule
    from prefect_dask_profiling.regression.verdict import describe, regressed

    if end.summary is None or end.verdicts is None or end.failed_otherwise:
        return
    series, note = rule.load_series(end.store, end.ctx.pipeline, end.ctx.version,
                                    exclude_run_id=end.ctx.run_id)
    latest = end.summary.assign(run_id=end.ctx.run_id, started=end.ctx.started.isoformat())
    options = {k: v for k, v in end.settings.check_options.items()
               if k in ("min_seconds", "min_share")}
    found = rule.detect_drift(pd.concat([series, latest], ignore_index=True),
                              threshold=end.settings.threshold, **options)
    failing = rule.drifted(found, failing_only=True)
    end.extras["drift"] = found
    end.extras["drift_fails"] = not failing.empty
    end.tables["drift"] = found.drop(columns="series")
    one_night = regressed(end.verdicts)
    end.verdicts = rule.merge_drift(end.verdicts, found)
    end.tables["regression"] = end.verdicts
    end.manifest_extra["drift"] = {
        "note": note, "failing": [f"{r.stage}/{r.prefix}" for r in failing.itertuples()],
        "drifting": [f"{r.stage}/{r.prefix}" for r in rule.drifted(found).itertuples()]}
    if not failing.empty:
        parts = ([describe(one_night)] if not one_night.empty else []) \
            + [rule.describe_drift(failing)]
        end.extras["failure_message"] = "; ".join(parts)


def _fleet(end: RunEnd) -> None:
    """Write the run's rows of the fleet-wide Parquet view (``<store>/fleet/``)."""
    from prefect_dask_profiling.export.fleet import write_fleet

    manifest, tasks = end.extras.get("_manifest"), end.tables.get("tasks")
    if manifest is not None and tasks is not None:
        end.extras["fleet_location"] = write_fleet(end.store, manifest, tasks)


# The steps after the record is stored, in order. Each one is isolated: add new ones here.
STEPS: list[tuple[str, Step]] = [
    ("spool delivery", _deliver_spool),
    ("lifecycle", _lifecycle),
    ("baseline", _baseline),
    ("verdict", _verdict),
    ("drift", _drift),
    ("diagnosis", _diagnose),
    ("explanation", _explain),
    ("flagged reports", _flagged_reports),
    ("trend", _trend),
]
# Steps that need the completed stored run (e.g. views built from it).
AFTER_STORE: list[tuple[str, Step]] = [("fleet", _fleet)]


def finish_run(store: RunStore, record: RunRecord, ctx: RunContext, stages: list[StageInfo],
               settings: FinishSettings | None = None, *, state: str | None = None,
               error: BaseException | None = None, env: dict[str, Any] | None = None,
               warnings: list[str] | None = None,
               flagged_reports: Callable[[set[str]], list[str]] | None = None) -> FinishResult:
    """Summarise, store, judge and complete one run; never raises for a failing step.

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
    settings
        How the run is judged; default :class:`FinishSettings`.
    state
        The flow's final state (``COMPLETED``, ``FAILED``...); default from ``error`` and the
        verdict.
    error
        The exception the flow body raised, if any: the run is stored but not judged regressed.
    env
        The environment fingerprint; default this process's.
    warnings
        Warnings collected before finishing (stage reports, snapshots...).
    flagged_reports
        Called with the names of the stages that regressed or drifted, once the run is
        judged and before it is completed: renders the reports left for that case (it fills
        the ``report`` of those ``stages``) and returns warnings for the manifest.

    Returns
    -------
    FinishResult
        Its ``status`` is ``unjudged`` when the verdict could not be computed.

    Raises
    ------
    StoreError
        Only when the run id already exists in the store (runs are never overwritten).
    """
    end = RunEnd(store=store, record=record, ctx=ctx, stages=stages,
                 settings=settings or FinishSettings(), state=state, error=error,
                 env=env if env is not None else environment(),
                 warnings=[*(warnings or []), *record.warnings],
                 flagged_reports=flagged_reports)
    _run_step(end, "summary", _summarise)
    first = _write(end, provisional=True)
    with store.remembering_reads():  # the baseline and the drift series share the history
        for name, step in STEPS:
            _run_step(end, name, step)
    if not end.judged:
        end.unjudged_reason = end.unjudged_reason or "the verdict was not computed"
    final = _write(end, provisional=False)
    for name, step in AFTER_STORE:
        _run_step(end, name, step)
    location = final.location or first.location
    manifest = end.extras.pop("_manifest")
    for w in final.warnings:
        logger.warning("dask-profiling: %s", w)
    return FinishResult(
        run_id=ctx.run_id, pipeline=ctx.pipeline, version=ctx.version,
        status=manifest["status"], summary=_or_empty(end.summary),
        utilisation=_or_empty(end.util), verdicts=_verdicts_or_empty(end.verdicts),
        manifest=manifest, location=location, regressed=end.regressed,
        warnings=[*end.warnings, *first.warnings, *final.warnings],
        trend_location=_join(location, "trend.html") if "trend.html" in end.files else None,
        extras=end.extras)


def _summarise(end: RunEnd) -> None:
    end.util = utilisation(end.record)
    _stage_totals(end.stages, end.record, end.util)
    if end.record.incidents:  # workers that died with work on them
        end.manifest_extra["incidents"] = end.record.incidents
    end.summary = summarise(end.record)


def _run_step(end: RunEnd, name: str, step: Step) -> None:
    started = time.perf_counter()
    try:
        step(end)
    except Exception as exc:
        message = f"{name} step failed: {type(exc).__name__}: {exc}"
        end.warnings.append(message)
        if name in ("baseline", "verdict", "summary"):
            end.unjudged_reason = end.unjudged_reason or message
        logger.warning("dask-profiling: %s", message, exc_info=True)
    finally:
        end.step_seconds[name] = time.perf_counter() - started


def _write(end: RunEnd, *, provisional: bool):
    """Store the run: first the record and a provisional manifest, then the rest.

    Both writes spool when the store does not answer. The provisional write raises
    ``StoreError`` only when the run id is already taken.
    """
    state = end.state
    if state is None:
        fails = end.error is not None or (end.regressed and end.settings.fail_on_regression)
        state = "FAILED" if fails else "COMPLETED"
    if end.record.incomplete and state == "COMPLETED":
        state = "CRASHED"
    judged = end.judged and not provisional
    baseline = end.baseline
    manifest = build_manifest(
        end.ctx, state=state, regressed=end.regressed, judged=judged,
        utilisation=_or_empty(end.util, ["utilisation", "wall_s", "task_s"]),
        stages=end.stages, workers=end.record.n_workers, threads=end.record.threads,
        env=end.env, warnings=list(end.warnings),
        baseline=None if baseline is None else {"runs": baseline.runs,
                                                "version": baseline.version,
                                                "note": baseline.note},
        unjudged_reason=None if judged else (end.unjudged_reason or "verdict pending"))
    manifest.update(end.manifest_extra)
    if end.step_seconds:
        manifest["finish_seconds"] = {k: round(v, 4) for k, v in end.step_seconds.items()}
    end.extras["_manifest"] = manifest
    if provisional:
        end.tables = _record_tables(end)
        return end.store.write_run(end.ctx.pipeline, end.ctx.run_id, end.tables, manifest)
    return end.store.complete_run(end.ctx.pipeline, end.ctx.run_id, end.tables, manifest,
                                  extra_files=end.files)


def _record_tables(end: RunEnd) -> dict[str, pd.DataFrame]:
    record = end.record
    tables: dict[str, pd.DataFrame] = {}
    tables["tasks"] = end.summary if end.summary is not None else record.tasks
    tables["orchestration"] = record.orchestration.drop(
        columns=["first_start", "last_stop"], errors="ignore")
    tables["workers"] = record.workers
    tables["transfers"] = record.transfers
    tables["memory"] = record.memory
    if end.util is not None:
        tables["utilisation"] = end.util.reset_index()
    return tables


def _stage_totals(stages: list[StageInfo], record: RunRecord, util: pd.DataFrame) -> None:
    """Fill each stage's task count, task seconds and wall; add stages only the record knows."""
    by_name = {s.name: s for s in stages}
    memory = stage_memory_info(record)
    for name in record.stages:
        if name not in by_name:
            by_name[name] = StageInfo(name=name)
            stages.append(by_name[name])
    for info in stages:
        t = record.tasks[record.tasks["stage"] == info.name]
        info.tasks = int(t["tasks"].sum())
        info.task_s = float(t["compute_s"].sum())
        info.wall_s = float(util.loc[info.name, "wall_s"]) if info.name in util.index else 0.0
        info.memory = dict(memory[info.name]) if info.name in memory else info.memory
        if info.tasks == 0 and info.note is None:
            info.note = "no tasks ran in this stage"


def _or_empty(frame: pd.DataFrame | None, columns: list[str] | None = None) -> pd.DataFrame:
    return frame if frame is not None else pd.DataFrame(columns=columns or [])


def _verdicts_or_empty(frame: pd.DataFrame | None) -> pd.DataFrame:
    return frame if frame is not None else pd.DataFrame(columns=VERDICT_COLUMNS)


def _join(location: str | None, name: str) -> str | None:
    return None if location is None else location.rstrip("/") + "/" + name
