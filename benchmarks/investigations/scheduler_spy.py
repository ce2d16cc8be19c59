"""Where the profiled runs' extra scheduler CPU goes, sampled: py-spy on the scheduler process.

Runs the ``stack`` flow of :mod:`benchmarks.flow_overhead` (a ``dask scheduler`` and two
``dask worker`` processes, one Prefect server on 127.0.0.1) plain and profiled, alternated,
``--runs`` times each after a warm-up of each. Around every run ``py-spy record --gil``
samples the scheduler process (the thread holding the interpreter lock only, so nothing
waiting is counted; C code that releases the lock is not seen), one record per run.

Unlike :mod:`benchmarks.scheduler_cprofile` nothing is added to each Python call, so the
per-task hooks are not inflated against the scheduler's own work. Prints the milliseconds
per run of each kind, then the code paths (the first ``--depth`` frames under the event
loop's dispatch) whose samples grew most, profiled minus plain. Needs ``py-spy`` (``pip
install py-spy`` into the venv; not a dependency) and the right to attach (root, or ptrace
allowed).

    PYTHONPATH=. .venv/bin/python benchmarks/investigations/scheduler_spy.py [--runs 6] [--top 30] \
        [--depth 2]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect_dask import DaskTaskRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # dask_processes
from helpers import dask_processes  # noqa: E402

from benchmarks import flow_overhead  # noqa: E402
from benchmarks.investigations.flow_process_spy import py_spy  # noqa: E402
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner  # noqa: E402

SHAPE, CHUNKS = (24, 1024, 1024), (1, 256, 256)
RATE = 250  # samples per second
# frames of the event loop's own dispatch, skipped before a path is keyed
PLUMBING = ("_bootstrap", "Thread.run", "run_forever", "_run_once", "Handle._run",
            "run_until_complete", "Runner.run", "asyncio_run", "<module>", "main (",
            "_run_module", "_run_code", "run_loop", "wrapper (", "__step", "_wrap_awaitable",
            "IOLoop._run_callback", "IOLoop.start", "gen.py", "invoke", "main_command",
            "Command.", "Context.", "_run_callback", "run_cli", "Server._handle_comm",
            "Server.handle_stream")


def _pid(dask_scheduler=None) -> int:
    import os

    return os.getpid()


def path_of(stack: str, depth: int) -> str:
    """The first ``depth`` frames of ``stack`` (``a;b;c`` as py-spy writes it) under the
    event loop's dispatch, each ``function[file]``."""
    frames = [f for f in stack.split(";") if not any(p in f for p in PLUMBING)]
    names = []
    for frame in frames[:depth]:
        name, _, where = frame.partition(" (")
        names.append(f"{name}[{where.split('/')[-1].split(':')[0]}]")
    return " > ".join(names) or "<loop>"


def read(raw: Path, depth: int, grep: str | None = None) -> collections.Counter:
    """Samples per path of one ``py-spy record -f raw`` file (of the stacks holding a
    frame named ``grep``, when given: keyed from that frame on)."""
    out: collections.Counter = collections.Counter()
    if not raw.exists():
        return out
    for line in raw.read_text().splitlines():
        if line.strip():
            stack, count = line.rsplit(" ", 1)
            if grep is not None:
                at = stack.find(grep)
                if at < 0:
                    continue
                stack = stack[at:]
            out[path_of(stack, depth)] += int(count)
    return out


def run(runs: int, top: int, depth: int, grep: str | None = None,
        keep: Path | None = None) -> None:
    spy = py_spy()
    samples: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    heartbeats = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with tempfile.TemporaryDirectory() as tmp, flow_overhead.prefect_server(), \
            temporary_settings(updates=heartbeats), \
            dask_processes.external_cluster(tmp + "/cluster", n_workers=2,
                                            nthreads=2) as cluster, \
            Client(cluster.address) as client:
        address, pid = cluster.address, client.run_on_scheduler(_pid)
        flows = {
            "plain": flow_overhead.make_flow(DaskTaskRunner(address=address), "stack",
                                             "spy-plain", SHAPE, CHUNKS),
            "profiled": flow_overhead.make_flow(
                ProfiledDaskTaskRunner(address=address, store=tmp + "/store"), "stack",
                "spy-profiled", SHAPE, CHUNKS),
        }
        for flow_fn in flows.values():  # warm-up: imports, first connections
            flow_fn(return_state=True)
        for i in range(runs):
            for kind in (("plain", "profiled") if i % 2 == 0 else ("profiled", "plain")):
                raw = Path(tmp) / f"{kind}-{i}.raw"
                recorder = subprocess.Popen(
                    [spy, "record", "-p", str(pid), "-r", str(RATE), "-f", "raw", "-o",
                     str(raw), "--nonblocking", "--gil"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # attached
                t0 = time.perf_counter()
                state = flows[kind](return_state=True)
                wall = time.perf_counter() - t0
                recorder.send_signal(2)  # SIGINT: py-spy writes what it sampled
                recorder.wait(timeout=60)
                samples[kind].update(read(raw, depth))
                if grep is not None:
                    samples[f"{kind} {grep}"].update(read(raw, depth, grep))
                if keep is not None and raw.exists():
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(raw, keep / raw.name)
                print(f"  run {i + 1}/{runs} {kind:9s} {wall:6.2f} s {state.name}", flush=True)
    report(samples, runs, top)


def report(samples: dict[str, collections.Counter], runs: int, top: int) -> None:
    """Milliseconds per run of each kind, and the paths that grew most."""
    per = 1000.0 / RATE / runs
    plain, profiled = samples["plain"], samples["profiled"]
    for kind, counter in samples.items():
        print(f"{kind}: scheduler {sum(counter.values()) * per:.0f} ms of sampled CPU per run "
              "(the sleep before each run included: idle loop)")
        if " " in kind:  # the --grep stacks, by path from the frame
            for key, n in counter.most_common(top):
                print(f"  {n * per:7.1f}  {key}")
    rows = sorted(set(plain) | set(profiled), key=lambda k: plain[k] - profiled[k])
    print(f"sampled ms per run, profiled minus plain (top {top}):")
    print(f"  {'+ms':>7} {'plain':>7} {'profiled':>8}  path")
    for key in rows[:top]:
        print(f"  {(profiled[key] - plain[key]) * per:+7.1f} {plain[key] * per:7.1f} "
              f"{profiled[key] * per:8.1f}  {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="runs of each kind")
    parser.add_argument("--top", type=int, default=30, help="paths listed")
    parser.add_argument("--depth", type=int, default=2, help="frames per path")
    parser.add_argument("--raw", type=Path, default=None,
                        help="also keep each run's raw stacks in this folder")
    parser.add_argument("--grep", default=None,
                        help="also print the ms per run of the stacks holding this frame")
    args = parser.parse_args()
    if min(args.runs, args.top, args.depth) < 1:
        parser.error("--runs, --top and --depth must be >= 1")
    run(args.runs, args.top, args.depth, args.grep, args.raw)


if __name__ == "__main__":
    main()
