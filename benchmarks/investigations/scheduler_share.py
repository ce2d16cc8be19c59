"""The scheduler's CPU for profiling, by its parts, against a plain stage's (printed figures).

The end-to-end benchmark (``flow_overhead.py --part stack --scheduler-process``) pairs whole
flow runs; on 2 noisy cores the scheduler's plain CPU per run moves by more than the
profiler's part of it, so its paired ratio moves between runs (0.96-1.12 on the same code).
This benchmark measures the scheduler's part *by its parts*, each with an instrument finer
than the noise, on the same stack stage (a 24 x 1024 x 1024 cube in 1 x 256 x 256 chunks,
1,154 tasks, computed on a ``dask scheduler`` and two ``dask worker`` processes of 2 threads):

1. **plain stage**: the scheduler's event-loop CPU (``time.thread_time`` on the loop, read
   through ``run_on_scheduler``) for one stage computed without profiling, median of
   ``--stages`` stages;
2. **the per-task hook**: one such stage's transitions recorded on the scheduler, then
   replayed there through a fresh ``TaskTimings`` keeping the task records the stage
   reports draw, in the scheduler's own call form, ``--replays`` times, in thread CPU
   seconds: what the hook adds to each stage. For reference (not counted), the same replay
   through ``TaskTimings`` without task records and through Dask's ``TaskStreamPlugin``,
   the recorder the reports read before the plugin kept its own, alternated with it;
3. **per-stage and per-run calls**: each scheduler round trip a profiled stage makes (the
   report window's two marks, the plugin's snapshot at the stage's close — the scheduler
   only, whose task counts also serve the ETA's boundary —, the workers' storage counters
   at both ends, the report's data copy) and each the run makes once (registering and
   removing the plugin, the final collection with the workers' transfer logs), repeated
   ``--calls`` times, the loop's CPU over them less the idle loop's over the same wall;
   the plugin's worker sampler, one tick a second (its default ``sample_interval``), and
   the ETA's task-count read, one every ``eta_interval`` (30 s by default), for as long
   as a plain stage runs.

The share printed is (hooks + calls per stage + per-run calls / 3 stages) / plain stage:
the scheduler's added CPU per stage of the stack flow, also against the plain stages'
fastest and slowest.

    PYTHONPATH=. .venv/bin/python benchmarks/investigations/scheduler_share.py \
        [--stages 12] [--replays 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dask
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # dask_processes
from helpers import dask_processes  # noqa: E402

from benchmarks.flow_overhead import ndvi_graph  # noqa: E402
from prefect_dask_profiling.forecast.model import DEFAULT_ETA_INTERVAL_S  # noqa: E402
from prefect_dask_profiling.reports import data as report_data  # noqa: E402
from prefect_dask_profiling.reports import stage_reports as reports  # noqa: E402
from prefect_dask_profiling.stages import stage  # noqa: E402
from prefect_dask_profiling.timing import client as timing_client  # noqa: E402
from prefect_dask_profiling.timing import io_client  # noqa: E402
from prefect_dask_profiling.timing.scope import RUN_ANNOTATION  # noqa: E402

SHAPE, CHUNKS = (24, 1024, 1024), (1, 256, 256)
STAGES_PER_RUN = 3  # the stack flow's stages: the per-run calls are shared out over them
RECORDER = "bench-transition-recorder"
COUNTED = "TaskTimings with task records"  # the hook a profiled run adds


class TransitionRecorder(SchedulerPlugin):
    """Keeps every transition's arguments as the scheduler passes them (the replay's input)."""

    name = RECORDER

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        self.calls.append((key, start, finish, kwargs))


def _loop_cpu(dask_scheduler=None) -> float:
    return time.thread_time()


def _replay(dask_scheduler, name: str, repeats: int) -> dict[str, list[float]]:
    """Replay the recorded transitions through a fresh TaskTimings (run ``name``'s tasks)
    with and without task records, and a fresh TaskStreamPlugin, alternated; thread CPU
    seconds of each pass."""
    from distributed.diagnostics.task_stream import TaskStreamPlugin

    from prefect_dask_profiling.timing.plugin import TaskTimings, task_stream_length
    from prefect_dask_profiling.timing.tasks import TaskRecords

    calls = dask_scheduler.plugins[RECORDER].calls
    out: dict[str, list[float]] = {COUNTED: [], "TaskTimings without task records": [],
                                   "Dask's TaskStreamPlugin": []}

    def one(plugin) -> float:
        t0 = time.thread_time()
        for key, start, finish, kwargs in calls:
            plugin.transition(key, start, finish, **kwargs)
        return time.thread_time() - t0

    for i in range(repeats):
        plugins = []
        for records in (True, False):
            timings = TaskTimings(name, None, 0.0)
            timings.scheduler = timings.scope.scheduler = dask_scheduler
            if records:  # what start() does with task_records=True
                timings.tasks.records = TaskRecords(task_stream_length())
            plugins.append(timings)
        plugins.append(TaskStreamPlugin(dask_scheduler))
        order = list(zip(out, plugins, strict=True))
        for label, plugin in (order if i % 2 == 0 else order[::-1]):
            out[label].append(one(plugin))
    return out


def _ticks(dask_scheduler, name: str, n: int) -> float:
    """Thread CPU seconds of one tick of plugin ``name``'s periodic worker sampler."""
    plugin = dask_scheduler.plugins[name]
    t0 = time.thread_time()
    for _ in range(n):
        plugin._sample_workers()
    return (time.thread_time() - t0) / n


def plain_stages(client: Client, n: int) -> tuple[list[float], list[float]]:
    """The loop's CPU seconds and the wall seconds of each of ``n`` plain stages."""
    cpu, walls = [], []
    for seed in range(n):
        c0, w0 = client.run_on_scheduler(_loop_cpu), time.perf_counter()
        with stage(f"plain-{seed}"):
            client.compute(ndvi_graph(SHAPE, seed, CHUNKS)).result()
        walls.append(time.perf_counter() - w0)
        cpu.append(client.run_on_scheduler(_loop_cpu) - c0)
    return cpu, walls


def hooks(client: Client, replays: int) -> dict[str, list[float]]:
    """Record one stage's transitions (its result kept, so its tasks stay known), replay."""
    client.register_plugin(TransitionRecorder(), name=RECORDER)
    with dask.annotate(**{RUN_ANNOTATION: "bench-run"}), stage("replayed"):
        kept = client.persist(ndvi_graph(SHAPE, 99, CHUNKS))
        kept.compute()
    try:
        return client.run_on_scheduler(_replay, name="bench-run", repeats=replays)
    finally:
        client.unregister_scheduler_plugin(RECORDER)
        del kept


def per_call(client: Client, fn: Callable[[], object], n: int) -> float:
    """The loop's CPU seconds per call of ``fn``, less the idle loop's over the same wall."""
    fn()
    c0, w0 = client.run_on_scheduler(_loop_cpu), time.perf_counter()
    for _ in range(n):
        fn()
    c1, wall = client.run_on_scheduler(_loop_cpu), time.perf_counter() - w0
    time.sleep(wall)
    idle = client.run_on_scheduler(_loop_cpu) - c1
    return max(c1 - c0 - idle, 0.0) / n


def calls(client: Client, n: int, wall: float) -> tuple[dict[str, float], dict[str, float]]:
    """Loop CPU seconds of each per-stage and each per-run scheduler call of a profiled run
    (the worker sampler's ticks: as many as a stage of ``wall`` seconds gets)."""
    name = timing_client.install(client, scope="run", task_records=True)
    io_client.install(client)
    with dask.annotate(**{RUN_ANNOTATION: name}), stage("calls"):
        window = reports.open_window(client, name)
        client.compute(ndvi_graph(SHAPE, 7, CHUNKS)).result()
        end = reports.close_window(client, window)
    stage_calls = {
        "report window marks (2)": per_call(client, lambda: reports.close_window(
            client, reports.open_window(client, name)), n),
        "snapshot at the close": per_call(
            client, lambda: timing_client.snapshot(client, name, transfers=False), n),
        f"ETA task counts ({wall / DEFAULT_ETA_INTERVAL_S:.2f} ticks)":
            wall / DEFAULT_ETA_INTERVAL_S * per_call(
                client, lambda: timing_client.task_counts(client, name), n),
        "storage counters (2)": per_call(client, lambda: (io_client.io_counters(client),
                                                          io_client.io_counters(client)),
                                         n),
        "report data copy": per_call(client, lambda: report_data.fetch(
            client, plugin=name, start=window.start, stop=end.stop, first=window.index,
            last=end.index,
            last_count=window.last_count, end_count=end.count or window.last_count,
            limit=window.stream_limit), max(n // 4, 1)),
        f"worker sampler ({wall:.1f} ticks)": wall * client.run_on_scheduler(
            _ticks, name=name, n=n * 10),
    }
    final = per_call(client, lambda: timing_client.snapshot(client, name), max(n // 4, 1))
    timing_client.uninstall(client, name)
    run_calls = {"final collection": final, "plugin registered and removed": per_call(
        client, lambda: timing_client.uninstall(client, timing_client.install(
            client, scope="run", task_records=True)), max(n // 4, 1))}
    return stage_calls, run_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=12, help="plain stages measured")
    parser.add_argument("--replays", type=int, default=9, help="replays of each hook")
    parser.add_argument("--calls", type=int, default=20, help="repeats of each call")
    args = parser.parse_args()
    if min(args.stages, args.replays, args.calls) < 3:
        parser.error("--stages, --replays and --calls must be >= 3")
    with tempfile.TemporaryDirectory() as tmp, \
            dask_processes.external_cluster(tmp, n_workers=2, nthreads=2) as cluster, \
            cluster.client() as client:
        plain_stages(client, 2)  # warm-up: imports, first connections
        plain, walls = plain_stages(client, args.stages)
        replayed = hooks(client, args.replays)
        stage_calls, run_calls = calls(client, args.calls, statistics.median(walls))
    base = statistics.median(plain)
    print(f"plain stage ({len(plain)} stages, 1,154 tasks): loop CPU median {base:.3f} s "
          f"(min {min(plain):.3f}, max {max(plain):.3f})")
    total = 0.0
    for label, seconds in replayed.items():
        med = statistics.median(seconds)
        total += med if label == COUNTED else 0.0
        print(f"  hook {label:<38} {med * 1000:7.1f} ms per stage "
              f"(min {min(seconds) * 1000:.1f}, max {max(seconds) * 1000:.1f})"
              + ("" if label == COUNTED else " [reference, not counted]"))
    for label, seconds in stage_calls.items():
        total += seconds
        print(f"  per stage: {label:<32} {seconds * 1000:7.1f} ms")
    for label, seconds in run_calls.items():
        total += seconds / STAGES_PER_RUN
        print(f"  per run:   {label:<32} {seconds * 1000:7.1f} ms "
              f"({seconds / STAGES_PER_RUN * 1000:.1f} ms per stage of {STAGES_PER_RUN})")
    low, high = 1 + total / max(plain), 1 + total / min(plain)
    print(f"added per stage {total * 1000:.1f} ms: scheduler CPU {1 + total / base:.3f}x a plain "
          f"stage's (against the plain stages' spread: {low:.3f}-{high:.3f})")


if __name__ == "__main__":
    main()
