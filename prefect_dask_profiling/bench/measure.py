"""Measuring one side of a benchmark session: :func:`run_side` runs the protocol's steps
(:mod:`~prefect_dask_profiling.bench.protocol`) on one cluster and writes
``<side>/summary.json`` and ``<side>/performance_report.html``."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling._util import json_clean
from prefect_dask_profiling.bench import calibrate as calibration
from prefect_dask_profiling.bench import probes
from prefect_dask_profiling.bench.config import BenchConfig, BenchInputError
from prefect_dask_profiling.bench.preflight import preflight
from prefect_dask_profiling.bench.report import SCHEMA, side_metrics
from prefect_dask_profiling.diagnosis.classify import classify
from prefect_dask_profiling.diagnosis.signals import extract_signals

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.bench.types import BenchSummary
    from prefect_dask_profiling.diagnosis.signals import Batch

Progress = Callable[[str], None]


def _as_futures(client: Client, obj: Any, workload: str) -> list:
    import dask
    from distributed import Future

    if dask.is_dask_collection(obj):
        return [client.compute(obj)]
    if isinstance(obj, Future):
        return [obj]
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(f, Future) for f in obj):
        return list(obj)
    raise BenchInputError(f"workload {workload} returned {type(obj).__name__}: expected a "
                          "Dask collection, a Future or a list of futures")


def run_batch(client: Client, fn: Callable[[int, int], Any], workload: str, n: int,
              seeds: list[int]) -> Batch:
    """One aggregate per seed, submitted together; waits, then forgets the results."""
    from distributed import wait

    start = time.time()
    t0 = time.perf_counter()
    aggregates = [_as_futures(client, fn(n, seed), workload) for seed in seeds]
    wait([f for agg in aggregates for f in agg])
    wall = time.perf_counter() - t0
    end = time.time()
    ok, errors = _outcome(aggregates)
    keys = [f.key for agg in aggregates for f in agg]
    del aggregates
    calibration.wait_forgotten(client, keys)
    return {"n": n, "start": start, "end": end, "wall_s": wall, "aggregates": len(seeds),
            "succeeded": ok, "errors": errors}


def _outcome(aggregates: list[list]) -> tuple[int, list[str]]:
    """Aggregates that succeeded, and the first error of each failed one."""
    ok, errors = 0, []
    for agg in aggregates:
        bad = [f for f in agg if f.status != "finished"]
        if not bad:
            ok += 1
            continue
        try:
            exc = bad[0].exception(timeout=5)
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        except Exception as err:  # cancelled or lost
            errors.append(f"{bad[0].status}: {err!r}"[:300])
    return ok, errors


def _scheduler_netns(client: Client) -> str | None:
    try:
        return client.run_on_scheduler(probes.netns)
    except Exception:  # an old scheduler or no /proc: host shares stay unmeasured
        return None


def run_side(client: Client, side: str, config: BenchConfig, fn: Callable[[int, int], Any],
             directory: Path, progress: Progress) -> BenchSummary:
    """Preflight, calibrate, warm up and measure one side; write its summary.json."""
    with client.as_current():  # performance_report and get_client() inside workloads
        return _run_side(client, side, config, fn, directory, progress)


def _run_side(client: Client, side: str, config: BenchConfig, fn: Callable[[int, int], Any],
              directory: Path, progress: Progress) -> BenchSummary:
    from distributed import performance_report

    from prefect_dask_profiling.summary.collect import collect
    from prefect_dask_profiling.summary.tables import summarise, utilisation
    from prefect_dask_profiling.timing import client as timing_client

    out = directory / side
    out.mkdir(parents=True, exist_ok=True)
    pre = preflight(client, side, config)
    probes.by_value()
    progress(f"{side}: {pre['n_workers']} workers, {pre['total_threads']} threads "
             f"at {pre['scheduler']}")
    for w in pre["warnings"]:
        progress(f"{side}: warning: {w}")
    cal = calibration.calibrate(client, repeats=config.calibration_repeats)
    progress(f"{side}: calibrated, effective threads {cal.effective_threads:.2f} of "
             f"{cal.total_threads}" + (" (unstable)" if cal.unstable else ""))
    for n in config.n:
        for _ in range(config.warmup):
            run_batch(client, fn, config.workload, n, config.seeds)
    if config.warmup:
        progress(f"{side}: warmed up ({config.warmup} batch(es) per n)")

    name = timing_client.install(client, scope="run", sample_interval=0.5)
    batches: list[Batch] = []
    try:
        client.get_task_stream(start=0, stop=0)  # make sure the task stream is recording
        fine0 = client.run_on_scheduler(probes.fine_metrics)
        since = time.time()
        report = out / "performance_report.html"
        with performance_report(filename=str(report)):
            workers0 = client.run(probes.worker_probe, since=since)
            sched0 = client.run_on_scheduler(probes.scheduler_probe)
            for n in config.n:
                for r in range(config.repeats):
                    batch = run_batch(client, fn, config.workload, n, config.seeds)
                    batches.append(batch)
                    progress(f"{side}: n={n} repeat {r + 1}/{config.repeats}: "
                             f"{batch['wall_s']:.2f} s, {batch['succeeded']}/"
                             f"{batch['aggregates']} ok")
            sched1 = client.run_on_scheduler(probes.scheduler_probe)
            workers1 = client.run(probes.worker_probe, since=since)
        stream = client.get_task_stream(start=since)
        fine1 = probes.settled_fine_metrics(client)
        record = collect(client, name)
    finally:
        with contextlib.suppress(Exception):
            timing_client.uninstall(client, name)

    measurement = {
        "batches": batches, "stream": stream, "fine_before": fine0, "fine_after": fine1,
        "scheduler_before": sched0, "scheduler_after": sched1, "workers_before": workers0,
        "workers_after": workers1, "threads": pre["total_threads"],
        "nthreads": {w["address"]: w["nthreads"] for w in pre["workers"]},
        "calibration": cal.to_dict(), "record": record,
        "scheduler_netns": _scheduler_netns(client),
    }
    signals = extract_signals(measurement)
    verdict = classify(signals)
    prefixes = summarise(record, by="prefix")
    util = utilisation(record)
    metrics = side_metrics(batches, pre["total_threads"], cal.effective_threads, signals)
    summary = {
        "schema": SCHEMA, "side": side, "created": datetime.now(UTC).isoformat(),
        "config": {"workload": config.workload, "n": config.n, "seeds": config.seeds,
                   "warmup": config.warmup, "repeats": config.repeats,
                   "aggregates_per_batch": len(config.seeds)},
        "preflight": pre, "calibration": cal.to_dict(), "metrics": metrics,
        "batches": batches, "signals": signals,
        "bottleneck": {k: verdict[k] for k in ("primary", "secondary", "confidence",
                                                "agreeing_sources",
                                                "signals", "sources", "disagreements",
                                                "compatible", "note", "actions", "scores")},
        "prefixes": prefixes.to_dict("records"),
        "utilisation": util.reset_index().to_dict("records"),
        "warnings": pre["warnings"] + cal.notes + record.warnings,
        "artifacts": {"performance_report": str(report)},
    }
    summary = json_clean(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    progress(f"{side}: {metrics['throughput_agg_s']:.3g} agg/s; bottleneck "
             f"{verdict['primary']} ({verdict['confidence']})")
    return summary
