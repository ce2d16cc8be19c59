"""A benchmark session's numbers and write-up (pure): one side's metrics
(:func:`side_metrics`), the local-vs-remote ``comparison.json`` (:func:`compare`, read by
:func:`rubric`), ``notes.md`` (:func:`notes_markdown`), and :func:`paired_ratio` /
:func:`paired_difference`, the figures every benchmark in ``benchmarks/`` quotes."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from prefect_dask_profiling.diagnosis.signals import ratio

if TYPE_CHECKING:
    from prefect_dask_profiling.bench.types import (
        BenchConfigSummary,
        BenchEnvironment,
        BenchMetrics,
        BenchSummary,
        Bottleneck,
        Comparison,
        MetricComparison,
        PerN,
        SideVerdict,
    )
    from prefect_dask_profiling.diagnosis.classify import Signals
    from prefect_dask_profiling.diagnosis.signals import Batch

SCHEMA = "dask-profiling-bench/1"
BOOTSTRAP_RESAMPLES = 4000  # of paired_ratio's interval


def side_metrics(batches: list[Batch], threads: int, effective_threads: float,
                 signals: Signals) -> BenchMetrics:
    """Throughput (raw, per thread, per effective thread), task stats, busy fraction, success."""
    wall = sum(b["wall_s"] for b in batches)
    total = sum(b["aggregates"] for b in batches)
    ok = sum(b["succeeded"] for b in batches)
    throughput = ratio(ok, wall) or 0.0
    per_n: dict[str, PerN] = {}
    for n in dict.fromkeys(b["n"] for b in batches):
        bs = [b for b in batches if b["n"] == n]
        w = sum(b["wall_s"] for b in bs)
        per_n[str(n)] = {"aggregates": sum(b["aggregates"] for b in bs),
                         "succeeded": sum(b["succeeded"] for b in bs),
                         "wall_s": w, "median_batch_s": statistics.median(b["wall_s"] for b in bs),
                         "throughput_agg_s": ratio(sum(b["succeeded"] for b in bs), w)}
    return cast("BenchMetrics", {
        "aggregates": total, "succeeded": ok, "success_rate": ratio(ok, total),
        "wall_s": wall, "throughput_agg_s": throughput,
        "threads": threads, "effective_threads": effective_threads,
        "throughput_per_thread": ratio(throughput, threads),
        "throughput_per_effective_thread": ratio(throughput, effective_threads),
        "busy_fraction": signals.get("tasks.busy_fraction"),
        "tasks": signals.get("tasks.count"), "task_median_s": signals.get("tasks.median_s"),
        "task_p95_s": signals.get("tasks.p95_s"), "task_compute_s": signals.get("tasks.compute_s"),
        "thread_cpu_s": signals.get("fine.thread_cpu_s"),
        "thread_noncpu_s": signals.get("fine.thread_noncpu_s"),
        "cpu_fraction": signals.get("fine.cpu_fraction"),
        "per_n": per_n,
        "errors": [e for b in batches for e in b["errors"]][:10],
    })


# -- comparison ------------------------------------------------------------------------------

TABLE_METRICS = ("throughput_agg_s", "throughput_per_thread", "throughput_per_effective_thread",
                 "threads", "effective_threads", "busy_fraction", "success_rate",
                 "task_median_s", "task_p95_s", "cpu_fraction", "wall_s", "tasks")


def compare(summaries: dict[str, BenchSummary]) -> Comparison:
    """The local-vs-remote comparison and its interpretation (:func:`rubric`) (pure)."""
    sides = list(summaries)
    table = []
    for metric in TABLE_METRICS:
        values = {side: cast(dict, summaries[side]["metrics"]).get(metric) for side in sides}
        row = cast("MetricComparison", {"metric": metric, **values})  # sides: local, remote
        if "local" in summaries and "remote" in summaries:
            row["remote_vs_local"] = ratio(row["remote"], row["local"])
        table.append(row)
    configs = [summaries[s]["config"] for s in sides]
    identical = all(c == configs[0] for c in configs)
    return {
        "schema": SCHEMA, "sides": sides, "identical_inputs": identical,
        "config": configs[0] if configs else cast("BenchConfigSummary", {}), "table": table,
        "verdicts": {s: _side_verdict(summaries[s]["bottleneck"]) for s in sides},
        "rubric": rubric(summaries),
        "warnings": {s: summaries[s]["warnings"] for s in sides},
    }


def _side_verdict(b: Bottleneck) -> SideVerdict:
    return {"primary": b["primary"], "secondary": b["secondary"],
            "confidence": b["confidence"], "note": b["note"]}


def rubric(summaries: dict[str, BenchSummary]) -> list[str]:
    """What the differences between local and remote mean, one sentence each (pure)."""
    out: list[str] = []
    for side, s in summaries.items():
        if s["calibration"].get("unstable"):
            out.append(f"{side}: calibration unstable: rerun calibration with more repeats "
                       "before trusting per-effective-thread numbers")
    if not ("local" in summaries and "remote" in summaries):
        out.append("only one side measured: no local-vs-remote comparison")
        return out
    loc, rem = summaries["local"]["metrics"], summaries["remote"]["metrics"]
    if (loc.get("success_rate") or 0) != (rem.get("success_rate") or 0):
        out.append(f"success rate differs (local {loc.get('success_rate'):.0%}, remote "
                   f"{rem.get('success_rate'):.0%}): treat correctness/stability as the first "
                   "bottleneck before performance")
    raw = ratio(rem.get("throughput_agg_s"), loc.get("throughput_agg_s"))
    per_thread = ratio(rem.get("throughput_per_thread"), loc.get("throughput_per_thread"))
    per_eff = ratio(rem.get("throughput_per_effective_thread"),
                     loc.get("throughput_per_effective_thread"))
    busy = rem.get("busy_fraction")
    if raw is not None and raw < 0.9 and per_thread is not None and 0.8 <= per_thread <= 1.25:
        out.append(f"remote raw throughput is lower (x{raw:.2f}) but per-thread is similar "
                   f"(x{per_thread:.2f}): fixed orchestration overhead likely dominates at "
                   "this N; try larger N")
    if raw is not None and raw > 1.1 and busy is not None and busy < 0.5:
        out.append(f"remote raw throughput is higher (x{raw:.2f}) but busy fraction is low "
                   f"({busy:.2f}): capacity is under-used; scaling headroom with a larger "
                   "workload")
    if (per_eff is not None and per_thread is not None and per_eff < 0.5
            and per_eff < 0.7 * per_thread):
        out.append(f"per-effective-thread throughput collapses remotely (x{per_eff:.2f} vs "
                   f"x{per_thread:.2f} per thread): calibration unstable or heterogeneity "
                   "dominates; rerun calibration with more repeats")
    for side in summaries:
        b = summaries[side]["bottleneck"]
        out.append(f"{side}: {b['primary']}-bound (secondary {b['secondary']}, "
                   f"{b['confidence']} confidence)")
    lp, rp = (summaries[s]["bottleneck"]["primary"] for s in ("local", "remote"))
    if lp != rp:
        out.append(f"the bottleneck changes between sides (local {lp}, remote {rp}): an "
                   "optimisation for one side may not help the other")
    return out


# -- notes.md --------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def notes_markdown(summaries: dict[str, BenchSummary], comparison: Comparison,
                   environment: BenchEnvironment) -> str:
    """``notes.md``: setup, environment, the comparison and its reading (pure)."""
    sides = list(summaries)
    cfg = comparison["config"]
    lines = ["# Dask profiling session", "", "## 1. Run context", "",
             f"- commit: `{environment.get('commit') or 'unknown'}`",
             f"- workload: `{cfg.get('workload')}`; n = {cfg.get('n')}; seeds = "
             f"{cfg.get('seeds')}; warmup = {cfg.get('warmup')} batch(es) per n; repeats = "
             f"{cfg.get('repeats')}; aggregates per batch = {cfg.get('aggregates_per_batch')}",
             f"- identical inputs on every side: {comparison['identical_inputs']}",
             f"- client: Python {environment.get('python')} on {environment.get('hostname')} "
             f"({environment.get('platform')})"]
    for side in sides:
        pre = summaries[side]["preflight"]
        topo = ", ".join(f"{w['address']} ({w['hostname']}, {w['nthreads']} thr)"
                         for w in pre["workers"])
        lines.append(f"- {side} topology: scheduler {pre['scheduler']}; {pre['n_workers']} "
                     f"workers / {pre['total_threads']} threads: {topo}")
        for w in summaries[side]["warnings"]:
            lines.append(f"  - warning: {w}")
    lines += ["", "## 2. Metric table", "",
              "| metric | " + " | ".join(sides) + (" | remote/local |" if len(sides) == 2
                                                   else " |"),
              "|---|" + "---|" * len(sides) + ("---|" if len(sides) == 2 else "")]
    for row in comparison["table"]:
        cells = [_fmt(row.get(s)) for s in sides]
        if len(sides) == 2:
            cells.append(_fmt(row.get("remote_vs_local")))
        lines.append(f"| {row['metric']} | " + " | ".join(cells) + " |")
    lines += ["", "## 3. Bottleneck diagnosis", ""]
    for side in sides:
        b = summaries[side]["bottleneck"]
        lines += [f"### {side}", "",
                  f"- primary: **{b['primary']}**; secondary: {b['secondary'] or '–'}; "
                  f"confidence: {b['confidence']} ({b.get('agreeing_sources', '?')} "
                  "distinct agreeing sources)", f"- {b['note']}", "",
                  "| signal | source | value | threshold | supports |", "|---|---|---|---|---|"]
        for e in b["signals"]:
            lines.append(f"| {e['signal']} | {e['source']} | {_fmt(e['value'])} | "
                         f"{e['op']} {_fmt(e['threshold'])} | "
                         f"{'yes' if e['supports'] else 'no'} |")
        if b["disagreements"]:
            lines += ["", "Signals that disagree:"]
            lines += [f"- {d}" for d in b["disagreements"]]
        lines.append("")
    lines += ["Interpretation (seed rubric):", ""]
    lines += [f"- {r}" for r in comparison["rubric"]]
    lines += ["", "## 4. Recommended actions", ""]
    first = summaries["remote"] if "remote" in summaries else summaries[sides[0]]
    for i, action in enumerate(first["bottleneck"]["actions"][:3], 1):
        lines.append(f"{i}. {action}")
    lines.append("")
    return "\n".join(lines)


def paired_ratio(walls: list[float], plain: list[float]) -> tuple[float, float, float]:
    """The median of the per-repeat ratios ``walls[i] / plain[i]`` and its 90% bootstrap
    interval (:data:`BOOTSTRAP_RESAMPLES` resamples of the repeats with replacement; a fixed
    seed, so a rerun prints the same).

    Runs of one repeat are adjacent in time, so their ratio cancels most of the machine's
    drift, which the ratio of the two medians keeps.
    """
    return _median_interval(np.asarray(walls) / np.asarray(plain))


def paired_difference(values: list[float], plain: list[float]) -> tuple[float, float, float]:
    """The median of the per-repeat differences ``values[i] - plain[i]`` and its 90%
    bootstrap interval, as :func:`paired_ratio` gives the ratios': the added seconds per
    run (divided by a run's task count, the added cost per task)."""
    return _median_interval(np.asarray(values) - np.asarray(plain))


def _median_interval(paired: np.ndarray) -> tuple[float, float, float]:
    """The median of ``paired`` and its 90% bootstrap interval (fixed seed)."""
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(paired, size=(BOOTSTRAP_RESAMPLES, len(paired))), axis=1)
    low, high = np.quantile(medians, [0.05, 0.95])
    return float(np.median(paired)), float(low), float(high)
