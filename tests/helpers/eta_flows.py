"""A two-stage profiled flow for the live ETA tests (tests/prefect/test_eta_flow.py).

Stage ``one`` is ``ONE_TASKS`` naps of ``one_s`` seconds, stage ``two`` ``TWO_TASKS`` naps of
``TWO_S``: sleeps, so a night's length hardly depends on the machine's load. While its
tasks run, the flow body watches its own progress artifact (what people see in the UI) and
its estimate in the run store (what ``dask-profiling eta`` lists) and, when asked, waits
(bounded) for one of its own ETA events to reach the server.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx
from prefect import flow
from prefect_dask import get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled

ONE_TASKS, TWO_TASKS, TWO_S = 8, 4, 0.5
WAIT_S = 120.0  # the bound of every wait of the flow body


def nap(seconds: float, i: int) -> float:
    """One task holding a thread for ``seconds``."""
    time.sleep(seconds)
    return seconds


def progress_percent(flow_run_id: str) -> float | None:
    """The flow run's ETA progress artifact as the server has it now (``None``: none yet)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterType,
    )

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
            type=ArtifactFilterType(any_=["progress"])))
    return float(found[0].data) if found else None


def events_of(api_url: str, flow_run_id: str, name: str) -> list[dict]:
    """The server's events called ``name`` about the flow run."""
    response = httpx.post(f"{api_url}/events/filter", json={
        "filter": {"event": {"name": [name]},
                   "any_resource": {"id": [f"prefect.flow-run.{flow_run_id}"]}},
        "limit": 50}, timeout=10)
    response.raise_for_status()
    return response.json()["events"]


def stored_estimate(store_url: str, pipeline: str, flow_run_id: str) -> dict | None:
    """The run's estimate in the store now, as ``dask-profiling eta`` reads it."""
    from prefect_dask_profiling.store.runs import RunStore

    for found in RunStore(store_url).live_estimates(pipeline).values():
        if isinstance(found, dict) and found.get("flow_run_id") == flow_run_id:
            return found
    return None


def _watch(futures, flow_run_id: str, samples: list[float], expect: bool,
           live: list[dict], store_url: str, pipeline: str) -> None:
    """Sample the progress artifact (and, with ``store_url``, the stored estimate) until
    the stage's tasks are done; with ``expect``, at least one sample of each (waited for,
    bounded): a run's progress seen while it runs."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        percent = progress_percent(flow_run_id)
        if percent is not None:
            samples.append(percent)
        if store_url and not live:
            found = stored_estimate(store_url, pipeline, flow_run_id)
            if found is not None and found.get("stage") is not None:
                live.append(found)
        seen = bool(samples) and (bool(live) or not store_url)
        if (seen or not expect) and all(f.done() for f in futures):
            return
        time.sleep(0.2)


def _wait_for_event(api_url: str, flow_run_id: str, name: str) -> bool:
    from prefect.events.worker import EventsWorker

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        EventsWorker.drain_all(timeout=5)
        if events_of(api_url, flow_run_id, name):
            return True
        time.sleep(0.3)
    return False


def make_eta_flow(runner: ProfiledDaskTaskRunner, name: str):
    """The flow: returns the progress samples, the stored estimate seen in stage ``one``
    (with ``store_url``), whether the awaited event came, and when stage ``two`` ended (UTC,
    ISO)."""

    def body(one_s: float, api_url: str = "", await_event: str | None = None,
             expect_progress: bool = True, store_url: str = "") -> dict:
        from prefect.runtime import flow_run

        samples: list[float] = []
        live: list[dict] = []
        with get_dask_client() as client:
            with stage("one"):
                futures = client.map(nap, [one_s] * ONE_TASKS, range(ONE_TASKS), pure=False)
                _watch(futures, flow_run.id, samples, expect_progress, live, store_url, name)
                client.gather(futures)
            with stage("two"):
                futures = client.map(nap, [TWO_S] * TWO_TASKS, range(TWO_TASKS), pure=False)
                client.gather(futures)
                seen = (_wait_for_event(api_url, flow_run.id, await_event) if await_event
                        else None)
                percent = progress_percent(flow_run.id)
                samples += [] if percent is None else [percent]
        return {"samples": samples, "live": live[0] if live else None, "seen": seen,
                "two_ended": datetime.now(UTC).isoformat(), "flow_run_id": str(flow_run.id)}

    return flow(name=name, version="1", task_runner=runner)(profiled(body))
