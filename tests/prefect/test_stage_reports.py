"""Per-stage reports: bounded to the stage, exact when the recorder overflowed, on real clusters.

The task runner renders a stage's report in the background while the next stage runs, so a
report must stop where its stage stopped, even when other work has run since — also when
more tasks than the run's task records keep (as many as Dask's task-stream recorder would)
finished after it: then the report shows only what is left of the stage's own tasks and
says it is cut. The last tests run a real flow
on a real cluster, store to S3 (moto) and open a report in headless Chromium.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import dask
import dask.array as da
import pytest
from distributed import Client, LocalCluster
from helpers.bokeh_pages import page_document
from helpers.ndvi_fixtures import artifacts_by_key
from helpers.s3_servers import boto_client, moto_server, s3_options
from helpers.tiers import starts_processes
from prefect import flow
from prefect_dask import get_dask_client

from prefect_dask_profiling import stage
from prefect_dask_profiling.options import RENDERERS as RENDERER_CHOICES
from prefect_dask_profiling.options import check_renderer
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner, profiled
from prefect_dask_profiling.reports import stage_reports as reports
from prefect_dask_profiling.reports.html import TABS
from prefect_dask_profiling.store.runs import RunStore
from prefect_dask_profiling.timing import client as timing_client

RENDERERS = pytest.mark.parametrize("renderer", RENDERER_CHOICES)
STREAM_LENGTH = ("distributed.scheduler.dashboard.tasks.task-stream-length",
                 "distributed.scheduler.dashboard.status.task-stream-length")


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


@pytest.fixture
def plugin(request):
    """The name of a ``TaskTimings`` keeping task records on the test's client (removed
    after the test); the client is the ``client`` fixture unless the test asks for
    ``small_recorder_client``."""
    name = "small_recorder_client" if "small_recorder_client" in request.fixturenames else "client"
    client = request.getfixturevalue(name)
    installed = timing_client.install(client, task_records=True)
    yield installed
    timing_client.uninstall(client, installed)


def _keys(html: str, prefix: str) -> set[str]:
    """The distinct task keys named ``<prefix>-<n>`` in a report's task stream."""
    return set(re.findall(rf"{prefix}-\d+", html))


def inc(x: int) -> int:
    return x + 1


def _numbers(html: str, prefix: str) -> list[int]:
    """The ``<n>`` of each distinct key ``<prefix>-<n>`` shown, sorted (tasks finish in about
    their submission order: the spread of these says which part of a window is shown)."""
    return sorted(int(key.rsplit("-", 1)[1]) for key in _keys(html, prefix))


def _run(client: Client, prefix: str, n: int) -> None:
    futures = client.map(inc, range(n), key=[f"{prefix}-{i}" for i in range(n)])
    client.gather(futures)
    del futures


@RENDERERS
def test_late_render_stops_at_the_window_end(client, plugin, renderer):
    window = reports.open_window(client, plugin)
    client.compute(da.ones(40, chunks=1).sum()).result()
    end = reports.close_window(client, window)
    client.compute(da.ones(200, chunks=1).sum()).result()  # the "next stage"
    late = reports.render(client, window, end)
    assert late.tasks == end.index - window.index == late.shown
    assert late.renderer == renderer
    assert 40 <= late.tasks < 100
    assert not late.truncated
    assert f"number of tasks: {late.tasks} " in late.html  # the stage's tasks
    unbounded = reports.render(client, window)  # default: up to now
    assert unbounded.tasks >= late.tasks + 200


@RENDERERS
def test_concurrent_renders_keep_their_own_end(client, plugin, renderer):
    first = reports.open_window(client, plugin)
    _run(client, "first-key", 30)
    first_end = reports.close_window(client, first)
    second = reports.open_window(client, plugin)
    _run(client, "second-key", 60)
    second_end = reports.close_window(client, second)
    with ThreadPoolExecutor(2) as pool:  # as two runs' report threads would
        ra = pool.submit(reports.render, client, first, first_end)
        rb = pool.submit(reports.render, client, second, second_end)
        a, b = ra.result(), rb.result()
    assert (a.shown, b.shown) == (30, 60)
    assert len(_keys(a.html, "first-key")) == 30 and not _keys(a.html, "second-key")
    assert len(_keys(b.html, "second-key")) == 60 and not _keys(b.html, "first-key")


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def small_recorder_client():
    """A fresh scheduler whose task-stream recorder keeps the last 50 tasks."""
    with dask.config.set({key: 50 for key in STREAM_LENGTH}), \
            LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                         dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


@RENDERERS
def test_a_report_after_three_times_the_recorder_holds_only_its_own_tasks(
        small_recorder_client, plugin, renderer):
    client = small_recorder_client
    window = reports.open_window(client, plugin)
    assert window.stream_limit == 50
    _run(client, "early-key", 20)
    end = reports.close_window(client, window)
    _run(client, "late-key", 150)  # 3x the recorder's limit finish after the stage
    cut = reports.render(client, window, end)
    # no window opened after it: its records were thinned evenly (a sample, its longest
    # among them), never replaced by the later tasks (on 5beef4d: all 20 gone)
    assert (cut.tasks, cut.truncated) == (20, True) and 0 < cut.shown < 20
    assert not _keys(cut.html, "late-key")
    assert _numbers(cut.html, "early-key")[0] <= 5  # the window's first to finish is kept
    if renderer == "flow":
        assert "number of tasks: 20 " in cut.html
        assert f"report sampled: {cut.shown} of 20 tasks shown" in cut.html


@RENDERERS
def test_a_partly_overwritten_stage_keeps_exactly_what_is_left_of_it(
        small_recorder_client, plugin, renderer):
    client = small_recorder_client
    window = reports.open_window(client, plugin)
    _run(client, "early-key", 40)
    end = reports.close_window(client, window)
    _run(client, "late-key", 30)  # 70 tasks, 50 kept: the stage's thinned to every other
    cut = reports.render(client, window, end)
    # every other of the stage's 40 (its whole time), and up to 2 of its longest besides
    assert (cut.tasks, cut.truncated) == (40, True) and 20 <= cut.shown <= 22
    shown = _numbers(cut.html, "early-key")
    assert len(shown) == cut.shown and shown[0] <= 5 and shown[-1] >= 30  # its whole time
    assert not _keys(cut.html, "late-key")


def test_an_unknown_renderer_is_refused_by_name():
    with pytest.raises(ValueError, match="report_renderer must be one of"):
        check_renderer("bokeh")
    with pytest.raises(ValueError, match="report_renderer"):
        ProfiledDaskTaskRunner(report_renderer="scheduler")
    with pytest.raises(ValueError, match="report_renderer='dask' was removed: it replaced"):
        ProfiledDaskTaskRunner(report_renderer="dask")


def test_every_stage_gets_a_report_by_default():
    options = ProfiledDaskTaskRunner(report_renderer="flow").profiling
    assert options.stage_reports is True
    assert options == ProfiledDaskTaskRunner().profiling  # the renderer is no option: one
    assert not hasattr(options, "report_renderer")


@pytest.mark.parametrize("mode, seconds, raised, expected", [
    ("auto", 19.9, False, False), ("auto", 20.0, False, True), ("auto", 3600.0, False, True),
    ("auto", 0.1, True, True), (True, 0.1, False, True), (False, 3600.0, True, False),
])
def test_which_stages_get_their_report_at_exit(mode, seconds, raised, expected):
    # "auto" leaves a shorter stage's report to finish(), which renders it if it regressed
    assert reports.render_now(mode, seconds, min_seconds=20.0, raised=raised) is expected


# -- a real flow, its cluster and S3 ------------------------------------------------------------

BUCKET = "reports"
EARLY, LATE = 20, 150


def two_stages(address: str, store: str, options: dict, **runner_kwargs):
    runner = ProfiledDaskTaskRunner(address=address, store=store, storage_options=options,
                                    **runner_kwargs)

    @flow(name="stage-reports", version="1", task_runner=runner)
    @profiled
    def body() -> None:
        with stage("early"), get_dask_client() as client:
            _run(client, "early-key", EARLY)
        with stage("late"), get_dask_client() as client:
            _run(client, "late-key", LATE)  # 3x the recorder's 50

    return body


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def s3_run(prefect_server):
    """Two stages on a fresh 2-worker cluster whose recorder keeps 50 tasks, stored on S3."""
    with moto_server() as endpoint, dask.config.set({key: 50 for key in STREAM_LENGTH}), \
            LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                         dashboard_address=":0") as cluster:
        boto_client(endpoint).create_bucket(Bucket=BUCKET)
        options = s3_options(endpoint)
        store = f"s3://{BUCKET}/pfx"
        state = two_stages(cluster.scheduler_address, store, options)(return_state=True)
        run_store = RunStore(store, options)
        runs = run_store.list_runs("stage-reports")
        manifest = run_store.read_manifest("stage-reports", runs[0]["run_id"])
        html = {info["name"]: run_store.read_page(info["report"]["location"])  # gunzipped
                for info in manifest["stages"]}
        yield state, manifest, html, run_store


def test_every_stage_of_a_flow_gets_its_report_stored_and_linked(s3_run):
    state, manifest, html, _ = s3_run
    assert state.is_completed(), state.message
    stages = {s["name"]: s for s in manifest["stages"]}
    assert set(stages) == {"early", "late"}
    arts = artifacts_by_key(state)
    for name, info in stages.items():
        report = info["report"]
        assert report["location"].startswith(f"s3://{BUCKET}/pfx/reports/"), report
        assert report["renderer"] == "flow" and not report["spooled"], report
        assert f"{manifest['run_id']}/{name}.html" in arts[f"stage-reports-report-{name}"].data
        for title in TABS:
            assert title in html[name]


def test_each_flow_report_holds_exactly_its_stage_s_tasks(s3_run):
    _, manifest, html, _ = s3_run
    stages = {s["name"]: s for s in manifest["stages"]}
    late = stages["late"]["report"]
    # the late stage alone ran 3x the recorder's limit: a sample over its whole time is
    # shown (every 4th, and its longest), and it says so (on 5beef4d: its last 50 only)
    # (every 4th is 38; the 2 longest, and later tasks longer than them, come on top: how
    # many depends on the machine's load, up to the recorder's limit of 50)
    assert (late["tasks"], late["truncated"]) == (LATE, True) and 37 <= late["shown"] <= 50
    shown = _numbers(html["late"], "late-key")
    assert len(shown) == late["shown"] and shown[0] <= 20 and shown[-1] >= 130
    assert f"report sampled: {late['shown']} of 150 tasks shown" in html["late"]
    assert stages["late"]["note"].startswith(
        f"report sampled: it shows {late['shown']} of the stage's 150")
    assert not _keys(html["late"], "early-key")
    # the early stage's report was drawn while the late stage ran: whole, or cut if the late
    # tasks overtook it, but never showing a late task
    early = stages["early"]["report"]
    shown = _keys(html["early"], "early-key")
    assert early["tasks"] == EARLY and early["shown"] == len(shown) <= EARLY
    assert early["truncated"] == (len(shown) < EARLY)
    assert shown <= {f"early-key-{i}" for i in range(EARLY)}
    assert not _keys(html["early"], "late-key")


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium)")
    return found


@pytest.fixture(scope="module")
def bokeh_js():
    """Bokeh's own JavaScript served on 127.0.0.1 (the tests run offline; reports use the
    CDN): yields a function that points a report's CDN URLs at it."""
    import bokeh.util.paths as paths

    static = str(paths.bokehjs_path() if hasattr(paths, "bokehjs_path") else paths.bokehjsdir())
    handler = functools.partial(_QuietHandler, directory=static)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/js"
    try:
        yield lambda text: re.sub(
            r"https://cdn\.bokeh\.org/bokeh/release/(bokeh[-a-z]*)-[0-9.]+(\.min)?\.js",
            lambda m: f"{base}/{m.group(1)}.min.js", text)
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


PROBE = """<script>window.addEventListener("load", () => setTimeout(() => {
  const tabs = Bokeh.documents[0].roots()[0];
  tabs.active = %d;
  const out = document.createElement("pre");
  out.id = "probe";
  const stream = Bokeh.documents[0].get_model_by_name("task_stream");
  const source = stream.renderers[0].data_source;
  out.textContent = JSON.stringify({tabs: tabs.tabs.map(t => t.title),
                                    views: Object.keys(Bokeh.index).length,
                                    rows: source.get_length(),
                                    starts: Array.from(source.data.start).length});
  document.body.appendChild(out);
}, 1500));</script></body>"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,900", "--virtual-time-budget=15000"]


def test_a_stored_report_opens_in_chromium_with_dask_s_tabs(s3_run, chromium, bokeh_js,
                                                              tmp_path):
    _, manifest, html, _ = s3_run
    # the late stage: its own window is never overtaken by later tasks, so it always shows
    # some (the early one's report may be drawn after the late tasks filled the records)
    shown = {s["name"]: s["report"]["shown"] for s in manifest["stages"]}["late"]
    page = tmp_path / "late.html"
    page.write_text(bokeh_js(html["late"]).replace("</body>", PROBE % 1))
    done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    probe = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout)
    assert probe, done.stdout[-2000:]
    seen = json.loads(probe.group(1).replace("&quot;", '"'))
    assert seen["tabs"] == list(TABS) and seen["views"] >= 1, seen
    # the task stream's columns (typed arrays in the page) decode to one row per action of
    # the tasks shown (Dask's rectangles): a compute each, and a transfer or a disk read
    # where a task had one (under load the scheduler moves data more: CI saw 41 for 40)
    assert seen["rows"] == seen["starts"] >= shown > 0, (seen, shown)
    shot = tmp_path / "stage-report.png"  # the task-stream tab, as docs/stage-report.png
    subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=180,
                   stdin=subprocess.DEVNULL, check=True)
    assert shot.stat().st_size > 10_000


def test_a_gzip_report_opens_in_chromium_straight_from_its_s3_link(s3_run, chromium, bokeh_js,
                                                                   tmp_path):
    """S3 keeps a report gzip-compressed with ``Content-Encoding: gzip``: Chromium opening
    its presigned link decodes it and draws the task stream (the page stored as the run
    stores it, its CDN pointed at the local Bokeh and a probe added)."""
    _, manifest, html, store = s3_run
    late = {s["name"]: s["report"] for s in manifest["stages"]}["late"]
    page = bokeh_js(html["late"]).replace("</body>", PROBE % 1)
    location = store.write_report("stage-reports", manifest["run_id"], "probe", page).location
    head = store.fs.call_s3("head_object", Bucket=BUCKET,
                            Key=location.split(f"s3://{BUCKET}/", 1)[1])
    assert head["ContentEncoding"] == "gzip" and head["ContentLength"] < len(page) / 3
    url = store.presign(location, 600)
    done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--dump-dom", url], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    probe = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout)
    assert probe, done.stdout[-2000:]
    seen = json.loads(probe.group(1).replace("&quot;", '"'))
    assert seen["tabs"] == list(TABS) and seen["rows"] >= late["shown"] > 0, (seen, late)


def test_a_refilled_report_is_what_bokeh_itself_would_write(client, plugin):
    """Reports after the first re-encode only what changed; the page must still equal
    Bokeh's own serialization of the same models."""
    from bokeh.embed import file_html
    from bokeh.resources import CDN

    from prefect_dask_profiling.reports import data as report_data
    from prefect_dask_profiling.reports import html as report_html

    def stage_data(prefix: str, n: int) -> report_data.StageData:
        window = reports.open_window(client, plugin)
        _run(client, prefix, n)
        end = reports.close_window(client, window)
        return report_data.fetch(client, plugin=plugin, start=window.start, stop=end.stop,
                                 first=window.index, last=end.index,
                                 last_count=window.last_count, end_count=end.count,
                                 limit=window.stream_limit)

    big, small = stage_data("big-key", 40), stage_data("small-key", 3)
    small.bandwidth_workers, small.monitor, small.logs = {}, {}, []
    for data, name in ((big, "big"), (small, "small"), (big, "big again")):
        page = report_html.render_html(data, name)
        layout = report_html.LAYOUTS.idle[-1]
        reference = file_html(layout.tabs, resources=CDN, title=report_html.TITLE,
                              template=layout.template)
        assert page_document(page) == page_document(reference), name
        assert f"Stage: {name}" in page
    assert len(_keys(page, "big-key")) == 40 and not _keys(page, "small-key")
