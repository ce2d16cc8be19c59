"""How often Dask runs more tasks than threads while a task is seceded.

A wrapper task (like a Prefect task computing a collection) secedes and persists a small
``nanmedian`` graph on a LocalCluster of one-thread workers; the task stream then shows how
many of the inner tasks ever ran at once on one worker. More than 1 means the worker
oversubscribed its thread, which pushes utilisation of short stages above 1.

    .venv/bin/python benchmarks/investigations/secede_oversubscription.py [--repeats 6]
"""

from __future__ import annotations

import argparse
from collections import Counter

import dask.array as da
import distributed
from distributed import Client, LocalCluster, worker_client


def inner_graph():
    x = da.random.random((8, 600, 600), chunks=(8, 150, 150))
    return da.nanmedian(x, axis=0) + da.isnan(x).sum(axis=0).astype("int16")


def wrapper(mode: str) -> int:
    """Persist the inner graph from inside a task, seceding one of two ways."""
    if mode == "worker_client":
        with worker_client() as client:
            distributed.wait(client.persist(inner_graph()))
    else:
        client = distributed.get_client()
        distributed.secede()
        distributed.wait(client.persist(inner_graph()))
    return 1


def max_concurrency(records: list[dict]) -> int:
    """Most compute intervals open at once on any one worker."""
    by_worker: dict[str, list[tuple[float, int]]] = {}
    for r in records:
        for ss in r["startstops"]:
            if ss["action"] == "compute":
                by_worker.setdefault(r["worker"], []).extend([(ss["start"], 1), (ss["stop"], -1)])
    worst = 0
    for points in by_worker.values():
        open_now = 0
        for _, delta in sorted(points):
            open_now += delta
            worst = max(worst, open_now)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    counts: Counter = Counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        for mode in ["worker_client", "secede"] * args.repeats:
            with distributed.get_task_stream(client=client) as stream:
                client.submit(wrapper, mode, pure=False).result()
            inner = [r for r in stream.data if not str(r["key"]).startswith("wrapper")]
            counts[(mode, max_concurrency(inner))] += 1
    print("inner tasks at once on one 1-thread worker, per repeat:")
    for (mode, worst), n in sorted(counts.items()):
        print(f"  {mode:14s} max {worst}: {n} of {args.repeats}")


if __name__ == "__main__":
    main()
