"""How long loading a baseline takes with 1,000 stored runs (target: < 2 s).

Creates 1,000 runs of one pipeline (two versions, a few regressed and failed runs) in a
temporary local store through ``RunStore.write_run``, then times ``load_baseline`` and a full
regression check, and prints how many tables were read. Run with::

    .venv/bin/python -m benchmarks.history_load [--runs 1000] [--n 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

from prefect_dask_profiling.regression.history import load_baseline
from prefect_dask_profiling.regression.verdict import detect_regressions
from prefect_dask_profiling.store.runs import RunStore, new_run_id

N_PREFIXES = 20


class CountingStore(RunStore):
    """Counts table reads (the expensive part of a baseline)."""

    table_reads = 0

    def read_table(self, pipeline: str, run_id: str, name: str = "tasks") -> pd.DataFrame:
        self.table_reads += 1
        return super().read_table(pipeline, run_id, name)

    def read_tables(self, pipeline: str, run_ids: list[str], name: str = "tasks") -> dict:
        self.table_reads += len(run_ids)
        return super().read_tables(pipeline, run_ids, name)


def tasks_table(rng: np.random.Generator) -> pd.DataFrame:
    total = 50.0 * (1 + np.arange(N_PREFIXES)) * rng.uniform(0.8, 1.2, N_PREFIXES)
    return pd.DataFrame({
        "stage": ["read", "reduce"] * (N_PREFIXES // 2),
        "prefix": [f"prefix-{i:02d}" for i in range(N_PREFIXES)],
        "tasks": 100, "total_s": total, "p50_s": total / 100, "p95_s": total / 50,
        "gb_out": 0.1, "max_s": total / 40, "errors": 0, "reruns": 0, "transfer_s": 0.0,
        "disk_read_s": 0.0, "disk_write_s": 0.0, "share": total / total.sum()})


def populate(store: RunStore, runs: int) -> str:
    """Write ``runs`` runs; returns the id of the newest."""
    rng = np.random.default_rng(0)
    start = datetime(2024, 1, 1, 2, tzinfo=UTC)
    run_id = ""
    for i in range(runs):
        version = "1.2" if i < runs // 2 else "1.3"
        status = "regressed" if i % 50 == 7 else "failed" if i % 70 == 3 else "healthy"
        run_id = new_run_id(start + timedelta(days=i))
        store.write_run("nightly", run_id, {"tasks": tasks_table(rng)},
                        {"version": version, "status": status, "state": "COMPLETED"})
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = CountingStore(f"{tmp}/store", spool_dir=f"{tmp}/spool")
        t0 = time.perf_counter()
        latest = populate(store, args.runs)
        print(f"created {args.runs} runs in {time.perf_counter() - t0:.1f} s")
        for attempt in range(3):
            store.table_reads = 0
            t0 = time.perf_counter()
            base = load_baseline(store, "nightly", "1.3", n=args.n, exclude_run_id=latest)
            loaded = time.perf_counter() - t0
            verdicts = detect_regressions(base.history, store.read_table("nightly", latest))
            checked = time.perf_counter() - t0
            print(f"attempt {attempt + 1}: load_baseline {loaded:.3f} s "
                  f"({store.table_reads - 1} tables read for {len(base.runs)} runs), "
                  f"with detect_regressions {checked:.3f} s; "
                  f"{(verdicts['verdict'] == 'regression').sum()} regression(s); "
                  f"target < 2 s: {'ok' if loaded < 2 else 'MISSED'}")
        print(f"note: {base.note}")


if __name__ == "__main__":
    main()
