"""The cost per task of profiling: added CPU on the scheduler, the workers and the flow process.

One Prefect flow (a real Prefect server on 127.0.0.1, as :mod:`benchmarks.flow_overhead`
starts it) with one stage, ``with stage("work"):``, that computes a graph of ``--tasks`` tasks
from the flow body through ``get_dask_client()`` (``client.compute(graph).result()``), on one
``dask scheduler`` and two ``dask worker --nthreads 1`` processes that live across all runs
(``tests/helpers/dask_processes.py``). The plain ``DaskTaskRunner`` and the
``ProfiledDaskTaskRunner``
(defaults: every stage's report drawn in the flow process) are alternated, the first of each
pair swapped every pair, after one warm-up run of each (of at most ``--warmup-tasks``
tasks, under the same flow name).

Graphs (``--graph``):

* **tiny** (default) — ``N`` tasks ``operator.pos(i)`` summed by a tree of ``sum`` tasks
  (fan-in 100, so ``1.01 N`` tasks): the scheduler-bound worst case, every task is overhead.
* **stack** — the median NDVI of a random cube in one-time-step chunks (the shape of
  ``flow_overhead.py --part stack``), ``T`` grown until the graph has about ``N`` tasks.

Around every run each process's CPU seconds are read with psutil (user + system): the
scheduler process, the two worker processes (not their nannies), the flow process (this one,
all threads) and the Prefect server with its children; "after" is read once the scheduler holds
no task and 1 s has passed, so the release of the graph and the profiled runner's plugin
removal count in their run. Before each plain run the workers' storage-request plugin is removed (a
profiled run on a shared cluster leaves it registered for the next run): plain runs measure
workers without it.

The flow process is also read by thread (``psutil``, live threads by name): its main
thread (the flow body and Prefect's engine) and the package's background service (the
reports drawn, the live ETA, the posts to Prefect); a plain run has no background thread.
The scheduler and the workers are split too: each process's main thread (its event loop,
where the plugins' hooks run) and the CPU of its garbage collections (a ``gc.callbacks``
timer, in whichever thread they ran; the scheduler's full collections also apart, with
their count). Two counts say whether the cluster did the same work:
the tasks work stealing moved and the transfers the workers received.

Prints, per process: plain and profiled CPU seconds (medians), the paired ratio (median of
each pair's profiled / plain, 90% bootstrap interval), and the added CPU (median of each
pair's difference, 90% bootstrap interval) per run and per task (µs; the run's tasks are
the graph's). The flow process's added CPU is a per-run figure (its per-task share is the
slope between two ``--tasks``).

A fourth column says how fast the machine was during each run: the median CPU
milliseconds a fixed piece of pure-Python work took, timed once a second by a process of
its own (``probe ms``). The same work taking more CPU milliseconds means the machine (the
host's other tenants, the caches the cores share), not the code, made the run's CPU
seconds grow.

``--spy`` samples the scheduler and each worker with ``py-spy record --gil --nonblocking``
around every measured run (nothing is added to the processes' calls, and they are not
paused): the samples whose stack holds a frame of the package (the plugin by value, the
reads it runs on the scheduler, the workers' storage-request counters) are the package's
own CPU on the cluster, the rest the cluster's. It prints those seconds per run with the
rest, and the package's samples by the package function that was entered first (its
hooks, its reads). Needs ``py-spy`` next to the interpreter or on the ``PATH`` (``pip
install py-spy``; not a dependency) and the right to attach (root, or ptrace allowed).

``--cprofile`` runs one more pair after the measured ones with ``cProfile`` (timed in thread
CPU) on the event-loop thread of the scheduler and of each worker (where the plugins' hooks
run), and prints what grew most, profiled minus plain (``scheduler_cprofile.report``).
cProfile inflates many small Python calls: read it as where the CPU goes, not how much.

    PYTHONPATH=. .venv/bin/python benchmarks/cost_per_task.py [--tasks 10000] [--pairs 5]
        [--graph tiny|stack] [--variants defaults,no-samplers,no-reports] [--cprofile]
        [--warmup-tasks 10000] [--spy [--spy-raw DIR]]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import operator
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import psutil
from dask.delayed import Delayed
from distributed import Client
from prefect import flow, task
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect_dask import DaskTaskRunner, get_dask_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # dask_processes
from helpers import dask_processes  # noqa: E402

from benchmarks import flow_overhead, scheduler_cprofile  # noqa: E402
from benchmarks.investigations.flow_process_spy import py_spy  # noqa: E402
from prefect_dask_profiling import stage  # noqa: E402
from prefect_dask_profiling.bench.report import paired_difference, paired_ratio  # noqa: E402
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled  # noqa: E402
from prefect_dask_profiling.run.background import Background  # noqa: E402
from prefect_dask_profiling.timing import io_client  # noqa: E402

FAN_IN = 100  # of the tiny graph's sum tree
STACK_YX = (512, 512)  # the stack cube's Y, X (chunks of 1 x Y/4 x X/4)
VARIANTS = {  # profiled variants: runner options
    "defaults": {},
    "no-samplers": {"sample_interval": 0},
    "no-reports": {"stage_reports": False},
}
PROCESSES = ("scheduler", "workers", "flow process", "Prefect server")
# the flow process's CPU by thread: its main thread (the flow body, Prefect's engine) and the
# package's one background service (reports, the live ETA, posts); the rest is Prefect's and
# Dask's threads, and threads that ended during the run
FLOW_THREADS = ("flow main", "flow background")
# the cluster's processes split: each one's main thread (the event loop, where the plugins'
# hooks run) and the CPU its garbage collector took, in whichever thread (``gc.callbacks``)
CLUSTER_PARTS = ("scheduler loop", "scheduler gc", "scheduler gc full", "scheduler full gcs",
                 "workers loop", "workers gc")
# what the cluster did, counted: tasks the scheduler's work stealing moved, and the
# transfers the workers received (``WorkerState.transfer_incoming_count_total``)
CLUSTER_COUNTS = ("steals", "transfers")
# with --spy: py-spy's samples (the thread holding the interpreter lock) of the scheduler and
# the workers, in seconds; "ours": the stacks holding a frame of the package
SPY_PARTS = ("scheduler sampled", "scheduler ours", "workers sampled", "workers ours")
SPY_RATE = 100  # samples a second
# the machine's speed while a run ran: the CPU milliseconds a fixed piece of pure-Python work
# took, timed once a second by a process of its own (the median over the run); the same
# work taking more CPU means the machine, not the code, made the run's CPU seconds grow
SPEED = ("probe ms",)
SPEED_PROBE = """
import sys, time
def work():
    d = {}
    for i in range(60000):
        d[i % 997] = d.get(i % 997, 0) + i
with open(sys.argv[1], "a") as out:
    while True:
        t0 = time.thread_time(); work(); took = time.thread_time() - t0
        out.write(f"{time.time()} {took * 1000}\\n"); out.flush()
        time.sleep(1.0)
"""
PACKAGE = "prefect_dask_profiling/"  # in a frame's file (code the process imported)
DYNAMIC = "<dynamic-code>"  # the file of code sent by value: the plugin, its reads, and ours


# -- the work ----------------------------------------------------------------------------------

def tiny_graph(n: int) -> Delayed:
    """``n`` tasks ``pos(i)`` and a sum tree over them (fan-in :data:`FAN_IN`): one result."""
    graph: dict[Any, Any] = {("tiny", i): (operator.pos, i) for i in range(n)}
    keys, level = list(graph), 0
    while len(keys) > 1:
        level += 1
        parents = []
        for j in range(0, len(keys), FAN_IN):
            graph[(f"total-{level}", j // FAN_IN)] = (sum, keys[j:j + FAN_IN])
            parents.append((f"total-{level}", j // FAN_IN))
        keys = parents
    return Delayed(keys[0], graph)


def stack_shape(n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The stack cube (shape, chunks) whose ndvi graph has about ``n`` tasks."""
    y, x = STACK_YX
    chunks = (1, y // 4, x // 4)
    per_step = flow_overhead.tasks_per_stage((4, y, x), chunks) / 4
    t = max(int(n / per_step), 1)
    return (t, y, x), chunks


def graph_of(kind: str, n: int) -> tuple[Any, int]:
    """The stage's graph and its task count (after Dask's optimisation)."""
    if kind == "tiny":
        graph = tiny_graph(n)
    else:
        shape, chunks = stack_shape(n)
        graph = flow_overhead.ndvi_graph(shape, 0, chunks)
    (optimised,) = dask.optimize(graph)
    return graph, len(dict(optimised.__dask_graph__()))


@task
def first_submission() -> int:
    """prefect-dask's ``get_dask_client()`` in a flow body needs the runner's client, which
    its first submission creates (as in ``flow_overhead.py``'s stack flow)."""
    return 0


def make_flow(runner: DaskTaskRunner, name: str, kind: str, n: int):
    """The one-stage flow on ``runner`` (``@profiled`` for a profiled runner)."""

    def body() -> float:
        with stage("work"):
            first_submission.submit().result()
            graph, _ = graph_of(kind, n)
            with get_dask_client() as client:
                return float(client.compute(graph).result())

    fn = profiled(body) if isinstance(runner, ProfiledDaskTaskRunner) else body
    return flow(name=name, version="1", task_runner=runner, log_prints=False)(fn)


# -- CPU per process -----------------------------------------------------------------------------

def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _thread_cpu(name: str) -> float:
    """CPU seconds so far of this process's live thread ``name`` (0 when there is none)."""
    ids = {t.native_id for t in threading.enumerate() if t.name == name}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def _main_thread_cpu(pid: int) -> float:
    """CPU seconds so far of process ``pid``'s main thread (its event loop for ``dask
    scheduler`` and ``dask worker``)."""
    return sum(t.user_time + t.system_time for t in psutil.Process(pid).threads()
               if t.id == pid)


def _gc_timer_on(dask_scheduler=None, dask_worker=None) -> None:
    """Add a ``gc.callbacks`` timer to this process (once): the thread CPU of every
    collection, summed, kept on the module ``gc`` itself so a later call finds it."""
    import gc
    import time as _time
    if getattr(gc, "_bench_gc_cpu", None) is not None:
        return
    # [CPU seconds, start of the current collection, CPU seconds and count of the full ones]
    gc._bench_gc_cpu = [0.0, 0.0, 0.0, 0]

    def timer(phase: str, info: dict) -> None:
        acc = gc._bench_gc_cpu
        if phase == "start":
            acc[1] = _time.thread_time()
            return
        took = _time.thread_time() - acc[1]
        acc[0] += took
        if info.get("generation") == 2:
            acc[2] += took
            acc[3] += 1

    gc.callbacks.append(timer)


def _gc_cpu(dask_scheduler=None, dask_worker=None) -> tuple[float, float, int]:
    """CPU seconds this process's collections took since :func:`_gc_timer_on`: all, the
    full (generation 2) ones, and how many full ones ran."""
    import gc
    return gc._bench_gc_cpu[0], gc._bench_gc_cpu[2], gc._bench_gc_cpu[3]


def _steals(dask_scheduler) -> int:
    """Tasks the scheduler's work stealing has moved so far."""
    stealing = dask_scheduler.extensions.get("stealing")
    return stealing.count if stealing is not None else 0


def _transfers(dask_worker) -> int:
    """Transfers this worker has received so far."""
    return dask_worker.state.transfer_incoming_count_total


def _n_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


class Processes:
    """The cluster's processes, the flow process and the Prefect server: CPU seconds so far."""

    def __init__(self, client: Client, scheduler_pid: int) -> None:
        self.client = client
        self.scheduler_pid = scheduler_pid
        self.worker_pids = sorted(client.run(os.getpid).values())
        client.run_on_scheduler(_gc_timer_on)
        client.run(_gc_timer_on)

    def cpu(self) -> dict[str, float]:
        gc_cpu = self.client.run(_gc_cpu)
        scheduler_gc, scheduler_full, full_gcs = self.client.run_on_scheduler(_gc_cpu)
        return {"scheduler": _cpu(self.scheduler_pid),
                "scheduler loop": _main_thread_cpu(self.scheduler_pid),
                "scheduler gc": scheduler_gc,
                "scheduler gc full": scheduler_full,
                "scheduler full gcs": full_gcs,
                "workers loop": sum(_main_thread_cpu(pid) for pid in self.worker_pids),
                "workers gc": sum(gc[0] for gc in gc_cpu.values()),
                "steals": self.client.run_on_scheduler(_steals),
                "transfers": sum(self.client.run(_transfers).values()),
                "workers": sum(_cpu(pid) for pid in self.worker_pids),
                "flow process": _cpu(os.getpid()),
                "Prefect server": flow_overhead.server_cpu(),
                "flow main": _thread_cpu(threading.main_thread().name),
                "flow background": _thread_cpu(Background.instance().name)}

    def quiet(self, timeout: float = 120.0) -> None:
        """Wait until the scheduler holds no task (the last graph released), then 1 s."""
        deadline = time.monotonic() + timeout
        while self.client.run_on_scheduler(_n_tasks) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)


class Spies:
    """``py-spy record --gil --nonblocking`` on the scheduler and each worker around one run:
    seconds sampled, those in the package's code, and the package's samples by entry.

    Parameters
    ----------
    spy
        The ``py-spy`` executable.
    procs
        The cluster's processes.
    folder
        Where each run's raw stacks are written.
    """

    def __init__(self, spy: str, procs: Processes, folder: Path) -> None:
        self.spy = spy
        self.pids = {"scheduler": [procs.scheduler_pid], "workers": procs.worker_pids}
        self.folder = folder
        self.runs = 0
        #: the package's samples per run kind and entry (its first frame in a stack)
        self.entries: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)

    @contextlib.contextmanager
    def around(self, kind: str) -> Iterator[dict[str, float]]:
        """Sample the cluster while the block runs; the seconds of :data:`SPY_PARTS` land in
        the dict it yields once the block is done."""
        self.runs += 1
        recorders = []
        for where, pids in self.pids.items():
            for pid in pids:
                raw = self.folder / f"{self.runs}-{kind}-{where}-{pid}.raw"
                recorders.append((where, raw, subprocess.Popen(
                    [self.spy, "record", "-p", str(pid), "-r", str(SPY_RATE), "-f", "raw",
                     "-o", str(raw), "--nonblocking", "--gil"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        time.sleep(1.0)  # attached
        out = dict.fromkeys(SPY_PARTS, 0.0)
        try:
            yield out
        finally:
            for where, raw, recorder in recorders:
                recorder.send_signal(signal.SIGINT)  # py-spy writes what it sampled
                recorder.wait(timeout=120)
                sampled, ours = self.read(raw, self.entries[f"{kind} {where}"])
                out[f"{where} sampled"] += sampled / SPY_RATE
                out[f"{where} ours"] += ours / SPY_RATE

    @staticmethod
    def ours(frame: str) -> bool:
        """Whether a py-spy frame (``name (file:line)``) is the package's: its file is in the
        package, or it was sent by value and is neither one of this script's probes nor
        prefect-dask's wrapper of a Prefect task (both kinds of run have that)."""
        name, _, where = frame.partition(" (")
        return PACKAGE in where or (DYNAMIC in where
                                    and name.split(".")[0] not in BENCH_FUNCTIONS
                                    and not name.startswith("PrefectDaskClient."))

    @staticmethod
    def read(raw: Path, entries: collections.Counter) -> tuple[int, int]:
        """(all samples, the package's samples) of one ``py-spy record -f raw`` file (one
        line per stack, ``frame;frame;... count``); the package's counted into ``entries``
        by the first package frame of each stack."""
        sampled = ours = 0
        if not raw.exists():
            return 0, 0
        for line in raw.read_text().splitlines():
            if not line.strip():
                continue
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():  # a frame read while the process changed it (--nonblocking)
                continue
            n = int(count)
            sampled += n
            first = next((f for f in stack.split(";") if Spies.ours(f)), None)
            if first is not None:
                ours += n
                name, _, where = first.partition(" (")
                entries[f"{name} ({where.split(PACKAGE)[-1].split(':')[0]})"] += n
        return sampled, ours

    def print_entries(self, runs_of: dict[str, int], top: int = 12) -> None:
        """The package's sampled CPU by entry, ms per run of each kind."""
        for key, counter in sorted(self.entries.items()):
            runs = runs_of.get(key.split(" ")[0], 1)
            total = sum(counter.values()) * 1000 / SPY_RATE / max(runs, 1)
            print(f"\nthe package's code on the {key.split(' ', 1)[1]}, {key.split(' ')[0]} "
                  f"runs: {total:.0f} ms sampled a run, by the package function entered first:")
            for entry, n in counter.most_common(top):
                print(f"  {n * 1000 / SPY_RATE / max(runs, 1):9.1f} ms  {entry}")


class SpeedProbe:
    """The machine's speed (:data:`SPEED`): a process timing :data:`SPEED_PROBE`'s fixed
    work once a second into a file, read back for a run's window."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.process = subprocess.Popen([sys.executable, "-c", SPEED_PROBE, str(path)])

    def median_ms(self, start: float, stop: float) -> float:
        """The median CPU milliseconds of the probe's work between ``start`` and ``stop``
        (``time.time()``), ``nan`` when none ran."""
        took = [float(ms) for at, ms in (line.split() for line in
                                           self.path.read_text().splitlines() if line)
                if start <= float(at) <= stop]
        return statistics.median(took) if took else float("nan")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def timed_run(flow_fn, procs: Processes, spies: Spies | None = None,
              kind: str = "", speed: SpeedProbe | None = None) -> dict[str, float]:
    """CPU seconds of each process in one flow run (and its wall).

    On a shared cluster (``address=``) a profiled run leaves the workers' storage-request
    plugin registered (another run may count with it): before a plain run it is removed,
    so the plain runs measure workers without it (each profiled run registers it again)."""
    if not isinstance(flow_fn.task_runner, ProfiledDaskTaskRunner):
        with contextlib.suppress(Exception):  # not registered (yet)
            procs.client.unregister_worker_plugin(io_client.PLUGIN_NAME)
    procs.quiet()
    with spies.around(kind) if spies is not None else contextlib.nullcontext({}) as sampled:
        started = time.time()
        before = procs.cpu()
        t0 = time.perf_counter()
        state = flow_fn(return_state=True)
        wall = time.perf_counter() - t0
        if not state.is_completed() and "RegressionDetected" not in (state.message or ""):
            raise RuntimeError(f"flow run ended {state.name}: {state.message}")
        procs.quiet()
        after = procs.cpu()
    probe = {} if speed is None else {"probe ms": speed.median_ms(started, time.time())}
    return {"wall": wall, **{k: after[k] - before[k] for k in before}, **sampled, **probe}


# -- cProfile of the event loops ---------------------------------------------------------------

def _worker_profile_on(dask_worker, name: str) -> None:
    scheduler_cprofile._profile_on(dask_worker, name)


def _worker_profile_off(dask_worker, name: str) -> dict:
    return scheduler_cprofile._profile_off(dask_worker, name)


def profiled_pair(client: Client, flows: dict[str, Any], procs: Processes,
                  tasks: int) -> None:
    """One pair (plain, then defaults) under cProfile on the scheduler's and the workers'
    event-loop threads; what grew most, per process kind."""
    kinds: dict[str, dict[str, list[dict]]] = {"scheduler": {}, "workers": {}}
    for kind in ("plain", "defaults"):
        procs.quiet()
        client.run_on_scheduler(scheduler_cprofile._profile_on, name=kind)
        client.run(_worker_profile_on, name=kind)
        t0 = time.perf_counter()
        flows[kind](return_state=True)
        procs.quiet()
        kinds["scheduler"][kind] = [client.run_on_scheduler(scheduler_cprofile._profile_off,
                                                            name=kind)]
        kinds["workers"][kind] = list(client.run(_worker_profile_off, name=kind).values())
        print(f"  cProfile run {kind:9s} {time.perf_counter() - t0:7.1f} s", flush=True)
    for where, runs in kinds.items():
        print(f"\n{where} (cProfile of the event-loop thread; workers: mean of the 2):")
        scheduler_cprofile.report({"plain": runs["plain"], "profiled": runs["defaults"]},
                                  top=25, sort="own")
        print_ours(runs["defaults"], tasks=tasks)


OURS = ("<dynamic-code>", "prefect_dask_profiling")  # the plugin (by value) and the package


def print_ours(profiles: list[dict], tasks: int, top: int = 20) -> None:
    """The package's own functions in the profiled run (mean over ``profiles``): calls, own
    and cumulative CPU, and their own CPU summed (per task: under cProfile)."""
    acc: dict[tuple, list[float]] = {}
    for stats in profiles:
        for key, values in stats.items():
            if any(mark in key[0] for mark in OURS):
                row = acc.setdefault(key, [0.0, 0.0, 0.0])
                for i, value in enumerate(values):
                    row[i] += value / len(profiles)
    own = sum(row[1] for row in acc.values())
    print(f"the package's functions: {own * 1000:.1f} ms own CPU per run under cProfile "
          f"({own / tasks * 1e6:.2f} us per task); by cumulative CPU (top {top}):")
    print(f"  {'calls':>9} {'own ms':>8} {'cum ms':>8} {'us/call':>8}  function")
    for (file, line, func), (calls, own_s, cum_s) in sorted(
            acc.items(), key=lambda kv: -kv[1][2])[:top]:
        where = file.split("prefect_dask_profiling/")[-1]
        print(f"  {calls:9.0f} {own_s * 1000:8.1f} {cum_s * 1000:8.1f} "
              f"{cum_s / max(calls, 1) * 1e6:8.1f}  {where}:{line} {func}")


# -- main -----------------------------------------------------------------------------------------

@contextlib.contextmanager
def bench_cluster() -> Iterator[tuple[str, Any, Client]]:
    """A Prefect server on 127.0.0.1 (no flow heartbeats), a ``dask scheduler`` and two
    ``dask worker --nthreads 1`` processes, and a client: ``(temporary folder, cluster,
    client)``, all stopped at the end."""
    heartbeats = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with tempfile.TemporaryDirectory() as tmp, flow_overhead.prefect_server(), \
            temporary_settings(updates=heartbeats), \
            dask_processes.external_cluster(tmp + "/cluster", n_workers=2,
                                            nthreads=1) as cluster, \
            Client(cluster.address) as client:
        yield tmp, cluster, client


def run(args: argparse.Namespace) -> None:
    variants = ["plain", *args.variants.split(",")]
    with bench_cluster() as (tmp, cluster, client):
        address = cluster.address
        procs = Processes(client, cluster.scheduler.pid)
        flows = {
            name: make_flow(
                DaskTaskRunner(address=address) if name == "plain" else
                ProfiledDaskTaskRunner(address=address, store=tmp + "/store", **VARIANTS[name]),
                f"cost-{name}", args.graph, args.tasks)
            for name in variants}
        _, tasks = graph_of(args.graph, args.tasks)
        print(f"{args.graph} graph: {tasks:,} tasks in one stage, dask scheduler + 2 dask worker "
              f"--nthreads 1 processes; {args.pairs} alternated pairs of {variants} "
              f"(load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
              f"{os.getloadavg()[2]:.2f})", flush=True)
        for name in variants:  # warm-up: imports, first connections, the store's first run
            runner = flows[name].task_runner
            timed_run(make_flow(runner, f"cost-{name}", args.graph,
                                min(args.tasks, args.warmup_tasks)), procs)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        if args.spy_raw is not None:
            args.spy_raw.mkdir(parents=True, exist_ok=True)
        spies = Spies(py_spy(), procs, args.spy_raw or Path(tmp)) if args.spy else None
        speed = SpeedProbe(Path(tmp) / "speed.log")
        try:
            parts = (*PROCESSES, *FLOW_THREADS, *CLUSTER_PARTS, *CLUSTER_COUNTS,
                     *(SPY_PARTS if spies else ()), *SPEED)
            for i in range(args.pairs):
                order = variants[i % len(variants):] + variants[:i % len(variants)]
                for name in order:
                    row = timed_run(flows[name], procs, spies, name, speed)
                    results[name].append(row)
                    print(f"  pair {i + 1}/{args.pairs} {name:<12} wall {row['wall']:7.1f} s  " +
                          "  ".join(f"{p} {row[p]:7.2f}" for p in parts) +
                          f"  (load {os.getloadavg()[0]:.2f})", flush=True)
        finally:
            speed.close()
        print_results(results, tasks)
        if spies is not None:
            spies.print_entries({name: len(rows) for name, rows in results.items()})
        if args.cprofile and "defaults" in flows:
            profiled_pair(client, flows, procs, tasks)
        print(f"load at the end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
              f"{os.getloadavg()[2]:.2f}")


def print_results(results: dict[str, list[dict[str, float]]], tasks: int) -> None:
    plain = results["plain"]
    for name, rows in results.items():
        if name == "plain":
            continue
        print(f"\n{name} vs plain, {len(rows)} pairs, {tasks:,} tasks a run "
              "(medians; paired: median of the pairs, 90% bootstrap interval):")
        print(f"  {'process':<15} {'plain CPU s':>11} {'profiled':>9} "
              f"{'paired ratio (90% CI)':>24} {'added CPU s/run (90% CI)':>27} "
              f"{'added us/task (90% CI)':>25}")
        for process in ("wall", *PROCESSES):
            mine, theirs = [r[process] for r in rows], [r[process] for r in plain]
            ratio, low, high = paired_ratio(mine, theirs)
            added, a_low, a_high = paired_difference(mine, theirs)
            per_task = (f"{added / tasks * 1e6:.2f} ({a_low / tasks * 1e6:.2f} to "
                        f"{a_high / tasks * 1e6:.2f})")
            print(f"  {process:<15} {statistics.median(theirs):11.2f} "
                  f"{statistics.median(mine):9.2f} "
                  f"{f'{ratio:.3f} ({low:.3f}-{high:.3f})':>24} "
                  f"{f'{added:+.2f} ({a_low:+.2f} to {a_high:+.2f})':>27} {per_task:>25}")
        for part in (*FLOW_THREADS, *CLUSTER_PARTS, *CLUSTER_COUNTS, *SPY_PARTS,
                     *SPEED):  # no ratio
            if part not in rows[0]:
                continue
            added, a_low, a_high = paired_difference([r[part] for r in rows],
                                                     [r[part] for r in plain])
            print(f"  {part:<15} {statistics.median(r[part] for r in plain):11.2f} "
                  f"{statistics.median(r[part] for r in rows):9.2f} {'':>24} "
                  f"{f'{added:+.2f} ({a_low:+.2f} to {a_high:+.2f})':>27}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000,
                        help="tasks of the stage (tiny: plus the 1%% of its sum tree)")
    parser.add_argument("--pairs", type=int, default=5, help="alternated pairs measured")
    parser.add_argument("--graph", choices=("tiny", "stack"), default="tiny")
    parser.add_argument("--variants", default="defaults",
                        help=f"comma-separated profiled variants, of {list(VARIANTS)}")
    parser.add_argument("--warmup-tasks", type=int, default=10_000,
                        help="tasks of each variant's warm-up run (at most --tasks)")
    parser.add_argument("--cprofile", action="store_true",
                        help="then one pair under cProfile on the scheduler and workers")
    parser.add_argument("--spy", action="store_true",
                        help="sample the scheduler and workers with py-spy around each run")
    parser.add_argument("--spy-raw", type=Path, default=None,
                        help="with --spy: keep each run's raw stacks in this folder")
    args = parser.parse_args()
    if args.tasks < 1 or args.pairs < 1:
        parser.error("--tasks and --pairs must be >= 1")
    if set(args.variants.split(",")) - set(VARIANTS):
        parser.error(f"--variants: choose among {list(VARIANTS)}")
    # a `timeout` must still stop the Prefect server and the cluster (context managers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run(args)


# this script's own functions, which it runs on the scheduler and workers by value too
BENCH_FUNCTIONS = frozenset(name for name, value in list(globals().items())
                            if callable(value) and getattr(value, "__module__", "") == __name__)

if __name__ == "__main__":
    main()
