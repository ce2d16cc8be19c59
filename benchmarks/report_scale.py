"""A stage report at any size: bytes, flow-process CPU and peak memory to draw it.

Feeds ``N`` task records of a real run's shape (``--workers`` × ``--threads`` threads, tasks
of ``--seconds`` each back to back, varied by up to ``--jitter`` of it, one straggler of 60×
every 100,000) through the run's recorder
(:class:`~prefect_dask_profiling.timing.tasks.TaskRecords` at its default bound, as the
scheduler plugin keeps them), copies what it holds, and draws the page as the flow
process does (:func:`~prefect_dask_profiling.reports.html.render_html`). Prints, per
``N``: the records shown, whether the page says it is sampled, the page's size, the thread
CPU seconds to draw it (a first page, then the median of ``--pages`` more) and the peak
Python memory while drawing a page (tracemalloc, in a pass of its own). With ``--gzip``
levels, also the page's size gzip-compressed at each level (as an S3 store keeps it,
:func:`~prefect_dask_profiling.store.compression.gzip_page`) and the thread CPU seconds
to compress it (the median of ``--pages``).

Run with::

    .venv/bin/python benchmarks/report_scale.py --tasks 200000 1000000 [--pages 3] \
        [--jitter 0.5] [--gzip 1 6 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.report_records import stage_data_of  # noqa: E402

from prefect_dask_profiling.reports.html import render_html  # noqa: E402
from prefect_dask_profiling.store.compression import gzip_page  # noqa: E402


def gzip_cost(page: bytes, level: int, repeats: int) -> tuple[float, float]:
    """The size in MB of ``page`` gzip-compressed at ``level``, and the median thread CPU
    seconds of ``repeats`` compressions (what storing a report on S3 adds)."""
    times, size = [], 0
    for _ in range(max(repeats, 1)):
        t0 = time.thread_time()
        size = len(gzip_page(page, level))
        times.append(time.thread_time() - t0)
    return size / 1e6, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.05)
    parser.add_argument("--pages", type=int, default=3)
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="vary each task's time by up to this share (seeded), as real "
                             "tasks' times vary: the page's numbers compress less")
    parser.add_argument("--gzip", type=int, nargs="*", default=[], metavar="LEVEL",
                        help="gzip levels (1-9) to compress each page at")
    args = parser.parse_args()
    print(f"{'tasks':>9} {'shown':>7} {'sampled':>8} {'MB':>6} {'first s':>8} {'page s':>7} "
          f"{'peak MB':>8}" + "".join(f" {f'gz{lv} MB':>8} {f'gz{lv} s':>7}"
                                       for lv in args.gzip))
    for n in args.tasks:
        data = stage_data_of(n, args.workers, args.threads, args.seconds, args.jitter)
        t0 = time.thread_time()
        html = render_html(data, "scale")  # the first in a process imports Bokeh, builds tabs
        first = time.thread_time() - t0
        times = []
        for _ in range(args.pages):
            t0 = time.thread_time()
            render_html(data, "scale")
            times.append(time.thread_time() - t0)
        tracemalloc.start()  # apart: tracing slows the drawing several times over
        render_html(data, "scale")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{n:>9} {data.stream.kept:>7} {str('report sampled' in html):>8} "
              f"{len(html.encode()) / 1e6:>6.2f} {first:>8.2f} {statistics.median(times):>7.2f} "
              f"{peak / 1e6:>8.1f}" + "".join(
                  f" {mb:>8.3f} {cpu:>7.3f}"
                  for mb, cpu in (gzip_cost(html.encode(), lv, args.pages) for lv in args.gzip)))


if __name__ == "__main__":
    main()
