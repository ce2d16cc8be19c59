"""Per-stage Dask profiling, run history and regression verdicts for Prefect flows.

The functional API (usable without Prefect) follows the seed document's names::

    name = install(client)
    with stage("reduce"):
        result = cube.median("time").compute()
    record = collect(client, name)
    summarise(record), utilisation(record)
"""

from prefect_dask_profiling.plugin import TaskTimings, collect, install, uninstall
from prefect_dask_profiling.record import RunRecord
from prefect_dask_profiling.stage import stage
from prefect_dask_profiling.summary import summarise, utilisation

__all__ = ["RunRecord", "TaskTimings", "collect", "install", "stage", "summarise",
           "uninstall", "utilisation"]
__version__ = "0.1.0"
