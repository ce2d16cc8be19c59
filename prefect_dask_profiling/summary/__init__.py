"""One run's record (:class:`RunRecord`) and the tables made from it (summary, utilisation)."""

from prefect_dask_profiling.summary.collect import collect
from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.summary.tables import summarise, utilisation

__all__ = ["RunRecord", "collect", "summarise", "utilisation"]
