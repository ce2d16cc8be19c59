"""Bottleneck verdict: a flat dict of measured signals in, a verdict out (pure).

A signal is a number named ``<instrument>.<name>`` (``fine.cpu_fraction``,
``tasks.busy_fraction``...). Each rule that reads a signal names the **source** of its
evidence: the independent instrument *and the events it times*. Two signals that time the
same events are one source, however many numbers they give:

``fine metrics``
    Dask's fine performance metrics, ``execute`` context: thread-cpu vs thread-noncpu vs
    executor / other overhead.
``task records``
    Task start/stop times (task stream, plugin aggregates, per-worker execute seconds):
    busy fraction, typical duration, per-worker and per-task skew, the idle tail.
``process CPU``
    The worker processes' own CPU use: system-monitor samples in heartbeats and the
    kernel's per-thread schedstat (the same CPU events, one source).
``transfer log``
    gather-dep events: the workers' incoming transfer logs, fine metrics' gather-dep network
    time and the task records' ``transfer`` intervals all time the same transfers.
``host network``
    The worker hosts' network-interface byte counters (kernel), compared with the bytes the
    transfer log accounts for: what is left came from outside the cluster.
``disk events``
    Spill disk-read/write time (fine metrics' disk activities and ``disk-*`` intervals).
``memory samples``
    Managed and spilled bytes against the memory limit, from worker heartbeats.
``process io``
    Bytes the worker processes caused to be written to storage (``/proc/<pid>/io``).
``scheduler load``
    The scheduler's event-loop thread CPU.
``storage requests``
    The requests and bytes the workers' storage clients (GDAL, s3fs) counted: the bytes the
    tasks fetched from storage against the bytes Dask moved to them.
``calibration``
    A fixed kernel timed on each worker.

:func:`classify` evaluates each class's rules, counts the *distinct sources* that agree
and names a class when at least :data:`MIN_SOURCES` sources agree (``high``
confidence) or two do (``medium``); one source alone is a ``low``-confidence guess. A class
is never named when one of its *necessary* conditions fails (no spill → not spill-bound; no
CPU evidence → not compute-bound), nor when its required signal is below the class's floor
(:data:`FLOORS`: transfer share, spilled MB, CPU per busy thread). Where sources disagree
the verdict lists the disagreement and lowers its confidence instead of guessing.
:func:`classify` does no I/O and reads no clock: it is tested on generated signal sets.

Thresholds (value, why this number)
-----------------------------------
:func:`threshold_table` renders :data:`RULES` as markdown (value, source, why this number):
each threshold is a round number set from what the class *means*, not fitted to a
workload. The synthetic workloads of the tests changed two *statistics*, never a number:
the scheduler overhead ratio divides by the median task (a loaded host's few preempted
tasks moved the time-weighted median 100x between runs), and ``compute`` no longer
outvotes a specific class it is compatible with. The ``EXPLAINED`` exception that let
transfer keep its confidence next to scheduler signals is gone: the scheduler class now
requires its event loop to be busy (CPU plus run-queue wait), which large-payload waits
do not produce.

io or GIL contention?
---------------------
Both leave busy threads with little thread-cpu. The signal that tells them apart is the
worker **process's** CPU in cores while several of its threads are busy
(``monitor.busy_process_cores``): threads queueing on the GIL keep about one core busy
(whoever holds the GIL runs); threads waiting on storage leave the process near zero. With
one thread per worker there is no GIL contention between tasks, and a lock held by another
process cannot be told from I/O by CPU signals: the host network bytes then decide (reads
from outside the cluster), or the verdict says it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from prefect_dask_profiling._util import finite_number
from prefect_dask_profiling.errors import InvalidInput

Signals = dict[str, float | str | None]
"""Measured signals, ``"<instrument>.<name>" -> number`` (``None``: not measured; plus a
few ``context.*`` texts)."""

# One evaluated rule (``class`` is a keyword: the functional form).
Evidence = TypedDict("Evidence", {
    "class": str, "signal": str, "source": str, "value": float, "op": str,
    "threshold": float, "supports": bool, "meaning": str, "role": str})


class _Score(TypedDict):
    """How one class fares: its agreeing sources, the rules for it, and what gates it."""

    sources: set[str]
    supporting: int
    evaluated: int
    ratio: float
    gate: str


class ClassScore(TypedDict):
    """One class's score in a verdict (:func:`classify` ``scores``)."""

    supporting_sources: list[str]
    supporting: int
    evaluated: int
    ratio: float
    gate: str


class Classification(TypedDict):
    """The verdict of :func:`classify` (plain JSON: stored in a run's manifest)."""

    primary: str
    secondary: str | None
    confidence: str
    agreeing_sources: int
    signals: list[Evidence]
    sources: list[str]
    scores: dict[str, ClassScore]
    disagreements: list[str]
    compatible: list[str]
    effects: dict[str, float | None]
    note: str
    actions: list[str]
    evidence: list[Evidence]

CLASSES = ("spill", "transfer", "straggler", "io", "scheduler", "compute")
"""Bottleneck classes, most specific first (the order that breaks ties)."""
MIN_SOURCES = 3
"""Distinct agreeing sources for a ``high``-confidence verdict."""
MEDIUM_SOURCES = 2
"""Distinct agreeing sources for a ``medium``-confidence verdict."""
SOURCES = ("fine metrics", "task records", "process CPU", "transfer log", "host network",
           "disk events", "memory samples", "process io", "scheduler load", "storage requests",
           "calibration")
"""Independent sources of evidence (see the module docstring)."""
GIL_PROCESS_CORES = 0.8
"""Process CPU (cores) at or above which busy, off-CPU threads point at GIL contention."""
MIN_TRANSFER_SHARE = 0.1
"""Floor for ``transfer``: the share of the tasks' time spent receiving payloads
(``tasks.transfer_share``, else ``fine.network_share``). Below a tenth, removing every
transfer would save under 10% of the tasks' time: the transfers cannot be what bounds the
stage, however large each payload is (issue 35: a read stage was called transfer-bound
with 1% of its time in transfers)."""
MIN_SPILLED_MB = 1.0
"""Floor for ``spill``: MB the workers held on disk (``memory.spilled_peak_mb``). Nothing
on disk, no spill; under 1 MB is bookkeeping."""
MIN_COMPUTE_CPU = 0.3
"""Floor for ``compute``: the share of a busy thread's time on (or waiting for) a CPU
(``monitor.cpu_per_busy_thread``, else ``fine.cpu_fraction``). Tasks on the CPU under 30% of
their time spend most of it waiting: the CPU cannot bound the stage."""
STRAGGLER_LEAD_SHARE = 0.5
"""Share of the stage's wall one skewed task must span for the straggler to lead
(:func:`straggler_wall_share`): past half the wall, that task sets it, and splitting or
rebalancing it is the first fix, whatever the task waits on (issue 35)."""


@dataclass(frozen=True)
class Floor:
    """The least of a class's required signal a stage must show before the class can be
    chosen at all: the first measured of ``signals`` must reach ``floor``; when none of
    them is measured the class is ruled out too (no transfer verdict without transfers)."""

    klass: str
    signals: tuple[str, ...]
    floor: float
    why: str


FLOORS: dict[str, Floor] = {
    "transfer": Floor("transfer", ("tasks.transfer_share", "fine.network_share"),
                      MIN_TRANSFER_SHARE, "transfers under a tenth of the tasks' time "
                      "cannot bound the stage"),
    "spill": Floor("spill", ("memory.spilled_peak_mb",), MIN_SPILLED_MB,
                   "nothing held on disk, no spill"),
    "compute": Floor("compute", ("monitor.cpu_per_busy_thread", "fine.cpu_fraction"),
                     MIN_COMPUTE_CPU, "tasks on the CPU under 30% of their time wait"),
}
"""Per class, the floor of its required signal (:class:`Floor`)."""


@dataclass(frozen=True)
class Rule:
    """One test of one signal for one class: ``signal op threshold`` supports ``klass``.

    ``role`` is ``"support"`` (counts as evidence), ``"required"`` (also a necessary
    condition: when measured and failing, the class is ruled out) or ``"any"`` (one of a
    group of alternatives: at least one of the class's ``any`` rules must hold).
    :data:`NEEDS` lists signals of which at least one must be measured at all.
    """

    klass: str
    signal: str
    op: str
    threshold: float
    source: str
    meaning: str
    why: str
    role: str = "support"

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value <= self.threshold


NEEDS: dict[str, tuple[str, ...]] = {
    "compute": ("fine.cpu_fraction", "monitor.cpu_per_busy_thread"),
    "io": ("fine.cpu_fraction", "monitor.cpu_per_busy_thread", "host.external_share",
           "storage.fetched_share"),
    "scheduler": ("scheduler.overhead_ratio", "scheduler.loop_busy"),
}
"""Per class, signals of which at least one must be measured: no CPU evidence, no compute;
no evidence of waiting off the CPU or on outside data, no io (busy threads alone are not
waiting); no measure of the scheduler's load, no scheduler-bound verdict."""

_CPU = "the share of time a running task spends on CPU"
RULES: tuple[Rule, ...] = (
    # compute-bound: busy threads running on CPU
    Rule("compute", "fine.cpu_fraction", ">=", 0.6, "fine metrics",
         "task time is CPU (thread-cpu share of execute)",
         f"{_CPU}; above 0.6 CPU is most of it (on a shared host run-queue waits count as "
         "noncpu here, so this is not a necessary condition)"),
    Rule("compute", "monitor.cpu_per_busy_thread", ">=", 0.6, "process CPU",
         "worker processes use (or wait in the run queue for) about one core per busy thread",
         "a CPU-bound thread uses a whole core; 0.6 leaves room for a shared host",
         role="required"),
    Rule("compute", "worker.cpu_demand", ">=", 0.5, "process CPU",
         "worker processes use or wait for a core per thread (CPU + run-queue wait)",
         "half the cores wanted: the cluster is CPU-saturated"),
    Rule("compute", "tasks.busy_fraction", ">=", 0.5, "task records",
         "worker threads are inside tasks for most of the wall",
         "below half, threads wait for work, not in it: CPU used then is overhead",
         role="required"),
    # io-bound: busy threads waiting off-CPU on storage or services outside Dask
    Rule("io", "tasks.busy_fraction", ">=", 0.5, "task records",
         "worker threads are inside tasks for most of the wall (low CPU is not idleness)",
         "below half, threads wait for work, not in it: scheduler or transfer", role="any"),
    Rule("io", "tasks.longest_share", ">=", 0.5, "task records",
         "one task spans most of the wall: the stage waits on what that task does",
         "past half the wall, the longest task sets it, whatever the other threads do",
         role="any"),
    Rule("io", "fine.cpu_fraction", "<=", 0.4, "fine metrics",
         "task time is mostly off CPU (thread-noncpu share of execute)",
         f"{_CPU}; below 0.4 most of a task's wall is waiting"),
    Rule("io", "monitor.cpu_per_busy_thread", "<=", 0.4, "process CPU",
         "worker processes use (or wait for) a fraction of a core per busy thread",
         "mirror of compute's 0.6, with the same margin", role="required"),
    Rule("io", "host.external_share", ">=", 0.5, "host network",
         "most bytes the worker hosts received did not come from Dask transfers",
         "more than half the received bytes came from outside the cluster (storage, "
         "services); measured only above 1 MB"),
    Rule("io", "storage.fetched_share", ">=", 0.5, "storage requests",
         "most bytes the tasks received they fetched from storage (GDAL / s3fs requests)",
         "the request counters' mirror of the host's external share; measured only above "
         "1 MB fetched"),
    # scheduler-bound: many short tasks, dispatch overhead dominates
    Rule("scheduler", "scheduler.overhead_ratio", ">=", 0.25, "scheduler load",
         "scheduler CPU per task is comparable to the task itself",
         "a quarter of a task's time again in the scheduler caps throughput",
         role="required"),
    Rule("scheduler", "scheduler.loop_busy", ">=", 0.3, "scheduler load",
         "the scheduler's event loop runs or waits for a core for much of the wall",
         "a scheduler idle 70% of the wall is not what the workers wait for",
         role="required"),
    Rule("scheduler", "tasks.typical_s", "<=", 0.005, "task records",
         "tasks are tiny (time-weighted median duration)",
         "5 ms is within 10x of the scheduler's ~0.5 ms of CPU per task"),
    Rule("scheduler", "tasks.busy_fraction", "<=", 0.5, "task records",
         "worker threads wait for work", "mirror of io's 0.5"),
    Rule("scheduler", "fine.overhead_share", ">=", 0.3, "fine metrics",
         "worker-side per-task overhead (executor, other) is a large share",
         "a third of execute spent outside the task function"),
    # transfer-bound: data movement between workers
    Rule("transfer", "transfer.mb_per_transfer", ">=", 0.5, "transfer log",
         "payloads are large (mean MB per transfer); latency of tiny messages is not "
         "transfer-bound", "below 0.5 MB a transfer is latency-, not bandwidth-bound",
         role="required"),
    Rule("transfer", "transfer.wait_fraction", ">=", 0.25, "transfer log",
         "thread-seconds spent receiving payloads (worker transfer logs)",
         "a quarter of the thread time receiving"),
    Rule("transfer", "fine.network_share", ">=", 0.3, "transfer log",
         "gather-dep network time vs task time (same transfers as the transfer log)",
         "a third of the time on the network"),
    Rule("transfer", "tasks.transfer_share", ">=", 0.3, "transfer log",
         "transfer intervals vs compute intervals (same transfers as the transfer log)",
         "a third of the time on the network"),
    Rule("transfer", "tasks.busy_fraction", "<=", 0.6, "task records",
         "threads idle awaiting payloads",
         "threads idle 40% of the wall or more while payloads move"),
    Rule("transfer", "host.dask_share", ">=", 0.5, "host network",
         "most bytes the worker hosts received were Dask transfers between workers",
         "mirror of io's external share"),
    # straggler-bound: one worker or one task lags
    Rule("straggler", "tasks.worker_skew", ">=", 2.0, "task records",
         "slowest / fastest worker's median task time (same prefix)",
         "one worker at half speed doubles the batch", role="any"),
    Rule("straggler", "tasks.task_skew", ">=", 5.0, "task records",
         "the longest task vs the p95 of its prefix",
         "5x p95 is far outside the prefix's own spread", role="any"),
    Rule("straggler", "tasks.tail_fraction", ">=", 0.2, "task records",
         "workers idle at the end of each batch waiting for the last one",
         "a fifth of the batch idle in the tail"),
    Rule("straggler", "worker.seconds_per_task_skew", ">=", 2.0, "task records",
         "worker-side execute seconds per task, slowest / fastest worker",
         "as tasks.worker_skew"),
    Rule("straggler", "monitor.cpu_imbalance", ">=", 1.5, "process CPU",
         "the busiest worker process used much more CPU than the idlest",
         "a third less CPU on one side: others sat idle"),
    Rule("straggler", "calibration.min_index", "<=", 0.6, "calibration",
         "the fixed kernel runs much slower on one worker (unclipped index)",
         "0.6 is beyond run-to-run noise of the kernel (~10%)"),
    # spill-bound: memory pressure and disk
    Rule("spill", "memory.spilled_peak_mb", ">=", 1.0, "memory samples",
         "workers spilled to disk", "any spill at all; below 1 MB is bookkeeping",
         role="required"),
    Rule("spill", "memory.managed_peak_fraction", ">=", 0.5, "memory samples",
         "managed + spilled data reached a large share of the memory limit",
         "Dask starts spilling at 0.6 of the limit by default"),
    Rule("spill", "fine.disk_share", ">=", 0.05, "disk events",
         "disk read/write vs task time (fine metrics)", "5% of task time on the disk"),
    Rule("spill", "tasks.disk_share", ">=", 0.05, "disk events",
         "disk-read/disk-write intervals vs compute (same disk events)",
         "5% of task time on the disk"),
    Rule("spill", "proc.write_mb", ">=", 10.0, "process io",
         "worker processes wrote to storage (kernel io accounting)",
         "10 MB written is more than logs; spill writes whole chunks"),
)

_TASK_SKEW = next(r.threshold for r in RULES if r.signal == "tasks.task_skew")

ACTIONS: dict[str, list[str]] = {
    "compute": [
        "optimise the hottest task prefix ({top_prefix}): it is where the CPU goes",
        "add cores or workers: the cluster is saturated (busy fraction {busy})",
        "check BLAS/numexpr threading per worker before scaling threads",
    ],
    "io": [
        "raise concurrency for the waits: more threads per worker (threads wait, not compute; "
        "CPU per busy thread {cpu_per_thread}) or async I/O inside tasks",
        "read fewer, larger pieces: merge range requests, larger blocks / chunks, "
        "fewer small objects",
        "run the workers next to the data (same region / zone as the bucket or service)",
        "cache what is read more than once (local disk, fsspec caching, persist)",
    ],
    "scheduler": [
        "make tasks bigger (larger chunks, batching, map_blocks/map_partitions): typical task "
        "{median_ms} ms against {overhead_ms} ms of scheduler CPU per task; aim for >= 100 ms",
        "cut the task count (fewer, fused stages; avoid per-element futures)",
        "keep the graph on the cluster (persist once, fewer compute() round trips)",
    ],
    "transfer": [
        "reduce payloads moved between workers (rechunk to avoid all-to-all, aggregate before "
        "moving, smaller dtypes): {mb_moved} MB moved at {bandwidth} MB/s",
        "co-locate work with its data (persist inputs, worker targeting, fewer shuffles)",
        "check serialization and compression of the moved types; faster links",
    ],
    "straggler": [
        "look at the straggler ({straggler}): a slow worker can be excluded or avoided with "
        "workers=/resources; a long task needs its input split",
        "split skewed tasks so no single task dominates the tail (longest / p95 "
        "{task_skew}, p95/p50 {p95_p50})",
        "rerun calibration with more repeats to separate hardware from noise",
    ],
    "spill": [
        "give workers more memory or fewer threads per worker (peak spilled {spilled_mb} MB)",
        "use smaller chunks or reduce what is held at once (avoid persist of large "
        "intermediates, reorder reductions)",
        "release intermediate results earlier (del futures, fewer simultaneous aggregates)",
    ],
}


def check_classes(classes: Any) -> tuple[str, ...]:
    """Validate a selection of class names; ``None`` means all of :data:`CLASSES`.

    Raises
    ------
    ValueError
        Naming each unknown class and the known ones.
    """
    if classes is None:
        return CLASSES
    if isinstance(classes, str):
        classes = [c.strip() for c in classes.split(",") if c.strip()]
    names = list(classes)
    unknown = [c for c in names if c not in CLASSES]
    if unknown:
        raise InvalidInput(f"unknown bottleneck class(es) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(CLASSES)}")
    if not names:
        raise InvalidInput(f"no bottleneck class selected; known: {', '.join(CLASSES)}")
    return tuple(c for c in CLASSES if c in names)


def evaluate(signals: Signals) -> list[Evidence]:
    """Evaluate every rule whose signal was measured.

    Returns
    -------
    One evidence row per evaluated rule: ``class, signal, source, value, op, threshold,
    supports, meaning, role``. Rules whose signal is missing or not finite are skipped.
    """
    rows = []
    for rule in RULES:
        value = finite_number(signals.get(rule.signal))
        if value is None:
            continue
        rows.append({"class": rule.klass, "signal": rule.signal, "source": rule.source,
                     "value": value, "op": rule.op, "threshold": rule.threshold,
                     "supports": rule.passes(value), "meaning": rule.meaning,
                     "role": rule.role})
    return rows


def classify(signals: Signals, classes: Any = None) -> Classification:
    """Classify the bottleneck from measured signals.

    Parameters
    ----------
    signals
        ``{"<instrument>.<name>": number}``; missing, ``None`` or non-finite values are
        ignored. Optional non-numeric context keys (``"context.top_prefix"``,
        ``"context.straggler"``, ``"context.slow_worker"``) fill in the recommended actions.
    classes
        Only consider these classes (names or a comma-separated string); default all.

    Returns
    -------
    ``{primary, secondary, confidence, agreeing_sources, signals, sources, scores,
    disagreements, compatible, effects, note, actions, evidence}``: ``signals`` lists the
    evidence for the primary class (value, threshold, source), ``confidence`` is ``"high"``,
    ``"medium"`` or ``"low"`` from the number of distinct agreeing sources, ``effects`` the
    :func:`expected_effect` of each class, ``actions`` the next steps ordered by expected
    impact (primary's first). When one skewed task spans at least
    :data:`STRAGGLER_LEAD_SHARE` of the wall (:func:`straggler_wall_share`), the straggler
    leads, and a class that also fits (io, when that task waits) is the secondary, said in
    ``disagreements``. Otherwise, when two specific classes both qualify, the one whose fix
    has the larger expected effect leads, and the other is the secondary. A class below
    its floor (:data:`FLOORS`) is never chosen.

    Raises
    ------
    ValueError
        When ``classes`` names an unknown class, or ``signals`` is not a mapping.
    """
    if not isinstance(signals, dict):
        raise InvalidInput(f"signals must be a dict of name -> number, got "
                           f"{type(signals).__name__}")
    allowed = check_classes(classes)
    evidence = [e for e in evaluate(signals) if e["class"] in allowed]
    scores = {k: _score(k, evidence, signals) for k in allowed}
    disagreements: list[str] = []
    candidates = []
    for k in allowed:
        n = len(scores[k]["sources"])
        if n < MEDIUM_SOURCES:
            continue
        if scores[k]["gate"]:
            disagreements.append(f"{k}-bound has {n} agreeing sources but its necessary "
                                 f"condition fails: {scores[k]['gate']}")
            continue
        candidates.append(k)

    wall_share = straggler_wall_share(signals)
    wall_led = (wall_share is not None and wall_share >= STRAGGLER_LEAD_SHARE
                and "straggler" in allowed and not scores["straggler"]["gate"])
    if wall_led and "straggler" not in candidates:
        candidates.append("straggler")  # the task records time the one task directly
    effects = {k: expected_effect(k, signals) for k in allowed}
    primary = "straggler" if wall_led else _pick_primary(candidates, scores, allowed, effects)
    if primary is None:
        open_ = [k for k in allowed if scores[k]["supporting"] and not scores[k]["gate"]]
        if open_:
            primary = max(open_, key=lambda k: (len(scores[k]["sources"]), scores[k]["ratio"],
                                                -allowed.index(k)))
        best = len(scores[primary]["sources"]) if primary else 0
        disagreements.append(f"no class has {MEDIUM_SOURCES} agreeing sources (best: "
                             f"{primary or 'none'} with {best}); the verdict is a best guess")
    others = [k for k in candidates if k != primary]
    if primary is not None:
        for k in _competing(primary, others):
            disagreements.append(
                f"{k}-bound is also supported by {len(scores[k]['sources'])} sources "
                f"({', '.join(sorted(scores[k]['sources']))})"
                + (_wall_text(k, wall_share, effects) if wall_led
                   else _effect_text(primary, k, effects)))
        for e in evidence:
            if e["class"] == primary and not e["supports"]:
                disagreements.append(f"{e['signal']} = {_fmt(e['value'])} does not meet "
                                     f"{e['op']} {_fmt(e['threshold'])} ({e['source']}: "
                                     f"{e['meaning']})")
        disagreements.extend(_contention_notes(primary, signals))
    secondary = _pick_secondary(primary, others, scores, allowed)
    confidence = ("high" if wall_led and len(scores[primary]["sources"]) >= MIN_SOURCES
                  and not _competing(primary, others) else "medium" if wall_led
                  else _confidence(primary, candidates, scores))
    note = _note(primary, secondary, confidence, scores, disagreements)
    return {
        "primary": primary or "undetermined",
        "secondary": secondary,
        "confidence": confidence,
        "agreeing_sources": len(scores[primary]["sources"]) if primary else 0,
        "signals": [e for e in evidence if e["class"] == primary],
        "sources": sorted(scores[primary]["sources"]) if primary else [],
        "scores": {k: {"supporting_sources": sorted(v["sources"]),
                       "supporting": v["supporting"], "evaluated": v["evaluated"],
                       "ratio": v["ratio"], "gate": v["gate"]} for k, v in scores.items()},
        "disagreements": disagreements,
        "compatible": _compatible_note(primary, others),
        "effects": effects,
        "note": note,
        "actions": recommend(primary, secondary, signals),
        "evidence": evidence,
    }


def recommend(primary: str | None, secondary: str | None,
              signals: Signals) -> list[str]:
    """Recommended next actions, ordered by expected impact (primary's first, then secondary)."""
    context = _action_context(signals)
    out: list[str] = []
    for klass in (primary, secondary):
        if klass in ACTIONS:
            out.extend(a.format(**context) for a in ACTIONS[klass])
    if primary is None:
        out.append("measure again with a larger workload (more aggregates, larger N): the "
                   "signals are too weak to name a bottleneck")
    return out


def threshold_table() -> str:
    """The rules as a markdown table: class, signal, threshold, source, why this number."""
    lines = ["| class | signal | threshold | source | role | why this number |",
             "|---|---|---|---|---|---|"]
    for r in RULES:
        lines.append(f"| {r.klass} | `{r.signal}` | {r.op} {r.threshold:g} | {r.source} | "
                     f"{r.role} | {r.why} |")
    return "\n".join(lines)


def _score(klass: str, evidence: list[Evidence], signals: Signals) -> _Score:
    rows = [e for e in evidence if e["class"] == klass]
    supporting = [e for e in rows if e["supports"]]
    failed = [e for e in rows if e["role"] == "required" and not e["supports"]]
    gates = [f"{e['signal']} = {_fmt(e['value'])} not {e['op']} {_fmt(e['threshold'])}"
             for e in failed]
    needed = NEEDS.get(klass, ())
    if needed and not any(e["signal"] in needed for e in rows):
        gates.append(f"none of {', '.join(needed)} was measured")
    alternatives = [e for e in rows if e["role"] == "any"]
    if alternatives and not any(e["supports"] for e in alternatives):
        gates.append(" and ".join(f"{e['signal']} = {_fmt(e['value'])} not {e['op']} "
                                  f"{_fmt(e['threshold'])}" for e in alternatives))
    floor = _floor_gate(FLOORS.get(klass), signals)
    if floor:
        gates.append(floor)
    gil = _gil_contention(signals)
    if klass == "io" and gil:
        gates.append(gil)
    return {"sources": {e["source"] for e in supporting}, "supporting": len(supporting),
            "evaluated": len(rows), "ratio": len(supporting) / len(rows) if rows else 0.0,
            "gate": "; ".join(gates)}


def _floor_gate(floor: Floor | None, signals: Signals) -> str:
    """Why a class is below its floor ('' when it reaches it, or has no floor)."""
    if floor is None:
        return ""
    for name in floor.signals:
        value = finite_number(signals.get(name))
        if value is not None:
            if value >= floor.floor:
                return ""
            return (f"{name} = {_fmt(value)} under the floor {_fmt(floor.floor)} "
                    f"({floor.why})")
    return f"none of {', '.join(floor.signals)} was measured ({floor.why})"


def straggler_wall_share(signals: Signals) -> float | None:
    """How much of the stage's wall one skewed task explains, or ``None`` without one.

    Measured as the longest task's duration over the stage's wall (``tasks.longest_share``),
    counted only when that task is an outlier of its prefix (``tasks.task_skew >= 5``, the
    straggler's own rule): then the other threads ran the rest of the work beside it, and
    the wall is what that one task took. At :data:`STRAGGLER_LEAD_SHARE` or more the
    straggler leads whatever the task did (wait or compute), and the class that fits what
    it did is named beside it.
    """
    skew = finite_number(signals.get("tasks.task_skew"))
    longest = finite_number(signals.get("tasks.longest_share"))
    if skew is None or longest is None or skew < _TASK_SKEW:
        return None
    return min(max(longest, 0.0), 1.0)


def _gil_contention(signals: Signals) -> str:
    """Why busy, off-CPU threads look like GIL contention rather than I/O ('' if not)."""
    cores = finite_number(signals.get("monitor.busy_process_cores"))
    threads = finite_number(signals.get("monitor.threads_per_worker"))
    if cores is None or threads is None or threads < 2:
        return ""
    if cores >= GIL_PROCESS_CORES:
        return (f"worker processes use {cores:.2f} cores with {threads:g} threads busy: "
                "GIL or lock contention, not waiting on I/O")
    return ""


def _contention_notes(primary: str, signals: Signals) -> list[str]:
    notes = []
    measured = finite_number(signals.get("monitor.cpu_wait_measured"))
    if primary in ("io", "compute") and measured == 0:
        notes.append("process CPU comes from system-monitor samples (CPU used, not CPU waited "
                     "for): on a loaded host a CPU-bound stage can look like io")
    return notes + _io_notes(primary, signals)


def _io_notes(primary: str, signals: Signals) -> list[str]:
    if primary != "io":
        return []
    threads = finite_number(signals.get("monitor.threads_per_worker"))
    external = finite_number(signals.get("host.external_share"))
    if threads is not None and threads < 2 and external is None:
        return ["one thread per worker: CPU signals cannot tell waiting on I/O from waiting on "
                "a lock held by another process, and no external bytes were measured"]
    return []


def expected_effect(klass: str, signals: Signals) -> float | None:
    """The share of the wall that fixing ``klass`` could remove, at most (``None``: unknown).

    Estimated from the signals, in the same unit for every class so that two classes that
    both fit can be ranked:

    ``io``
        the share of the tasks' time spent off the CPU, over the part of the wall the tasks
        cover (the busy fraction, or the longest task's share when one task sets the wall);
    ``straggler``
        the idle thread time: ``1 - busy fraction`` when one task spans most of the wall
        (split, it would fill the idle threads), else the idle tail of the batches;
    ``scheduler``
        the scheduler's CPU per task against the task itself, ``r / (1 + r)``, at most the
        idle thread time (what the workers wait for);
    ``transfer``
        the time receiving payloads against the time computing;
    ``spill`` and ``compute``
        ``None``: spill costs more than its disk time (paused workers, recomputation) and
        no source measures it; compute is what remains, not a competing cause.
    """
    busy = finite_number(signals.get("tasks.busy_fraction"))
    longest = finite_number(signals.get("tasks.longest_share"))
    idle = None if busy is None else max(0.0, 1.0 - min(busy, 1.0))
    if klass == "io":
        cpu = _first(signals, "monitor.cpu_per_busy_thread", "fine.cpu_fraction")
        covered = max(busy or 0.0, longest or 0.0) if (busy, longest) != (None, None) else None
        if cpu is None or covered is None:
            return None
        return max(0.0, 1.0 - min(cpu, 1.0)) * min(covered, 1.0)
    if klass == "straggler":
        if longest is not None and longest >= 0.5 and idle is not None:
            return idle
        tail = finite_number(signals.get("tasks.tail_fraction"))
        return None if tail is None else min(max(tail, 0.0), 1.0)
    if klass == "scheduler":
        r = finite_number(signals.get("scheduler.overhead_ratio"))
        if r is None or r < 0:
            return None
        effect = r / (1.0 + r)
        return effect if idle is None else min(effect, idle)
    if klass == "transfer":
        share = _first(signals, "tasks.transfer_share", "fine.network_share")
        return None if share is None else min(max(share, 0.0), 1.0)
    return None


def _first(signals: Signals, *names: str) -> float | None:
    for name in names:
        value = finite_number(signals.get(name))
        if value is not None:
            return value
    return None


def _pick_primary(candidates: list[str], scores: dict[str, _Score],
                  allowed: tuple[str, ...],
                  effects: dict[str, float | None] | None = None) -> str | None:
    """The specific class whose fix has the larger expected effect, when every qualifying
    one has an estimate; else the one with the most agreeing sources (ties: the most
    specific one).

    ``compute`` is what remains when no specific bottleneck qualifies: a straggler or a
    spilling run still computes, so compute's evidence does not outvote theirs.
    """
    if not candidates:
        return None
    specific = [k for k in candidates if k != "compute"] or candidates
    effects = effects or {}
    if len(specific) >= 2 and all(effects.get(k) is not None for k in specific):
        return max(specific, key=lambda k: (effects[k], len(scores[k]["sources"]),
                                            -allowed.index(k)))
    return max(specific, key=lambda k: (len(scores[k]["sources"]), scores[k]["ratio"] >= 0.5,
                                        -allowed.index(k)))


def _effect_text(primary: str, other: str, effects: dict[str, float | None]) -> str:
    """``; its fix could remove ~40% of the wall, io's ~71%`` when both are estimated."""
    mine, theirs = effects.get(primary), effects.get(other)
    if mine is None or theirs is None:
        return ""
    return (f"; its fix could remove about {theirs:.0%} of the wall, {primary}'s about "
            f"{mine:.0%}")


def _wall_text(other: str, share: float | None, effects: dict[str, float | None]) -> str:
    """Why the straggler leads a class that also fits (:func:`straggler_wall_share`)."""
    text = (f"; the straggler leads: one task spans {share or 0:.0%} of the stage's wall "
            f"(tasks.longest_share >= {STRAGGLER_LEAD_SHARE:g} with tasks.task_skew >= "
            f"{_TASK_SKEW:g}), so split or rebalance it first")
    theirs = effects.get(other)
    if theirs is not None:
        text += f"; {other}'s fix could remove about {theirs:.0%} of the wall"
    return text


def _pick_secondary(primary: str | None, others: list[str], scores: dict[str, _Score],
                    allowed: tuple[str, ...]) -> str | None:
    if primary is None:
        return None
    rest = others or [k for k in allowed if k != primary and len(scores[k]["sources"]) >= 1
                      and not scores[k]["gate"] and scores[k]["ratio"] >= 0.5]
    if not rest:
        return None
    return max(rest, key=lambda k: (len(scores[k]["sources"]), scores[k]["ratio"]))


def _competing(primary: str, others: list[str]) -> list[str]:
    """Other candidate classes that contradict the primary.

    Compute-bound alongside a specific bottleneck is no contradiction (a straggler or a
    spilling run still computes); two specific bottlenecks at once are.
    """
    return [k for k in others if not (k == "compute" and primary != "compute")]


def _confidence(primary: str | None, candidates: list[str],
                scores: dict[str, _Score]) -> str:
    """high: >= MIN_SOURCES agree, nothing competes; medium: two agree, or three with a
    weaker competitor; low: a best guess or an even contest."""
    if primary is None or primary not in candidates:
        return "low"
    n = len(scores[primary]["sources"])
    competing = _competing(primary, [k for k in candidates if k != primary])
    if competing:
        rival = max(len(scores[k]["sources"]) for k in competing)
        return "medium" if n > rival else "low"
    return "high" if n >= MIN_SOURCES else "medium"


def _compatible_note(primary: str | None, others: list[str]) -> list[str]:
    return [f"workers are also busy computing (compute-bound signals hold): the {primary} "
            "bottleneck sits on top of real work" for k in others
            if k == "compute" and primary not in (None, "compute")]


def _note(primary: str | None, secondary: str | None, confidence: str,
          scores: dict[str, _Score], disagreements: list[str]) -> str:
    if primary is None:
        return "no signal supports any bottleneck class; measure a larger workload"
    s = scores[primary]
    text = (f"{primary}-bound ({confidence} confidence): {len(s['sources'])} agreeing "
            f"source(s) ({', '.join(sorted(s['sources']))}), {s['supporting']} of "
            f"{s['evaluated']} rules hold")
    if secondary:
        text += f"; secondary: {secondary}"
    if disagreements:
        text += f"; sources disagree ({len(disagreements)} point(s), listed)"
    return text


def _action_context(signals: Signals) -> dict[str, str]:
    def num(key: str, scale: float = 1.0, digits: int = 1) -> str:
        v = finite_number(signals.get(key))
        return "?" if v is None else f"{v * scale:.{digits}f}"

    straggler = signals.get("context.straggler") or (
        f"worker {signals['context.slow_worker']}" if signals.get("context.slow_worker")
        else None)
    return {
        "top_prefix": str(signals.get("context.top_prefix") or "?"),
        "straggler": str(straggler or "?"),
        "busy": num("tasks.busy_fraction", digits=2),
        "cpu_per_thread": num("monitor.cpu_per_busy_thread", digits=2),
        "median_ms": num("tasks.median_s", 1000, 2),
        "overhead_ms": num("scheduler.cpu_per_task_s", 1000, 2),
        "mb_moved": num("transfer.mb_moved"),
        "bandwidth": num("transfer.bandwidth_mb_s"),
        "task_skew": num("tasks.task_skew"),
        "p95_p50": num("tasks.p95_p50"),
        "spilled_mb": num("memory.spilled_peak_mb"),
    }




def _fmt(value: float) -> str:
    return f"{value:.3g}"
