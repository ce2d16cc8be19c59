"""The cost of profiling at scale: big stages, a million tasks, wide runs, long histories.

Four measurements, each printed as rows of one figures table (what, value, how measured):

1. **big stage** — one stage of ``--stage-tasks`` tiny tasks on a LocalCluster (2 × 1):
   scheduler CPU seconds with and without the plugin, the stage's report size and render
   time, and, with Dask's task-stream buffer set below the task count, whether the report
   says it is cut while the summary still counts every task.
2. **a million tasks** — ``--transitions`` direct ``processing → memory`` transitions
   through the plugin (no scheduler, as in ``plugin_overhead.py``): µs per task, memory
   held (tracemalloc) and the time to summarise the snapshot.
3. **a wide run** — ``--prefixes`` prefixes × ``--stages`` stages through the plugin, then
   the whole end of a run (``finish_run``: summarise, store, baseline of 8 earlier runs,
   verdict, diagnosis, trend...) on a local store: time per step and bytes stored.
4. **a long history** — ``--runs`` stored runs of one pipeline; ``load_baseline``, then what
   judging a run reads (baseline and drift series, each reading for itself and remembering
   reads as ``finish()`` does) on a local store and on S3 (moto ``ThreadedMotoServer`` on
   127.0.0.1): filesystem calls and time.

    .venv/bin/python benchmarks/scale.py [--part all|stage|million|wide|history]
        [--stage-tasks 100000] [--transitions 1000000] [--prefixes 500] [--stages 10]
        [--runs 10000]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import operator
import os
import signal
import sys
import tempfile
import time
import tracemalloc
import types
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd
from distributed import Client, LocalCluster, wait

from prefect_dask_profiling.regression.baseline import load_baseline
from prefect_dask_profiling.regression.drift import load_series
from prefect_dask_profiling.reports import stage_reports as reports
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store.manifest import RunContext, StageInfo
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary import collect, summarise
from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.timing.client import install, uninstall
from prefect_dask_profiling.timing.plugin import TaskTimings
from prefect_dask_profiling.timing.scope import RUN_ANNOTATION, STAGE_ANNOTATION, RunScope
from prefect_dask_profiling.timing.tasks import MAX_TASK_RECORDS, TaskRecords

WORKERS = [f"tcp://127.0.0.1:{4000 + i}" for i in range(4)]
FIGURES: list[tuple[str, str, str]] = []


def figure(what: str, value: str, how: str) -> None:
    """Record one row of the figures table (and show it at once)."""
    FIGURES.append((what, value, how))
    print(f"  {what}: {value}", flush=True)


# -- 1. a big stage --------------------------------------------------------------------------------

def _scheduler_cpu(dask_scheduler) -> float:
    return time.process_time()


def _n_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def _stage(client: Client, n: int, plugin: bool) -> tuple[float, float, str | None]:
    """Run ``n`` tiny tasks; (wall s, scheduler CPU s, plugin name)."""
    while client.run_on_scheduler(_n_tasks):
        time.sleep(0.05)  # the previous stage's tasks are being forgotten (benchmark only)
    name = install(client, sample_interval=1.0) if plugin else None
    cpu0 = client.run_on_scheduler(_scheduler_cpu)
    t0 = time.perf_counter()
    futures = client.map(operator.pos, range(n), pure=False)
    wait(futures)
    wall = time.perf_counter() - t0
    cpu = client.run_on_scheduler(_scheduler_cpu) - cpu0
    del futures
    return wall, cpu, name


def big_stage(n: int) -> None:
    print(f"1) one stage of {n:,} tiny tasks, LocalCluster 2 workers x 1 thread", flush=True)
    limit = max(n // 2, 1)  # below the task count: the report must say it is cut
    with dask.config.set({"distributed.scheduler.dashboard.tasks.task-stream-length": limit}), \
            LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        _stage(client, 1000, False)  # warm-up
        wall0, cpu0, _ = _stage(client, n, False)
        name = install(client, sample_interval=1.0, task_records=True)
        window = reports.open_window(client, name)
        wall1, cpu1, _ = _stage(client, n, False)  # the plugin installed above records it
        end = reports.close_window(client, window)
        t0 = time.perf_counter()
        rendered = reports.render(client, window, end)
        render_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        record = collect(client, name)
        collect_s = time.perf_counter() - t0
        uninstall(client, name)
    counted = int(record.tasks["tasks"].sum())
    figure(f"{n:,}-task stage: wall without / with plugin (and its task records)",
           f"{wall0:.1f} s / {wall1:.1f} s", "one run each, same cluster")
    figure(f"{n:,}-task stage: scheduler CPU without / with plugin (and its task records)",
           f"{cpu0:.1f} s / {cpu1:.1f} s ({(cpu1 - cpu0) / n * 1e6:+.0f} us per task)",
           "time.process_time() in the scheduler")
    figure(f"{n:,}-task stage: report render / size",
           f"{render_s:.1f} s / {len(rendered.html.encode()) / 1e6:.1f} MB",
           f"reports.render, task records kept {limit:,}")
    figure(f"{n:,}-task stage: report says cut / summary counts",
           f"truncated={rendered.truncated} ({rendered.tasks:,} tasks, buffer {limit:,}) / "
           f"{counted:,} of {n:,} tasks", "RenderedReport.truncated; plugin snapshot")
    figure(f"{n:,}-task stage: collect (snapshot + record)", f"{collect_s:.2f} s",
           "summary.collect")


# -- 2. a million tasks ----------------------------------------------------------------------------

class StagedScope(RunScope):
    """A run told its stage directly (no TaskState to read it from)."""

    current_stage = "default"

    def owner_stage(self, ts) -> str | None:
        return self.current_stage


class StagedTimings(TaskTimings):
    """The plugin without a scheduler, told the stage directly through its scope."""

    scope_type = StagedScope


class AnnotatedScope(RunScope):
    """A run that owns its tasks (``owner_client`` set) and reads each task's stage from its
    annotations, as the profiled runner's plugin does: one stand-in ``TaskState`` a prefix."""

    def task(self, key):
        return _STATES.get(key[:6])


_STATES: dict[str, Any] = {}  # prefix (``op0000``) -> stand-in TaskState


class AnnotatedTimings(TaskTimings):
    """The plugin without a scheduler, reading stages from annotations, keeping records."""

    scope_type = AnnotatedScope


def annotated_plugin(prefixes: int) -> TaskTimings:
    """The plugin as the profiled runner has it: its run's tasks annotated with the run and
    the stage, task records kept for the stage reports (at most ``MAX_TASK_RECORDS``)."""
    plugin = AnnotatedTimings("bench", owner_client="bench-client", sample_interval=0)
    _STATES.clear()
    for p in range(prefixes):
        _STATES[f"op{p:04d}"] = types.SimpleNamespace(
            annotations={RUN_ANNOTATION: "bench", STAGE_ANNOTATION: "work"},
            prefix=types.SimpleNamespace(name=f"op{p:04d}"), run_id=1, who_wants=None,
            waiters=None, state="memory")
    plugin.tasks.records = TaskRecords(MAX_TASK_RECORDS)
    return plugin


def drive(plugin: TaskTimings, n: int, prefixes: int, offset: int = 0) -> float:
    """``n`` finished tasks over ``prefixes`` prefixes; seconds spent in ``transition``."""
    transition = plugin.transition
    t0 = time.perf_counter()
    base = 1.8e9
    for i in range(offset, offset + n):
        t = base + i * 1e-4
        stops = ({"action": "compute", "start": t, "stop": t + 1e-3},)
        transition(f"op{i % prefixes:04d}-{i:032x}", "processing", "memory", startstops=stops,
                   nbytes=8000, worker=WORKERS[i & 3])
    return time.perf_counter() - t0


def million(n: int, records: bool = False) -> None:
    """``records``: the plugin as the profiled runner has it (:func:`annotated_plugin`);
    else the stage told directly and no task records (the figures before ``--records``)."""
    make = partial(annotated_plugin, 50) if records else partial(
        StagedTimings, "bench", sample_interval=0)
    how = ("direct TaskTimings.transition calls, stage from annotations, task records kept"
           if records else "direct TaskTimings.transition calls")
    print(f"2) {n:,} tasks through the plugin (direct transitions, 50 prefixes"
          f"{', annotated, records kept' if records else ''})", flush=True)
    gc.collect()
    seconds = drive(make(), n, 50)  # timing: no tracemalloc
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    plugin = make()
    drive(plugin, n, 50)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    t0 = time.perf_counter()
    record = RunRecord.from_snapshot(plugin.snapshot(), workers=4, threads=4)
    table = summarise(record)
    summary_s = time.perf_counter() - t0
    assert int(table["tasks"].sum()) == n, "the summary lost tasks"
    figure(f"{n:,} tasks: plugin time per task", f"{seconds / n * 1e6:.2f} us", how)
    figure(f"{n:,} tasks: memory held by the plugin", f"{held / 2**20:.2f} MiB",
           "tracemalloc, after gc")
    figure(f"{n:,} tasks: snapshot + summary", f"{summary_s * 1000:.0f} ms",
           "RunRecord.from_snapshot + summarise")


# -- 3. a wide run ---------------------------------------------------------------------------------

def wide_record(prefixes: int, stages: int, tasks_per_prefix: int, seed: int) -> RunRecord:
    plugin = StagedTimings("bench", sample_interval=0)
    rng = np.random.default_rng(seed)
    for s in range(stages):
        plugin.scope.current_stage = f"stage{s:02d}"
        drive(plugin, prefixes * tasks_per_prefix, prefixes,
              offset=int(rng.integers(0, 1000)) * prefixes)
    return RunRecord.from_snapshot(plugin.snapshot(), workers=4, threads=4)


def wide(prefixes: int, stages: int) -> None:
    print(f"3) finish_run on a run of {prefixes} prefixes x {stages} stages, 8 earlier runs",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(f"{tmp}/store", spool_dir=f"{tmp}/spool")
        start = datetime(2025, 1, 1, tzinfo=UTC)
        for i in range(9):
            record = wide_record(prefixes, stages, 2, seed=i)
            ctx = RunContext(run_id=new_run_id(start + timedelta(days=i)), pipeline="wide",
                             version="1")
            stage_infos = [StageInfo(name=f"stage{s:02d}") for s in range(stages)]
            t0 = time.perf_counter()
            result = finish_run(store, record, ctx, stage_infos)
            elapsed = time.perf_counter() - t0
        stored = sum(p.stat().st_size for p in Path(result.location).rglob("*") if p.is_file())
        steps = result.manifest.get("finish_seconds") or {}
    figure(f"finish_run, {prefixes} prefixes x {stages} stages", f"{elapsed:.2f} s "
           f"(status {result.status}, {len(result.summary):,} summary rows)",
           "9th run on a local store; 8 earlier runs as baseline")
    top = sorted(steps.items(), key=lambda kv: -kv[1])[:5]
    figure("  of which (largest steps)", ", ".join(f"{k} {v:.2f} s" for k, v in top),
           "manifest finish_seconds")
    figure("  stored size of that run", f"{stored / 1e6:.2f} MB", "sum of files in its folder")


# -- 4. a long history -----------------------------------------------------------------------------

def small_tasks_table(rng: np.random.Generator) -> pd.DataFrame:
    total = 10.0 * (1 + np.arange(10)) * rng.uniform(0.8, 1.2, 10)
    return pd.DataFrame({"stage": "s", "prefix": [f"p{i}" for i in range(10)], "tasks": 10,
                         "total_s": total, "p50_s": total / 10, "p95_s": total / 5,
                         "gb_out": 0.0, "max_s": total / 4, "errors": 0, "share": 0.1})


def populate(store: RunStore, runs: int) -> str:
    rng = np.random.default_rng(0)
    start = datetime(2000, 1, 1, tzinfo=UTC)
    table = small_tasks_table(rng)
    run_id = ""
    for i in range(runs):
        run_id = new_run_id(start + timedelta(hours=i))
        store.write_run("nightly", run_id, {"tasks": table},
                        {"version": "1", "status": "healthy", "state": "COMPLETED"})
    return run_id


def count_calls(store: RunStore) -> collections.Counter:
    """Count the store's filesystem calls by method (wrapping the instance's ``fs``)."""
    counts: collections.Counter = collections.Counter()
    fs = store.fs
    for method in ("ls", "find", "glob", "cat", "cat_file", "open", "info", "exists", "pipe",
                   "pipe_file", "walk", "isdir", "isfile"):
        original = getattr(fs, method, None)
        if original is None:
            continue

        def counted(*args: Any, _m=method, _o=original, **kwargs: Any) -> Any:
            counts[_m] += 1
            return _o(*args, **kwargs)

        setattr(fs, method, counted)
    return counts


def time_baseline(store: RunStore, latest: str, label: str, runs: int) -> None:
    counts = count_calls(store)
    t0 = time.perf_counter()
    base = load_baseline(store, "nightly", "1", n=8, exclude_run_id=latest)
    seconds = time.perf_counter() - t0
    calls = ", ".join(f"{k} {v}" for k, v in counts.most_common())
    figure(f"baseline load, {runs:,} stored runs, {label}",
           f"{seconds:.2f} s, {sum(counts.values())} fs calls ({calls}); {len(base.runs)} runs",
           "load_baseline(n=8)")


def time_judging_reads(store: RunStore, latest: str, label: str, runs: int,
                       remember: bool) -> None:
    """What finish() reads to judge a run: the baseline, then the drift series."""
    counts = count_calls(store)
    t0 = time.perf_counter()
    with store.remembering_reads() if remember else contextlib.nullcontext():
        load_baseline(store, "nightly", "1", n=8, exclude_run_id=latest)
        series, _ = load_series(store, "nightly", "1", exclude_run_id=latest)
    seconds = time.perf_counter() - t0
    calls = ", ".join(f"{k} {v}" for k, v in counts.most_common())
    how = "remembering reads (as finish() does)" if remember else "each reading for itself"
    figure(f"baseline + drift series, {runs:,} stored runs, {label}, {how}",
           f"{seconds:.2f} s, {sum(counts.values())} fs calls ({calls}); "
           f"{series['run_id'].nunique()} runs in the series",
           "load_baseline(n=8) + drift.load_series(max_runs=60)")


def history(runs: int) -> None:
    print(f"4) baseline load with {runs:,} stored runs of one pipeline", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        local = RunStore(f"{tmp}/store", spool_dir=f"{tmp}/spool")
        t0 = time.perf_counter()
        latest = populate(local, runs)
        print(f"  ({runs:,} runs written locally in {time.perf_counter() - t0:.0f} s)",
              flush=True)
        for measure in (time_baseline, partial(time_judging_reads, remember=False),
                        partial(time_judging_reads, remember=True)):
            measure(RunStore(f"{tmp}/store", spool_dir=f"{tmp}/spool"), latest, "local", runs)
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            print("  (moto not installed: S3 skipped)")
            return
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            options = {"key": "bench", "secret": "bench",
                       "endpoint_url": f"http://{host}:{port}"}
            s3 = RunStore("s3://bench-history", options, spool_dir=f"{tmp}/spool-s3",
                          timeout=120)
            s3.fs.call_s3("create_bucket", Bucket="bench-history")
            t0 = time.perf_counter()
            s3.fs.put(f"{tmp}/store/", "bench-history/", recursive=True)
            print(f"  (copied to moto S3 in {time.perf_counter() - t0:.0f} s)", flush=True)
            for measure in (time_baseline, partial(time_judging_reads, remember=False),
                            partial(time_judging_reads, remember=True)):
                s3 = RunStore("s3://bench-history", options, spool_dir=f"{tmp}/spool-s3",
                              timeout=120)
                measure(s3, latest, "S3 (moto)", runs)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "stage", "million", "wide", "history"),
                        default="all")
    parser.add_argument("--stage-tasks", type=int, default=100_000)
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--prefixes", type=int, default=500)
    parser.add_argument("--stages", type=int, default=10)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--records", action="store_true",
                        help="million: stages from annotations and task records kept, as "
                             "the profiled runner's plugin has them")
    args = parser.parse_args()
    for name in ("stage_tasks", "transitions", "prefixes", "stages", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clusters/servers still stop
    command = " ".join([".venv/bin/python", "benchmarks/scale.py", *sys.argv[1:]])
    if args.part in ("all", "million"):
        million(args.transitions, records=args.records)
    if args.part in ("all", "wide"):
        wide(args.prefixes, args.stages)
    if args.part in ("all", "history"):
        history(args.runs)
    if args.part in ("all", "stage"):
        big_stage(args.stage_tasks)
    print(f"\n$ {command}   ({os.cpu_count()} cores)")
    print(f"| {'what':<70} | {'figure':<60} | how |")
    print(f"|{'-' * 72}|{'-' * 62}|-----|")
    for what, value, how in FIGURES:
        print(f"| {what:<70} | {value:<60} | {how} |")


if __name__ == "__main__":
    main()
