"""A fleet-wide Parquet view of every run: ``<store>/fleet/pipeline=<name>/<run_id>.parquet``.

One row per (run, stage, prefix) with one explicit Arrow schema (:data:`COLUMNS`; the
columns are described in docs/beyond-one-night.md). Each run writes its own file, so
concurrent runs never race; files written before a column existed read null in it
(:func:`dataset_schema`). ``dask-profiling fleet --rebuild`` writes the view again from the
stored runs; ``--compact`` (:func:`compact_fleet`) folds each closed month into
``month=<YYYY-MM>.parquet``, and **a run's own file wins over its month's file** in
:func:`read_fleet` and :func:`duckdb_view`."""

from __future__ import annotations

import io
import logging
from collections.abc import Collection, Mapping
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

    return _parquet_bytes(pa.Table.from_pandas(rows[COLUMNS], schema=_schema(),
                                               preserve_index=False))


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
        removed += _remove_stale(store, name, set(runs),
                                 {run_id for run_id, _ in skipped if run_id in runs})
    return {"written": written, "removed": removed, "skipped": skipped}


def read_fleet(store: RunStore) -> pd.DataFrame:
    """The whole fleet view as one DataFrame (empty, with the columns, when there is none).

    Read with :func:`dataset_schema`, so files written before a column existed read
    together with newer ones (null in that column). A run in a compacted month's file and in
    its own file (a compaction that stopped before deleting it, or a rebuild after it) is
    read from its own file only.
    """
    path = store._path(layout.fleet_dir())
    try:
        present = store.fs.exists(path)
    except Exception as exc:
        raise StoreError(f"could not reach {store.url}: {type(exc).__name__}: {exc}") from None
    if not present:
        return pd.DataFrame(columns=["pipeline", *COLUMNS])
    import pyarrow.dataset as ds

    schema = dataset_schema()
    table = ds.dataset(path, filesystem=store.fs, partitioning="hive", schema=schema).to_table(
        columns=[*schema.names, "__filename"])
    frame = table.to_pandas()
    frame["pipeline"] = frame["pipeline"].astype(str)
    return _each_run_once(frame).reset_index(drop=True)


def _each_run_once(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (with pyarrow's ``__filename``) without the month-file rows of runs that
    have their own file; the source column dropped."""
    monthly = frame.pop("__filename").str.rsplit("/", n=1).str[-1].str.startswith(
        layout.FLEET_MONTH)
    own = pd.MultiIndex.from_frame(frame.loc[~monthly, ["pipeline", "run_id"]])
    keys = pd.MultiIndex.from_frame(frame[["pipeline", "run_id"]])
    return frame[~(monthly & keys.isin(own)).to_numpy()]


def duckdb_view(folder: str, name: str = "fleet") -> str:
    """The DuckDB statement that makes view ``name`` over the fleet view at ``folder``.

    Every run once: a run in a compacted month's file and in its own file (see the module)
    is read from its own file. The rule is an anti-join against the runs' own files (few
    once compacted), not a window over every row, so a query's filter on ``started``
    still reaches the Parquet scan. ``folder`` is the view's location (``<store>/fleet``, local
    or, with DuckDB's ``httpfs``, ``s3://...``). DuckDB takes the columns from one file:
    files written before a column existed must be written again first (``fleet --rebuild``,
    or ``fleet --compact``, whose month files have every column). Its ``union_by_name``
    would read them as they are, but opened every file's schema first: over 290 s for
    10,000 files, where the view read them in 7.4 s (docs/beyond-one-night.md).

    Examples
    --------
    >>> import duckdb  # doctest: +SKIP
    >>> con = duckdb.connect()  # doctest: +SKIP
    >>> con.execute(duckdb_view(".dask-profiling/fleet"))  # doctest: +SKIP
    >>> con.sql("SELECT pipeline, count(DISTINCT run_id) FROM fleet GROUP BY 1")  # doctest: +SKIP
    """
    validate_name(name, "view name")
    glob = f"{folder.rstrip('/')}/*/*.parquet".replace("'", "''")
    return (f"CREATE OR REPLACE VIEW {name} AS "
            f"WITH files AS (SELECT *, starts_with(parse_filename(filename), "
            f"'{layout.FLEET_MONTH}') AS monthly FROM read_parquet('{glob}', "
            f"hive_partitioning = true, filename = true)) "
            f"SELECT * EXCLUDE (filename, monthly) FROM files WHERE NOT monthly "
            f"OR (pipeline, run_id) NOT IN "
            f"(SELECT pipeline, run_id FROM files WHERE NOT monthly)")


class FleetCompaction(TypedDict):
    """What :func:`compact_fleet` did: month files written, run files folded into them and
    deleted, and the run files it could not read (``[path, reason]``, left in place)."""

    months: int
    removed: int
    skipped: list[list[str]]


def compact_fleet(store: RunStore, pipeline: str | None = None,
                  before: str | None = None) -> FleetCompaction:
    """Fold each closed month's run files of a pipeline into one file per month.

    A query engine opens every file of the view: at 1,000 runs of 100 pipelines that is
    100,000 files (docs/beyond-one-night.md has the figures), at one file per month 3,300.
    For each month before ``before``, the month's file is written (with the rows it already
    held for runs that have no file of their own) and then the runs' files are deleted:
    interrupted at any point, readers see each run once (its own file wins, see the module),
    and running it again finishes the work.

    Parameters
    ----------
    store
        The store.
    pipeline
        Only this pipeline (default: every pipeline of the view).
    before
        The first month left alone (``YYYY-MM``; default the current month, UTC): runs of
        an open month still arrive.

    Returns
    -------
    FleetCompaction
        Month files written, run files removed, unreadable run files skipped.
    """
    month_now = before or pd.Timestamp.now(tz="UTC").strftime("%Y-%m")
    layout.fleet_month_file("p", month_now)  # checks the month
    names = [validate_name(pipeline, "pipeline")] if pipeline else _fleet_pipelines(store)
    done: FleetCompaction = {"months": 0, "removed": 0, "skipped": []}
    for name in names:
        for month, (month_file, runs) in sorted(_fleet_files(store, name).items()):
            if month >= month_now or not runs:
                continue
            written, unread = _compact_month(store, name, month, month_file, runs)
            done["months"] += 1
            done["skipped"] += unread
            for rel in written:  # only after the month's file holds their rows
                store.fs.rm_file(store._path(rel))
            done["removed"] += len(written)
    return done


def _fleet_pipelines(store: RunStore) -> list[str]:
    """The pipelines with a partition in the fleet view."""
    return sorted(child[len(layout.FLEET_PARTITION):]
                  for child in store._children(layout.fleet_dir())
                  if child.startswith(layout.FLEET_PARTITION)
                  and layout.valid_names(child[len(layout.FLEET_PARTITION):]))


def _fleet_files(store: RunStore, pipeline: str) -> dict[str, tuple[str | None, dict[str, str]]]:
    """A pipeline's fleet files by month: ``{YYYY-MM: (its month file or None, {run_id:
    its own file})}`` (paths relative to the root; runs with undated ids are left out)."""
    out: dict[str, tuple[str | None, dict[str, str]]] = {}
    folder = layout.fleet_dir(pipeline)
    for name in store._children(folder):
        parsed = layout.parse_fleet_file(name)
        if parsed is None:
            continue
        kind, value = parsed
        month = value if kind == "month" else layout.index_partition(value)
        if month == layout.UNDATED:
            continue
        month_file, runs = out.get(month, (None, {}))
        if kind == "month":
            month_file = f"{folder}/{name}"
        else:
            runs = {**runs, value: f"{folder}/{name}"}
        out[month] = (month_file, runs)
    return out


def _compact_month(store: RunStore, pipeline: str, month: str, month_file: str | None,
                   runs: dict[str, str]) -> tuple[list[str], list[list[str]]]:
    """Write the month's file: its runs' own files, and the rows the month's file held for
    runs without one. The run files now in it, and those that could not be read."""
    import pyarrow as pa

    wanted = dict(runs)
    if month_file is not None:
        wanted[""] = month_file
    found = store._read_many({rel: f"fleet file of {pipeline}" for rel in wanted.values()})
    tables, written, unread = [], [], []
    for run_id, rel in sorted(wanted.items()):
        data = found[rel]
        try:
            if isinstance(data, BaseException):
                raise data
            table = _conformed(data)
        except Exception as exc:
            if not run_id:  # the month's own file: nothing may be lost
                raise StoreError(f"could not read {store.location(rel)}: {exc}") from None
            unread.append([store.location(rel), f"{type(exc).__name__}: {exc}"])
            continue
        if not run_id:
            import pyarrow.compute as pc

            table = table.filter(pc.invert(pc.is_in(table["run_id"],
                                                    pa.array(sorted(runs), pa.string()))))
        else:
            written.append(rel)
        tables.append(table)
    merged = pa.concat_tables(tables).sort_by([("run_id", "ascending")])
    rel = layout.fleet_month_file(pipeline, month)
    store.backend.put_whole(rel, _parquet_bytes(merged), store.call_options())
    return written, unread


def _conformed(data: bytes):
    """A fleet file's table with every column of the schema (nulls where an older file
    lacks one), in the schema's order and types."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data))
    schema = _schema()
    columns = [table[field.name].cast(field.type) if field.name in table.column_names
               else pa.nulls(len(table), field.type) for field in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _parquet_bytes(table) -> bytes:
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def _remove_stale(store: RunStore, pipeline: str, runs: set[str],
                  unwritten: Collection[str] = ()) -> int:
    """Delete fleet files of ``pipeline`` whose run is not in ``runs``, and the compacted
    month files: every stored run has its own file again (which wins over its month's),
    except in the months of ``unwritten`` runs, whose month files are kept. How many."""
    folder = layout.fleet_dir(pipeline)
    keep = {layout.index_partition(run_id) for run_id in unwritten}
    stale = []
    for name in store._children(folder):
        parsed = layout.parse_fleet_file(name)
        if parsed is None:
            continue
        kind, value = parsed
        if (kind == "run" and value not in runs) or (kind == "month" and value not in keep):
            stale.append(f"{folder}/{name}")
    for rel in stale:
        store.fs.rm_file(store._path(rel))
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
