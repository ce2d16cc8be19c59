"""How long the ``dask-profiling`` command line takes to answer, and what it imports.

Starts a moto S3 server in this process (on 127.0.0.1), stores ``--runs`` nights of one
pipeline there with the project's own writing code (one record of a small staged job on an
in-process ``LocalCluster``, its times scaled a little per night, each night stored and judged
by :func:`~prefect_dask_profiling.run.pipeline.finish_run`, as a flow's end does), then runs each
command ``--repeats`` times as a new process — as a user's shell does — and prints the median,
the fastest and the slowest wall time:

* ``--help`` (what every typo costs);
* ``runs --pipeline P``, ``show RUN``, ``check --run RUN`` (the newest night), ``alerts``.

Then, once per command, ``python -X importtime``: the process's total import time and, for
the heavy libraries (Prefect, distributed, pandas, dask, numpy), whether the command imported
them and their cumulative import time.

``--also DIR`` runs every command of another checkout too (``PYTHONPATH=DIR``: an older
commit, from ``git archive``), against the same store, alternating with this one's: a paired
figure without storing the nights twice.

Run with::

    .venv/bin/python -m benchmarks.cli_latency [--runs 100] [--repeats 5] [--also DIR]

Targets (issue 34, item 7): ``--help`` <= 0.5 s; ``runs``, ``show``, ``check`` on 100 runs
<= 2 s; ``import prefect_dask_profiling.cli`` imports none of Prefect, distributed, pandas.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

PIPELINE = "bench"
HEAVY = ("prefect", "distributed", "pandas", "dask", "numpy")
T0 = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)
# The CLI as the console script ``dask-profiling`` runs it (pyproject's [project.scripts]).
CLI = (sys.executable, "-c", "from prefect_dask_profiling.cli import app; app()")
# Where the commands run: ``python -c`` puts the working directory first on sys.path, which
# would beat the checkout named by PYTHONPATH.
NEUTRAL = tempfile.gettempdir()


@dataclass(frozen=True)
class Imports:
    """What one process imported: the total import time and the heavy libraries'."""

    total_s: float
    heavy_s: dict[str, float]  # only the heavy libraries it imported


def record_night() -> object:
    """One record of a small two-stage array job on an in-process ``LocalCluster``."""
    import dask.array as da
    from distributed import Client, LocalCluster

    from prefect_dask_profiling import collect, install, stage, uninstall

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        name = install(client)
        for stage_name, n in (("read", 400), ("reduce", 200)):
            with client.as_current(), stage(stage_name):
                (da.ones((n, 200), chunks=(50, 50)) * 2).sum().compute()
        record = collect(client, name)
        uninstall(client, name)
    return record


def scaled(record, factor: float):
    """``record`` with its task seconds times ``factor`` × 200 (nightly prefixes take
    seconds; the recorded job takes milliseconds)."""
    from dataclasses import replace

    tasks = record.tasks.copy()
    columns = ["compute_s", "p50_s", "p95_s", "max_s"]
    tasks[columns] = tasks[columns] * 200.0 * factor
    return replace(record, tasks=tasks)


def store_nights(url: str, options: dict, spool: Path, runs: int) -> list[str]:
    """Store ``runs`` judged nights of :data:`PIPELINE` at ``url``; their run ids, oldest
    first."""
    from prefect_dask_profiling.run.pipeline import finish_run
    from prefect_dask_profiling.store.manifest import RunContext
    from prefect_dask_profiling.store.runs import RunStore, new_run_id

    record = record_night()
    store = RunStore(url, options, spool_dir=spool)
    ids = []
    for night in range(runs):
        noise = 1.0 + 0.015 * ((night * 7) % 5 - 2)  # deterministic, within the noise
        ctx = RunContext(run_id=new_run_id(T0 + timedelta(days=night)), pipeline=PIPELINE,
                         version="1")
        finish_run(store, scaled(record, noise), ctx, [])
        ids.append(ctx.run_id)
    listed = len(store.list_runs(PIPELINE))
    if listed != runs:
        raise SystemExit(f"{listed} of {runs} nights reached the store (the rest spooled)")
    return ids


def wall(argv: list[str], env: dict[str, str], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` runs of ``argv`` as a new process (exit code ignored:
    ``check`` exits 1 on a regression, which is an answer too)."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, check=False, cwd=NEUTRAL)
        out.append(time.perf_counter() - start)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{argv[3:]} exited {done.returncode}: {done.stderr.decode()}")
    return out


def imports(args: list[str], env: dict[str, str]) -> Imports:
    """``python -X importtime`` of the CLI running ``args``."""
    done = subprocess.run([CLI[0], "-X", "importtime", *CLI[1:], *args], env=env,
                          capture_output=True, check=False, text=True, cwd=NEUTRAL)
    return _parse(done.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="Nights stored (default 100).")
    parser.add_argument("--repeats", type=int, default=5, help="Runs per command (default 5).")
    parser.add_argument("--also", default=None,
                        help="Another checkout whose CLI runs too (alternating).")
    args = parser.parse_args()

    import logging

    import botocore.session
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's line per request

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
            aws_secret_access_key="testing").create_bucket(Bucket="cli-latency")
        url = "s3://cli-latency/store"
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            ids = store_nights(url, options, Path(tmp) / "spool", args.runs)
            print(f"stored {len(ids)} judged nights of {PIPELINE!r} at {url} on moto in "
                  f"{time.perf_counter() - started:.1f} s")
            env = {**os.environ, "DASK_PROFILING_STORAGE_OPTIONS": json.dumps(options),
                   "DASK_PROFILING_SPOOL": str(Path(tmp) / "spool"),
                   "DASK_PROFILING_STORE": url, "COLUMNS": "200"}
            here = str(Path(__file__).resolve().parent.parent)
            checkouts = {"this": here, **({"also": args.also} if args.also else {})}
            envs = {label: {**env, "PYTHONPATH": path} for label, path in checkouts.items()}
            commands = {"--help": ["--help"],
                        "runs": ["runs", "--pipeline", PIPELINE],
                        "show": ["show", ids[-1]],
                        "check": ["check", "--run", ids[-1]],
                        "alerts": ["alerts"]}
            print(f"\nwall time per command, {args.repeats} new processes each "
                  f"(python {sys.version.split()[0]}, {os.cpu_count()} cores, load "
                  f"{os.getloadavg()[0]:.1f}); checkouts: "
                  + ", ".join(f"{k} = {v}" for k, v in checkouts.items()))
            print(f"  {'command':<10} {'checkout':<8} {'median':>8} {'min':>8} {'max':>8}")
            for name, argv in commands.items():
                times: dict[str, list[float]] = {label: [] for label in envs}
                for _ in range(args.repeats):
                    for label, label_env in envs.items():
                        times[label] += wall([*CLI, *argv], label_env, 1)
                for label, found in times.items():
                    print(f"  {name:<10} {label:<8} {statistics.median(found):7.2f}s "
                          f"{min(found):7.2f}s {max(found):7.2f}s")
            print(f"\nimports per command (python -X importtime; cumulative seconds; load "
                  f"{os.getloadavg()[0]:.1f}):")
            for name, argv in {"import cli": None, **commands}.items():
                for label, label_env in envs.items():
                    found = imports(argv, label_env) if argv is not None else \
                        _cli_import(label_env)
                    heavy = ", ".join(f"{k} {v:.2f}" for k, v in found.heavy_s.items()) or \
                        "none"
                    print(f"  {name:<10} {label:<8} total {found.total_s:5.2f}s; heavy: {heavy}")
    finally:
        server.stop()


def _cli_import(env: dict[str, str]) -> Imports:
    """``python -X importtime -c 'import prefect_dask_profiling.cli'``."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import prefect_dask_profiling.cli"], env=env, capture_output=True,
                          check=False, text=True, cwd=NEUTRAL)
    return _parse(done.stderr)


def _parse(stderr: str) -> Imports:
    """The total and heavy-library import times in ``-X importtime`` output."""
    total, heavy = 0, {}
    for line in stderr.splitlines():
        parts = line[len("import time:"):].split("|") if line.startswith("import time:") else []
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2]
        depth = len(name) - len(name.lstrip(" "))
        if depth == 1:  # top level: its cumulative time includes everything below it
            total += int(parts[1])
        if name.strip() in HEAVY:
            heavy[name.strip()] = int(parts[1]) / 1e6
    return Imports(total / 1e6, heavy)


if __name__ == "__main__":
    main()
