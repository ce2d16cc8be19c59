"""How fast the fleet view answers at 100 pipelines x 1,000 runs: DuckDB, pandas, compacted.

Writes ``--pipelines`` x ``--runs`` fleet files (one run a night per pipeline, the newest
last night, ``--prefixes`` rows each) into a local store, ``<root>/fleet/pipeline=<name>/
<run_id>.parquet`` as a profiled run writes them. The files are not made one by one with
:func:`~prefect_dask_profiling.export.fleet.write_fleet` (0.15 s each: 100,000 would take
hours): one run's rows come from the real :func:`~prefect_dask_profiling.export.fleet.
fleet_rows`, and each pipeline's 1,000 runs are that table repeated with their own run id,
start, times and utilisation, converted once with the view's Arrow schema and written one
slice per file with ``pyarrow.parquet.write_table`` (what ``write_fleet`` writes; the
benchmark checks that a file's schema is the real writer's).

Then it times the three questions of docs/beyond-one-night.md ("The fleet view"), each in a
new DuckDB connection (nothing cached) over ``read_parquet('<root>/fleet/*/*.parquet',
hive_partitioning = true)`` through the view of :func:`~prefect_dask_profiling.export.fleet.
duckdb_view`, and the docs' pandas code (one ``pandas.read_parquet`` of the folder, then the
three questions). With ``--compact`` it then runs ``compact_fleet`` (the months before the
current one, one file per pipeline and month) and times both again.

Run with::

    .venv/bin/python -m benchmarks.fleet_scale [--pipelines 100] [--runs 1000] [--compact]

Target: each question in <= 2 s by DuckDB at 100 pipelines x 1,000 runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from prefect_dask_profiling.export import fleet
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.runs import RunStore, new_run_id

# The three questions of docs/beyond-one-night.md, as the docs ask them of DuckDB.
QUESTIONS = {
    "1 slowest stages this week": """
        SELECT pipeline, stage, median(seconds) AS median_s
        FROM (SELECT pipeline, stage, run_id, sum(total_s) AS seconds FROM fleet
              WHERE started >= now() - INTERVAL 7 DAY GROUP BY ALL)
        GROUP BY ALL ORDER BY median_s DESC LIMIT 10""",
    "2 p95 growth in 30 days": """
        SELECT pipeline, stage, prefix,
               median(p95_s) FILTER (started >= now() - INTERVAL 7 DAY)
               / median(p95_s) FILTER (started <= now() - INTERVAL 30 DAY) AS growth
        FROM fleet WHERE started >= now() - INTERVAL 37 DAY
        GROUP BY ALL HAVING growth IS NOT NULL ORDER BY growth DESC LIMIT 10""",
    "3 utilisation by pipeline": """
        SELECT pipeline, median(utilisation) AS median, min(utilisation) AS min,
               count(*) AS count
        FROM (SELECT DISTINCT pipeline, run_id, utilisation FROM fleet
              WHERE started >= now() - INTERVAL 30 DAY)
        GROUP BY pipeline ORDER BY pipeline""",
}


def template(prefixes: int) -> pd.DataFrame:
    """One run's fleet rows, from the real :func:`fleet_rows`."""
    stages = [f"stage{i % 3}" for i in range(prefixes)]
    tasks = pd.DataFrame({"stage": stages, "prefix": [f"prefix{i:02d}" for i in range(prefixes)],
                          "tasks": 40, "total_s": 10.0 + np.arange(prefixes), "p50_s": 0.5,
                          "p95_s": 0.9, "gb_out": 0.1})
    manifest = {"run_id": "20260101T020000Z-000000", "pipeline": "p", "version": "1",
                "status": "healthy", "started": "2026-01-01T02:00:00+00:00",
                "utilisation": {"run": 0.6}}
    return fleet.fleet_rows(manifest, tasks)


def write_pipeline(store: RunStore, pipeline: str, runs: int, rows: pd.DataFrame,
                   rng: np.random.Generator, now: datetime) -> None:
    """``runs`` nightly fleet files of ``pipeline``, the newest last night."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(rows)
    started = [now - timedelta(days=runs - i, hours=-2) for i in range(runs)]
    frame = pd.concat([rows] * runs, ignore_index=True)
    frame["run_id"] = np.repeat([new_run_id(s) for s in started], n)
    frame["started"] = pd.to_datetime(np.repeat(started, n), utc=True)
    frame["version"] = np.repeat([str(1 + i * 3 // runs) for i in range(runs)], n)
    drift = np.repeat(1 + 0.5 * np.arange(runs) / runs, n)
    frame["total_s"] = frame["total_s"] * drift * rng.uniform(0.9, 1.1, len(frame))
    frame["p95_s"] = frame["p95_s"] * drift * rng.uniform(0.9, 1.1, len(frame))
    frame["utilisation"] = np.repeat(rng.uniform(0.3, 0.9, runs), n)
    table = pa.Table.from_pandas(frame[fleet.COLUMNS], schema=fleet._schema(),
                                 preserve_index=False)
    folder = Path(store._path(layout.fleet_dir(pipeline)))
    folder.mkdir(parents=True, exist_ok=True)
    ids = frame["run_id"].to_numpy()
    for i in range(runs):
        pq.write_table(table.slice(i * n, n), folder / f"{ids[i * n]}.parquet")


def populate(store: RunStore, pipelines: int, runs: int, prefixes: int) -> float:
    """Write the view; the seconds it took. Checks one file's schema against the writer's."""
    import pyarrow.parquet as pq

    rows = template(prefixes)
    now = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for p in range(pipelines):
        write_pipeline(store, f"p{p:03d}", runs, rows, rng, now)
    seconds = time.perf_counter() - t0
    real = pq.read_schema(fleet.write_fleet(store, {
        "run_id": new_run_id(now - timedelta(days=runs + 5)), "pipeline": "p000",
        "version": "1", "status": "healthy", "started": now.isoformat()},
        rows[["stage", "prefix", "tasks", "total_s", "p50_s", "p95_s", "gb_out", "share"]]))
    some = next(Path(store._path(layout.fleet_dir("p001"))).glob("*.parquet"))
    if not pq.read_schema(some).equals(real, check_metadata=False):
        raise SystemExit("the generated files' schema is not the writer's")
    return seconds


def plain_view(folder: str) -> str:
    """The view without the rule that reads each run once (for comparison: what the rule
    costs)."""
    return (f"CREATE VIEW fleet AS SELECT * FROM read_parquet('{folder}/*/*.parquet', "
            f"hive_partitioning = true)")


def time_duckdb(root: str, view=fleet.duckdb_view) -> dict[str, tuple[float, int]]:
    """Each question in a new connection (``view`` made first, timed with it): its seconds
    and its number of result rows."""
    import duckdb

    out = {}
    for name, sql in QUESTIONS.items():
        con = duckdb.connect()
        t0 = time.perf_counter()
        con.execute(view(f"{root}/fleet"))
        found = con.execute(sql).fetchall()
        out[name] = (time.perf_counter() - t0, len(found))
        con.close()
        print(f"  {view.__name__}, question {name}: {out[name][0]:.2f} s", flush=True)
    return out


def time_pandas(root: str) -> tuple[float, float]:
    """The docs' pandas code: reading the folder, then the three questions (seconds each)."""
    t0 = time.perf_counter()
    frame = fleet.read_fleet(RunStore(root))
    read = time.perf_counter() - t0
    now = pd.Timestamp.now(tz="UTC")
    t0 = time.perf_counter()
    week = frame[frame["started"] >= now - pd.Timedelta(days=7)]
    per_night = week.groupby(["pipeline", "stage", "run_id"], observed=True)["total_s"].sum()
    per_night.groupby(["pipeline", "stage"], observed=True).median().nlargest(10)
    keys = ["pipeline", "stage", "prefix"]
    before = frame[frame["started"].between(now - pd.Timedelta(days=37),
                                            now - pd.Timedelta(days=30))]
    (week.groupby(keys, observed=True)["p95_s"].median()
     / before.groupby(keys, observed=True)["p95_s"].median()).dropna().nlargest(10)
    runs = frame[frame["started"] >= now - pd.Timedelta(days=30)].drop_duplicates("run_id")
    runs.groupby("pipeline", observed=True)["utilisation"].agg(["median", "min", "count"])
    return read, time.perf_counter() - t0


def report(root: str, label: str, attempts: int, everything: bool = True) -> None:
    """Print the DuckDB and pandas figures of the view at ``root`` (not ``everything``: the
    DuckDB view alone)."""
    files = sum(1 for _ in Path(root, "fleet").glob("*/*.parquet"))
    views = (("duckdb_view", fleet.duckdb_view), ("plain read_parquet", plain_view))
    for attempt in range(attempts):
        for kind, view in views if everything else views[:1]:
            figures = time_duckdb(root, view)
            text = "; ".join(f"{name}: {s:.2f} s ({rows} rows)"
                             for name, (s, rows) in figures.items())
            print(f"{label}, {files} files, DuckDB ({kind}) attempt {attempt + 1}: {text} "
                  f"(load average {os.getloadavg()[0]:.1f})")
    if not everything:
        return
    read, questions = time_pandas(root)
    print(f"{label}, {files} files, pandas: read_fleet {read:.2f} s, the three questions "
          f"{questions:.2f} s (load average {os.getloadavg()[0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--prefixes", type=int, default=6)
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--compact", action="store_true",
                        help="then compact the months before this one and time again")
    parser.add_argument("--everything", action=argparse.BooleanOptionalAction, default=True,
                        help="--no-everything: before compacting, time the DuckDB view alone "
                             "(no plain read_parquet, no pandas: minutes each at 100,000 "
                             "files)")
    parser.add_argument("--before", action=argparse.BooleanOptionalAction, default=True,
                        help="--no-before: do not time the per-run files before compacting")
    parser.add_argument("--keep", help="write the view here and keep it, or reuse the one "
                                       "kept there (default: a temporary folder, removed)")
    args = parser.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="fleet-scale-")
    try:
        store = RunStore(root, spool_dir=f"{root}-spool")
        if args.keep and Path(root, "fleet").exists():
            print(f"reusing the view kept at {root}")
        else:
            seconds = populate(store, args.pipelines, args.runs, args.prefixes)
            print(f"wrote {args.pipelines} pipelines x {args.runs} runs ({args.prefixes} rows "
                  f"each) in {seconds:.0f} s")
        if args.before:
            report(root, "per-run files", args.attempts, args.everything)
        if args.compact:
            t0 = time.perf_counter()
            done = fleet.compact_fleet(store)
            print(f"compact_fleet: {done['months']} month file(s) written, {done['removed']} "
                  f"run file(s) removed in {time.perf_counter() - t0:.1f} s")
            report(root, "compacted", args.attempts)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(f"{root}-spool", ignore_errors=True)
    print(f"(cpu count {os.cpu_count()}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
