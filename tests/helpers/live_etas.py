"""A run's live ETA without a cluster (tests/prefect/test_eta_*.py, tests/store): its
options and identity given, its news told to a real publisher, no task counts read."""

from __future__ import annotations

from prefect_dask_profiling.prefect.publish import Publisher
from prefect_dask_profiling.prefect.runner import ProfilingOptions
from prefect_dask_profiling.run.live_eta import LiveEta
from prefect_dask_profiling.store.manifest import RunContext


def live_eta(options: ProfilingOptions, ctx: RunContext) -> LiveEta:
    """The live ETA of the run ``ctx`` with ``options``, telling its news to a publisher."""
    return LiveEta(ctx, lambda: options, Publisher(ctx, lambda: None,
                                                   options.report_retention_days))
