"""The nightly NDVI job as a profiled Prefect flow.

Four stages, each a window in which its work really runs on the flow's Dask cluster:
``read`` (a STAC search, then the scenes' COGs read through GDAL into cluster memory),
``ndvi`` (NDVI with cloud edges masked), ``reduce`` (NaN-aware temporal median) and
``write`` (NDVI series and composite to Zarr). A first run on a fresh data URL also has a
``prepare`` stage that writes the scene archive (COGs and a static STAC catalog).

Run it::

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.nightly_ndvi --size small

``slowdown`` injects a realistic regression into one stage (see :mod:`tasks.raster`); after
a few normal runs, the regression check fails the run and :func:`notify_on_failure` fires.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.request
from typing import Any

from prefect import flow, runtime
from prefect.context import FlowRunContext
from prefect.logging.loggers import flow_run_logger

from prefect_dask_profiling import stage
from prefect_dask_profiling.prefect.runner import (
    ProfiledDaskTaskRunner,
    RegressionDetected,
    profiled,
)
from tasks.raster import (
    catalog_url,
    compute_ndvi,
    data_url_default,
    plan_run,
    prepare_scenes,
    read_scenes,
    reduce_median,
    release_datasets,
    write_outputs,
)
from tasks.scenes import scenes_exist

NOTIFY_URL_ENV = "NDVI_NOTIFY_URL"
DATA_ENDPOINT_ENV = "NDVI_DATA_ENDPOINT"
CLUSTER_KWARGS = {"n_workers": 2, "threads_per_worker": 1, "processes": True,
                  "dashboard_address": ":0"}


def notify_url_for(flow_run) -> str | None:
    """The run's ``notify_url`` parameter, else env ``NDVI_NOTIFY_URL``."""
    return (flow_run.parameters or {}).get("notify_url") or os.environ.get(NOTIFY_URL_ENV)


def notification(flow, flow_run, state) -> dict[str, Any]:
    """What a failure notification says: names, ids, state and cause; nothing secret."""
    cause, regressions = None, []
    try:
        state.result()
    except RegressionDetected as exc:
        cause = "regression"
        regressions = [f"{r.stage}/{r.prefix}" for r in exc.verdicts.itertuples()
                       if r.verdict == "regression"]
    except Exception as exc:
        cause = type(exc).__name__
    return {"flow": flow.name, "flow_run": flow_run.name, "flow_run_id": str(flow_run.id),
            "state": state.name, "message": state.message, "cause": cause,
            "regressions": regressions, "deployment_id": str(flow_run.deployment_id or "")}


def send(url: str, payload: dict[str, Any], timeout: float = 5.0) -> None:
    """POST ``payload`` as JSON to an http(s) URL, or append it as a JSON line to file://."""
    body = json.dumps(payload, default=str)
    if url.startswith("file://"):
        with open(url.removeprefix("file://"), "a", encoding="utf-8") as fh:
            fh.write(body + "\n")
        return
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"notify_url must be http(s):// or file://, got {url!r}")
    request = urllib.request.Request(url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        response.read()


def notify_on_failure(flow, flow_run, state) -> None:
    """``on_failure`` hook: log one line and, if configured, send a webhook notification."""
    logger = flow_run_logger(flow_run, flow)
    payload = notification(flow, flow_run, state)
    logger.error("NOTIFY %s run %s failed (%s): %s", flow.name, flow_run.name,
                 payload["cause"], state.message)
    url = notify_url_for(flow_run)
    if url:
        try:
            send(url, payload)
        except Exception as exc:  # a notification problem must not hide the failure
            logger.warning("notification to %s failed: %r", url.split("?")[0], exc)


@flow(name="nightly-ndvi", version="1", log_prints=True,
      task_runner=ProfiledDaskTaskRunner(cluster_kwargs=CLUSTER_KWARGS, on_regression="fail"),
      on_failure=[notify_on_failure])
@profiled
def nightly_ndvi(size: str = "small", store: str | None = None, data_url: str | None = None,
                 data_storage_options: dict | None = None, slowdown: str = "none",
                 slowdown_stage: str = "read", slowdown_factor: int = 3,
                 notify_url: str | None = None) -> dict[str, Any]:
    """Composite the latest scenes into a median NDVI image, profiled per stage.

    Parameters
    ----------
    size
        ``"tiny"``, ``"small"`` (default, well under a minute on 2 cores) or ``"large"``.
    store
        Run store URL (default env ``DASK_PROFILING_STORE``, else ``./.dask-profiling``).
    data_url
        Where scenes and products live (local folder or ``s3://``; default env
        ``NDVI_DATA_URL``, else ``./.ndvi-data``).
    data_storage_options
        fsspec options for a remote ``data_url`` (e.g. ``{"endpoint_url": ...}``); keep
        credentials in the environment, not in flow parameters.
    slowdown
        ``"none"``, ``"more-tasks"`` (``factor`` x the catalogue items), ``"slower-tasks"``
        (read: GDAL range merging off; write: small output chunks) or
        ``"misaligned-chunks"`` (read chunks not multiples of the COG tiles): inject a
        regression (:mod:`tasks.raster`).
    slowdown_stage
        The stage it hits (``slower-tasks``: read or write; ``misaligned-chunks``: read).
    slowdown_factor
        How many times more scenes / how much smaller the writes (2-10).
    notify_url
        Failure notification target: ``https://...`` webhook or ``file://`` JSON-lines file
        (default env ``NDVI_NOTIFY_URL``).
    """
    plan = plan_run(size, slowdown, slowdown_stage, slowdown_factor)
    data = data_url_default(data_url)
    catalog = catalog_url(data, plan.catalogue)
    products_url = f"{data.rstrip('/')}/products/{size}"
    if plan.slowdown != "none":
        print(f"injected slowdown: {plan.slowdown} in stage {plan.slowdown_stage} "
              f"(factor {plan.factor})")
    if not scenes_exist(data, plan.catalogue, data_storage_options):
        with stage("prepare"):
            prepare_scenes.submit(data, plan.catalogue, data_storage_options).result()
    run_key = f"nightly-ndvi-{runtime.flow_run.id}"
    names = {k: f"{run_key}-{k}" for k in ("scenes", "ndvi", "median")}
    try:
        with stage("read"):
            scenes = read_scenes.submit(catalog, plan, names["scenes"],
                                        data_storage_options).result()
        with stage("ndvi"):
            index = compute_ndvi.submit(names["scenes"], plan, names["ndvi"]).result()
        with stage("reduce"):
            composite = reduce_median.submit(names["ndvi"], plan, names["median"]).result()
        with stage("write"):
            written = write_outputs.submit(names["ndvi"], names["median"], plan, products_url,
                                           data_storage_options).result()
    finally:
        own_cluster = FlowRunContext.get().task_runner.address is None
        release_datasets.submit(list(names.values()), stop_io_threads=own_cluster).result()
    print(f"read {scenes['dims']} ({scenes['mbytes']} MB); ndvi {index['dims']}; "
          f"composite {composite['dims']}; wrote {written['url']}")
    return {"products": written["url"], "scenes": scenes["dims"], "size": size,
            "slowdown": plan.slowdown}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the nightly NDVI flow once.")
    parser.add_argument("--size", default="small")
    parser.add_argument("--store")
    parser.add_argument("--data-url")
    parser.add_argument("--data-endpoint", default=os.environ.get(DATA_ENDPOINT_ENV),
                        help="endpoint of an S3-compatible server holding an s3:// data URL "
                             f"(default env {DATA_ENDPOINT_ENV}); credentials from the "
                             "environment")
    parser.add_argument("--slowdown", default="none")
    parser.add_argument("--slowdown-stage", default="read")
    parser.add_argument("--slowdown-factor", type=int, default=3)
    parser.add_argument("--notify-url")
    args = parser.parse_args(argv)
    options = {"endpoint_url": args.data_endpoint} if args.data_endpoint else None
    state = nightly_ndvi(size=args.size, store=args.store, data_url=args.data_url,
                         data_storage_options=options, slowdown=args.slowdown,
                         slowdown_stage=args.slowdown_stage,
                         slowdown_factor=args.slowdown_factor, notify_url=args.notify_url,
                         return_state=True)
    print(f"flow run {state.name}: {state.message or ''}")
    raise SystemExit(0 if state.is_completed() else 1)


if __name__ == "__main__":
    main()
