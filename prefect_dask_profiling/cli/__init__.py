"""The ``dask-profiling`` command line: a thin layer over store, history, regression, bench.

Exit codes: 0 ok, 1 a verdict failed (regression), 2 bad input (unknown store, run,
pipeline, malformed arguments). Errors are one clear line on stderr, never a traceback.
Every command takes ``--json`` for machines.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Where each night's Dask time went, and whether it regressed.")
console = Console()
err_console = Console(stderr=True)

EXIT_OK, EXIT_VERDICT, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """Raised by command bodies for input errors: printed as one line, exit code 2."""


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected errors into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except (BadInput, ValueError, KeyError, FileNotFoundError, PermissionError,
                OSError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            err_console.print(f"error: {message}", markup=False, highlight=False,
                              soft_wrap=True)  # one line, whatever the terminal width
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON (NaN/inf become null)."""
    from prefect_dask_profiling._util import json_clean

    sys.stdout.write(json.dumps(json_clean(data), indent=2, sort_keys=False) + "\n")


def print_table(frame, title: str | None = None, float_digits: int = 3) -> None:
    """Print a pandas DataFrame as a rich table."""
    table = Table(title=title, show_lines=False)
    for col in frame.columns:
        numeric = frame[col].dtype.kind in "fiu"
        # names (prefixes, run ids) wrap rather than being cut to "open_d…" on narrow terminals
        table.add_column(str(col), justify="right" if numeric else "left",
                         overflow="ellipsis" if numeric else "fold")
    for row in frame.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append("" if v != v else f"{v:.{float_digits}f}")
            else:
                cells.append(str(v))
        table.add_row(*cells)
    console.print(table)


# Commands are registered by the modules below (each keeps its command next to its logic).
# >>> command registrations
# --- store: sweep, upload-pending, report (logic in prefect_dask_profiling/store.py)
_STORE_HELP = "Store URL (default: $DASK_PROFILING_STORE or ./.dask-profiling)."

StoreOption = Annotated[str | None, typer.Option("--store", help=_STORE_HELP)]
PipelineOption = Annotated[str | None, typer.Option("--pipeline", help="Pipeline name.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="Run id.")]


@app.command("sweep")
@guarded
def sweep_command(
    older_than: str = typer.Option(..., "--older-than", help="Age: 30d, 12h or days."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete per-stage reports older than --older-than (never summaries or the index)."""
    from prefect_dask_profiling.store.runs import RunStore, StoreError, parse_age

    days = parse_age(older_than)
    try:
        run_store = RunStore(store)
        removed = run_store.sweep(days)
    except StoreError as exc:
        raise BadInput(str(exc)) from None
    if as_json:
        emit_json({"store": run_store.url, "older_than_days": days, "removed": removed})
        return
    for location in removed:
        console.print(f"removed {location}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"{len(removed)} report folder(s) older than {days:g} days removed from "
                  f"{run_store.url}", markup=False, highlight=False, soft_wrap=True)


@app.command("upload-pending")
@guarded
def upload_pending_command(
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Upload files spooled while the store was unreachable (exit 1 if some still fail)."""
    from rich.progress import Progress

    from prefect_dask_profiling.store.runs import RunStore

    run_store = RunStore(store)
    with Progress(console=err_console, transient=True, disable=as_json) as progress:
        task = progress.add_task("uploading", total=None)
        result = run_store.upload_pending(
            progress=lambda done, total: progress.update(task, completed=done, total=total))
    if as_json:
        emit_json({"store": run_store.url, "uploaded": result.uploaded,
                   "failed": result.failed, "warnings": result.warnings})
    else:
        for warning in result.warnings:
            err_console.print(f"warning: {warning}", markup=False, highlight=False,
                              soft_wrap=True)
        console.print(f"uploaded {result.uploaded}, failed {result.failed} ({run_store.url})",
                      markup=False, highlight=False, soft_wrap=True)
    if result.failed:
        raise typer.Exit(EXIT_VERDICT)


@app.command("report")
@guarded
def report_command(
    run_id: RunArgument,
    stage_name: str = typer.Argument(..., metavar="STAGE", help="Stage name."),
    pipeline: str = typer.Option(..., "--pipeline", help="Pipeline name."),
    store: StoreOption = None,
    expires: int = typer.Option(3600, "--expires", min=1, help="Link lifetime (s, max 7d)."),
    open_it: bool = typer.Option(False, "--open", help="Open the report in a browser."),
    as_json: JsonOption = False,
) -> None:
    """Print a link to one stage's performance report (presigned on S3)."""
    import webbrowser
    from pathlib import Path

    from prefect_dask_profiling.store.runs import RunStore, StoreError, report_link

    try:
        info = report_link(RunStore(store), run_id, stage_name, pipeline, expires)
    except StoreError as exc:
        raise BadInput(str(exc)) from None
    target = info["url"] or info["location"]
    if as_json:
        emit_json(info)
    else:
        console.print(target, markup=False, highlight=False, soft_wrap=True)
    if open_it and not webbrowser.open(target if "://" in target else Path(target).as_uri()):
        err_console.print("warning: no browser could be opened", markup=False)


# --- bench: the profiling protocol (logic in prefect_dask_profiling/bench.py)
@app.command()
@guarded
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
    from prefect_dask_profiling.bench.protocol import cli_bench

    cli_bench(workload=workload, scheduler=scheduler, local=local, local_workers=local_workers,
              local_threads=local_threads, local_memory_limit=local_memory_limit, n=n,
              seeds=seeds, warmup=warmup, repeats=repeats,
              calibration_repeats=calibration_repeats, out=out,
              connect_timeout=connect_timeout, as_json=as_json)


# --- history: runs, show, compare, check, accept (logic in prefect_dask_profiling/history.py)
def _history_call(fn, *args, **kwargs):
    """Call a history function; store errors become one line and exit code 2."""
    from prefect_dask_profiling.store.runs import StoreError

    try:
        return fn(*args, **kwargs)
    except StoreError as exc:
        raise BadInput(str(exc)) from None


def _store_and_pipeline(store: str | None, pipeline: str | None):
    from prefect_dask_profiling.regression import history

    run_store = _history_call(history.open_store, store)
    return run_store, _history_call(history.resolve_pipeline, run_store, pipeline)


@app.command("runs")
@guarded
def runs_command(
    pipeline: str | None = typer.Option(None, "--pipeline", help="Pipeline (omit: list them)."),
    version: str | None = typer.Option(None, "--version", help="Only this version."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List a pipeline's runs (run id, version, status), newest first; or the pipelines."""
    from prefect_dask_profiling.regression import history

    run_store = _history_call(history.open_store, store)
    if pipeline is None:
        names = _history_call(run_store.list_pipelines)
        if as_json:
            emit_json({"store": run_store.url, "pipelines": names})
        else:
            for name in names:
                console.print(name, markup=False, highlight=False)
        return
    pipeline = _history_call(history.resolve_pipeline, run_store, pipeline)
    runs = _history_call(history.list_runs, run_store, pipeline, version)
    if as_json:
        emit_json({"store": run_store.url, "pipeline": pipeline,
                   "runs": runs.to_dict(orient="records")})
    else:
        print_table(runs, title=f"{pipeline} runs in {run_store.url}")


@app.command("show")
@guarded
def show_command(
    run_id: RunArgument,
    pipeline: PipelineOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """A run's manifest summary and its per-prefix table."""
    from prefect_dask_profiling.regression import history

    run_store, pipeline = _store_and_pipeline(store, pipeline)
    summary, tasks = _history_call(history.show_run, run_store, pipeline, run_id)
    if as_json:
        emit_json({"manifest": summary, "tasks": tasks.to_dict(orient="records")})
        return
    for key, value in summary.items():
        if value not in (None, [], {}):
            console.print(f"{key}: {value}", markup=False, highlight=False, soft_wrap=True)
    print_table(tasks, title=f"{pipeline} {run_id}: time per prefix")


@app.command("compare")
@guarded
def compare_command(
    run_a: str = typer.Argument(..., metavar="RUN_A", help="First run id."),
    run_b: str = typer.Argument(..., metavar="RUN_B", help="Second run id."),
    pipeline: PipelineOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per-prefix differences between two runs (ratio = B / A)."""
    from prefect_dask_profiling.regression import history

    run_store, pipeline = _store_and_pipeline(store, pipeline)
    diff = _history_call(history.compare_runs, run_store, pipeline, run_a, run_b)
    if as_json:
        emit_json({"pipeline": pipeline, "run_a": run_a, "run_b": run_b,
                   "prefixes": diff.to_dict(orient="records")})
    else:
        print_table(diff, title=f"{pipeline}: {run_a} (A) vs {run_b} (B)")


@app.command("check")
@guarded
def check_command(
    pipeline: PipelineOption = None,
    version: str | None = typer.Option(None, "--version", help="Newest run of this version."),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: the newest)."),
    threshold: float = typer.Option(2.0, "--threshold", help="Ratio to the median (> 1)."),
    n_history: int = typer.Option(8, "--history", min=1, help="Baseline runs at most."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Judge a run against its baseline; exit 1 on a regression."""
    from prefect_dask_profiling.regression import history
    from prefect_dask_profiling.regression.verdict import describe, regressed

    run_store, pipeline = _store_and_pipeline(store, pipeline)
    result = _history_call(history.check_run, run_store, pipeline, run_id, version,
                           n=n_history, threshold=threshold)
    if as_json:
        emit_json(result.to_json())
    else:
        base = result.baseline
        console.print(f"{pipeline} {result.version} run {result.run_id} against "
                      f"{len(base.runs)} baseline run(s)" + (f" ({base.note})" if base.note
                                                             else ""),
                      markup=False, highlight=False, soft_wrap=True)
        print_table(result.verdicts[list(history.CHECK_COLUMNS)], title="verdicts")
        for row in result.verdicts[result.verdicts["note"] != ""].itertuples():
            console.print(f"note: {row.stage}/{row.prefix}: {row.note}", markup=False,
                          highlight=False, soft_wrap=True)
        console.print(describe(regressed(result.verdicts)), markup=False, highlight=False,
                      soft_wrap=True)
    if result.regressed:
        raise typer.Exit(EXIT_VERDICT)


@app.command("accept")
@guarded
def accept_command(
    run_id: RunArgument,
    pipeline: PipelineOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Accept a run: its version's baseline restarts there (an intended change)."""
    from prefect_dask_profiling.regression import history

    run_store, pipeline = _store_and_pipeline(store, pipeline)
    version = _history_call(history.accept_run, run_store, pipeline, run_id)
    if as_json:
        emit_json({"pipeline": pipeline, "version": version, "accepted": run_id})
    else:
        console.print(f"accepted {run_id}: the baseline of {pipeline} {version} restarts there",
                      markup=False, highlight=False, soft_wrap=True)


# <<< command registrations


def main() -> None:  # pragma: no cover - console entry point
    app()
