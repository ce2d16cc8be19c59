"""Alert commands: ``alerts`` (open episodes, ``--stats``) and ``ack``.

The command bodies import what they use (the alert history brings pandas): listing the
commands, or ``--help``, imports none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.cli._output import emit_json, guarded, print_table, say
from prefect_dask_profiling.cli._params import (
    JsonOption,
    PipelineOption,
    StoreOption,
    existing_store,
)
from prefect_dask_profiling.store.errors import StoreNotFound

if TYPE_CHECKING:
    import pandas as pd

    from prefect_dask_profiling.regression.alert_history import Replayed
    from prefect_dask_profiling.regression.alerts import Book, Episode
    from prefect_dask_profiling.store.runs import RunStore

# The columns of the human table; --json has every field.
ALERT_COLUMNS = ["id", "state", "stage", "prefix", "start_run", "last_run", "nights",
                 "peak_ratio", "last_ratio", "note"]
# ``alert_history.LOOKBACK_RUNS``, the default of --runs (spelled here so that the help
# imports no pandas; tests/cli/test_cli_imports.py checks they agree).
LOOKBACK_RUNS = 60


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("alerts")(guarded(alerts_command))
    app.command("ack")(guarded(ack_command))


def _versions(store: RunStore, pipeline: str, version: str | None) -> list[str]:
    """``[version]`` when ``pipeline`` has runs of it (``[]`` otherwise), or the pipeline's
    newest version (its open episodes are the live ones)."""
    if version is not None:
        return [version] if store.list_runs(pipeline, version, newest=1) else []
    runs = store.list_runs(pipeline)
    return [runs[0]["version"]] if runs else []


def _books(store: RunStore, pipeline: str | None, version: str | None,
           runs: int) -> list[tuple[str, str, Replayed]]:
    """The replayed episodes of each pipeline (``pipeline``, else every one) and version,
    with the nights left out; an unknown pipeline, or a ``version`` no pipeline asked about
    has runs of, is a ``StoreNotFound``."""
    from prefect_dask_profiling.regression import alert_history, history

    if version is not None:
        validate_name(version, "version")
    pipelines = [history.resolve_pipeline(store, pipeline)] if pipeline else \
        store.list_pipelines()
    out = []
    for name in pipelines:
        for ver in _versions(store, name, version):
            out.append((name, ver, alert_history.replayed(store, name, ver, runs=runs)))
    if version is not None and not out:
        raise StoreNotFound(_unknown_version(store, pipelines, version))
    return out


def _unknown_version(store: RunStore, pipelines: list[str], version: str) -> str:
    """The message for ``--version`` naming no stored run: the versions there are."""
    known = {name: ", ".join(dict.fromkeys(r["version"] for r in store.list_runs(name)))
             or "none" for name in pipelines}
    where = "; ".join(f"{name}: {versions}" for name, versions in known.items()) or "none"
    whose = f"pipeline {pipelines[0]!r}" if len(pipelines) == 1 else "any pipeline"
    return (f"unknown version {version!r} of {whose} in store {store.url} "
            f"(versions stored: {where})")


def alerts_command(
    pipeline: PipelineOption = None,
    version: str | None = typer.Option(None, "--version",
                                       help="This version (default: each pipeline's newest)."),
    show_all: bool = typer.Option(False, "--all", help="Closed episodes too."),
    show_stats: bool = typer.Option(False, "--stats",
                                    help="Per pipeline: confirmed, cleared, acknowledged."),
    runs: int = typer.Option(LOOKBACK_RUNS, "--runs", min=1,
                             help="Judged runs replayed before each pipeline's newest "
                                  "(the window its judge replayed)."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Alert episodes (open ones by default), recomputed from the stored verdicts."""
    run_store = existing_store(store)
    books = _books(run_store, pipeline, version, runs)
    if show_stats:
        _print_stats([(name, ver, found.book) for name, ver, found in books], runs, as_json)
        return
    episodes = [e for _, _, found in books for e in found.book.episodes
                if show_all or e.open]
    skipped = [{"pipeline": name, "version": ver, **s.to_json()}
               for name, ver, found in books for s in found.skipped]
    if as_json:
        emit_json({"store": run_store.url, "episodes": [e.to_json() for e in episodes],
                   "skipped": skipped})
        return
    for night in skipped:
        say(f"{night['pipeline']} {night['version']}: night {night['run_id']} left out of "
            f"the replay: {night['reason']}")
    if not episodes:
        say("no open alert episodes" if not show_all else "no alert episodes")
        return
    print_table(_frame(episodes), title=("alert episodes" if show_all else "open alerts")
                + f" in {run_store.url}")


def _frame(episodes: list[Episode]) -> pd.DataFrame:
    from prefect_dask_profiling.regression import alert_history
    from prefect_dask_profiling.regression.alerts import Book

    frame = alert_history.episodes_frame(Book(tuple(episodes)))
    several = frame["pipeline"].nunique() > 1
    return frame[["pipeline", *ALERT_COLUMNS] if several else ALERT_COLUMNS]


def _print_stats(books: list[tuple[str, str, Book]], runs: int, as_json: bool) -> None:
    import pandas as pd

    from prefect_dask_profiling.regression import alert_history

    rows = [alert_history.stats(book, name, ver, runs) for name, ver, book in books]
    frame = pd.DataFrame([{**r.__dict__, "precision": r.suspected_precision} for r in rows],
                         columns=["pipeline", "version", "runs", "confirmed", "cleared",
                                  "acknowledged", "resolved", "open", "precision"])
    if as_json:
        emit_json({"stats": frame.to_dict(orient="records")})
    else:
        print_table(frame, title="alert episodes per pipeline (precision = confirmed / "
                                 "(confirmed + cleared))")


def ack_command(
    target: str = typer.Argument(..., metavar="ALERT_OR_RUN",
                                 help="An episode id (ep-…) or a run id."),
    pipeline: PipelineOption = None,
    note: str = typer.Option("", "--note", help="Why (kept in the marker)."),
    nights: int | None = typer.Option(None, "--nights", min=1,
                                      help="Silence it for this many nights only "
                                           "(default: until it resolves)."),
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Acknowledge an episode (or every episode open at a run): it fails no more runs
    (for ``--nights`` nights, or until it resolves) and its nights stay out of the
    baseline."""
    from prefect_dask_profiling.regression import alert_history, history

    run_store = existing_store(store)
    validate_name(target, "ALERT_OR_RUN")
    if target.startswith("ep-"):
        name, ver = _find_episode(run_store, target, pipeline)
    else:
        name = history.find_run(run_store, target, pipeline)
        ver = run_store.read_manifest(name, target)["version"]
    ack = alert_history.acknowledge(run_store, name, ver, target, note, nights=nights)
    if as_json:
        emit_json({"pipeline": name, "version": ver, "acknowledged": target, "at": ack.at,
                   "nights": nights})
    else:
        what = "episode" if target.startswith("ep-") else "the episodes open at run"
        until = f"for {nights} night(s)" if nights else "until it resolves"
        say(f"acknowledged {what} {target} of {name} {ver}: it fails no runs {until} "
            "from the next run on (its nights stay out of the baseline; `accept` makes "
            "it the new normal)")


def _find_episode(store: RunStore, episode: str, pipeline: str | None) -> tuple[str, str]:
    """The pipeline and version whose recent runs hold ``episode``."""
    from prefect_dask_profiling.regression import alert_history, history
    from prefect_dask_profiling.store.errors import StoreError

    pipelines = [history.resolve_pipeline(store, pipeline)] if pipeline else \
        store.list_pipelines()
    for name in pipelines:
        versions = dict.fromkeys(e["version"] for e in store.list_runs(name))
        for ver in versions:
            book, _ = alert_history.episodes_of(store, name, ver)
            if book.find(episode) is not None:  # its own id, or one paged for it
                return name, ver
    raise StoreError(f"no alert episode {episode} in store {store.url} "
                     "(see `dask-profiling alerts --all`)")
