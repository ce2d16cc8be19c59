"""``python -m prefect_dask_profiling.cli``: the ``dask-profiling`` command."""

from prefect_dask_profiling.cli.application import main

main()
