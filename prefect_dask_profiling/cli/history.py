"""History commands: ``runs``, ``show``, ``compare``, ``check``, ``accept``.

The command bodies import what they use (:mod:`~prefect_dask_profiling.regression.history`
brings pandas): listing the commands, or ``--help``, imports none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.cli._output import (
    EXIT_UNJUDGED,
    EXIT_VERDICT,
    emit_json,
    format_value,
    guarded,
    print_table,
    say,
)
from prefect_dask_profiling.cli._params import (
    JsonOption,
    PipelineOption,
    RunArgument,
    StoreOption,
    existing_store,
)

if TYPE_CHECKING:
    from prefect_dask_profiling.regression.history import RunSummary
    from prefect_dask_profiling.store.manifest import Manifest
    from prefect_dask_profiling.store.runs import RunStore

# The columns of the human check table; --json has them all.
CHECK_COLUMNS = ["stage", "prefix", "verdict", "cause", "baseline_s", "latest_s", "ratio",
                 "robust_z", "tasks_ratio", "share"]


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("runs")(guarded(runs_command))
    app.command("show")(guarded(show_command))
    app.command("compare")(guarded(compare_command))
    app.command("check")(guarded(check_command))
    app.command("accept")(guarded(accept_command))


def _store_and_run(store: str | None, pipeline: str | None, *runs: str) -> tuple[RunStore, str]:
    """The store, and the pipeline holding the first run (found when not given)."""
    from prefect_dask_profiling.regression import history

    run_store = existing_store(store)
    for run_id in runs:
        validate_name(run_id, "run_id")
    return run_store, history.find_run(run_store, runs[0], pipeline)


def runs_command(
    pipeline: str | None = typer.Option(None, "--pipeline", help="Pipeline (omit: list them)."),
    version: str | None = typer.Option(None, "--version", help="Only this version."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List a pipeline's runs (run id, version, status), newest first; or the pipelines."""
    from prefect_dask_profiling.regression import history

    run_store = existing_store(store)
    if pipeline is None:
        names = run_store.list_pipelines()
        if as_json:
            emit_json({"store": run_store.url, "pipelines": names})
        else:
            for name in names:
                say(name)
        return
    pipeline = history.resolve_pipeline(run_store, pipeline)
    runs = history.list_runs(run_store, pipeline, version)
    if as_json:
        emit_json({"store": run_store.url, "pipeline": pipeline,
                   "runs": runs.to_dict(orient="records")})
    else:
        print_table(runs, title=f"{pipeline} runs in {run_store.url}")


def summary_lines(summary: RunSummary) -> list[str]:
    """``key: value`` lines of a run's manifest summary, formatted like the tables.

    Floats are rounded, the baseline is its runs and note, warnings get a line each; empty
    values are left out.
    """
    lines = []
    for key, value in summary.items():
        if key in ("baseline", "warnings", "bottlenecks", "explanations", "storage") or value in (
                None, [], {}, ""):
            continue
        lines.append(f"{key}: {format_value(value)}")
    lines.extend(bottleneck_lines(summary.get("bottlenecks"), summary.get("explanations")))
    lines.extend(storage_lines(summary.get("storage")))
    baseline = summary.get("baseline")
    if isinstance(baseline, dict):
        runs = baseline.get("runs") or []
        span = f" ({runs[0]} … {runs[-1]})" if len(runs) > 1 else (
            f" ({runs[0]})" if runs else "")
        lines.append(f"baseline: {len(runs)} run(s) of version "
                     f"{format_value(baseline.get('version'))}{span}")
        if baseline.get("note"):
            lines.append(f"baseline note: {baseline['note']}")
    lines.extend(f"warning: {w}" for w in summary.get("warnings") or [])
    return lines


def storage_lines(storage: Any) -> list[str]:
    """One line per stage that made storage requests, one per chunks-against-blocks check."""
    from prefect_dask_profiling.summary.io import io_text

    lines = []
    for stage, entry in storage.items() if isinstance(storage, dict) else ():
        text = io_text((entry or {}).get("io"))
        if text:
            lines.append(f"storage {stage}: {text}")
        align = (entry or {}).get("chunks_vs_blocks")
        if isinstance(align, dict) and align.get("text"):
            lines.append(f"chunks {stage}: {align['text']}")
    return lines


def bottleneck_lines(bottlenecks: Any, explanations: Any = None) -> list[str]:
    """One line per stage diagnosis (verdict, evidence), one per regression explanation.

    Runs stored before diagnoses existed have none: no line, no error.
    """
    from prefect_dask_profiling.diagnosis.stages import Diagnosis

    lines = []
    for stage, stored in (bottlenecks or {}).items() if isinstance(bottlenecks, dict) else ():
        d = Diagnosis.from_dict(stored, stage=str(stage))
        if d is not None:
            evidence = d.evidence()
            lines.append(f"bottleneck {stage}: {d.summary()}" +
                         (f" — {evidence}" if evidence else ""))
    for stage, why in (explanations or {}).items() if isinstance(explanations, dict) else ():
        if isinstance(why, dict) and why.get("text"):
            lines.append(f"why {stage}: {why['text']}")
    return lines


def show_command(
    run_id: RunArgument,
    pipeline: PipelineOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """A run's manifest summary and its per-prefix table."""
    from prefect_dask_profiling.regression import history

    run_store, pipeline = _store_and_run(store, pipeline, run_id)
    summary, tasks = history.show_run(run_store, pipeline, run_id)
    if as_json:
        manifest = run_store.read_manifest(pipeline, run_id)
        emit_json({"manifest": summary, "tasks": tasks.to_dict(orient="records"),
                   "memory": {s.get("name"): s.get("memory") for s in manifest.get("stages")
                              or [] if isinstance(s, dict) and s.get("memory")},
                   "incidents": manifest.get("incidents") or [],
                   "allocation": manifest.get("allocation")})
        return
    for line in summary_lines(summary):
        say(line)
    if "errors" in tasks and not (tasks["errors"].fillna(0) != 0).any():
        tasks = tasks.drop(columns="errors")  # shown only when some task erred (JSON: always)
    print_table(tasks, title=f"{pipeline} {run_id}: time per prefix")
    manifest = run_store.read_manifest(pipeline, run_id)
    _show_memory(manifest, f"{pipeline} {run_id}")
    _show_allocation(manifest, f"{pipeline} {run_id}")


def _show_allocation(manifest: Manifest, title: str) -> None:
    """What the cluster allocated per stage (runs stored before: nothing); the rate used
    when the run was priced, and that its cost is an estimate."""
    from prefect_dask_profiling.cost.allocation import allocation_table

    doc = manifest.get("allocation")
    table = allocation_table(doc if isinstance(doc, dict) else None)
    if table.empty:
        return
    print_table(table, title=f"{title}: allocated, busy and idle (hours)")
    rates = doc.get("rates") if isinstance(doc, dict) else None
    if rates:
        say(f"cost is an estimate at {rates.get('text', '')} ({rates.get('currency', '')}); "
            "see docs/cost.md")


def _show_memory(manifest: Manifest, title: str) -> None:
    """The run's memory per stage and its worker deaths (runs stored before: nothing)."""
    from prefect_dask_profiling.summary.memory import describe_incident, memory_table

    memory = memory_table(manifest.get("stages") or [])
    if not memory.empty:
        print_table(memory, title=f"{title}: memory per stage")
    for incident in manifest.get("incidents") or []:
        if isinstance(incident, dict):
            say(f"worker death: {describe_incident(incident)}")


def compare_command(
    run_a: str = typer.Argument(..., metavar="RUN_A", help="First run id."),
    run_b: str = typer.Argument(..., metavar="RUN_B", help="Second run id."),
    pipeline: PipelineOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per-prefix differences between two runs (ratio = B / A)."""
    from prefect_dask_profiling.regression import history

    run_store, pipeline = _store_and_run(store, pipeline, run_a, run_b)
    diff = history.compare_runs(run_store, pipeline, run_a, run_b)
    if as_json:
        emit_json({"pipeline": pipeline, "run_a": run_a, "run_b": run_b,
                   "prefixes": diff.to_dict(orient="records")})
    else:
        print_table(diff, title=f"{pipeline}: {run_a} (A) vs {run_b} (B)")


def check_command(
    pipeline: PipelineOption = None,
    version: str | None = typer.Option(None, "--version", help="Newest run of this version."),
    run_id: str | None = typer.Option(None, "--run", help="Run id (default: the newest)."),
    threshold: float | None = typer.Option(
        None, "--threshold", help="Ratio to the median (> 1); default the run's own rules."),
    n_history: int | None = typer.Option(
        None, "--history", min=1, help="Baseline runs at most; default the run's own rules."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Judge a stored run again with the rules it was judged with (one-night verdicts and
    drift); exit 1 on a regression, 5 on a run stored unjudged (or that cannot be judged
    now) that shows none: its gate did not look."""
    from prefect_dask_profiling.regression import history
    from prefect_dask_profiling.regression.judge import judge_stored

    overrides = {k: v for k, v in (("threshold", threshold), ("history", n_history))
                 if v is not None}
    run_store = existing_store(store)
    with run_store.remembering_reads():  # finding the run lists what judging it reads again
        if run_id is not None and pipeline is None:
            validate_name(run_id, "run_id")
            pipeline = history.find_run(run_store, run_id)
        else:
            pipeline = history.resolve_pipeline(run_store, pipeline)
        result = judge_stored(run_store, pipeline, run_id, version, overrides=overrides)
    if as_json:
        emit_json(result.to_json())
    else:
        _say_check(result)
    if result.failing:
        regressed = result.judgement is not None and result.judgement.regressed
        raise typer.Exit(EXIT_VERDICT if regressed else EXIT_UNJUDGED)


def _say_check(result) -> None:
    """The human form of ``check``: the verdict table, notes, outcome and explanations."""
    manifest, judgement = result.manifest, result.judgement
    run = f"{manifest['pipeline']} {manifest['version']} run {manifest['run_id']}"
    if judgement is None:
        say(f"{run}: cannot be judged now: {result.error}")
    else:
        base = judgement.baseline_note
        say(f"{run} against {len(judgement.baseline_runs)} baseline run(s)"
            + (f" ({base})" if base else ""))
        verdicts = judgement.verdicts
        print_table(verdicts[CHECK_COLUMNS], title="verdicts")
        for row in verdicts[verdicts["note"] != ""].itertuples():
            say(f"note: {row.stage}/{row.prefix}: {row.note}")
        say(judgement.outcome.message)
        for line in _family_lines(judgement):
            say(line)
        for line in bottleneck_lines(None, judgement.explanations):
            say(line)
        if judgement.outcome.reason:
            say(f"note: {judgement.outcome.reason}")
    if result.unjudged:
        say(f"run {manifest['run_id']} was stored unjudged: "
            f"{manifest.get('unjudged_reason') or 'no reason recorded'}")


def _family_lines(judgement) -> list[str]:
    """Each verdict family's flagged rows in words (its manifest part's ``flagged``),
    failing the run or not: what ``check`` names besides the outcome's message."""
    from prefect_dask_profiling.regression.families import REGISTRY

    lines = []
    for family in REGISTRY:
        part = family.manifest(family.rows(judgement), judgement) or {}
        lines += [f"flagged ({family.name}): {text}" for text in part.get("flagged") or []]
    return lines


def accept_command(
    run_id: RunArgument,
    pipeline: PipelineOption = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Accept a run: its version's baseline restarts there (an intended change)."""
    from prefect_dask_profiling.regression import history

    run_store, pipeline = _store_and_run(store, pipeline, run_id)
    version = history.accept_run(run_store, pipeline, run_id)
    if as_json:
        emit_json({"pipeline": pipeline, "version": version, "accepted": run_id})
    else:
        say(f"accepted {run_id}: the baseline of {pipeline} {version} restarts there")
