"""A stage report stays bounded at any size and covers the stage's whole time (issue 58).

Records of a real run's shape (tests/helpers/report_records.py) go through the run's
recorder at its default bound and are drawn as the flow process draws a report.
"""

from __future__ import annotations

import re

import pytest
from helpers.report_records import PREFIXES, stage_data_of, straggler_keys

from prefect_dask_profiling.reports.html import render_html
from prefect_dask_profiling.timing.tasks import MAX_TASK_RECORDS

pytestmark = pytest.mark.slow  # ~15 s: 250k records drawn


def test_a_250k_task_stage_report_is_bounded_sampled_and_says_so():
    n = 250_000
    data = stage_data_of(n)
    assert data.stream.cut and MAX_TASK_RECORDS // 2 <= data.stream.kept <= MAX_TASK_RECORDS
    html = render_html(data, "scale")
    assert len(html.encode()) <= 10_000_000  # ~8 MB: docs/reports.md
    assert f"number of tasks: {n} " in html
    assert f"report sampled: {data.stream.kept} of {n} tasks shown" in html
    shown = {int(i) for i in re.findall(r", (\d+)\)", html)}
    assert min(shown) < 100 and max(shown) > n - 100  # the whole time, not its end
    # every straggler is drawn (Dask's recorder would have kept the last 100k only)
    assert {k for k in straggler_keys(n)} <= set(re.findall(r"\('[\w-]+', \d+\)", html))
    assert all(p in html for p in PREFIXES)
