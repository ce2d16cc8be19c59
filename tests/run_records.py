"""Real run records for tests of what happens after collection (finishing, store, drift).

One in-process LocalCluster per test session records a small staged job; tests reuse it.
"""

from __future__ import annotations

import dask.array as da
from distributed import Client

from prefect_dask_profiling import collect, install, stage, uninstall
from prefect_dask_profiling.summary import RunRecord


def record_stages(client: Client, sizes: dict[str, int]) -> RunRecord:
    """Run one small array job per stage (``{stage: n}`` for an n × 200 array) and collect it."""
    name = install(client)
    try:
        for stage_name, n in sizes.items():
            with client.as_current(), stage(stage_name):
                (da.ones((n, 200), chunks=(50, 50)) * 2).sum().compute()
        return collect(client, name)
    finally:
        uninstall(client, name)
