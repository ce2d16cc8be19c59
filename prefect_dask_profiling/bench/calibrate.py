"""Per-worker calibration: a fixed numpy kernel timed on each worker → effective threads.

Each worker runs the same kernel ``repeats`` times, pinned with ``workers=[addr]``; its
score is ``1 / median(seconds)``. The calibration index of a worker is its score divided by
the median worker's score, clipped to ``[0.5, 1.5]`` so one odd worker cannot distort the
total. Effective threads = Σ threads × index. A worker whose repeats spread by more than
:data:`UNSTABLE_SPREAD` of their median is flagged: its index is noise, rerun calibration
with more repeats. The spread is the interquartile range of the repeats over their median.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling._util import positive_int, ship_by_value

if TYPE_CHECKING:
    from distributed import Client


CLIP = (0.5, 1.5)
UNSTABLE_SPREAD = 0.25
KERNEL_SIZE = 128
KERNEL_ROUNDS = 150


def kernel(size: int = KERNEL_SIZE, rounds: int = KERNEL_ROUNDS) -> float:
    """Run the fixed calibration kernel; return its wall seconds (measured in the task).

    Small matrix products with an elementwise step: mostly single-threaded, and sensitive
    to both slow cores and GIL contention in the worker process.
    """
    import time

    import numpy as np

    rng = np.random.default_rng(12345)
    a = rng.random((size, size))
    b = rng.random((size, size)) / size
    t0 = time.perf_counter()
    for _ in range(rounds):
        a = np.tanh(a @ b) + 0.5
    return time.perf_counter() - t0


@dataclass
class WorkerCalibration:
    """Calibration of one worker."""

    worker: str
    nthreads: int
    seconds: list[float]
    median_s: float
    score: float
    spread: float
    index_raw: float = 1.0
    index: float = 1.0
    unstable: bool = False


@dataclass
class Calibration:
    """Calibration of a cluster."""

    workers: list[WorkerCalibration]
    total_threads: int
    effective_threads: float
    repeats: int
    unstable: bool
    clip: tuple[float, float] = CLIP
    notes: list[str] = field(default_factory=list)

    @property
    def min_index(self) -> float | None:
        """Smallest unclipped index (a slow worker), ``None`` with fewer than two workers."""
        return min(w.index_raw for w in self.workers) if len(self.workers) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (a side's summary's ``calibration``), with :attr:`min_index`."""
        d = asdict(self)
        d["min_index"] = self.min_index
        return d


def effective_threads(scores: dict[str, float], nthreads: dict[str, int]
                      ) -> tuple[float, dict[str, float], dict[str, float]]:
    """Σ threads × calibration index clipped to :data:`CLIP` (around the median worker,
    1.0).

    Parameters
    ----------
    scores
        Worker → score (higher is faster).
    nthreads
        Worker → threads.

    Returns
    -------
    ``(effective_threads, raw index, clipped index)``.
    """
    if not scores:
        return 0.0, {}, {}
    median = statistics.median(scores.values())
    raw = {w: (s / median if median > 0 else 1.0) for w, s in scores.items()}
    clipped = {w: min(max(v, CLIP[0]), CLIP[1]) for w, v in raw.items()}
    return sum(nthreads[w] * clipped[w] for w in scores), raw, clipped


def spread(seconds: list[float]) -> float:
    """Interquartile range / median of repeated timings (robust to one odd repeat)."""
    if not seconds:
        return float("nan")
    median = statistics.median(seconds)
    if len(seconds) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(seconds, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else float("inf")


def calibrate(client: Client, repeats: int = 5, size: int = KERNEL_SIZE,
              rounds: int = KERNEL_ROUNDS) -> Calibration:
    """Time :func:`kernel` on every worker, one worker at a time.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    repeats
        Timed runs per worker (after one untimed warm-up run).
    """
    positive_int(repeats, "calibration repeats")
    _by_value()
    nthreads = dict(client.nthreads())
    timings: dict[str, list[float]] = {w: [] for w in nthreads}
    keys = []
    for r in range(repeats + 1):
        for worker in sorted(nthreads):
            fut = client.submit(kernel, size, rounds, workers=[worker],
                                allow_other_workers=False, pure=False)
            seconds = fut.result()
            keys.append(fut.key)
            del fut
            if r > 0:
                timings[worker].append(float(seconds))
    wait_forgotten(client, keys)
    per_worker = []
    for worker in sorted(nthreads):
        secs = timings[worker]
        median = statistics.median(secs)
        s = spread(secs)
        per_worker.append(WorkerCalibration(worker, int(nthreads[worker]), secs, median,
                                            1.0 / median if median > 0 else 0.0, s,
                                            unstable=s > UNSTABLE_SPREAD))
    eff, raw, clipped = effective_threads({w.worker: w.score for w in per_worker}, nthreads)
    notes = []
    for w in per_worker:
        w.index_raw, w.index = raw[w.worker], clipped[w.worker]
        if w.index != w.index_raw:
            notes.append(f"{w.worker}: index {w.index_raw:.2f} clipped to {w.index:.2f}")
        if w.unstable:
            notes.append(f"{w.worker}: unstable calibration (spread {w.spread:.0%} of the "
                         f"median over {repeats} repeats); rerun with more repeats")
    return Calibration(per_worker, sum(nthreads.values()), eff, repeats,
                       any(w.unstable for w in per_worker), CLIP, notes)


def _forgotten(dask_scheduler, keys: list) -> bool:
    return not any(k in dask_scheduler.tasks for k in keys)


def wait_forgotten(client: Client, keys: list, timeout: float = 10.0) -> bool:
    """Wait until the scheduler forgot ``keys`` (released results are not reused or timed)."""
    import time

    _by_value()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.run_on_scheduler(_forgotten, keys=keys):
            return True
        time.sleep(0.05)
    return False


def _by_value() -> None:
    """Ship this module by value: the calibration must not need the package on workers."""
    ship_by_value(__name__)
