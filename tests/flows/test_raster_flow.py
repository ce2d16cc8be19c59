"""The nightly NDVI flow on real COGs over a moto S3 server: storage requests per night.

Shares the run history of test_nightly_flow.py (three healthy nights and one with five
times the catalogue items), then runs one night whose workers have GDAL's range merging
off (warn mode, so it completes whatever the time rule says; stored apart, so the shared
history is not changed).
"""

from __future__ import annotations

import pytest
from helpers.ndvi_fixtures import HISTORY_RUNS, MERGE_OFF, SLOWED

from flows.nightly_ndvi import CLUSTER_KWARGS, nightly_ndvi
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.regression.explain import explain_stage
from prefect_dask_profiling.store.runs import RunStore
from prefect_dask_profiling.summary.io import stage_io_metrics
from tasks.raster import SIZES

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")]

PIPELINE = "nightly-ndvi"
TINY = SIZES["tiny"]
# array chunks the read stage decodes: scenes x bands x (size / chunk)^2
READ_CHUNKS = TINY.dates * 2 * (TINY.size // TINY.chunk) ** 2


def read_metrics(store: RunStore, run_id: str):
    return stage_io_metrics(store.read_table(PIPELINE, run_id, "io")).loc["read"]


@pytest.fixture(scope="module")
def merge_off_night(ndvi_history, tmp_path_factory) -> tuple[RunStore, str]:
    """The night with range merging off, stored apart: the shared history stays as it is."""
    store = str(tmp_path_factory.mktemp("merge-off-store"))
    warn = nightly_ndvi.with_options(task_runner=ProfiledDaskTaskRunner(
        cluster_kwargs=CLUSTER_KWARGS, on_regression="warn"))
    state = warn(size="tiny", store=store, data_url=ndvi_history.data,
                 data_storage_options=ndvi_history.data_options, **MERGE_OFF,
                 return_state=True)
    assert state.is_completed(), state.message
    return RunStore(store), RunStore(store).list_runs(PIPELINE)[0]["run_id"]


def healthy_runs(store: RunStore) -> list[str]:
    runs = list(reversed(store.list_runs(PIPELINE)))
    return [r["run_id"] for r in runs[:HISTORY_RUNS]]


def test_healthy_nights_read_every_chunk_with_consistent_requests(ndvi_history):
    store = RunStore(ndvi_history.store)
    metrics = [read_metrics(store, run) for run in healthy_runs(store)]
    assert [int(m["chunks"]) for m in metrics] == [READ_CHUNKS] * HISTORY_RUNS
    per_chunk = [m["requests_per_chunk"] for m in metrics]
    assert all(p > 0 for p in per_chunk)
    assert max(per_chunk) <= 1.5 * min(per_chunk), per_chunk
    for run in healthy_runs(store):
        manifest = store.read_manifest(PIPELINE, run)
        stages = {s["name"]: s for s in manifest["stages"]}
        assert stages["read"]["io"]["requests"] > 0
        assert stages["read"]["chunks_vs_blocks"]["aligned"] is True
        assert not stages["ndvi"]["io"] or not stages["ndvi"]["io"].get("requests")
        raster = manifest["environment"]["raster"]
        assert raster["gdal"] and raster["rasterio"] and raster["libcurl"]
        assert raster["options"]["GDAL_HTTP_MERGE_CONSECUTIVE_RANGES"] == "YES"
        assert raster["options"]["AWS_SECRET_ACCESS_KEY"] == "<set>"


def test_more_catalogue_items_read_more_chunks(ndvi_history):
    store = RunStore(ndvi_history.store)
    slowed = store.list_runs(PIPELINE)
    run = [r for r in slowed if r["run_id"] not in healthy_runs(store)][-1]["run_id"]
    assert int(read_metrics(store, run)["chunks"]) == SLOWED["slowdown_factor"] * READ_CHUNKS


def test_the_merge_off_night_makes_more_requests_per_chunk(ndvi_history, merge_off_night):
    store = RunStore(ndvi_history.store)
    healthy = [read_metrics(store, run) for run in healthy_runs(store)]
    night_store, night = merge_off_night
    tonight = read_metrics(night_store, night)
    assert tonight["chunks"] == READ_CHUNKS
    assert tonight["requests_per_chunk"] > max(m["requests_per_chunk"] for m in healthy)
    assert tonight["bytes_per_chunk"] > 3 * max(m["bytes_per_chunk"] for m in healthy)
    manifest = night_store.read_manifest(PIPELINE, night)
    baselines = [store.read_manifest(PIPELINE, run) for run in healthy_runs(store)]
    why = explain_stage("read", manifest, baselines)
    assert why["context"][0]["what"] in ("GDAL_HTTP_MERGE_CONSECUTIVE_RANGES",
                                         "GDAL_HTTP_MULTIRANGE"), why
    assert "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES YES → NO" in why["text"]
