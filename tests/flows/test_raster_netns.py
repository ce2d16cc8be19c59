"""The nightly NDVI flow on real COGs over a moto S3 server across rate-limited links.

The workers of a netns cluster are separate network hosts behind tc-limited veth links; the
scene archive sits on a moto server bound to the cluster's host-side address, so every byte
GDAL reads crosses a worker's link (issue 22). One healthy night runs on that cluster; its
read stage must be diagnosed io-bound, from the stage's own evidence, with the storage
requests counted.

Under load: ``monitor.cpu_per_busy_thread`` counts the CPU of a worker process's threads and
the run-queue wait of its task threads only (the event loop and helper threads wake many times
a second and, on a loaded host, wait each time: counted, they made this stage read as compute
at load average 4). At 4 mbit the stage was io with high confidence at load averages 1.5 and 5
but once undetermined (0.416 CPU per busy thread) on a loaded fresh-clone CI run: the Prefect
read task's own CPU and wait on one worker sit between the io and compute thresholds when the
link is only a few seconds of the stage. At 2 mbit the link carries most of the stage
(measured below in ``RATE``'s comment and in docs/diagnosis.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest
from helpers.bench_fixtures import (
    address_host,
    netns_cluster,
    netns_unavailable,
    prefect_api_on,
    print_verdict,
)
from helpers.ndvi_fixtures import flow_run_id
from helpers.s3_servers import KEY, SECRET, boto_client, moto_server
from helpers.tiers import starts_processes

from flows.nightly_ndvi import nightly_ndvi
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.store.runs import RunStore
from tasks.raster import plan_run
from tasks.scenes import write_scenes

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(netns_unavailable() is not None,
                                 reason=f"netns cluster unavailable: {netns_unavailable()}"),
              pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")]

PIPELINE = "nightly-ndvi"
SIZE = "tiny"
# ~0.25 MB/s a link: each worker's ~1.9 MB of the tiny archive take ~8 s to cross, most of the
# read stage. The stage also holds the Prefect read task's own CPU work (catalogue, opening the
# files: ~1.5 s on one worker), whose wait for a core grows with the host's load; at 4mbit
# that put CPU per busy thread at 0.416 on a loaded CI run (undetermined), at 20mbit the link
# carries each worker's data in 0.75 s of a 4.5 s stage and the stage is not link-bound
RATE = "2mbit"
BUCKET = "ndvi-netns"  # moto keeps buckets per process: apart from the shared history's


@dataclass
class Night:
    """One stored night of the flow run on the netns cluster."""

    store: RunStore
    run_id: str
    manifest: dict
    seconds: float

    def stage(self, name: str) -> dict:
        return next(s for s in self.manifest["stages"] if s["name"] == name)

    def print_stage(self, name: str) -> None:
        """The stage's verdict with its evidence, storage requests and each worker process's
        CPU and run-queue wait (what ``monitor.cpu_per_busy_thread`` is made of)."""
        stage = self.stage(name)
        print_verdict(f"stage {name}", stage["diagnosis"])
        print(f"  IO {stage.get('io')}")
        io = self.store.read_table(PIPELINE, self.run_id, "io")
        for row in io[io["stage"] == name].itertuples():
            print(f"  CPU {row.worker}: {row.cpu_s:.2f} s used, {row.task_wait_s:.2f} s waited "
                  f"for in {row.seconds:.2f} s, {row.chunks} chunks")


@pytest.fixture
@starts_processes("the netns cluster")
def night(prefect_server, tmp_path, monkeypatch) -> Night:
    """One healthy tiny night on 2 netns workers x 1 thread reading scenes from moto.

    The credentials go to the environment before the cluster starts: the netns tool hands
    the caller's environment to the worker processes, where GDAL and s3fs read them. The
    scenes are uploaded from here (the data step is not what is measured), so the night has
    no ``prepare`` stage.
    """
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    store = str(tmp_path / "store")
    with netns_cluster(workers=2, nthreads=1, rate=RATE) as address:
        host = address_host(address)
        with moto_server(host=host) as endpoint, prefect_api_on(host):
            boto_client(endpoint).create_bucket(Bucket=BUCKET)
            data, options = f"s3://{BUCKET}/data", {"endpoint_url": endpoint}
            write_scenes(plan_run(SIZE).catalogue, data, options)
            runner = ProfiledDaskTaskRunner(address=address, on_regression="warn")
            started = time.monotonic()
            state = nightly_ndvi.with_options(task_runner=runner)(
                size=SIZE, store=store, data_url=data, data_storage_options=options,
                return_state=True)
            seconds = time.monotonic() - started
    assert state.is_completed(), state.message
    runs = RunStore(store)
    [run] = runs.list_runs(PIPELINE)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"FLOW RUN {flow_run_id(state)}: {seconds:.1f} s on {RATE} links (load {load})")
    return Night(store=runs, run_id=run["run_id"],
                 manifest=runs.read_manifest(PIPELINE, run["run_id"]), seconds=seconds)


def test_reading_scenes_across_rate_limited_links_is_io_bound(night):
    for stage in night.manifest["stages"]:
        night.print_stage(stage["name"])
    read = night.stage("read")
    assert read["io"]["requests"] > 0 and read["io"]["bytes"] > 0, read["io"]
    diagnosis = read["diagnosis"]
    assert diagnosis["primary"] == "io", diagnosis["note"]
    supporting = {s["signal"] for s in diagnosis["signals"] if s["supports"]}
    # waiting off the CPU (process CPU), on bytes fetched from storage (storage requests:
    # ~3.7 MB, against the little that Dask moved to the read tasks)
    assert {"monitor.cpu_per_busy_thread", "storage.fetched_share"} <= supporting, \
        diagnosis["signals"]
