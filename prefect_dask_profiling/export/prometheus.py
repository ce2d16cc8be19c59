"""The latest run of each pipeline as Prometheus gauges: a textfile or a Pushgateway push.

Every metric is defined with its labels and help in :func:`build_registry` (the docs:
beyond-one-night.md, memory.md, cost.md). The textfile is written by
``prometheus_client.write_to_textfile`` (renamed into place); a push sends each pipeline
under its own grouping key (``job``, ``pipeline``), so it never erases another's."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.regression.alerts import Episode
from prefect_dask_profiling.store.manifest import Manifest
from prefect_dask_profiling.store.runs import RunStore, StoreError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Gauge


logger = logging.getLogger(__name__)

DEFAULT_JOB = "dask_profiling"
FLAGGED = ("regression", "drift", "improved")
# Runs that say something about the pipeline's speed (``acknowledged``: a known regression
# that failed nothing); incomplete ones are skipped.
EXPORTED_STATUSES = ("healthy", "regressed", "acknowledged", "failed", "unjudged")
# Judged runs replayed for the open alert episodes of each pipeline (a few weeks of nights).
ALERT_LOOKBACK_RUNS = 30
# (key of an ``allocation`` row, divisor, gauge, help) of the allocation gauges
ALLOCATION_GAUGES = (
    ("worker_s", 3600.0, "dask_profiling_allocated_worker_hours", "Worker-hours the cluster "
     "allocated, per stage, outside stages and for the latest run"),
    ("thread_s", 3600.0, "dask_profiling_allocated_thread_hours", "Thread-hours the cluster "
     "allocated, latest run"),
    ("gib_h", 1.0, "dask_profiling_allocated_memory_gib_hours", "GiB-hours of the workers' "
     "memory limits, latest run"),
    ("idle_s", 3600.0, "dask_profiling_idle_thread_hours", "Thread-hours allocated but not "
     "computing tasks, latest run"),
    ("idle_share", 1.0, "dask_profiling_idle_ratio", "Idle / allocated thread-hours, latest "
     "run"),
)
# (key of the stage's ``io`` entry, gauge, help) of the per-stage storage gauges
STORAGE_GAUGES = (
    ("requests", "dask_profiling_stage_storage_requests", "GDAL storage requests (GET + HEAD "
     "+ LIST) while the stage ran, latest run"),
    ("requests_per_chunk", "dask_profiling_stage_storage_requests_per_chunk", "GDAL storage "
     "requests per chunk read while the stage ran, latest run"),
    ("bytes", "dask_profiling_stage_storage_bytes", "Bytes GDAL downloaded from storage "
     "while the stage ran, latest run"),
    ("bytes_per_chunk", "dask_profiling_stage_storage_bytes_per_chunk", "Bytes GDAL "
     "downloaded per chunk read while the stage ran, latest run"),
    ("read_amplification", "dask_profiling_stage_read_amplification_ratio", "Bytes GDAL "
     "downloaded / bytes of decoded pixels while the stage ran, latest run"),
    ("s3fs_requests", "dask_profiling_stage_s3fs_requests", "s3fs storage requests while "
     "the stage ran, latest run"),
    ("s3fs_bytes", "dask_profiling_stage_s3fs_bytes", "Bytes s3fs downloaded while the "
     "stage ran, latest run"),
)


@dataclass
class LatestRun:
    """The newest exportable run of one pipeline: manifest, per-prefix table, verdicts."""

    pipeline: str
    manifest: Manifest
    tasks: pd.DataFrame
    verdicts: pd.DataFrame
    episodes: list[Episode] = field(default_factory=list)


def latest_runs(store: RunStore, pipeline: str | None = None) -> list[LatestRun]:
    """The newest exportable run of each pipeline (or of ``pipeline``).

    A pipeline whose newest runs cannot be read falls back to the next one, with a warning;
    ``StoreError`` when ``pipeline`` has no run at all.
    """
    names = [pipeline] if pipeline else store.list_pipelines()
    out = []
    for name in names:
        runs = [r for r in store.list_runs(name) if r["status"] in EXPORTED_STATUSES]
        if pipeline and not runs:
            raise StoreError(f"no exportable run of pipeline {name!r} in {store.url}")
        for entry in runs:
            try:
                run = _read_run(store, name, entry["run_id"])
            except StoreError as exc:
                logger.warning("prometheus export: skipping run %s of %s: %s",
                               entry["run_id"], name, exc)
                continue
            run.episodes = _open_episodes(store, name, entry["version"])
            out.append(run)
            break
    return out


def _open_episodes(store: RunStore, pipeline: str, version: str) -> list[Episode]:
    """The open alert episodes of ``pipeline``/``version``; none (with a warning) when the
    store cannot be read."""
    from prefect_dask_profiling.regression.alert_history import episodes_of

    try:
        book, _ = episodes_of(store, pipeline, version, runs=ALERT_LOOKBACK_RUNS)
    except StoreError as exc:
        logger.warning("prometheus export: no alert episodes of %s: %s", pipeline, exc)
        return []
    return book.open()


def build_registry(runs: list[LatestRun]) -> CollectorRegistry:
    """A fresh registry holding the metrics of ``runs``."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    prefix_labels = ["pipeline", "version", "stage", "prefix"]
    verdict_labels = ["pipeline", "stage", "prefix", "verdict"]

    def gauge(name: str, doc: str, labels: list[str]) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    seconds = gauge("dask_profiling_prefix_seconds", "Total task seconds of a key prefix in "
                    "the latest run", prefix_labels)
    tasks = gauge("dask_profiling_prefix_tasks", "Tasks of a key prefix in the latest run",
                  prefix_labels)
    p95 = gauge("dask_profiling_prefix_p95_seconds", "95th percentile task seconds of a key "
                "prefix in the latest run", prefix_labels)
    stage_util = gauge("dask_profiling_stage_utilisation_ratio", "Task seconds / thread "
                       "seconds available, per stage of the latest run", ["pipeline", "stage"])
    run_util = gauge("dask_profiling_run_utilisation_ratio", "Task seconds / thread seconds "
                     "available over the latest run", ["pipeline"])
    wall = gauge("dask_profiling_run_wall_seconds", "Wall time of the latest run",
                 ["pipeline"])
    stamp = gauge("dask_profiling_run_timestamp_seconds", "Start of the latest run, Unix time",
                  ["pipeline"])
    healthy = gauge("dask_profiling_run_healthy", "1 when the latest run is healthy",
                    ["pipeline", "status"])
    peak = gauge("dask_profiling_stage_memory_peak_bytes", "Largest worker process memory "
                 "while the stage ran, latest run", ["pipeline", "stage"])
    headroom = gauge("dask_profiling_stage_memory_headroom_ratio", "Min over workers of "
                     "(memory limit - peak) / limit while the stage ran, latest run",
                     ["pipeline", "stage"])
    spilled = gauge("dask_profiling_stage_spilled_bytes", "Bytes spilled to disk while the "
                    "stage ran, latest run", ["pipeline", "stage"])
    storage = {key: gauge(name, doc, ["pipeline", "stage"])
               for key, name, doc in STORAGE_GAUGES}
    deaths = gauge("dask_profiling_run_worker_deaths", "Workers that died with tasks of the "
                   "latest run on them", ["pipeline", "kind"])
    flagged = gauge("dask_profiling_regression", "1 for a prefix judged regression or drift "
                    "in the latest run (0 for improved)", verdict_labels)
    ratio = gauge("dask_profiling_regression_ratio", "Ratio to the baseline of a flagged "
                  "prefix in the latest run", verdict_labels)
    alert = gauge("dask_profiling_alert", "1 for each open alert episode (suspected, "
                  "confirmed or acknowledged)", ["pipeline", "version", "stage", "prefix",
                                                 "metric", "episode", "state"])
    allocated = {key: (scale, gauge(name, doc, ["pipeline", "scope"]))
                 for key, scale, name, doc in ALLOCATION_GAUGES}
    cost = (gauge("dask_profiling_cost_estimate", "Estimated cost at the run's own rates "
                  "(cost= on the runner), latest run", ["pipeline", "scope", "currency"])
            if any(_rates(run.manifest) for run in runs) else None)
    for run in runs:
        m, p = run.manifest, run.pipeline
        _set_allocation(allocated, cost, p, m)
        version = str(m.get("version", ""))
        for row in run.tasks.itertuples(index=False):
            labels = (p, version, str(row.stage), str(row.prefix))
            _set(seconds, labels, getattr(row, "total_s", None))
            _set(tasks, labels, getattr(row, "tasks", None))
            _set(p95, labels, getattr(row, "p95_s", None))
        util = m.get("utilisation") or {}
        for stage, value in (util.get("stages") or {}).items():
            _set(stage_util, (p, str(stage)), value)
        _set(run_util, (p,), util.get("run"))
        _set(wall, (p,), m.get("wall_s"))
        _set(stamp, (p,), _timestamp(m.get("started")))
        _set(healthy, (p, str(m.get("status"))), 1.0 if m.get("status") == "healthy" else 0.0)
        for info in m.get("stages") or []:
            memory = info.get("memory") if isinstance(info, dict) else None
            if isinstance(memory, dict) and memory.get("workers"):
                labels = (p, str(info.get("name")))
                _set(peak, labels, memory.get("peak_bytes"))
                _set(headroom, labels, memory.get("headroom"))
                _set(spilled, labels, memory.get("spilled_bytes"))
            _set_storage(storage, p, info)
        kinds = {"suspected OOM": 0, "worker lost": 0}
        for incident in m.get("incidents") or []:
            kind = str(incident.get("kind")) if isinstance(incident, dict) else "worker lost"
            kinds[kind] = kinds.get(kind, 0) + 1
        for kind, n in kinds.items():
            _set(deaths, (p, kind), n)
        for row in run.verdicts.itertuples(index=False):
            if row.verdict not in FLAGGED:
                continue
            labels = (p, str(row.stage), str(row.prefix), str(row.verdict))
            _set(flagged, labels, 0.0 if row.verdict == "improved" else 1.0)
            _set(ratio, labels, getattr(row, "ratio", None))
        for ep in run.episodes:
            _set(alert, (p, ep.version, ep.stage, ep.prefix, ep.metric, ep.id, ep.state), 1.0)
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """The registry in the Prometheus text exposition format."""
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


def write_textfile(registry: CollectorRegistry, path: str) -> None:
    """Write the metrics atomically (for node-exporter's textfile collector)."""
    from prometheus_client import write_to_textfile

    if not str(path).endswith(".prom"):
        logger.warning("node-exporter's textfile collector only reads *.prom files: %s", path)
    write_to_textfile(str(path), registry)


def push(runs: list[LatestRun], gateway: str, job: str = DEFAULT_JOB,
         timeout: float = 10.0) -> list[str]:
    """Push each run's metrics to a Pushgateway, grouped by pipeline; the pipelines pushed."""
    from prometheus_client import push_to_gateway

    if not gateway or not isinstance(gateway, str):
        raise InvalidInput(f"gateway must be a URL such as http://pushgateway:9091, "
                           f"got {gateway!r}")
    pushed = []
    for run in runs:
        push_to_gateway(gateway, job=job, registry=build_registry([run]),
                        grouping_key={"pipeline": run.pipeline}, timeout=timeout)
        pushed.append(run.pipeline)
    return pushed


def _read_run(store: RunStore, pipeline: str, run_id: str) -> LatestRun:
    manifest = store.read_manifest(pipeline, run_id)
    tasks = store.read_table(pipeline, run_id, "tasks")
    frames = []
    for name in ("regression", "drift"):
        if f"{name}.csv" in manifest["files"]:
            frames.append(store.read_table(pipeline, run_id, name))
    verdicts = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["stage", "prefix", "verdict", "ratio"])
    if "ratio" not in verdicts.columns:
        verdicts["ratio"] = float("nan")
    if "cumulative_ratio" in verdicts.columns:  # drift rows carry their cumulative ratio
        verdicts["ratio"] = verdicts["ratio"].fillna(verdicts["cumulative_ratio"])
    return LatestRun(pipeline, manifest, tasks, verdicts)


def _set_storage(gauges: dict[str, Gauge], pipeline: str, info: dict[str, Any]) -> None:
    """Set the storage gauges (by ``io`` key) of one manifest stage entry; a key absent from
    its ``io`` (the source was not loaded), or no ``io`` at all (old runs), sets nothing."""
    io = info.get("io") if isinstance(info, dict) else None
    if not isinstance(io, dict):
        return
    labels = (pipeline, str(info.get("name")))
    for key, gauge in gauges.items():
        _set(gauge, labels, io.get(key))


def _rates(manifest: Manifest) -> dict[str, Any] | None:
    """The rates a run was priced at (``None``: not priced, or stored before)."""
    doc = manifest.get("allocation")
    rates = doc.get("rates") if isinstance(doc, dict) else None
    return rates if isinstance(rates, dict) else None


def _set_allocation(gauges: dict[str, tuple[float, Gauge]], cost: Gauge | None,
                    pipeline: str, manifest: Manifest) -> None:
    """The allocation gauges of one run: every stage, the outside row and the run; the
    cost only when the run was priced."""
    doc = manifest.get("allocation")
    if not isinstance(doc, dict) or not isinstance(doc.get("run"), dict):
        return
    rates = _rates(manifest)
    rows: list[Mapping[str, Any]] = [*(doc.get("stages") or []), doc.get("outside") or {},
                                     doc["run"]]  # read by gauge key
    for row in rows:
        if not isinstance(row, dict) or not row.get("scope"):
            continue
        labels = (pipeline, str(row["scope"]))
        for key, (scale, gauge) in gauges.items():
            value = row.get(key)
            _set(gauge, labels, None if value is None else float(value) / scale)
        if cost is not None and rates is not None:
            _set(cost, (*labels, str(rates.get("currency", ""))), row.get("cost"))


def _set(gauge: Any, labels: tuple, value: Any) -> None:
    """Set a labelled gauge; missing or non-finite values are left out, not exported."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return
    if math.isfinite(number):
        gauge.labels(*labels).set(number)


def _timestamp(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None
