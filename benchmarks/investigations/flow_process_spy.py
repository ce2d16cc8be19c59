"""Where a profiled run's flow-process CPU goes: py-spy on the tiny or stack flow, per function.

Runs the ``tiny`` flow of :mod:`benchmarks.flow_overhead` (4 stages, each a Prefect task
summing a 400 × 400 array; the scheduler in this process, 2 worker processes × 1 thread, one
Prefect server on 127.0.0.1), or with ``--part stack`` issue 34's stack flow (3 stages of a
24 × 1024 × 1024 cube in 1 × 256 × 256 chunks from the flow body, 8 mapped Prefect tasks
each; a ``dask scheduler`` and 2 ``dask worker`` processes × 2 threads of their own, so this
process is the flow's alone), with the profiled runner's defaults: ``--warmups`` runs, then
``--runs`` runs while ``py-spy record --gil`` samples this process: only the thread holding
the interpreter lock, so a thread waiting for it is not counted as busy (C code that
releases the lock — pandas' parsers, zlib, sockets — is not seen; the printed process CPU
says how much that leaves out). In the tiny flow the scheduler shares the flow process, so
what the profiler adds to this process's CPU is the flow's added wall. ``--plain`` samples
prefect-dask's own runner instead, to compare; ``--raw`` keeps the stacks.

Prints this process's CPU seconds per run, each thread's CPU per run (read from
``/proc/self/task``: the flow body's main thread, the background service's, the event loop
the scheduler and the client share), the samples per thread, and the package's functions
with their inclusive milliseconds of CPU per run. Needs ``py-spy`` (``pip install py-spy``
into the venv; not a dependency) and the right to attach to this process (root, or ptrace
allowed).

    PYTHONPATH=. .venv/bin/python benchmarks/investigations/flow_process_spy.py [--part tiny|stack]
        [--runs 10] [--warmups 3] [--top 40] [--plain] [--raw stacks.txt]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from distributed import Client, LocalCluster
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect_dask import DaskTaskRunner

from benchmarks import flow_overhead
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner

RATE = 200  # samples per second
PACKAGE = "prefect_dask_profiling"


def py_spy() -> str:
    """The ``py-spy`` next to this interpreter, else on the PATH; exits naming the fix."""
    candidate = Path(sys.executable).parent / "py-spy"
    found = str(candidate) if candidate.exists() else shutil.which("py-spy")
    if found is None:
        sys.exit("py-spy not found: pip install py-spy into the venv")
    return found


def functions(raw: Path, runs: int) -> tuple[collections.Counter, collections.Counter, int]:
    """(inclusive samples per package function, samples per thread, all samples) of a
    ``py-spy record -f raw`` file: one line per stack, ``frame;frame;... count``."""
    inclusive: collections.Counter = collections.Counter()
    threads: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        frames, n = stack.split(";"), int(count)
        total += n
        threads[frames[0].split(" (")[0]] += n
        seen = set()
        for frame in frames:
            if PACKAGE not in frame:
                continue
            name, _, where = frame.partition(" (")
            key = f"{name} ({where.split('/')[-1].split(':')[0]})"
            if key not in seen:
                seen.add(key)
                inclusive[key] += n
    return inclusive, threads, total


def thread_cpu() -> collections.Counter:
    """CPU seconds of each thread of this process so far, by thread name (a thread pool's
    threads summed under its prefix; a thread Python does not know by its kernel name)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: collections.Counter = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = names.get(int(tid)) or stat.split("(", 1)[1].rsplit(")", 1)[0]
        out[name.rsplit("_", 1)[0] if name.startswith("ThreadPoolExecutor") else name] += (
            int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


STACK_SHAPE = (24, 1024, 1024)  # flow_overhead's default shape


@contextlib.contextmanager
def _cluster(part: str, tmp: str) -> Iterator[str]:
    """The tiny flow's in-process cluster (the scheduler in this process), or the stack
    shape's scheduler and workers in processes of their own; its address."""
    if part == "stack":
        from helpers.dask_processes import external_cluster

        flow_overhead.SCHEDULER_IN_FLOW[0] = False
        with external_cluster(f"{tmp}/cluster", n_workers=2, nthreads=2) as cluster:
            yield cluster.address
        return
    flow_overhead.SCHEDULER_IN_FLOW[0] = True
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      host="127.0.0.1") as cluster:
        yield cluster.scheduler_address


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmups", type=int, default=3)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--plain", action="store_true",
                        help="sample prefect-dask's plain DaskTaskRunner instead, to compare")
    parser.add_argument("--part", choices=("tiny", "stack"), default="tiny",
                        help="stack: issue 34's stack shape, the scheduler and 2 workers x 2 "
                             "threads in processes of their own (this process is the flow's "
                             "alone)")
    parser.add_argument("--raw", type=Path, default=None,
                        help="also keep py-spy's raw stacks (one line per stack) here")
    args = parser.parse_args()
    if args.runs < 1 or args.warmups < 1 or args.top < 1:
        parser.error("--runs, --warmups and --top must be >= 1")
    spy = py_spy()
    with tempfile.TemporaryDirectory() as tmp, flow_overhead.prefect_server(), \
            temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), \
            _cluster(args.part, tmp) as address, Client(address):
        runner = (DaskTaskRunner(address=address) if args.plain else
                  ProfiledDaskTaskRunner(address=address, store=f"{tmp}/store"))
        shape = STACK_SHAPE if args.part == "stack" else (0, 0, 0)
        chunks = (1, shape[1] // 4, shape[2] // 4) if args.part == "stack" else None
        run = flow_overhead.make_flow(runner, args.part, f"bench-{args.part}-spy", shape,
                                      chunks)
        for _ in range(args.warmups):
            run(return_state=True)
        raw = Path(tmp) / "spy.raw"
        recorder = subprocess.Popen(
            [spy, "record", "-p", str(os.getpid()), "-r", str(RATE), "-f", "raw",
             "-o", str(raw), "--nonblocking", "--gil"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached
        cpu, before = time.process_time(), thread_cpu()
        for _ in range(args.runs):
            run(return_state=True)
        cpu, per_thread = (time.process_time() - cpu) / args.runs, thread_cpu()
        per_thread.subtract(before)
        recorder.send_signal(2)  # SIGINT: py-spy writes what it sampled
        recorder.wait(timeout=60)
        inclusive, threads, total = functions(raw, args.runs)
        if args.raw is not None:
            shutil.copyfile(raw, args.raw)
    per_run = 1000.0 / RATE / args.runs
    variant = "plain" if args.plain else "profiled (defaults)"
    print(f"{args.part} flow, {variant}, {args.runs} runs: this process's CPU "
          f"{cpu:.3f} s per run; py-spy saw {total * per_run / 1000:.3f} s per run")
    print("CPU per thread (/proc/self/task), ms per run:")
    for thread, seconds in per_thread.most_common(8):
        print(f"  {seconds * 1000 / args.runs:7.1f} ms/run  {thread}")
    print("py-spy samples per thread's first frame, ms per run:")
    for thread, n in threads.most_common(4):
        print(f"  {n * per_run:7.1f} ms/run  thread {thread}")
    for name, n in inclusive.most_common(args.top):
        print(f"  {n * per_run:7.1f} ms/run  {name}")


if __name__ == "__main__":
    main()
