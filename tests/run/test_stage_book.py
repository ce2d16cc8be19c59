"""A run's stage entries (:class:`StageBook`) on an in-process cluster, no Prefect.

A stage's close reads the scheduler once for its snapshot (kept in case the final
collection fails, its task counts serving the live ETA); when the final collection does
fail, the run's record is that snapshot, marked incomplete, with a warning saying what it
lacks.
"""

from __future__ import annotations

import dask.array as da
import pytest

from prefect_dask_profiling.reports.stage_reports import StageReports
from prefect_dask_profiling.run.background import Background
from prefect_dask_profiling.run.stages import StageBook
from prefect_dask_profiling.stages import stage
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.timing import client as timing_client


@pytest.fixture
def book(inproc_client, tmp_path):
    plugin = timing_client.install(inproc_client)
    warnings: list[str] = []
    ctx = RunContext(run_id=new_run_id(), pipeline="nightly", version="1")
    store = RunStore(str(tmp_path))
    reports = StageReports(inproc_client, plugin, ctx, warnings, lambda: store,
                           submit=Background.instance().submit, mode="off")
    yield StageBook(inproc_client, plugin, warnings, reports, cost=None)
    timing_client.uninstall(inproc_client, plugin)


def _stage(book: StageBook, name: str, client, n: int) -> None:
    token = book.opened(name, None)
    with stage(name):  # tags the work (no session listens here: the book is driven below)
        client.compute(da.ones(n, chunks=1).sum()).result()
    book.closed(name, token)


def test_a_close_reads_the_counts_the_eta_needs(book, inproc_client):
    _stage(book, "load", inproc_client, 12)
    assert book.last_counts == timing_client.task_counts(inproc_client, book.plugin_name)
    assert book.last_counts["load"]["sum"] == 12  # a task per chunk
    assert "transfer_bytes" not in book.last_snapshot  # left to the final collection


def test_a_failed_final_collection_keeps_the_last_close_marked_incomplete(book, inproc_client):
    _stage(book, "load", inproc_client, 12)
    _stage(book, "sum", inproc_client, 8)
    timing_client.uninstall(inproc_client, book.plugin_name)  # the final read fails
    record = book.record()
    assert record.incomplete
    assert set(record.tasks["stage"]) == {"load", "sum"}
    [warning] = [w for w in book.warnings if w.startswith("final collection failed")]
    assert "without the workers' transfer bytes" in warning and "run incomplete" in warning


def test_a_failed_final_collection_without_a_close_raises(book):
    timing_client.uninstall(book.client, book.plugin_name)
    with pytest.raises(KeyError, match="no TaskTimings plugin"):
        book.record()
