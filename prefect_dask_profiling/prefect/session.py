"""The flow-side profiling session of one run: identity, preflight, stages, and ``finish()``.

Created by :class:`~prefect_dask_profiling.prefect.runner.ProfiledDaskTaskRunner` when Prefect
enters it in the flow process. ``finish()`` is one straight pipeline: collect → store the
record → judge → complete (:mod:`~prefect_dask_profiling.run.pipeline`) → **the verdict decides
the flow's failure** → publish (:class:`~prefect_dask_profiling.prefect.publish.Publisher`,
the one place that posts to Prefect) → the views, queued on the background service. Everything
degrades to a warning (and a spool) when storage or artifacts fail — except the regression
verdict, which fails the flow on purpose.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import dask

from prefect_dask_profiling.errors import Unpicklable
from prefect_dask_profiling.prefect import flow_run
from prefect_dask_profiling.prefect.publish import Publisher, run_log
from prefect_dask_profiling.regression.verdict import RegressionDetected
from prefect_dask_profiling.reports import stage_reports as reports
from prefect_dask_profiling.run.background import Background
from prefect_dask_profiling.run.live_eta import LiveEta
from prefect_dask_profiling.run.pipeline import (
    EarlyHistory,
    FinishResult,
    complete_run,
    judge_run,
    read_history_early,
    store_record,
)
from prefect_dask_profiling.run.stages import OpenStage, StageBook
from prefect_dask_profiling.stages import reset_listener, set_listener
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.timing import client as timing_client
from prefect_dask_profiling.timing import io_client
from prefect_dask_profiling.timing.scope import RUN_ANNOTATION

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger("prefect_dask_profiling")

FORGOT_FINISH = ("finish() was never called in the flow body: summaries were stored from the "
                 "task runner's exit, but no artifacts were published and no regression verdict "
                 "was applied; decorate the flow function with @profiled or call finish() at "
                 "the end of the flow")


class Session:
    """Flow-side state of one profiled run."""

    def __init__(self, runner: Any, client: Client, plugin_name: str, scope: str) -> None:
        from prefect_dask_profiling.store.runs import new_run_id

        self.runner = runner
        self.options = runner.profiling
        self.client, self.plugin_name, self.scope = client, plugin_name, scope
        self.ctx = RunContext(run_id=new_run_id(), pipeline="", version="")
        self.warnings: list[str] = []
        self.publisher = Publisher(self.ctx, lambda: self.store,
                                   self.options.report_retention_days,
                                   self.options.retry_on_regression, self.options.otel)
        self.reports = reports.StageReports(
            client, plugin_name, self.ctx, self.warnings, lambda: self.store, self.publisher,
            submit=Background.instance().submit, mode=self.options.stage_reports,
            min_seconds=self.options.report_min_seconds)
        self.book = StageBook(client, plugin_name, self.warnings, self.reports,
                              self.options.cost, log=run_log)
        self.stages, self.io = self.book.stages, self.book.io
        self.finished = False
        self.result: FinishResult | None = None
        self._captured = self._checked_workers = False
        # what preflight found unpicklable in the flow, and the tasks already checked
        self.unpicklable: flow_run.Held | None = None
        self._shipped_tasks: set[int] = set()
        self._store = self._store_url = None
        self._early_history: EarlyHistory | None = None
        self.eta: LiveEta | None = None  # the live ETA, once the history is being read

    # -- start / stop ----------------------------------------------------------------------

    @classmethod
    def start(cls, runner, exit_stack: ExitStack) -> Session:
        """Create the cluster/client, register the plugin, listen to stages."""
        client = runner.client
        scope = "run" if runner.address else "cluster"
        name = timing_client.install(client, scope=scope,
                                     sample_interval=runner.profiling.sample_interval,
                                     task_records=bool(runner.profiling.stage_reports))
        session = cls(runner, client, name, scope)
        session.io.counted = io_client.install(client)
        exit_stack.callback(session.close)  # LIFO: runs before the client closes
        token = set_listener(session)
        exit_stack.callback(_reset_quietly, token)
        if scope == "run":  # graphs from other clients in the flow body belong to this run
            exit_stack.enter_context(dask.annotate(**{RUN_ANNOTATION: name}))
        return session

    def close(self) -> None:
        """Remove the plugin (its task records with it; before client close);
        wait for the run's views (trend page, fleet rows) still being stored, last: the
        removals are round trips to the scheduler, during which the background draws."""
        if self.eta is not None:  # no tick may read the plugin once it is removed
            self.eta.stop(finished=False)
        self.reports.drain()
        try:
            if self.io.counted and self.scope == "cluster":
                # on a shared cluster (scope "run") it stays: another run may count with it
                io_client.uninstall(self.client)
            try:
                timing_client.uninstall(self.client, self.plugin_name)
            except Exception:
                logger.debug("dask-profiling cleanup failed", exc_info=True)
        finally:
            self.publisher.wait_views()

    @property
    def store(self):
        if self._store is None or self._store_url != self.options.store:
            self._store, self._store_url = self._new_store(), self.options.store
        return self._store

    def _new_store(self):
        from prefect_dask_profiling.store.runs import RunStore

        return RunStore(self.options.store, self.options.storage_options,
                        timeout=self.options.store_timeout)

    def _read_history_early(self) -> None:
        """Start reading the run's history while the flow computes (once the pipeline and
        version are known), and the live ETA on it: finish() then judges without waiting."""
        if self._early_history is not None or self.finished or not self._captured:
            return
        try:
            store = self._new_store()  # its own: remembered reads never meet our writes
        except Exception:  # a bad setting is refused at finish(), with its message
            logger.debug("history not read early", exc_info=True)
            return
        self._early_history = read_history_early(
            store, self.ctx, self.options.rules,
            submit=lambda read: Background.instance().submit(read, label="history read"))
        try:  # never fails the run; its news goes through the publisher
            self.eta = LiveEta(self.ctx, lambda: self.options, self.publisher,
                               lambda: timing_client.task_counts(self.client, self.plugin_name))
            self.eta.start(self._early_history.future, flow_run.scheduled_start())
        except Exception:
            logger.debug("dask-profiling: no live ETA", exc_info=True)
            self.eta = None

    def use_store(self, url: str | None) -> None:
        """Store this run at ``url`` instead of the runner's store (before it finishes)."""
        if url is None or self.finished:
            return
        from prefect_dask_profiling.store.url import check_store_url

        self.options = self.options.evolve(store=check_store_url(url))

    # -- flow context and preflight ----------------------------------------------------------

    def capture(self) -> None:
        """Read the flow run's identity (once, from inside the flow run)."""
        from prefect.context import FlowRunContext

        if self._captured or FlowRunContext.get() is None:
            return
        self._captured = True
        flow_run.read_identity(self.ctx, self.options.pipeline, self.options.version)

    def preflight(self, read_history: bool = True) -> None:
        """Check (once) that the workers can load what Prefect will send them; start reading
        the run's history (unless ``read_history`` is False: a stage opening starts it once
        its boundary reads are done, so the two do not share the interpreter lock).

        A flow that cannot be pickled is a warning here, naming the object: its Dask work
        may run only in its body, where nothing is sent. :meth:`check_travels` raises it at
        the first task submitted.

        Raises
        ------
        WorkersCannotLoad
            From :func:`~.flow_run.check_workers_load`, in the flow body, where it fails the
            run cleanly.
        """
        from prefect.context import FlowRunContext

        self.capture()
        if read_history:
            self._read_history_early()
        if not self._checked_workers and FlowRunContext.get() is not None:
            self._checked_workers = True  # once, also when it raises
            self.unpicklable = flow_run.check_workers_load(self.client)
            if self.unpicklable is not None:
                logger.warning("dask-profiling: %s Nothing needs it while the flow's Dask "
                               "work runs in its body; a Prefect task submitted from it "
                               "fails.", self.unpicklable.message("This flow"))

    def check_travels(self, task: Any) -> None:
        """Before Prefect sends ``task`` to the workers: the flow and the task can travel.

        Raises
        ------
        Unpicklable
            Naming the object that cannot be pickled, what holds it, and the fix.
        """
        if self.unpicklable is not None:
            raise Unpicklable(self.unpicklable.message(
                f"Task {getattr(task, 'name', task)!r} needs this flow, which"))
        if id(task) not in self._shipped_tasks:
            flow_run.check_task_pickles(task)
            self._shipped_tasks.add(id(task))

    # -- stages ----------------------------------------------------------------------------

    def track(self, future) -> None:
        """Remember a Dask future submitted inside the current stage."""
        self.book.track(future)

    def stage_opened(self, name: str) -> OpenStage:
        """Open a stage's window; a name opened before continues its stage (and report)."""
        try:
            self.preflight(read_history=False)
        except RuntimeError:
            raise
        except Exception:  # identity is best effort; the stage must still open
            logger.debug("capture failed", exc_info=True)
        opened = self.book.opened(name, self.reports.opened(name))
        self._read_history_early()
        if self.eta is not None:
            self.eta.stage_opened(name)
        return opened

    def stage_closed(self, name: str, token: OpenStage, error: BaseException | None) -> None:
        """Close a stage's window: its entry (:meth:`StageBook.closed`), then its report is
        drawn in the background. A name closed before is the same stage: one manifest entry
        whose ``windows`` counts the openings, one report from its first opening to its last
        closing."""
        info, end = self.book.closed(name, token)
        if token.window is not None:
            try:
                self.capture()  # a report is stored under the run's pipeline
            except Exception:
                logger.debug("capture failed", exc_info=True)
            self.reports.closed(info, token.window, end, failed=error is not None)
        if self.eta is not None:  # the counts the close read: no second round trip
            self.eta.stage_closed(name, self.book.last_counts)

    # -- finish ----------------------------------------------------------------------------

    def finish(self, error: BaseException | None = None, *, state: str | None = None,
               publish: bool = True, extra_warning: str | None = None) -> FinishResult | None:
        """Collect, store, judge and publish the run; idempotent.

        In order: the run is stored and judged (:meth:`_store_run`), whether the flow fails
        is decided, then the publisher posts it (artifacts, events, report links) and queues
        its views. A failure while publishing is a warning and never drops the failure; a
        failure before the judgement never changes the flow's own outcome (logged, ``None``).

        Raises
        ------
        RegressionDetected
            On a regression in ``"fail"`` mode (only when ``error`` is None and ``publish``).
        """
        if self.finished:
            if self._fails(error, publish):
                raise RegressionDetected(self.result.verdicts, self.result.failure_message)
            return self.result
        self.finished = True
        if self.eta is not None:
            self.eta.stop(finished=error is None and state in (None, "COMPLETED"))
        try:
            self.result = result = self._store_run(error, state, publish, extra_warning)
        except Exception as exc:  # never change the flow's own outcome by our failure
            self.publisher.abandon()
            run_log(logging.ERROR, f"dask-profiling could not store this run: {exc!r}",
                    exc_info=True)
            return None
        fails = self._fails(error, publish)  # decided before anything is published
        if fails:
            self.publisher.stop_retries()
        try:
            self.publisher.publish(
                result, self.stages, post=publish,
                eta=self.eta.forecast if self.eta is not None else None,
                fail_on_regression=publish and self.options.on_regression == "fail")
        except Exception as exc:  # a bug while publishing: said, and the verdict stands
            run_log(logging.WARNING, f"dask-profiling: the run {result.run_id} is stored "
                    f"and judged, but publishing it failed: {exc!r}", exc_info=True)
        self.publisher.views(result)  # after the artifacts (one queue): the exit waits
        if fails:
            raise RegressionDetected(result.verdicts, result.failure_message)
        return result

    def _fails(self, error: BaseException | None, publish: bool) -> bool:
        """Whether the stored result fails the flow: a regression, in ``"fail"`` mode, from
        the flow body (``publish``) of a flow that did not raise."""
        return (self.result is not None and self.result.regressed and error is None
                and publish and self.options.on_regression == "fail")

    def finish_unattended(self, error: BaseException | None) -> None:
        """From the runner's ``__exit__``: store the summaries, say finish() was missed.

        The flow's final state is read from Prefect (it caught the flow's exception, so
        ``error`` is None for a flow that raised): any state but ``COMPLETED`` stores the
        run ``failed``, never ``regressed``.
        """
        logger.warning("dask-profiling: %s", FORGOT_FINISH)
        self.finish(error, state=flow_run.final_state(self.ctx.flow_run_id, error),
                    publish=False, extra_warning=FORGOT_FINISH)

    def _store_run(self, error: BaseException | None, state: str | None, publish: bool,
                   extra_warning: str | None) -> FinishResult:
        """Collect, then the three seams of :mod:`~prefect_dask_profiling.run.pipeline`: store
        the record, judge it (then draw the flagged stages' reports, so the final manifest
        lists them), complete it. The publisher starts posting the report links and the
        summary meanwhile (neither depends on the verdict). Raises only when the run could
        not be stored."""
        self.capture()
        if not self.ctx.pipeline:  # no flow context ever seen: name after the runner
            self.ctx.pipeline = self.options.pipeline or "unnamed"
            self.ctx.version = self.options.version or "unversioned"
        record = self.book.record()  # first: a failed collection adds its warning
        self.reports.drain()  # the last stage's report was drawn during the collection
        if publish:
            self.publisher.begin(self.stages, self.warnings)
        env = self.book.environment()
        end = store_record(self.store, record, self.ctx, self.stages, self.options,
                           state=state, error=error, env=env,
                           warnings=[*self.warnings, *([extra_warning] if extra_warning else [])],
                           early_history=self._early_history,
                           log_warnings=False)  # logged once each, by the publisher
        if publish and end.summary is not None:
            self.publisher.summary(end.summary, end.warnings)
        judge_run(end)
        end.step("flagged reports", lambda e: e.warnings.extend(  # "auto": their reports
            self.reports.flagged(e.flagged_stages)
            if self.reports.deferred and e.flagged_stages else []))
        return complete_run(end)


def _reset_quietly(token) -> None:
    try:
        reset_listener(token)
    except ValueError:  # reset from another context: harmless, the var dies with it
        pass
