"""``dask-profiling eta``: what the live ETA of a pipeline's next run starts from.

Per stage the p50 / p90 of its duration over the time baseline (and from which nights), and
the whole run's range as the ETA computes it at the start. A run in progress keeps its live
ETA on its Prefect flow run (the progress artifact, the boundary log lines, the events): it
is not in the store until it ends, so this command shows the plan only.

The command body imports what it uses (the history brings pandas): ``--help`` imports none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, cast

import typer

from prefect_dask_profiling.cli._output import emit_json, say
from prefect_dask_profiling.cli._params import JsonOption, PipelineOption, StoreOption

if TYPE_CHECKING:
    from prefect_dask_profiling.regression.eta import HistoryStats, UnknownStage

IN_PROGRESS_NOTE = ("a run in progress is not in the store until it ends: its live ETA is "
                    "on its Prefect flow run (progress artifact, logs, events); this is the "
                    "plan it starts from")


class PlanStage(TypedDict):
    """One stage of the plan: its baseline nights, p50 / p90 seconds, windows and usual
    task count, and whether it has enough nights to be counted (``known``)."""

    stage: str
    nights: int
    p50_s: float
    p90_s: float
    windows: int
    usual_tasks: int
    known: bool


class PlanRun(TypedDict):
    """The whole run's ETA range at its start, and the stages it leaves out."""

    expected_s: float
    high_s: float
    unknown: list[UnknownStage]


class Plan(TypedDict):
    """``dask-profiling eta --json`` (:func:`plan_json`; the command adds ``store`` and
    ``note``): ``run`` is ``None`` and ``text`` says why until the plan is ready."""

    pipeline: str
    version: str
    nights: list[str]
    needed: int
    ready: bool
    stages: list[PlanStage]
    run: PlanRun | None
    naive_s: float | None
    text: str | None


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    from prefect_dask_profiling.cli._output import guarded

    app.command("eta")(guarded(eta_command))


def eta_command(
    pipeline: PipelineOption = None,
    version: str | None = typer.Option(None, "--version",
                                       help="Pipeline version (default: the newest run's)."),
    n_history: int | None = typer.Option(None, "--history", min=1,
                                         help="Baseline runs at most (default 8)."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Each stage's expected duration (p50, p90, from which nights) and the whole run's
    ETA range at its start, from the baseline the next run is judged against."""
    from prefect_dask_profiling.cli._params import existing_store
    from prefect_dask_profiling.regression import history

    run_store = existing_store(store)
    pipeline = history.resolve_pipeline(run_store, pipeline)
    stats = history.eta_plan(run_store, pipeline, version, n_history)
    plan = plan_json(stats)
    if as_json:
        emit_json({"store": run_store.url, **plan, "note": IN_PROGRESS_NOTE})
        return
    for line in plan_lines(stats, plan):
        say(line)


def plan_json(stats: HistoryStats) -> Plan:
    """The plan as JSON: per stage its figures, and the whole run's range at its start."""
    from datetime import UTC, datetime

    from prefect_dask_profiling.regression.eta import RunProgress, estimate

    eta = estimate(stats, RunProgress(now=datetime.now(UTC), elapsed_s=0.0))
    low, high = eta.remaining_low_s, eta.remaining_high_s  # set when the ETA is known
    return {
        "pipeline": stats.pipeline, "version": stats.version, "nights": list(stats.runs),
        "needed": stats.needed, "ready": stats.ready,
        "stages": [{"stage": s.name, "nights": s.nights, "p50_s": s.p50_s, "p90_s": s.p90_s,
                    "windows": s.windows, "usual_tasks": s.usual_tasks,
                    "known": s.nights >= stats.needed} for s in stats.stages],
        "run": None if not eta.known or low is None or high is None else {
            "expected_s": low, "high_s": high,
            "unknown": [{"stage": s, "reason": r} for s, r in eta.unknown]},
        "naive_s": stats.total_p50_s, "text": eta.text if not eta.known else None}


def plan_lines(stats: HistoryStats, plan: Plan) -> list[str]:
    """The human form of :func:`plan_json`."""
    head = f"{stats.pipeline} {stats.version}: ETA plan from {len(stats.runs)} baseline night"
    head += "s" * (len(stats.runs) != 1)
    if stats.runs:
        head += f" ({stats.runs[0]} .. {stats.runs[-1]})"
    lines = [head]
    if not stats.ready:
        return [*lines, cast(str, plan["text"]), f"note: {IN_PROGRESS_NOTE}"]  # why not
    width = max(len(s.name) for s in stats.stages)
    lines.append(f"  {'stage':<{width}}  {'p50':>9}  {'p90':>9}  nights  tasks")
    for s in stats.stages:
        known = "" if s.nights >= stats.needed else \
            f"  unknown: too little history ({s.nights} of {stats.needed} nights)"
        lines.append(f"  {s.name:<{width}}  {_duration(s.p50_s):>9}  {_duration(s.p90_s):>9}"
                     f"  {s.nights:>6}  {s.usual_tasks:>5}{known}")
    run = cast("PlanRun", plan["run"])  # ready: the ETA is known
    lines.append(f"whole run: {_duration(run['expected_s'])} expected, up to "
                 f"{_duration(run['high_s'])} (stages' p90 spreads added in quadrature); "
                 f"the median night took {_duration(stats.total_p50_s or 0.0)}")
    for unknown in run["unknown"]:
        lines.append(f"  not counting stage `{unknown['stage']}`: {unknown['reason']}")
    lines.append(f"note: {IN_PROGRESS_NOTE}")
    return lines


def _duration(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``12.3s``."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"
