"""The idle rule (regression/cost.py) on generated manifests: false alarms on jittery nights
and idle steps caught.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/idle_rule.py``
"""

from __future__ import annotations

import numpy as np

from prefect_dask_profiling.regression.cost import detect_idle


def manifest(idle_h: float, workers: float = 1.0, wall_s: float = 3600.0) -> dict:
    """One night: stage ``write`` of ``wall_s`` with ``idle_h`` idle worker-hours."""
    worker_s = workers * wall_s
    return {"stages": [{"name": "write", "allocation": {
        "worker_s": worker_s, "wall_s": wall_s, "idle_share": idle_h * 3600 / worker_s}}]}


def flagged(history: list[dict], tonight: dict) -> bool:
    return detect_idle(history, tonight)["verdict"].iloc[0] == "idle-regression"


def main(trials: int = 10_000, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    false = caught = 0
    for _ in range(trials):
        history = [manifest(0.4 * rng.uniform(0.8, 1.2)) for _ in range(8)]
        false += flagged(history, manifest(0.4 * rng.uniform(0.8, 1.2)))
        caught += flagged(history, manifest(3.1 * rng.uniform(0.9, 1.1), 3.7))
    print(f"trials {trials}: false alarms {false} (8 baseline nights, idle 0.4 h +-20%), "
          f"3.1 h idle nights caught {caught}")


if __name__ == "__main__":
    main()
