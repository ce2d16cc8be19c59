"""Memory rule on generated histories: false alarms and detection per threshold.

Each generated stage has a base peak (200 MiB to 12 GiB, log-uniform) on workers with a 4 to
32 GiB limit, and nine nights: eight healthy baseline nights and tonight. A night's peak is
``base x U(0.8, 1.2)`` (+-20%) and, on 5% of nights, a late garbage collection multiplies it
by ``U(1.10, 1.25)`` (one row: up to 1.35). Spilled bytes: 80% of stages never spill but
10% of their nights spill a little (under the minimum effect); the others spill
``S x U(0.7, 1.3)`` every night (+-30%; one row shows +-50%).
Regressions multiply tonight's peak (or spill) by a factor.

Run: ``python benchmarks/memory_rule.py [n_stages]`` (default 5000 stages per row).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

from prefect_dask_profiling.regression.memory import detect_memory, min_effect
from prefect_dask_profiling.regression.rule import RegressionRule

GiB, MiB = 2**30, 2**20


def generate(n: int, seed: int, factor: float = 1.0, metric: str = "peak_bytes",
             small: bool = False, spill_noise: float = 0.3,
             gc_max: float = 1.25) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``n`` stages: (history rows, tonight rows); tonight's ``metric`` times ``factor``.

    ``small``: stages whose doubled peak stays under the minimum effect (20 to 60 MiB of
    process memory on 16 to 32 GiB workers).
    """
    rng = np.random.default_rng(seed)
    if small:
        limit = rng.choice([16, 32], n) * GiB
        base = rng.uniform(20, 60, n) * MiB
    else:
        limit = rng.choice([4, 8, 16, 32], n) * GiB
        base = np.minimum(np.exp(rng.uniform(np.log(200 * MiB), np.log(12 * GiB), n)),
                          0.55 * limit)
    nights = 9
    noise = rng.uniform(0.8, 1.2, (n, nights))
    gc = np.where(rng.random((n, nights)) < 0.05, rng.uniform(1.10, gc_max, (n, nights)), 1.0)
    peak = base[:, None] * noise * gc
    spills = rng.random(n) < 0.2
    spill_base = rng.uniform(0.2, 2.0, n) * GiB
    effect = np.minimum(0.1 * limit, 256 * MiB)
    steady = spill_base[:, None] * rng.uniform(1 - spill_noise, 1 + spill_noise,
                                                 (n, nights))
    little = np.where(rng.random((n, nights)) < 0.1,
                      rng.uniform(0, 0.9, (n, nights)) * effect[:, None], 0.0)
    spilled = np.where(spills[:, None], steady, little)
    if metric == "peak_bytes":
        peak[:, -1] *= factor
    else:
        spilled[:, -1] = np.where(spills, spilled[:, -1] * factor,
                                  spilled[:, -1] + (factor - 1) * 1 * GiB)
    stages = [f"s{i}" for i in range(n)]
    history = pd.DataFrame({
        "run_id": np.tile([f"r{j}" for j in range(nights - 1)], n),
        "stage": np.repeat(stages, nights - 1),
        "peak_bytes": peak[:, :-1].ravel(), "spilled_bytes": spilled[:, :-1].ravel(),
        "memory_limit": np.repeat(limit, nights - 1)})
    latest = pd.DataFrame({"stage": stages, "peak_bytes": peak[:, -1],
                           "spilled_bytes": spilled[:, -1], "memory_limit": limit,
                           "headroom": (limit - peak[:, -1]) / limit})
    return history, latest


def alarm_rate(verdicts: pd.DataFrame, metric: str) -> float:
    rows = verdicts[verdicts["metric"] == metric]
    return float((rows["verdict"] == "memory-regression").mean())


def main(n: int = 5000) -> None:
    thresholds = [1.25, 1.5, 1.75, 2.0]
    print("z threshold = the default of RegressionRule; thr = memory_threshold")
    cases = [("noise only", 1.0, "peak_bytes", False),
             ("noise, spill +-50%", 1.0, "spill50", False),
             ("noise, GC up to +35%", 1.0, "gc35", False), ("peak x1.5", 1.5, "peak_bytes", False),
             ("peak x1.75", 1.75, "peak_bytes", False), ("peak x2", 2.0, "peak_bytes", False),
             ("peak x3", 3.0, "peak_bytes", False),
             ("peak x3, under min effect", 3.0, "peak_bytes", True),
             ("spill +1 GiB / x2", 2.0, "spilled_bytes", False)]
    started = time.perf_counter()
    print(f"{n} generated stage-nights per cell, 8 baseline nights each; cell = share of "
          "stage-nights judged memory-regression (metric of the case)")
    print(f"{'case':<28}" + "".join(f"  thr {t:<5}" for t in thresholds))
    for label, factor, metric, small in cases:
        spill_noise = 0.5 if metric == "spill50" else 0.3
        history, latest = generate(n, seed=7, factor=factor, metric=metric, small=small,
                                   spill_noise=spill_noise,
                                   gc_max=1.35 if metric == "gc35" else 1.25)
        cells = []
        for t in thresholds:
            verdicts = detect_memory(history, latest, RegressionRule(memory_threshold=t,
                                                                     near_oom=False))
            if label.startswith("noise"):
                rate = float((verdicts["verdict"] == "memory-regression").mean())
            else:
                rate = alarm_rate(verdicts, metric)
            cells.append(f"{rate:10.4f}")
        print(f"{label:<28}" + "".join(f"  {c}" for c in cells))
    rule = RegressionRule()
    print(f"defaults: memory_threshold={rule.memory_threshold}, memory_z_threshold="
          f"{rule.memory_z_threshold}, memory_mad_floor={rule.memory_mad_floor}, min effect="
          f"min({rule.memory_min_fraction:.0%} of limit, {rule.memory_min_bytes / MiB:.0f} MiB)"
          f" e.g. {min_effect(4 * GiB, rule) / MiB:.0f} MiB on 4 GiB workers")
    print(f"took {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
