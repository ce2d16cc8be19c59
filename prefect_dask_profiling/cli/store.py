"""Store commands: ``sweep``, ``upload-pending``, ``report`` (and their argument bodies)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TypedDict

import typer

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.cli._output import (
    EXIT_VERDICT,
    BadInput,
    emit_json,
    err_console,
    guarded,
    say,
    warn,
)
from prefect_dask_profiling.cli._params import (
    JsonOption,
    PipelineOption,
    RunArgument,
    StoreOption,
    make_store,
)
from prefect_dask_profiling.errors import InvalidInput

if TYPE_CHECKING:
    from prefect_dask_profiling.store.runs import RunStore


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("sweep")(guarded(sweep_command))
    app.command("upload-pending")(guarded(upload_pending_command))
    app.command("report")(guarded(report_command))


def sweep_command(
    older_than: str = typer.Option(..., "--older-than", help="Age: 30d, 12h or days."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete per-stage reports older than --older-than (never summaries or the index),
    and the leftover live estimates of runs that stopped without ending (exit 1 if those
    cannot be listed)."""
    from prefect_dask_profiling.errors import StoreError

    try:
        days = parse_age(older_than)
    except ValueError as exc:  # the age's own validation
        raise BadInput(str(exc)) from None
    run_store = make_store(store)
    removed = run_store.sweep(days)
    try:
        live_removed, live_error = run_store.sweep_live(), None
    except StoreError as exc:  # the reports' sweep is still said
        live_removed, live_error = [], " ".join(str(exc).split())
    if as_json:
        emit_json({"store": run_store.url, "older_than_days": days, "removed": removed,
                   "live_removed": live_removed, "live_error": live_error})
    else:
        for location in [*removed, *live_removed]:
            say(f"removed {location}")
        say(f"{len(removed)} report folder(s) older than {days:g} days removed from "
            f"{run_store.url}")
        say(f"{len(live_removed)} leftover live estimate(s) removed (runs that stopped "
            "without ending)")
        if live_error:
            warn(f"warning: leftover live estimates not swept: {live_error}")
    if live_error:
        raise typer.Exit(EXIT_VERDICT)


def upload_pending_command(
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Upload files spooled while the store was unreachable (exit 1 if some still fail)."""
    from rich.progress import Progress

    run_store = make_store(store)
    with Progress(console=err_console(), transient=True, disable=as_json) as progress:
        task = progress.add_task("uploading", total=None)
        result = run_store.upload_pending(
            progress=lambda done, total: progress.update(task, completed=done, total=total))
    if as_json:
        emit_json({"store": run_store.url, "uploaded": result.uploaded,
                   "failed": result.failed, "warnings": result.warnings})
    else:
        for warning in result.warnings:
            warn(f"warning: {warning}")
        say(f"uploaded {result.uploaded}, failed {result.failed} ({run_store.url})")
    if result.failed:
        raise typer.Exit(EXIT_VERDICT)


def report_command(
    run_id: RunArgument,
    stage_name: str = typer.Argument(..., metavar="STAGE", help="Stage name."),
    pipeline: PipelineOption = None,
    store: StoreOption = None,
    expires: int = typer.Option(3600, "--expires", min=1, help="Link lifetime (s, max 7d)."),
    open_it: bool = typer.Option(False, "--open", help="Open the report in a browser."),
    as_json: JsonOption = False,
) -> None:
    """Print a link to one stage's performance report (presigned on S3)."""
    import webbrowser
    from pathlib import Path

    from prefect_dask_profiling.regression.history import find_run

    run_store = make_store(store)
    pipeline = find_run(run_store, validate_name(run_id, "run_id"), pipeline)
    info = report_link(run_store, run_id, stage_name, pipeline, expires)
    target = info["url"] or info["location"]
    if as_json:
        emit_json(info)
    else:
        say(target)
    if open_it and not webbrowser.open(target if "://" in target else Path(target).as_uri()):
        warn("warning: no browser could be opened")


def parse_age(text: str) -> float:
    """Days from ``30d``, ``12h`` or a plain number of days (``--older-than``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dh]?)\s*", str(text), re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise InvalidInput("--older-than must look like 30d, 12h or a number of days, "
                           f"got {text!r}")
    value = float(match.group(1))
    return value / 24 if match.group(2).lower() == "h" else value


class ReportLink(TypedDict):
    """Where a stage's report is (``dask-profiling report``): its location, and a presigned
    ``url`` (``None``: the store cannot sign) valid for ``expires_s`` (S3 stores only)."""

    pipeline: str
    run_id: str
    stage: str
    location: str
    url: str | None
    signed: bool
    expires_s: int | None


def report_link(store: RunStore, run_id: str, stage: str, pipeline: str,
                expires_s: int = 3600) -> ReportLink:
    """Where a stage's report is, with a presigned link when the store is S3 and can sign.

    ``StoreNotFound`` for an unknown run or a report that expired or was never written.
    """
    from prefect_dask_profiling.store import layout
    from prefect_dask_profiling.store.errors import StoreNotFound

    manifest = store.read_manifest(pipeline, run_id)
    stage = validate_name(stage, "stage")
    entries = [s for s in manifest.get("stages") or [] if isinstance(s, dict)
               and s.get("name") == stage]
    report = entries[0].get("report") if entries else None
    if isinstance(report, dict) and isinstance(report.get("location"), str):
        location = report["location"]
    else:
        location = store.location(layout.report_file(pipeline, run_id, stage))
    if not store.exists(location):
        known = ", ".join(str(s.get("name")) for s in manifest.get("stages") or []
                          if isinstance(s, dict)) or "none"
        raise StoreNotFound(f"no report for stage {stage!r} of run {run_id!r} (expired or "
                            f"never written); stages in the manifest: {known}")
    url = store.presign(location, expires_s)
    return {"pipeline": pipeline, "run_id": run_id, "stage": stage, "location": location,
            "url": url, "signed": url is not None,
            "expires_s": store.backend.link_expiry(expires_s)}
