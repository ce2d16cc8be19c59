"""The ``dask-profiling`` command line: a thin layer over store, history, regression, bench.

Exit codes: 0 ok, 1 a verdict failed (regression), 2 bad input (unknown store, run,
pipeline, malformed arguments). Errors are one clear line on stderr, never a traceback.
Every command takes ``--json`` for machines.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Where each night's Dask time went, and whether it regressed.")
console = Console()
err_console = Console(stderr=True)

EXIT_OK, EXIT_VERDICT, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """Raised by command bodies for input errors: printed as one line, exit code 2."""


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected errors into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except (BadInput, ValueError, KeyError, FileNotFoundError, PermissionError,
                OSError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            err_console.print(f"error: {message}", markup=False, highlight=False)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON (NaN/inf become null)."""
    from prefect_dask_profiling.jsonclean import json_clean

    sys.stdout.write(json.dumps(json_clean(data), indent=2, sort_keys=False) + "\n")


def print_table(frame, title: str | None = None, float_digits: int = 3) -> None:
    """Print a pandas DataFrame as a rich table."""
    table = Table(title=title, show_lines=False)
    for col in frame.columns:
        table.add_column(str(col), justify="right" if frame[col].dtype.kind in "fiu" else "left")
    for row in frame.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append("" if v != v else f"{v:.{float_digits}f}")
            else:
                cells.append(str(v))
        table.add_row(*cells)
    console.print(table)


# Commands are registered by the modules below (each keeps its command next to its logic).
# >>> command registrations
# <<< command registrations


def main() -> None:  # pragma: no cover - console entry point
    app()
