"""Shared fixtures. Keep this small: helpers own their fixtures in their own modules."""

from __future__ import annotations

import pytest
from prefect_server import PrefectServer, running_server, use_server

# faults.report: the fault suite's figures line at the end of any run that included it
# (tests/faults); ndvi_fixtures: the nightly NDVI run history shared by two test files
pytest_plugins = ["faults.report", "ndvi_fixtures"]


@pytest.fixture(scope="session")
def prefect_server() -> PrefectServer:
    """A real Prefect server (with UI) for the session; this process points at it."""
    with running_server() as server, use_server(server):
        yield server

