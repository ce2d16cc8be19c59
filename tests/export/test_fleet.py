"""The fleet Parquet view: one file per run, one pandas call to read it, local and S3 (moto)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.s3_servers import boto_client, moto_server, reset_moto, s3_options
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.errors import DamagedRecord
from prefect_dask_profiling.export.fleet import (
    COLUMNS,
    STORAGE_COLUMNS,
    dataset_schema,
    fleet_location,
    fleet_rows,
    read_fleet,
    rebuild_fleet,
    to_parquet,
    write_fleet,
)
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary.io import io_frame, stage_io_summary

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
BUCKET = "fleet-bucket"


def tasks(scale: float = 1.0) -> pd.DataFrame:
    total = [20.0 * scale, 10.0]
    return pd.DataFrame({"stage": ["read", "reduce"], "prefix": ["open_dataset", "nanmedian"],
                         "tasks": [40, 8], "total_s": total, "p50_s": [0.5, 1.2],
                         "p95_s": [0.9 * scale, 1.5], "gb_out": [1.5, 0.01],
                         "share": [t / sum(total) for t in total]})


def manifest(pipeline: str, run_id: str, night: int, **extra) -> dict:
    return {"run_id": run_id, "pipeline": pipeline, "version": "v1", "status": "healthy",
            "state": "COMPLETED", "started": (T0 + timedelta(days=night)).isoformat(),
            "utilisation": {"run": 0.5 + night / 100, "stages": {"read": 0.7, "reduce": 0.3}},
            **extra}


def put(store: RunStore, pipeline: str, night: int, scale: float = 1.0, **extra) -> str:
    run_id = new_run_id(T0 + timedelta(days=night))
    doc = manifest(pipeline, run_id, night, **extra)
    assert not store.write_run(pipeline, run_id, {"tasks": tasks(scale)}, doc).spooled
    return run_id


def test_rows_carry_the_run_and_a_nullable_bottleneck():
    rows = fleet_rows(manifest("ndvi", "r1", 0), tasks())
    assert list(rows.columns) == COLUMNS and len(rows) == 2
    assert rows["utilisation"].tolist() == [0.5, 0.5]
    assert rows["stage_utilisation"].tolist() == [0.7, 0.3]
    assert rows["bottleneck"].isna().all()
    assert str(rows["started"].dt.tz) == "UTC"
    diagnosed = fleet_rows(manifest("ndvi", "r1", 0, bottleneck="transfer-bound"), tasks())
    assert diagnosed["bottleneck"].tolist() == ["transfer-bound"] * 2
    per_stage = fleet_rows(manifest("ndvi", "r1", 0, bottleneck="transfer-bound", stages=[
        {"name": "read", "diagnosis": {"primary": "io-bound", "confidence": "high"}},
        {"name": "reduce", "diagnosis": None}]), tasks())
    assert per_stage["bottleneck"].tolist() == ["io-bound", "transfer-bound"]
    with pytest.raises(DamagedRecord, match="status"):  # a stored run missing a field
        fleet_rows({"run_id": "r", "pipeline": "p", "version": "v"}, tasks())
    with pytest.raises(DamagedRecord, match="total_s"):
        fleet_rows(manifest("ndvi", "r1", 0), tasks().drop(columns="total_s"))


def storage(stage: str, gdal: bool) -> dict:
    """A stage's manifest ``io`` entry as a run stores it (``stage_io_summary`` of its io
    table): GDAL and s3fs requests, or s3fs only (no GDAL columns: GDAL was not loaded)."""
    row = {"stage": stage, "worker": "tcp://10.0.0.1:4001", "chunks": 40,
           "decoded_bytes": 8_000_000, "s3fs_get": 3, "s3fs_head": 1, "s3fs_list": 1,
           "s3fs_bytes": 2_048}
    if gdal:
        row |= {"gdal_get": 44, "gdal_head": 2, "gdal_list": 1, "gdal_bytes": 3_000_000}
    return stage_io_summary(io_frame([row]), stage)


def storage_of(rows: pd.DataFrame, stage: str) -> dict:
    """The storage columns of ``stage``'s row, by ``io`` key (None where null)."""
    row = rows.set_index("stage").loc[stage]
    return {key: None if pd.isna(row[column]) else row[column]
            for column, key, _ in STORAGE_COLUMNS}


def test_rows_carry_each_stages_storage_requests_null_without_a_source():
    read, s3fs_only = storage("read", gdal=True), storage("reduce", gdal=False)
    assert set(s3fs_only) == {"s3fs_requests", "s3fs_bytes"}  # the producer leaves GDAL out
    rows = fleet_rows(manifest("ndvi", "r1", 0, stages=[
        {"name": "read", "io": read}, {"name": "reduce", "io": s3fs_only}]), tasks())
    assert storage_of(rows, "read") == pytest.approx({k: read[k] for _, k, _ in STORAGE_COLUMNS})
    assert storage_of(rows, "read")["requests"] == 47  # GET + HEAD + LIST
    assert storage_of(rows, "reduce") == {k: s3fs_only.get(k) for _, k, _ in STORAGE_COLUMNS}
    # in the file: typed, and null (not 0) where the source was absent
    table = pq.read_table(pa.BufferReader(to_parquet(rows)))
    assert table.schema.field("stage_requests").type == pa.int64()
    assert table.schema.field("stage_read_amplification").type == pa.float64()
    assert table.column("stage_get_requests").to_pylist() == [44, None]
    assert table.column("stage_s3fs_bytes").to_pylist() == [2_048, 2_048]

    # an old manifest (no stage entries, or entries without io) still exports: all null
    storage_columns = [column for column, _, _ in STORAGE_COLUMNS]
    for stages in ([], [{"name": "read", "io": None}, {"name": "reduce"}]):
        old = fleet_rows(manifest("ndvi", "r1", 0, stages=stages), tasks())
        assert old[storage_columns].isna().all().all()
        assert pq.read_table(pa.BufferReader(to_parquet(old)),
                             columns=storage_columns).to_pandas().isna().all().all()


def test_files_without_the_storage_columns_read_with_newer_ones(tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    old_id = put(store, "ndvi", 0)
    new_id = put(store, "ndvi", 1, stages=[{"name": "read", "io": storage("read", True)}])
    # the older run's file as the fleet view wrote it before the storage columns existed;
    # it sorts first, the file pyarrow would infer the dataset's schema from
    rows = fleet_rows(store.read_manifest("ndvi", old_id), store.read_table("ndvi", old_id,
                                                                            "tasks"))
    new_columns = {c for c, _, _ in STORAGE_COLUMNS} | {"pipeline"}
    old_schema = pa.schema([f for f in dataset_schema() if f.name not in new_columns])
    old_file = tmp_path / f"store/fleet/pipeline=ndvi/{old_id}.parquet"
    old_file.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(rows[old_schema.names], schema=old_schema,
                                        preserve_index=False), old_file)
    write_fleet(store, store.read_manifest("ndvi", new_id),
                store.read_table("ndvi", new_id, "tasks"))

    frame = read_fleet(store).set_index(["run_id", "stage"])
    assert set(COLUMNS) - {"run_id", "stage"} <= set(frame.columns) and len(frame) == 4
    assert frame.loc[(new_id, "read"), "stage_requests"] == 47
    assert frame.loc[(new_id, "read"), "stage_read_amplification"] == pytest.approx(0.375)
    assert frame.loc[old_id, "stage_requests"].isna().all()  # null, not 0
    assert pd.isna(frame.loc[(new_id, "reduce"), "stage_requests"])  # no io entry: null
    assert frame.loc[old_id, "total_s"].tolist() == [20.0, 10.0]
    assert set(frame["pipeline"]) == {"ndvi"}


def fill(store: RunStore) -> dict[str, list[str]]:
    """Three nights of two pipelines, each run writing its own fleet file."""
    ids: dict[str, list[str]] = {"ndvi": [], "sar": []}
    for night in range(3):
        for pipeline in ids:
            extra = {"bottleneck": "compute-bound"} if pipeline == "sar" else {}
            run_id = put(store, pipeline, night, scale=1 + night / 10, **extra)
            ids[pipeline].append(run_id)
            write_fleet(store, store.read_manifest(pipeline, run_id),
                        store.read_table(pipeline, run_id, "tasks"))
    return ids


def check_view(frame: pd.DataFrame, ids: dict[str, list[str]]) -> None:
    assert len(frame) == 12
    assert set(frame["pipeline"].astype(str)) == {"ndvi", "sar"}
    assert set(frame["run_id"]) == {r for runs in ids.values() for r in runs}
    assert frame["bottleneck"].isna().sum() == 6  # ndvi: no diagnosis; sar: one
    slowest = frame.groupby(["pipeline", "stage"], observed=True)["total_s"].max()
    assert slowest[("ndvi", "read")] == pytest.approx(24.0)
    assert pd.api.types.is_datetime64_any_dtype(frame["started"])


def test_local_view_reads_in_one_pandas_call_and_rebuilds(tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    ids = fill(store)
    check_view(pd.read_parquet(fleet_location(store)), ids)
    files = sorted(p.name for p in (tmp_path / "store/fleet/pipeline=ndvi").iterdir())
    assert files == sorted(f"{r}.parquet" for r in ids["ndvi"])  # one file per run, no temp

    stale = tmp_path / "store/fleet/pipeline=ndvi/19990101T000000Z-dead00.parquet"
    stale.write_bytes((tmp_path / "store/fleet/pipeline=ndvi" / files[0]).read_bytes())
    (tmp_path / "store/fleet/pipeline=sar").joinpath(f"{ids['sar'][0]}.parquet").unlink()
    result = CliRunner().invoke(app, ["fleet", "--rebuild", "--store", store.url, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["written"] == 6 and report["removed"] == 1 and report["skipped"] == []
    check_view(read_fleet(store), ids)

    summary = CliRunner().invoke(app, ["fleet", "--store", store.url])
    assert summary.exit_code == 0 and "12 rows, 6 runs of 2 pipeline(s)" in summary.stdout


def test_rebuild_skips_unreadable_runs(tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    ids = fill(store)
    (tmp_path / "store/runs/sar" / ids["sar"][1] / "tasks.csv").write_text("garbage")
    result = rebuild_fleet(store, "sar")
    assert result["written"] == 2 and [r for r, _ in result["skipped"]] == [ids["sar"][1]]


@pytest.fixture(scope="module")
def moto_endpoint():
    with moto_server() as endpoint:
        yield endpoint


def test_s3_view_reads_in_one_pandas_call(moto_endpoint, tmp_path):
    reset_moto(moto_endpoint)
    boto_client(moto_endpoint).create_bucket(Bucket=BUCKET)
    options = s3_options(moto_endpoint)
    store = RunStore(f"s3://{BUCKET}/pfx", options, spool_dir=tmp_path / "spool")
    ids = fill(store)
    assert fleet_location(store) == f"s3://{BUCKET}/pfx/fleet"
    frame = pd.read_parquet(f"s3://{BUCKET}/pfx/fleet",
                            storage_options={"key": options["key"],
                                             "secret": options["secret"],
                                             "client_kwargs": {"endpoint_url": moto_endpoint}})
    check_view(frame, ids)
    keys = {o["Key"] for o in boto_client(moto_endpoint).list_objects_v2(
        Bucket=BUCKET, Prefix="pfx/fleet/")["Contents"]}
    assert f"pfx/fleet/pipeline=sar/{ids['sar'][2]}.parquet" in keys and len(keys) == 6
    result = rebuild_fleet(store)
    assert result["written"] == 6 and result["removed"] == 0
    check_view(read_fleet(store), ids)
