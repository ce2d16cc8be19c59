"""A finished run's stages as OpenTelemetry spans (issue 59), without Prefect.

Nights are finished through :func:`finish_run` on records derived from one real record (a
real in-process LocalCluster), 4 healthy nights then one whose ``read`` stage is 5x slower:
a regression of ``read``. The spans go to a real SDK ``TracerProvider`` with the SDK's
in-memory exporter, under a span made current as Prefect makes its flow-run span current
(the flow-level test is tests/prefect/test_otel_flow.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import count

import pandas as pd
import pytest
from helpers.otel_sdk import by_name, reset_trace_globals, sdk_provider
from helpers.run_records import record_stages, scaled
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from prefect_dask_profiling import otel
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.options import ProfilingOptions, check_otel_mode
from prefect_dask_profiling.run.pipeline import FinishResult, finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id

PIPELINE = "spans"
LOOSE = ProfilingOptions(check_options={"min_seconds": 0.0, "min_share": 0.0})
START = datetime(2026, 11, 1, 2, tzinfo=UTC)
NS = otel.NS


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


@pytest.fixture(scope="module")
def regressed(record, tmp_path_factory) -> tuple[RunStore, FinishResult]:
    """Four healthy nights, then ``read`` 5x slower: stored, judged regressed."""
    store = RunStore(str(tmp_path_factory.mktemp("otel") / "store"))
    result = None
    for n in range(5):
        when = START + timedelta(days=n)
        ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="7", started=when)
        result = finish_run(store, scaled(record, {"read": 5.0} if n == 4 else None), ctx, [],
                            LOOSE, ended=when + timedelta(hours=1))
    assert result is not None and result.regressed
    return store, result


@pytest.fixture(autouse=True)
def no_provider():
    """Every test starts (and leaves) the process with no SDK configured."""
    reset_trace_globals()
    yield
    reset_trace_globals()


def spans_under_a_flow_span(result: FinishResult, **kwargs):
    """Make the run's spans under a current "flow-run" span; (flow span, exported spans,
    the job's warnings)."""
    with sdk_provider() as (_, exporter):
        tracer = trace.get_tracer("test")
        flow_span = tracer.start_span("flow-run")
        with trace.use_span(flow_span, end_on_exit=True):
            job = otel.prepare_spans(result, **kwargs)
        assert job is not None
        warnings = job()  # later, anywhere (the session: its background service)
        return flow_span, exporter.get_finished_spans(), warnings


def test_each_stage_is_a_child_span_of_the_current_span_with_its_stored_window(regressed):
    store, result = regressed
    flow_span, spans, warnings = spans_under_a_flow_span(
        result, links={"read": "https://reports/read.html"}, trend="https://reports/trend")
    assert warnings == []
    named = by_name(spans)
    assert set(named) == {"flow-run", f"dask-profiling run {PIPELINE}",
                          "dask-profiling stage read", "dask-profiling stage reduce"}
    flow = flow_span.get_span_context()
    stored = {s["name"]: s for s in store.read_manifest(PIPELINE, result.run_id)["stages"]}
    for name in ("read", "reduce"):
        span = named[f"dask-profiling stage {name}"]
        assert span.parent is not None and span.parent.span_id == flow.span_id
        assert span.context.trace_id == flow.trace_id
        window = stored[name]["allocation"]
        assert (span.start_time, span.end_time) == (int(window["start"] * 1e9),
                                                    int(window["stop"] * 1e9))
        attrs = span.attributes
        assert (attrs[f"{NS}.pipeline"], attrs[f"{NS}.version"], attrs[f"{NS}.run_id"],
                attrs[f"{NS}.stage"]) == (PIPELINE, "7", result.run_id, name)
        assert attrs[f"{NS}.tasks"] == stored[name]["tasks"] > 0
        assert attrs[f"{NS}.compute_s"] == pytest.approx(stored[name]["task_s"])
        assert attrs[f"{NS}.utilisation"] == pytest.approx(
            result.utilisation.loc[name, "utilisation"])
        assert attrs[f"{NS}.bottleneck.class"] == stored[name]["diagnosis"]["primary"]
        assert attrs[f"{NS}.bottleneck.confidence"] == stored[name]["diagnosis"]["confidence"]
        assert attrs[f"{NS}.memory.peak_bytes"] == stored[name]["memory"]["peak_bytes"]
        assert f"{NS}.idle_worker_hours" in attrs
    run = named[f"dask-profiling run {PIPELINE}"]
    assert run.parent.span_id == flow.span_id
    assert run.attributes[f"{NS}.report.read"] == "https://reports/read.html"
    assert run.attributes[f"{NS}.trend"] == "https://reports/trend"
    assert run.attributes[f"{NS}.regressed"] is True
    assert run.attributes[f"{NS}.verdict"] == result.failure_message
    # the verdict is on the flow-run span too, set while it was open
    assert named["flow-run"].attributes[f"{NS}.run_id"] == result.run_id
    assert named["flow-run"].attributes[f"{NS}.regressed"] is True


def test_the_regressed_stage_has_status_error_with_its_explanation(regressed):
    _, result = regressed
    _, spans, _ = spans_under_a_flow_span(result)
    named = by_name(spans)
    read, reduce = named["dask-profiling stage read"], named["dask-profiling stage reduce"]
    assert read.status.status_code is StatusCode.ERROR
    assert read.status.description == result.manifest["explanations"]["read"]["text"]
    assert read.attributes[f"{NS}.verdict"] == "regression"
    assert reduce.status.status_code is StatusCode.UNSET
    assert reduce.attributes[f"{NS}.verdict"] == "ok"


def test_the_top_prefixes_are_events_with_their_figures(regressed):
    _, result = regressed
    _, spans, _ = spans_under_a_flow_span(result)
    read = by_name(spans)["dask-profiling stage read"]
    rows = result.summary[result.summary["stage"] == "read"].sort_values(
        "total_s", ascending=False)
    assert [e.attributes[f"{NS}.prefix"] for e in read.events] == list(rows["prefix"])
    first, row = read.events[0], rows.iloc[0]
    assert (first.attributes[f"{NS}.tasks"], first.attributes[f"{NS}.compute_s"],
            first.attributes[f"{NS}.p50_s"], first.attributes[f"{NS}.p95_s"]) == (
        row["tasks"], pytest.approx(row["total_s"]), pytest.approx(row["p50_s"]),
        pytest.approx(row["p95_s"]))


def test_at_most_twenty_prefixes_per_stage_the_largest(regressed):
    """A stage of 45 prefixes: its 20 largest by compute seconds become events."""
    _, result = regressed
    extra = pd.DataFrame([{**result.summary.iloc[0].to_dict(), "stage": "read",
                           "prefix": f"p{i:02d}", "total_s": float(i)} for i in range(45)])
    many = replace(result, summary=pd.concat([result.summary, extra], ignore_index=True))
    read = next(s for s in otel.plan(many).stages if s.name == "read")
    assert len(read.prefixes) == otel.MAX_PREFIXES == 20
    largest = many.summary[many.summary["stage"] == "read"].nlargest(20, "total_s")
    assert [e.prefix for e in read.prefixes] == list(largest["prefix"])


def test_without_an_sdk_nothing_is_built(regressed, monkeypatch):
    """The API's default provider: no plan is built (it would raise here), no job."""
    _, result = regressed

    def no_plan(*args, **kwargs):
        raise AssertionError("a plan was built without an SDK")

    monkeypatch.setattr(otel, "plan", no_plan)
    assert not otel.tracing_configured()
    assert otel.prepare_spans(result) is None
    assert not trace.get_current_span().is_recording()


def test_otel_off_builds_nothing_even_with_an_sdk(regressed):
    _, result = regressed
    with sdk_provider() as (_, exporter):
        assert otel.tracing_configured()
        assert otel.prepare_spans(result, mode="off") is None
        assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("mode", ["on", "", None, True])
def test_an_unknown_otel_mode_is_refused_naming_the_allowed_ones(mode):
    with pytest.raises(InvalidInput, match=r"otel must be one of \('auto', 'off'\)"):
        check_otel_mode(mode)


def test_a_spent_budget_leaves_the_remaining_spans_unmade_with_one_warning(regressed,
                                                                          caplog):
    """A span processor exporting synchronously to a collector that is down makes every
    span slow: a clock that moves 10 s per reading spends the 3 s budget on the run span;
    the stage spans are not started, one warning says so, nothing raises."""
    _, result = regressed
    ticks = count(0, 10)
    with sdk_provider() as (_, exporter), caplog.at_level(logging.WARNING):
        warnings = otel.make_spans(otel.plan(result), None, budget_s=3.0,
                                   clock=lambda: float(next(ticks)))
        made = [s.name for s in exporter.get_finished_spans()]
    assert made == [f"dask-profiling run {PIPELINE}"]
    assert len(warnings) == 1 and "2 of 2 stage spans not made" in warnings[0]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_an_exporter_to_a_closed_port_never_raises(regressed, caplog):
    """The real OTLP/HTTP exporter to a port nothing listens on, exporting as each span
    ends: the job returns (at most one warning of ours) and the run stays stored."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    store, result = regressed
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{closed_port()}/v1/traces",
                                timeout=1)
    with sdk_provider(exporter), caplog.at_level(logging.WARNING, "prefect_dask_profiling"):
        job = otel.prepare_spans(result)
        assert job is not None
        warnings = job()
    assert len(warnings) <= 1
    assert [r for r in caplog.records if r.name == "prefect_dask_profiling"] == []
    assert store.read_manifest(PIPELINE, result.run_id)["status"] == result.status


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the night's figures as OTLP metrics --------------------------------------------------------


def test_the_nights_figures_are_gauges_with_pipeline_version_stage_and_prefix_only(regressed):
    from helpers.otel_sdk import gauge_points, sdk_meter_provider

    store, result = regressed
    with sdk_meter_provider() as reader:
        job = otel.prepare_metrics(result)
        assert job is not None
        assert job() == []
        points = gauge_points(reader)
    stored = {s["name"]: s for s in store.read_manifest(PIPELINE, result.run_id)["stages"]}
    walls = {a[f"{NS}.stage"]: v for a, v in points[f"{NS}.stage.wall_time"]}
    assert walls == pytest.approx({n: s["wall_s"] for n, s in stored.items()})
    peaks = {a[f"{NS}.stage"]: v for a, v in points[f"{NS}.stage.memory.peak"]}
    assert peaks == {n: s["memory"]["peak_bytes"] for n, s in stored.items()}
    assert {a[f"{NS}.stage"] for a, _ in points[f"{NS}.stage.utilisation"]} == set(stored)
    assert f"{NS}.stage.idle_worker_hours" in points
    prefix = {(a[f"{NS}.stage"], a[f"{NS}.prefix"]): v
              for a, v in points[f"{NS}.prefix.compute_time"]}
    expected = result.summary.groupby(["stage", "prefix"])["total_s"].sum().to_dict()
    assert prefix == pytest.approx(expected)
    allowed = {f"{NS}.pipeline", f"{NS}.version", f"{NS}.stage", f"{NS}.prefix"}
    for instrument in points.values():
        for attributes, _ in instrument:
            assert set(attributes) <= allowed
            assert (attributes[f"{NS}.pipeline"], attributes[f"{NS}.version"]) == (
                PIPELINE, "7")


def test_prefixes_beyond_twenty_fold_into_other(regressed):
    _, result = regressed
    extra = pd.DataFrame([{**result.summary.iloc[0].to_dict(), "stage": "read",
                           "prefix": f"p{i:02d}", "total_s": float(i)} for i in range(45)])
    many = replace(result, summary=pd.concat([result.summary, extra], ignore_index=True))
    read = {p.attributes[f"{NS}.prefix"]: p.value for p in otel.metric_points(many)
            if p.instrument == f"{NS}.prefix.compute_time"
            and p.attributes[f"{NS}.stage"] == "read"}
    seconds = many.summary[many.summary["stage"] == "read"].groupby("prefix")["total_s"].sum()
    top = seconds.nlargest(otel.MAX_METRIC_PREFIXES)
    assert set(read) == {*top.index, otel.OTHER}
    assert read[otel.OTHER] == pytest.approx(seconds.sum() - top.sum())


def test_without_a_meter_provider_no_metrics_are_built(regressed, monkeypatch):
    _, result = regressed

    def no_points(*args, **kwargs):
        raise AssertionError("metric points were built without a meter provider")

    monkeypatch.setattr(otel, "metric_points", no_points)
    assert not otel.metrics_configured()
    assert otel.prepare_metrics(result) is None


def test_the_runner_takes_otel_and_refuses_an_unknown_value():
    from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, ProfilingOptions

    assert ProfiledDaskTaskRunner(otel="off").duplicate().profiling.otel == "off"
    assert ProfilingOptions().otel == "auto"
    with pytest.raises(InvalidInput, match=r"otel must be one of \('auto', 'off'\), got 'on'"):
        ProfiledDaskTaskRunner(otel="on")


def test_a_flow_that_failed_has_no_error_span_and_says_its_regression_did_not_count(
        record, tmp_path):
    """The same slow night in a flow that failed (state FAILED): stored ``failed``, not
    regressed; its flagged stage's span is not ERROR and says the regression did not
    count."""
    store = RunStore(str(tmp_path / "store"))
    for n in range(5):
        when = START + timedelta(days=n)
        ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="7", started=when)
        result = finish_run(store, scaled(record, {"read": 5.0} if n == 4 else None), ctx, [],
                            LOOSE, ended=when + timedelta(hours=1),
                            state="FAILED" if n == 4 else None)
    assert (result.status, result.regressed) == ("failed", False)
    _, spans, _ = spans_under_a_flow_span(result)
    read = by_name(spans)["dask-profiling stage read"]
    assert read.status.status_code is StatusCode.UNSET
    assert read.attributes[f"{NS}.verdict"] == "regression-not-counted"
