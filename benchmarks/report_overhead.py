"""What a per-stage performance report costs: wall time, size, upload time.

Runs, on one LocalCluster in one process, a 10k-task stage with and without its report
(alternating, repeated) and prints the median wall ratio (target: the report adds <= 10%),
the report's size plain and gzipped, the flow process's CPU to draw one page of that
stage's copied data (median of ``--pages`` pages after the first: the tabs are built once
per process and refilled), and the time to upload it to a local store and to a moto S3
server on 127.0.0.1.

    .venv/bin/python benchmarks/report_overhead.py [--tasks 10000] [--repeats 3]
        [--pages 20]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time

import dask.array as da
from distributed import Client, LocalCluster

from prefect_dask_profiling.reports import stage_reports as reports
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.timing.client import install


def stage_once(client: Client, plugin: str, tasks: int,
               with_report: bool) -> tuple[float, float, str | None]:
    """Run a stage of ``tasks`` tiny tasks; render its report (from the task records of
    ``plugin``) when asked.

    Returns the stage's wall seconds, the seconds spent rendering, and the HTML.
    """
    t0 = time.perf_counter()
    window = reports.open_window(client, plugin) if with_report else None
    x = da.ones(tasks, chunks=1)
    client.compute((x + 1).sum()).result()
    t1 = time.perf_counter()
    html = reports.render(client, window).html if window is not None else None
    return time.perf_counter() - t0, time.perf_counter() - t1, html


def page_cpu(client: Client, plugin: str, tasks: int, pages: int) -> tuple[float, int]:
    """Median thread CPU seconds to draw the HTML of one stage of ``tasks`` tasks from its
    copied data (after a first page), and the page's length."""
    from prefect_dask_profiling.reports import data as report_data
    from prefect_dask_profiling.reports.html import render_html

    window = reports.open_window(client, plugin)
    x = da.ones(tasks, chunks=1)
    client.compute((x + 1).sum()).result()
    end = reports.close_window(client, window)
    data = report_data.fetch(client, plugin=plugin, start=window.start, stop=end.stop,
                             first=window.index, last=end.index,
                             last_count=window.last_count, end_count=end.count or 0,
                             limit=window.stream_limit)
    html = render_html(data, "bench")
    times = []
    for _ in range(pages):
        t0 = time.thread_time()
        render_html(data, "bench")
        times.append(time.thread_time() - t0)
    return statistics.median(times), len(html)


def upload_seconds(store: RunStore, html: str) -> float:
    t0 = time.perf_counter()
    result = store.write_report("bench", new_run_id(), "stage", html)
    assert not result.spooled, result.warnings
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pages", type=int, default=20)
    args = parser.parse_args()
    if args.tasks < 1 or args.repeats < 1 or args.pages < 1:
        parser.error("--tasks, --repeats and --pages must be >= 1")
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        plugin = install(client, task_records=True)  # in both: the report's cost is measured
        stage_once(client, plugin, 1000, True)  # warm-up: imports
        plain, reported, renders, html = [], [], [], ""
        for i in range(args.repeats):
            order = (False, True) if i % 2 == 0 else (True, False)
            for with_report in order:
                wall, render_s, out = stage_once(client, plugin, args.tasks, with_report)
                (reported if with_report else plain).append(wall)
                if with_report:
                    renders.append(render_s)
                html = out or html
        draw_s, page_length = page_cpu(client, plugin, args.tasks, args.pages)
    ratio = statistics.median(reported) / statistics.median(plain)
    raw = html.encode()
    print(f"stage of {args.tasks} tasks, {args.repeats} repeats, 2 workers x 1 thread")
    print(f"  without report: median {statistics.median(plain):.2f} s")
    print(f"  with report:    median {statistics.median(reported):.2f} s  "
          f"(ratio {ratio:.3f}; target <= 1.10)")
    print(f"  of which rendering: median {statistics.median(renders):.2f} s")
    print(f"  report size: {len(raw) / 1e6:.2f} MB plain, "
          f"{len(gzip.compress(raw)) / 1e6:.3f} MB gzip")
    print(f"  one page drawn from the copied data: {draw_s * 1000:.1f} ms of CPU "
          f"(median of {args.pages}, after the first), {page_length / 1e6:.2f} MB")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"  upload to local store: {upload_seconds(RunStore(tmp), html):.3f} s")
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        return
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"key": "bench", "secret": "bench", "endpoint_url": f"http://{host}:{port}"}
        store = RunStore("s3://bench-reports", options)
        store.fs.call_s3("create_bucket", Bucket="bench-reports")
        print(f"  upload to moto S3:     {upload_seconds(store, html):.3f} s")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
