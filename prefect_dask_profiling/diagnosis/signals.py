"""The classifier's signals, extracted from one side's measurement (pure, I/O already done).

:func:`extract_signals` builds the signal dict that
:func:`prefect_dask_profiling.diagnosis.classify.classify` reads, from: fine performance metrics
(:func:`fine_signals`), task start/stop records and batch windows (:func:`task_signals`),
the scheduler's event-loop load (:func:`scheduler_signals`), the workers' transfer logs
(:func:`transfer_signals`), worker CPU samples and run-queue accounting
(:func:`worker_signals`), memory and spill samples (:func:`memory_signals`) and the
calibration.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any, TypedDict

from prefect_dask_profiling.diagnosis.classify import Signals


class SchedulerProbe(TypedDict):
    """One reading of the scheduler's event loop (``bench.probes.scheduler_probe``)."""

    time: float
    loop_cpu: float
    loop_wait: float | None
    ticks: int
    tick_total: float
    tick_interval: float


class WorkerProbe(TypedDict):
    """One reading of a worker (``bench.probes.worker_probe``): tasks executed, execute
    seconds, incoming transfers ``(who, bytes, seconds)``, the process's schedstat
    ``(monotonic s, CPU s, wait s)``, its task threads' ``{thread: (CPU s, wait s)}``, its
    network namespace and the bytes received / written (``None`` where not readable)."""

    executed: int
    exec_s: float
    incoming: list[tuple[str | None, int, float]]
    schedstat: tuple[float, float, float] | None
    task_threads: dict[int, tuple[float, float]]
    netns: str | None
    net_recv: float | None
    io_write: float | None


class Batch(TypedDict):
    """One measured batch of a bench side (``bench.measure``): its ``n`` tasks' start, end
    and wall, aggregates per batch, and how many of them succeeded (the errors of the
    others)."""

    n: int
    start: float
    end: float
    wall_s: float
    aggregates: int
    succeeded: int
    errors: list[str]



class StartStop(TypedDict):
    """One phase of a task in Dask's task stream: its ``action`` (``compute``,
    ``transfer``, ``disk-read``, ``disk-write``) and its start and stop (epoch seconds)."""

    action: str
    start: float
    stop: float


class StreamRecord(TypedDict, total=False):
    """One record of ``Client.get_task_stream``: the task's Dask ``key`` (a name or a
    tuple), the ``worker`` that ran it and its phases (the keys read here; Dask's records
    carry more)."""

    key: str | tuple
    worker: str
    startstops: list[StartStop]


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or ``None`` when either is missing or ``den`` is zero or NaN."""
    if num is None or den is None or not den or den != den:
        return None
    return num / den


def fine_signals(delta: dict[Any, float]) -> dict[str, float | None]:
    """Signals from a delta of ``scheduler.cumulative_worker_metrics``."""
    def total(pred: Callable[[tuple], bool]) -> float:
        return sum(v for k, v in delta.items() if isinstance(k, tuple) and pred(k))

    def execute(activity: str) -> float:
        return total(lambda k: k[0] == "execute" and k[-2] == activity and k[-1] == "seconds")

    cpu, noncpu = execute("thread-cpu"), execute("thread-noncpu")
    overhead = execute("executor") + execute("other")
    network = total(lambda k: k[0] == "gather-dep" and k[-2] == "network"
                    and k[-1] == "seconds")
    disk = total(lambda k: "disk" in str(k[-2]) and k[-1] == "seconds")
    code = cpu + noncpu
    return {
        "fine.thread_cpu_s": cpu, "fine.thread_noncpu_s": noncpu,
        "fine.overhead_s": overhead, "fine.network_s": network, "fine.disk_s": disk,
        "fine.cpu_fraction": ratio(cpu, code),
        "fine.code_share": ratio(code, code + overhead + network + disk),
        "fine.overhead_share": ratio(overhead, code + overhead),
        "fine.network_share": ratio(network, code + network),
        "fine.disk_share": ratio(disk, code + disk),
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def task_signals(stream: list[StreamRecord], batches: list[Batch], threads: int,
                 workers: list[str]) -> Signals:
    """Signals from task start/stop records (the task stream) and the batch windows."""
    from dask.utils import key_split

    compute: list[tuple[str, str, float, float]] = []
    transfer_s = disk_s = 0.0
    for rec in stream:
        for ss in rec.get("startstops") or ():
            action, d = ss.get("action"), ss["stop"] - ss["start"]
            if action == "compute":
                compute.append((rec.get("worker"), key_split(rec.get("key")), ss["start"],
                                ss["stop"]))
            elif action == "transfer":
                transfer_s += d
            elif action in ("disk-read", "disk-write"):
                disk_s += d
    wall = sum(b["wall_s"] for b in batches)
    durations = [stop - start for _, _, start, stop in compute]
    compute_s = sum(durations)
    median = _quantile(durations, 0.5)
    p95 = _quantile(durations, 0.95)
    skew, slow = _worker_skew(compute)
    task_skew, skewed = _task_skew(compute, wall)
    return {
        "tasks.count": len(compute), "tasks.compute_s": compute_s,
        "tasks.median_s": median, "tasks.p95_s": p95,
        "tasks.typical_s": _weighted_median(durations),
        "tasks.p95_p50": ratio(p95, median),
        "tasks.per_s": ratio(len(compute), wall),
        "tasks.busy_fraction": ratio(compute_s, threads * wall),
        "tasks.transfer_share": ratio(transfer_s, compute_s + transfer_s),
        "tasks.disk_share": ratio(disk_s, compute_s),
        "tasks.worker_skew": skew, "tasks.task_skew": task_skew,
        "tasks.longest_share": ratio(max(durations, default=None), wall),
        "tasks.tail_fraction": _tail_fraction(compute, batches, workers),
        "context.slow_worker": slow,
        "context.straggler": _straggler_name(skew, slow, task_skew, skewed),
    }


def _straggler_name(worker_skew: float | None, slow: str | None, task_skew: float | None,
                    skewed: str | None) -> str | None:
    """Name what lags: a task prefix (one long task) or a worker, whichever stands out more."""
    by_task = (task_skew or 0.0) / 5.0
    by_worker = (worker_skew or 0.0) / 2.0
    if skewed and by_task >= max(by_worker, 1.0):
        return f"task prefix {skewed} (longest task {task_skew:.1f}x its prefix's p95)"
    if slow and by_worker >= 1.0:
        return f"worker {slow} ({worker_skew:.1f}x the fastest worker's task time)"
    return None


MIN_SKEW_TASKS = 10
"""Tasks a prefix needs before its longest task is compared with its p95."""
MIN_STRAGGLER_SHARE = 0.1
"""Share of the measured wall a prefix's longest task must reach to count as skew: one task
of a tiny prefix preempted for 10 ms on a loaded host is far outside its p95 and costs the
stage nothing."""


def _task_skew(compute: list[tuple[str, str, float, float]],
               wall: float | None = None) -> tuple[float | None, str | None]:
    """Largest ratio of a prefix's longest task to the p95 of its other tasks.

    The longest task is left out of the p95 so that one outlier cannot hide itself in a
    small prefix. Prefixes with fewer than :data:`MIN_SKEW_TASKS` tasks, whose p95 is
    under a millisecond (timer noise), or whose longest task is under
    :data:`MIN_STRAGGLER_SHARE` of ``wall`` (immaterial), are skipped.
    """
    by_prefix: dict[str, list[float]] = {}
    for _, prefix, start, stop in compute:
        by_prefix.setdefault(prefix, []).append(stop - start)
    best: tuple[float | None, str | None] = (None, None)
    for prefix, durations in by_prefix.items():
        if len(durations) < MIN_SKEW_TASKS:
            continue
        rest = sorted(durations)[:-1]
        p95 = _quantile(rest, 0.95)
        if not p95 or p95 < 0.001 or (wall and max(durations) < MIN_STRAGGLER_SHARE * wall):
            continue
        r = max(durations) / p95
        if best[0] is None or r > best[0]:
            best = (r, prefix)
    return best


def _weighted_median(durations: list[float]) -> float | None:
    """Duration of the task a random compute-second falls in (time-weighted median).

    The plain median of a graph with a few big tasks and many tiny ones is tiny; this is
    the granularity where the time actually goes.
    """
    total = sum(durations)
    if not durations or total <= 0:
        return None
    acc = 0.0
    for d in sorted(durations):
        acc += d
        if acc >= total / 2:
            return d
    return durations[-1]


def _worker_skew(compute: list[tuple[str, str, float, float]]) -> tuple[float | None, str | None]:
    """Slowest / fastest worker's median task time, each task normalised by its prefix."""
    by_prefix: dict[str, list[float]] = {}
    for _, prefix, start, stop in compute:
        by_prefix.setdefault(prefix, []).append(stop - start)
    medians = {p: statistics.median(v) for p, v in by_prefix.items()
               if len(v) >= 4 and statistics.median(v) >= 0.001}
    per_worker: dict[str, list[float]] = {}
    for worker, prefix, start, stop in compute:
        if prefix in medians:
            per_worker.setdefault(worker, []).append((stop - start) / medians[prefix])
    worker_medians = {w: statistics.median(v) for w, v in per_worker.items() if len(v) >= 3}
    if len(worker_medians) < 2:
        return None, None
    slow = max(worker_medians, key=worker_medians.get)
    fastest = min(worker_medians.values())
    return (ratio(worker_medians[slow], fastest), slow)


def _tail_fraction(compute: list[tuple[str, str, float, float]], batches: list[Batch],
                   workers: list[str]) -> float | None:
    """Mean share of each batch during which workers sat idle waiting for the last one."""
    if len(workers) < 2:
        return None
    weighted = total = 0.0
    for b in batches:
        tasks = [t for t in compute if t[2] >= b["start"] - 0.05 and t[3] <= b["end"] + 0.05]
        if not tasks:
            continue
        first = min(t[2] for t in tasks)
        end = max(t[3] for t in tasks)
        span = end - first
        if span <= 0:
            continue
        last = {w: first for w in workers}
        for w, _, _, stop in tasks:
            if w in last:
                last[w] = max(last[w], stop)
        idle = sum(end - s for s in last.values()) / (len(workers) * span)
        weighted += idle * span
        total += span
    return weighted / total if total else None


def scheduler_signals(before: SchedulerProbe, after: SchedulerProbe, n_tasks: int,
                      typical_s: float | None, wall: float) -> dict[str, float | None]:
    """Signals from the scheduler's event-loop thread CPU and tick counters.

    ``wall`` is the measured time (sum of batch walls); the loop's CPU between batches
    (forgetting results) is small and counted against it. ``scheduler.loop_busy`` is the
    loop thread's CPU plus its run-queue wait (when the kernel reports it) per second of wall:
    the time the loop wanted a core. ``typical_s`` is the median
    task duration: what most tasks cost (a few tasks slowed by a loaded host move the
    time-weighted median by 100x, which made the overhead ratio unstable).
    """
    cpu = after["loop_cpu"] - before["loop_cpu"]
    wanted = cpu
    if after.get("loop_wait") is not None and before.get("loop_wait") is not None:
        wanted += after["loop_wait"] - before["loop_wait"]
    ticks = after["ticks"] - before["ticks"]
    per_task = ratio(cpu, n_tasks)
    mean_tick = ratio(after["tick_total"] - before["tick_total"], ticks)
    return {"scheduler.cpu_s": cpu, "scheduler.cpu_per_task_s": per_task,
            "scheduler.overhead_ratio": ratio(per_task, typical_s),
            "scheduler.loop_busy": ratio(wanted, wall),
            "scheduler.tick_mean_ms": None if mean_tick is None else mean_tick * 1000,
            "scheduler.tick_lag": ratio(mean_tick, after.get("tick_interval"))}


def transfer_signals(workers_after: dict[str, WorkerProbe], threads: int,
                     wall: float) -> dict[str, float | None]:
    """Signals from the workers' incoming transfer logs."""
    entries = [e for w in workers_after.values() for e in w.get("incoming", [])]
    nbytes = float(sum(e[1] or 0 for e in entries))
    seconds = float(sum(e[2] or 0.0 for e in entries))
    return {"transfer.count": len(entries), "transfer.mb_moved": nbytes / 1e6,
            "transfer.mb_per_transfer": ratio(nbytes / 1e6, len(entries)),
            "transfer.seconds": seconds,
            "transfer.bandwidth_mb_s": ratio(nbytes / 1e6, seconds),
            "transfer.wait_fraction": ratio(seconds, threads * wall)}


def worker_signals(before: dict[str, WorkerProbe], after: dict[str, WorkerProbe],
                   nthreads: dict[str, int]) -> Signals:
    """Signals from the worker probes: per-worker execute seconds per task and run-queue
    accounting (``worker.cpu_demand`` = CPU used + CPU waited for, per thread)."""
    per_task = {}
    for w, a in after.items():
        b = before.get(w, {"executed": 0, "exec_s": 0.0})
        executed = a["executed"] - b["executed"]
        if executed >= 3:
            per_task[w] = (a["exec_s"] - b["exec_s"]) / executed
    skew = None
    if len(per_task) >= 2 and min(per_task.values()) > 0:
        skew = max(per_task.values()) / min(per_task.values())
    wanted = available = 0.0
    for w, a in after.items():
        b = before.get(w) or {}
        if not a.get("schedstat") or not b.get("schedstat"):
            continue
        (t1, c1, q1), (t0, c0, q0) = a["schedstat"], b["schedstat"]
        wanted += (c1 - c0) + (q1 - q0)
        available += (t1 - t0) * max(int(nthreads.get(w) or 1), 1)
    demand = min(wanted / available, 1.0) if available > 0 else None
    return {"worker.seconds_per_task_skew": skew, "worker.cpu_demand": demand}


def schedstat_cpu_seconds(before: dict[str, WorkerProbe], after: dict[str, WorkerProbe],
                          wanted: bool = False) -> dict[str, float]:
    """CPU seconds each worker process used between two probes (kernel schedstat).

    With ``wanted``, CPU used plus CPU waited for in the run queue: on a shared host a
    CPU-bound thread that waits for a core is still CPU-bound, though Dask's fine metrics
    count the wait as thread-noncpu.
    """
    out = {}
    for w, a in after.items():
        b = before.get(w) or {}
        if a.get("schedstat") and b.get("schedstat"):
            out[w] = a["schedstat"][1] - b["schedstat"][1]
            if wanted:
                out[w] += a["schedstat"][2] - b["schedstat"][2]
    return out


def task_thread_wanted_seconds(before: dict[str, WorkerProbe], after: dict[str, WorkerProbe]
                               ) -> dict[str, float]:
    """CPU used plus run-queue wait of each worker's task threads between two probes.

    Threads present in both probes only (a thread that exited took its counters with it).
    """
    out = {}
    for w, a in after.items():
        b = (before.get(w) or {}).get("task_threads") or {}
        now = a.get("task_threads") or {}
        common = set(now) & set(b)
        if common:
            out[w] = sum((now[t][0] - b[t][0]) + (now[t][1] - b[t][1]) for t in common)
    return out


MIN_CPU_SAMPLES = 4


def sampled_cpu_seconds(samples, window: tuple[float, float]) -> dict[str, float]:
    """CPU seconds each worker process used in ``window``, from system-monitor samples.

    Each sample carries the process's CPU percent over the monitor's last interval; the
    mean over the window times the window's length estimates CPU seconds. A worker with
    fewer than :data:`MIN_CPU_SAMPLES` samples in the window is left out (absent, not zero): a
    couple of lagging percentages cannot tell a thread waiting on I/O from one computing,
    so a short stage gets no process-CPU evidence rather than a wrong one.
    """
    if samples is None or len(samples) == 0:
        return {}
    s = samples[(samples["time"] >= window[0]) & (samples["time"] <= window[1])]
    length = window[1] - window[0]
    if s.empty or length <= 0:
        return {}
    return {str(w): float(g["cpu"].mean()) / 100.0 * length for w, g in s.groupby("worker")
            if len(g) >= MIN_CPU_SAMPLES}


def monitor_signals(cpu_s: dict[str, float], nthreads: dict[str, int], compute_s: float | None,
                    wall: float, wanted_s: dict[str, float] | None = None) -> Signals:
    """Signals from the worker processes' own CPU use (``process CPU`` source).

    ``monitor.cpu_per_busy_thread`` is CPU per thread-second spent in tasks: from
    ``wanted_s`` (used + run-queue wait, of the task threads when the probe could tell them
    apart) when the kernel gave it, else from ``cpu_s``.

    Parameters
    ----------
    cpu_s
        CPU seconds per worker process over the measured time.
    wanted_s
        CPU seconds used plus waited for, per worker process (optional).
    nthreads
        Threads per worker.
    compute_s
        Thread-seconds spent inside tasks over the same time (task records).
    wall
        The measured time in seconds.
    """
    out: Signals = {"monitor.cpu_per_busy_thread": None,
                           "monitor.busy_process_cores": None,
                           "monitor.threads_per_worker": None, "monitor.cpu_imbalance": None}
    if not cpu_s or wall <= 0:
        return out
    total = sum(cpu_s.values())
    threads = [max(int(nthreads.get(w) or 1), 1) for w in cpu_s]
    out["monitor.threads_per_worker"] = sum(threads) / len(threads)
    out["monitor.busy_process_cores"] = total / (wall * len(cpu_s))
    if compute_s and compute_s > 0.05 * wall:
        want = sum(wanted_s.values()) if wanted_s else total
        out["monitor.cpu_per_busy_thread"] = min(want / compute_s, 1.5)
    basis = wanted_s if wanted_s and len(wanted_s) == len(cpu_s) else cpu_s
    if len(basis) >= 2 and max(basis.values()) >= 0.3 * wall:
        # CPU wanted by the task threads when known: on a saturated host the CPU *used*
        # evens out between a busy and an idle worker, the CPU wanted does not
        out["monitor.cpu_imbalance"] = min(max(basis.values()) /
                                           max(min(basis.values()), 0.05 * wall), 20.0)
    return out


def host_signals(before: dict[str, WorkerProbe], after: dict[str, WorkerProbe],
                 transfer_bytes: float, scheduler_netns: str | None = None) -> Signals:
    """Signals from the worker hosts' interface counters and the processes' io accounting.

    Received bytes are counted once per network namespace (workers sharing a host share its
    counters). When a worker shares the scheduler's namespace, its counters also carry the
    cluster's control traffic, so the host shares are left unmeasured.
    """
    received: dict[str, float] = {}
    written = 0.0
    measured = shared = False
    for w, a in after.items():
        b = before.get(w) or {}
        if a.get("io_write") is not None and b.get("io_write") is not None:
            written += a["io_write"] - b["io_write"]
            measured = True
        ns = a.get("netns")
        if a.get("net_recv") is None or b.get("net_recv") is None or ns is None:
            continue
        if scheduler_netns is not None and ns == scheduler_netns:
            shared = True
        received[ns] = max(received.get(ns, 0.0), a["net_recv"] - b["net_recv"])
    out: Signals = {"proc.write_mb": written / 1e6 if measured else None,
                           "host.received_mb": None, "host.external_mb": None,
                           "host.external_share": None, "host.dask_share": None}
    if not received or shared:
        return out
    total = sum(received.values())
    external = max(total - transfer_bytes, 0.0)
    out["host.received_mb"] = total / 1e6
    out["host.external_mb"] = external / 1e6
    if total >= 1e6:
        out["host.external_share"] = external / total
        out["host.dask_share"] = min(transfer_bytes / total, 1.0)
    return out


MIN_FETCHED_BYTES = 1e6
"""Bytes a stage must fetch from storage before the share of its input they are is judged."""


def storage_signals(fetched_bytes: float | None,
                    transfer_mb: float | None) -> dict[str, float | None]:
    """Signals from the storage requests the workers counted (``storage requests`` source).

    ``storage.fetched_share`` is the share of the bytes the stage's tasks received that they
    fetched from storage (GDAL, s3fs) rather than from other workers: the request counters'
    own account of what the host network counters see as external bytes. Measured only
    above :data:`MIN_FETCHED_BYTES` fetched; ``None`` where requests were not counted.
    """
    if fetched_bytes is None:
        return {"storage.fetched_mb": None, "storage.fetched_share": None}
    moved = max(float(transfer_mb or 0.0), 0.0) * 1e6
    share = fetched_bytes / (fetched_bytes + moved) if fetched_bytes >= MIN_FETCHED_BYTES \
        else None
    return {"storage.fetched_mb": fetched_bytes / 1e6, "storage.fetched_share": share}


def memory_signals(record, window: tuple[float, float]) -> dict[str, float | None]:
    """Signals from worker memory and spill samples."""
    samples = record.samples
    s = samples[(samples["time"] >= window[0] - 1) & (samples["time"] <= window[1] + 1)]
    if s.empty:
        return {"memory.spilled_peak_mb": None, "memory.managed_peak_fraction": None}
    limits = dict(zip(record.workers["worker"], record.workers["memory_limit"], strict=True))
    frac = None
    with_limit = s[s["worker"].map(lambda w: bool(limits.get(w)))]
    if not with_limit.empty:
        frac = float(((with_limit["managed"] + with_limit["spilled"]) /
                      with_limit["worker"].map(limits)).max())
    return {"memory.spilled_peak_mb": float(s["spilled"].max()) / 1e6,
            "memory.managed_peak_fraction": frac}


def extract_signals(m: dict[str, Any]) -> Signals:
    """Build the classifier's signal dict from one side's measurement (I/O already done).

    Parameters
    ----------
    m
        ``batches, stream, fine_before/after, scheduler_before/after, workers_before/after,
        threads, nthreads, calibration, record`` as gathered by
        :func:`prefect_dask_profiling.bench.measure.run_side`.
    """
    batches = m["batches"]
    wall = sum(b["wall_s"] for b in batches)
    window = (min(b["start"] for b in batches), max(b["end"] for b in batches))
    signals: Signals = {}
    signals.update(fine_signals(_delta(m["fine_after"], m["fine_before"])))
    tasks = task_signals(m["stream"], batches, m["threads"], sorted(m["nthreads"]))
    signals.update(tasks)
    signals.update(scheduler_signals(m["scheduler_before"], m["scheduler_after"],
                                     tasks["tasks.count"], tasks["tasks.median_s"], wall))
    transfer = transfer_signals(m["workers_after"], m["threads"], wall)
    signals.update(transfer)
    signals.update(worker_signals(m["workers_before"], m["workers_after"], m["nthreads"]))
    cpu_s = schedstat_cpu_seconds(m["workers_before"], m["workers_after"])
    if not cpu_s:
        cpu_s = sampled_cpu_seconds(m["record"].samples, window)
    wanted = (task_thread_wanted_seconds(m["workers_before"], m["workers_after"])
              or schedstat_cpu_seconds(m["workers_before"], m["workers_after"], wanted=True))
    signals.update(monitor_signals(cpu_s, m["nthreads"], tasks["tasks.compute_s"], wall,
                                   wanted or None))
    signals.update(host_signals(m["workers_before"], m["workers_after"],
                                transfer["transfer.mb_moved"] * 1e6, m.get("scheduler_netns")))
    signals.update(memory_signals(m["record"], window))
    cal = m["calibration"]
    spreads = [w["spread"] for w in cal["workers"]]
    signals["calibration.min_index"] = cal.get("min_index")
    signals["calibration.max_spread"] = max(spreads) if spreads else None
    t = m["record"].tasks
    if not t.empty:
        top = t.groupby("prefix")["compute_s"].sum().sort_values(ascending=False)
        signals["context.top_prefix"] = str(top.index[0])
    return signals
