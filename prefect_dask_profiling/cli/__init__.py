"""The ``dask-profiling`` command line: a thin layer over store, history, regression, bench.

Exit codes: 0 ok, 1 a verdict failed (regression, unjudged run, files still pending),
2 bad input (unknown store, run, pipeline, version, malformed arguments), 3 an unexpected
error (one line and a hint to report it; ``--debug`` shows the traceback), 4 the store could
not be used (unreachable, timed out, access denied; :mod:`._output` has the table). Every
command takes ``--json`` for machines. The app and how command modules are registered:
:mod:`.application`. Importing this package (and ``--help``) imports only Typer: each command
imports pandas, the store's filesystem and the judge when it runs.
"""

from prefect_dask_profiling.cli.application import app, main

__all__ = ["app", "main"]
