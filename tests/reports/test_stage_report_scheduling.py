"""The stage reports of one run (:class:`StageReports`) on an in-process cluster, no Prefect.

A closed stage's report is drawn and stored by the process's background service while the
caller goes on; :meth:`StageReports.drain` waits for it, so nothing is lost. ``"auto"`` mode
keeps a short stage's window and draws it only when asked (:meth:`StageReports.flagged`).
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import pytest

from prefect_dask_profiling.prefect.publish import Publisher
from prefect_dask_profiling.reports.stage_reports import StageReports
from prefect_dask_profiling.run.background import Background
from prefect_dask_profiling.store.manifest import RunContext, StageInfo
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.timing import client as timing_client


@pytest.fixture
def run(inproc_client, tmp_path):
    plugin = timing_client.install(inproc_client, task_records=True)

    def make(**settings) -> tuple[StageReports, RunContext]:
        ctx = RunContext(run_id=new_run_id(), pipeline="nightly", version="1")
        store = RunStore(str(tmp_path))
        return StageReports(inproc_client, plugin, ctx, [], lambda: store,
                            submit=Background.instance().submit, **settings), ctx
    yield make
    timing_client.uninstall(inproc_client, plugin)


def _stage(reports: StageReports, info: StageInfo, client, n: int = 20) -> None:
    window = reports.opened(info.name)
    client.compute(da.ones(n, chunks=1).sum()).result()
    reports.closed(info, window, reports.end(window))


def test_a_closed_stage_has_its_report_stored_once_drained(run, inproc_client):
    reports, ctx = run()
    info = StageInfo(name="load")
    _stage(reports, info, inproc_client)
    reports.drain()
    assert info.report is not None and info.report["tasks"] > 0
    assert Path(info.report["location"]).read_text().startswith("<!DOCTYPE html>")
    publisher = Publisher(ctx, reports._store, retention_days=30)
    assert publisher.links([info]) == {"load": info.report["location"]}
    assert publisher.unposted([info]) == [info]  # no flow run: its link is the run's to post
    assert reports.warnings == []


def test_auto_mode_draws_a_short_stage_only_when_it_is_flagged(run, inproc_client):
    reports, _ = run(mode="auto", min_seconds=3600.0)
    short, other = StageInfo(name="short"), StageInfo(name="other")
    _stage(reports, short, inproc_client)
    _stage(reports, other, inproc_client)
    reports.drain()
    assert short.report is None and "report_min_seconds" in short.note
    assert reports.deferred
    assert reports.flagged({"short"}) == []
    assert short.report is not None and short.note is None
    assert other.report is None and reports.deferred  # not flagged: still only its marks


def test_a_stage_opened_again_has_one_report_spanning_its_windows(run, inproc_client):
    reports, _ = run()
    info, between = StageInfo(name="tile"), StageInfo(name="between")
    _stage(reports, info, inproc_client, n=5)
    _stage(reports, between, inproc_client, n=5)
    info.windows += 1
    _stage(reports, info, inproc_client, n=5)
    reports.drain()
    assert info.report["tasks"] >= 15  # from the first opening to the last closing
    assert "2 windows" in info.note and "between" in info.note


def test_no_report_when_reports_are_off(run, inproc_client):
    reports, _ = run(mode=False)
    info = StageInfo(name="load")
    _stage(reports, info, inproc_client)
    reports.drain()
    assert info.report is None and info.note is None


def test_a_plugin_keeping_no_task_records_gives_no_report_and_says_why(inproc_client,
                                                                       tmp_path):
    plugin = timing_client.install(inproc_client)  # task_records=False: nothing to draw
    try:
        ctx = RunContext(run_id=new_run_id(), pipeline="nightly", version="1")
        store = RunStore(str(tmp_path))
        reports = StageReports(inproc_client, plugin, ctx, [], lambda: store,
                               submit=Background.instance().submit)
        info = StageInfo(name="load")
        _stage(reports, info, inproc_client)
        reports.drain()
    finally:
        timing_client.uninstall(inproc_client, plugin)
    assert info.report is None
    assert [w for w in reports.warnings if "report not started" in w
            and "keeps no task records" in w and plugin in w], reports.warnings
