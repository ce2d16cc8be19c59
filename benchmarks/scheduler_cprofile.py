"""Where the profiled runs' extra scheduler CPU goes: cProfile on the scheduler's event loop.

Runs the ``stack`` flow of :mod:`benchmarks.flow_overhead` (a ``dask scheduler`` and two
``dask worker`` processes, one Prefect server on 127.0.0.1) plain and profiled, alternated,
``--runs`` times each after a warm-up of each. Around every run a ``cProfile.Profile`` timed
in the thread's CPU seconds (``time.thread_time``) is switched on and off on the scheduler's
event-loop thread through ``run_on_scheduler``, one profile per run (cProfile keys functions
by file, line and name: the plugin's classes, shipped by value, are new code objects every
run, and one profile over several runs would keep one run's entries of them).

Prints the loop thread's CPU per run of each kind and the functions whose cumulative CPU
grew most, per run, profiled minus plain. cProfile adds a fixed cost to every Python call,
so code made of many small calls (a plugin hook per transition) is inflated more than code
that spends its time in C (pickling, sockets): read the list as where to look, and measure
a change with ``flow_overhead.py``.

    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_cprofile.py [--runs 3] [--top 40] \
        [--sort own]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect_dask import DaskTaskRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # dask_processes
from helpers import dask_processes  # noqa: E402

from benchmarks import flow_overhead  # noqa: E402
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner  # noqa: E402

SHAPE, CHUNKS = (24, 1024, 1024), (1, 256, 256)
Entry = tuple[str, int, str]  # (file, line, function), as pstats keys them


def _profile_on(dask_scheduler, name: str) -> None:
    import cProfile
    import time as _time

    profiles = dask_scheduler.__dict__.setdefault("_bench_profiles", {})
    profiles[name] = cProfile.Profile(_time.thread_time)
    profiles[name].enable()


def _profile_off(dask_scheduler, name: str) -> dict:
    """Stop run ``name``'s profile; its stats as
    ``{(file, line, function): (calls, own s, cumulative s)}``."""
    import pstats

    profile = dask_scheduler._bench_profiles.pop(name)
    profile.disable()
    stats = pstats.Stats(profile).stats
    return {key: (value[1], value[2], value[3]) for key, value in stats.items()}


def run(runs: int, top: int, sort: str = "cumulative") -> None:
    kinds: dict[str, list[dict]] = {"plain": [], "profiled": []}
    heartbeats = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with tempfile.TemporaryDirectory() as tmp, flow_overhead.prefect_server(), \
            temporary_settings(updates=heartbeats), \
            dask_processes.external_cluster(tmp + "/cluster", n_workers=2,
                                            nthreads=2) as cluster, \
            Client(cluster.address) as client:
        address = cluster.address
        flows = {
            "plain": flow_overhead.make_flow(DaskTaskRunner(address=address), "stack",
                                             "cprofile-plain", SHAPE, CHUNKS),
            "profiled": flow_overhead.make_flow(
                ProfiledDaskTaskRunner(address=address, store=tmp + "/store"), "stack",
                "cprofile-profiled", SHAPE, CHUNKS),
        }
        for flow_fn in flows.values():  # warm-up: imports, first connections
            flow_fn(return_state=True)
        for i in range(runs):
            for kind in (("plain", "profiled") if i % 2 == 0 else ("profiled", "plain")):
                name = f"{kind}-{i}"
                client.run_on_scheduler(_profile_on, name=name)
                t0 = time.perf_counter()
                state = flows[kind](return_state=True)
                stats = client.run_on_scheduler(_profile_off, name=name)
                kinds[kind].append(stats)
                print(f"  run {i + 1}/{runs} {kind:9s} {time.perf_counter() - t0:6.2f} s "
                      f"{state.name}", flush=True)
    report(kinds, top, sort)


def report(kinds: dict[str, list[dict]], top: int, sort: str = "cumulative") -> None:
    """The loop thread's CPU per run, and the functions whose CPU grew most."""
    mean: dict[str, dict[Entry, list[float]]] = {}
    for kind, profiles in kinds.items():
        acc: dict[Entry, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        for stats in profiles:
            for key, values in stats.items():
                for i, value in enumerate(values):
                    acc[key][i] += value / len(profiles)
        mean[kind] = acc
        own = sum(v[1] for v in acc.values())
        print(f"{kind}: event-loop thread {own:.3f} s of CPU per run (under cProfile)")
    plain, profiled = mean["plain"], mean["profiled"]
    column = 1 if sort == "own" else 2
    rows = []
    for key in set(plain) | set(profiled):
        a = plain.get(key, (0.0, 0.0, 0.0))
        b = profiled.get(key, (0.0, 0.0, 0.0))
        rows.append((b[column] - a[column], a[0], b[0], key))
    print(f"{sort} CPU per run, profiled minus plain (top {top}):")
    print(f"  {'ms':>8} {'calls plain':>12} {'profiled':>9}  function")
    for diff, calls_a, calls_b, (file, line, func) in sorted(rows, reverse=True)[:top]:
        where = file.split("site-packages/")[-1]
        print(f"  {diff * 1000:8.1f} {calls_a:12.0f} {calls_b:9.0f}  {where}:{line} {func}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="profiled runs of each kind")
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--sort", choices=("cumulative", "own"), default="cumulative",
                        help="list by the growth of cumulative CPU (callees included) or of "
                             "the function's own CPU")
    args = parser.parse_args()
    if args.runs < 1 or args.top < 1:
        parser.error("--runs and --top must be >= 1")
    run(args.runs, args.top, args.sort)


if __name__ == "__main__":
    main()
