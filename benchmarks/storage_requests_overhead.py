"""What counting storage requests costs the nightly flow's Dask work (issue 22: <= 1%).

One moto S3 server and one 2-worker x 1-thread LocalCluster on 127.0.0.1; the nightly
flow's work on real COGs (search the static STAC catalog, read through GDAL ``/vsis3/``,
NDVI, temporal median, computed) run alternately on two identical clusters, one **with**
the storage-requests worker plugin (installed before GDAL loads, as the runner does: GDAL's
own statistics on) and one **without** it (GDAL's statistics off); GDAL's caches are
cleared before every run, so every run fetches. Each run is one stage; with the plugin its
two counter readings (stage open and close, ``client.run`` on every worker) and the
chunks-against-blocks check are inside the timed window, as in the runner. Prints per-run
walls, the ratio of medians and the per-stage boundary cost.

    .venv/bin/python benchmarks/storage_requests_overhead.py [--repeats 5] [--size tiny]

The workload is the ``tiny`` or ``small`` size of :mod:`tasks.raster`; the Prefect flow adds
seconds of orchestration around it, so the whole flow's overhead is lower than the ratio
printed here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


BOUNDARY: list[float] = []  # stage-close cost: counters, deltas, chunks against blocks


def one_run(client, catalog: str, options: dict, plan, counted: bool) -> float:
    from distributed import wait

    from prefect_dask_profiling.timing import io_client
    from tasks import raster, scenes

    scenes.configure_workers(client, scenes.gdal_options(options))
    started = time.perf_counter()
    before = io_client.io_counters(client) if counted else None
    ds = client.submit(raster.open_catalogue, catalog, plan, options, pure=False).result()
    ds = client.persist(ds)
    wait(ds)
    median = client.compute(raster.temporal_median(raster.ndvi(ds))).result()
    if counted:
        t = time.perf_counter()
        after = io_client.io_counters(client)
        io_client.stage_deltas("read", before, after)
        io_client.check_alignment(client, before, after)
        BOUNDARY.append(time.perf_counter() - t)
    seconds = time.perf_counter() - started
    del ds, median
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    from distributed import Client, LocalCluster
    from helpers.s3_servers import boto_client, moto_server

    from prefect_dask_profiling.timing import io_client
    from tasks import raster, scenes

    plan = raster.plan_run(args.size)
    with moto_server() as endpoint:
        boto_client(endpoint).create_bucket(Bucket="bench")
        options = {"endpoint_url": endpoint}
        catalog = scenes.write_scenes(plan.catalogue, "s3://bench/data", options)
        kwargs = {"n_workers": 2, "threads_per_worker": 1, "processes": True,
                  "dashboard_address": ":0"}
        with LocalCluster(**kwargs) as c_on, Client(c_on) as on_client, \
                LocalCluster(**kwargs) as c_off, Client(c_off) as off_client:
            assert io_client.install(on_client)
            clients = {True: on_client, False: off_client}
            for counted, client in clients.items():  # warm-up: imports, first opens
                one_run(client, catalog, options, plan, counted)
            walls: dict[bool, list[float]] = {True: [], False: []}
            for i in range(args.repeats):
                for counted in ((True, False) if i % 2 else (False, True)):
                    walls[counted].append(one_run(clients[counted], catalog, options, plan,
                                                  counted))
            boundary = []
            for _ in range(20):
                t = time.perf_counter()
                io_client.io_counters(on_client)
                boundary.append(time.perf_counter() - t)
    on, off = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"size {args.size}: {plan.catalogue.dates} scenes of {plan.catalogue.size} px, "
          f"{args.repeats} runs per side, alternated")
    print("without plugin s:", " ".join(f"{w:.2f}" for w in walls[False]))
    print("with plugin    s:", " ".join(f"{w:.2f}" for w in walls[True]))
    print(f"median without {off:.3f} s, with {on:.3f} s: ratio {on / off:.4f} "
          f"({100 * (on / off - 1):+.2f}%)")
    print(f"one counter reading on all workers (a stage boundary makes two): median "
          f"{1000 * statistics.median(boundary):.1f} ms")
    print(f"stage close with the plugin (reading, deltas, chunks against blocks): median "
          f"{1000 * statistics.median(BOUNDARY):.1f} ms")


if __name__ == "__main__":
    main()
