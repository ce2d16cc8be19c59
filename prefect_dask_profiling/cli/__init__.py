"""The ``dask-profiling`` command line: a thin layer over store, history, regression, bench.

Exit codes and one-line errors: :mod:`._output`; the app and how command modules are
registered: :mod:`.application`. Every command takes ``--json``. Importing this package (and
``--help``) imports only Typer: each command imports what it needs when it runs."""

from prefect_dask_profiling.cli.application import app, main

__all__ = ["app", "main"]
