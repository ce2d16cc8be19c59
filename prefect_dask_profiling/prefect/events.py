"""Prefect events for Automations: ``dask-profiling.regression.detected`` and ``...drift...``.

One event per verdict family with an event name whose rows fail the run: the flow run as
resource, the flow, deployment and each alert episode as related resources (role
``episode``, shared by every lifecycle event of the episode), the flagged prefixes and links
as payload (docs/alerts.md). Failing to emit one is a warning and never changes the run."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypedDict

import pandas as pd

from prefect_dask_profiling._util import json_clean
from prefect_dask_profiling.regression.families import REGISTRY

if TYPE_CHECKING:
    from prefect_dask_profiling.forecast.live import RiskNews
    from prefect_dask_profiling.run.pipeline import FinishResult
    from prefect_dask_profiling.store.manifest import RunContext

logger = logging.getLogger(__name__)

# Each verdict family names its own event (:attr:`~.families.Family.event`); these are the
# built-in families' names, kept for callers that match on them.
REGRESSION_EVENT = str(REGISTRY["time"].event)
DRIFT_EVENT = str(REGISTRY["drift"].event)
MEMORY_EVENT = str(REGISTRY["memory"].event)
REQUESTS_EVENT = str(REGISTRY["requests"].event)
MAX_PREFIXES = 50  # keeps the event far below the server's size limit
# Episode events other than "detected" (which is the run-level regression event above).
EPISODE_KINDS = ("suspected", "cleared", "resolved")
_RUN_EVENT_NAMESPACE = uuid.UUID("0b7c4a52-1d9e-5f3a-8c61-4e2d9a7f0c15")
# The related resource that names an alert episode on every event about it.
EPISODE_ROLE = "episode"
EPISODE_RESOURCE = "dask-profiling.episode."
PREFIX_FIELDS = ("stage", "prefix", "metric", "verdict", "ratio", "cumulative_ratio",
                 "baseline_s", "latest_s", "baseline", "latest", "headroom", "cause", "note",
                 "alert", "fails", "start_run", "start_started", "episode")


class FlaggedPrefix(TypedDict, total=False):
    """One flagged row of an event (:data:`PREFIX_FIELDS` that its verdict table has and
    that are not NaN): per-prefix verdicts carry seconds and ``cause``; memory, requests
    and cost verdicts a ``metric`` and plain figures; drift rows the night it started."""

    stage: str
    prefix: str
    metric: str
    verdict: str
    ratio: float
    cumulative_ratio: float
    baseline_s: float
    latest_s: float
    baseline: float
    latest: float | None
    headroom: float | None
    cause: str
    note: str
    alert: str
    fails: bool
    start_run: str | None
    start_started: str | None
    episode: str | None


class EventPayload(TypedDict):
    """The JSON payload of one detection event (:func:`event_payload`): the run, whether
    it fails the flow, how many rows were flagged (the first :data:`MAX_PREFIXES` listed),
    their alert episodes and the links to the reports and the trend page."""

    run_id: str
    pipeline: str
    version: str
    status: str
    fails: bool
    flagged: int
    episodes: list[str]
    prefixes: list[FlaggedPrefix]
    report_links: dict[str, str]
    trend_link: str | None
    location: str | None


def findings(result: FinishResult) -> dict[str, pd.DataFrame]:
    """The rows that fail the run, by event name, each with its ``episode`` id.

    Only what fails the run tonight is detected: a suspicion has its own episode event, an
    acknowledged episode is silent, and a chronic near-OOM is detected once per episode. A
    run that failed or is incomplete has no findings: by the judgement's own rule its
    flagged prefixes do not count (its times are partial), and its failure is reported by
    Prefect itself. An unjudged run has none either.
    """
    judgement = result.judgement
    if judgement is None or judgement.outcome.reason:
        return {}
    out: dict[str, pd.DataFrame] = {}
    for family in REGISTRY:  # each family with an event, in the registry's order
        rows = judgement.failing_rows(family.name) if family.event else None
        if rows is not None and not rows.empty:
            out[str(family.event)] = rows.assign(episode=[
                judgement.outcome.episode_of(*family.key(r))
                for r in rows.itertuples(index=False)])
    return out


def _fails_by_row(name: str) -> bool:
    """Whether the event ``name`` fails by its rows' ``fails`` column (drift) rather than
    on every row."""
    return any(f.fails_by_row for f in REGISTRY if f.event == name)


def event_payload(result: FinishResult, rows: pd.DataFrame, links: dict[str, str],
                  trend_link: str | None, fails: bool) -> EventPayload:
    """The JSON payload of one event (pure)."""
    prefixes: list[FlaggedPrefix] = []
    for record in rows.head(MAX_PREFIXES).to_dict("records"):
        entry = {k: record[k] for k in PREFIX_FIELDS if k in record}
        prefixes.append({k: v for k, v in entry.items()
                         if not (isinstance(v, float) and math.isnan(v))})
    episodes = list(result.judgement.outcome.episodes) if result.judgement is not None else []
    return json_clean({
        "run_id": result.run_id, "pipeline": result.pipeline, "version": result.version,
        "status": result.status, "fails": fails, "flagged": len(rows), "episodes": episodes,
        "prefixes": prefixes, "report_links": dict(links), "trend_link": trend_link,
        "location": result.location,
    })


def emit_detection_events(result: FinishResult, links: dict[str, str] | None = None,
                          trend_link: str | None = None, *, fail_on_regression: bool = False
                          ) -> tuple[list[Any], list[str]]:
    """Emit one event per kind of finding of ``result``; return (events, warnings).

    Parameters
    ----------
    result
        The finished run.
    links
        Report links by stage (presigned on S3).
    trend_link
        Link to the stored trend page.
    fail_on_regression
        Whether the caller fails the flow on a regression: the payload's ``fails`` is true
        only then and only when the run counts as regressed.

    Notes
    -----
    Needs the flow run id (``result.manifest["flow_run_id"]``); without one (a plain
    ``distributed.Client`` run) nothing is emitted. Never raises.
    """
    found = findings(result)
    episode_events = [e for e in (result.judgement.outcome.events if result.judgement
                                  is not None else ()) if e.kind in EPISODE_KINDS]
    if not found and not episode_events:
        return [], []
    flow_run_id = result.manifest.get("flow_run_id")
    if not flow_run_id:
        return [], ["no event emitted: the run has no Prefect flow run"]
    try:
        from prefect.events import emit_event

        resource, related = _resources(result, str(flow_run_id))
    except Exception as exc:
        return [], [f"no event emitted: {exc!r}"]
    events, warnings = [], []
    for name, rows in found.items():
        fails = fail_on_regression and result.regressed and (
            not _fails_by_row(name) or bool(rows.get("fails", pd.Series(dtype=bool)).any()))
        ids = [str(i) for i in dict.fromkeys(rows.get("episode", pd.Series(dtype=object)))
               if isinstance(i, str) and i]
        try:
            event = emit_event(name, resource=resource,
                               related=[*related, *episode_resources(ids)],
                               payload=event_payload(result, rows, links or {}, trend_link,
                                                     fails),
                               id=uuid.uuid5(_RUN_EVENT_NAMESPACE, f"{result.run_id}/{name}"))
        except Exception as exc:
            warnings.append(f"event {name} not emitted: {exc!r}")
            continue
        if event is None:
            warnings.append(f"event {name} not emitted: Prefect events are switched off")
        else:
            events.append(event)
    for alert in episode_events:  # stable ids: a retried run's events are deduplicated
        try:
            event = emit_event(alert.event, resource=resource,
                               related=[*related, *episode_resources(alert.episode.ids)],
                               payload=json_clean({**alert.to_json(), "pipeline":
                                                   result.pipeline, "version": result.version,
                                                   "episodes": list(alert.episode.ids)}),
                               id=uuid.UUID(alert.id))
        except Exception as exc:
            warnings.append(f"event {alert.event} not emitted: {exc!r}")
            continue
        if event is not None:
            events.append(event)
    return events, warnings


def emit_unjudged_event(result: FinishResult) -> tuple[list[Any], list[str]]:
    """Emit ``dask-profiling.judgement.unjudged`` when the gate has gone blind
    (:mod:`~prefect_dask_profiling.regression.blind`); return (events, warnings).

    The payload carries the run, the streak of unjudged nights, the cause and the command that
    shows it, so an Automation can page on a pipeline whose regressions can no longer fail it.
    One event per run (a stable id). Never raises.
    """
    from prefect_dask_profiling.regression.blind import UNJUDGED_EVENT

    unjudged = result.manifest.get("unjudged") or {}
    flow_run_id = result.manifest.get("flow_run_id")
    if result.status != "unjudged" or not unjudged.get("blind") or not flow_run_id:
        return [], []
    try:
        from prefect.events import emit_event

        resource, related = _resources(result, str(flow_run_id))
        event = emit_event(UNJUDGED_EVENT, resource=resource, related=related,
                           payload=json_clean({"run_id": result.run_id,
                                               "pipeline": result.pipeline,
                                               "version": result.version, **unjudged}),
                           id=uuid.uuid5(_RUN_EVENT_NAMESPACE,
                                         f"{result.run_id}/{UNJUDGED_EVENT}"))
    except Exception as exc:
        return [], [f"event {UNJUDGED_EVENT} not emitted: {exc!r}"]
    return ([event], []) if event is not None else ([], [
        f"event {UNJUDGED_EVENT} not emitted: Prefect events are switched off"])


def episode_resources(ids: Iterable[str]) -> list[dict[str, str]]:
    """The related resources naming alert episodes ``ids`` (role :data:`EPISODE_ROLE`):
    the one field every lifecycle event of an episode carries its id in."""
    return [{"prefect.resource.id": EPISODE_RESOURCE + ep_id,
             "prefect.resource.role": EPISODE_ROLE, "dask-profiling.episode": ep_id}
            for ep_id in ids]


def emit_eta_event(ctx: RunContext, news: RiskNews) -> Any:
    """Emit the live ETA's deadline news (``dask-profiling.run.at-risk``, ``...on-track``,
    ``...late``: :class:`~prefect_dask_profiling.forecast.live.RiskNews`) about the flow run
    of ``ctx``; the event (``None``: Prefect events are switched off).

    The flow run is the resource (as for the detection events); related: its flow (when
    the API answers: the event still names the run otherwise), the pipeline, its version,
    the stage behind (if any) and the deployment.
    """
    from prefect.events import emit_event

    resource = run_resource(str(ctx.flow_run_id), ctx.pipeline, ctx.version, ctx.run_id,
                            ctx.flow_run_name)
    related = []
    try:
        flow_id, flow_name, _ = run_identity(str(ctx.flow_run_id))
        related.append(flow_resource(flow_id, flow_name))
    except Exception:  # the API did not answer
        logger.debug("dask-profiling: flow of the run not read", exc_info=True)
    pipeline = f"dask-profiling.pipeline.{ctx.pipeline}"
    related += [{"prefect.resource.id": pipeline, "prefect.resource.role": "pipeline"},
                {"prefect.resource.id": f"{pipeline}.version.{ctx.version}",
                 "prefect.resource.role": "version"}]
    if news.stage is not None:
        related.append({"prefect.resource.id": f"{pipeline}.stage.{news.stage}",
                        "prefect.resource.role": "stage"})
    if ctx.deployment:
        related.append(deployment_resource(ctx.deployment))
    return emit_event(news.event, resource=resource, related=related,
                      payload=dict(news.payload), id=news.id)


def run_resource(flow_run_id: str, pipeline: str, version: str, run_id: str,
                 name: str | None = None) -> dict[str, str]:
    """The flow run as an event's resource, labelled with the pipeline, version and run id
    (``name``: the flow run's)."""
    resource = {"prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
                "dask-profiling.pipeline": pipeline,
                "dask-profiling.version": str(version),
                "dask-profiling.run-id": run_id}
    if name:
        resource["prefect.resource.name"] = str(name)
    return resource


def flow_resource(flow_id: str, name: str | None = None) -> dict[str, str]:
    """The flow as a related resource (role ``flow``)."""
    flow = {"prefect.resource.id": f"prefect.flow.{flow_id}", "prefect.resource.role": "flow"}
    if name:
        flow["prefect.resource.name"] = name
    return flow


def deployment_resource(deployment_id: str) -> dict[str, str]:
    """The deployment as a related resource (role ``deployment``)."""
    return {"prefect.resource.id": f"prefect.deployment.{deployment_id}",
            "prefect.resource.role": "deployment"}


def _resources(result: FinishResult, flow_run_id: str) -> tuple[dict, list[dict]]:
    """The flow run as the resource; its flow and deployment as related resources."""
    resource = run_resource(flow_run_id, result.pipeline, result.version, result.run_id,
                            result.manifest.get("flow_run_name"))
    flow_id, flow_name, deployment_id = run_identity(flow_run_id)
    related = []
    if flow_id:
        related.append(flow_resource(flow_id, flow_name))
    if deployment_id:
        related.append(deployment_resource(deployment_id))
    return resource, related


def run_identity(flow_run_id: str) -> tuple[str | None, str | None, str | None]:
    """(flow id, flow name, deployment id) of the flow run: from the context, else the API."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    run = ctx.flow_run if ctx is not None and ctx.flow_run is not None else None
    if run is None or str(run.id) != flow_run_id:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
    flow_name = ctx.flow.name if ctx is not None and ctx.flow is not None else None
    deployment = str(run.deployment_id) if run.deployment_id else None
    return str(run.flow_id), flow_name, deployment
