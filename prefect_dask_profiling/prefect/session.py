"""The flow-side profiling session of one run: plugin, stages, reports, and ``finish()``.

Created by :class:`~prefect_dask_profiling.prefect.runner.ProfiledDaskTaskRunner` when Prefect
enters it in the flow process. Everything here degrades to a warning (and a spool) when
storage or artifacts fail — except the regression verdict, which fails the flow on purpose.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import dask
import distributed

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.environment import environment
from prefect_dask_profiling.finishing import (
    EarlyHistory,
    FinishResult,
    FinishSettings,
    RunEnd,
    complete_run,
    draw_views,
    judge_run,
    read_history_early,
    store_record,
)
from prefect_dask_profiling.prefect import artifacts, reports
from prefect_dask_profiling.prefect.background import Background
from prefect_dask_profiling.prefect.eta import LiveEta
from prefect_dask_profiling.regression.verdict import RegressionDetected
from prefect_dask_profiling.stage import (
    LocalWorkWatch,
    open_stage_name,
    reset_listener,
    set_listener,
)
from prefect_dask_profiling.store.manifest import LocalWork, RunContext, StageInfo
from prefect_dask_profiling.summary.io import io_frame
from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.timing import plugin, storage_io

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger("prefect_dask_profiling")

# the longest the runner's exit waits for the run's views (a few store writes, each bounded by
# the store's own timeout, and one Bokeh page)
VIEWS_TIMEOUT_S = 120.0
FORGOT_FINISH = ("finish() was never called in the flow body: summaries were stored from the "
                 "task runner's exit, but no artifacts were published and no regression verdict "
                 "was applied; decorate the flow function with @profiled or call finish() at "
                 "the end of the flow")


@dataclass
class Stored:
    """A run stored and judged by ``finish()``, before it is published."""

    result: FinishResult
    early_links: dict[str, str]  # report links whose posting started before the judgement
    early: list[artifacts.Posting | None]  # those postings, then the summary's


@dataclass
class OpenStage:
    """A stage block that is open in the flow body."""

    name: str
    window: reports.ReportWindow | None
    futures: list = field(default_factory=list)
    local: LocalWorkWatch | None = None
    io_before: dict[str, Any] | None = None  # storage counters per worker at the start
    alignment: dict[str, Any] | None = None  # chunks against the files' blocks


class Session:
    """Flow-side state of one profiled run."""

    def __init__(self, runner: Any, client: Client, plugin_name: str, scope: str) -> None:
        from prefect_dask_profiling.store.runs import new_run_id

        self.runner = runner
        self.options = runner.profiling
        self.client = client
        self.plugin_name = plugin_name
        self.scope = scope
        self.ctx = RunContext(run_id=new_run_id(), pipeline="", version="")
        self.open_stages: dict[str, OpenStage] = {}
        self.stages: list[StageInfo] = []
        self._stage_by_name: dict[str, StageInfo] = {}  # a name opened again: its entry
        self.warnings: list[str] = []
        self.reports = reports.StageReports(
            client, self.ctx, self.warnings, lambda: self.store, reports.ReportSettings(
                mode=self.options.stage_reports, min_seconds=self.options.report_min_seconds,
                renderer=self.options.report_renderer,
                retention_days=self.options.report_retention_days))
        self.last_snapshot: dict[str, Any] | None = None
        self.io_rows: list[dict[str, Any]] = []  # storage requests per (stage, worker)
        self.storage_counted = False
        self.finished = False
        self.result: FinishResult | None = None
        self._captured = False
        self._checked_workers = False
        self._pricing_checked = False
        self._store = None
        self._store_url: str | None = None
        self._early_history: EarlyHistory | None = None
        self.eta: LiveEta | None = None  # the live ETA, once the history is being read

    # -- start / stop ----------------------------------------------------------------------

    @classmethod
    def start(cls, runner, exit_stack: ExitStack) -> Session:
        """Create the cluster/client, register the plugin, listen to stages."""
        client = runner.client
        scope = "run" if runner.address else "cluster"
        name = plugin.install(client, scope=scope,
                              sample_interval=runner.profiling.sample_interval)
        session = cls(runner, client, name, scope)
        session.storage_counted = storage_io.install(client)
        exit_stack.callback(session.close)  # LIFO: runs before the client closes
        token = set_listener(session)
        exit_stack.callback(_reset_quietly, token)
        if scope == "run":  # graphs from other clients in the flow body belong to this run
            exit_stack.enter_context(dask.annotate(**{plugin.RUN_ANNOTATION: name}))
        return session

    def close(self) -> None:
        """Remove the plugin and the task-stream recorder we caused (before client close);
        wait for the run's views (trend page, fleet rows) still being stored.

        The views are waited for last: the removals are round trips to the scheduler,
        during which the background service draws.
        """
        if self.eta is not None:  # no tick may read the plugin once it is removed
            self.eta.stop(finished=False)
        self.reports.drain()
        try:
            if self.storage_counted and self.scope == "cluster":
                # on a shared cluster (scope "run") it stays: another run may count with it
                storage_io.uninstall(self.client)
            try:
                plugin.uninstall(self.client, self.plugin_name)
                if self.reports.installed_stream:
                    reports.release_task_stream(self.client)
            except Exception:
                logger.debug("dask-profiling cleanup failed", exc_info=True)
        finally:
            self._wait_views()

    @property
    def store(self):
        if self._store is None or self._store_url != self.options.store:
            self._store = self._new_store()
            self._store_url = self.options.store
        return self._store

    def _new_store(self):
        from prefect_dask_profiling.store.runs import RunStore

        return RunStore(self.options.store, self.options.storage_options,
                        timeout=self.options.store_timeout)

    def _settings(self) -> FinishSettings:
        """How the run is judged and kept, from the runner's options."""
        options = self.options
        return FinishSettings(
            threshold=options.threshold, history=options.history,
            check_options=dict(options.check_options),
            report_retention_days=options.report_retention_days,
            spool_budget_s=options.store_timeout,
            fail_on_regression=options.on_regression == "fail", views_in_background=True,
            cost=options.cost, cost_regression=options.cost_regression)

    def _read_history_early(self) -> None:
        """Start reading the run's history while the flow computes (once the pipeline and
        version are known): finish() then judges without waiting for the store."""
        if self._early_history is not None or self.finished or not self._captured:
            return
        try:
            rules = self._settings().rules
            store = self._new_store()  # its own: remembered reads never meet our writes
        except Exception:  # a bad setting is refused at finish(), with its message
            logger.debug("history not read early", exc_info=True)
            return
        self._early_history = read_history_early(
            store, self.ctx, rules,
            submit=lambda read: Background.instance().submit(read, label="history read"))
        self._start_eta()

    def _start_eta(self) -> None:
        """Start the live ETA on the history being read (never fails the run)."""
        try:
            self.eta = LiveEta(self)
            self.eta.start(self._early_history.future)
        except Exception:
            logger.debug("dask-profiling: no live ETA", exc_info=True)
            self.eta = None

    def use_store(self, url: str | None) -> None:
        """Store this run at ``url`` instead of the runner's store (before it finishes)."""
        if url is None or self.finished:
            return
        from prefect_dask_profiling.store.url import check_store_url

        self.options = replace(self.options, store=check_store_url(url))

    # -- flow context and preflight ----------------------------------------------------------

    def capture(self) -> None:
        """Read the flow run's identity (once, from inside the flow run)."""
        if self._captured:
            return
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if ctx is None:
            return
        self._captured = True
        flow, flow_run = ctx.flow, ctx.flow_run
        self.ctx.pipeline = validate_name(self.options.pipeline or flow.name, "pipeline")
        source_hash = _source_hash(flow)
        explicit = flow.version if flow.version and flow.version != source_hash else None
        self.ctx.version = validate_name(self.options.version or explicit or "unversioned",
                                         "version")
        self.ctx.source_hash = source_hash
        if flow_run is not None:
            self.ctx.flow_run_id = str(flow_run.id)
            self.ctx.flow_run_name = flow_run.name
            self.ctx.deployment = str(flow_run.deployment_id) if flow_run.deployment_id else None
            # Prefect's run_count (prefect.runtime.flow_run.run_count): 1, then each retry
            self.ctx.attempt = int(flow_run.run_count) if flow_run.run_count else None

    def preflight(self, read_history: bool = True) -> None:
        """Check (once) that the workers can load what Prefect will send them; start reading
        the run's history (unless ``read_history`` is False: a stage opening starts it once
        its boundary reads are done, so the two do not share the interpreter lock).

        Raises
        ------
        RuntimeError
            Naming the workers and the fix, from the flow body, where it fails the run
            cleanly (a worker that cannot unpickle a task hangs the flow silently).
        """
        self.capture()
        if read_history:
            self._read_history_early()
        if self._checked_workers:
            return
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if ctx is None:
            return
        self._checked_workers = True
        payload = distributed.protocol.pickle.dumps(ctx.flow)

        def can_load(blob: bytes) -> str | None:  # local: travels by value
            import pickle

            try:
                pickle.loads(blob)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return None

        problems = {w: e for w, e in self.client.run(can_load, payload).items() if e}
        if problems:
            detail = "; ".join(f"{w}: {e}" for w, e in sorted(problems.items()))
            raise RuntimeError(
                f"Dask workers cannot load this flow ({detail}). Install the flow's code and "
                "prefect-dask-profiling (same versions as the flow process) on every worker, "
                "or start the workers from a directory/PYTHONPATH where the flow's module "
                "imports.")

    # -- stages ----------------------------------------------------------------------------

    def track(self, future) -> None:
        """Remember a Dask future submitted inside the current stage."""
        name = open_stage_name()
        if name is not None and name in self.open_stages:
            self.open_stages[name].futures.append(future)

    def stage_opened(self, name: str) -> OpenStage:
        """Open a stage's window; a name opened before continues its stage (and report)."""
        try:
            self.preflight(read_history=False)
        except RuntimeError:
            raise
        except Exception:  # identity is best effort; the stage must still open
            logger.debug("capture failed", exc_info=True)
        window = self.reports.opened(name)
        io = _outcome(lambda: storage_io.io_counters(self.client)) \
            if self.storage_counted else None
        local = LocalWorkWatch()
        local.register()
        opened = OpenStage(name=name, window=window, local=local,
                           io_before=self._io_counters(name, io))
        self.open_stages[name] = opened
        self._read_history_early()
        if self.eta is not None:
            self.eta.stage_opened(name)
        return opened

    def _io_counters(self, name: str, read: Any) -> dict[str, Any] | None:
        """The workers' storage counters read at a boundary (None when not counted or
        unreadable: said in a warning)."""
        if read is None:
            return None
        if isinstance(read, BaseException):
            self.warnings.append(f"stage {name!r}: storage requests not read: {read!r}")
            return None
        return read

    def _record_io(self, name: str, token: OpenStage, read: Any) -> None:
        """The stage's storage requests: the counters' change per worker since it opened.

        Counts are per process, so a stage open while another runs (nested, or from
        another thread) shares its requests with it: said in the stage's warning.
        """
        if token.io_before is None:
            return
        after = self._io_counters(name, read)
        if after is None:
            return
        rows = storage_io.stage_deltas(name, token.io_before, after)
        if self.open_stages:
            self.warnings.append(
                f"stage {name!r} overlapped stage(s) {', '.join(sorted(self.open_stages))}: "
                "storage requests are counted per worker process, so overlapping stages "
                "share them")
        self.io_rows.extend(rows)
        try:
            token.alignment = storage_io.check_alignment(self.client, token.io_before, after)
        except Exception as exc:
            self.warnings.append(f"stage {name!r}: chunks not compared with blocks: {exc!r}")

    def stage_closed(self, name: str, token: OpenStage, error: BaseException | None) -> None:
        """Close a stage's window: wait for its futures, snapshot, submit its report.

        A name closed before is the same stage: one manifest entry whose ``windows`` counts
        the openings, one report from its first opening to its last closing.
        """
        if token.local is not None:
            token.local.unregister()
        self.open_stages.pop(name, None)
        if token.futures:
            with self.client.as_current():
                distributed.wait(token.futures)
        snapshot = _outcome(lambda: plugin.snapshot(self.client, self.plugin_name))
        io = _outcome(lambda: storage_io.io_counters(self.client)) \
            if token.io_before is not None else None
        end = self.reports.end(token.window)
        self._record_io(name, token, io)
        info = self._stage_by_name.get(name)
        if info is None:
            info = self._stage_by_name[name] = StageInfo(name=name)
            self.stages.append(info)
        else:
            info.windows += 1
        if token.local is not None:
            self._count_local_work(info, token.local)
        if token.alignment is not None:
            info.chunks_vs_blocks = token.alignment
        if isinstance(snapshot, BaseException):
            self.warnings.append(f"stage {name!r}: snapshot failed: {snapshot!r}")
        else:
            self.last_snapshot = snapshot
            self._check_pricing(snapshot)
        if token.window is not None:
            try:
                self.capture()  # a report is stored under the run's pipeline
            except Exception:
                logger.debug("capture failed", exc_info=True)
            self.reports.closed(info, token.window, end, failed=error is not None)
        if self.eta is not None:
            self.eta.stage_closed(name)

    def _check_pricing(self, snap: dict[str, Any]) -> None:
        """At the first stage: warn (once) about workers ``cost=`` rules do not price and
        rules that match no worker (:meth:`~prefect_dask_profiling.pricing.CostRates.warnings`)."""
        rates = self.options.cost
        if self._pricing_checked or rates is None or not rates.by_attribute:
            return
        self._pricing_checked = True
        workers = [(str(entry.get("name", "")), entry.get("resources"))
                   for entry in snap.get("lifetimes") or []]
        for message in rates.warnings(workers):
            self.warnings.append(message)
            _run_log(logging.WARNING, f"dask-profiling: {message}")

    def _count_local_work(self, info: StageInfo, watch: LocalWorkWatch) -> None:
        """Add the Dask work that ran on local threads in this window to the stage's entry,
        and say so in the flow run's logs (it is not in the profile)."""
        count = watch.count()
        if count.tasks == 0:
            return
        before = info.local_work or LocalWork(tasks=0, seconds=0.0, computes=0)
        info.local_work = LocalWork(tasks=before["tasks"] + count.tasks,
                                    seconds=round(before["seconds"] + count.seconds, 4),
                                    computes=before["computes"] + count.computes)
        self.reports.renote(info)
        _run_log(logging.WARNING, f"dask-profiling: {reports.local_work_text(info)}")

    # -- finish ----------------------------------------------------------------------------

    def finish(self, error: BaseException | None = None, *, state: str | None = None,
               publish: bool = True, extra_warning: str | None = None) -> FinishResult | None:
        """Collect, store, judge and publish the run; idempotent.

        The order is what keeps a regression's failure: the run is stored and judged
        (:mod:`~prefect_dask_profiling.finishing`), then whether the flow fails
        is decided, then the run is published (artifacts, events, report links). A failure
        while publishing is a warning and never drops the failure; a failure before the
        judgement never changes the flow's own outcome (it is logged, ``None`` returned).

        Raises
        ------
        RegressionDetected
            On a regression in ``"fail"`` mode (only when ``error`` is None and ``publish``).
        """
        if self.finished:
            if self._fails(error, publish):
                raise self._regression()
            return self.result
        self.finished = True
        if self.eta is not None:
            self.eta.stop(finished=error is None)
        try:
            stored = self._store_run(error, state, publish, extra_warning)
        except Exception as exc:  # never change the flow's own outcome by our failure
            _run_log(logging.ERROR, f"dask-profiling could not store this run: {exc!r}",
                     exc_info=True)
            return None
        self.result = stored.result
        fails = self._fails(error, publish)  # decided before anything is published
        if fails:
            self._stop_retries()
        try:
            self._publish(stored, publish)
        except Exception as exc:  # a bug while publishing: said, and the verdict stands
            _run_log(logging.WARNING, f"dask-profiling: the run {stored.result.run_id} is "
                     f"stored and judged, but publishing it failed: {exc!r}", exc_info=True)
        if self.result.views:  # after the artifacts (one queue): the runner's exit waits
            self.result.views_pending = Background.instance().submit(
                draw_views, self.result.views, label="the run's views")
        if fails:
            raise self._regression()
        return self.result

    def _eta_lines(self, result: FinishResult) -> list[str]:
        """The live ETA's lines of the run's markdown (none without it)."""
        if self.eta is None:
            return []
        wall = result.manifest.get("wall_s")
        try:  # never costs the run its artifacts
            return self.eta.markdown_lines(float(wall) if isinstance(wall, int | float)
                                           else None)
        except Exception:
            logger.debug("dask-profiling: no ETA lines in the run's markdown", exc_info=True)
            return []

    def _fails(self, error: BaseException | None, publish: bool) -> bool:
        """Whether the stored result fails the flow: a regression, in ``"fail"`` mode, from
        the flow body (``publish``) of a flow that did not raise."""
        return (self.result is not None and self.result.regressed and error is None
                and publish and self.options.on_regression == "fail")

    def _regression(self) -> RegressionDetected:
        return RegressionDetected(self.result.verdicts, self.result.failure_message)

    def _stop_retries(self) -> None:
        """Keep Prefect from retrying the flow run on this regression (unless
        ``retry_on_regression``): a regression is not flaky, and a retry re-runs the whole
        pipeline to regress again.

        Prefect's server turns any Running → Failed of a flow run with retries left into
        ``AwaitingRetry``, whether the flow raised or returned a ``Failed`` state; so the
        run's retries are set to the attempts already made (its ``empirical_policy`` on the
        server), and the Failed state that follows is final. Never raises: when the API
        does not answer, a warning says a retry may follow.
        """
        if self.options.retry_on_regression:
            return
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        run = getattr(ctx, "flow_run", None)
        if run is None or not run.empirical_policy.retries:
            return  # no retries to switch off: no round trip to the API
        try:
            from prefect.client.schemas.objects import FlowRunPolicy

            policy = run.empirical_policy.model_dump()
            made = max(int(run.run_count or 1) - 1, 0)  # the retries already used
            policy["retries"] = policy["max_retries"] = min(policy["retries"], made)
            # at most one client retry when the API is lost (as for the artifacts)
            with artifacts._few_retries(), artifacts._run_client() as client:
                client.update_flow_run(run.id, empirical_policy=FlowRunPolicy(**policy))
            run.empirical_policy.retries = policy["retries"]
        except Exception as exc:
            _run_log(logging.WARNING, "dask-profiling: could not switch off this flow run's "
                     f"retries for the regression ({exc!r}): Prefect may retry it")

    def finish_unattended(self, error: BaseException | None) -> None:
        """From the runner's ``__exit__``: store the summaries, say finish() was missed.

        The flow's final state is read from Prefect (it caught the flow's exception, so
        ``error`` is None for a flow that raised): any state but ``COMPLETED`` stores the
        run ``failed``, never ``regressed``.
        """
        logger.warning("dask-profiling: %s", FORGOT_FINISH)
        self.finish(error, state=self._final_state(error), publish=False,
                    extra_warning=FORGOT_FINISH)

    def _final_state(self, error: BaseException | None) -> str:
        if self.ctx.flow_run_id is None:
            return "FAILED" if error is not None else "UNKNOWN"
        try:
            from prefect.client.orchestration import get_client

            with get_client(sync_client=True) as client:
                run = client.read_flow_run(self.ctx.flow_run_id)
            return run.state.type.value if run.state is not None else "UNKNOWN"
        except Exception:
            return "FAILED" if error is not None else "UNKNOWN"

    def _collect(self) -> RunRecord:
        try:
            snap = plugin.snapshot(self.client, self.plugin_name)
        except Exception as exc:
            if self.last_snapshot is None:
                raise
            self.warnings.append(f"final collection failed ({exc!r}): the summary holds what "
                                 "was collected at the last stage boundary; run incomplete")
            snap = self.last_snapshot
            snap["incomplete"] = True
        workers, threads = plugin.cluster_size(self.client, snap)
        record = RunRecord.from_snapshot(snap, workers=workers, threads=threads)
        record.incomplete = bool(snap.get("incomplete"))
        record.io = io_frame(self.io_rows)
        return record

    def _store_run(self, error: BaseException | None, state: str | None, publish: bool,
                   extra_warning: str | None) -> Stored:
        """Collect, store and judge the run (:func:`store_record`, :func:`judge_run`, the
        flagged stages' reports, :func:`complete_run`); start posting the report links and
        the summary meanwhile. Raises only when the run could not be stored."""
        self.capture()
        if not self.ctx.pipeline:  # no flow context ever seen: name after the runner
            self.ctx.pipeline = self.options.pipeline or "unnamed"
            self.ctx.version = self.options.version or "unversioned"
        record = self._collect()  # first: a failed collection adds its warning to self.warnings
        self.reports.drain()  # the last stage's report was drawn during the collection
        warnings = [*self.warnings, *([extra_warning] if extra_warning else [])]
        settings = self._settings()
        env = environment(self.client) if _alive(self.client) else environment()
        if self.storage_counted and _alive(self.client):
            raster = storage_io.raster_fingerprint(self.client)
            if raster is not None:
                env["raster"] = raster
        # the stored reports' links are posted while the run is judged (auto mode: a
        # flagged stage's report is drawn after the judgement, its link posted with the rest)
        early_links = self.reports.links(self.reports.unposted(self.stages)) if publish else {}
        early = [self._post_links(early_links)]  # and the summary once it is computed
        try:
            end = store_record(self.store, record, self.ctx, self.stages, settings,
                               state=state, error=error, env=env, warnings=warnings,
                               early_history=self._early_history,
                               log_warnings=False)  # logged once each, below, to the run
            if publish and end.summary is not None:
                self._post_summary(end, early)
            judge_run(end)
            end.step("flagged reports", self._draw_flagged)
            result = complete_run(end)
        except BaseException:
            for w in self._wait_early(early):
                logger.warning("dask-profiling: %s", w)
            raise
        return Stored(result=result, early_links=early_links, early=early)

    def _post_summary(self, end: RunEnd, early: list[artifacts.Posting | None]) -> None:
        """Start posting the summary's artifact while the run is judged."""
        try:
            early.append(self._post([artifacts.summary_artifact(
                self.ctx.pipeline, self.ctx.run_id, end.summary)], "summary"))
        except Exception as exc:
            end.warnings.append(f"summary not handed on: {type(exc).__name__}: {exc}")

    def _draw_flagged(self, end: RunEnd) -> None:
        """Draw the reports kept for the stages that regressed or drifted (auto mode), before
        the run is completed, so its manifest lists them."""
        if self.reports.deferred:
            stages = end.flagged_stages
            if stages:
                end.warnings.extend(self.reports.flagged(stages))

    def _publish(self, stored: Stored, publish: bool) -> None:
        """Log the run's warnings; post its artifacts (``publish``) and emit its events.

        Each part is isolated: one that raises is a warning and the others still run.
        """
        result, early_links, early = stored.result, stored.early_links, stored.early
        for w in result.warnings:
            _run_log(logging.WARNING, f"dask-profiling: {w}")
        if not result.judged:
            _run_log(logging.WARNING, f"dask-profiling: run {result.run_id} stored unjudged: "
                     f"{result.manifest.get('unjudged_reason')}")
        problems: list[str] = []
        links = _attempt(lambda: self.reports.links(self.stages), "report links", problems,
                         {})
        trend = _attempt(lambda: self._link(result.trend_location), "trend link", problems)
        posting = None
        if publish:
            def post() -> artifacts.Posting:
                late = self.reports.links(self.reports.unposted(self.stages))  # flagged ones
                late = {k: v for k, v in late.items() if k not in early_links}
                summary_posted = any(p is not None for p in early[1:])
                return artifacts.post([
                    *artifacts.run_artifacts(result, links, trend, summary=not summary_posted,
                                             eta=self._eta_lines(result)),
                    *artifacts.report_link_artifacts(result.pipeline, result.run_id, late)])

            posting = _attempt(post, "artifacts", problems)
        from prefect_dask_profiling.prefect.events import emit_detection_events

        # built while the artifacts are being posted; the flow fails only from a published
        # finish (in the flow body): the runner's exit path runs after its state is final
        _, event_warnings = _attempt(
            lambda: emit_detection_events(
                result, links, trend,
                fail_on_regression=publish and self.options.on_regression == "fail"),
            "events", problems, ([], []))
        posted = [*(_attempt(posting.wait, "artifacts", problems, [])
                    if posting is not None else []),
                  *_attempt(lambda: self._wait_early(early),
                            "early artifacts", problems, [])]
        for w in [*posted, *event_warnings, *problems]:
            logger.warning("dask-profiling: %s", w)

    def _post_links(self, links: dict[str, str]) -> artifacts.Posting | None:
        """Start posting the report links' artifacts (None when there are none)."""
        if not links:
            return None
        return self._post(artifacts.report_link_artifacts(
            self.ctx.pipeline, self.ctx.run_id, links), "report links")

    def _post(self, posted: list[Any], what: str) -> artifacts.Posting | None:
        """Start posting artifacts while the run is judged (None when the posting could
        not start: its warning is kept and the run goes on)."""
        try:
            return artifacts.post(posted)
        except Exception as exc:
            self.warnings.append(f"{what} not posted: {exc!r}")
            return None

    @staticmethod
    def _wait_early(postings: list[artifacts.Posting | None]) -> list[str]:
        return [w for posting in postings if posting is not None for w in posting.wait()]

    def _wait_views(self) -> None:
        """Wait for the views the finished run draws in the background; log what failed
        (the run and its artifacts are stored: a view can be drawn again)."""
        if self.result is None:
            return
        try:
            for w in self.result.wait_views(timeout=VIEWS_TIMEOUT_S):
                _run_log(logging.WARNING, f"dask-profiling: {w}")
        except Exception as exc:
            _run_log(logging.WARNING, f"dask-profiling: the run's views were not stored "
                     f"within {VIEWS_TIMEOUT_S:.0f} s: {exc!r}")

    def _link(self, location: str | None) -> str | None:
        """A presigned link to a stored file on S3 (as for reports), else its location."""
        if not location:
            return None
        return reports.presign(self.store, location, self.options.report_retention_days)


def _attempt(job: Callable[[], Any], what: str, problems: list[str],
             default: Any = None) -> Any:
    """``job()``, or ``default`` with a warning naming ``what`` in ``problems`` (a part of
    publishing that raised: the others still run, the verdict is unchanged)."""
    try:
        return job()
    except Exception as exc:
        logger.debug("dask-profiling: %s failed", what, exc_info=True)
        problems.append(f"{what} not published: {type(exc).__name__}: {exc}")
        return default


def _outcome(read: Callable[[], Any]) -> Any:
    """``read()``, or the exception it raised."""
    try:
        return read()
    except Exception as exc:
        return exc


def _source_hash(flow) -> str | None:
    import inspect

    from prefect.utilities.hashing import file_hash

    try:
        return file_hash(inspect.getsourcefile(inspect.unwrap(flow.fn)))
    except (TypeError, OSError):
        return None


def _alive(client: Client) -> bool:
    try:
        return client.status == "running"
    except Exception:
        return False


def _run_log(level: int, message: str, exc_info: bool = False) -> None:
    """Log to the flow run's logger (shown in the Prefect UI), else to ours."""
    try:
        from prefect.logging import get_run_logger

        run_logger = get_run_logger()
    except Exception:  # outside a run context (e.g. the runner's __exit__)
        run_logger = logger
    run_logger.log(level, message, exc_info=exc_info)


def _reset_quietly(token) -> None:
    try:
        reset_listener(token)
    except ValueError:  # reset from another context: harmless, the var dies with it
        pass

