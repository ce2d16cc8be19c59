"""Per-stage Dask profiling, run history and regression verdicts for Prefect flows.

The functional API (usable without Prefect)::

    name = install(client)
    with stage("reduce"):
        result = cube.median("time").compute()
    record = collect(client, name)
    summarise(record), utilisation(record)

The Prefect task runner and helpers (``ProfiledDaskTaskRunner``, ``profiled``, ``finish``),
the Prefect-free end of a run (``finish_run``: store the record, then judge it) and the
checks (``detect_regressions``, ``detect_drift``) are reachable from here too, imported on
first use so that importing the package does not import Prefect (nor pandas). The scheduler
plugin itself (``TaskTimings``) is an internal of :mod:`prefect_dask_profiling.timing`.
"""

from __future__ import annotations

import importlib
from typing import Any

from prefect_dask_profiling.stage import stage
from prefect_dask_profiling.timing import install, uninstall

_LAZY = {
    # summary (pandas) is loaded on first use: Dask workers import this package to unpickle
    # the task runner around every Prefect task and need none of it
    "RunRecord": "prefect_dask_profiling.summary",
    "collect": "prefect_dask_profiling.summary",
    "summarise": "prefect_dask_profiling.summary",
    "utilisation": "prefect_dask_profiling.summary",
    "ProfiledDaskTaskRunner": "prefect_dask_profiling.prefect.runner",
    "ProfilingOptions": "prefect_dask_profiling.prefect.runner",
    "profiled": "prefect_dask_profiling.prefect.runner",
    "finish": "prefect_dask_profiling.prefect.runner",
    "finish_run": "prefect_dask_profiling.finishing",
    "detect_regressions": "prefect_dask_profiling.regression.verdict",
    "detect_drift": "prefect_dask_profiling.regression.drift",
    "RegressionDetected": "prefect_dask_profiling.regression.verdict",
}

__all__ = ["install", "stage", "uninstall", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prefect_dask_profiling' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
