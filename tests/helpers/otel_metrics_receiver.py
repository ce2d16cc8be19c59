"""An OTLP/HTTP metrics endpoint for tests: a real HTTP server on 127.0.0.1 that accepts
what the SDK's ``OTLPMetricExporter`` sends (``POST /v1/metrics``, protobuf, gzip or not)
and decodes it with ``opentelemetry-proto``, the protocol's own schema package.

Phoenix (tests/helpers/otel_receiver.py) stores spans only; no metrics store is installable on this
machine (no Go toolchain for a collector, Prometheus or VictoriaMetrics). This receives the
real exporter's bytes over a real socket, so the wire, the encoding and the push at the
run's end are what a collector would get.
"""

from __future__ import annotations

import gzip
import http.server
import threading
from dataclasses import dataclass, field
from typing import Any

from helpers.prefect_server import HOST


@dataclass
class MetricPoint:
    """One data point as received: its instrument, unit, attributes and value."""

    name: str
    unit: str
    attributes: dict[str, Any]
    value: float


@dataclass
class MetricsReceiver:
    """The received points (:attr:`points`) and the endpoint to export to."""

    endpoint: str = ""
    points: list[MetricPoint] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes) -> None:
        """Decode one ``ExportMetricsServiceRequest`` and keep its gauge and sum points."""
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )

        request = ExportMetricsServiceRequest.FromString(body)
        points = []
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        value = point.as_double if point.HasField("as_double") \
                            else float(point.as_int)
                        points.append(MetricPoint(metric.name, metric.unit,
                                                  _attributes(point.attributes), value))
        with self.lock:
            self.points += points
            self.requests += 1


def _attributes(pairs: Any) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        out[pair.key] = getattr(pair.value, kind) if kind else None
    return out


class _Handler(http.server.BaseHTTPRequestHandler):
    receiver: MetricsReceiver

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path.rstrip("/") != "/v1/metrics":
            self.send_response(404)
            self.end_headers()
            return
        self.receiver.add(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()


class running_metrics_receiver:  # noqa: N801 (used as a context manager, like a function)
    """Serve a :class:`MetricsReceiver` on a free port of 127.0.0.1; stopped on exit."""

    def __enter__(self) -> MetricsReceiver:
        receiver = MetricsReceiver()
        handler = type("Handler", (_Handler,), {"receiver": receiver})
        self._server = http.server.ThreadingHTTPServer((HOST, 0), handler)
        receiver.endpoint = f"http://{HOST}:{self._server.server_address[1]}/v1/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return receiver

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
