"""``dask-profiling eta``: what the live ETA of a pipeline's next run starts from (per stage
the p50 / p90 of its baseline nights, the whole run's range at its start), and the current
estimate of each run in progress with its age (docs/eta.md).

The command body imports what it uses (the history brings pandas): ``--help`` imports none."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, cast

import typer

from prefect_dask_profiling.cli._output import emit_json, say
from prefect_dask_profiling.cli._params import JsonOption, PipelineOption, StoreOption

if TYPE_CHECKING:
    from datetime import datetime

    from prefect_dask_profiling.forecast.live_store import LiveEstimate, UnknownStage
    from prefect_dask_profiling.forecast.model import HistoryStats
    from prefect_dask_profiling.store.runs import RunStore

IN_PROGRESS_NOTE = ("a run in progress stores its current estimate at each stage boundary "
                    "and every eta_interval (live/<pipeline>/<run_id>.json); its progress "
                    "artifact, logs and events are on its Prefect flow run")


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


class PlanOutside(TypedDict):
    """The time before the first stage or after the last (``part``: ``LEAD`` / ``TAIL`` of
    :mod:`~prefect_dask_profiling.forecast.model`) in :class:`Plan`."""

    part: str
    nights: int
    p50_s: float
    p90_s: float
    known: bool


class Plan(TypedDict):
    """``dask-profiling eta --json`` (:func:`plan_json`; the command adds ``store`` and
    ``note``): ``run`` is ``None`` and ``text`` says why until the plan is ready."""

    pipeline: str
    version: str
    nights: list[str]
    needed: int
    ready: bool
    stages: list[PlanStage]
    outside: list[PlanOutside]
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
    from prefect_dask_profiling.errors import StoreError
    from prefect_dask_profiling.regression import history

    run_store = existing_store(store)
    try:
        pipeline = history.resolve_pipeline(run_store, pipeline)
    except StoreError:  # a first night in progress: no stored run yet, but its estimate
        running = in_progress(run_store, pipeline) if pipeline is not None else []
        if not running or running[0]["run_id"] is None:
            raise
        if as_json:
            emit_json({"store": run_store.url, "pipeline": pipeline, "stages": [],
                       "in_progress": running, "note": IN_PROGRESS_NOTE})
            return
        for line in [f"{pipeline}: no stored run yet (no ETA plan)",
                     *in_progress_lines(running)]:
            say(line)
        return
    stats = history.eta_plan(run_store, pipeline, version, n_history)
    plan = plan_json(stats)
    running = in_progress(run_store, pipeline)
    if as_json:
        emit_json({"store": run_store.url, **plan, "in_progress": running,
                   "note": IN_PROGRESS_NOTE})
        return
    for line in [*plan_lines(stats, plan), *in_progress_lines(running)]:
        say(line)


class InProgress(TypedDict, total=False):
    """One run in progress as the command shows it: its stored ``estimate``, its age and
    whether it is ``stale``; or the ``error`` reading it (``run_id`` None: the listing)."""

    run_id: str | None
    error: str
    age_s: float
    stale: bool
    estimate: LiveEstimate


def in_progress(run_store: RunStore, pipeline: str, now: datetime | None = None
                ) -> list[InProgress]:
    """The runs in progress of ``pipeline``, oldest first: per run its stored estimate, its
    age (``age_s``) and whether it is ``stale``; or the ``error`` reading it (one line).
    A store whose estimates cannot be listed gives one entry, ``run_id`` None, saying why."""
    from datetime import UTC, datetime

    from prefect_dask_profiling.errors import StoreError
    from prefect_dask_profiling.forecast.live_store import estimate_age, is_stale

    now = now or datetime.now(UTC)
    try:
        stored = run_store.live_estimates(pipeline)
    except StoreError as exc:  # the plan is still worth printing
        return [{"run_id": None, "error": " ".join(str(exc).split())}]
    out: list[InProgress] = []
    for run_id, found in stored.items():
        if isinstance(found, StoreError):
            out.append({"run_id": run_id, "error": " ".join(str(found).split())})
            continue
        age = estimate_age(found, now)
        if age is None:
            out.append({"run_id": run_id, "error": f"computed_at "
                        f"{found['computed_at']!r} is not an ISO 8601 time with a zone"})
            continue
        out.append({"run_id": run_id, "age_s": round(age, 1),
                    "stale": bool(is_stale(found, now)), "estimate": found})
    return out


def in_progress_lines(running: list[InProgress]) -> list[str]:
    """The human form of :func:`in_progress`."""
    if not running:
        return ["runs in progress: none stored"]
    if running[0]["run_id"] is None:
        return [f"runs in progress: not read: {running[0]['error']}"]
    lines = [f"runs in progress: {len(running)}"]
    for run in running:
        if "error" in run:
            lines.append(f"  {run['run_id']}: unreadable estimate: {run['error']}")
            continue
        est = run["estimate"]
        where = f"stage {est['stage']} running" if est.get("stage") else "between stages"
        if est.get("done_fraction") is not None:
            where += f", {100 * est['done_fraction']:.0f} % done"
        line = f"  {run['run_id']}: {where}; {est.get('text') or 'no estimate'}"
        if est.get("deadline"):
            line += f"; deadline {est['deadline']}"
            line += f" ({est['risk']})" if est.get("risk") else ""
        line += f"; computed {_duration(max(run['age_s'], 0.0))} ago"
        if run["stale"]:
            line += " (stale: not updated since; the run may have stopped without ending)"
        lines.append(line)
    return lines


def plan_json(stats: HistoryStats) -> Plan:
    """The plan as JSON: per stage its figures, and the whole run's range at its start."""
    from datetime import UTC, datetime

    from prefect_dask_profiling.forecast.model import RunProgress, estimate

    eta = estimate(stats, RunProgress(now=datetime.now(UTC), elapsed_s=0.0))
    low, high = eta.remaining_low_s, eta.remaining_high_s  # set when the ETA is known
    return {
        "pipeline": stats.pipeline, "version": stats.version, "nights": list(stats.runs),
        "needed": stats.needed, "ready": stats.ready,
        "stages": [{"stage": s.name, "nights": s.nights, "p50_s": s.p50_s, "p90_s": s.p90_s,
                    "windows": s.windows, "usual_tasks": s.usual_tasks,
                    "known": s.nights >= stats.needed} for s in stats.stages],
        "outside": [{"part": o.name, "nights": o.nights, "p50_s": o.p50_s, "p90_s": o.p90_s,
                     "known": o.nights >= stats.needed}
                    for o in (stats.lead, stats.tail) if o is not None],
        "run": None if not eta.known or low is None or high is None else {
            "expected_s": low, "high_s": high,
            "unknown": [{"stage": s, "reason": r} for s, r in eta.unknown]},
        "naive_s": stats.total_p50_s, "text": eta.text if not eta.known else None}


def plan_lines(stats: HistoryStats, plan: Plan) -> list[str]:
    """The human form of :func:`plan_json`."""
    from prefect_dask_profiling.forecast.model import unknown_text

    head = f"{stats.pipeline} {stats.version}: ETA plan from {len(stats.runs)} baseline night"
    head += "s" * (len(stats.runs) != 1)
    if stats.runs:
        head += f" ({stats.runs[0]} .. {stats.runs[-1]})"
    lines = [head]
    if not stats.ready:
        return [*lines, cast(str, plan["text"]), f"note: {IN_PROGRESS_NOTE}"]  # why not
    width = max(len(s.name) for s in (stats.lead, *stats.stages, stats.tail) if s is not None)
    lines.append(f"  {'stage':<{width}}  {'p50':>9}  {'p90':>9}  nights  tasks")
    rows = [o for o in (stats.lead, *stats.stages, stats.tail) if o is not None]
    for s in rows:
        known = "" if s.nights >= stats.needed else \
            f"  unknown: too little history ({s.nights} of {stats.needed} nights)"
        lines.append(f"  {s.name:<{width}}  {_duration(s.p50_s):>9}  {_duration(s.p90_s):>9}"
                     f"  {s.nights:>6}  {s.usual_tasks:>5}{known}")
    run = cast("PlanRun", plan["run"])  # ready: the ETA is known
    lines.append(f"whole run: {_duration(run['expected_s'])} expected, up to "
                 f"{_duration(run['high_s'])} (the parts' p90 spreads added in quadrature); "
                 f"the median night took {_duration(stats.total_p50_s or 0.0)}")
    for unknown in run["unknown"]:
        lines.append(f"  not counting {unknown_text(unknown['stage'], unknown['reason'])}")
    lines.append(f"note: {IN_PROGRESS_NOTE}")
    return lines


def _duration(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``12.3s``."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"
