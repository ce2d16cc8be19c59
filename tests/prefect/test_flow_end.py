"""How a profiled flow run ends, through a real Prefect server and a real cluster (issue 33,
defects 8, 9 and 10).

Each test seeds a store with three healthy nights in which ``compute/slow_block`` took a
tenth of a second, then runs a real flow whose ``compute`` stage takes 1.6 s: a regression.
What is checked is how the flow run ends — its final state, its hooks, Prefect's retries —
and what is stored for each attempt.
"""

from __future__ import annotations

from datetime import UTC, datetime

import dask.array as da
import pandas as pd
import pytest
from distributed import LocalCluster
from helpers.prefect_events import events_of_run
from helpers.profiled_flows import fails, slow_block, write_hook_file
from helpers.tiers import starts_processes
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.states import Completed, Failed
from prefect_dask import get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect import artifacts
from prefect_dask_profiling.prefect.events import REGRESSION_EVENT
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, finish, profiled
from prefect_dask_profiling.regression.verdict import RegressionDetected
from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, new_run_id

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(600)]

SLOW, FAST = 0.2, 0.0  # seconds per slow_block task; 8 tasks; the seeded nights took 0.1 s


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def seed(store: RunStore, pipeline: str, runs: int = 3) -> set[str]:
    """Healthy earlier nights in which ``compute/slow_block`` took a tenth of a second."""
    seeded = set()
    for second in range(runs):
        tasks = pd.DataFrame([{"stage": "compute", "prefix": "slow_block", "tasks": 8,
                               "total_s": 0.1, "p50_s": 0.0125, "p95_s": 0.0125,
                               "gb_out": 0.0}], columns=TASKS_COLUMNS)
        run_id = new_run_id(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC))  # in the past
        store.write_run(pipeline, run_id, {"tasks": tasks},
                        {"version": "1", "status": "healthy", "state": "COMPLETED"})
        seeded.add(run_id)
    return seeded


def make(runner: ProfiledDaskTaskRunner, name: str, attempts: list[int], *,
         retries: int = 0, ending: str = "profiled", raise_on: tuple[int, ...] = (),
         hook_file: str | None = None, returns: str = "value"):
    """A one-stage flow (``compute``: 8 ``slow_block`` tasks) that records its attempts.

    ``ending``: ``"profiled"`` (``@profiled``), ``"explicit"`` (``finish()`` as the last
    line) or ``"none"`` (neither: the runner's exit stores the run). ``raise_on``: the
    attempts on which the body raises after its stage (an infrastructure error).
    """

    def body(delay: float = SLOW, blocks: int = 8) -> float:
        from prefect.runtime import flow_run

        attempts.append(flow_run.run_count)
        with stage("compute"):
            with get_dask_client() as client:
                x = da.ones((blocks * 10, 10), chunks=(10, 10))
                y = client.persist(x.map_blocks(slow_block, delay, dtype=float))
                total = float(client.compute(y.sum()).result())
        if flow_run.run_count in raise_on:
            raise OSError(f"infrastructure hiccup on attempt {flow_run.run_count}")
        if ending == "explicit":
            finish()  # RegressionDetected propagates: the documented way
        return RETURNS[returns](total)

    fn = profiled(body) if ending == "profiled" else body
    return flow(name=name, version="1", task_runner=runner, retries=retries,
                retry_delay_seconds=0,
                on_failure=[write_hook_file(hook_file)] if hook_file else [])(fn)


# What a flow body may return, as users write it: Prefect derives the final state from it.
RETURNS = {
    "value": lambda total: total,
    "failed future": lambda total: fails.submit(f"failed after {total}"),
    "Failed state": lambda total: Failed(message=f"returned Failed after {total}"),
    "states, one failed": lambda total: [Completed(), fails.submit("one of two")],
}


def stored(store: RunStore, pipeline: str, seeded: set[str]) -> list[dict]:
    """The manifests of the runs the test's flow stored, oldest first."""
    runs = [r["run_id"] for r in store.list_runs(pipeline) if r["run_id"] not in seeded]
    return [store.read_manifest(pipeline, run_id) for run_id in sorted(runs)]


def server_run(state):
    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id)


def detected_events(api_url: str, run_id: str, wait_s: float = 60.0) -> list[dict]:
    """The ``regression.detected`` events naming ``run_id`` that reached the server."""
    return events_of_run(api_url, REGRESSION_EVENT, run_id, wait_s)


# -- defect 8: a failed flow is judged by its final state on every path ------------------------


def test_a_failed_flow_is_stored_failed_on_the_runner_exit_path(cluster, tmp_path,
                                                                 prefect_server):
    """No ``@profiled``, no ``finish()``: the flow regresses, then raises. Prefect catches
    the exception before the runner exits (``error`` is None there); the server's state
    ``FAILED`` decides: stored ``failed``, not ``regressed``, and no regression event."""
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "end-exit-path")
    runner = ProfiledDaskTaskRunner(address=cluster, store=store.url, stage_reports=False)
    attempts: list[int] = []
    state = make(runner, "end-exit-path", attempts, ending="none", raise_on=(1,))(
        return_state=True)
    assert state.is_failed() and "infrastructure hiccup" in state.message
    [manifest] = stored(store, "end-exit-path", seeded)
    assert (manifest["state"], manifest["status"], manifest["regressed"]) == (
        "FAILED", "failed", False)
    assert detected_events(prefect_server.api_url, manifest["run_id"]) == []


@pytest.mark.parametrize("returns", ["failed future", "Failed state", "states, one failed"])
def test_a_flow_failed_by_its_return_value_is_stored_failed_on_every_attempt(
        cluster, tmp_path, returns):
    """Issue 56, defect 3: ``@flow(retries=2)`` whose body returns what Prefect turns into
    ``Failed`` (a failed task's future, a hand-made ``Failed`` state, a list holding a failed
    future). Prefect retries it twice and ends it Failed; every attempt is stored ``failed``
    with state ``FAILED`` (on 5beef4d: ``healthy`` / ``COMPLETED``, entering baselines)."""
    pipeline = "end-returned-" + returns.replace(" ", "-").replace(",", "")
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, pipeline)
    runner = ProfiledDaskTaskRunner(address=cluster, store=store.url, stage_reports=False)
    attempts: list[int] = []
    state = make(runner, pipeline, attempts, retries=2, returns=returns)(
        delay=FAST, return_state=True)
    assert attempts == [1, 2, 3]
    assert state.is_failed(), state
    assert server_run(state).run_count == 3
    runs = stored(store, pipeline, seeded)
    assert [(m["attempt"], m["state"], m["status"], m["regressed"]) for m in runs] == [
        (attempt, "FAILED", "failed", False) for attempt in (1, 2, 3)]


# -- defect 9: nothing after the record can drop the failure ----------------------------------


def test_a_bug_while_publishing_never_drops_the_regression(cluster, tmp_path, monkeypatch,
                                                           caplog):
    """Building the run's artifacts raises (a bug in our code, injected): a warning says
    so, and the flow still ends Failed on the regression stored."""
    def broken(*args, **kwargs):
        raise TypeError("artifact bug for the test")

    monkeypatch.setattr(artifacts, "run_artifacts", broken)
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "end-publish-bug")
    runner = ProfiledDaskTaskRunner(address=cluster, store=store.url, stage_reports=False)
    state = make(runner, "end-publish-bug", [])(return_state=True)
    assert state.is_failed(), state.message
    assert "slow_block" in state.message
    with pytest.raises(RegressionDetected):
        state.result()
    [manifest] = stored(store, "end-publish-bug", seeded)
    assert manifest["status"] == "regressed"
    assert server_run(state).state.is_failed()
    assert any("artifact bug for the test" in r.getMessage() for r in caplog.records)


# -- defect 10: a regression ends the flow Failed without Prefect's retries -------------------


@pytest.mark.parametrize("ending", ["profiled", "explicit"])
def test_a_regression_with_flow_retries_runs_once(cluster, tmp_path, ending):
    """``@flow(retries=2)`` that regresses: one attempt, Failed, ``on_failure`` fired, one
    stored run (with ``@profiled``, and with ``finish()`` as the flow's last line)."""
    pipeline = f"end-retries-{ending}"
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, pipeline)
    runner = ProfiledDaskTaskRunner(address=cluster, store=store.url, stage_reports=False)
    hook_file = tmp_path / "hook.txt"
    attempts: list[int] = []
    state = make(runner, pipeline, attempts, retries=2, ending=ending,
                 hook_file=str(hook_file))(return_state=True)
    assert attempts == [1]
    assert state.is_failed() and "slow_block" in state.message
    with pytest.raises(RegressionDetected):
        state.result()
    assert hook_file.read_text().startswith("RegressionDetected")
    recorded = server_run(state)
    assert recorded.state.is_failed() and recorded.run_count == 1
    [manifest] = stored(store, pipeline, seeded)
    assert manifest["status"] == "regressed" and manifest["attempt"] == 1
    assert manifest["flow_run_id"] == str(state.state_details.flow_run_id)


def test_retry_on_regression_lets_prefect_retry(cluster, tmp_path):
    """``retry_on_regression=True``: each attempt regresses and is stored, attempt by
    attempt, under the same flow run; the last one ends Failed."""
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "end-retry-on")
    runner = ProfiledDaskTaskRunner(address=cluster, store=store.url, stage_reports=False,
                                    retry_on_regression=True)
    attempts: list[int] = []
    state = make(runner, "end-retry-on", attempts, retries=1)(return_state=True)
    assert attempts == [1, 2]
    assert state.is_failed() and "slow_block" in state.message
    runs = stored(store, "end-retry-on", seeded)
    assert [(m["attempt"], m["status"]) for m in runs] == [(1, "regressed"), (2, "regressed")]
    assert {m["flow_run_id"] for m in runs} == {str(state.state_details.flow_run_id)}


def test_an_infrastructure_retry_stores_each_attempt(cluster, tmp_path):
    """Attempt 1 raises (infrastructure), Prefect retries, attempt 2 completes: attempt 1
    is stored ``failed``, attempt 2 judged, each with its attempt number."""
    store = RunStore(str(tmp_path / "store"))
    seeded = seed(store, "end-infra-retry")
    runner = ProfiledDaskTaskRunner(address=cluster, store=store.url, stage_reports=False)
    attempts: list[int] = []
    state = make(runner, "end-infra-retry", attempts, retries=1, raise_on=(1,))(
        delay=FAST, return_state=True)
    assert attempts == [1, 2]
    assert state.is_completed(), state.message
    first, second = stored(store, "end-infra-retry", seeded)
    assert (first["attempt"], first["status"], first["regressed"]) == (1, "failed", False)
    assert second["attempt"] == 2 and second["status"] == "healthy", second["unjudged_reason"]
    assert first["flow_run_id"] == second["flow_run_id"] == str(
        state.state_details.flow_run_id)
