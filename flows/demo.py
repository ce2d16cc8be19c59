"""``make demo``: a local Prefect server, a short run history, one injected regression.

What it does, printing progress as it goes:

1. starts ``prefect server start`` on 127.0.0.1:4200 with its UI (SQLite under
   ``.demo/prefect-home``; pid in ``.demo/server.pid``) unless one already answers there;
2. starts a local S3-compatible server (moto, on 127.0.0.1) for the scene archive, unless
   ``--data-url`` points elsewhere: the first run writes Sentinel-2-like COGs and a static
   STAC catalog there, and every run reads them through GDAL over HTTP (``/vsis3/``);
3. runs the nightly NDVI flow several times, each run in its own process against that
   server, on a local Dask cluster, storing to the default run store (or
   ``DASK_PROFILING_STORE``, e.g. ``s3://bucket/prefix``);
4. runs it with a real slowdown injected into one stage (default: the read stage with
   GDAL's range merging off) until the regression check fails a run, at most
   ``--slowdown-runs`` times (default 2): a change that is not conclusive on one night (a
   storage-request blow-up never is: docs/alerts.md) is *suspected* on the first slowed
   night and confirmed on the next, which fails and whose ``on_failure`` hook writes a
   notification;
5. prints the summary table, utilisation per stage, the regression verdicts, where the
   summaries and reports are, and the UI pages to open; saves a screenshot of the summary
   artifact page to ``docs/summary-artifact.png`` (headless Chromium).

``make stop`` (``python -m flows.demo --stop``) stops the server the demo started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / ".demo"
PID_FILE = DEMO / "server.pid"
HOST, PORT = "127.0.0.1", 4200
PIPELINE = "nightly-ndvi"
SCREENSHOT = ROOT / "docs" / "summary-artifact.png"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def api_url(port: int = PORT) -> str:
    return f"http://{HOST}:{port}/api"


def healthy(port: int = PORT) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url(port)}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def prefect_home() -> Path:
    return DEMO / "prefect-home"


# -- the scene archive's S3 server ---------------------------------------------------------------

SCENE_BUCKET = "scenes"
SCENE_PORT = 4571  # a fixed port when free: the workers' AWS_S3_ENDPOINT stays the same


@contextlib.contextmanager
def scene_server():
    """A moto S3 server on 127.0.0.1 with the scene bucket; yields its endpoint URL.

    Credentials are dummies put in the environment, which the flow runs (subprocesses) and
    their Dask workers inherit: GDAL and s3fs read them there.
    """
    import socket

    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "demo")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "demo")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with socket.socket() as probe:
        port = SCENE_PORT if probe.connect_ex((HOST, SCENE_PORT)) != 0 else 0
    server = ThreadedMotoServer(HOST, port, verbose=False)
    server.start()
    try:
        endpoint = f"http://{HOST}:{server._server.server_address[1]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=SCENE_BUCKET)
        say(f"scene archive: moto S3 server at {endpoint} (bucket {SCENE_BUCKET})")
        yield endpoint
    finally:
        server.stop()


# -- server ------------------------------------------------------------------------------------


def start_server(port: int = PORT, timeout: float = 240.0) -> bool:
    """Start a detached Prefect server unless one is healthy on ``port``; True if started."""
    if healthy(port):
        say(f"Prefect server already running at http://{HOST}:{port} - using it")
        return False
    DEMO.mkdir(exist_ok=True)
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    log = DEMO / "server.log"
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    env.update({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_API_URL": api_url(port)})
    prefect = Path(sys.executable).parent / "prefect"
    say(f"starting Prefect server on http://{HOST}:{port} (PREFECT_HOME={rel(home)}, "
        f"log {rel(log)})")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(prefect if prefect.exists() else "prefect"), "server", "start",
             "--host", HOST, "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=ROOT)
    PID_FILE.write_text(str(proc.pid))
    started = time.monotonic()
    while not healthy(port):
        if proc.poll() is not None or time.monotonic() - started > timeout:
            tail = log.read_text(errors="replace")[-1500:]
            stop_server(quiet=True)
            raise SystemExit(f"[demo] the Prefect server did not start (see {rel(log)}):\n"
                             f"{tail}")
        time.sleep(0.5)
    say(f"Prefect server healthy after {time.monotonic() - started:.0f} s "
        f"(pid {proc.pid}, `make stop` stops it)")
    return True


def _is_our_server(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return _alive(pid)  # no /proc: trust the pid file
    return "prefect" in cmdline and "server" in cmdline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_server(quiet: bool = False) -> None:
    """Stop the server recorded in ``.demo/server.pid`` (and its process group)."""
    if not PID_FILE.exists():
        if not quiet:
            say("nothing to stop: no .demo/server.pid (the demo did not start a server)")
        return
    pid = int(PID_FILE.read_text().strip() or 0)
    if pid and _alive(pid) and _is_our_server(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.2)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if not quiet:
            say(f"stopped the Prefect server (pid {pid})")
    elif not quiet:
        say(f"the server recorded in {rel(PID_FILE)} (pid {pid}) is not running")
    PID_FILE.unlink(missing_ok=True)


# -- runs --------------------------------------------------------------------------------------


def run_flow(index: int, total: int, args: argparse.Namespace, slowdown: bool,
             notify: Path) -> dict:
    """One flow run in its own process; returns the stored run's index entry."""
    from prefect_dask_profiling.store.runs import RunStore

    command = [sys.executable, "-m", "flows.nightly_ndvi", "--size", args.size,
               "--data-url", args.data_url, "--notify-url", f"file://{notify}"]
    if args.data_endpoint:
        command += ["--data-endpoint", args.data_endpoint]
    what = "normal"
    if slowdown:
        command += ["--slowdown", args.slowdown, "--slowdown-stage", args.slowdown_stage,
                    "--slowdown-factor", str(args.slowdown_factor)]
        what = f"slowdown {args.slowdown} in stage {args.slowdown_stage}"
    log = DEMO / "runs" / f"run-{index}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"PREFECT_API_URL": api_url(args.port), "PREFECT_HOME": str(prefect_home()),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    say(f"run {index}/{total}: nightly-ndvi size={args.size}, {what} ...")
    before = {r["run_id"] for r in RunStore().list_runs(PIPELINE)}
    started = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.call(command, cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    new = [r for r in RunStore().list_runs(PIPELINE) if r["run_id"] not in before]
    if not new:
        raise SystemExit(f"[demo] run {index} stored nothing (exit code {code}); "
                         f"see {rel(log)}")
    entry = new[0]
    state = "Completed" if code == 0 else "Failed"
    say(f"  -> {state} in {seconds:.0f} s, status {entry['status']}, run {entry['run_id']} "
        f"(log {rel(log)})")
    return entry


def show_results(entries: list[dict], notify: Path, port: int) -> dict:
    """Print summary, utilisation, verdicts, locations; return the last run's manifest."""
    from prefect_dask_profiling.store import layout
    from prefect_dask_profiling.store.runs import RunStore

    store = RunStore()
    pd.set_option("display.width", 140)
    last = entries[-1]
    manifest = store.read_manifest(PIPELINE, last["run_id"])
    summary = store.read_table(PIPELINE, last["run_id"], "tasks")
    cols = ["stage", "prefix", "tasks", "total_s", "p50_s", "p95_s", "gb_out", "share"]
    print()
    say(f"summary of the last run {last['run_id']} (state {manifest['state']}, "
        f"status {manifest['status']}):")
    print(summary[[c for c in cols if c in summary]].head(15).to_string(
        index=False, float_format=lambda v: f"{v:.3f}"))
    rows = {}
    for entry in entries:
        m = store.read_manifest(PIPELINE, entry["run_id"])
        stages = m["utilisation"].get("stages") or {}
        rows[entry["run_id"]] = {"status": m["status"], "wall_s": round(m["wall_s"] or 0, 1),
                                 **stages}
    print()
    say("utilisation per stage (task seconds / thread-seconds in the stage's window):")
    print(pd.DataFrame.from_dict(rows, orient="index").to_string(
        float_format=lambda v: f"{v:.2f}", na_rep="-"))
    verdicts = store.read_table(PIPELINE, last["run_id"], "regression")
    flagged = verdicts[verdicts["verdict"] != "ok"]
    print()
    say(f"regression verdicts of the last run ({len(verdicts)} prefixes checked; "
        f"{(verdicts['verdict'] == 'ok').sum()} ok):")
    vcols = ["stage", "prefix", "verdict", "cause", "baseline_s", "latest_s", "ratio",
             "robust_z", "tasks_ratio", "share"]
    print(flagged[[c for c in vcols if c in flagged]].to_string(
        index=False, float_format=lambda v: f"{v:.2f}") if len(flagged) else "  (none)")
    print()
    say(f"run store: {store.url}")
    run_dir = store.location(layout.run_dir(PIPELINE, last["run_id"])) + "/"
    say(f"  summaries: {run_dir} "
        "(tasks.csv, utilisation.csv, regression.csv, io.csv, trend.html, manifest.json)")
    for s in manifest["stages"]:
        if s.get("report"):
            say(f"  report of stage {s['name']}: {s['report']['location']}")
    if notify.exists():
        lines = notify.read_text().strip().splitlines()
        say(f"on_failure notifications ({rel(notify)}): {len(lines)}; last:")
        print("  " + (lines[-1] if lines else ""))
    return manifest


# -- UI and screenshot ---------------------------------------------------------------------------


def artifact_ids(flow_run_id: str, port: int) -> dict[str, str]:
    """Artifact ids by key for one flow run."""
    body = json.dumps({"artifacts": {"flow_run_id": {"any_": [flow_run_id]}},
                       "limit": 100}).encode()
    request = urllib.request.Request(f"{api_url(port)}/artifacts/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        found = json.loads(response.read())
    return {a["key"]: a["id"] for a in found if a.get("key")}


def find_chromium(install: bool = True) -> str | None:
    """The Chromium binary; install Debian's ``chromium`` with apt-get if allowed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if not install or not shutil.which("apt-get") or os.geteuid() != 0:
        return None
    say("installing chromium with apt-get for the screenshot (about a minute) ...")
    ok = subprocess.call("apt-get update -qq && apt-get install -y -qq chromium",
                         shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return shutil.which("chromium") if ok == 0 else None


def screenshot(url: str, target: Path, chromium: str) -> bool:
    """Save a screenshot of ``url`` with headless Chromium; True on success."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="demo-chromium-") as profile:
        command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                   "--virtual-time-budget=20000", f"--screenshot={target}",
                   "--window-size=1400,900", url]
        try:
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=180, check=False)
        except subprocess.TimeoutExpired:
            return False
    return target.exists() and target.stat().st_size > 0


def show_ui(manifest: dict, port: int, take_screenshot: bool) -> None:
    ui = f"http://{HOST}:{port}"
    flow_run_id = manifest.get("flow_run_id")
    print()
    say(f"Prefect UI: {ui}")
    if not flow_run_id:
        return
    say(f"  the failed run: {ui}/runs/flow-run/{flow_run_id} (Artifacts tab)")
    ids = artifact_ids(flow_run_id, port)
    for key in (f"{PIPELINE}-summary", f"{PIPELINE}-regression", f"{PIPELINE}-run"):
        if key in ids:
            say(f"  {key}: {ui}/artifacts/artifact/{ids[key]}")
    if not take_screenshot:
        return
    key = f"{PIPELINE}-summary"
    if key not in ids:
        say("no summary artifact found: screenshot skipped")
        return
    chromium = find_chromium()
    if chromium is None:
        say("screenshot skipped: chromium is not installed and could not be installed "
            "(apt-get install chromium)")
        return
    if screenshot(f"{ui}/artifacts/artifact/{ids[key]}", SCREENSHOT, chromium):
        say(f"screenshot of the summary artifact page: {rel(SCREENSHOT)}")
    else:
        say("screenshot failed (chromium did not write the file)")


# -- main ---------------------------------------------------------------------------------------


def rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop", action="store_true", help="stop the demo's Prefect server")
    parser.add_argument("--runs", type=int, default=4, help="normal runs before the slowdown")
    parser.add_argument("--size", default="small")
    parser.add_argument("--slowdown", default="slower-tasks")
    parser.add_argument("--slowdown-stage", default="read")
    parser.add_argument("--slowdown-factor", type=int, default=3)
    parser.add_argument("--slowdown-runs", type=int, default=2,
                        help="slowed runs at most: they stop at the first that is not "
                             "suspected (a suspicion waits for the next night)")
    parser.add_argument("--data-url", default=os.environ.get("NDVI_DATA_URL"),
                        help="where the scenes live (default: a bucket on a local moto "
                             "S3 server the demo starts)")
    parser.add_argument("--data-endpoint", default=os.environ.get("NDVI_DATA_ENDPOINT"))
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--no-screenshot", action="store_true")
    args = parser.parse_args(argv)
    if args.runs < 3:
        parser.error("--runs must be at least 3: the regression check needs 3 earlier runs")
    if args.slowdown_runs < 1:
        parser.error("--slowdown-runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.stop:
        stop_server()
        return
    from tasks.raster import plan_run

    plan_run(args.size, args.slowdown, args.slowdown_stage, args.slowdown_factor)  # validate
    DEMO.mkdir(exist_ok=True)
    notify = DEMO / "notifications.jsonl"
    start_server(args.port)
    from prefect_dask_profiling.store.runs import RunStore

    with contextlib.ExitStack() as stack:
        if args.data_url is None:
            args.data_endpoint = stack.enter_context(scene_server())
            args.data_url = f"s3://{SCENE_BUCKET}/data"
        say(f"run store: {RunStore().url} (set DASK_PROFILING_STORE=s3://bucket/prefix for "
            f"S3); data: {args.data_url}" + (f" on {args.data_endpoint}"
                                             if args.data_endpoint else ""))
        total = args.runs + args.slowdown_runs
        entries = [run_flow(i + 1, total, args, slowdown=False, notify=notify)
                   for i in range(args.runs)]
        for night in range(args.slowdown_runs):
            entries.append(run_flow(args.runs + night + 1, total, args, slowdown=True,
                                    notify=notify))
            if entries[-1]["status"] != "suspected":
                break
            say("  suspected: a change not conclusive on one night waits for the next to "
                "confirm it (docs/alerts.md)")
    manifest = show_results(entries, notify, args.port)
    show_ui(manifest, args.port, take_screenshot=not args.no_screenshot)
    last = entries[-1]
    if last["status"] != "regressed":
        say(f"note: the injected slowdown did not fail a run (status {last['status']}); "
            "see the verdicts above")
    say("done. `make stop` stops the Prefect server.")


if __name__ == "__main__":
    main()
