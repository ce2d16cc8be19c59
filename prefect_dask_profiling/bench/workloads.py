"""Benchmark workloads for ``dask-profiling bench``.

A workload is an importable ``workload(n: int, seed: int)`` returning one aggregate (a Dask
collection, a future or a list of futures); the same ``(n, seed)`` must build the same work
on every cluster, and its task functions must be importable on every worker. Shipped
examples: :func:`matmul`, :func:`monte_carlo_pi`. The ``synthetic_*`` workloads,
:class:`SlowWorker` and :data:`HOLDOUT` are the textbook bottlenecks the classifier's tests
use (docs/diagnosis.md)."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, TypedDict

import dask
import dask.array as da
import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin

from prefect_dask_profiling.errors import BenchInputError

if TYPE_CHECKING:
    from botocore.client import BaseClient

# -- shipped examples ----------------------------------------------------------------------


def matmul(n: int, seed: int):
    """``sum(X @ X.T)`` for a ``4n × 4n`` random matrix in ``n × n`` chunks."""
    x = da.random.default_rng(seed).random((4 * n, 4 * n), chunks=(n, n))
    return (x @ x.T).sum()


def _pi_part(samples: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    xy = rng.random((samples, 2))
    return int(((xy ** 2).sum(axis=1) <= 1.0).sum())


def monte_carlo_pi(n: int, seed: int):
    """Estimate π with 16 independent delayed tasks of ``n × 1000`` samples each."""
    parts = [dask.delayed(_pi_part, pure=True)(n * 1000, seed * 1_000_003 + i)
             for i in range(16)]
    return dask.delayed(lambda counts, total: 4.0 * sum(counts) / total, pure=True)(
        parts, 16 * n * 1000)


# -- synthetic bottlenecks (tests) ---------------------------------------------------------


def _gram_power(block: np.ndarray, rounds: int) -> np.ndarray:
    out = block
    for _ in range(rounds):
        out = np.tanh(out @ block.T) @ block / block.shape[1]
    return out[:1, :1]


def synthetic_compute(n: int, seed: int):
    """Compute-bound: repeated matrix products inside 4 big ``n × n`` chunks, no transfer."""
    x = da.random.default_rng(seed).random((4 * n, n), chunks=(n, n))
    return x.map_blocks(_gram_power, 3, chunks=(1, 1), dtype=float).sum()


def synthetic_scheduler(n: int, seed: int):
    """Scheduler-bound: ``n`` one-element chunks (≈ ``n`` tiny tasks plus a tree reduction)."""
    return da.random.default_rng(seed).random(n, chunks=1).sum()


def synthetic_transfer(n: int, seed: int):
    """Transfer-bound: ``x + x.T`` on a ``n × n`` array of 16 big chunks (all-to-all moves)."""
    x = da.random.default_rng(seed).random((n, n), chunks=(n // 4, n // 4))
    return (x + x.T).sum()


def _spin(iterations: int, seed: int) -> int:
    total = seed
    for _ in range(_slowdown()):
        for i in range(iterations):
            total = (total * 31 + i) % 1_000_003
    return total


def _slowdown() -> int:
    """How many times slower this worker's CPU is (set by :class:`SlowWorker`; else 1)."""
    try:
        from distributed import get_worker

        return int(getattr(get_worker(), SLOWDOWN_ATTRIBUTE, 1))
    except ValueError:  # not in a worker
        return 1


def synthetic_straggler(n: int, seed: int):
    """Straggler-bound with :class:`SlowWorker`: 32 equal pure-Python tasks of ``n`` steps."""
    parts = [dask.delayed(_spin, pure=True)(n, seed * 100 + i) for i in range(32)]
    return dask.delayed(sum, pure=True)(parts)


def synthetic_spill(n: int, seed: int):
    """Spill-bound on small workers: ``n`` chunks of 10 MB held at once, then reduced."""
    x = da.random.default_rng(seed).random((n * 1250, 1000), chunks=(1250, 1000))
    return (x - x.mean(axis=0)).sum()


def synthetic_skewed_task(n: int, seed: int):
    """Straggler by one task: 32 equal pure-Python tasks of ``n`` steps and one of ``100 n``.

    The classic skew of one bad input or one hot partition, on healthy workers.
    """
    parts = [dask.delayed(_spin, pure=True)(n, seed * 100 + i) for i in range(32)]
    parts.append(dask.delayed(_spin, pure=True)(100 * n, seed * 100 + 99))
    return dask.delayed(sum, pure=True)(parts)


def _wait_on_service(requests: int, latency_s: float, seed: int) -> int:
    """``requests`` sequential calls to a service that answers after ``latency_s``."""
    for _ in range(requests):
        time.sleep(latency_s)  # the round trip: the thread waits, the CPU idles
    return seed


def synthetic_io_latency(n: int, seed: int):
    """io-bound: ``n`` tasks each making 5 calls of 20 ms to a (simulated) remote service."""
    parts = [dask.delayed(_wait_on_service, pure=True)(5, 0.02, seed * 1000 + i)
             for i in range(n)]
    return dask.delayed(sum, pure=True)(parts)


S3_ENDPOINT_ENV = "DASK_PROFILING_BENCH_S3"
"""``endpoint,bucket,key`` of the object :func:`s3_read_ranges` reads (read on the client)."""


_S3_CLIENTS: dict[str, BaseClient] = {}
_S3_LOCK = threading.Lock()


def _s3_client(endpoint: str) -> BaseClient:
    """One botocore client per endpoint and process (creating one costs ~0.1 s of CPU)."""
    with _S3_LOCK:
        if endpoint not in _S3_CLIENTS:
            import botocore.session
            from botocore.config import Config

            _S3_CLIENTS[endpoint] = botocore.session.get_session().create_client(
                "s3", endpoint_url=endpoint, region_name="us-east-1",
                aws_access_key_id="testing", aws_secret_access_key="testing",
                config=Config(retries={"max_attempts": 2}))
        return _S3_CLIENTS[endpoint]


def _read_ranges(endpoint: str, bucket: str, key: str, offset: int, size: int,
                 requests: int) -> int:
    """``requests`` sequential range GETs of ``size`` bytes from an S3 object."""
    client = _s3_client(endpoint)
    total = 0
    for i in range(requests):
        start = offset + i * size
        body = client.get_object(Bucket=bucket, Key=key,
                                 Range=f"bytes={start}-{start + size - 1}")["Body"]
        total += len(body.read())
    return total


def s3_read_ranges(n: int, seed: int):
    """io-bound on object storage: ``n`` tasks, each 4 range GETs of 256 KB from one object.

    The object is named by the environment variable :data:`S3_ENDPOINT_ENV`
    (``endpoint,bucket,key``, read on the client) and must hold at least 4 MB. Results are
    byte counts: nothing large moves between workers.
    """
    spec = os.environ.get(S3_ENDPOINT_ENV, "")
    parts_of = spec.split(",")
    if len(parts_of) != 3:
        raise BenchInputError(f"{S3_ENDPOINT_ENV} must be 'endpoint,bucket,key', got {spec!r}")
    endpoint, bucket, key = parts_of
    size = 256 * 1024
    parts = [dask.delayed(_read_ranges, pure=True)(endpoint, bucket, key,
                                                   ((seed * 7 + i) % 4) * 4 * size, size, 4)
             for i in range(n)]
    return dask.delayed(sum, pure=True)(parts)


# -- holdout: written after the thresholds were fixed, never used to tune them -------------


def holdout_sort(n: int, seed: int):
    """Compute-bound (holdout): sort 8 chunks of ``n`` random floats, several times each."""
    x = da.random.default_rng(seed).random(8 * n, chunks=n)
    return x.map_blocks(_sort_rounds, 5, chunks=(1,), dtype=float).sum()


def _sort_rounds(block: np.ndarray, rounds: int) -> np.ndarray:
    out = block
    for i in range(rounds):
        out = np.sort(out * (i + 1.5) % 1.0)
    return out[:1]


def holdout_slow_files(n: int, seed: int):
    """io-bound (holdout): ``n`` tasks, each reading 8 blocks from a filesystem that takes
    30 ms per block (a slow network mount)."""
    parts = [dask.delayed(_slow_file_read, pure=True)(8, 0.03, seed * 1000 + i)
             for i in range(n)]
    return dask.delayed(sum, pure=True)(parts)


def _slow_file_read(blocks: int, latency_s: float, seed: int) -> int:
    import tempfile

    total = 0
    with tempfile.TemporaryFile() as fh:
        fh.write(os.urandom(4096))
        for _ in range(blocks):
            time.sleep(latency_s)
            fh.seek(0)
            total += len(fh.read())
    return total + seed % 2


def holdout_hot_partition(n: int, seed: int):
    """Straggler (holdout): a groupby-like map over 24 partitions where one partition holds
    50 times the rows of the others (numpy work per row)."""
    sizes = [n] * 23 + [50 * n]
    parts = [dask.delayed(_partition_work, pure=True)(size, seed * 100 + i)
             for i, size in enumerate(sizes)]
    return dask.delayed(sum, pure=True)(parts)


def _partition_work(rows: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    total = 0.0
    for _ in range(max(rows // 1000, 1)):
        block = rng.random((1000, 16))
        total += float(np.linalg.svd(block, compute_uv=False)[0])
    return total


def holdout_slow_object(n: int, seed: int):
    """A straggler that waits (holdout, written for issue 22 after its rules): 32 reads of
    ``n`` ms from a slow store and one of ``60 n`` ms (one object behind a slow replica):
    the wall is set by one task while the other threads idle, so splitting or rebalancing
    it comes first (issue 35), and the wait (io) is named beside it."""
    delays = [n / 1000] * 32 + [60 * n / 1000]
    parts = [dask.delayed(_wait_on_service, pure=True)(1, d, seed * 100 + i)
             for i, d in enumerate(delays)]
    return dask.delayed(sum, pure=True)(parts)


# -- holdout written for issue 35 after its rules (floors, the wall-setting straggler) were
# fixed, their expected class stated before they were first run


def holdout_jittered_waits(n: int, seed: int):
    """io-bound (holdout, issue 35): ``n`` calls to a service that answers in 200-400 ms
    (seeded jitter): every task waits, none is an outlier, no straggler sets the wall."""
    rng = np.random.default_rng(seed)
    delays = rng.uniform(0.2, 0.4, size=n)
    parts = [dask.delayed(_wait_on_service, pure=True)(1, float(d), seed * 1000 + i)
             for i, d in enumerate(delays)]
    return dask.delayed(sum, pure=True)(parts)


def holdout_stuck_request(n: int, seed: int):
    """Straggler (holdout, issue 35): 24 numpy tasks of ``n`` rows each and one request
    that hangs for 3 s beside them (a stuck connection): the stage's wall is that request."""
    parts = [dask.delayed(_partition_work, pure=True)(n, seed * 100 + i) for i in range(24)]
    parts.append(dask.delayed(_wait_on_service, pure=True)(1, 3.0, seed))
    return dask.delayed(sum, pure=True)(parts)


def holdout_tree_of_spins(n: int, seed: int):
    """Compute-bound (holdout, issue 35): 16 pure-Python tasks of ``n`` steps combined by a
    pairwise tree whose inner tasks also spin: every task computes, and the few bytes that
    move between workers (integers) are no transfer bottleneck."""
    level = [dask.delayed(_spin, pure=True)(n, seed * 100 + i) for i in range(16)]
    while len(level) > 1:
        level = [dask.delayed(_spin_pair, pure=True)(a, b, n // 4)
                 for a, b in zip(level[::2], level[1::2], strict=True)]
    return level[0]


def _spin_pair(a: int, b: int, steps: int) -> int:
    return _spin(steps, a + b)


HOLDOUT = {"holdout_sort": "compute", "holdout_slow_files": "io",
           "holdout_hot_partition": "straggler", "holdout_slow_object": "straggler",
           "holdout_jittered_waits": "io", "holdout_stuck_request": "straggler",
           "holdout_tree_of_spins": "compute"}
"""Holdout workloads and the class each should get. ``holdout_slow_object`` (one 60x read
among fast ones) was io with straggler second under issue 22's rules; issue 35 made the
straggler lead when one task sets the stage's wall (io is named beside it)."""


SLOWDOWN_ATTRIBUTE = "dask_profiling_slowdown"


class _SlowWorkerState(TypedDict):
    """What a :class:`SlowWorker` ships to the workers: its settings, not its threads."""

    address: str
    threads: int
    factor: int
    _stop: None


class SlowWorker(WorkerPlugin):
    """A worker plugin that makes one worker slow, as if on a slower, busier machine.

    Two effects: GIL-holding busy threads in its process (a noisy neighbour, which the
    calibration kernel measures independently), and a slower CPU for
    :func:`synthetic_straggler`'s tasks, which do ``factor`` times their work there (GIL
    contention alone slows pure-Python tasks too little to be reliable). Register with
    ``client.register_plugin(SlowWorker(address), name="slow-worker")`` and remove with
    ``client.unregister_worker_plugin("slow-worker")`` (which stops the threads).

    Parameters
    ----------
    address
        The worker to slow down; other workers ignore the plugin.
    threads
        Busy threads to start in that worker.
    factor
        How many times slower the straggler workload's tasks run there.
    """

    name = "slow-worker"

    def __init__(self, address: str, threads: int = 3, factor: int = 4) -> None:
        self.address = address
        self.threads = threads
        self.factor = factor
        self._stop: threading.Event | None = None

    def setup(self, worker: Any) -> None:
        if worker.address != self.address:
            return
        setattr(worker, SLOWDOWN_ATTRIBUTE, self.factor)
        self._stop = threading.Event()
        for i in range(self.threads):
            threading.Thread(target=_burn, args=(self._stop,), daemon=True,
                             name=f"slow-worker-{i}").start()

    def teardown(self, worker: Any) -> None:
        if self._stop is not None:
            self._stop.set()
        if hasattr(worker, SLOWDOWN_ATTRIBUTE):
            delattr(worker, SLOWDOWN_ATTRIBUTE)

    def __getstate__(self) -> _SlowWorkerState:
        return {"address": self.address, "threads": self.threads, "factor": self.factor,
                "_stop": None}


def _burn(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(10_000):
            x = (x * 7 + i) % 65_521
