"""What the OpenTelemetry step costs at a run's end (issue 59: zero without an SDK).

One real record (an in-process LocalCluster, ``--stages`` small array stages) is finished
once into a temporary store; then, in thread CPU seconds, median of ``--repeats`` rounds:

* **no SDK** (the API's default provider): ``prepare_spans`` + ``prepare_metrics``, what the
  runner calls at every run's end — ``--calls`` calls per round;
* **SDK** (a real ``TracerProvider`` and ``MeterProvider``, in-memory exporter and reader):
  building the plan and making the spans, recording the metric points — ``--sdk-calls``
  calls per round.

Prints microseconds per run's end for each. The scheduler does no OTel work in either case.

    .venv/bin/python benchmarks/otel_overhead.py [--repeats 7] [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def finished_run(stages: int):
    """A real record of ``stages`` small stages, finished into a temporary store."""
    from distributed import Client, LocalCluster
    from helpers.run_records import record_stages

    from prefect_dask_profiling.run.pipeline import finish_run
    from prefect_dask_profiling.store.manifest import RunContext
    from prefect_dask_profiling.store.runs import RunStore, new_run_id

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        record = record_stages(client, {f"stage{i}": 200 for i in range(stages)})
    when = datetime.now(UTC)
    ctx = RunContext(run_id=new_run_id(when), pipeline="otel-bench", version="1", started=when)
    store = RunStore(str(Path(tempfile.mkdtemp(prefix="otel-bench-")) / "store"))
    return finish_run(store, record, ctx, [])


def per_call_us(job, calls: int, repeats: int) -> float:
    """Median over ``repeats`` rounds of thread CPU microseconds per ``job()``."""
    rounds = []
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            job()
        rounds.append((time.thread_time() - start) / calls * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--sdk-calls", type=int, default=200)
    parser.add_argument("--stages", type=int, default=4)
    args = parser.parse_args()

    from helpers.otel_sdk import reset_metrics_globals, reset_trace_globals, sdk_provider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from prefect_dask_profiling import otel

    result = finished_run(args.stages)
    reset_trace_globals()
    reset_metrics_globals()

    def end_without_sdk() -> None:
        assert otel.prepare_spans(result) is None and otel.prepare_metrics(result) is None

    without = per_call_us(end_without_sdk, args.calls, args.repeats)

    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    with sdk_provider() as (_, exporter):
        def end_with_sdk() -> None:
            otel.make_spans(otel.plan(result), None)
            otel.record_metrics(otel.metric_points(result), budget_s=0.0)
            exporter.clear()

        with_sdk = per_call_us(end_with_sdk, args.sdk_calls, args.repeats)
    reset_metrics_globals()
    spans = len(result.manifest["stages"]) + 1
    print(f"stages {args.stages} ({spans} spans), repeats {args.repeats}")
    print(f"no SDK: {without:.2f} µs CPU per run's end ({args.calls} calls per round)")
    print(f"SDK, in-memory export: {with_sdk:.0f} µs CPU per run's end "
          f"({args.sdk_calls} calls per round)")


if __name__ == "__main__":
    main()
