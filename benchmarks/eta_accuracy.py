"""The live ETA on generated nights: how close, how often a healthy night is called at risk,
how early a slow night is.

A generated pipeline has five stages (read 600 s, ndvi 1800 s, reduce 900 s, write 300 s,
publish 120 s: about 62 minutes) with one to three prefixes each (10 to 800 tasks). A night's
stage lasts ``base x N x S``: ``N`` a night factor shared by its stages (lognormal, sigma
0.03: a busier cluster, a bigger scene), ``S`` the stage's own (lognormal, sigma 0.08); a
gap of 1-3 % of the stage precedes it (graph submission, the flow body; the first stage's is
the run's lead), and a tail of 20-60 s ends the run (collection, store). The manifests hold
each stage's window, from which the ETA reads the lead and tail as parts of their own. A
stage's tasks finish at uniform random times inside it. The baseline is the eight nights
before (the judge's ``history``), with the manifests and tasks tables the store keeps;
tonight is a ninth night.

Measured, over ``trials`` independent histories:

* **accuracy** — at 25 %, 50 % and 75 % of tonight's duration: ``|predicted finish - actual|``
  as a % of the duration (median over nights), for the per-stage estimate (p50 end of the
  range) and the naive one (the median of the baseline's totals);
* **false at-risk** — healthy nights with a deadline at the p99 of the night totals (the
  generator's, from 20,000 nights) plus a slack: the share that raises ``at-risk`` at any
  check (every 30 s, as ``eta_interval``) — also with the deadline at the eight-night
  baseline's own p99, which is about its slowest night;
* **detection** — nights whose first stage runs 2x slow: the share raising ``at-risk``
  before their second stage ends, and how far into the run.

Run: ``python benchmarks/eta_accuracy.py [trials]`` (default 400; about a minute).

**Stored nights** (``--store PATH --pipeline P [--version V]``): the ETA replayed on a
store's real nights (e.g. the reference flow's, from ``benchmarks/ndvi_nights.py``), leave
one out: each judged night (healthy, suspected or regressed) is predicted from the up to
eight healthy nights stored before it (at least ``MIN_NIGHTS``, the ETA's own minimum), at
25 %, 50 % and 75 % of its wall time, against the naive estimate (the median wall time of
the same nights). A stored night keeps each stage's wall time and window but not when
its tasks finished: the replay lays the night out as the ETA reads it (``night_layout``: the
lead before the first stage, the stages end to end with the gaps between them shared out,
the tail) and estimates **from time only** inside a stage, as the live ETA does when the
scheduler's counts cannot be read.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

from prefect_dask_profiling.forecast.model import (
    MIN_NIGHTS,
    HistoryStats,
    NightLayout,
    RunProgress,
    estimate,
    history_stats,
    night_layout,
    risk,
)

STAGES = {"read": (600.0, {"open": 10, "load": 200}),
          "ndvi": (1800.0, {"ndvi": 800, "mask": 200, "clip": 50}),
          "reduce": (900.0, {"median": 400, "agg": 20}),
          "write": (300.0, {"store": 100}),
          "publish": (120.0, {"upload": 10})}
NIGHT_SIGMA, STAGE_SIGMA = 0.03, 0.08
HISTORY = 8
CHECK_S = 30.0
START = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)


@dataclass
class Night:
    """One generated night: per stage its gap before, duration and task finish offsets."""

    gaps: list[float]
    durations: list[float]
    finishes: list[dict[str, np.ndarray]]  # per stage, per prefix: sorted offsets in it
    tail: float

    @property
    def total(self) -> float:
        return sum(self.gaps) + sum(self.durations) + self.tail

    def manifest(self, run_id: str) -> dict:
        """As stored: each stage's window (``allocation``: its start and stop instants) and
        the run's start, from which the ETA reads the lead and the tail."""
        t0, at, stages = START.timestamp(), 0.0, []
        for n, gap, d in zip(STAGES, self.gaps, self.durations, strict=True):
            at += gap
            stages.append({"name": n, "wall_s": d, "windows": 1,
                           "allocation": {"start": t0 + at, "stop": t0 + at + d}})
            at += d
        return {"run_id": run_id, "version": "v1", "wall_s": self.total,
                "started": START.isoformat(), "stages": stages}

    def tasks(self, run_id: str) -> list[dict]:
        return [{"run_id": run_id, "stage": n, "prefix": p, "tasks": len(f),
                 "total_s": d * len(f) / sum(len(x) for x in fin.values())}
                for n, d, fin in zip(STAGES, self.durations, self.finishes, strict=True)
                for p, f in fin.items()]

    def progress(self, t: float) -> RunProgress:
        """Where the night is ``t`` seconds after its start."""
        at, completed, windows, current, current_s, done = 0.0, {}, {}, None, 0.0, {}
        closed: float | None = None
        for name, gap, d, fin in zip(STAGES, self.gaps, self.durations, self.finishes,
                                     strict=True):
            at += gap
            if t < at:
                break
            windows[name] = 1
            if t < at + d:
                current, current_s = name, t - at
                done[name] = {p: int(np.searchsorted(f, current_s, side="right"))
                              for p, f in fin.items()}
                break
            completed[name] = d
            done[name] = {p: len(f) for p, f in fin.items()}
            at += d
            closed = at
        since = t - closed if closed is not None and current is None else None
        return RunProgress(now=START + timedelta(seconds=t), elapsed_s=t, completed=completed,
                           windows=windows, current=current, current_s=current_s, done=done,
                           since_stage_s=since)


def generate(rng: np.random.Generator, slow_first: float = 1.0) -> Night:
    night = rng.lognormal(0.0, NIGHT_SIGMA)
    durations, gaps, finishes = [], [], []
    for i, (base, prefixes) in enumerate(STAGES.values()):
        d = base * night * rng.lognormal(0.0, STAGE_SIGMA) * (slow_first if i == 0 else 1.0)
        durations.append(d)
        gaps.append(d * rng.uniform(0.01, 0.03))
        finishes.append({p: np.sort(rng.uniform(0.02, 1.0, n)) * d
                         for p, n in prefixes.items()})
    return Night(gaps, durations, finishes, float(rng.uniform(20, 60)))


def stats_of(nights: list[Night]) -> HistoryStats:
    ids = [f"r{i:03d}" for i in range(len(nights))]
    tasks = pd.DataFrame([r for n, i in zip(nights, ids, strict=True) for r in n.tasks(i)])
    return history_stats("bench", "v1", [n.manifest(i) for n, i in zip(nights, ids,
                                                                         strict=True)], tasks)


def accuracy(trials: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    errors: dict[str, list[float]] = {}
    for _ in range(trials):
        history = [generate(rng) for _ in range(HISTORY)]
        stats, tonight = stats_of(history), generate(rng)
        naive = float(np.median([n.total for n in history]))
        for share in (0.25, 0.5, 0.75):
            t = share * tonight.total
            eta = estimate(stats, tonight.progress(t))
            predicted = t + (eta.remaining_s or 0.0)
            errors.setdefault(f"eta {share:.0%}", []).append(
                100 * abs(predicted - tonight.total) / tonight.total)
            errors.setdefault(f"naive {share:.0%}", []).append(
                100 * abs(naive - tonight.total) / tonight.total)
    return errors


def first_at_risk(stats: HistoryStats, night: Night, deadline: datetime) -> float | None:
    """Seconds into the night of its first ``at-risk`` check (None: never)."""
    t = 0.0
    while t < night.total:
        eta = estimate(stats, night.progress(t))
        if risk(eta, deadline, 0.0, START + timedelta(seconds=t)) in ("at-risk", "late"):
            return t
        t += CHECK_S
    return None


@dataclass
class Rates:
    """At-risk over a set of nights against one deadline."""

    raised: float  # share of all nights raising at-risk
    false: float  # share of the nights finishing before the deadline that raised it
    missing: float  # share of nights finishing after the deadline
    early: float  # share of the missing nights raising it before their stage 2 ended
    when: float | None  # median share of the run elapsed at the first at-risk


def risk_rates(trials: int, seed: int, p99: float, slack: float, slow: float,
               own_p99: bool = False) -> Rates:
    rng = np.random.default_rng(seed)
    raised = false = ok = missing = early = 0
    when: list[float] = []
    for _ in range(trials):
        history = [generate(rng) for _ in range(HISTORY)]
        stats, night = stats_of(history), generate(rng, slow_first=slow)
        limit = float(np.quantile([n.total for n in history], 0.99)) if own_p99 else p99
        limit *= 1 + slack
        at = first_at_risk(stats, night, START + timedelta(seconds=limit))
        misses = night.total > limit
        missing += misses
        ok += not misses
        if at is None:
            continue
        raised += 1
        false += not misses
        stage2_end = sum(night.gaps[:2]) + sum(night.durations[:2])
        early += misses and at < stage2_end
        when.append(at / night.total)
    return Rates(raised / trials, false / max(ok, 1), missing / trials,
                 early / max(missing, 1), float(np.median(when)) if when else None)


def main(trials: int) -> None:
    rng = np.random.default_rng(1)
    population = [generate(rng).total for _ in range(20_000)]
    p50, p99 = np.quantile(population, [0.5, 0.99])
    print(f"generated nights: p50 {p50:.0f} s, p99 {p99:.0f} s ({100 * (p99 / p50 - 1):.1f} "
          f"% over p50); {trials} trials, {HISTORY} baseline nights each")
    t0 = time.perf_counter()
    errors = accuracy(trials, seed=2)
    took = time.perf_counter() - t0
    print(f"\nmedian |error| of the predicted finish, % of the run ({took:.0f} s)")
    for share in ("25%", "50%", "75%"):
        eta, naive = np.median(errors[f"eta {share}"]), np.median(errors[f"naive {share}"])
        print(f"  at {share:>3}: per-stage {eta:5.2f} %   naive {naive:5.2f} %   "
              f"({naive / eta:.1f}x better)")
    print("\nat-risk (deadline = p99 x (1 + slack), margin 0, a check every 30 s); false = "
          "raised on a night that finished before its deadline")
    for slack in (0.0, 0.02, 0.05):
        healthy = risk_rates(trials, 3, p99, slack, 1.0)
        slow = risk_rates(trials, 4, p99, slack, 2.0)
        print(f"  slack {slack:4.0%}: healthy nights: raised {100 * healthy.raised:5.1f} %, "
              f"false {100 * healthy.false:5.1f} %  |  2x slow first stage: "
              f"{100 * slow.missing:5.1f} % miss the deadline, raised on "
              f"{100 * slow.raised:5.1f} %, before stage 2 ends on {100 * slow.early:5.1f} % "
              f"of those missing; first raised at {100 * (slow.when or 0):.0f} % of the run")
    own = risk_rates(trials, 3, p99, 0.0, 1.0, own_p99=True)
    print(f"  deadline at the 8-night baseline's own p99 (about its slowest night): healthy "
          f"nights raised {100 * own.raised:.1f} %, false {100 * own.false:.1f} %")
    stats = stats_of([generate(rng) for _ in range(HISTORY)])
    night = generate(rng)
    n, t0 = 2000, time.perf_counter()
    for i in range(n):
        estimate(stats, night.progress(night.total * i / n))
    print(f"\none estimate: {1e6 * (time.perf_counter() - t0) / n:.0f} us (pure Python, "
          "five stages, ten prefixes)")


# ---------------------------------------------------------------------- stored nights
PREDICTED_STATUSES = ("healthy", "suspected", "regressed")  # judged nights


@dataclass
class StoredNight:
    """One stored night: its manifest, its tasks table (long) and stage layout."""

    run_id: str
    status: str
    manifest: dict
    tasks: pd.DataFrame

    @property
    def wall(self) -> float:
        return float(self.manifest["wall_s"])

    def layout(self) -> NightLayout:
        """The night as the ETA reads it (:func:`~prefect_dask_profiling.forecast.model.
        night_layout`: lead, stages, tail)."""
        return night_layout(self.manifest)

    def progress(self, t: float) -> RunProgress:
        """Where the night was ``t`` seconds after its start: its lead, its stages end to end
        (a name opened twice once, in its first place), its tail; time only inside a stage."""
        layout = self.layout()
        at, completed, windows, current, current_s = layout.lead_s or 0.0, {}, {}, None, 0.0
        closed: float | None = None
        for name, seconds, _ in layout.stages if t >= at else ():
            windows[name] = 1
            if t < at + seconds:
                current, current_s = name, t - at
                break
            completed[name] = seconds
            at += seconds
            closed = at
        since = t - closed if closed is not None and current is None else None
        return RunProgress(now=START + timedelta(seconds=t), elapsed_s=t, completed=completed,
                           windows=windows, current=current, current_s=current_s, done=None,
                           since_stage_s=since)


def stored_nights(store_url: str, pipeline: str, version: str | None) -> list[StoredNight]:
    """The judged nights of ``pipeline`` (``version``: default the newest run's), oldest
    first; a night that cannot be read is skipped with a line saying so."""
    from prefect_dask_profiling.store.runs import RunStore

    store = RunStore(store_url)
    runs = store.list_runs(pipeline)
    if not runs:
        raise SystemExit(f"--pipeline: no runs of {pipeline!r} in {store.url}")
    version = version or str(runs[0]["version"])
    chosen = sorted(r["run_id"] for r in runs if str(r["version"]) == version
                    and r["status"] in PREDICTED_STATUSES)
    manifests = store.read_manifests(pipeline, chosen)
    tables = store.read_tables(pipeline, chosen, "tasks")
    nights = []
    for run_id in chosen:
        manifest, tasks = manifests[run_id], tables[run_id]
        if isinstance(manifest, Exception) or isinstance(tasks, Exception):
            print(f"  skipped {run_id}: {manifest if isinstance(manifest, Exception) else tasks}")
            continue
        if not isinstance(manifest.get("wall_s"), int | float):
            print(f"  skipped {run_id}: no wall_s")
            continue
        nights.append(StoredNight(run_id, str(manifest["status"]), dict(manifest),
                                  tasks.assign(run_id=run_id)))
    return nights


def replay(nights: list[StoredNight], pipeline: str) -> tuple[dict[str, list[float]],
                                                              list[str]]:
    """Leave-one-out errors (% of the night's wall) per ``eta 25%`` / ``naive 25%`` ..., and
    the nights predicted."""
    errors: dict[str, list[float]] = {}
    predicted = []
    for i, night in enumerate(nights):
        before = [n for n in nights[:i] if n.status == "healthy"][-HISTORY:]
        if len(before) < MIN_NIGHTS:
            continue
        version = str(night.manifest["version"])
        stats = history_stats(pipeline, version, [n.manifest for n in before],
                              pd.concat([n.tasks for n in before], ignore_index=True))
        naive = float(np.median([n.wall for n in before]))
        predicted.append(night.run_id)
        for share in (0.25, 0.5, 0.75):
            t = share * night.wall
            eta = estimate(stats, night.progress(t))
            finish = t + (eta.remaining_s or 0.0)
            errors.setdefault(f"eta {share:.0%}", []).append(
                100 * abs(finish - night.wall) / night.wall)
            errors.setdefault(f"naive {share:.0%}", []).append(
                100 * abs(naive - night.wall) / night.wall)
    return errors, predicted


def main_stored(store_url: str, pipeline: str, version: str | None) -> None:
    nights = stored_nights(store_url, pipeline, version)
    errors, predicted = replay(nights, pipeline)
    walls = [n.wall for n in nights]
    if not predicted:
        raise SystemExit(f"{len(nights)} judged nights of {pipeline}: none has "
                         f"{MIN_NIGHTS} healthy nights before it to predict from")
    print(f"{pipeline}: {len(nights)} judged nights (walls {min(walls):.1f}-{max(walls):.1f} "
          f"s, median {np.median(walls):.1f} s); {len(predicted)} predicted, each from the "
          f"up to {HISTORY} healthy nights before it; time only inside a stage")
    print("\nmedian |error| of the predicted finish, % of the run (max in brackets)")
    for share in ("25%", "50%", "75%"):
        eta, naive = errors[f"eta {share}"], errors[f"naive {share}"]
        ratio = np.median(naive) / np.median(eta) if np.median(eta) > 0 else float("inf")
        print(f"  at {share:>3}: per-stage {np.median(eta):5.2f} % ({max(eta):5.2f})   "
              f"naive {np.median(naive):5.2f} % ({max(naive):5.2f})   ({ratio:.1f}x better)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", nargs="?", type=int, default=400,
                        help="generated histories (default 400)")
    parser.add_argument("--store", default="", help="replay on this store's nights instead")
    parser.add_argument("--pipeline", default="", help="with --store: whose nights")
    parser.add_argument("--version", default=None, help="with --store: default the newest")
    args = parser.parse_args(argv)
    if bool(args.store) != bool(args.pipeline):
        parser.error("--store and --pipeline go together")
    if args.trials < 1:
        parser.error(f"trials must be >= 1, got {args.trials}")
    return args


if __name__ == "__main__":
    ARGS = parse_args(sys.argv[1:])
    if ARGS.store:
        main_stored(ARGS.store, ARGS.pipeline, ARGS.version)
    else:
        main(ARGS.trials)
