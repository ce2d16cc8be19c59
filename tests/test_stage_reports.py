"""Per-stage reports rendered after their stage ended: bounded to the stage, on a real cluster.

The task runner renders a stage's report in the background while the next stage runs, so a
report must stop where its stage stopped, even when other work has run since.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dask.array as da
import pytest
from distributed import Client, LocalCluster

from prefect_dask_profiling.prefect import reports


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def _shown(html: str) -> int:
    return int(reports._TASKS_IN_REPORT.search(html).group(1))


def test_late_render_stops_at_the_window_end(client):
    window = reports.open_window(client)
    client.compute(da.ones(40, chunks=1).sum()).result()
    end = reports.close_window(client)
    client.compute(da.ones(200, chunks=1).sum()).result()  # the "next stage"
    late = reports.render(client, window, end)
    assert late.tasks == end.index - window.index
    assert _shown(late.html) == late.tasks
    assert 40 <= late.tasks < 100
    assert not late.truncated
    unbounded = reports.render(client, window)  # default: up to now
    assert _shown(unbounded.html) >= late.tasks + 200


def test_concurrent_renders_keep_their_own_end(client):
    first = reports.open_window(client)
    client.compute(da.ones(30, chunks=1).sum()).result()
    first_end = reports.close_window(client)
    second = reports.open_window(client)
    client.compute(da.ones(60, chunks=1).sum()).result()
    second_end = reports.close_window(client)
    with ThreadPoolExecutor(2) as pool:  # as two runs' report threads would
        ra = pool.submit(reports.render, client, first, first_end)
        rb = pool.submit(reports.render, client, second, second_end)
        a_html, b_html = ra.result().html, rb.result().html
    assert _shown(a_html) == first_end.index - first.index
    assert _shown(b_html) == second_end.index - second.index
    assert _shown(a_html) < _shown(b_html)


@pytest.mark.parametrize("mode, seconds, raised, expected", [
    ("auto", 19.9, False, False), ("auto", 20.0, False, True), ("auto", 3600.0, False, True),
    ("auto", 0.1, True, True), (True, 0.1, False, True), (False, 3600.0, True, False),
])
def test_which_stages_get_their_report_at_exit(mode, seconds, raised, expected):
    # "auto" leaves a shorter stage's report to finish(), which renders it if it regressed
    assert reports.render_now(mode, seconds, min_seconds=20.0, raised=raised) is expected
