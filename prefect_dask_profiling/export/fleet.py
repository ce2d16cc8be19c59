"""A fleet-wide Parquet view of every run: ``<store>/fleet/pipeline=<name>/<run_id>.parquet``.

One row per (run, stage, prefix), with the run's identity, status, utilisation,
bottleneck, the stage's memory (``stage_peak_bytes``, ``stage_headroom``,
``stage_spilled_bytes``, ``stage_worker_deaths``) and the stage's storage requests
(:data:`STORAGE_COLUMNS`, from the manifest's ``stages[].io``), so that one call reads every
run of every pipeline::

    pandas.read_parquet("s3://bucket/prefix/fleet", storage_options={...})

The storage columns are the stage's figures summed over its workers, GDAL's unless named
s3fs: ``stage_requests`` (GET + HEAD + LIST), ``stage_get_requests``, ``stage_head_requests``,
``stage_list_requests``, ``stage_bytes_fetched`` (downloaded), ``stage_chunks_read`` (chunks
that fetched), ``stage_requests_per_chunk``, ``stage_bytes_per_chunk``,
``stage_read_amplification`` (bytes fetched / bytes of decoded pixels),
``stage_s3fs_requests`` and ``stage_s3fs_bytes``. A stage whose source was not loaded on any
worker (or a run stored before storage requests were counted) has null there, never 0.

What the cluster allocated (:data:`ALLOCATION_COLUMNS`, from the manifest's ``allocation``)
comes per stage and for the run: ``stage_worker_hours`` / ``run_worker_hours``,
``..._thread_hours``, ``..._gib_hours`` (memory limits), ``..._idle_thread_hours``,
``..._idle_share`` and ``..._cost`` with ``cost_currency``; cost is null unless the run was
priced (``cost=`` on the runner), never 0.

Each run writes its own file (no read-modify-write, so concurrent runs never race); the
folder name ``pipeline=<name>`` is Hive partitioning: readers get ``pipeline`` as a column
and can skip other pipelines' files. Every file has the same explicit Arrow schema
(:data:`COLUMNS`), so a run without a bottleneck (null) and one with (text) read
together. Files written before a column existed lack it; pyarrow infers a dataset's schema
from one file, so :func:`read_fleet` reads with :func:`dataset_schema` instead: old and new
files read together, the old ones null in the new columns. The view is derived:
``dask-profiling fleet --rebuild`` writes it again from the stored runs.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast, overload

import pandas as pd

from prefect_dask_profiling._util import float_or_nan, validate_name
from prefect_dask_profiling.errors import DamagedRecord
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.manifest import Manifest
from prefect_dask_profiling.store.runs import RunStore, StoreError

if TYPE_CHECKING:
    from pandas.api.extensions import ExtensionArray

    from prefect_dask_profiling.summary.io import StageIO
    from prefect_dask_profiling.summary.memory import StageMemory

logger = logging.getLogger(__name__)

# (column, key of the stage's ``io`` entry, Arrow type): GDAL's figures unless named s3fs
STORAGE_COLUMNS: tuple[tuple[str, str, Literal["int64", "float64"]], ...] = (
    ("stage_requests", "requests", "int64"), ("stage_get_requests", "get", "int64"),
    ("stage_head_requests", "head", "int64"), ("stage_list_requests", "list", "int64"),
    ("stage_bytes_fetched", "bytes", "int64"), ("stage_chunks_read", "chunks", "int64"),
    ("stage_requests_per_chunk", "requests_per_chunk", "float64"),
    ("stage_bytes_per_chunk", "bytes_per_chunk", "float64"),
    ("stage_read_amplification", "read_amplification", "float64"),
    ("stage_s3fs_requests", "s3fs_requests", "int64"),
    ("stage_s3fs_bytes", "s3fs_bytes", "int64"),
)
# What the cluster allocated (the manifest's ``allocation``): per stage and for the run,
# the stage's values repeated on each of its prefix rows; cost null unless the run was priced
ALLOCATION_COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("worker_hours", "worker_s", 3600.0), ("thread_hours", "thread_s", 3600.0),
    ("gib_hours", "gib_h", 1.0), ("idle_thread_hours", "idle_s", 3600.0),
    ("idle_share", "idle_share", 1.0), ("cost", "cost", 1.0),
)
ALLOCATION_FIELDS = [f"{scope}_{column}" for scope in ("stage", "run")
                     for column, _, _ in ALLOCATION_COLUMNS]
COLUMNS = ["version", "run_id", "started", "status", "stage", "prefix", "tasks", "total_s",
           "p50_s", "p95_s", "gb_out", "share", "utilisation", "stage_utilisation",
           "bottleneck", "stage_peak_bytes", "stage_headroom", "stage_spilled_bytes",
           "stage_worker_deaths", *(column for column, _, _ in STORAGE_COLUMNS),
           *ALLOCATION_FIELDS, "cost_currency"]


def _schema():
    import pyarrow as pa

    return pa.schema([
        ("version", pa.string()), ("run_id", pa.string()),
        ("started", pa.timestamp("us", tz="UTC")), ("status", pa.string()),
        ("stage", pa.string()), ("prefix", pa.string()), ("tasks", pa.int64()),
        ("total_s", pa.float64()), ("p50_s", pa.float64()), ("p95_s", pa.float64()),
        ("gb_out", pa.float64()), ("share", pa.float64()), ("utilisation", pa.float64()),
        ("stage_utilisation", pa.float64()), ("bottleneck", pa.string()),
        ("stage_peak_bytes", pa.float64()), ("stage_headroom", pa.float64()),
        ("stage_spilled_bytes", pa.float64()), ("stage_worker_deaths", pa.int64()),
        *((column, pa.type_for_alias(kind)) for column, _, kind in STORAGE_COLUMNS),
        *((column, pa.float64()) for column in ALLOCATION_FIELDS),
        ("cost_currency", pa.string()),
    ])


def dataset_schema():
    """The Arrow schema of the whole view: every file's columns and the ``pipeline`` partition.

    Pass it as ``schema=`` to ``pandas.read_parquet`` when the folder may hold files written
    before a column existed: those read as null in it, where pyarrow's own inference (from
    one file) could leave the column out of every row.
    """
    import pyarrow as pa

    return _schema().append(pa.field("pipeline", pa.string()))


def fleet_rows(manifest: Manifest, tasks: pd.DataFrame) -> pd.DataFrame:
    """The fleet rows of one run: its per-prefix table with the run's fields added.

    Parameters
    ----------
    manifest
        The run's manifest (``run_id``, ``pipeline``, ``version``, ``status``, ``started``,
        ``utilisation``; ``stages[].diagnosis.primary`` when the stage was diagnosed, which
        gives the row's ``bottleneck``; else a run-level ``bottleneck`` if any, else null;
        ``stages[].memory`` and ``stages[].io`` give the stage's memory and storage
        columns, null where the entry or its key is absent).
    tasks
        The run's ``tasks`` table (``stage, prefix, tasks, total_s, p50_s, p95_s, gb_out``,
        ``share`` when present; a missing share is computed from ``total_s``).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS` (``pipeline`` is the partition, not a column of the file).
    """
    missing = [k for k in ("run_id", "pipeline", "version", "status") if k not in manifest]
    if missing:
        raise DamagedRecord(f"manifest lacks {', '.join(missing)}")
    need = ["stage", "prefix", "tasks", "total_s"]
    absent = [c for c in need if c not in tasks.columns]
    if absent:
        raise DamagedRecord(f"tasks table of run {manifest['run_id']} lacks {', '.join(absent)}")
    util = manifest.get("utilisation") or {}
    stage_util = util.get("stages") or {}
    out = pd.DataFrame({
        "stage": tasks["stage"].astype(str), "prefix": tasks["prefix"].astype(str),
        "tasks": pd.to_numeric(tasks["tasks"], errors="coerce").fillna(0).astype("int64"),
    })
    for col in ("total_s", "p50_s", "p95_s", "gb_out"):
        out[col] = pd.to_numeric(tasks[col], errors="coerce") if col in tasks.columns \
            else float("nan")
    if "share" in tasks.columns:
        out["share"] = pd.to_numeric(tasks["share"], errors="coerce")
    else:
        total = float(out["total_s"].sum())
        out["share"] = out["total_s"] / total if total > 0 else float("nan")
    out["version"] = str(manifest["version"])
    out["run_id"] = str(manifest["run_id"])
    out["started"] = pd.to_datetime(manifest.get("started"), utc=True)
    out["status"] = str(manifest["status"])
    out["utilisation"] = float_or_nan(util.get("run"))
    out["stage_utilisation"] = [float_or_nan(stage_util.get(s)) for s in out["stage"]]
    by_stage = _stage_bottlenecks(manifest)
    run_level = _bottleneck(manifest)
    out["bottleneck"] = [by_stage.get(stage, run_level) for stage in out["stage"]]
    memory: Mapping[str, Mapping[str, object]] = _stage_entries(manifest, "memory")
    for column, key in (("stage_peak_bytes", "peak_bytes"), ("stage_headroom", "headroom"),
                        ("stage_spilled_bytes", "spilled_bytes")):
        out[column] = [float_or_nan(memory.get(stage, {}).get(key)) for stage in out["stage"]]
    storage: Mapping[str, Mapping[str, object]] = _stage_entries(manifest, "io")
    for column, key, kind in STORAGE_COLUMNS:
        out[column] = _nullable([storage.get(stage, {}).get(key) for stage in out["stage"]],
                                kind)
    deaths = _stage_deaths(manifest)
    out["stage_worker_deaths"] = [deaths.get(stage, 0) for stage in out["stage"]]
    _allocation_columns(out, manifest)
    return out[COLUMNS].reset_index(drop=True)


def _allocation_columns(out: pd.DataFrame, manifest: Manifest) -> None:
    """The stage's and the run's allocation (:data:`ALLOCATION_COLUMNS`) on every row; null
    for runs stored before allocations, and cost null unless the run was priced."""
    stored = manifest.get("allocation")
    doc: dict[str, Any] = stored if isinstance(stored, dict) else {}
    stages: Mapping[str, Mapping[str, object]] = _stage_entries(manifest, "allocation")
    run: Mapping[str, object] = doc.get("run") or {}  # read by column key
    for column, key, scale in ALLOCATION_COLUMNS:
        out[f"run_{column}"] = float_or_nan(run.get(key)) / scale
        out[f"stage_{column}"] = [float_or_nan(stages.get(stage, {}).get(key)) / scale
                                  for stage in out["stage"]]
    rates = doc.get("rates")
    out["cost_currency"] = rates.get("currency") if isinstance(rates, dict) else None


def to_parquet(rows: pd.DataFrame) -> bytes:
    """``rows`` (columns :data:`COLUMNS`) as Parquet bytes with the fleet schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(rows[COLUMNS], schema=_schema(), preserve_index=False)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def fleet_location(store: RunStore, pipeline: str | None = None,
                   run_id: str | None = None) -> str:
    """Where the fleet view (or one pipeline's partition, or one run's file) is: a path or
    URL."""
    if run_id is not None and pipeline is not None:
        return store.location(layout.fleet_file(pipeline, run_id))
    return store.location(layout.fleet_dir(pipeline))


def write_fleet(store: RunStore, manifest: Manifest, tasks: pd.DataFrame) -> str:
    """Write one run's fleet file (replacing an earlier one of the same run); its location.

    Raises ``StoreError`` when the store cannot be written.
    """
    pipeline = validate_name(manifest.get("pipeline"), "pipeline")
    run_id = validate_name(manifest.get("run_id"), "run_id")
    data = to_parquet(fleet_rows(manifest, tasks))
    rel = layout.fleet_file(pipeline, run_id)
    store._check_reachable()  # a store that just failed is not waited for again
    try:
        # readers never see a half-written file (a local one is written aside and renamed);
        # bounded by the store's timeout like its own calls
        store.backend.put_whole(rel, data, store.call_options(len(data)))
    except Exception as exc:
        raise StoreError(f"could not write the fleet view of run {run_id} to "
                         f"{fleet_location(store, pipeline)}: {type(exc).__name__}: "
                         f"{exc}") from None
    return fleet_location(store, pipeline, run_id)


class FleetRebuild(TypedDict):
    """What :func:`rebuild_fleet` did: runs written, stale files removed, and the runs
    skipped as ``[run_id, reason]``."""

    written: int
    removed: int
    skipped: list[list[str]]


def rebuild_fleet(store: RunStore, pipeline: str | None = None) -> FleetRebuild:
    """Write the fleet view again from the stored runs; drop files of runs no longer stored.

    Parameters
    ----------
    store
        The store.
    pipeline
        Only this pipeline's partition (default: every pipeline).

    Returns
    -------
    FleetRebuild
        What was written, removed and skipped. A run whose manifest or table cannot be
        read is skipped, never fatal.
    """
    pipelines = [validate_name(pipeline, "pipeline")] if pipeline else store.list_pipelines()
    written, removed = 0, 0
    skipped: list[list[str]] = []
    for name in pipelines:
        runs = [r["run_id"] for r in store.list_runs(name)]
        for run_id in runs:
            try:
                write_fleet(store, store.read_manifest(name, run_id),
                            store.read_table(name, run_id, "tasks"))
                written += 1
            except StoreError as exc:
                logger.warning("fleet view: skipping run %s of %s: %s", run_id, name, exc)
                skipped.append([run_id, str(exc)])
        removed += _remove_stale(store, name, set(runs))
    return {"written": written, "removed": removed, "skipped": skipped}


def read_fleet(store: RunStore) -> pd.DataFrame:
    """The whole fleet view as one DataFrame (empty, with the columns, when there is none).

    Read with :func:`dataset_schema`, so files written before a column existed read
    together with newer ones (null in that column).
    """
    path = store._path(layout.fleet_dir())
    try:
        present = store.fs.exists(path)
    except Exception as exc:
        raise StoreError(f"could not reach {store.url}: {type(exc).__name__}: {exc}") from None
    if not present:
        return pd.DataFrame(columns=["pipeline", *COLUMNS])
    frame = pd.read_parquet(path, filesystem=store.fs, partitioning="hive",
                            schema=dataset_schema())
    frame["pipeline"] = frame["pipeline"].astype(str)
    return frame


def _remove_stale(store: RunStore, pipeline: str, runs: set[str]) -> int:
    """Delete fleet files of ``pipeline`` whose run is not in ``runs``; how many."""
    folder = store._path(layout.fleet_dir(pipeline))
    try:
        paths = store.fs.find(folder)
    except FileNotFoundError:
        return 0
    stale = [p for p in paths if p.endswith(".parquet")
             and p.rsplit("/", 1)[-1][: -len(".parquet")] not in runs]
    for path in stale:
        store.fs.rm_file(path)
    return len(stale)




def _stage_bottlenecks(manifest: Manifest) -> dict[str, str]:
    """Each stage's primary bottleneck class from its stored diagnosis, when there is one."""
    out = {}
    for info in manifest.get("stages") or []:
        if not isinstance(info, dict) or not isinstance(info.get("diagnosis"), dict):
            continue
        primary = info["diagnosis"].get("primary")
        if primary:
            out[str(info.get("name"))] = str(primary)
    return out


def _nullable(values: list[Any], kind: Literal["int64", "float64"]) -> ExtensionArray:
    """``values`` as a column of ``kind`` in which a missing or non-numeric value is null
    (``pd.NA`` for int64, NaN for float64; both null in Parquet), never 0. An array, not a
    Series: it takes the rows' index, whatever the tasks table's was."""
    numbers = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
    return (numbers.round().astype("Int64") if kind == "int64"
            else numbers.astype("float64")).array


@overload
def _stage_entries(manifest: Manifest, key: Literal["memory"]) -> dict[str, StageMemory]: ...
@overload
def _stage_entries(manifest: Manifest, key: Literal["io"]) -> dict[str, StageIO]: ...
@overload
def _stage_entries(manifest: Manifest,
                   key: Literal["allocation"]) -> dict[str, dict[str, Any]]: ...
def _stage_entries(manifest: Manifest, key: Literal["memory", "io", "allocation"]
                   ) -> dict[str, StageMemory] | dict[str, StageIO] | dict[str, dict[str, Any]]:
    """Each stage's stored ``stages[].<key>`` entry (``memory``, ``io``, ``allocation``) by
    stage name; stages without one (old runs, no source) are left out."""
    return cast("dict[str, StageMemory] | dict[str, StageIO] | dict[str, dict[str, Any]]",
                {str(info.get("name")): info[key] for info in manifest.get("stages") or []
                 if isinstance(info, dict) and isinstance(info.get(key), dict)})


def _stage_deaths(manifest: Manifest) -> dict[str, int]:
    """How many workers died in each stage (``incidents``)."""
    out: dict[str, int] = {}
    for incident in manifest.get("incidents") or []:
        for stage in (incident.get("stages") or []) if isinstance(incident, dict) else []:
            out[str(stage)] = out.get(str(stage), 0) + 1
    return out


def _bottleneck(manifest: Manifest) -> str | None:
    """The run's bottleneck class, when a diagnosis stored one."""
    value = manifest.get("bottleneck")
    diagnosis = manifest.get("diagnosis")
    if value is None and isinstance(diagnosis, dict):
        value = diagnosis.get("bottleneck") or diagnosis.get("class")
    if isinstance(value, dict):
        value = value.get("class") or value.get("name")
    return None if value is None else str(value)
