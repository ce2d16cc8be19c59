"""Everything a profiled run posts to Prefect, in one place: :class:`Publisher`.

The session calls it at four moments (docs/architecture.md): a stage's report stored and
the live ETA's news (it is the :class:`~prefect_dask_profiling.forecast.live.EtaSink`); the
run being judged (:meth:`Publisher.begin`, :meth:`Publisher.summary`); after the verdict,
:meth:`Publisher.stop_retries`; then :meth:`Publisher.publish` and :meth:`Publisher.views`.
Every part is isolated: one that raises is a warning, and the verdict never changes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from prefect_dask_profiling._util import artifact_key
from prefect_dask_profiling.otel import prepare_metrics, prepare_spans
from prefect_dask_profiling.prefect import artifacts
from prefect_dask_profiling.reports import stage_reports as reports
from prefect_dask_profiling.run.background import Background
from prefect_dask_profiling.run.pipeline import draw_views

if TYPE_CHECKING:
    from uuid import UUID

    from prefect_dask_profiling.forecast.live import RiskNews
    from prefect_dask_profiling.run.pipeline import FinishResult
    from prefect_dask_profiling.store.manifest import RunContext, StageInfo
    from prefect_dask_profiling.store.runs import RunStore

logger = logging.getLogger("prefect_dask_profiling")

#: The longest the runner's exit waits for the run's views (a few store writes, each bounded
#: by the store's own timeout, and one Bokeh page).
VIEWS_TIMEOUT_S = 120.0
#: The longest the runner's exit waits for the run's spans: the budget for starting them
#: (:data:`~prefect_dask_profiling.otel.EMIT_BUDGET_S`) and one synchronous export.
SPANS_TIMEOUT_S = 30.0

T = TypeVar("T")


class EtaLines(Protocol):
    """The live forecast (:class:`~prefect_dask_profiling.forecast.live.LiveForecast`), as
    the run's markdown reads it."""

    def markdown_lines(self, actual_s: float | None = None) -> list[str]: ...


class Publisher:
    """The Prefect side of one run: artifacts, report links, events, retries, views.

    Parameters
    ----------
    ctx
        The run's identity (filled in by the session as the flow run is read).
    store
        The run's store, when a link is presigned (the session may switch stores).
    retention_days
        How long the presigned links stay valid (the reports' retention).
    retry_on_regression
        ``True``: a regression fails the attempt and Prefect may retry it
        (:meth:`stop_retries` does nothing).
    otel
        ``"auto"``: the run's stages become spans under the flow-run span when an
        OpenTelemetry SDK is configured (:mod:`prefect_dask_profiling.otel`); ``"off"``: never.
    """

    def __init__(self, ctx: RunContext, store: Callable[[], RunStore], retention_days: int,
                 retry_on_regression: bool = False, otel: str = "auto") -> None:
        self.ctx = ctx
        self.otel = otel
        self._store = store
        self.retention_days = retention_days
        self.retry_on_regression = retry_on_regression
        self._posted: dict[str, str] = {}  # stage -> the report location its link points to
        self._early: list[artifacts.Posting] = []  # started while the run is judged
        self._early_links: dict[str, str] = {}
        self._summary_posted = False
        self._views: Any = None  # the views' future (Future[list[str]])
        self._spans: Any = None  # the spans' future (Future[None])
        self._progress: UUID | None = None  # the live ETA's progress artifact
        self.eta_events: list[Any] = []  # the live ETA's events emitted

    # -- links ------------------------------------------------------------------------------

    def links(self, infos: list[StageInfo]) -> dict[str, str]:
        """Links to the stored reports of ``infos`` (presigned on S3), by stage name."""
        links = {}
        for info in infos:
            location = (info.report or {}).get("location")
            if location:
                links[info.name] = self.link(location)
        return links

    def link(self, location: str | None) -> str | None:
        """A presigned link to a stored file on S3 (as for reports), else its location."""
        if not location:
            return None
        return reports.presign(self._store(), location, self.retention_days)

    def unposted(self, infos: list[StageInfo]) -> list[StageInfo]:
        """The stages of ``infos`` whose stored report's link has not been posted."""
        return [info for info in infos
                if (info.report or {}).get("location") != self._posted.get(info.name)]

    # -- 1. during the run ------------------------------------------------------------------

    def report_stored(self, info: StageInfo) -> None:
        """Post the link artifact of a report just stored (only in a flow run; from the
        background service: created here, not queued behind this job); one not posted is
        left to the run's artifacts (:meth:`unposted`)."""
        if self.ctx.flow_run_id is None:
            return
        try:
            problems = artifacts.create(artifacts.report_link_artifacts(
                self.ctx.pipeline, self.ctx.run_id, self.links([info])))
        except Exception as exc:
            problems = [f"report link not posted: {exc!r}"]
        if problems:
            for w in problems:
                logger.warning("dask-profiling: %s", w)
            return
        self._posted[info.name] = info.report["location"]

    # the live ETA's news (forecast.live.EtaSink), from its background jobs

    def progress(self, percent: float, text: str) -> None:
        """Create or move the live ETA's progress artifact
        (``dask-profiling-eta-<pipeline>``) to ``percent``, ``text`` its description."""
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        with artifacts._few_retries():
            if self._progress is None:
                self._progress = create_progress_artifact(
                    percent, key=artifact_key("dask-profiling-eta", self.ctx.pipeline),
                    description=text)
            else:
                update_progress_artifact(self._progress, percent, description=text)

    def risk(self, news: RiskNews) -> None:
        """Emit the live ETA's deadline news (at-risk, on-track, late) about the flow run
        and log its line (nothing outside a flow run)."""
        if not self.ctx.flow_run_id:
            return
        from prefect_dask_profiling.prefect.events import emit_eta_event

        event = emit_eta_event(self.ctx, news)
        if event is not None:
            self.eta_events.append(event)
        run_log(logging.WARNING if news.kind != "on-track" else logging.INFO, news.line)

    def say(self, level: int, message: str) -> None:
        """A line of the live ETA for the flow run's log."""
        run_log(level, message)

    # -- 2. while the run is judged -----------------------------------------------------------

    def begin(self, stages: list[StageInfo], warnings: list[str]) -> None:
        """Start posting the links of the reports stored but not posted yet (a failure to
        start is kept in ``warnings``)."""
        try:
            self._early_links = self.links(self.unposted(stages))
        except Exception as exc:  # left to the run's artifacts
            warnings.append(f"report links not posted: {exc!r}")
            return
        if self._early_links:
            self._start(artifacts.report_link_artifacts(
                self.ctx.pipeline, self.ctx.run_id, self._early_links), "report links",
                warnings)

    def summary(self, summary: Any, warnings: list[str]) -> None:
        """Start posting the summary table (``summary``: the per-prefix frame), known
        before the judgement."""
        try:
            posted = [artifacts.summary_artifact(self.ctx.pipeline, self.ctx.run_id, summary)]
        except Exception as exc:
            warnings.append(f"summary not handed on: {type(exc).__name__}: {exc}")
            return
        self._summary_posted = self._start(posted, "summary", warnings)

    def _start(self, posted: list[Any], what: str, warnings: list[str]) -> bool:
        try:
            self._early.append(artifacts.post(posted))
        except Exception as exc:
            warnings.append(f"{what} not posted: {exc!r}")
            return False
        return True

    def abandon(self) -> None:
        """The run could not be stored: wait for what started posting, log its warnings."""
        for w in self._wait_early():
            logger.warning("dask-profiling: %s", w)

    def _wait_early(self) -> list[str]:
        early, self._early = self._early, []
        return [w for posting in early for w in posting.wait()]

    # -- 3. after the verdict -----------------------------------------------------------------

    def stop_retries(self) -> None:
        """Keep Prefect from retrying the flow run on this regression (unless
        ``retry_on_regression``): a regression is not flaky, and a retry re-runs the whole
        pipeline to regress again.

        Prefect's server turns any Running → Failed of a flow run with retries left into
        ``AwaitingRetry``, whether the flow raised or returned a ``Failed`` state; so the
        run's retries are set to the attempts already made (its ``empirical_policy`` on the
        server), and the Failed state that follows is final. Never raises: when the API
        does not answer, a warning says a retry may follow.
        """
        if self.retry_on_regression:
            return
        from prefect.context import FlowRunContext

        run = getattr(FlowRunContext.get(), "flow_run", None)
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
            run_log(logging.WARNING, "dask-profiling: could not switch off this flow run's "
                    f"retries for the regression ({exc!r}): Prefect may retry it")

    # -- 4. the run's artifacts, events and views ---------------------------------------------

    def publish(self, result: FinishResult, stages: list[StageInfo], *, post: bool,
                fail_on_regression: bool, eta: EtaLines | None = None) -> None:
        """Log the run's warnings; post its artifacts (``post``) and emit its events.

        Each part is isolated: one that raises is a warning and the others still run.
        ``fail_on_regression``: the events say the flow fails (only from a published
        finish, in the flow body); ``eta``: the live ETA (its lines in the run's markdown).
        """
        for w in result.warnings:
            run_log(logging.WARNING, f"dask-profiling: {w}")
        if not result.judged:
            run_log(logging.WARNING, f"dask-profiling: run {result.run_id} stored unjudged: "
                    f"{result.manifest.get('unjudged_reason')}")
        problems: list[str] = []
        links = _attempt(lambda: self.links(stages), "report links", problems, {})
        trend = _attempt(lambda: self.link(result.trend_location), "trend link", problems,
                         None)
        posting = None
        if post:
            def start() -> artifacts.Posting:
                late = self.links(self.unposted(stages))  # the flagged stages' reports
                late = {k: v for k, v in late.items() if k not in self._early_links}
                return artifacts.post([
                    *artifacts.run_artifacts(result, links, trend,
                                             summary=not self._summary_posted,
                                             eta=_eta_lines(eta, result)),
                    *artifacts.report_link_artifacts(result.pipeline, result.run_id, late)])

            posting = _attempt(start, "artifacts", problems, None)
        from prefect_dask_profiling.prefect.events import (
            emit_detection_events,
            emit_unjudged_event,
        )

        # built while the artifacts are being posted
        _, event_warnings = _attempt(
            lambda: emit_detection_events(result, links, trend,
                                          fail_on_regression=fail_on_regression),
            "events", problems, ([], []))
        event_warnings = [*event_warnings, *_attempt(lambda: emit_unjudged_event(result),
                                                     "events", problems, ([], []))[1]]
        posted = [*(_attempt(posting.wait, "artifacts", problems, [])
                    if posting is not None else []),
                  *_attempt(self._wait_early, "early artifacts", problems, [])]
        # last: the stages as spans under the flow-run span, made off the flow's path
        _attempt(lambda: self.spans(result, links, trend), "OpenTelemetry spans", problems,
                 None)
        for w in [*posted, *event_warnings, *problems]:
            logger.warning("dask-profiling: %s", w)

    def spans(self, result: FinishResult, links: dict[str, str], trend: str | None) -> None:
        """Queue the run's spans and metrics on the background service when OpenTelemetry
        is configured (:func:`~prefect_dask_profiling.otel.prepare_spans`,
        :func:`~prefect_dask_profiling.otel.prepare_metrics`: nothing is built otherwise);
        one warning at most is logged. The runner's exit waits for them
        (:meth:`wait_views`)."""
        problems: list[str] = []  # a bug building one leaves the other
        jobs = [job for job in (
            _attempt(lambda: prepare_spans(result, links, trend, mode=self.otel),
                     "OpenTelemetry spans", problems, None),
            _attempt(lambda: prepare_metrics(result, mode=self.otel),
                     "OpenTelemetry metrics", problems, None)) if job is not None]
        for w in problems[:1]:
            logger.warning("dask-profiling: %s", w)
        if not jobs:
            return

        self._spans = Background.instance().post(SpansJob(jobs))

    def views(self, result: FinishResult) -> None:
        """Queue the run's views (trend page, fleet rows) on the background service, after
        its artifacts (one queue); :meth:`wait_views` waits for them."""
        if result.views:
            self._views = result.views_pending = Background.instance().post(
                ViewsJob(result.views))

    def wait_views(self) -> None:
        """Wait for the views being drawn; log what failed (the run and its artifacts are
        stored: a view can be drawn again). The run's spans first, if any (:meth:`spans`)."""
        if self._spans is not None:
            try:
                self._spans.result(timeout=SPANS_TIMEOUT_S)
            except Exception as exc:
                run_log(logging.WARNING, f"dask-profiling: the run's OpenTelemetry spans were "
                        f"not made within {SPANS_TIMEOUT_S:.0f} s: {exc!r}")
        if self._views is None:
            return
        try:
            for w in self._views.result(timeout=VIEWS_TIMEOUT_S):
                run_log(logging.WARNING, f"dask-profiling: {w}")
        except Exception as exc:
            run_log(logging.WARNING, f"dask-profiling: the run's views were not stored "
                    f"within {VIEWS_TIMEOUT_S:.0f} s: {exc!r}")


@dataclass
class SpansJob:
    """Make the run's spans and metrics (``makers``: prepared, each returning its
    warnings); the first warning is logged."""

    makers: list[Callable[[], list[str]]]
    label: ClassVar[str] = "the run's spans"

    def run(self) -> None:
        for w in [w for make in self.makers for w in make()][:1]:
            run_log(logging.WARNING, f"dask-profiling: {w}")


@dataclass
class ViewsJob:
    """Draw and store the run's views (trend page, fleet rows); their warnings."""

    views: Any
    label: ClassVar[str] = "the run's views"

    def run(self) -> list[str]:
        return draw_views(self.views)


def _eta_lines(eta: EtaLines | None, result: FinishResult) -> list[str]:
    """The live ETA's lines of the run's markdown (none without it; never raises)."""
    wall = result.manifest.get("wall_s")
    try:  # never costs the run its artifacts
        return [] if eta is None else eta.markdown_lines(
            float(wall) if isinstance(wall, int | float) else None)
    except Exception:
        logger.debug("dask-profiling: no ETA lines in the run's markdown", exc_info=True)
        return []


def _attempt(job: Callable[[], T], what: str, problems: list[str], default: T) -> T:
    """``job()``, or ``default`` with a warning naming ``what`` in ``problems`` (a part of
    publishing that raised: the others still run, the verdict is unchanged)."""
    try:
        return job()
    except Exception as exc:
        logger.debug("dask-profiling: %s failed", what, exc_info=True)
        problems.append(f"{what} not published: {type(exc).__name__}: {exc}")
        return default


def run_log(level: int, message: str, exc_info: bool = False) -> None:
    """Log to the flow run's logger (shown in the Prefect UI), else to ours."""
    try:
        from prefect.logging import get_run_logger

        run_logger = get_run_logger()
    except Exception:  # outside a run context (e.g. the runner's __exit__)
        run_logger = logger
    run_logger.log(level, message, exc_info=exc_info)
