"""Bottleneck verdict: a flat dict of measured signals in, a verdict out (pure).

A signal is a number named ``<source>.<name>``; the source is the instrument it came from:

``fine``
    Dask's fine performance metrics (``scheduler.cumulative_worker_metrics``, delta over the
    measured phase): thread-cpu vs thread-noncpu, executor overhead, network, disk.
``tasks``
    Task start/stop records (the task stream): busy fraction, median task duration, p95/p50,
    per-worker skew, the idle tail at the end of each batch, transfer and disk intervals.
``scheduler``
    The scheduler's own load: event-loop thread CPU per task and per second of wall.
``transfer``
    Workers' incoming transfer logs: bytes and seconds spent receiving payloads.
``memory``
    Worker memory and spill samples (managed / spilled bytes vs the memory limit).
``worker``
    The worker processes: CPU used plus CPU waited for (run-queue), heartbeat CPU samples,
    per-worker fine metrics (seconds per executed task).
``calibration``
    The fixed calibration kernel timed on each worker.

:func:`classify` evaluates each class's rules, counts the *distinct sources* that support it
(three views of one number count once) and names a class only when at least
:data:`MIN_SOURCES` independent sources agree and none of its *necessary* conditions fails
(no spill → not spill-bound; tiny messages → not transfer-bound). Where signals disagree
the verdict says so and lowers its confidence rather than guessing. :func:`classify` does
no I/O and reads no clock: it is tested on generated signal sets.
``signals.extract_signals`` builds the dict from a real run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

CLASSES = ("spill", "transfer", "straggler", "scheduler", "compute")
"""Bottleneck classes, most specific first (the order that breaks ties)."""
MIN_SOURCES = 3
"""Independent sources needed before a class is named with confidence."""


@dataclass(frozen=True)
class Rule:
    """One test of one signal for one class: ``signal op threshold`` supports ``klass``."""

    klass: str
    signal: str
    op: str
    threshold: float
    meaning: str
    required: bool = False

    @property
    def source(self) -> str:
        return self.signal.split(".", 1)[0]

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value <= self.threshold


RULES: tuple[Rule, ...] = (
    # compute-bound: workers busy running CPU in task code, little else
    Rule("compute", "fine.cpu_fraction", ">=", 0.5, "task time is CPU (thread-cpu share)"),
    Rule("compute", "fine.code_share", ">=", 0.75,
         "fine metrics: task code dominates executor overhead, network and disk"),
    Rule("compute", "tasks.busy_fraction", ">=", 0.6, "worker threads busy most of the wall"),
    Rule("compute", "worker.cpu_demand", ">=", 0.5,
         "worker processes use or wait for a core per thread (CPU + run-queue wait)"),
    Rule("compute", "scheduler.overhead_ratio", "<=", 0.05,
         "scheduler CPU per task is small next to the typical task"),
    # scheduler-bound: many short tasks, dispatch overhead dominates
    Rule("scheduler", "tasks.typical_s", "<=", 0.005,
         "tasks are tiny (time-weighted median duration)"),
    Rule("scheduler", "tasks.busy_fraction", "<=", 0.5, "worker threads wait for work"),
    Rule("scheduler", "scheduler.overhead_ratio", ">=", 0.25,
         "scheduler CPU per task is comparable to the task itself"),
    Rule("scheduler", "scheduler.loop_busy", ">=", 0.4,
         "the scheduler's event loop is busy for much of the wall"),
    Rule("scheduler", "fine.overhead_share", ">=", 0.3,
         "worker-side per-task overhead (executor, other) is a large share"),
    # transfer-bound: data movement and idle gaps awaiting payloads
    Rule("transfer", "transfer.mb_per_transfer", ">=", 0.5,
         "payloads are large (mean MB per transfer); latency of tiny messages is not "
         "transfer-bound", required=True),
    Rule("transfer", "transfer.wait_fraction", ">=", 0.25,
         "thread-seconds spent receiving payloads (worker transfer logs)"),
    Rule("transfer", "fine.network_share", ">=", 0.3,
         "fine metrics: network time in gather-dep vs task time"),
    Rule("transfer", "tasks.transfer_share", ">=", 0.3,
         "task records: transfer intervals vs compute intervals"),
    Rule("transfer", "tasks.busy_fraction", "<=", 0.6, "threads idle awaiting payloads"),
    # straggler-bound: one or few workers lag
    Rule("straggler", "tasks.worker_skew", ">=", 2.0,
         "slowest / fastest worker's median task time (same prefix)"),
    Rule("straggler", "tasks.tail_fraction", ">=", 0.2,
         "workers idle at the end of each batch waiting for the last one"),
    Rule("straggler", "worker.seconds_per_task_skew", ">=", 2.0,
         "worker-side fine metrics: slowest / fastest seconds per executed task"),
    Rule("straggler", "calibration.min_index", "<=", 0.6,
         "the fixed kernel runs much slower on one worker (unclipped index)"),
    # spill-bound: memory pressure and disk
    Rule("spill", "memory.spilled_peak_mb", ">=", 1.0, "workers spilled to disk",
         required=True),
    Rule("spill", "memory.managed_peak_fraction", ">=", 0.5,
         "managed + spilled data reached a large share of the memory limit"),
    Rule("spill", "fine.disk_share", ">=", 0.05, "fine metrics: disk read/write vs task time"),
    Rule("spill", "tasks.disk_share", ">=", 0.05,
         "task records: disk-read/disk-write intervals vs compute"),
)

ACTIONS: dict[str, list[str]] = {
    "compute": [
        "optimise the hottest task prefix ({top_prefix}): it is where the CPU goes",
        "add cores or workers: the cluster is saturated (busy fraction {busy})",
        "check BLAS/numexpr threading per worker before scaling threads",
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
        "handle the slow worker ({slow_worker}): exclude it, or restrict heavy tasks with "
        "workers=/resources",
        "split skewed tasks so no single task dominates the tail (p95/p50 {p95_p50})",
        "rerun calibration with more repeats to separate hardware from noise",
    ],
    "spill": [
        "give workers more memory or fewer threads per worker (peak spilled {spilled_mb} MB)",
        "use smaller chunks or reduce what is held at once (avoid persist of large "
        "intermediates, reorder reductions)",
        "release intermediate results earlier (del futures, fewer simultaneous aggregates)",
    ],
}


def evaluate(signals: dict[str, Any]) -> list[dict[str, Any]]:
    """Evaluate every rule whose signal was measured.

    Returns
    -------
    One evidence row per evaluated rule: ``class, signal, source, value, op, threshold,
    supports, meaning``. Rules whose signal is missing or not finite are skipped.
    """
    rows = []
    for rule in RULES:
        value = _number(signals.get(rule.signal))
        if value is None:
            continue
        rows.append({"class": rule.klass, "signal": rule.signal, "source": rule.source,
                     "value": value, "op": rule.op, "threshold": rule.threshold,
                     "supports": rule.passes(value), "meaning": rule.meaning,
                     "required": rule.required})
    return rows


def classify(signals: dict[str, Any]) -> dict[str, Any]:
    """Classify the bottleneck from measured signals.

    Parameters
    ----------
    signals
        ``{"<source>.<name>": number}``; missing, ``None`` or non-finite values are ignored.
        Optional non-numeric context keys (``"context.top_prefix"``, ``"context.slow_worker"``)
        fill in the recommended actions.

    Returns
    -------
    ``{primary, secondary, confidence, signals, sources, scores, disagreements, note,
    actions}`` where ``signals`` lists the evidence for the primary class (value, threshold,
    source), ``confidence`` is ``"high"``, ``"medium"`` or ``"low"`` and ``actions`` are the
    recommended next steps ordered by expected impact (primary first).
    """
    evidence = evaluate(signals)
    scores = {k: _score(k, evidence) for k in CLASSES}
    disagreements: list[str] = []
    qualified = []
    for k in CLASSES:
        if len(scores[k]["sources"]) < MIN_SOURCES:
            continue
        if scores[k]["gate"]:
            disagreements.append(
                f"{k}-bound has {len(scores[k]['sources'])} supporting sources but its "
                f"necessary condition fails: {scores[k]['gate']}")
            continue
        qualified.append(k)

    primary = _pick_primary(qualified, scores)
    if primary is None:
        ranked = sorted(CLASSES, key=lambda k: (bool(scores[k]["gate"]),
                                                -len(scores[k]["sources"]),
                                                -scores[k]["ratio"], CLASSES.index(k)))
        primary = ranked[0] if scores[ranked[0]]["supporting"] else None
        best = len(scores[primary]["sources"]) if primary else 0
        disagreements.append(
            f"no class has {MIN_SOURCES} independent supporting sources (best: "
            f"{primary or 'none'} with {best}); the verdict is a best guess")
    others = [k for k in qualified if k != primary]
    if primary is not None:
        for k in _competing(primary, others):
            disagreements.append(
                f"{k}-bound is also supported by {len(scores[k]['sources'])} independent "
                f"sources ({', '.join(sorted(scores[k]['sources']))})")
        against = [e for e in evidence if e["class"] == primary and not e["supports"]]
        for e in against:
            disagreements.append(
                f"{e['signal']} = {_fmt(e['value'])} does not meet {e['op']} "
                f"{_fmt(e['threshold'])} ({e['meaning']})")
    secondary = _pick_secondary(primary, others, scores)
    confidence = _confidence(primary, qualified, scores)
    primary_evidence = [e for e in evidence if e["class"] == primary]
    note = _note(primary, secondary, confidence, scores, disagreements)
    compatible = _compatible_note(primary, others)
    return {
        "primary": primary or "undetermined",
        "secondary": secondary,
        "confidence": confidence,
        "signals": primary_evidence,
        "sources": sorted(scores[primary]["sources"]) if primary else [],
        "scores": {k: {"supporting_sources": sorted(v["sources"]),
                       "supporting": v["supporting"], "evaluated": v["evaluated"],
                       "ratio": v["ratio"]} for k, v in scores.items()},
        "disagreements": disagreements,
        "compatible": compatible,
        "note": note,
        "actions": recommend(primary, secondary, signals),
        "evidence": evidence,
    }


def recommend(primary: str | None, secondary: str | None,
              signals: dict[str, Any]) -> list[str]:
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


def _score(klass: str, evidence: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [e for e in evidence if e["class"] == klass]
    supporting = [e for e in rows if e["supports"]]
    failed = [e for e in rows if e["required"] and not e["supports"]]
    gate = "; ".join(f"{e['signal']} = {_fmt(e['value'])} not {e['op']} "
                     f"{_fmt(e['threshold'])}" for e in failed)
    return {"sources": {e["source"] for e in supporting}, "supporting": len(supporting),
            "evaluated": len(rows), "ratio": len(supporting) / len(rows) if rows else 0.0,
            "gate": gate}


def _pick_primary(qualified: list[str], scores: dict[str, dict[str, Any]]) -> str | None:
    """The most specific qualified class whose rules mostly agree, else the strongest."""
    if not qualified:
        return None
    for k in qualified:  # CLASSES order: specific bottlenecks before compute
        if scores[k]["ratio"] >= 0.5:
            return k
    return max(qualified, key=lambda k: (len(scores[k]["sources"]), scores[k]["ratio"]))


def _pick_secondary(primary: str | None, others: list[str],
                    scores: dict[str, dict[str, Any]]) -> str | None:
    if primary is None:
        return None
    if others:
        return max(others, key=lambda k: (len(scores[k]["sources"]), scores[k]["ratio"]))
    rest = [k for k in CLASSES if k != primary and len(scores[k]["sources"]) >= 2
            and not scores[k]["gate"]]
    if not rest:
        return None
    return max(rest, key=lambda k: (len(scores[k]["sources"]), scores[k]["ratio"]))


def _competing(primary: str, others: list[str]) -> list[str]:
    """Other qualified classes that contradict the primary.

    Compute-bound alongside a specific bottleneck is no contradiction (a straggler or a
    spilling run still computes); two specific bottlenecks at once are.
    """
    return [k for k in others if not (k == "compute" and primary != "compute")]


# (primary, other): the other class's signals are a consequence of the primary's
# bottleneck. Transfer-bound already requires large payloads; tiny tasks and idle threads
# waiting on those payloads then also look "scheduler-bound". Still listed as a
# disagreement, but it does not lower the confidence.
EXPLAINED = {("transfer", "scheduler")}


def _confidence(primary: str | None, qualified: list[str],
                scores: dict[str, dict[str, Any]]) -> str:
    if primary is None or primary not in qualified:
        return "low"
    competing = [k for k in _competing(primary, [k for k in qualified if k != primary])
                 if (primary, k) not in EXPLAINED]
    s = scores[primary]
    if competing:
        return "medium" if len(s["sources"]) > max(len(scores[k]["sources"])
                                                    for k in competing) else "low"
    if len(s["sources"]) >= MIN_SOURCES + 1 and s["ratio"] >= 0.75:
        return "high"
    return "medium"


def _compatible_note(primary: str | None, others: list[str]) -> list[str]:
    return [f"workers are also busy computing (compute-bound signals hold): the {primary} "
            "bottleneck sits on top of real work" for k in others
            if k == "compute" and primary not in (None, "compute")]


def _note(primary: str | None, secondary: str | None, confidence: str,
          scores: dict[str, dict[str, Any]], disagreements: list[str]) -> str:
    if primary is None:
        return "no signal supports any bottleneck class; measure a larger workload"
    s = scores[primary]
    text = (f"{primary}-bound ({confidence} confidence): {s['supporting']} of {s['evaluated']} "
            f"rules hold, from {len(s['sources'])} independent sources "
            f"({', '.join(sorted(s['sources']))})")
    if secondary:
        text += f"; secondary: {secondary}"
    if disagreements:
        text += f"; signals disagree ({len(disagreements)} point(s), listed)"
    return text


def _action_context(signals: dict[str, Any]) -> dict[str, str]:
    def num(key: str, scale: float = 1.0, digits: int = 1) -> str:
        v = _number(signals.get(key))
        return "?" if v is None else f"{v * scale:.{digits}f}"

    return {
        "top_prefix": str(signals.get("context.top_prefix") or "?"),
        "slow_worker": str(signals.get("context.slow_worker") or "?"),
        "busy": num("tasks.busy_fraction", digits=2),
        "median_ms": num("tasks.typical_s", 1000, 2),
        "overhead_ms": num("scheduler.cpu_per_task_s", 1000, 2),
        "mb_moved": num("transfer.mb_moved"),
        "bandwidth": num("transfer.bandwidth_mb_s"),
        "p95_p50": num("tasks.p95_p50"),
        "spilled_mb": num("memory.spilled_peak_mb"),
    }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _fmt(value: float) -> str:
    return f"{value:.3g}"
