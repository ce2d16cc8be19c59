"""A finished run's stages as OpenTelemetry spans, made after the fact from stored figures.

With a real SDK ``TracerProvider`` in the flow process, :func:`prepare_spans` (in the flow:
it reads the current span) returns a job that makes one span per stage, an event per top
prefix (:data:`MAX_PREFIXES`) and one span of the run, off the flow's path and within
:data:`EMIT_BUDGET_S`; without one it costs one ``isinstance``. Whatever goes wrong is one
warning. Only ``opentelemetry-api`` is imported (docs/observability.md)."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_dask_profiling.run.pipeline import FinishResult

logger = logging.getLogger("prefect_dask_profiling")

#: The attribute namespace (docs/observability.md lists every attribute).
NS = "dask_profiling"
#: The most prefixes per stage made into span events (the largest by compute seconds).
MAX_PREFIXES = 20
#: The most seconds spent starting spans (a processor exporting synchronously, to a
#: collector that is down, makes each span slow); the spans left are not made.
EMIT_BUDGET_S = 3.0
TRACER_NAME = "prefect_dask_profiling"
#: The most prefixes per stage with metric points of their own; the rest fold into "other".
MAX_METRIC_PREFIXES = 20
OTHER = "other"

Attributes = dict[str, str | bool | int | float]


def tracing_configured() -> bool:
    """Whether a real ``TracerProvider`` is set: not the API's no-op or proxy default.

    The whole cost of this module when OpenTelemetry is not configured.
    """
    try:
        from opentelemetry import trace
    except ImportError:  # the package runs without Prefect's dependencies too
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.NoOpTracerProvider | trace.ProxyTracerProvider)


def metrics_configured() -> bool:
    """Whether a real ``MeterProvider`` is set: not the API's no-op or proxy default."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return False
    return not type(metrics.get_meter_provider()).__module__.startswith("opentelemetry.metrics")


@dataclass(frozen=True)
class MetricPoint:
    """One figure of the night as an OTLP gauge point: the instrument, its unit, the value
    and its attributes (pipeline, version, stage and, per prefix, prefix: nothing else)."""

    instrument: str
    unit: str
    value: float
    attributes: dict[str, str]


#: The gauges a run records once at its end: name -> (unit, description).
INSTRUMENTS = {
    f"{NS}.stage.wall_time": ("s", "a stage's wall seconds"),
    f"{NS}.stage.utilisation": ("1", "a stage's compute seconds over its thread-seconds"),
    f"{NS}.stage.memory.peak": ("By", "the largest worker process memory while a stage ran"),
    f"{NS}.stage.idle_worker_hours": ("h", "worker-hours allocated that no task used"),
    f"{NS}.stage.storage.requests": ("{request}", "GDAL/s3fs storage requests of a stage"),
    f"{NS}.prefix.compute_time": ("s", "task compute seconds of a prefix in a stage"),
}


def metric_points(result: FinishResult) -> list[MetricPoint]:
    """The night's figures as gauge points (pure): per stage its wall time, utilisation,
    peak memory, idle worker-hours and storage requests (each where recorded); per prefix
    its compute seconds, the :data:`MAX_METRIC_PREFIXES` largest of each stage with the
    rest summed into ``"other"`` (bounded cardinality)."""
    points: list[MetricPoint] = []
    for info in result.manifest.get("stages") or []:
        name = str(info["name"])
        attrs = {f"{NS}.pipeline": result.pipeline, f"{NS}.version": result.version,
                 f"{NS}.stage": name}
        figures = stage_attributes(result, info)
        for instrument, key in ((f"{NS}.stage.wall_time", f"{NS}.wall_s"),
                                (f"{NS}.stage.utilisation", f"{NS}.utilisation"),
                                (f"{NS}.stage.memory.peak", f"{NS}.memory.peak_bytes"),
                                (f"{NS}.stage.idle_worker_hours", f"{NS}.idle_worker_hours"),
                                (f"{NS}.stage.storage.requests", f"{NS}.storage.requests")):
            value = figures.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                points.append(MetricPoint(instrument, INSTRUMENTS[instrument][0],
                                          float(value), attrs))
        points += _prefix_points(result, name, attrs)
    return points


def _prefix_points(result: FinishResult, stage: str,
                   attrs: dict[str, str]) -> list[MetricPoint]:
    frame = result.summary
    if frame is None or frame.empty or "stage" not in frame:
        return []
    seconds = frame[frame["stage"] == stage].groupby("prefix")["total_s"].sum()
    seconds = seconds.sort_values(ascending=False)
    kept = seconds.head(MAX_METRIC_PREFIXES)
    folded = float(seconds.iloc[MAX_METRIC_PREFIXES:].sum())
    unit = INSTRUMENTS[f"{NS}.prefix.compute_time"][0]
    points = [MetricPoint(f"{NS}.prefix.compute_time", unit, float(value),
                          {**attrs, f"{NS}.prefix": str(prefix)})
              for prefix, value in kept.items()]
    if len(seconds) > MAX_METRIC_PREFIXES:
        points.append(MetricPoint(f"{NS}.prefix.compute_time", unit, folded,
                                  {**attrs, f"{NS}.prefix": OTHER}))
    return points


def record_metrics(points: list[MetricPoint], budget_s: float = EMIT_BUDGET_S) -> list[str]:
    """Record ``points`` on the configured ``MeterProvider`` and push them once (a flush
    bounded by ``budget_s``: a batch cluster is gone before anything could scrape it).
    Returns the warnings (at most one); never raises."""
    try:
        from opentelemetry import metrics

        meter = metrics.get_meter(TRACER_NAME)
        gauges = {name: meter.create_gauge(name, unit=unit, description=text)
                  for name, (unit, text) in INSTRUMENTS.items()}
        for point in points:
            gauges[point.instrument].set(point.value, attributes=point.attributes)
        flush = getattr(metrics.get_meter_provider(), "force_flush", None)
        if flush is not None and flush(timeout_millis=budget_s * 1000) is False:
            return [f"OpenTelemetry metrics not pushed within {budget_s:.0f} s"]
    except Exception as exc:  # the user's reader or exporter, or a bug here
        logger.debug("dask-profiling: metrics not recorded", exc_info=True)
        return [f"OpenTelemetry metrics not recorded: {type(exc).__name__}: {exc}"]
    return []


def prepare_metrics(result: FinishResult, *, mode: str = "auto",
                    budget_s: float = EMIT_BUDGET_S) -> Callable[[], list[str]] | None:
    """The job that records and pushes the night's figures as OTLP metrics, or ``None``
    (nothing built) when ``mode`` is ``"off"`` or no ``MeterProvider`` is configured."""
    if mode == "off" or not metrics_configured():
        return None
    return functools.partial(record_metrics, metric_points(result), budget_s)


@dataclass(frozen=True)
class PrefixEvent:
    """One prefix of a stage, as a span event."""

    prefix: str
    attributes: Attributes


@dataclass(frozen=True)
class StageSpan:
    """One stage as a span: its window (ns since the epoch), attributes, prefix events and,
    when it counted in the run's regression, the explanation (status ERROR)."""

    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes
    prefixes: list[PrefixEvent] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class RunSpan:
    """The run's own span: its window, verdict and report links."""

    start_ns: int
    end_ns: int
    attributes: Attributes


@dataclass(frozen=True)
class TracePlan:
    """Everything :func:`emit_run_spans` makes, built from stored figures alone (pure)."""

    run: RunSpan
    stages: list[StageSpan]
    skipped: list[str]  # stages without a stored window (no task ran): no span


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _clean(attributes: Mapping[str, Any]) -> Attributes:
    """The attributes OTel accepts: str/bool/int/float, no None, no NaN; numpy scalars as
    Python ones."""
    out: Attributes = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if hasattr(value, "item"):  # numpy scalar
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if isinstance(value, str | bool | int | float):
            out[key] = value
    return out


def _failing_stages(result: FinishResult) -> set[str]:
    """The stages whose prefixes counted in the run's regression (none unless regressed)."""
    if not result.regressed or result.judgement is None:
        return set()
    return {str(item[0]) for item in result.judgement.outcome.failing}


#: Prefix verdicts, most notable first: a stage's verdict is the first its prefixes have.
STAGE_VERDICT_ORDER = ("regression", "new", "vanished", "improved", "insufficient-history",
                       "ok")


def stage_verdict(result: FinishResult, stage: str) -> str:
    """The stage's verdict: ``regression`` when it counted in the run's regression;
    ``regression-not-counted`` when a prefix was flagged but did not count (a suspected
    night, a run that failed); else the most notable verdict of its prefixes
    (:data:`STAGE_VERDICT_ORDER`), ``unjudged`` without any."""
    if stage in _failing_stages(result):
        return "regression"
    frame = result.verdicts
    if frame is None or frame.empty or "stage" not in frame or "verdict" not in frame:
        return "unjudged"
    verdicts = {str(v) for v in frame.loc[frame["stage"] == stage, "verdict"] if v}
    if "regression" in verdicts:
        return "regression-not-counted"
    ranked = [v for v in STAGE_VERDICT_ORDER if v in verdicts]
    return ranked[0] if ranked else (sorted(verdicts)[0] if verdicts else "unjudged")


def _utilisation(result: FinishResult, stage: str) -> float | None:
    frame = result.utilisation
    if frame is None or "utilisation" not in frame or stage not in frame.index:
        return None
    return float(frame.loc[stage, "utilisation"])


def _prefix_events(result: FinishResult, stage: str) -> list[PrefixEvent]:
    """The stage's top prefixes by compute seconds (at most :data:`MAX_PREFIXES`)."""
    frame = result.summary
    if frame is None or frame.empty or "stage" not in frame:
        return []
    rows = frame[frame["stage"] == stage].sort_values("total_s", ascending=False)
    return [PrefixEvent(str(row["prefix"]), _clean({
        f"{NS}.prefix": str(row["prefix"]), f"{NS}.tasks": int(row["tasks"]),
        f"{NS}.compute_s": row.get("total_s"), f"{NS}.p50_s": row.get("p50_s"),
        f"{NS}.p95_s": row.get("p95_s"), f"{NS}.share": row.get("share")}))
        for _, row in rows.head(MAX_PREFIXES).iterrows()]


def stage_attributes(result: FinishResult, info: Mapping[str, Any]) -> Attributes:
    """The ``dask_profiling.*`` attributes of one stored stage entry of the manifest."""
    name = str(info["name"])
    memory = info.get("memory") or {}
    io = info.get("io") or {}
    allocation = info.get("allocation") or {}
    diagnosis = info.get("diagnosis") or {}
    worker_s, idle = allocation.get("worker_s"), allocation.get("idle_share")
    return _clean({
        f"{NS}.pipeline": result.pipeline, f"{NS}.version": result.version,
        f"{NS}.run_id": result.run_id, f"{NS}.stage": name,
        f"{NS}.tasks": int(info.get("tasks") or 0),
        f"{NS}.compute_s": float(info.get("task_s") or 0.0),
        f"{NS}.wall_s": info.get("wall_s"), f"{NS}.windows": info.get("windows"),
        f"{NS}.utilisation": _utilisation(result, name),
        f"{NS}.memory.peak_bytes": memory.get("peak_bytes"),
        f"{NS}.memory.headroom": memory.get("headroom"),
        f"{NS}.memory.limit_bytes": memory.get("memory_limit") or None,
        f"{NS}.idle_worker_hours": (worker_s / 3600.0 * idle)
        if worker_s is not None and idle is not None else None,
        f"{NS}.storage.requests": io.get("requests"),
        f"{NS}.storage.chunks": io.get("chunks"),
        f"{NS}.storage.requests_per_chunk": io.get("requests_per_chunk"),
        f"{NS}.storage.bytes": io.get("bytes"),
        f"{NS}.bottleneck.class": diagnosis.get("primary"),
        f"{NS}.bottleneck.secondary": diagnosis.get("secondary"),
        f"{NS}.bottleneck.confidence": diagnosis.get("confidence"),
        f"{NS}.verdict": stage_verdict(result, name),
        f"{NS}.report": ((info.get("report") or {}).get("location")),
    })


def _explanation(result: FinishResult, stage: str) -> str:
    why = (result.manifest.get("explanations") or {}).get(stage) or {}
    return str(why.get("text") or result.failure_message)


def plan(result: FinishResult, links: Mapping[str, str] | None = None,
         trend: str | None = None) -> TracePlan:
    """The spans of a finished run, from its stored figures (pure: no OTel call); the run
    span ends at the latest stage end.

    ``links``: the stages' report links by name; ``trend``: the trend page's link.
    """
    stages, skipped = [], []
    failing = _failing_stages(result)
    for info in result.manifest.get("stages") or []:
        allocation = info.get("allocation") or {}
        start, stop = allocation.get("start"), allocation.get("stop")
        if start is None or stop is None:
            skipped.append(str(info["name"]))
            continue
        name = str(info["name"])
        stages.append(StageSpan(
            name=name, start_ns=_ns(start), end_ns=_ns(max(stop, start)),
            attributes=stage_attributes(result, info),
            prefixes=_prefix_events(result, name),
            error=_explanation(result, name) if name in failing else None))
    started = [s.start_ns for s in stages]
    ended = [s.end_ns for s in stages]
    end_ns = max(ended, default=0)
    run_attributes = {
        f"{NS}.pipeline": result.pipeline, f"{NS}.version": result.version,
        f"{NS}.run_id": result.run_id, f"{NS}.status": result.status,
        f"{NS}.regressed": result.regressed, f"{NS}.verdict": result.failure_message,
        f"{NS}.stages": len(stages), f"{NS}.location": result.location,
        f"{NS}.trend": trend,
        **{f"{NS}.report.{stage}": link for stage, link in (links or {}).items()}}
    run = RunSpan(start_ns=min(started, default=end_ns), end_ns=max(end_ns, *ended, 0),
                  attributes=_clean(run_attributes))
    return TracePlan(run=run, stages=stages, skipped=skipped)


def make_spans(trace_plan: TracePlan, parent: Any, budget_s: float = EMIT_BUDGET_S,
               clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Start and end every span of ``trace_plan`` under the context ``parent``.

    The user's span processor may export each span as it ends (``SimpleSpanProcessor``), to
    a collector that is down: no span is started once ``budget_s`` is spent. Returns the
    warnings (at most one); never raises.
    """
    try:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        tracer = trace.get_tracer(TRACER_NAME)
        deadline = clock() + budget_s
        run = trace_plan.run
        span = tracer.start_span(
            f"dask-profiling run {run.attributes.get(f'{NS}.pipeline')}", context=parent,
            start_time=run.start_ns, attributes=run.attributes)
        if trace_plan.skipped:
            span.set_attribute(f"{NS}.stages_without_window", ", ".join(trace_plan.skipped))
        span.end(end_time=run.end_ns)
        for i, stage in enumerate(trace_plan.stages):
            if clock() > deadline:
                return [f"{len(trace_plan.stages) - i} of {len(trace_plan.stages)} stage "
                        f"spans not made: the span processor took over {budget_s:.0f} s "
                        "(a synchronous exporter whose collector is down?)"]
            span = tracer.start_span(f"dask-profiling stage {stage.name}", context=parent,
                                     start_time=stage.start_ns, attributes=stage.attributes)
            for event in stage.prefixes:
                span.add_event(f"prefix {event.prefix}", attributes=event.attributes,
                               timestamp=stage.end_ns)
            if stage.error is not None:
                span.set_status(Status(StatusCode.ERROR, stage.error))
            span.end(end_time=stage.end_ns)
    except Exception as exc:  # the user's processor or exporter, or a bug here
        logger.debug("dask-profiling: spans not made", exc_info=True)
        return [f"OpenTelemetry spans not made: {type(exc).__name__}: {exc}"]
    return []


def _mark_current(result: FinishResult) -> None:
    """The run id and verdict on the span current here (the flow-run span), if recording."""
    from opentelemetry import trace

    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(_clean({
            f"{NS}.run_id": result.run_id, f"{NS}.status": result.status,
            f"{NS}.regressed": result.regressed, f"{NS}.verdict": result.failure_message}))


def prepare_spans(result: FinishResult, links: Mapping[str, str] | None = None,
                  trend: str | None = None, *, mode: str = "auto",
                  budget_s: float = EMIT_BUDGET_S) -> Callable[[], list[str]] | None:
    """The job that makes the run's spans under the span current here, or ``None``.

    ``None`` (nothing built) when ``mode`` is ``"off"`` or no provider is configured. Called
    in the flow's thread: the current context (the flow-run span) is captured and the
    verdict set on that span now, while it is open; the job, run anywhere later, makes the
    spans with their stored timestamps (:func:`make_spans`) and returns its warnings.
    Raises only on a bug building the plan (the caller keeps it to a warning).
    """
    if mode == "off" or not tracing_configured():
        return None
    from opentelemetry import context as otel_context

    parent = otel_context.get_current()
    _mark_current(result)
    trace_plan = plan(result, links, trend)
    return functools.partial(make_spans, trace_plan, parent, budget_s)
