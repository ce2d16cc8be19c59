"""The screenshot of docs/observability.md: a regressed night of the reference NDVI flow in
the trace view of a real OpenTelemetry receiver (issue 59).

What it does, everything on 127.0.0.1 and stopped at the end (process groups):

1. starts Arize Phoenix (``tests/helpers/otel_receiver.py``: OTLP/HTTP receiver, REST API, UI), a
   Prefect server without UI (``tests/helpers/prefect_server.py``) and a moto S3 server holding the
   scene archive;
2. configures the OpenTelemetry SDK in this process as a user would (a ``TracerProvider``
   with a ``BatchSpanProcessor`` and the OTLP/HTTP exporter pointed at Phoenix; project
   ``nightly-ndvi``), then runs :func:`flows.nightly_ndvi.nightly_ndvi` (its own cluster of
   2 worker processes, COGs read through GDAL from the S3 server) ``--nights`` times, then
   once with the read stage slowed (10x the scenes, as tests/helpers/ndvi_fixtures.py ``SLOWED``):
   that night regresses and fails;
3. finds the regressed night's trace on Phoenix's REST API (the trace of the stage span
   whose status is ERROR), opens Phoenix's trace view of it in headless Chromium (driven
   over the DevTools protocol), waits until the span tree shows every stage, selects the
   ERROR stage span and saves the page as a PNG (default ``docs/otel-trace.png``).

Run (about 7 minutes here, most of it the four flow runs)::

    PYTHONPATH=. .venv/bin/python benchmarks/otel_screenshot.py [--nights 3] [--out PATH]

``--workdir DIR --keep-data`` keeps Phoenix's database in DIR; ``--workdir DIR --no-flows``
then only takes the screenshot again from it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PROJECT = "nightly-ndvi"
OUT = ROOT / "docs" / "otel-trace.png"
STAGES = ("read", "ndvi", "reduce", "write")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def say(message: str) -> None:
    print(f"[otel-screenshot] {message}", flush=True)


# -- the nights ----------------------------------------------------------------------------


def run_nights(phoenix: Any, nights: int, size: str, scratch: Path) -> None:
    """``nights`` healthy nights then a slowed one, exported to ``phoenix``."""
    from helpers.ndvi_fixtures import BUCKET, SLOWED
    from helpers.otel_sdk import sdk_provider
    from helpers.prefect_server import running_server, use_server
    from helpers.s3_servers import KEY, SECRET, boto_client, moto_server
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from flows.nightly_ndvi import nightly_ndvi

    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto: a line per request
    exporter = OTLPSpanExporter(endpoint=phoenix.traces_endpoint, timeout=10)
    resource = Resource.create({"openinference.project.name": PROJECT,
                                "service.name": PROJECT})
    with running_server(ui=False) as server, use_server(server), moto_server() as s3, \
            sdk_provider(exporter, BatchSpanProcessor, resource=resource) as (provider, _):
        boto_client(s3).create_bucket(Bucket=BUCKET)
        common = {"size": size, "store": str(scratch / "store"),
                  "data_url": f"s3://{BUCKET}/data",
                  "data_storage_options": {"endpoint_url": s3},
                  "notify_url": f"file://{scratch / 'notify.jsonl'}"}
        for night in range(1, nights + 2):
            slowed = SLOWED if night > nights else {}
            t0 = time.perf_counter()
            state = nightly_ndvi(**common, **slowed, return_state=True)
            say(f"night {night}/{nights + 1}{' (read slowed)' if slowed else ''}: "
                f"{state.name} in {time.perf_counter() - t0:.0f} s")
        provider.force_flush()
    if not state.is_failed():
        raise SystemExit(f"the slowed night did not regress ({state.name}: {state.message})")


def regressed_trace(phoenix: Any, timeout: float = 60.0) -> tuple[str, dict]:
    """The trace id of the regressed night and its ERROR stage span, read from Phoenix."""
    deadline = time.monotonic() + timeout
    while True:  # the receiver stores what it was sent a moment after
        errors = [s for s in phoenix.spans(PROJECT) if s["status_code"] == "ERROR"
                  and s["name"].startswith("dask-profiling stage ")]
        if errors:
            span = errors[-1]
            return span["context"]["trace_id"], span
        if time.monotonic() > deadline:
            raise SystemExit(f"no ERROR stage span in Phoenix's project {PROJECT}")
        time.sleep(1)


# -- the screenshot ------------------------------------------------------------------------


class DevTools:
    """One page of a headless Chromium, driven over the DevTools protocol (a websocket)."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=None, open_timeout=30)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive in between; the answer carries our id
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText : ''")
                raise SystemExit(f"Chromium: {what} not seen in {timeout:.0f} s; the page "
                                 f"shows:\n{(text or '')[:1500]}")
            time.sleep(1)


@contextlib.contextmanager
def chromium_page(width: int, height: int) -> Iterator[DevTools]:
    """A headless Chromium with a DevTools port, its first page; stopped on exit."""
    import httpx
    from helpers.processes import stop_process_group

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="otel-chromium-") as profile:
        proc = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            start_new_session=True)
        try:
            port_file, deadline = Path(profile) / "DevToolsActivePort", time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("chromium did not open its DevTools port")
                time.sleep(0.2)
            port = port_file.read_text().split()[0]
            [page] = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json()
                      if t["type"] == "page"][:1]
            tools = DevTools(page["webSocketDebuggerUrl"])
            try:
                tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                           deviceScaleFactor=1, mobile=False)
                yield tools
            finally:
                tools.ws.close()
        finally:
            stop_process_group(proc)


def screenshot(phoenix: Any, trace_id: str, error_span: dict, out: Path, width: int,
               height: int) -> None:
    """Phoenix's trace view of ``trace_id``, the ERROR stage span selected, as a PNG."""
    names = [f"dask-profiling stage {s}" for s in STAGES]
    with chromium_page(width, height) as page:
        page.call("Page.enable")
        page.call("Page.navigate", url=f"{phoenix.url}/redirects/traces/{trace_id}")
        page.wait_for(f"document.body && {json.dumps(names)}.every("
                      "n => document.body.innerText.includes(n))", "the span tree")
        clicked = page.evaluate(f"""(() => {{
            const name = {json.dumps(error_span['name'])};
            const hits = [...document.querySelectorAll('*')].filter(e =>
                e.children.length === 0 && e.textContent.trim() === name);
            if (!hits.length) return false;
            hits[0].click();
            return true;
        }})()""")
        if clicked:
            message = error_span["status_message"][:24]
            page.wait_for(f"document.body.innerText.includes({json.dumps(message)})",
                          "the selected span's status message", timeout=30)
        time.sleep(2)  # the detail pane's last paint
        shot = page.call("Page.captureScreenshot", format="png")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(shot["data"]))
    optimise(out)


def optimise(path: Path) -> None:
    """A palette PNG when it is smaller (a UI screenshot has few colours)."""
    from PIL import Image

    with Image.open(path) as image:
        image.load()
    quantized = path.with_suffix(".q.png")
    image.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE).save(
        quantized, optimize=True)
    if quantized.stat().st_size < path.stat().st_size:
        quantized.replace(path)
    else:
        quantized.unlink()


# -- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=3, help="healthy nights before the "
                        "slowed one (the regression check needs 3)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "small", "large"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--workdir", type=Path, help="Phoenix's working directory "
                        "(default: a temporary one)")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep --workdir (Phoenix's database) afterwards")
    parser.add_argument("--no-flows", action="store_true",
                        help="screenshot what --workdir's Phoenix already holds")
    args = parser.parse_args(argv)
    if args.nights < 3:
        parser.error("--nights must be at least 3: the regression check needs 3 earlier runs")
    if args.no_flows and args.workdir is None:
        parser.error("--no-flows needs --workdir (a Phoenix database kept with --keep-data)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on `timeout`

    from helpers.otel_receiver import running_phoenix

    with tempfile.TemporaryDirectory(prefix="otel-screenshot-") as scratch:
        workdir = args.workdir or Path(scratch) / "phoenix"
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            with running_phoenix(workdir) as phoenix:
                say(f"Phoenix at {phoenix.url} (working directory {workdir})")
                if not args.no_flows:
                    run_nights(phoenix, args.nights, args.size, Path(scratch))
                trace_id, span = regressed_trace(phoenix)
                say(f"regressed night: trace {trace_id}, {span['name']}: "
                    f"{span['status_message'][:100]}")
                screenshot(phoenix, trace_id, span, args.out, args.width, args.height)
                say(f"saved {args.out} ({args.out.stat().st_size // 1024} KiB)")
        finally:
            if args.workdir is not None and not args.keep_data and not args.no_flows:
                shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
