"""What every command prints and how it ends: tables, JSON, one-line errors, exit codes.

:func:`guarded` maps the package's error tree to an exit code (:data:`EXIT_CODES`: 1 a
verdict failed, 2 bad input or a bad record, 4 the store could not be used, 3 anything else,
a bug, with the traceback under ``--debug``) and prints every error as one line on stderr.
rich's consoles are made on first use, so ``--help`` and a typo cost no rich import."""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import typer

from prefect_dask_profiling._util import json_clean
from prefect_dask_profiling.errors import (
    InvalidInput,
    StoreError,
    StoreUnavailable,
    VerdictFailed,
)

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console

EXIT_OK, EXIT_VERDICT, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_STORE = 0, 1, 2, 3, 4
# `check`: the run was stored unjudged, or cannot be judged now, and no regression is seen:
# the gate did not look (regression.blind), distinct from a regression (1)
EXIT_UNJUDGED = 5
# The one map from errors to exit codes, most specific first (see the module docstring).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (StoreUnavailable, EXIT_STORE),
    (StoreError, EXIT_BAD_INPUT),
    (InvalidInput, EXIT_BAD_INPUT),
    (VerdictFailed, EXIT_VERDICT),
)
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


@cache
def out_console() -> Console:
    """The rich console on stdout (made on first use; it follows ``sys.stdout``)."""
    from rich.console import Console

    return Console()


@cache
def err_console() -> Console:
    """The rich console on stderr (made on first use; it follows ``sys.stderr``)."""
    from rich.console import Console

    return Console(stderr=True)


def say(text: str) -> None:
    """One line on stdout, as is (no markup, no wrapping at the terminal width)."""
    out_console().print(text, markup=False, highlight=False, soft_wrap=True)


def warn(text: str) -> None:
    """One line on stderr, as is."""
    err_console().print(text, markup=False, highlight=False, soft_wrap=True)


def exit_code(exc: BaseException) -> int:
    """The exit code for ``exc``: from :data:`EXIT_CODES`, else :data:`EXIT_INTERNAL`."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_INTERNAL


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command body; a known error → one line and its :func:`exit_code`; anything
    unexpected → one line, a hint, exit 3 (the traceback with ``--debug``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            code = exit_code(exc)
            if code != EXIT_INTERNAL:
                warn(f"error: {_one_line(exc)}")
                raise typer.Exit(code) from None
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


def print_table(frame: pd.DataFrame, title: str | None = None) -> None:
    """Print a pandas DataFrame as a rich table (floats with :data:`FLOAT_DIGITS` digits)."""
    from rich.table import Table

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
                cells.append("" if v != v else f"{v:.{FLOAT_DIGITS}f}")
            else:
                cells.append(str(v))
        table.add_row(*cells)
    out_console().print(table)
