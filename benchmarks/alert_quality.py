"""How often the regression check fails a run for nothing, and how fast it catches a step —
with every night judged in sequence through the stored history, as the judge builds it.

Per regime, ``--trials`` trials (160) of a 20-prefix pipeline. Each trial is a fresh local
run store in which ``--warmup`` nights (10) and then two judged nights J1 and J2 are
finished one after the other by the real :func:`~prefect_dask_profiling.run.pipeline.finish_run`:
the baseline of every night is the one the judge builds from the nights stored before it
(which runs count, suspicions, episodes, confirmation priors), nothing is handed in. On J1
one prefix per trial steps up U(2.2, 4)x and stays there on J2 (160 steps, 3,200 J1
prefix-nights). Noise per prefix-night:

* **calm**: level x U(0.8, 1.2);
* **rough**: level x U(0.65, 1.35), and 5% of prefix-nights are 1.8x one-night spikes.

A stepped prefix is ``factor x level`` on its step nights (no jitter, as in issue 23;
``--step-jitter`` applies the night's jitter to it too). Every night also carries memory
noise: peaks U(0.35, 0.55) of a 1 GiB limit and, on 10% of nights, 300-600 MiB spilled.

Counted per regime:

* **false failures / J1 prefix-nights**: a non-stepped prefix failing J1, or failing J2 when
  it was already flagged on J1 (J2 confirming J1's noise);
* **warm-up false failures**: nights of the warm-up that failed, per prefix-night (there is
  no step there: every failure is false);
* **steps failing by night 1 / by night 2**;
* **memory false verdicts**: nights failed for memory (there is no memory change at all:
  only the spill noise).

The record is real (one small job on an in-process LocalCluster, once), its tasks table
rewritten into the 20 prefixes. To keep a run to minutes, the steps of ``finish_run`` that
do not feed the verdict (spool delivery, lifecycle, diagnosis, flagged reports, trend page,
fleet view) are left out of :data:`~prefect_dask_profiling.run.pipeline.STEPS`; summary,
history and judgement run as in production.

Run with::

    .venv/bin/python -m benchmarks.alert_quality [--trials 160] [--seeds 0 1 2] [--warmup 10]

``--one-shot [--margins 1 3.5]`` runs the earlier form instead (issue 23: each night judged
against an unfiltered 8-night baseline handed to the rule, night 1 without priors), whose
functions ``tests/regression/test_confirm.py`` uses to check the pure confirmation rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from prefect_dask_profiling.regression.alerts import Book, Night, advance, failing, priors
from prefect_dask_profiling.regression.confirm import (
    Evidence,
    Prior,
    confirm_verdicts,
    decide,
    noise_reach,
)
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.regression.verdict import detect_regressions
from prefect_dask_profiling.store.manifest import RunKey

N_PREFIXES = 20
PREFIXES = [f"prefix-{i:02d}" for i in range(N_PREFIXES)]
STAGE = "s"
LIMIT = 2**30
MIB = 2**20
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
VERDICT_STEPS = ("history", "judgement")
BASELINE_NIGHTS = 8  # the one-shot form's baseline


@dataclass(frozen=True)
class Regime:
    """A noise regime: uniform jitter ``±jitter`` and one-night ``spike``x spikes."""

    name: str
    jitter: float
    spike_share: float = 0.0
    spike: float = 1.8


CALM = Regime("calm", 0.20)
ROUGH = Regime("rough", 0.35, 0.05)


@dataclass
class SequentialCounts:
    """What one regime did over its sequential trials."""

    regime: str
    seed: int
    trials: int = 0
    false_failures: int = 0
    warmup_false: int = 0
    warmup_nights: int = 0
    first_night: int = 0
    by_second_night: int = 0
    memory_false: int = 0
    nights: int = 0
    spill_nights: int = 0


def base_record():
    """One real record (an in-process LocalCluster), its tasks made 20 prefixes of stage s."""
    import dask.array as da
    from distributed import Client, LocalCluster

    from prefect_dask_profiling import collect, install, stage, uninstall

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        name = install(client)
        try:
            with client.as_current(), stage(STAGE):
                (da.ones((300, 200), chunks=(50, 50)) * 2).sum().compute()
            record = collect(client, name)
        finally:
            uninstall(client, name)
    row = record.tasks[record.tasks["prefix"] == "sum"].iloc[[0]]
    tasks = pd.concat([row.assign(prefix=p) for p in PREFIXES], ignore_index=True)
    sketch = record.sketches.get((STAGE, "sum"))  # quantiles: not judged, but kept finite
    sketches = {(STAGE, p): sketch for p in PREFIXES} if sketch is not None else {}
    return dataclasses.replace(record, tasks=tasks, sketches=sketches)


def night(record, seconds: np.ndarray, spilled: int, peak: float):
    """``record`` with the 20 prefixes at ``seconds`` and one memory sample row."""
    tasks = record.tasks.copy()
    scale = seconds / tasks["compute_s"].to_numpy(float)
    for column in ("compute_s", "p50_s", "p95_s", "max_s"):
        tasks[column] = tasks[column].to_numpy(float) * scale
    used = int(peak * LIMIT)
    memory = pd.DataFrame([{"stage": STAGE, "worker": "tcp://127.0.0.1:40001", "samples": 20,
                            "memory_limit": LIMIT, "peak_process": used,
                            "peak_managed": int(used * 0.8), "peak_unmanaged": int(used * 0.2),
                            "peak_spilled": spilled, "headroom": (LIMIT - used) / LIMIT}])
    return dataclasses.replace(record, tasks=tasks, memory=memory, spill={
        STAGE: {"disk_write_bytes": spilled, "disk_read_bytes": spilled}})


def _noise(rng: np.random.Generator, level: np.ndarray, regime: Regime) -> np.ndarray:
    values = level * rng.uniform(1 - regime.jitter, 1 + regime.jitter, len(level))
    return values * np.where(rng.random(len(level)) < regime.spike_share, regime.spike, 1.0)


def failing_prefixes(result) -> set[str]:
    """The prefixes a finished night fails on (from its failure message)."""
    if not result.regressed:
        return set()
    return set(re.findall(rf"\b{STAGE}/(prefix-\d\d)", result.failure_message))


def flagged_prefixes(result) -> set[str]:
    verdicts = result.verdicts
    return set(verdicts.loc[verdicts["verdict"] == "regression", "prefix"].astype(str))


def memory_failed(result) -> bool:
    return result.regressed and "memory" in result.failure_message


def run_trial(record, rng: np.random.Generator, regime: Regime, warmup: int,
              step_jitter: bool, counts: SequentialCounts, where: Path) -> None:
    """One trial on a fresh store: warm-up nights, J1 and J2, counted into ``counts``."""
    from prefect_dask_profiling.run.pipeline import finish_run
    from prefect_dask_profiling.store.manifest import RunContext
    from prefect_dask_profiling.store.runs import RunStore, new_run_id

    store = RunStore(str(where / "store"), spool_dir=where / "spool")
    level = rng.uniform(40.0, 80.0, N_PREFIXES)
    k, factor = int(rng.integers(N_PREFIXES)), float(rng.uniform(2.2, 4.0))
    results = []
    for day in range(warmup + 2):
        values = _noise(rng, level, regime)
        if day >= warmup:
            values[k] = factor * (values[k] if step_jitter else level[k])
        spilled = int(rng.uniform(300, 600) * MIB) if rng.random() < 0.10 else 0
        counts.spill_nights += spilled > 0
        started = EPOCH + timedelta(days=day, hours=2)
        ctx = RunContext(run_id=new_run_id(started), pipeline="bench", version="1",
                         started=started)
        result = finish_run(store, night(record, values, spilled, rng.uniform(0.35, 0.55)),
                            ctx, [], ended=started + timedelta(hours=1))
        results.append(result)
        counts.nights += 1
        counts.memory_false += memory_failed(result)
        if day < warmup:
            counts.warmup_nights += 1
            counts.warmup_false += len(failing_prefixes(result))
    j1, j2 = results[-2:]
    stepped = PREFIXES[k]
    fail1, fail2 = failing_prefixes(j1), failing_prefixes(j2)
    counts.trials += 1
    counts.first_night += stepped in fail1
    counts.by_second_night += stepped in fail1 or stepped in fail2
    counts.false_failures += len(fail1 - {stepped})
    counts.false_failures += len((fail2 - fail1 - {stepped}) & flagged_prefixes(j1))
    shutil.rmtree(where, ignore_errors=True)


def sequential(regime: Regime, trials: int, seed: int, warmup: int = 10,
               step_jitter: bool = False, record=None) -> SequentialCounts:
    """The counts of ``trials`` sequential trials of ``regime`` from ``seed``."""
    from prefect_dask_profiling.run import pipeline as finishing

    record = record if record is not None else base_record()
    kept_steps, kept_final = finishing.STEPS, finishing.FINAL
    finishing.STEPS = [(n, s) for n, s in kept_steps if n in VERDICT_STEPS]
    finishing.FINAL = []
    counts = SequentialCounts(regime.name, seed)
    rng = np.random.default_rng([seed, len(regime.name)])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for trial in range(trials):
                run_trial(record, rng, regime, warmup, step_jitter, counts,
                          Path(tmp) / f"t{trial}")
    finally:
        finishing.STEPS, finishing.FINAL = kept_steps, kept_final
    return counts


def table(rows: list[SequentialCounts]) -> pd.DataFrame:
    return pd.DataFrame([{
        "regime": c.regime, "seed": c.seed, "J1 prefix-nights": c.trials * N_PREFIXES,
        "false failures": c.false_failures,
        "warm-up false / prefix-nights": f"{c.warmup_false}/{c.warmup_nights * N_PREFIXES}",
        "steps failing night 1": f"{c.first_night}/{c.trials}",
        "by night 2": f"{c.by_second_night}/{c.trials}",
        "memory false verdicts": f"{c.memory_false}/{c.nights} nights "
                                 f"({c.spill_nights} with spill)"} for c in rows])


# ---------------------------------------------------------------------- one-shot (issue 23)
# The earlier, one-shot form (an unfiltered 8-night baseline handed to the rule, night 1 with
# no priors), kept for tests/regression/test_confirm.py, which checks the pure confirmation
# rule on it. It is not what the judge does over a history: see sequential().
@dataclass
class Counts:
    """What one regime and one ``confirm`` mode did over the one-shot trials."""

    regime: str
    confirm: str
    seed: int = 0
    trials: int = 0
    false_failures: int = 0
    first_night: int = 0
    by_second_night: int = 0
    suspected: int = 0
    cleared: int = 0


@dataclass(frozen=True)
class Trial:
    """One trial's judged nights: verdict tables, baselines' reach, the stepped prefix."""

    stepped: str
    j1: pd.DataFrame
    j2: pd.DataFrame
    reach1: float
    reach2: float


def _night(rng: np.random.Generator, level: np.ndarray, regime: Regime) -> np.ndarray:
    values = level * rng.uniform(1 - regime.jitter, 1 + regime.jitter, len(level))
    spikes = rng.random(len(level)) < regime.spike_share
    return values * np.where(spikes, regime.spike, 1.0)


def _history(nights: list[np.ndarray], names: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"run_id": np.repeat(names, N_PREFIXES), "stage": "s",
                         "prefix": PREFIXES * len(names), "tasks": 100.0,
                         "total_s": np.concatenate(nights)})


def _table(values: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"stage": "s", "prefix": PREFIXES, "tasks": 100.0, "total_s": values})


def make_trial(rng: np.random.Generator, regime: Regime, step_jitter: bool = False) -> Trial:
    """Generate one trial and judge J1 and J2 with ``detect_regressions``."""
    level = rng.uniform(40.0, 80.0, N_PREFIXES)
    base = [_night(rng, level, regime) for _ in range(BASELINE_NIGHTS)]
    k, factor = int(rng.integers(N_PREFIXES)), rng.uniform(2.2, 4.0)

    def stepped() -> np.ndarray:
        values = _night(rng, level, regime)
        values[k] = factor * (values[k] if step_jitter else level[k])
        return values

    j1, j2 = stepped(), stepped()
    names = [f"h{i}" for i in range(BASELINE_NIGHTS)]
    history1 = _history(base, names)
    v1 = detect_regressions(history1, _table(j1))
    if (v1["verdict"] == "regression").any():  # regressed or suspected: kept out
        nights2, names2 = base, names
    else:
        nights2, names2 = base[1:] + [j1], names[1:] + ["j1"]
    history2 = _history(nights2, names2)
    v2 = detect_regressions(history2, _table(j2))
    return Trial(PREFIXES[k], v1, v2, noise_reach(history1), noise_reach(history2))


def _alerts(night: Night) -> dict[tuple[str, str], tuple[str, float, str]]:
    """``{(stage, prefix): (alert, ratio, verdict)}`` of a night's time signals."""
    return {(s, p): (sig.alert, sig.ratio, sig.verdict)
            for (s, p, _), sig in night.signals.items()}


def score(trial: Trial, rule: RegressionRule, counts: Counts) -> None:
    """Run both nights through confirmation and episodes; add up into ``counts``."""
    book = Book()
    n1 = Night.from_tables(RunKey("j1", "bench", "1"),
                           confirm_verdicts(trial.j1, {}, rule, trial.reach1), rule=rule)
    book, _ = advance(book, n1)
    n2 = Night.from_tables(RunKey("j2", "bench", "1"),
                           confirm_verdicts(trial.j2, priors(book), rule, trial.reach2),
                           rule=rule)
    fail1 = {e.prefix for e in failing(book, n1)}
    alerts1 = _alerts(n1)
    book, _ = advance(book, n2)
    fail2 = failing(book, n2)
    alerts2 = _alerts(n2)
    counts.trials += 1
    counts.first_night += trial.stepped in fail1
    counts.by_second_night += trial.stepped in fail1 or any(
        e.prefix == trial.stepped for e in fail2)
    counts.false_failures += len(fail1 - {trial.stepped})
    rows2 = trial.j2.set_index("prefix")
    for ep in fail2:
        if ep.prefix == trial.stepped or ep.prefix in fail1:
            continue
        alone = decide(Evidence.from_row(rows2.loc[ep.prefix]), Prior(), rule, trial.reach2)
        if ep.start_run == "j1" or not alone.fails:
            counts.false_failures += 1
    for (_, prefix), (alert, _, _) in alerts1.items():
        if alert == "suspected" and prefix != trial.stepped:
            counts.suspected += 1
            counts.cleared += alerts2.get(("s", prefix), ("",))[0] == "cleared"


def simulate(regime: Regime, trials: int = 160, seed: int = 0,
             modes: tuple[str, ...] = ("never", "auto", "always"),
             step_jitter: bool = False) -> list[Counts]:
    """Counts per ``confirm`` mode for ``trials`` generated trials of ``regime``."""
    generated = generate(regime, trials, seed, step_jitter)
    return [tally(generated, RegressionRule(confirm=mode), regime, seed) for mode in modes]


def generate(regime: Regime, trials: int, seed: int, step_jitter: bool = False
             ) -> list[Trial]:
    """``trials`` judged trials of ``regime`` from ``seed``."""
    rng = np.random.default_rng(seed)
    return [make_trial(rng, regime, step_jitter) for _ in range(trials)]


def tally(trials: list[Trial], rule: RegressionRule, regime: Regime, seed: int) -> Counts:
    """The counts of ``rule`` over ``trials``."""
    counts = Counts(regime.name, rule.confirm, seed)
    for trial in trials:
        score(trial, rule, counts)
    return counts


def margin_sweep(trials: list[Trial], regime: Regime, seed: int,
                 margins: list[float]) -> list[Counts]:
    """``confirm="auto"`` with other values of ``confirm.CONCLUSIVE_SIGMAS`` (a sweep: the
    constant is set for the count and restored)."""
    from prefect_dask_profiling.regression import confirm

    out, kept = [], confirm.CONCLUSIVE_SIGMAS
    try:
        for margin in margins:
            confirm.CONCLUSIVE_SIGMAS = margin
            counts = tally(trials, RegressionRule(confirm="auto"), regime, seed)
            counts.confirm = f"auto, margin {margin:g}"
            out.append(counts)
    finally:
        confirm.CONCLUSIVE_SIGMAS = kept
    return out


def _table_of(rows: list[Counts]) -> pd.DataFrame:
    return pd.DataFrame([{
        "regime": c.regime, "confirm": c.confirm, "seed": c.seed,
        "prefix-nights": c.trials * N_PREFIXES,
        "false failures": c.false_failures,
        "steps failing night 1": f"{c.first_night}/{c.trials}",
        "by night 2": f"{c.by_second_night}/{c.trials}",
        "suspected (noise)": c.suspected, "cleared": c.cleared} for c in rows])


def one_shot(args: argparse.Namespace) -> None:
    """The one-shot form's table (``--one-shot``), per ``confirm`` mode and margin."""
    rows = []
    for seed in args.seeds:
        for regime in (CALM, ROUGH):
            trials = generate(regime, args.trials, seed, args.step_jitter)
            rows.extend(tally(trials, RegressionRule(confirm=mode), regime, seed)
                        for mode in ("never", "auto", "always"))
            rows.extend(margin_sweep(trials, regime, seed, args.margins))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(_table_of(rows).to_string(index=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=160)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--warmup", type=int, default=10,
                        help="nights judged in sequence before J1 (the baseline's history)")
    parser.add_argument("--regimes", nargs="+", default=["calm", "rough"],
                        choices=["calm", "rough"])
    parser.add_argument("--step-jitter", action="store_true",
                        help="apply the night's jitter to the stepped prefix too")
    parser.add_argument("--one-shot", action="store_true",
                        help="the earlier one-shot form (issue 23) instead of sequential nights")
    parser.add_argument("--margins", type=float, nargs="*", default=[],
                        help="with --one-shot: also count confirm='auto' with these "
                             "CONCLUSIVE_SIGMAS")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.one_shot:
        one_shot(args)
        print(f"\n{len(args.seeds) * 2 * args.trials} trials in "
              f"{time.perf_counter() - started:.1f} s")
        return
    record = base_record()
    regimes = {"calm": CALM, "rough": ROUGH}
    rows = [sequential(regimes[name], args.trials, seed, args.warmup, args.step_jitter, record)
            for seed in args.seeds for name in args.regimes]
    with pd.option_context("display.width", 220, "display.max_columns", 20):
        print(table(rows).to_string(index=False))
    nights = sum(c.nights for c in rows)
    print(f"\n{sum(c.trials for c in rows)} trials, {nights} nights through finish_run in "
          f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
