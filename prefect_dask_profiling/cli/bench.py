"""The ``bench`` command: the profiling protocol of :mod:`prefect_dask_profiling.bench`."""

from __future__ import annotations

import time

import typer

from prefect_dask_profiling.cli._output import (
    BadInput,
    emit_json,
    err_console,
    guarded,
    out_console,
    print_table,
)
from prefect_dask_profiling.cli._params import JsonOption


def register(app: typer.Typer) -> None:
    """Add this module's command to ``app``."""
    app.command("bench")(guarded(bench))


def bench(
    workload: str = typer.Option(..., "--workload", help="package.module:callable(n, seed)."),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Remote tcp://HOST:PORT."),
    local: bool = typer.Option(True, "--local/--no-local", help="Also run a local cluster."),
    local_workers: int = typer.Option(2, "--local-workers"),
    local_threads: int = typer.Option(1, "--local-threads"),
    local_memory_limit: str | None = typer.Option(None, "--local-memory-limit"),
    n: str = typer.Option("128,256", "--n", help="Problem sizes, comma-separated."),
    seeds: str = typer.Option("1,2,3", "--seeds", help="Seeds = aggregates per batch."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed batches per n."),
    repeats: int = typer.Option(3, "--repeats", help="Measured batches per n."),
    calibration_repeats: int = typer.Option(5, "--calibration-repeats"),
    out: str = typer.Option("benchmark_results/profiles", "--out"),
    connect_timeout: float = typer.Option(5.0, "--connect-timeout", help="Seconds."),
    as_json: JsonOption = False,
) -> None:
    """Profile a workload on a local and/or remote cluster; classify the bottleneck."""
    from prefect_dask_profiling.bench.config import BenchConfig, BenchInputError, parse_ints
    from prefect_dask_profiling.bench.protocol import run_bench

    started = time.monotonic()

    def progress(message: str) -> None:
        err_console().print(f"[dim]{time.monotonic() - started:6.1f}s[/dim] {message}",
                          highlight=False)

    try:
        config = BenchConfig(workload=workload, n=parse_ints(n, "--n"),
                             seeds=parse_ints(seeds, "--seeds"), warmup=warmup,
                             repeats=repeats, out=out, scheduler=scheduler, local=local,
                             local_workers=local_workers, local_threads=local_threads,
                             local_memory_limit=local_memory_limit,
                             calibration_repeats=calibration_repeats,
                             connect_timeout=connect_timeout)
        if err_console().is_terminal:
            with err_console().status("benchmarking…"):
                result = run_bench(config, progress)
        else:
            result = run_bench(config, progress)
    except BenchInputError as exc:  # bad input, found before anything is measured
        raise BadInput(str(exc)) from None
    if as_json:
        emit_json({"directory": str(result.directory), "comparison": result.comparison})
        return
    import pandas as pd

    print_table(pd.DataFrame(result.comparison["table"]), title="local vs remote")
    for side, s in result.summaries.items():
        b = s["bottleneck"]
        out_console().print(f"{side}: [bold]{b['primary']}[/bold]-bound (secondary "
                      f"{b['secondary']}, {b['confidence']}): {b['note']}", highlight=False)
    out_console().print(f"artifacts: {result.directory}", highlight=False)
