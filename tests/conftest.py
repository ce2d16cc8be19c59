"""Shared fixtures. Keep this small: helpers own their fixtures in their own modules."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from distributed import Client, LocalCluster
from prefect_server import PrefectServer, running_server, use_server
from tiers import mark_slow_by_fixture, starts_processes

# faults.report: the fault suite's figures line at the end of any run that included it
# (tests/faults); ndvi_fixtures: the nightly NDVI run history shared by two test files
pytest_plugins = ["faults.report", "ndvi_fixtures"]

# Prefect's home (its settings, a temporary server's SQLite database) is this process's own:
# a test never touches the user's ~/.prefect, and the processes of ``pytest -n`` never share
# one database. Set before anything imports Prefect; the ``prefect_server`` fixture points
# the session at its server's home instead.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-home-")
atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers (tests/tiers.py): a test whose fixtures start processes is ``slow``."""
    mark_slow_by_fixture(items)


@pytest.fixture(scope="session")
@starts_processes("a Prefect server")
def prefect_server(request: pytest.FixtureRequest) -> PrefectServer:
    """A real Prefect server for the session; this process points at it.

    It serves its UI only if a test of the session renders UI pages (``prefect_ui`` mark).
    """
    ui = any(item.get_closest_marker("prefect_ui") for item in request.session.items)
    with running_server(ui=ui) as server, use_server(server):
        yield server


@pytest.fixture(scope="session")
def inproc_client() -> Client:
    """An in-process LocalCluster (1 worker × 2 threads) for tests that only need a record.

    Not the default client: a session-long default would be picked up by every later
    ``DaskTaskRunner()`` without an address, and by every bare ``compute()``.
    """
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client
