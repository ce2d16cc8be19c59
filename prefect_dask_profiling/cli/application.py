"""The ``dask-profiling`` application: one Typer app, command modules registered explicitly.

A command module defines its commands as plain functions and a ``register(app)`` function
that adds them (wrapped in :func:`~prefect_dask_profiling.cli._output.guarded`); adding a
command group is one module and one line in :data:`COMMAND_MODULES`. Nothing in the package
imports the CLI: it sits on top of store, regression and bench.
"""

from __future__ import annotations

import importlib

import typer

from prefect_dask_profiling.cli._output import DEBUG_ENV, set_debug

# Command modules under prefect_dask_profiling.cli, in the order their commands are listed.
COMMAND_MODULES: tuple[str, ...] = ("history", "eta", "alerts", "store", "bench", "export")

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Where each night's Dask time went, and whether it regressed.")


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", envvar=DEBUG_ENV,
                               help="Show the traceback of an unexpected error."),
) -> None:
    """Where each night's Dask time went, and whether it regressed.

    Exit codes: 0 ok, 1 a regression (or an unjudged run, or files still pending),
    2 bad input (or a missing or damaged record), 3 an unexpected error (please report it,
    with --debug), 4 the store could not be reached or denied access (retry, or fix access).
    """
    set_debug(debug)


def register_commands(target: typer.Typer, modules: tuple[str, ...] = COMMAND_MODULES) -> None:
    """Import each command module and let it add its commands to ``target``."""
    for name in modules:
        module = importlib.import_module(f"{__package__}.{name}")
        module.register(target)


register_commands(app)


def main() -> None:  # pragma: no cover - console entry point
    app()
