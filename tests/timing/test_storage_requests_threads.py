"""Storage-request figures on a multi-threaded worker do not depend on thread timing.

Real parts only: moto's S3 server on 127.0.0.1, COGs written with rio-cogeo, GDAL reading
through ``/vsis3/`` in the tasks of a fresh ``LocalCluster`` of one worker process with four
threads per repeat (fresh: GDAL's caches and the plugin's memory start empty every time).

One stage reads every chunk of two scenes x two bands while tasks of another prefix
(``gated``, array chunks computed from an array already in memory) run in the same
process. Which of them overlaps which is thread timing; the test fixes the interleaving
both ways with Dask events (no sleeps, no timing asserts): the ``gated`` tasks finish before
the reads start ("apart"), they are running while every read happens ("beside"), or
nothing is fixed ("free"). The chunk count a stage stores must be the same in every case.
"""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pytest
from distributed import Client, Event, LocalCluster, wait
from helpers.s3_servers import boto_client, moto_server, s3_options

from prefect_dask_profiling.summary.io import io_frame, stage_io_summaries
from prefect_dask_profiling.timing import io_client
from tasks import scenes
from tasks.synthetic import CubeSpec

SPEC = CubeSpec(dates=2, size=256, tile=64)
BUCKET = "threads"
CHUNK = 64
# array chunks the stage reads: scenes x bands x (size / chunk)^2
READ_CHUNKS = SPEC.dates * 2 * (SPEC.size // CHUNK) ** 2
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def archive():
    """The scenes on moto; the GDAL options of the workers that read them."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    try:
        with moto_server() as endpoint:
            boto_client(endpoint).create_bucket(Bucket=BUCKET)
            catalog = scenes.write_scenes(SPEC, f"s3://{BUCKET}/data", s3_options(endpoint))
            found = scenes.search(catalog, SPEC.dates, s3_options(endpoint))
            yield {"found": found, "options": scenes.gdal_options({"endpoint_url": endpoint})}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def gated(block: np.ndarray, started: str, go: str) -> np.ndarray:
    """Say this task runs, then wait for ``go`` (the test sets it after the reads)."""
    Event(started).set()
    if not Event(go).wait(timeout=120):
        raise TimeoutError(f"event {go!r} never set")
    return block * 2


def read_beside_compute(archive, order: str) -> dict:
    """One stage on a fresh 1 x 4-thread worker process: its stored io summary."""
    with LocalCluster(n_workers=1, threads_per_worker=4, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        assert io_client.install(client)
        scenes.configure_workers(client, archive["options"])
        ds = client.submit(scenes.open_scenes, archive["found"], CHUNK, pure=False).result()
        reads = [ds.red.data, ds.nir.data]
        # two chunks: two of the four threads wait in gated tasks, two read
        base = da.ones((SPEC.size, SPEC.size), chunks=(SPEC.size // 2, SPEC.size)).persist()
        wait(base)
        started, go = Event(f"started-{order}"), Event(f"go-{order}")
        # meta given: without it Dask calls ``gated`` on an empty block in this process to
        # infer the output, which would set ``started`` before any task ran and wait for
        # ``go`` until its timeout
        work = base.map_blocks(gated, started.name, go.name,
                               meta=np.empty((0, 0), dtype=base.dtype))
        before = io_client.io_counters(client)
        if order == "apart":
            go.set()
            wait(client.persist(work))
            wait(client.persist(reads))
        elif order == "beside":  # every read happens while the gated tasks run
            running = client.persist(work)
            assert started.wait(timeout=120)
            wait(client.persist(reads))
            go.set()
            wait(running)
        else:
            go.set()
            wait(client.persist([work, *reads]))
        rows = io_client.stage_deltas("read", before, io_client.io_counters(client))
    return stage_io_summaries(io_frame(rows))["read"]


@pytest.mark.timeout(1800)  # three fresh clusters on a loaded 2-core host
def test_the_chunks_a_stage_read_do_not_depend_on_which_tasks_ran_beside_them(archive):
    stored = []
    for order in ("apart", "beside", "free"):
        io = read_beside_compute(archive, order)
        stored.append((order, io.get("chunks"), io.get("requests"),
                       io.get("requests_per_chunk")))
        assert io["requests"] > 0, stored
        assert io["chunks"] == READ_CHUNKS, stored
        assert io["requests_per_chunk"] == pytest.approx(io["requests"] / READ_CHUNKS,
                                                         abs=1e-3), stored
