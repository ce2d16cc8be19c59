"""Task timing on the scheduler: the :class:`TaskTimings` plugin and its client API.

The plugin module imports nothing but the standard library and ``distributed`` (plus the
sketch, shipped with it by value): it runs inside a scheduler we do not own.
"""

from prefect_dask_profiling.timing.plugin import (
    DEFAULT_STAGE,
    RUN_ANNOTATION,
    STAGE_ANNOTATION,
    TaskTimings,
    install,
    snapshot,
    uninstall,
)

__all__ = ["DEFAULT_STAGE", "RUN_ANNOTATION", "STAGE_ANNOTATION", "TaskTimings", "install",
           "snapshot", "uninstall"]
