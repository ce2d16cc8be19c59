"""What every command prints and how it ends: tables, JSON, one-line errors, exit codes.

Exit codes: 0 ok, 1 a verdict failed (a regression, an unjudged run, files still pending),
2 bad input (raised as :class:`BadInput`, :class:`~prefect_dask_profiling._util.InvalidInput`
or :class:`~prefect_dask_profiling.store.runs.StoreError`: an unknown store, run or
pipeline, a malformed argument), 3 an unexpected error — a bug: one line without a
traceback and a hint to report it; ``--debug`` (or ``DASK_PROFILING_DEBUG=1``) shows the
traceback.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from prefect_dask_profiling._util import InvalidInput, json_clean

if TYPE_CHECKING:
    import pandas as pd

console = Console()
err_console = Console(stderr=True)

EXIT_OK, EXIT_VERDICT, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
DEBUG_ENV = "DASK_PROFILING_DEBUG"
FLOAT_DIGITS = 3  # tables; single values print with 2


class BadInput(InvalidInput):
    """Raised by command bodies for input errors: printed as one line, exit code 2."""


_debug = {"on": False}


def set_debug(on: bool) -> None:
    """Show tracebacks of unexpected errors (``--debug``)."""
    _debug["on"] = bool(on)


def debugging() -> bool:
    return _debug["on"] or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")


def say(text: str) -> None:
    """One line on stdout, as is (no markup, no wrapping at the terminal width)."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def warn(text: str) -> None:
    """One line on stderr, as is."""
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from prefect_dask_profiling.store.runs import StoreError

    return (InvalidInput, StoreError)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input → one line and exit 2; anything unexpected → one line, a hint, exit 3."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except _bad_input_types() as exc:
            warn(f"error: {_one_line(exc)}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except Exception as exc:
            if debugging():
                raise
            warn(f"internal error: {type(exc).__name__}: {_one_line(exc)} (this is a bug in "
                 f"dask-profiling: please report it with the output of --debug or "
                 f"{DEBUG_ENV}=1)")
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split()) or type(exc).__name__


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON (NaN/inf become null)."""
    sys.stdout.write(json.dumps(json_clean(data), indent=2, sort_keys=False) + "\n")


def format_value(value: Any, digits: int = 2) -> str:
    """A single value for a ``key: value`` line: floats rounded, lists joined, None empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v, digits) for v in value)
    return str(value)


def print_table(frame: pd.DataFrame, title: str | None = None,
                float_digits: int = FLOAT_DIGITS) -> None:
    """Print a pandas DataFrame as a rich table."""
    table = Table(title=title, show_lines=False)
    for col in frame.columns:
        numeric = frame[col].dtype.kind in "fiu"
        # names (prefixes, run ids) wrap rather than being cut to "open_d…" on narrow terminals
        table.add_column(str(col), justify="right" if numeric else "left",
                         overflow="ellipsis" if numeric else "fold")
    for row in frame.itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append("" if v != v else f"{v:.{float_digits}f}")
            else:
                cells.append(str(v))
        table.add_row(*cells)
    console.print(table)
