"""The bench test files' cluster: each module that asks for ``remote`` starts its own."""

from __future__ import annotations

import pytest
from helpers.bench_fixtures import subprocess_cluster
from helpers.tiers import starts_processes


@pytest.fixture(scope="module")
@starts_processes("dask scheduler and worker processes")
def remote() -> str:
    """A real ``dask scheduler`` and two 1-thread ``dask worker`` processes on 127.0.0.1."""
    with subprocess_cluster(workers=2, nthreads=1) as address:
        yield address
