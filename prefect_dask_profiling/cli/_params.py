"""Parameters repeated across commands, and opening the store they name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from prefect_dask_profiling.cli._output import BadInput

if TYPE_CHECKING:
    from prefect_dask_profiling.store.runs import RunStore

_STORE_HELP = "Store URL (default: $DASK_PROFILING_STORE or ./.dask-profiling)."

StoreOption = Annotated[str | None, typer.Option("--store", help=_STORE_HELP)]
PipelineOption = Annotated[str | None, typer.Option(
    "--pipeline", help="Pipeline name (default: the one holding the run, or the only one).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="Run id.")]


def make_store(url: str | None) -> RunStore:
    """The store at ``url`` (it may not exist yet); a malformed URL is bad input."""
    from prefect_dask_profiling.store.runs import RunStore

    try:
        return RunStore(url)
    except ValueError as exc:  # the URL's own validation: nothing else runs here
        raise BadInput(str(exc)) from None


def existing_store(url: str | None) -> RunStore:
    """The store at ``url``, which must exist (``StoreError`` naming it otherwise)."""
    from prefect_dask_profiling.regression import history

    make_store(url)  # a malformed URL is reported as such
    return history.open_store(url)
