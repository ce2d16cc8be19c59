"""Export commands: ``export prometheus``, ``fleet``, ``drift``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefect_dask_profiling.cli._output import (
    EXIT_VERDICT,
    BadInput,
    emit_json,
    guarded,
    print_table,
    say,
    warn,
)
from prefect_dask_profiling.cli._params import (
    JsonOption,
    PipelineOption,
    StoreOption,
    existing_store,
)

export_app = typer.Typer(no_args_is_help=True,
                         help="Export the stored runs to other tools (Prometheus).")

DRIFT_SHOW = ["stage", "prefix", "verdict", "fails", "cumulative_ratio", "start_run",
              "start_s", "level_s", "latest_s", "z", "n_nights"]


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    export_app.command("prometheus")(guarded(prometheus_command))
    app.add_typer(export_app, name="export")
    app.command("fleet")(guarded(fleet_command))
    app.command("drift")(guarded(drift_command))


def prometheus_command(
    store: StoreOption = None,
    pipeline: PipelineOption = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write a .prom file (atomically) for node-exporter's textfile "
                      "collector.")] = None,
    push: Annotated[str | None, typer.Option(
        "--push", help="Push to this Pushgateway URL (one group per pipeline).")] = None,
    job: Annotated[str, typer.Option("--job", help="Pushgateway job name.")] = "dask_profiling",
) -> None:
    """Write the latest run of each pipeline (or of --pipeline) as Prometheus metrics."""
    from prefect_dask_profiling.export import prometheus

    if (out is None) == (push is None):
        raise BadInput("give exactly one of --out FILE or --push URL")
    runs = prometheus.latest_runs(existing_store(store), pipeline)
    if not runs:
        raise BadInput("no exportable runs in the store")
    if out is not None:
        prometheus.write_textfile(prometheus.build_registry(runs), str(out))
        say(f"wrote the latest run of {len(runs)} pipeline(s) to {out}")
        return
    try:
        pushed = prometheus.push(runs, push, job=job)
    except OSError as exc:  # refused, unreachable, HTTP error from the gateway
        raise BadInput(f"could not push to {push}: {exc}") from None
    say(f"pushed the latest run of {', '.join(pushed)} to {push}")


def fleet_command(
    store: StoreOption = None,
    pipeline: PipelineOption = None,
    rebuild: Annotated[bool, typer.Option(
        "--rebuild", help="Write the view again from the stored runs.")] = False,
    compact: Annotated[bool, typer.Option(
        "--compact", help="Fold each month before this one into one file per pipeline "
                          "(month=YYYY-MM.parquet): fewer files for a query engine.")] = False,
    as_json: JsonOption = False,
) -> None:
    """The fleet-wide Parquet view at <store>/fleet/: where it is, --rebuild or --compact it."""
    from prefect_dask_profiling.export import fleet

    if rebuild and compact:
        raise BadInput("--rebuild and --compact: one at a time")
    run_store = existing_store(store)
    location = fleet.fleet_location(run_store)
    if compact:
        done = fleet.compact_fleet(run_store, pipeline)
        if as_json:
            emit_json({"location": location, **done})
            return
        for path, reason in done["skipped"]:
            warn(f"left {path} as it is: {reason}")
        say(f"compacted {location}: {done['months']} month file(s) written, "
            f"{done['removed']} run file(s) folded into them")
        return
    if not rebuild:
        frame = fleet.read_fleet(run_store)
        info = {"location": location, "rows": len(frame),
                "pipelines": sorted(frame["pipeline"].unique().tolist()),
                "runs": int(frame["run_id"].nunique())}
        if as_json:
            emit_json(info)
            return
        say(f"{location}: {info['rows']} rows, {info['runs']} runs of "
            f"{len(info['pipelines'])} pipeline(s)")
        return
    result = fleet.rebuild_fleet(run_store, pipeline)
    if as_json:
        emit_json({"location": location, **result})
        return
    for run_id, reason in result["skipped"]:
        warn(f"skipped run {run_id}: {reason}")
    say(f"rebuilt {location}: {result['written']} run file(s) written, {result['removed']} "
        f"stale file(s) removed")


def drift_command(
    store: StoreOption = None,
    pipeline: PipelineOption = None,
    run_id: Annotated[str | None, typer.Option(
        "--run", help="Run id (default: the newest).")] = None,
    threshold: Annotated[float | None, typer.Option(
        "--threshold", help="Cumulative ratio from which drift fails (exit 1); default the "
                            "run's own rules.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Judge a run (default the newest) for gradual drift since its baseline start."""
    from prefect_dask_profiling.regression import history
    from prefect_dask_profiling.regression.judge import judge_stored

    run_store = existing_store(store)
    name = history.find_run(run_store, run_id, pipeline) if run_id is not None \
        else history.resolve_pipeline(run_store, pipeline)
    overrides = {"threshold": threshold} if threshold is not None else None
    result = judge_stored(run_store, name, run_id, overrides=overrides)
    judgement = result.judgement
    if judgement is None:
        raise BadInput(f"run {result.manifest['run_id']} cannot be judged now: {result.error}")
    from prefect_dask_profiling.regression.drift import describe_drift, drifted

    verdicts, note = judgement.drift, judgement.notes.get("drift", "")
    failing = drifted(verdicts, failing_only=True)
    if as_json:
        emit_json({"pipeline": name, "run_id": judgement.run.run_id, "note": note,
                   "failing": not failing.empty, "rules": judgement.rules.to_dict(),
                   "verdicts": verdicts.to_dict("records")})
    else:
        print_table(verdicts[[c for c in DRIFT_SHOW if c in verdicts.columns]],
                    title=f"{name} {judgement.run.run_id}: drift ({note})")
        say(describe_drift(drifted(verdicts)))
    if not failing.empty:
        raise typer.Exit(EXIT_VERDICT)
