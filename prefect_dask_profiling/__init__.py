"""Per-stage Dask profiling, run history and regression verdicts for Prefect flows.

The functional API (usable without Prefect)::

    name = install(client)
    with stage("reduce"):
        result = cube.median("time").compute()
    record = collect(client, name)
    summarise(record), utilisation(record)

The Prefect task runner and helpers (``ProfiledDaskTaskRunner``, ``profiled``, ``finish``),
the Prefect-free end of a run (``finish_run``: store the record, then judge it) and the
checks (``detect_regressions``, ``detect_drift``) are reachable from here too. Every name is
imported on first use, so importing the package (as every ``dask-profiling`` command does)
imports none of Prefect, distributed, dask or pandas. The scheduler plugin itself
(``TaskTimings``) is an internal of :mod:`prefect_dask_profiling.timing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_dask_profiling import _util

# The Prefect-free names of _LAZY, for type checkers and the API docs (griffe). The Prefect
# ones are not imported here even so: tests/test_architecture.py counts every import, and
# docs/api.md documents them at their home, prefect_dask_profiling.prefect.runner.
if TYPE_CHECKING:
    from prefect_dask_profiling.regression.drift import detect_drift
    from prefect_dask_profiling.regression.verdict import RegressionDetected, detect_regressions
    from prefect_dask_profiling.run.pipeline import finish_run
    from prefect_dask_profiling.stages import stage
    from prefect_dask_profiling.summary import RunRecord, collect, summarise, utilisation
    from prefect_dask_profiling.timing import install, uninstall

_LAZY = {
    # dask and distributed are loaded on first use too: the command line needs neither
    "stage": "prefect_dask_profiling.stages",
    "install": "prefect_dask_profiling.timing",
    "uninstall": "prefect_dask_profiling.timing",
    # summary (pandas) is loaded on first use: Dask workers import this package to unpickle
    # the task runner around every Prefect task and need none of it
    "RunRecord": "prefect_dask_profiling.summary",
    "collect": "prefect_dask_profiling.summary",
    "summarise": "prefect_dask_profiling.summary",
    "utilisation": "prefect_dask_profiling.summary",
    "ProfiledDaskTaskRunner": "prefect_dask_profiling.prefect.runner",
    "ProfilingOptions": "prefect_dask_profiling.options",
    "profiled": "prefect_dask_profiling.prefect.runner",
    "finish": "prefect_dask_profiling.prefect.runner",
    "finish_run": "prefect_dask_profiling.run.pipeline",
    "detect_regressions": "prefect_dask_profiling.regression.verdict",
    "detect_drift": "prefect_dask_profiling.regression.drift",
    "RegressionDetected": "prefect_dask_profiling.regression.verdict",
}

# spelled out for linters and type checkers; tests/test_docs_examples.py checks it is exactly
# the eager names plus _LAZY, and that docs/api.md documents every one
__all__ = [
    "ProfiledDaskTaskRunner",
    "ProfilingOptions",
    "RegressionDetected",
    "RunRecord",
    "collect",
    "detect_drift",
    "detect_regressions",
    "finish",
    "finish_run",
    "install",
    "profiled",
    "stage",
    "summarise",
    "uninstall",
    "utilisation",
]
__version__ = "0.1.0"


# Served on first use (PEP 562). The package stays a plain types.ModuleType: cloudpickle
# writes a module by reference only when its type is exactly that, and a flow script run as
# ``python flow.py`` is ``__main__``, so its functions travel by value with every global they
# use, ``import prefect_dask_profiling as pdp`` among them. No submodule shares a name with a
# lazy name (the ``stage`` function lives in :mod:`~prefect_dask_profiling.stages`), so the
# import system setting a submodule attribute never hides one.
__getattr__, __dir__ = _util.lazy_exports(__name__, _LAZY)
