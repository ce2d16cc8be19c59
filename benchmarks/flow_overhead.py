"""What profiling costs a whole Prefect flow: plain ``DaskTaskRunner`` vs the profiled runner.

Two flows on one shared cluster each (passed by ``address=``, as a deployment would), one
real Prefect server on 127.0.0.1, runs alternated so drift hits both sides alike:

* **ndvi** — three stages, each a Prefect task computing the median NDVI of a random
  ``T × Y × X`` cube (default 24 × 1024 × 1024) on the Dask cluster (2 workers × 2
  threads); plain vs profiled with default settings (every stage's report, drawn in the flow
  process), ``stage_reports=False`` and ``stage_reports="auto"`` (these stages are too short
  for a report). Prints the ratio of medians, the median of the paired
  ratios (each repeat's run over the plain run of the same repeat, adjacent in time) with
  its 90% bootstrap interval, and how long the scheduler's event loop was blocked: a
  probe coroutine on the scheduler wakes every 5 ms and records each late wake-up (a
  stall) — the longest per run, and the stalls over 20 ms.
* **stack** — the shape issue 34 measured: each stage computes the cube with a chunk per
  time step (``1 × Y/4 × X/4``, as a stack of COGs read one time step per chunk gives;
  1,154 tasks per stage at the default shape instead of 69) **from the flow body** through
  ``get_dask_client()`` (``client.compute(x).result()``), beside 8 Prefect tasks mapped over
  the stage's tiles (:func:`tile_check`, each a small NumPy statistic on a worker: the per-tile
  writes and checks of a nightly flow); ``--chunks`` sets other chunks for either part.
* **tiny** — four stages, each a Prefect task summing a 400 × 400 array, on a long-lived
  2 × 1 cluster, many runs: the fixed cost per run and per stage (least squares over the
  runs' stage counts is not needed: all runs have four stages, so per stage = extra / 4 is
  an upper bound).

Besides the walls, each row has the flow process's CPU seconds (all its threads: Prefect's
engine, our finish, reports, the client's event loop share one interpreter lock, so extra
CPU there is extra wall), the *tail* (from the end of the flow body's work to the flow
call's return: Prefect's end of run plus the runner's finish()) and its garbage-collector
seconds.

The breakdown says where the profiled runs' extra seconds go, in the flow process: the
runner's own functions are wrapped with ``time.perf_counter`` for the benchmark only (no
hook in the package), split by thread (``main`` is the flow's critical path). Scheduler and
worker CPU seconds per run are read from the processes themselves, and the cost of a
runner copy entered in a worker task is timed in a worker.

    .venv/bin/python benchmarks/flow_overhead.py [--part ndvi|stack|tiny|all] [--repeats 3]
        [--tiny-repeats 10] [--shape 24,1024,1024] [--chunks T,Y,X] [--prefect-heartbeats]
        [--scheduler-process] [--variants plain,defaults,...] [--breakdown VARIANT]

``--scheduler-process`` runs the scheduler and workers as separate ``dask scheduler`` /
``dask worker`` processes (as a deployment's cluster would be) instead of an in-process
``LocalCluster``, whose scheduler shares the flow process's GIL: there, anything the flow
process computes (Prefect's own engine, our finish(), a report drawn in the flow) also
delays the scheduler.

Prefect's flow-run heartbeat thread sleeps in whole seconds and the flow's exit joins it, so
with heartbeats on (Prefect's default) every run's wall is rounded up to the next second
after the heartbeat's start: a second-long flow takes 1.09 s or 2.08 s, and any extra cost
shows as 0 or 1 s. The benchmark therefore turns heartbeats off unless
``--prefect-heartbeats`` is given (then the walls are what a default deployment shows).

Each variant also gets the paired ratios of CPU seconds per process (scheduler, workers, flow
process, the Prefect server: its process and children, read with psutil) and of their sum,
"all processes" (the scheduler counted once when a LocalCluster runs it inside the flow
process): CPU seconds move far less than walls on a noisy machine.

``no reports + deadline`` is also paired with ``no reports + eta 1 s`` (the same live ETA,
every second, without a deadline): the cost of judging a deadline (issue 36).

Targets (issue 34, the stack shape with ``--scheduler-process``): all processes' CPU
<= 1.03x plain, scheduler CPU <= 1.05x plain; the tiny flow's added wall <= 0.3 s per run.
Earlier targets (issue 20): defaults (now with every stage's report) <= 1.03x the plain runner; the
scheduler's event loop blocked <= 20 ms per stage report; the tiny flow <= +0.5 s per run
with its 4 reports.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
from distributed import Client, LocalCluster
from prefect import flow, task
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect_dask import DaskTaskRunner, get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.bench.report import paired_ratio
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

NDVI_STAGES = ("ndvi", "median", "reduce")
BODY_END = [0.0]  # when the flow body's own work ended (the runner's finish() comes after)


class GcPauses:
    """Seconds the flow process spent in the garbage collector (``gc.callbacks``), by
    generation: a full collection of a Prefect process's heap is tens of ms."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started

    def total(self) -> float:
        return sum(self.seconds)


GC = GcPauses()
TINY_STAGES = ("read", "clean", "combine", "write")


# -- the work ----------------------------------------------------------------------------------

@task
def ndvi_median(shape: tuple[int, int, int], seed: int,
                chunks: tuple[int, int, int] | None = None) -> float:
    """Median NDVI over time of a random cube, computed on the Dask cluster."""
    return float(ndvi_graph(shape, seed, chunks).compute())


def ndvi_graph(shape: tuple[int, int, int], seed: int,
               chunks: tuple[int, int, int] | None = None) -> da.Array:
    """The median NDVI over time of a random ``shape`` cube, not computed.

    ``chunks`` default: the whole time axis and a quarter of each side (69 tasks per stage
    at the default shape, after Dask's graph optimisation).
    """
    t, y, x = shape
    chunks = chunks or (t, max(y // 4, 1), max(x // 4, 1))
    rs = da.random.RandomState(seed)
    red = rs.random((t, y, x), chunks=chunks).astype("float32")
    nir = rs.random((t, y, x), chunks=chunks).astype("float32")
    ndvi = (nir - red) / (nir + red + 1e-6)
    return da.median(ndvi, axis=0).mean()


def tasks_per_stage(shape: tuple[int, int, int], chunks: tuple[int, int, int] | None) -> int:
    """How many tasks one ndvi stage schedules (its graph after Dask's optimisation)."""
    (optimised,) = dask.optimize(ndvi_graph(shape, 0, chunks))
    return len(dict(optimised.__dask_graph__()))


@task
def tile_check(seed: int, tile: int) -> float:
    """One of a stack stage's mapped Prefect tasks: the mean of a 256 x 256 tile (NumPy, on
    the worker the task runs on; no Dask graph of its own)."""
    rng = np.random.default_rng(seed * TILES + tile)
    return float(rng.random((256, 256), dtype="float32").mean())


TILES = 8  # mapped Prefect tasks per stack stage


@task
def array_sum(n: int) -> float:
    """Sum of an ``n × n`` array of ones (16 chunks) on the Dask cluster."""
    return float(da.ones((n, n), chunks=max(n // 4, 1)).sum().compute())


def make_flow(runner: DaskTaskRunner, kind: str, name: str, shape: tuple[int, int, int],
              chunks: tuple[int, int, int] | None = None):
    """The ndvi, stack or tiny flow on ``runner``; profiled runners get ``@profiled``."""

    def body() -> float:
        total = 0.0
        if kind == "ndvi":
            for seed, stage_name in enumerate(NDVI_STAGES):
                with stage(stage_name):
                    total += ndvi_median.submit(shape, seed, chunks).result()
        elif kind == "stack":
            for seed, stage_name in enumerate(NDVI_STAGES):
                with stage(stage_name):
                    # mapped first: prefect-dask 0.3.7's get_dask_client() in a flow body
                    # needs the runner's client, which its first submission creates
                    tiles = tile_check.map(seed, range(TILES))
                    with get_dask_client() as client:
                        total += float(client.compute(ndvi_graph(shape, seed, chunks)).result())
                    total += sum(f.result() for f in tiles)
        else:
            for stage_name in TINY_STAGES:
                with stage(stage_name):
                    total += array_sum.submit(400).result()
        BODY_END[0] = time.perf_counter()
        return total

    fn = profiled(body) if isinstance(runner, ProfiledDaskTaskRunner) else body
    return flow(name=name, version="1", task_runner=runner, log_prints=False)(fn)


# -- the breakdown -------------------------------------------------------------------------------

class Phases:
    """Seconds spent in named functions of the profiled runner, per thread kind.

    Installed by wrapping attributes for the benchmark; nothing in the package pays for it.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self._undo: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        """Time every call of ``owner.attr`` under ``label`` (skipped if it does not exist)."""
        original = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(
            owner, attr, None)
        if original is None:
            return

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            where = "main" if threading.current_thread() is threading.main_thread() else "bg"
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[f"{label} [{where}]"] += time.perf_counter() - t0
                    self.calls[f"{label} [{where}]"] += 1

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, original))

    def add(self, label: str, seconds: float) -> None:
        with self._lock:
            self.seconds[label] += seconds
            self.calls[label] += 1

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def instrument(phases: Phases) -> None:
    """Wrap the profiled runner's steps that cost time in the flow process."""
    from prefect_dask_profiling.prefect import artifacts, events, publish, session
    from prefect_dask_profiling.reports import data as report_data
    from prefect_dask_profiling.reports import html as report_html
    from prefect_dask_profiling.reports import stage_reports as reports
    from prefect_dask_profiling.run import pipeline as finishing
    from prefect_dask_profiling.run import stages
    from prefect_dask_profiling.store import runs
    from prefect_dask_profiling.timing import client as timing_client
    from prefect_dask_profiling.timing import io_client

    cls = session.Session
    targets = [
        (ProfiledDaskTaskRunner, "__enter__", "runner __enter__ (total)"),
        (ProfiledDaskTaskRunner, "__exit__", "runner __exit__ (total)"),
        (timing_client, "install", "  plugin registration"),
        (cls, "preflight", "  preflight (worker loadability)"),
        (cls, "stage_opened", "stage opened (total)"),
        (reports, "open_window", "  report window open"),
        (io_client, "io_counters", "  workers' storage counters"),
        (cls, "stage_closed", "stage closed (total)"),
        (timing_client, "snapshot", "  plugin snapshot (stage ends + collect)"),
        (reports.StageReports, "_draw", "  stage report render+upload"),
        (reports, "render", "    report render"),
        (report_data, "fetch", "      data copied from the scheduler and workers"),
        (report_html, "render_html", "      HTML drawn (Bokeh, flow process)"),
        (runs.RunStore, "write_report", "    report upload"),
        (reports.StageReports, "drain", "  wait for stage reports"),
        (stages.StageBook, "record", "  collect"),
        (stages, "environment", "  environment fingerprint"),
        (session, "store_record", "  finish_run: summary + record stored"),
        (session, "judge_run", "  finish_run: judged"),
        (session, "complete_run", "  finish_run: completed"),
        (finishing, "_summarise", "    summarise"),
        (runs.RunStore, "write_run", "    store write (record)"),
        (runs.RunStore, "complete_run", "    store write (complete)"),
        (artifacts.Posting, "__init__", "  artifacts: posting started"),
        (artifacts.Posting, "wait", "  artifacts: waited for"),
        (publish.Publisher, "links", "  report links (presign)"),
        (io_client, "raster_fingerprint", "  workers' raster stack"),
        (events, "emit_detection_events", "  Prefect events"),
        (session, "read_history_early", "  history read started (at the run's start)"),
        (cls, "finish", "finish() (total)"),
        (cls, "close", "shutdown (plugin uninstall, stream release)"),
    ]
    for owner, attr, label in targets:
        phases.wrap(owner, attr, label)


def add_finish_steps(phases: Phases, store_dir: str) -> None:
    """Add ``finish_seconds`` (per finishing step) from the newest stored manifest."""
    import json

    manifests = sorted(Path(store_dir).rglob("manifest.json"), key=lambda p: p.stat().st_mtime)
    if not manifests:
        return
    steps = json.loads(manifests[-1].read_text()).get("finish_seconds") or {}
    for name, seconds in steps.items():
        if name not in ("summary",):
            phases.add(f"    step: {name}", seconds)


# -- runs -----------------------------------------------------------------------------------------

def _scheduler_cpu(dask_scheduler) -> float:
    return time.process_time()


def _worker_cpu() -> float:
    return time.process_time()


async def _probe_start(dask_scheduler, interval: float = 0.005) -> None:
    """Start a coroutine on the scheduler's event loop that records its late wake-ups."""
    import asyncio
    import time as _time

    old = dask_scheduler.__dict__.get("_bench_probe")
    if old is not None:
        old[1].cancel()
    state = {"stalls": [], "wakeups": 0}

    async def probe() -> None:
        last = _time.perf_counter()
        while True:
            await asyncio.sleep(interval)
            now = _time.perf_counter()
            late = now - last - interval
            state["wakeups"] += 1
            if late > 0.005:
                state["stalls"].append(late)
            last = now

    dask_scheduler._bench_probe = (state, asyncio.ensure_future(probe()))


def _probe_read(dask_scheduler) -> dict:
    """The stalls recorded since the last read (seconds each, > 5 ms), then reset."""
    state = dask_scheduler._bench_probe[0]
    out = {"stalls": list(state["stalls"]), "wakeups": state["wakeups"]}
    state["stalls"].clear()
    state["wakeups"] = 0
    return out


def _probe_stop(dask_scheduler) -> None:
    probe = dask_scheduler.__dict__.pop("_bench_probe", None)
    if probe is not None:
        probe[1].cancel()


SERVER_PID: list[int] = []  # the Prefect server's process (set by prefect_server())
SCHEDULER_IN_FLOW: list[bool] = [True]  # the scheduler shares the flow process (LocalCluster)


def server_cpu() -> float:
    """CPU seconds the Prefect server's process and its children used so far (0 without)."""
    import psutil

    if not SERVER_PID:
        return 0.0
    try:
        root = psutil.Process(SERVER_PID[0])
        total = 0.0
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total
    except psutil.Error:
        return 0.0


def cpu_seconds(client: Client) -> tuple[float, float]:
    """(scheduler, sum of workers) process CPU seconds so far."""
    return (client.run_on_scheduler(_scheduler_cpu), sum(client.run(_worker_cpu).values()))


def timed_run(flow_fn, client: Client) -> tuple[float, float, float, list[float], float, float,
                                                float, float]:
    """Wall seconds of one flow run, the scheduler's and workers' CPU seconds in it, the
    scheduler's event-loop stalls (seconds, > 5 ms) during it, the flow process's CPU
    seconds (all its threads), the tail: wall seconds from the end of the flow body's
    last stage to the flow call's return (Prefect's end of run, and the runner's finish),
    the flow process's seconds in the garbage collector, and the Prefect server's CPU
    seconds (its process and children) during the run."""
    s0, w0 = cpu_seconds(client)
    p0 = server_cpu()
    client.run_on_scheduler(_probe_read)
    c0, g0 = time.process_time(), GC.total()
    t0 = time.perf_counter()
    state = flow_fn(return_state=True)
    t1 = time.perf_counter()
    wall, flow_cpu, tail = t1 - t0, time.process_time() - c0, t1 - BODY_END[0]
    gc_s = GC.total() - g0
    stalls = client.run_on_scheduler(_probe_read)["stalls"]
    # a noisy machine can make a run look regressed: the flow then fails on purpose, after
    # doing exactly the same work, so the run still counts
    if not state.is_completed() and "RegressionDetected" not in (state.message or ""):
        raise RuntimeError(f"flow run ended {state.name}: {state.message}")
    s1, w1 = cpu_seconds(client)
    return wall, s1 - s0, w1 - w0, stalls, flow_cpu, tail, gc_s, server_cpu() - p0


def all_cpu(row: tuple) -> float:
    """CPU seconds of every process one run used: scheduler, workers, flow process, Prefect
    server (the scheduler counted once when it runs inside the flow process)."""
    wall, sched, workers, _, flow, _, _, server = row
    return (0.0 if SCHEDULER_IN_FLOW[0] else sched) + workers + flow + server


def compare(client: Client, flows: dict[str, Any], repeats: int, phases: Phases,
            store_dir: str, breakdown_of: str) -> dict[str, list[tuple[float, float, float]]]:
    """Run every flow ``repeats`` times, rotating the order; collect the breakdown of one."""
    results: dict[str, list] = {name: [] for name in flows}
    names = list(flows)
    for name in names:  # warm-up: imports, first connections
        options = NDVI_VARIANTS.get(name) or {}
        for _ in range(ETA_WARMUPS if "eta_interval" in options else 1):
            timed_run(flows[name], client)
    phases.reset()
    for i in range(repeats):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            if name == breakdown_of:
                instrument(phases)
            try:
                results[name].append(timed_run(flows[name], client))
            finally:
                phases.restore()
            if name == breakdown_of:
                add_finish_steps(phases, store_dir)
            wall, _, _, stalls, *_ = results[name][-1]
            print(f"  run {i + 1}/{repeats} {name:<26} {wall:7.2f} s, longest scheduler stall "
                  f"{max(stalls, default=0.0) * 1000:6.1f} ms", flush=True)
    return results


def print_results(results: dict[str, list], plain: str) -> None:
    base = statistics.median(r[0] for r in results[plain])
    plain_walls = [r[0] for r in results[plain]]
    print(f"  {'runner':<26} {'median s':>9} {'ratio':>7} {'paired (90% CI)':>21} "
          f"{'min s':>7} {'max s':>7} "
          f"{'sched CPU s':>11} {'worker CPU s':>12} {'max stall ms':>12} "
          f"{'stalls>20ms/run':>15} {'flow CPU s':>10} {'tail s':>7} {'GC s':>6} "
          f"{'server CPU s':>12} {'all CPU s':>9}")
    for name, rows in results.items():
        walls = [r[0] for r in rows]
        med = statistics.median(walls)
        worst = max((max(r[3], default=0.0) for r in rows), default=0.0)
        over = statistics.mean(sum(1 for x in r[3] if x > 0.020) for r in rows)
        paired, low, high = paired_ratio(walls, plain_walls)
        print(f"  {name:<26} {med:9.2f} {med / base:7.3f} "
              f"{f'{paired:.3f} ({low:.3f}-{high:.3f})':>21} {min(walls):7.2f} {max(walls):7.2f} "
              f"{statistics.median(r[1] for r in rows):11.2f} "
              f"{statistics.median(r[2] for r in rows):12.2f} {worst * 1000:12.1f} "
              f"{over:15.1f} {statistics.median(r[4] for r in rows):10.2f} "
              f"{statistics.median(r[5] for r in rows):7.3f} "
              f"{statistics.median(r[6] for r in rows):6.3f} "
              f"{statistics.median(r[7] for r in rows):12.2f} "
              f"{statistics.median(all_cpu(r) for r in rows):9.2f}")
    print_cpu_ratios(results, plain)


def print_cpu_ratios(results: dict[str, list], plain: str) -> None:
    """Paired ratios (90% CI) of each process's CPU seconds to the plain run of the same
    repeat: the overhead figure that holds on a noisy machine (walls move +-20 %)."""
    columns = {"scheduler": 1, "workers": 2, "flow process": 4, "Prefect server": 7}
    if SCHEDULER_IN_FLOW[0]:
        columns.pop("scheduler")  # inside the flow process's figure
    base = results[plain]
    print(f"  CPU seconds, paired ratio to {plain} (90% CI):")
    for name, rows in results.items():
        if name == plain:
            continue
        parts = []
        for label, index in columns.items():
            mine, theirs = [r[index] for r in rows], [r[index] for r in base]
            if min(theirs, default=0.0) > 0:
                ratio, low, high = paired_ratio(mine, theirs)
                parts.append(f"{label} {ratio:.3f} ({low:.3f}-{high:.3f})")
        ratio, low, high = paired_ratio([all_cpu(r) for r in rows], [all_cpu(r) for r in base])
        parts.append(f"all processes {ratio:.3f} ({low:.3f}-{high:.3f})")
        print(f"    {name:<24} " + "; ".join(parts))


def print_partners(results: dict[str, list]) -> None:
    """Each variant against its partner (:data:`PARTNERS`) of the same repeats: the paired
    ratio (90% CI) of the walls, the flow process's CPU and all processes' CPU."""
    for name, partner in PARTNERS.items():
        if name not in results or partner not in results:
            continue
        mine, theirs = results[name], results[partner]
        parts = []
        for label, value in (("wall", lambda r: r[0]), ("flow CPU", lambda r: r[4]),
                             ("all CPU", all_cpu)):
            ratio, low, high = paired_ratio([value(r) for r in mine],
                                            [value(r) for r in theirs])
            parts.append(f"{label} {ratio:.3f} ({low:.3f}-{high:.3f})")
        print(f"  {name} / {partner}, paired (90% CI): " + "; ".join(parts))


def print_breakdown(phases: Phases, runs: int, plain_wall: float) -> None:
    print(f"  breakdown per profiled run (mean of {runs}; % of the plain wall "
          f"{plain_wall:.2f} s; [main] = on the flow's critical path):")
    for label in sorted(phases.seconds, key=_order):
        per_run = phases.seconds[label] / runs
        print(f"    {label:<58} {per_run * 1000:8.1f} ms {100 * per_run / plain_wall:6.2f} % "
              f"({phases.calls[label] / runs:.0f} calls)")


_ORDER = ["runner __enter__", "plugin registration", "preflight", "history read started",
          "stage opened",
          "report window", "storage counters", "stage closed",
          "plugin snapshot", "stage report", "report render",
          "data copied", "HTML drawn", "report upload", "wait for", "finish()", "collect",
          "environment", "finish_run",
          "summarise", "store write (record)", "step:", "store write (complete)", "artifacts",
          "report links", "raster stack", "Prefect events", "shutdown", "runner __exit__"]


def _order(label: str) -> int:
    for n, key in enumerate(_ORDER):
        if key in label:
            return n
    return len(_ORDER)


def worker_copy_cost(client: Client, runner: DaskTaskRunner, n: int = 200) -> float:
    """Seconds a worker task spends duplicating and entering/exiting ``runner``.

    Prefect does this around every task it runs on Dask; timed inside a real worker task
    (where the profiled copy takes its worker-side path), median over the workers.
    """
    import cloudpickle

    blob = cloudpickle.dumps(runner)

    def enter_many(payload: bytes, count: int) -> float:
        import pickle
        import time as _time

        r = pickle.loads(payload)
        t0 = _time.perf_counter()
        for _ in range(count):
            with r.duplicate():
                pass
        return (_time.perf_counter() - t0) / count

    futures = [client.submit(enter_many, blob, n, pure=False, workers=[w])
               for w in client.scheduler_info()["workers"]]
    return statistics.median(client.gather(futures))


# -- main -----------------------------------------------------------------------------------------

@contextlib.contextmanager
def prefect_server() -> Iterator[None]:
    from helpers.prefect_server import running_server, use_server
    from prefect.logging.handlers import APILogHandler

    with running_server(ui=False) as server, use_server(server):
        SERVER_PID[:] = [server.pid]
        try:
            yield
        finally:
            SERVER_PID.clear()
            APILogHandler().flush()  # send the last runs' logs while the server still answers


NDVI_VARIANTS = {  # name: runner options (None: the plain DaskTaskRunner)
    "plain": None,
    "defaults": {},
    "no reports": {"stage_reports": False},
    "auto": {"stage_reports": "auto"},
    # the live ETA updated every second inside a stage (progress artifact, stored
    # estimate), without and with a deadline judged (events): the pair is the deadline's
    # cost. The ETA needs 3 earlier runs of the variant: they get ETA_WARMUPS warm-up runs
    "no reports + eta 1 s": {"stage_reports": False, "eta_interval": 1.0},
    "no reports + deadline": {"stage_reports": False, "deadline": timedelta(hours=4),
                              "eta_interval": 1.0},
}
# variant: the variant it is paired with besides plain (same runs, rotated order)
PARTNERS = {"no reports + deadline": "no reports + eta 1 s"}
ETA_WARMUPS = 3  # warm-up runs of a variant with eta_interval (its ETA's 3 earlier nights)


@contextlib.contextmanager
def ndvi_cluster(args: argparse.Namespace, workdir: str) -> Iterator[str]:
    """A 2-worker x 2-thread cluster: in-process LocalCluster or separate processes."""
    SCHEDULER_IN_FLOW[0] = not args.scheduler_process
    if args.scheduler_process:
        from helpers.dask_processes import external_cluster

        with external_cluster(workdir, n_workers=2, nthreads=2) as cluster:
            yield cluster.address
        return
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0",
                      host="127.0.0.1") as cluster:
        yield cluster.scheduler_address


def run_ndvi(args: argparse.Namespace, store_dir: str, part: str = "ndvi") -> None:
    shape = tuple(int(v) for v in args.shape.split(","))
    chunks = tuple(int(v) for v in args.chunks.split(",")) if args.chunks else (
        (1, max(shape[1] // 4, 1), max(shape[2] // 4, 1)) if part == "stack" else None)
    variants = args.variants.split(",") if args.variants else list(NDVI_VARIANTS)
    unknown = set(variants) - set(NDVI_VARIANTS)
    if unknown or "plain" not in variants:
        raise SystemExit(f"--variants: choose among {list(NDVI_VARIANTS)}, with plain")
    with ndvi_cluster(args, store_dir + "-cluster") as address, Client(address) as client:
        flows = {}
        for name in variants:
            options = NDVI_VARIANTS[name]
            runner = (DaskTaskRunner(address=address) if options is None else
                      ProfiledDaskTaskRunner(address=address, store=store_dir, **options))
            flows[name] = make_flow(runner, part, f"bench-{part}-{name.replace(' ', '-')}",
                                    shape, chunks)
        client.run_on_scheduler(_probe_start)
        phases = Phases()
        where = "separate processes" if args.scheduler_process else "in-process LocalCluster"
        mapped = f" + {TILES} mapped Prefect tasks" if part == "stack" else ""
        print(f"{part} flow: 3 stages of a {shape} cube in chunks of "
              f"{chunks or 'T x Y/4 x X/4'} ({tasks_per_stage(shape, chunks):,} tasks per "
              f"stage{mapped}), 2 workers x 2 threads ({where}), "
              f"{args.repeats} alternated runs each")
        try:
            results = compare(client, flows, args.repeats, phases, store_dir,
                              breakdown_of=args.breakdown or (
                                  "defaults" if "defaults" in flows else ""))
        finally:
            client.run_on_scheduler(_probe_stop)
        print_results(results, "plain")
        print_partners(results)
        plain = statistics.median(r[0] for r in results["plain"])
        if args.breakdown or "defaults" in flows:
            print_breakdown(phases, args.repeats, plain)
        print("  targets: defaults (3 reports) <= 1.03; <= 20 ms of scheduler stall per "
              "report")


def run_tiny(args: argparse.Namespace, store_dir: str) -> None:
    SCHEDULER_IN_FLOW[0] = True
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        address = cluster.scheduler_address
        profiled_runner = ProfiledDaskTaskRunner(address=address, store=store_dir)
        flows = {
            "plain": make_flow(DaskTaskRunner(address=address), "tiny", "bench-tiny-plain",
                               (0, 0, 0)),
            "profiled (defaults)": make_flow(profiled_runner, "tiny", "bench-tiny", (0, 0, 0)),
            "profiled (no reports)": make_flow(
                ProfiledDaskTaskRunner(address=address, store=store_dir, stage_reports=False),
                "tiny", "bench-tiny-noreports", (0, 0, 0)),
        }
        client.run_on_scheduler(_probe_start)
        phases = Phases()
        print(f"tiny flow: 4 stages of a 400x400 sum, 2 workers x 1 thread, "
              f"{args.tiny_repeats} alternated runs each")
        results = compare(client, flows, args.tiny_repeats, phases, store_dir,
                          breakdown_of="profiled (defaults)")
        print_results(results, "plain")
        plain = statistics.median(r[0] for r in results["plain"])
        extra = statistics.median(r[0] for r in results["profiled (defaults)"]) - plain
        print(f"  fixed cost per run: {extra:.3f} s (4 stages, 4 reports; <= {extra / 4:.3f} s "
              "per stage); target <= 0.3 s per run (issue 34)")
        print_breakdown(phases, args.tiny_repeats, plain)
        plain_copy = worker_copy_cost(client, DaskTaskRunner(address=address))
        ours = worker_copy_cost(client, profiled_runner)
        print(f"  runner copy entered per worker task: plain {plain_copy * 1e6:.0f} us, "
              f"profiled {ours * 1e6:.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("ndvi", "stack", "tiny", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny-repeats", type=int, default=10)
    parser.add_argument("--shape", default="24,1024,1024",
                        help="T,Y,X of the ndvi cube (default: ~3 s per stage here)")
    parser.add_argument("--chunks", default="",
                        help="T,Y,X chunks of the cube (default: ndvi T x Y/4 x X/4, "
                             "stack 1 x Y/4 x X/4)")
    parser.add_argument("--prefect-heartbeats", action="store_true",
                        help="keep Prefect's flow-run heartbeats (walls round up to seconds)")
    parser.add_argument("--scheduler-process", action="store_true",
                        help="ndvi, stack: scheduler and workers in their own processes")
    parser.add_argument("--breakdown", default="",
                        help="ndvi, stack: the variant whose breakdown is printed "
                             "(default: defaults)")
    parser.add_argument("--variants", default="",
                        help=f"ndvi, stack: comma-separated subset of {list(NDVI_VARIANTS)}")
    args = parser.parse_args()
    if args.repeats < 1 or args.tiny_repeats < 1:
        parser.error("--repeats and --tiny-repeats must be >= 1")
    if len(args.shape.split(",")) != 3:
        parser.error(f"--shape must be T,Y,X, got {args.shape!r}")
    for flag, value in (("--shape", args.shape), ("--chunks", args.chunks)):
        parts = value.split(",") if value else ["1", "1", "1"]
        if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            parser.error(f"{flag} must be three positive integers T,Y,X, got {value!r}")
    # a `timeout` must still stop the Prefect server and the clusters (context managers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    heartbeats = {} if args.prefect_heartbeats else {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with tempfile.TemporaryDirectory() as store_dir, prefect_server(), \
            temporary_settings(updates=heartbeats):
        for part in ("ndvi", "stack"):
            if args.part in (part, "all"):
                run_ndvi(args, str(Path(store_dir) / part), part)
        if args.part in ("tiny", "all"):
            run_tiny(args, str(Path(store_dir) / "tiny"))


if __name__ == "__main__":
    main()
