"""Prefect artifacts for a finished run: where users look, in the Prefect UI.

Created in the flow run, keys lowercase with dashes derived from the pipeline name:
``<pipeline>-summary`` (table), ``<pipeline>-run`` (markdown), ``<pipeline>-regression``
(table, also when everything is ok), ``<pipeline>-report-<stage>`` (link per stage) and
``<pipeline>-trend`` (link to the stored trend page, presigned on S3; a run draws it
every night with ``stage_reports=True``, otherwise only on a night that flags).
Values are JSON-clean (no NaN/inf, no numpy scalars). A failure to create an artifact is
a warning: the reports are stored before their links are posted, the summaries before the
run's other artifacts. This module builds and sends them; *when* a run posts what is the
:class:`~prefect_dask_profiling.prefect.publish.Publisher`'s (the one place that posts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pandas as pd

from prefect_dask_profiling._util import artifact_key, json_clean
from prefect_dask_profiling.cost.allocation import allocation_markdown
from prefect_dask_profiling.regression.families import REGISTRY
from prefect_dask_profiling.summary.io import io_text, raster_text
from prefect_dask_profiling.summary.memory import describe_incident, memory_cells

if TYPE_CHECKING:
    from prefect_dask_profiling.run.pipeline import FinishResult
    from prefect_dask_profiling.store.manifest import Manifest

SUMMARY_ARTIFACT_COLUMNS = ["stage", "prefix", "tasks", "errors", "total_s", "p50_s", "p95_s",
                            "gb_out", "share"]
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


def _blind_lines(m: Manifest) -> list[str]:
    """The line that says the gate is blind (``regression.blind``), at the top of the run."""
    unjudged = m.get("unjudged") or {}
    if not unjudged.get("blind"):
        return []
    return [f"- **⚠ the regression gate is blind**: {unjudged['streak']} nights in a row "
            f"unjudged, so no regression can fail this pipeline; run `{unjudged['fix']}`"]


def _fmt(value: Any, pattern: str = "{:.2f}") -> str:
    clean = json_clean(value)
    return "n/a" if clean is None else pattern.format(clean)


def run_markdown(result: FinishResult, links: dict[str, str], trend: str | None,
                 eta: list[str] | tuple[str, ...] = ()) -> str:
    """The run's markdown: wall, workers, utilisation per stage, warnings, environment, links;
    ``eta``: the live ETA's lines
    (:meth:`~prefect_dask_profiling.forecast.live.LiveForecast.markdown_lines`)."""
    m = result.manifest
    lines = [f"# {result.pipeline} · run `{result.run_id}`", "",
             f"- version: `{result.version}`, state: **{m['state']}**, status: **{m['status']}**",
             f"- wall: {_fmt(m['wall_s'], '{:.1f}')} s, workers: {m['workers']}, "
             f"threads: {m['threads']}",
             f"- baseline: {m['baseline'].get('note') or ''} "
             f"({len(m['baseline'].get('runs') or [])} runs)",
             *([f"- **not judged**: {m['unjudged_reason']}"] if m.get("unjudged_reason") else []),
             *_blind_lines(m),
             *eta,
             "",
             "## Utilisation (task seconds ÷ thread-seconds available)", "",
             "| scope | utilisation | wall s | task s | reading |", "|---|---|---|---|---|"]
    for scope, row in result.utilisation.iterrows():
        lines.append(f"| {scope} | {_fmt(row['utilisation'])} | {_fmt(row['wall_s'])} | "
                     f"{_fmt(row['task_s'])} | {row['reading']} |")
    lines += ["", "## Stages", "",
              "| stage | tasks | task s | peak memory | headroom | spilled | bottleneck | "
              "evidence | report |", "|---|---|---|---|---|---|---|---|---|"]
    for s in m["stages"]:
        link = links.get(s["name"])
        report = f"[report]({link})" if link else (s.get("note") or "")
        verdict, evidence = _bottleneck(s.get("diagnosis"))
        peak, headroom, spilled = memory_cells(s.get("memory"))
        lines.append(f"| {s['name']} | {s['tasks']} | {_fmt(s['task_s'])} | {peak} | "
                     f"{headroom} | {spilled} | {verdict} | {evidence} | {report} |")
    allocated = allocation_markdown(m.get("allocation"))
    if allocated:
        lines += ["", "## What the cluster allocated (busy = task compute seconds)", "",
                  *allocated]
    if m.get("incidents"):
        lines += ["", "## Worker deaths", ""] + [f"- {describe_incident(i)}"
                                                 for i in m["incidents"]]
    local = [s for s in m["stages"] if s.get("local_work")]
    if local:
        lines += ["", "## Work the profile did not see", ""]
        lines += [f"- {s.get('note') or s['name']}" for s in local]
    storage = [(s["name"], io_text(s.get("io")), (s.get("chunks_vs_blocks") or {}))
               for s in m["stages"] if io_text(s.get("io"))]
    if storage:
        lines += ["", "## Storage requests per stage", "",
                  "| stage | requests | chunks against blocks |", "|---|---|---|"]
        lines += [f"| {name} | {text} | {align.get('text', '')} |"
                  for name, text, align in storage]
    for stage, why in (m.get("explanations") or {}).items():
        lines += ["", f"**Why {stage} regressed:** {why.get('text', '')}"]
    for family in REGISTRY:  # each verdict family's lines: idle, flagged prefixes...
        said = family.markdown(m.get(family.name) or {}, result.judgement)
        if said:
            lines += ["", *said]
    if trend:
        lines += ["", f"[Trend of total seconds per prefix]({trend})"
                  if "://" in trend else f"Trend of total seconds per prefix: `{trend}`"]
    if result.location:
        lines += ["", f"Stored at `{result.location}`"]
    if m["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in m["warnings"]]
    env = m.get("environment") or {}
    lines += ["", "## Environment", "", ", ".join(
        f"{k} {v}" for k, v in env.items()
        if k not in ("mismatches", "mismatch_detail", "raster") and v)]
    if raster_text(env.get("raster")):
        lines += ["", f"Workers' raster stack: {raster_text(env.get('raster'))}"]
    mismatches = env.get("mismatch_detail") or env.get("mismatches")  # with worker addresses
    if mismatches:
        lines += ["", "Version mismatches:"] + [f"- {x}" for x in mismatches]
    return "\n".join(lines) + "\n"


def _bottleneck(diagnosis: Any) -> tuple[str, str]:
    """A stored stage diagnosis as (verdict, supporting evidence); blank for old runs."""
    from prefect_dask_profiling.diagnosis.stages import Diagnosis

    d = Diagnosis.from_dict(diagnosis)
    return ("", "") if d is None else (d.summary(), d.evidence())


def regression_rows(result: FinishResult) -> list[dict[str, Any]]:
    """The regression table's rows, each regressed stage's explanation in ``why``."""
    explanations = result.manifest.get("explanations") or {}
    frame = result.verdicts.copy()
    if "stage" in frame and "verdict" in frame:
        frame["why"] = [explanations.get(st, {}).get("text", "") if v == "regression" else ""
                        for st, v in zip(frame["stage"], frame["verdict"], strict=True)]
    return table_rows(frame, [*VERDICT_ARTIFACT_COLUMNS, "why"])


def report_link_artifacts(pipeline: str, run_id: str, links: dict[str, str]) -> list[Any]:
    """One link artifact per stage report (``<pipeline>-report-<stage>``)."""
    from prefect.artifacts import LinkArtifact

    key = artifact_key(pipeline)
    return [LinkArtifact(link=link, link_text=f"{pipeline} {stage_name} report",
                         key=artifact_key(key, "report", stage_name),
                         description=f"Dask performance report of stage {stage_name}, "
                                     f"run {run_id}")
            for stage_name, link in links.items()]


def summary_artifact(pipeline: str, run_id: str, summary: pd.DataFrame) -> Any:
    """The per-prefix summary table (``<pipeline>-summary``): known before the judgement,
    so it can be posted while the run is judged."""
    from prefect.artifacts import TableArtifact

    return TableArtifact(table=table_rows(summary, SUMMARY_ARTIFACT_COLUMNS),
                         key=f"{artifact_key(pipeline)}-summary",
                         description=f"Per-prefix task summary of run {run_id}")


def run_artifacts(result: FinishResult, links: dict[str, str],
                  trend_location: str | None = None, *, summary: bool = True,
                  eta: list[str] | tuple[str, ...] = ()) -> list[Any]:
    """The judged run's artifacts: summary table (unless ``summary=False``: posted
    already), run markdown (with the live ETA's lines ``eta``), regression table, trend."""
    from prefect.artifacts import LinkArtifact, MarkdownArtifact, TableArtifact

    key = artifact_key(result.pipeline)
    artifacts = [
        *([summary_artifact(result.pipeline, result.run_id, result.summary)] if summary
          else []),
        MarkdownArtifact(markdown=run_markdown(result, links, trend_location, eta),
                         key=f"{key}-run",
                         description=f"Utilisation, stages and reports of run {result.run_id}"),
        TableArtifact(table=regression_rows(result), key=f"{key}-regression",
                      description=f"Regression check of run {result.run_id}"),
    ]
    if trend_location:
        artifacts.append(LinkArtifact(
            link=trend_location, link_text=f"{result.pipeline} trend", key=f"{key}-trend",
            description=f"Total seconds per prefix over the baseline, run {result.run_id}"))
    return artifacts


def _requests(artifacts: list[Any]) -> list[Any]:
    """The API requests that create ``artifacts`` in the current flow (or task) run."""
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.utilities.context import get_task_and_flow_run_ids

    task_run_id, flow_run_id = get_task_and_flow_run_ids()
    return [ArtifactCreate(type=a.type, key=a.key, description=a.description,
                           task_run_id=task_run_id, flow_run_id=flow_run_id,
                           data=a.format(_sync=True))
            for a in artifacts]


def _create(requests: list[Any]) -> list[BaseException]:
    """Send ``requests``, one after the other, through the flow run's client; the failures.

    The run's client retries a lost API for about a minute per request; artifacts are not
    worth that: one retry, and a transport failure is reported once for the group.
    """
    if not requests:
        return []
    errors: list[BaseException] = []
    with _few_retries(), _run_client() as client:
        for request in requests:
            try:
                client.create_artifact(artifact=request)
            except Exception as exc:
                errors.append(exc)
    return errors


def create(artifacts: list[Any]) -> list[str]:
    """Create ``artifacts`` in the current flow run now, in this thread; the warnings of
    those not created, never raising (for a job already in the background service)."""
    return _post_warnings(_create(_requests(artifacts)))


@dataclass
class ArtifactJob:
    """Create artifacts in the flow run, from the background service: ``requests`` (their
    API requests, built in the caller's thread); the failures (:func:`_create`)."""

    requests: list[Any]
    label: ClassVar[str] = "artifacts"

    def run(self) -> list[BaseException]:
        return _create(self.requests)


class Posting:
    """Artifacts being created in the current flow run by the process's one background
    service (:mod:`~prefect_dask_profiling.run.background`).

    The Prefect API has no bulk endpoint for artifacts: each is one request. Started by
    :func:`post`, so a caller can go on with other work (the session posts the report
    links and the summary while the run is judged); :meth:`wait` waits for them and returns
    the warnings, never raising. The job runs in the caller's context (Prefect's settings,
    the API URL and the run context live in context variables).
    """

    def __init__(self, artifacts: list[Any]) -> None:
        from prefect_dask_profiling.run.background import Background

        requests = _requests(artifacts)
        self._future: Future[list[BaseException]] | None = None
        if requests:
            self._future = Background.instance().post(ArtifactJob(requests))

    def wait(self) -> list[str]:
        """Wait for every artifact; the warnings of those not created."""
        if self._future is None:
            return []
        try:
            errors = self._future.result()
        except Exception as exc:  # _create keeps its failures; a bug all the same
            errors = [exc]
        return _post_warnings(errors)


def post(artifacts: list[Any]) -> Posting:
    """Start creating ``artifacts`` in the current flow run (see :class:`Posting`). Not
    from a job of the background service: it would wait for itself (use :func:`create`)."""
    return Posting(artifacts)


def _post_warnings(failed: list[BaseException]) -> list[str]:
    import httpx

    if failed and all(isinstance(e, _NoClient) for e in failed):
        failed = [failed[0].__cause__ or failed[0]] * len(failed)
    lost = [e for e in failed if isinstance(e, httpx.TransportError)]
    warnings = [f"artifact not created: {exc!r}"
                for exc in failed if not isinstance(exc, httpx.TransportError)]
    if lost:
        warnings.append(f"artifact not created: {lost[0]!r}")
        warnings.append(f"{len(lost)} artifact(s) not created: the Prefect API did not answer")
    return warnings


class _NoClient(Exception):
    """The Prefect client could not be opened (its cause is the reason)."""


@contextlib.contextmanager
def _run_client() -> Iterator[Any]:
    """The flow run's own synchronous Prefect client, or a new one outside a sync flow run.

    Opening a client costs tens of milliseconds (settings, a version check); the flow run
    already holds one open. A client that cannot be opened yields one that raises
    :class:`_NoClient` on every call, so the caller reports the group's failure once.
    """
    from prefect.client.orchestration import SyncPrefectClient, get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is not None and isinstance(getattr(ctx, "client", None), SyncPrefectClient):
        yield ctx.client
        return
    try:
        client = get_client(sync_client=True)
        client.__enter__()
    except Exception as exc:
        yield _Unavailable(exc)
        return
    try:
        yield client
    finally:
        client.__exit__(None, None, None)


class _Unavailable:
    """Stands in for a client that could not be opened."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause

    def create_artifact(self, **_: Any) -> None:
        raise _NoClient(str(self.cause)) from self.cause


_FEW_RETRIES: dict[int, tuple[Any, Any]] = {}


@contextlib.contextmanager
def _few_retries() -> Iterator[None]:
    """Prefect's current settings with at most one client retry.

    ``temporary_settings`` builds and validates a new settings object on every call (about
    80 ms on a slow core); the derived object is kept per settings object instead (settings
    are immutable, and the original is kept alive with it so its id is not reused).
    """
    import prefect.context
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    context = prefect.context.get_settings_context()
    cached = _FEW_RETRIES.get(id(context.settings))
    if cached is None or cached[0] is not context.settings:
        retries = min(PREFECT_CLIENT_MAX_RETRIES.value(), 1)
        cached = (context.settings, context.settings.copy_with_update(
            updates={PREFECT_CLIENT_MAX_RETRIES: retries}))
        if len(_FEW_RETRIES) > 16:
            _FEW_RETRIES.clear()
        _FEW_RETRIES[id(context.settings)] = cached
    with prefect.context.SettingsContext(profile=context.profile, settings=cached[1]):
        yield
