"""Stages as spans under Prefect's own flow-run span: a real flow on a real Prefect server
and a real cluster (issue 59).

The store is seeded with three healthy nights in which ``compute/slow_block`` took a tenth
of a second; the flow's ``compute`` stage then takes 1.6 s: a regression, which fails the
flow (``on_regression="fail"``). The spans go to a real SDK ``TracerProvider`` set as the
process's global, as a user's ``opentelemetry-instrument`` or own code sets it; Prefect makes
its flow-run span from the same provider.
"""

from __future__ import annotations

import logging
import socket

import pytest
from distributed import LocalCluster
from helpers.otel_flows import regressing_flow, seed, the_run
from helpers.otel_sdk import (
    gauge_points,
    reset_metrics_globals,
    reset_trace_globals,
    sdk_meter_provider,
    sdk_provider,
)
from helpers.tiers import starts_processes
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import StatusCode

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


@pytest.fixture(autouse=True)
def no_provider():
    reset_trace_globals()
    reset_metrics_globals()
    yield
    reset_trace_globals()
    reset_metrics_globals()


def span_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Our warnings about spans, from our logger or the flow run's (``run_log``)."""
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "dask-profiling" in r.getMessage()
            and ("span" in r.getMessage().lower() or "OpenTelemetry" in r.getMessage())]


def test_the_stages_are_children_of_prefects_flow_run_span(cluster, tmp_path, caplog):
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "otel-flow")
    with sdk_provider() as (_, exporter), sdk_meter_provider() as reader, \
            caplog.at_level(logging.WARNING):
        state = regressing_flow(cluster, store, "otel-flow")(return_state=True)
        spans = exporter.get_finished_spans()
        points = gauge_points(reader)
    assert state.is_failed() and "regression" in state.message
    manifest = the_run(store, "otel-flow", seeded)
    [flow_span] = [s for s in spans if s.attributes.get("prefect.run.type") == "flow"]
    assert str(flow_span.attributes["prefect.run.id"]) == str(state.state_details.flow_run_id)
    stages = {s.attributes[f"{NS}.stage"]: s for s in spans
              if s.name.startswith("dask-profiling stage ")}
    assert set(stages) == {"load", "compute"}
    for span in stages.values():
        assert span.parent.span_id == flow_span.context.span_id
        assert span.context.trace_id == flow_span.context.trace_id
        assert span.attributes[f"{NS}.run_id"] == manifest["run_id"]
        assert span.attributes[f"{NS}.pipeline"] == "otel-flow"
    compute = stages["compute"]
    assert compute.status.status_code is StatusCode.ERROR
    assert compute.status.description == manifest["explanations"]["compute"]["text"]
    assert compute.attributes[f"{NS}.verdict"] == "regression"
    assert compute.attributes[f"{NS}.tasks"] >= 8
    assert [e.attributes[f"{NS}.prefix"] for e in compute.events][0] == "slow_block"
    assert stages["load"].status.status_code is StatusCode.UNSET
    stored = {s["name"]: s for s in manifest["stages"]}
    assert compute.start_time == int(stored["compute"]["allocation"]["start"] * 1e9)
    [run_span] = [s for s in spans if s.name == "dask-profiling run otel-flow"]
    assert run_span.parent.span_id == flow_span.context.span_id
    assert run_span.attributes[f"{NS}.regressed"] is True
    assert flow_span.attributes[f"{NS}.run_id"] == manifest["run_id"]
    assert span_warnings(caplog) == []
    # the night's figures as metrics, with their attributes
    walls = {a[f"{NS}.stage"]: v for a, v in points[f"{NS}.stage.wall_time"]}
    assert walls == pytest.approx({n: s["wall_s"] for n, s in stored.items()})
    assert ({"dask_profiling.pipeline": "otel-flow", "dask_profiling.version": "1",
             "dask_profiling.stage": "compute", "dask_profiling.prefix": "slow_block"}
            in [a for a, _ in points[f"{NS}.prefix.compute_time"]])


def test_without_an_sdk_the_flow_makes_no_spans_and_no_errors(cluster, tmp_path, caplog,
                                                              monkeypatch):
    """No provider configured: no plan is built (it would raise), the flow ends as ever."""
    def no_plan(*args, **kwargs):
        raise AssertionError("a span plan was built without an SDK")

    monkeypatch.setattr(otel, "plan", no_plan)
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "otel-none")
    with caplog.at_level(logging.WARNING):
        state = regressing_flow(cluster, store, "otel-none")(return_state=True)
    assert state.is_failed() and "regression" in state.message
    assert the_run(store, "otel-none", seeded)["status"] == "regressed"
    assert not [r for r in caplog.records if "span" in r.getMessage().lower()
                or "OpenTelemetry" in r.getMessage()]


def test_an_exporter_to_a_closed_port_leaves_the_flow_as_it_was(cluster, tmp_path, caplog):
    """The real OTLP/HTTP exporter, batched as users configure it, to a port nothing
    listens on: the flow ends Failed on its regression as without OpenTelemetry, the run is
    stored, and at most one warning of ours mentions the spans."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "otel-down")
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1)
    with sdk_provider(exporter, BatchSpanProcessor), caplog.at_level(logging.WARNING):
        state = regressing_flow(cluster, store, "otel-down")(return_state=True)
    assert state.is_failed() and "regression" in state.message
    assert the_run(store, "otel-down", seeded)["status"] == "regressed"
    assert len(span_warnings(caplog)) <= 1
