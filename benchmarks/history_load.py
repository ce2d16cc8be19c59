"""How long judging a night reads its history, with many stored runs (local folder or S3).

Stores ``--runs`` runs of one pipeline (two versions; a few regressed and failed runs; one run
every 8 hours up to 16 February 2026, so 10,000 runs span 9 years of monthly index partitions
and the newest 57 runs two of them), then times what a night's judgement reads:
``load_baseline`` and ``load_series`` (the drift series) inside one ``remembering_reads``
block, as ``finish_run`` does, and a full regression check.

Each attempt opens the store anew (a new night: nothing remembered). Its S3 client is
created before the timing, in a time printed apart: ``finish_run``'s store has written the
night's provisional record with it by then. Each figure is split into the store's listings,
its reads and the rest (parsing and pandas). On S3 (a moto server started in this process,
on 127.0.0.1) it also counts the HTTP requests, split into listings and reads. The runs are
put into that server's backend directly (the same keys and bytes ``write_run`` would PUT,
without 30,000 HTTP round trips of setup) and kept out of the garbage collector (a real
server's objects are not in the client's process).

``--layout`` says which version of the store wrote the history:

* ``new``: index markers in monthly partitions, manifests carrying the tasks totals;
* ``before-totals``: monthly partitions, manifests without totals (stores written before
  the totals: the drift series then reads each run's ``tasks.csv`` too);
* ``old``: markers flat below the version and no totals (before the partitions).

Run with::

    .venv/bin/python -m benchmarks.history_load [--runs 1000] [--n 8]
    .venv/bin/python -m benchmarks.history_load --backend s3 --runs 10000
    .venv/bin/python -m benchmarks.history_load --backend s3 --runs 10000 --layout old
    .venv/bin/python -m benchmarks.history_load --runs 100000
    .venv/bin/python -m benchmarks.history_load --cli --sizes 100 10000 --attempts 5

Targets: baseline + drift series < 1 s with 10,000 runs on moto S3, requests O(history) —
the same count for 1,000 and 10,000 runs.

``--cli`` times the command a user runs instead, end to end: ``dask-profiling check --run
<the newest run>`` as a new process (``python -m prefect_dask_profiling.cli``: imports,
opening the store, finding the run's pipeline, reading and judging), pointed at the moto
server of this process through ``$DASK_PROFILING_STORE`` and
``$DASK_PROFILING_STORAGE_OPTIONS``, for each of ``--sizes`` (a bucket each: moto scans
every key of a bucket on each listing). It prints each size's attempts, the ratio of the
medians to the first size's with its range (slowest over fastest, fastest over slowest),
and with ``--profile`` one run of each under ``-X importtime`` and cProfile: where the
time went. Target: ``check`` at 10,000 runs within 1.5 times its time at 100.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

from prefect_dask_profiling.regression.baseline import load_baseline
from prefect_dask_profiling.regression.drift import load_series
from prefect_dask_profiling.regression.verdict import detect_regressions
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.manifest import complete_manifest, dump, marker_doc
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.store.tables import encode_files

N_PREFIXES = 20
PIPELINE = "nightly"
BUCKET = "history-load"
VARIANTS = 16  # distinct tables, reused: encoding 100,000 CSVs would dominate the setup
# The newest run, whatever --runs: every history ends in the same months, so the windows a
# night reads (and the requests they cost) compare between 1,000 and 10,000 runs.
NEWEST = datetime(2026, 2, 16, 2, tzinfo=UTC)


def tasks_table(rng: np.random.Generator) -> pd.DataFrame:
    total = 50.0 * (1 + np.arange(N_PREFIXES)) * rng.uniform(0.8, 1.2, N_PREFIXES)
    return pd.DataFrame({
        "stage": ["read", "reduce"] * (N_PREFIXES // 2),
        "prefix": [f"prefix-{i:02d}" for i in range(N_PREFIXES)],
        "tasks": 100, "total_s": total, "p50_s": total / 100, "p95_s": total / 50,
        "gb_out": 0.1, "max_s": total / 40, "errors": 0, "reruns": 0, "transfer_s": 0.0,
        "disk_read_s": 0.0, "disk_write_s": 0.0, "share": total / total.sum()})


def run_files(runs: int, vintage: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(run_id, {path relative to the root: bytes})`` of every run, oldest first, as the
    store version ``vintage`` (``--layout``) wrote them."""
    rng = np.random.default_rng(0)
    tables = [encode_files({"tasks": tasks_table(rng)}, None) for _ in range(VARIANTS)]
    start = NEWEST - timedelta(hours=8 * (runs - 1))
    marker = layout.flat_index_marker if vintage == "old" else layout.index_marker
    for i in range(runs):
        version = "1.2" if i < runs // 2 else "1.3"
        status = "regressed" if i % 50 == 7 else "failed" if i % 70 == 3 else "healthy"
        run_id = new_run_id(start + timedelta(hours=8 * i))
        files = tables[i % VARIANTS]
        doc = complete_manifest(PIPELINE, run_id, {"version": version, "status": status,
                                                   "state": "COMPLETED"}, files)
        if vintage != "new":
            doc.pop("totals", None)
        out = {layout.run_file(PIPELINE, run_id, name): data for name, data in files.items()}
        out[layout.manifest_file(PIPELINE, run_id)] = dump(doc)
        out[marker(PIPELINE, version, run_id, status)] = dump(marker_doc(doc))
        yield run_id, out


def populate(store: RunStore, runs: int, vintage: str) -> str:
    """Store ``runs`` runs (the files ``write_run`` writes, in bulk); the newest run id."""
    put = write_local if store.kind == "local" else put_into_moto(store)
    latest = ""
    for run_id, files in run_files(runs, vintage):
        latest = run_id
        for rel, data in files.items():
            put(store, rel, data)
    return latest


def write_local(store: RunStore, rel: str, data: bytes) -> None:
    path = Path(store._path(rel))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def put_into_moto(store: RunStore) -> Callable[[RunStore, str, bytes], None]:
    """Puts an object straight into the backend of the moto server of this process."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def put(store: RunStore, rel: str, data: bytes) -> None:
        bucket, _, key = store._path(rel).partition("/")
        backend.put_object(bucket, key, data)

    return put


class Requests:
    """Counts the S3 requests of one store (a botocore event hook on its session)."""

    def __init__(self, store: RunStore) -> None:
        self.counts: Counter = Counter()
        store.fs.session.register("before-send.s3", self._count)

    def _count(self, request: object, **kwargs: object) -> None:
        method = getattr(request, "method", "?")
        url = str(getattr(request, "url", ""))
        self.counts["list" if method == "GET" and ("list-type" in url or "delimiter" in url)
                    else method.lower()] += 1

    def __str__(self) -> str:
        return ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts.items())) or "none"


class Breakdown:
    """Where one store's time goes: its listings and its reads, timed around the store's
    primitive calls (present in this version and in the ones before); the rest of a night's
    history load is parsing the files and pandas."""

    LISTINGS = ("_find", "_listing", "_run_folders")

    def __init__(self, store: RunStore) -> None:
        self.seconds: Counter = Counter()
        for name in self.LISTINGS:
            self._time(store, name, "listing")
        self._time(store, "_read_many", "reading")

    def _time(self, store: RunStore, name: str, kind: str) -> None:
        call = getattr(store, name)

        def timed(*args: object, **kwargs: object) -> object:
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[kind] += time.perf_counter() - t0

        setattr(store, name, timed)

    def text(self, total: float) -> str:
        listing, reading = self.seconds["listing"], self.seconds["reading"]
        return (f"listing {listing:.3f} s, reading {reading:.3f} s, the rest "
                f"{total - listing - reading:.3f} s")


@contextlib.contextmanager
def moto_endpoint() -> Iterator[dict]:
    """A moto server of this process on 127.0.0.1 (stopped on leaving): its storage options."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield {"endpoint_url": f"http://{host}:{port}", "key": "bench", "secret": "bench"}
    finally:
        server.stop()


def s3_store(options: dict, bucket: str, tmp: str) -> RunStore:
    """A store in a new, empty bucket of the moto server at ``options``."""
    import botocore.session

    botocore.session.get_session().create_client(
        "s3", endpoint_url=options["endpoint_url"], region_name="us-east-1",
        aws_access_key_id="bench", aws_secret_access_key="bench").create_bucket(Bucket=bucket)
    return RunStore(f"s3://{bucket}/store", options, spool_dir=f"{tmp}/spool", timeout=60)


@contextlib.contextmanager
def open_store(backend: str, tmp: str) -> Iterator[tuple[RunStore, dict]]:
    """An empty store on ``backend``, and the options to open it again."""
    if backend == "local":
        yield RunStore(f"{tmp}/store", spool_dir=f"{tmp}/spool"), {}
        return
    with moto_endpoint() as options:
        yield s3_store(options, BUCKET, tmp), options


def open_client(store: RunStore) -> float:
    """Create an S3 store's client (no request), as ``finish_run``'s store has one by its
    history step (it wrote the provisional record with it); the seconds it took."""
    t0 = time.perf_counter()
    if store.kind == "s3":
        store.fs.connect()
    return time.perf_counter() - t0


def judge_once(store: RunStore, latest: str, n: int) -> tuple[float, float, str]:
    """Drift series + baseline of the newest run, as ``finish_run`` reads them (in the
    order of ``regression.judge.load_history``)."""
    breakdown = Breakdown(store)
    t0 = time.perf_counter()
    with store.remembering_reads():
        series, _ = load_series(store, PIPELINE, "1.3", exclude_run_id=latest)
        base = load_baseline(store, PIPELINE, "1.3", n=n, exclude_run_id=latest)
    loaded = time.perf_counter() - t0
    spent = breakdown.text(loaded)
    verdicts = detect_regressions(base.history, store.read_table(PIPELINE, latest))
    regressions = int((verdicts["verdict"] == "regression").sum())
    text = (f"{spent}; {len(base.runs)} baseline runs, {series['run_id'].nunique()} series "
            f"runs, {regressions} regression(s)")
    return loaded, time.perf_counter() - t0, text


def check_env(store: RunStore, options: dict, tmp: str) -> dict[str, str]:
    """The environment of a ``dask-profiling`` process pointed at ``store``."""
    return {**os.environ, "DASK_PROFILING_STORE": store.url,
            "DASK_PROFILING_STORAGE_OPTIONS": json.dumps(options),
            "DASK_PROFILING_SPOOL": f"{tmp}/spool", "PYTHONPATH": str(Path.cwd())}


def check_command(store: RunStore, options: dict, run_id: str, tmp: str,
                  python_flags: tuple[str, ...] = ()) -> tuple[float, dict, str]:
    """Run ``dask-profiling check --run <run_id> --json`` on ``store`` as a new process:
    its wall seconds, its JSON answer and its standard error."""
    command = [sys.executable, *python_flags, "-m", "prefect_dask_profiling.cli", "check",
               "--run", run_id, "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(command, env=check_env(store, options, tmp), capture_output=True,
                          text=True, timeout=600)
    seconds = time.perf_counter() - t0
    if done.returncode not in (0, 1, 5):
        raise SystemExit(f"check failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout), done.stderr


class ServerRequests(logging.Handler):
    """Counts the requests the moto server of this process answers (its werkzeug log
    lines), by method and whether a GET lists: what one ``check`` process sent."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        for method in ("GET", "HEAD", "PUT", "POST", "DELETE"):
            if f'"{method} ' in line:
                listing = method == "GET" and ("list-type" in line or "delimiter" in line)
                self.counts["LIST" if listing else method] += 1

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counter]:
        log = logging.getLogger("werkzeug")
        level, propagate, handlers = log.level, log.propagate, log.handlers
        log.setLevel(logging.INFO)
        log.propagate, log.handlers = False, [self]  # counted, not printed
        try:
            yield self.counts
        finally:
            log.setLevel(level)
            log.propagate, log.handlers = propagate, handlers


def profile_check(store: RunStore, options: dict, run_id: str, tmp: str) -> str:
    """Where one ``check`` process spends its time: the requests it sends, its imports
    (``-X importtime``: the slowest top-level imports, cumulative) and cProfile's top
    functions of this package, s3fs and fsspec by cumulative time."""
    with ServerRequests().counting() as requests:
        seconds, _, stderr = check_command(store, options, run_id, tmp, ("-X", "importtime"))
    rows = [line.split("|") for line in stderr.splitlines() if line.startswith("import time:")]
    top = sorted(((int(row[1]), row[2].rstrip()) for row in rows[1:]
                  if row[1].strip().isdigit() and not row[2].startswith("   ")),
                 reverse=True)[:6]
    imports = ", ".join(f"{name.strip()} {us / 1e6:.2f} s" for us, name in top)
    total = sum(int(row[1]) for row in rows[1:] if row[1].strip().isdigit()
                and not row[2].startswith("   "))
    out = f"{tmp}/check.prof"
    subprocess.run([sys.executable, "-m", "cProfile", "-o", out, "-m",
                    "prefect_dask_profiling.cli", "check", "--run", run_id, "--json"],
                   env=check_env(store, options, tmp), capture_output=True, check=False)
    stream = io.StringIO()
    pstats.Stats(out, stream=stream).sort_stats("cumulative").print_stats(
        "prefect_dask_profiling|s3fs|fsspec", 30)
    sent = ", ".join(f"{n} {kind}" for kind, n in sorted(requests.items()))
    return (f"one process under -X importtime: {seconds:.2f} s, requests: {sent}; imports "
            f"{total / 1e6:.2f} s in all, the slowest top-level ones: {imports}\n"
            f"{stream.getvalue()}")


def cli_main(sizes: list[int], attempts: int, profile: bool) -> None:
    """Time ``check --run <newest>`` as a process at each of ``sizes`` (see the module's
    docstring); print the attempts and the ratios to the first size."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    times: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, moto_endpoint() as options:
        stores = {}
        for runs in sizes:
            store = s3_store(options, f"{BUCKET}-{runs}", tmp)
            t0 = time.perf_counter()
            stores[runs] = store, populate(store, runs, "new")
            print(f"stored {runs} runs on moto S3 in {time.perf_counter() - t0:.1f} s")
        gc.collect()
        gc.freeze()
        for attempt in range(attempts):  # the sizes alternate: a change of load hits both
            for runs, (store, latest) in stores.items():
                seconds, answer, _ = check_command(store, options, latest, tmp)
                times.setdefault(runs, []).append(seconds)
                base = answer.get("baseline") or {}
                print(f"attempt {attempt + 1}, {runs} runs: check {seconds:.2f} s "
                      f"({len(base.get('runs') or [])} baseline runs; load average "
                      f"{os.getloadavg()[0]:.1f})")
        if profile:
            for runs, (store, latest) in stores.items():
                print(f"--- {runs} runs\n{profile_check(store, options, latest, tmp)}")
    first = sizes[0]
    for runs in sizes[1:]:
        ratio = statistics.median(times[runs]) / statistics.median(times[first])
        low, high = min(times[runs]) / max(times[first]), max(times[runs]) / min(times[first])
        print(f"{runs} runs: {min(times[runs]):.2f}-{max(times[runs]):.2f} s (median "
              f"{statistics.median(times[runs]):.2f}); {first} runs: {min(times[first]):.2f}-"
              f"{max(times[first]):.2f} s (median {statistics.median(times[first]):.2f}); "
              f"ratio of medians {ratio:.2f} (range {low:.2f}-{high:.2f}); target <= 1.5: "
              f"{'ok' if ratio <= 1.5 else 'MISSED'}")
    print(f"(cpu count {os.cpu_count()}; load average {os.getloadavg()[0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--backend", choices=["local", "s3"], default="local")
    parser.add_argument("--layout", choices=["new", "before-totals", "old"], default="new",
                        help="which store version wrote the history: before-totals: manifests "
                             "without totals; old: also the index markers flat (before the "
                             "monthly partitions)")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--cli", action="store_true",
                        help="time `dask-profiling check --run <newest>` as a process on moto "
                             "S3 at each of --sizes")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10000])
    parser.add_argument("--profile", action="store_true",
                        help="with --cli: one more process per size under -X importtime and "
                             "cProfile")
    args = parser.parse_args()
    if args.cli:
        cli_main(args.sizes, args.attempts, args.profile)
        return
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto logs every request
    with tempfile.TemporaryDirectory() as tmp, open_store(args.backend, tmp) as (store, opts):
        t0 = time.perf_counter()
        latest = populate(store, args.runs, args.layout)
        print(f"stored {args.runs} runs ({args.layout} layout, {args.backend}) in "
              f"{time.perf_counter() - t0:.1f} s")
        # The stored runs (moto's objects on S3) live in this process, where a real store
        # would not: kept out of the garbage collector, whose full passes over them fell
        # into random attempts (0.6 s each at 10,000 runs, timed with gc.callbacks).
        gc.collect()
        gc.freeze()
        for attempt in range(args.attempts):
            gc.collect()
            fresh = RunStore(store.url, opts or None, spool_dir=f"{tmp}/spool",
                             timeout=store.timeout)  # a new night: nothing remembered
            requests = Requests(fresh) if fresh.kind == "s3" else None
            opened = open_client(fresh)
            loaded, checked, text = judge_once(fresh, latest, args.n)
            counted = f"; S3 requests: {requests}" if requests else ""
            client = f"; its S3 client opened before, in {opened:.3f} s" if requests else ""
            print(f"attempt {attempt + 1}: baseline + drift series {loaded:.3f} s, with the "
                  f"verdict {checked:.3f} s ({text}){counted}{client}; target < 1 s: "
                  f"{'ok' if loaded < 1 else 'MISSED'}")
        print(f"(cpu count {os.cpu_count()}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
