"""An OpenTelemetry SDK ``TracerProvider`` installed as the process's global for one test.

The API lets a process set its provider once; tests that configure one put the API's
globals back afterwards (as ``opentelemetry-test-utils``'s ``reset_trace_globals`` does), so
the tests after them run with no SDK configured, as a user's flow without OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def reset_trace_globals() -> None:
    """No provider set: the API's proxy default again."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def sdk_provider(exporter: SpanExporter | None = None,
                 processor_class: type = SimpleSpanProcessor, resource: Any = None
                 ) -> Iterator[tuple[TracerProvider, SpanExporter]]:
    """A real SDK provider exporting to ``exporter`` (default in memory), set globally."""
    exporter = exporter or InMemorySpanExporter()
    provider = TracerProvider(**({"resource": resource} if resource is not None else {}))
    provider.add_span_processor(processor_class(exporter))
    reset_trace_globals()
    trace.set_tracer_provider(provider)
    try:
        yield provider, exporter
    finally:
        provider.shutdown()
        reset_trace_globals()


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def reset_metrics_globals() -> None:
    """No meter provider set: the API's proxy default again."""
    from opentelemetry.metrics import _internal

    _internal._METER_PROVIDER_SET_ONCE = Once()
    _internal._METER_PROVIDER = None


@contextmanager
def sdk_meter_provider(reader: Any = None) -> Iterator[Any]:
    """A real SDK ``MeterProvider`` with ``reader`` (default an in-memory reader), set
    globally; yields the reader."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = reader if reader is not None else InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    reset_metrics_globals()
    metrics.set_meter_provider(provider)
    try:
        yield reader
    finally:
        provider.shutdown()
        reset_metrics_globals()


def gauge_points(reader: Any) -> dict[str, list[tuple[dict, float]]]:
    """``{instrument: [(attributes, value), ...]}`` of what ``reader`` holds."""
    out: dict[str, list[tuple[dict, float]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(
                    (dict(p.attributes), p.value) for p in metric.data.data_points)
    return out
