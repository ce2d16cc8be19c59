"""A real flow's trace read back from a real OTLP receiver (issue 59).

The flow of tests/prefect/test_otel_flow.py (a real Prefect server, a real cluster, a seeded
store so that its ``compute`` stage regresses) exports with the SDK's OTLP/HTTP exporter,
batched as users configure it, to Arize Phoenix, which stores the spans; the trace is then
read back from Phoenix's REST API. Its metrics go out the same night through the SDK's
``OTLPMetricExporter`` on a periodic reader, as users configure it, to an OTLP/HTTP
endpoint that decodes them (tests/helpers/otel_metrics_receiver.py: Phoenix takes no metrics).
"""

from __future__ import annotations

import time
import uuid

import pytest
from distributed import LocalCluster
from helpers.otel_flows import regressing_flow, seed, the_run
from helpers.otel_metrics_receiver import running_metrics_receiver
from helpers.otel_receiver import TraceServer, running_phoenix
from helpers.otel_sdk import reset_trace_globals, sdk_meter_provider, sdk_provider
from helpers.tiers import starts_processes
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from prefect_dask_profiling import otel
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(600)]

NS = otel.NS


@pytest.fixture(scope="module")
@starts_processes("an in-process LocalCluster beside the Prefect server")
def cluster():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
@starts_processes("an Arize Phoenix trace server")
def phoenix(tmp_path_factory) -> TraceServer:
    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as server:
        yield server


def attribute(span: dict, key: str):
    """``key`` of a span as Phoenix returns it (flat dotted keys, or nested)."""
    attributes = span.get("attributes") or {}
    if key in attributes:
        return attributes[key]
    value = attributes
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def test_the_flows_trace_read_back_from_a_real_receiver(cluster, tmp_path, phoenix):
    project = f"dask-profiling-{uuid.uuid4().hex[:8]}"
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "otel-phoenix")
    exporter = OTLPSpanExporter(endpoint=phoenix.traces_endpoint, timeout=10)
    resource = Resource.create({"openinference.project.name": project,
                                "service.name": "otel-phoenix"})
    reset_trace_globals()
    try:
        with running_metrics_receiver() as received, \
                sdk_meter_provider(PeriodicExportingMetricReader(
                    OTLPMetricExporter(endpoint=received.endpoint, timeout=10),
                    export_interval_millis=3_600_000)), \
                sdk_provider(exporter, BatchSpanProcessor, resource=resource):
            state = regressing_flow(cluster, store, "otel-phoenix")(return_state=True)
            pushed = list(received.points)  # before the provider's shutdown exports again
    finally:
        reset_trace_globals()
    assert state.is_failed() and "regression" in state.message
    manifest = the_run(store, "otel-phoenix", seeded)
    # the night's figures, pushed once at the run's end (the reader's own period is an hour)
    names = {p.name for p in pushed}
    assert {f"{NS}.stage.wall_time", f"{NS}.stage.utilisation",
            f"{NS}.prefix.compute_time"} <= names, names
    walls = {p.attributes[f"{NS}.stage"]: p for p in pushed
             if p.name == f"{NS}.stage.wall_time"}
    assert set(walls) == {"load", "compute"} and walls["compute"].unit == "s"
    assert set(walls["compute"].attributes) == {f"{NS}.pipeline", f"{NS}.version",
                                                f"{NS}.stage"}
    assert walls["compute"].attributes[f"{NS}.pipeline"] == "otel-phoenix"
    assert walls["compute"].value > 0
    [slow] = [p for p in pushed if p.name == f"{NS}.prefix.compute_time"
              and p.attributes[f"{NS}.prefix"] == "slow_block"]
    assert slow.attributes[f"{NS}.stage"] == "compute" and slow.value > 1.0  # 8 x 0.2 s

    deadline = time.monotonic() + 60
    while True:  # the receiver stores what it was sent a moment after
        spans = phoenix.spans(project)
        stages = {attribute(s, f"{NS}.stage"): s for s in spans
                  if s["name"].startswith("dask-profiling stage ")}
        if set(stages) == {"load", "compute"} or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert set(stages) == {"load", "compute"}, [s["name"] for s in spans]
    [flow_span] = [s for s in spans if attribute(s, "prefect.run.type") == "flow"]
    for span in stages.values():
        assert span["parent_id"] == flow_span["context"]["span_id"]
        assert span["context"]["trace_id"] == flow_span["context"]["trace_id"]
        assert attribute(span, f"{NS}.run_id") == manifest["run_id"]
        assert attribute(span, f"{NS}.pipeline") == "otel-phoenix"
        assert attribute(span, f"{NS}.tasks") > 0
        assert attribute(span, f"{NS}.bottleneck.class")
    compute = stages["compute"]
    assert compute["status_code"] == "ERROR"
    assert compute["status_message"] == manifest["explanations"]["compute"]["text"]
    assert attribute(compute, f"{NS}.verdict") == "regression"
    assert stages["load"]["status_code"] != "ERROR"
    assert "slow_block" in [attribute(e, f"{NS}.prefix") for e in compute["events"]]
    [run_span] = [s for s in spans if s["name"] == "dask-profiling run otel-phoenix"]
    assert run_span["parent_id"] == flow_span["context"]["span_id"]
