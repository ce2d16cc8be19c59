"""Shared fixtures. Keep this small: helpers own their fixtures in their own modules."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from distributed import Client, LocalCluster
from helpers.prefect_server import PrefectServer, running_server, use_server
from helpers.tiers import mark_slow_by_fixture, starts_processes

# faults.report: the fault suite's figures line at the end of any run that included it
# (tests/faults); ndvi_fixtures: the nightly NDVI run history shared by two test files
pytest_plugins = ["faults.report", "helpers.ndvi_fixtures"]

# Prefect's home (its settings, a temporary server's SQLite database) is this process's own:
# a test never touches the user's ~/.prefect, and the processes of ``pytest -n`` never share
# one database. Set before anything imports Prefect; the ``prefect_server`` fixture points
# the session at its server's home instead.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-home-")
atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)


# Test files that share an expensive session fixture run in one pytest-xdist process (one
# scope of ``--dist loadfile``), so the fixture is set up once, not once per process: the
# nightly NDVI history (four flow runs on a Prefect server) and the fault suite's cluster.
SHARED_SESSION_FIXTURES = {
    "tests/flows/test_nightly_flow.py": "ndvi_history",
    "tests/flows/test_raster_flow.py": "ndvi_history",
    "tests/prefect/test_ui.py": "ndvi_history",
    "tests/faults/test_cluster_faults.py": "shared_cluster",
    "tests/faults/test_prefect_api_faults.py": "shared_cluster",
    "tests/faults/test_security.py": "shared_cluster",
    "tests/faults/test_store_faults.py": "shared_cluster",
}


# The scopes that take longest, longest first (each 40-280 s of wall beside a 2-process CPU
# hog, `make test` on 2 cores, tests/helpers/timeline.py's summary of 5 December 2026): they are
# handed out before the others (longest processing time first), so none of them starts last
# and runs alone while the other processes have finished; the files under ~40 s fill in.
RUN_FIRST = (
    "ndvi_history",
    "tests/bench/test_bench.py",
    "shared_cluster",
    "tests/summary/test_memory.py",
    "tests/bench/test_bench_holdout.py",
    "tests/regression/test_history_defects.py",
    "tests/flows/test_raster_netns.py",
    "tests/timing/test_storage_requests.py",
    "tests/regression/test_history_simulation.py",
    "tests/timing/test_plugin.py",
    "tests/diagnosis/test_stage_workloads.py",
    "tests/prefect/test_runner.py",
    "tests/bench/test_bench_netns.py",
    "tests/prefect/test_stage_reports.py",
    "tests/test_docs_examples.py",
    "tests/faults/test_ack_store_faults.py",
    "tests/flows/test_deployment.py",
    "tests/flows/test_user_scripts.py",
    "tests/prefect/test_eta_flow.py",
    "tests/prefect/test_cost_flow.py",
    "tests/faults/test_final_write_faults.py",
    "tests/prefect/test_verdicts.py",
    "tests/store/test_store.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with the files of :data:`SHARED_SESSION_FIXTURES` in one scope,
    and the scopes of :data:`RUN_FIRST` handed out first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_SESSION_FIXTURES.get(path, path)

        def _assign_work_unit(self, node) -> None:
            def rank(scope: str) -> int:
                return RUN_FIRST.index(scope) if scope in RUN_FIRST else len(RUN_FIRST)

            self.workqueue.move_to_end(min(self.workqueue, key=rank), last=False)
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers (tests/helpers/tiers.py): a test whose fixtures start processes is ``slow``; a
    test file that uses a shared session fixture must be listed with it."""
    mark_slow_by_fixture(items)
    shared = set(SHARED_SESSION_FIXTURES.values())
    for scope in RUN_FIRST:  # a renamed file would silently lose its place
        if scope not in shared and not (config.rootpath / scope).is_file():
            raise pytest.UsageError(f"RUN_FIRST (tests/conftest.py) names {scope!r}, which is "
                                    "neither a test file nor a shared session fixture")
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for name in shared.intersection(getattr(item, "fixturenames", ())):
            if SHARED_SESSION_FIXTURES.get(path) != name:
                raise pytest.UsageError(f"{path} uses the session fixture {name!r}: list it "
                                        "in SHARED_SESSION_FIXTURES (tests/conftest.py)")


@pytest.fixture(scope="session")
@starts_processes("a Prefect server")
def prefect_server(request: pytest.FixtureRequest) -> PrefectServer:
    """A real Prefect server for the session; this process points at it.

    It serves its UI only if a test of the session renders UI pages (``prefect_ui`` mark).
    """
    ui = any(item.get_closest_marker("prefect_ui") for item in request.session.items)
    with running_server(ui=ui) as server, use_server(server):
        yield server


@pytest.fixture(scope="module")
def inproc_client() -> Client:
    """An in-process LocalCluster (1 worker × 2 threads) for tests that only need a record.

    One per test file: an idle in-process cluster's periodic callbacks burn 0.035-0.06 of a
    core in this process (measured 5 December 2026), ~40 CPU-s over a session's remaining
    quarter hour, where starting and stopping one costs 0.04 CPU-s once Dask is imported.
    Not the default client: a default would be picked up by every later
    ``DaskTaskRunner()`` without an address, and by every bare ``compute()``.
    """
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client
