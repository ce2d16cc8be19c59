"""What the scheduler sends in a profiled run, against a plain one: messages, bytes, CPU.

Runs the ``stack`` flow of :mod:`benchmarks.flow_overhead` (a ``dask scheduler`` and two
``dask worker`` processes, one Prefect server on 127.0.0.1) plain and profiled, alternated,
``--runs`` times each after a warm-up of each. On the scheduler, ``TCP.write`` is wrapped
(through ``run_on_scheduler``; the scheduler is this benchmark's own) to count, per run,
what it writes: batched stream messages by the ops they hold (``compute-task`` to workers,
``key-in-memory`` to clients, …) and single messages (replies to RPCs such as ``run``:
the profiled run's snapshots and report data) — how many, the bytes, and the thread CPU
seconds the write took (serializing and sending; a write that waits for the socket counts
the loop's other work meanwhile, so read the CPU as an upper bound).

Prints the means per run, plain and profiled, largest CPU growth first.

    PYTHONPATH=. .venv/bin/python benchmarks/investigations/scheduler_messages.py \
        [--runs 3] [--top 15]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from distributed import Client
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect_dask import DaskTaskRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # dask_processes
from helpers import dask_processes  # noqa: E402

from benchmarks import flow_overhead  # noqa: E402
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner  # noqa: E402

SHAPE, CHUNKS = (24, 1024, 1024), (1, 256, 256)
Tally = dict[str, list[float]]  # kind of write: [count, bytes, CPU seconds]


def _count_writes(dask_scheduler) -> None:
    """Wrap ``TCP.write`` in the scheduler process to tally every write by its kind."""
    import collections as _collections
    import time as _time

    from distributed.comm.tcp import TCP

    dask_scheduler.__dict__.setdefault("_bench_writes",
                                       _collections.defaultdict(lambda: [0, 0, 0.0]))
    if getattr(TCP, "_bench_counted", False):
        return
    write = TCP.write

    async def counted(self, msg, serializers=None, on_error="message"):
        start = _time.thread_time()
        n = await write(self, msg, serializers=serializers, on_error=on_error)
        if isinstance(msg, list):
            ops = sorted({m.get("op", "?") for m in msg if isinstance(m, dict)})
            kind = "batch: " + ", ".join(ops)
        elif isinstance(msg, dict):
            kind = "single: " + str(msg.get("op", msg.get("status", "?")))
        else:
            kind = "single: " + type(msg).__name__
        tally = dask_scheduler._bench_writes[kind]
        tally[0] += 1
        tally[1] += n or 0
        tally[2] += _time.thread_time() - start
        return n

    TCP.write = counted
    TCP._bench_counted = True


def _take(dask_scheduler) -> Tally:
    """The tally since the last call, and a fresh one."""
    tally = dask_scheduler.__dict__.get("_bench_writes", {})
    out = {kind: list(values) for kind, values in tally.items()}
    tally.clear()
    return out


def run(runs: int, top: int) -> None:
    totals: dict[str, Tally] = {"plain": {}, "profiled": {}}
    heartbeats = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with tempfile.TemporaryDirectory() as tmp, flow_overhead.prefect_server(), \
            temporary_settings(updates=heartbeats), \
            dask_processes.external_cluster(tmp + "/cluster", n_workers=2,
                                            nthreads=2) as cluster, \
            Client(cluster.address) as client:
        address = cluster.address
        flows = {
            "plain": flow_overhead.make_flow(DaskTaskRunner(address=address), "stack",
                                             "messages-plain", SHAPE, CHUNKS),
            "profiled": flow_overhead.make_flow(
                ProfiledDaskTaskRunner(address=address, store=tmp + "/store"), "stack",
                "messages-profiled", SHAPE, CHUNKS),
        }
        for flow_fn in flows.values():  # warm-up: imports, first connections
            flow_fn(return_state=True)
        client.run_on_scheduler(_count_writes)
        for i in range(runs):
            for kind in (("plain", "profiled") if i % 2 == 0 else ("profiled", "plain")):
                client.run_on_scheduler(_take)
                flows[kind](return_state=True)
                for what, values in client.run_on_scheduler(_take).items():
                    into = totals[kind].setdefault(what, [0, 0, 0.0])
                    for j, value in enumerate(values):
                        into[j] += value / runs
                print(f"  run {i + 1}/{runs} {kind}", flush=True)
    report(totals, top)


def report(totals: dict[str, Tally], top: int) -> None:
    """Per run: each kind of write, plain and profiled, largest CPU growth first."""
    plain, profiled = totals["plain"], totals["profiled"]
    empty = [0, 0, 0.0]
    for name, tally in totals.items():
        print(f"{name}: {sum(v[1] for v in tally.values()) / 1e6:.2f} MB written, "
              f"{sum(v[2] for v in tally.values()) * 1000:.0f} ms in the writes, per run")
    kinds = sorted(set(plain) | set(profiled),
                   key=lambda k: plain.get(k, empty)[2] - profiled.get(k, empty)[2])
    print(f"  {'writes':>7} {'':>7} {'MB':>7} {'':>7} {'ms':>7} {'':>7}  kind")
    print(f"  {'plain':>7} {'prof.':>7} {'plain':>7} {'prof.':>7} {'plain':>7} {'prof.':>7}")
    for kind in kinds[:top]:
        a, b = plain.get(kind, empty), profiled.get(kind, empty)
        print(f"  {a[0]:7.0f} {b[0]:7.0f} {a[1] / 1e6:7.2f} {b[1] / 1e6:7.2f} "
              f"{a[2] * 1000:7.1f} {b[2] * 1000:7.1f}  {kind[:70]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind")
    parser.add_argument("--top", type=int, default=15, help="kinds of write listed")
    args = parser.parse_args()
    if args.runs < 1 or args.top < 1:
        parser.error("--runs and --top must be >= 1")
    run(args.runs, args.top)


if __name__ == "__main__":
    main()
