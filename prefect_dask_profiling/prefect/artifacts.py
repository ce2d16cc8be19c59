"""Prefect artifacts for a finished run: where users look, in the Prefect UI.

Created in the flow run, keys lowercase with dashes derived from the pipeline name:
``<pipeline>-summary`` (table), ``<pipeline>-run`` (markdown), ``<pipeline>-regression``
(table, also when everything is ok) and ``<pipeline>-report-<stage>`` (link per stage).
Values are JSON-clean (no NaN/inf, no numpy scalars). A failure to create an artifact is
a warning: the summaries are already stored by then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from prefect_dask_profiling._util import artifact_key, json_clean

if TYPE_CHECKING:
    from prefect_dask_profiling.finishing import FinishResult

SUMMARY_ARTIFACT_COLUMNS = ["stage", "prefix", "tasks", "total_s", "p50_s", "p95_s", "gb_out",
                            "share"]
VERDICT_ARTIFACT_COLUMNS = ["stage", "prefix", "verdict", "cause", "baseline_s", "latest_s",
                            "ratio", "robust_z", "tasks_ratio", "share", "n_history"]


def table_rows(frame: pd.DataFrame, columns: list[str], digits: int = 4) -> list[dict[str, Any]]:
    """JSON-clean rows of ``frame`` restricted to the ``columns`` it has."""
    present = [c for c in columns if c in frame.columns]
    rounded = frame[present].copy()
    for col in present:
        if rounded[col].dtype.kind == "f":
            rounded[col] = rounded[col].round(digits)
    return json_clean(rounded.to_dict("records"))


def _fmt(value: Any, pattern: str = "{:.2f}") -> str:
    clean = json_clean(value)
    return "n/a" if clean is None else pattern.format(clean)


def run_markdown(result: FinishResult, links: dict[str, str], trend: str | None) -> str:
    """The run's markdown: wall, workers, utilisation per stage, warnings, environment, links."""
    m = result.manifest
    lines = [f"# {result.pipeline} · run `{result.run_id}`", "",
             f"- version: `{result.version}`, state: **{m['state']}**, status: **{m['status']}**",
             f"- wall: {_fmt(m['wall_s'], '{:.1f}')} s, workers: {m['workers']}, "
             f"threads: {m['threads']}",
             f"- baseline: {m['baseline'].get('note') or ''} "
             f"({len(m['baseline'].get('runs') or [])} runs)",
             *([f"- **not judged**: {m['unjudged_reason']}"] if m.get("unjudged_reason") else []),
             "",
             "## Utilisation (task seconds ÷ thread-seconds available)", "",
             "| scope | utilisation | wall s | task s | reading |", "|---|---|---|---|---|"]
    for scope, row in result.utilisation.iterrows():
        lines.append(f"| {scope} | {_fmt(row['utilisation'])} | {_fmt(row['wall_s'])} | "
                     f"{_fmt(row['task_s'])} | {row['reading']} |")
    lines += ["", "## Stages", "", "| stage | tasks | task s | report |", "|---|---|---|---|"]
    for s in m["stages"]:
        link = links.get(s["name"])
        report = f"[report]({link})" if link else (s.get("note") or "")
        lines.append(f"| {s['name']} | {s['tasks']} | {_fmt(s['task_s'])} | {report} |")
    if trend:
        lines += ["", f"Trend of total seconds per prefix: `{trend}`"]
    if result.location:
        lines += ["", f"Stored at `{result.location}`"]
    if m["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in m["warnings"]]
    env = m.get("environment") or {}
    lines += ["", "## Environment", "", ", ".join(
        f"{k} {v}" for k, v in env.items() if k != "mismatches" and v)]
    if env.get("mismatches"):
        lines += ["", "Version mismatches:"] + [f"- {x}" for x in env["mismatches"]]
    return "\n".join(lines) + "\n"


def publish(result: FinishResult, links: dict[str, str],
            trend_location: str | None = None) -> list[str]:
    """Create the run's artifacts in the current flow run; return warnings, never raise."""
    import httpx
    from prefect.artifacts import (
        create_link_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    key = artifact_key(result.pipeline)
    jobs = [
        lambda: create_table_artifact(
            table_rows(result.summary, SUMMARY_ARTIFACT_COLUMNS), key=f"{key}-summary",
            description=f"Per-prefix task summary of run {result.run_id}"),
        lambda: create_markdown_artifact(
            run_markdown(result, links, trend_location), key=f"{key}-run",
            description=f"Utilisation, stages and reports of run {result.run_id}"),
        lambda: create_table_artifact(
            table_rows(result.verdicts, VERDICT_ARTIFACT_COLUMNS), key=f"{key}-regression",
            description=f"Regression check of run {result.run_id}"),
    ]
    for stage_name, link in links.items():
        jobs.append(lambda s=stage_name, u=link: create_link_artifact(
            u, link_text=f"{result.pipeline} {s} report", key=artifact_key(key, "report", s),
            description=f"Dask performance report of stage {s}, run {result.run_id}"))
    warnings = []
    # The run's client retries a lost API for about a minute per request; artifacts are
    # not worth that: one retry, and after a transport failure the rest are skipped.
    retries = min(PREFECT_CLIENT_MAX_RETRIES.value(), 1)
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: retries}):
        for n, job in enumerate(jobs):
            try:
                job()
            except Exception as exc:
                warnings.append(f"artifact not created: {exc!r}")
                if isinstance(exc, httpx.TransportError):
                    warnings.append(f"{len(jobs) - n - 1} more artifact(s) not created: the "
                                    "Prefect API did not answer")
                    break
    return warnings
