"""The raster job's operations on a plain LocalCluster (no Prefect run involved)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
import zarr
from distributed import Client, LocalCluster
from helpers.s3_servers import boto_client, moto_server, s3_options

from tasks import raster, scenes
from tasks.synthetic import CubeSpec, acquisition_dates, synthetic_cube

SPEC = CubeSpec(dates=6, size=64, tile=32)
pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")


def cube_values(spec: CubeSpec) -> xr.Dataset:
    return synthetic_cube(spec).compute(scheduler="sync")


# -- synthetic cube -----------------------------------------------------------------------------


def test_cube_is_deterministic_and_sentinel_like():
    a, b = cube_values(SPEC), cube_values(SPEC)
    for band in ("red", "nir"):
        np.testing.assert_array_equal(a[band].values, b[band].values)
    other = cube_values(CubeSpec(dates=6, size=64, tile=32, seed=7))
    assert not np.array_equal(a.red.values, other.red.values, equal_nan=True)
    cloudy = np.isnan(a.red.values)
    assert 0.05 < cloudy.mean() < 0.6, "cloud gaps are NaN, not everywhere"
    np.testing.assert_array_equal(cloudy, np.isnan(a.nir.values))
    clear = ~cloudy
    assert (a.nir.values[clear] > a.red.values[clear]).mean() > 0.95, "vegetation: NIR > red"
    assert list(a.time.values) == list(acquisition_dates(6).values)
    assert a.red.dtype == np.float32 and a.red.shape == (6, 64, 64)


def test_a_longer_catalogue_holds_the_same_latest_scenes():
    short, long = cube_values(SPEC), cube_values(CubeSpec(dates=18, size=64, tile=32))
    tail = long.isel(time=slice(-6, None))
    np.testing.assert_array_equal(tail.time.values, short.time.values)
    np.testing.assert_array_equal(tail.red.values, short.red.values)


@pytest.mark.parametrize("field, value", [("dates", 0), ("size", -1), ("tile", 2.5),
                                          ("cloud_cover", 1.0)])
def test_bad_cube_spec_names_the_field(field, value):
    kwargs = {"dates": 2, "size": 8, "tile": 8, field: value}
    with pytest.raises(ValueError, match=field):
        CubeSpec(**kwargs)


# -- numerics on a hand-made cube -----------------------------------------------------------------


def hand_made() -> xr.Dataset:
    rng = np.random.default_rng(0)
    red = rng.uniform(0.02, 0.2, (5, 6, 6)).astype("float32")
    nir = rng.uniform(0.2, 0.5, (5, 6, 6)).astype("float32")
    red[1, 2, 3] = nir[1, 2, 3] = np.nan
    red[:4, 0, 0] = nir[:4, 0, 0] = np.nan          # one clear observation left
    red[:, 5, 5] = nir[:, 5, 5] = np.nan            # never clear
    ds = xr.Dataset({"red": (("time", "y", "x"), red), "nir": (("time", "y", "x"), nir)},
                    coords={"time": acquisition_dates(5)})
    return ds.chunk({"time": 2, "y": 3, "x": 3})


def test_ndvi_and_median_are_numerically_right():
    ds = hand_made()
    red, nir = ds.red.values, ds.nir.values
    expected = (nir - red) / (nir + red)
    index = raster.ndvi(ds, cloud_buffer=0).compute(scheduler="sync")
    np.testing.assert_allclose(index.values, expected, rtol=1e-6)
    composite = raster.temporal_median(raster.ndvi(ds, cloud_buffer=0)).compute(
        scheduler="sync")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN pixels
        want = np.nanmedian(expected, axis=0)
    np.testing.assert_allclose(composite.ndvi_median.values, want, rtol=1e-6)
    assert composite.ndvi_median.values[0, 0] == pytest.approx(expected[4, 0, 0])
    assert np.isnan(composite.ndvi_median.values[5, 5])
    np.testing.assert_array_equal(composite.clear_count.values,
                                  (~np.isnan(expected)).sum(axis=0))


def test_cloud_edges_are_masked_across_chunk_borders():
    ds = hand_made()
    index = raster.ndvi(ds, cloud_buffer=1).compute(scheduler="sync").values
    # the cloud at (t=1, y=2, x=3) sits on a chunk border (x chunks 0-2 | 3-5)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            assert np.isnan(index[1, 2 + dy, 3 + dx])
    assert not np.isnan(index[1, 4, 3]) and not np.isnan(index[2, 2, 3])
    block = np.ones((1, 5, 5), dtype="float32")
    block[0, 0, 0] = np.nan
    masked = raster.mask_cloud_edges(block, radius=2)
    assert np.isnan(masked[0, :3, :3]).all() and np.isfinite(masked[0, 3:, :]).all()


# -- the tasks' bodies on a real LocalCluster -----------------------------------------------------


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The tiny plan's catalogue, plus a 2x longer one, as COGs + STAC in a local folder."""
    data = str(tmp_path_factory.mktemp("data"))
    catalogs = {}
    for slowdown in ("none", "more-tasks"):
        plan = raster.plan_run("tiny", slowdown, "read", 2)
        catalogs[slowdown] = scenes.write_scenes(plan.catalogue, data)
    return data, catalogs


def run_job(data: str, catalog: str, plan: raster.Plan, tag: str) -> xr.Dataset:
    names = [f"{tag}-scenes", f"{tag}-ndvi", f"{tag}-median"]
    raster.read_scenes.fn(catalog, plan, names[0])
    raster.compute_ndvi.fn(names[0], plan, names[1])
    raster.reduce_median.fn(names[1], plan, names[2])
    raster.write_outputs.fn(names[1], names[2], plan, f"{data}/products/{tag}")
    assert sorted(raster.release_datasets.fn(names)) == sorted(names)
    return xr.open_zarr(f"{data}/products/{tag}/ndvi-median.zarr", consolidated=False)


def test_scenes_are_tiled_cogs_with_overviews_in_a_stac_catalog(stored):
    import json

    import rasterio

    data, catalogs = stored
    plan = raster.plan_run("tiny")
    found = scenes.search(catalogs["none"], plan.window)
    assert len(found) == plan.window and [s.time for s in found] == sorted(s.time for s in found)
    with rasterio.open(found[0].hrefs["red"]) as ds:
        assert ds.block_shapes == [(128, 128)] and ds.overviews(1) and ds.nodata == 0
        assert ds.profile["tiled"] and ds.dtypes == ("uint16",)
    item = json.loads(open(found[0].hrefs["nir"].replace("nir.tif", f"{found[0].id}.json")
                           ).read())
    props = item["properties"]
    assert props.get("proj:code") == "EPSG:32633" or props.get("proj:epsg") == 32633
    assert {"red", "nir"} <= set(item["assets"])


def test_scenes_read_back_as_the_synthetic_reflectance(stored):
    data, catalogs = stored
    plan = raster.plan_run("tiny")
    found = scenes.search(catalogs["none"], plan.window)
    back = scenes.open_scenes(found, plan.chunk).compute(scheduler="sync")
    truth = cube_values(plan.catalogue)
    np.testing.assert_array_equal(np.isnan(back.red.values), np.isnan(truth.red.values))
    np.testing.assert_allclose(back.nir.values, truth.nir.values, atol=1e-4, equal_nan=True)


def test_job_writes_the_median_of_the_stored_scenes(client, stored):
    data, catalogs = stored
    plan = raster.plan_run("tiny")
    assert scenes.scenes_exist(data, plan.catalogue)
    assert not scenes.scenes_exist(data, CubeSpec(dates=3, size=8, tile=8))
    composite = run_job(data, catalogs["none"], plan, "normal").compute()
    read = scenes.open_scenes(scenes.search(catalogs["none"], plan.window), plan.chunk)
    expected = raster.temporal_median(raster.ndvi(read)).compute(scheduler="sync")
    np.testing.assert_allclose(composite.ndvi_median.values, expected.ndvi_median.values,
                               rtol=1e-6)
    series = xr.open_zarr(f"{data}/products/normal/ndvi-series.zarr", consolidated=False)
    assert series.sizes["time"] == plan.window
    assert not client.list_datasets()


@pytest.mark.slow  # > 10 s
def test_more_tasks_reads_factor_times_the_chunks_for_the_same_result(client, stored):
    data, catalogs = stored
    normal, more = raster.plan_run("tiny"), raster.plan_run("tiny", "more-tasks", "read", 2)
    n = raster.open_catalogue(catalogs["none"], normal)
    m = raster.open_catalogue(catalogs["more-tasks"], more)
    assert m.red.data.npartitions == 2 * n.red.data.npartitions > 0
    reference = run_job(data, catalogs["none"], normal, "ref").compute()
    slowed = run_job(data, catalogs["more-tasks"], more, "more").compute()
    np.testing.assert_array_equal(slowed.ndvi_median.values, reference.ndvi_median.values)


def test_slowdowns_are_real_gdal_settings_chunks_and_output_chunks(client, stored):
    data, catalogs = stored
    plan = raster.plan_run("tiny", "slower-tasks", "read", 3)
    assert plan.merge_off and plan.catalogue == raster.plan_run("tiny").catalogue
    options = scenes.gdal_options({"endpoint_url": "http://127.0.0.1:9"}, plan.merge_off)
    assert options["GDAL_HTTP_MERGE_CONSECUTIVE_RANGES"] == "NO"
    assert options["AWS_S3_ENDPOINT"] == "127.0.0.1:9" and options["AWS_HTTPS"] == "NO"
    misaligned = raster.plan_run("tiny", "misaligned-chunks", "read", 2)
    assert misaligned.chunk % misaligned.catalogue.tile != 0
    opened = raster.open_catalogue(catalogs["none"], misaligned)
    assert opened.red.chunks[1][0] == misaligned.chunk
    writes = raster.plan_run("tiny", "slower-tasks", "write", 3)
    assert writes.write_pixels == 64
    run_job(data, catalogs["none"], writes, "smallwrites")
    stored_median = zarr.open_group(f"{data}/products/smallwrites/ndvi-median.zarr", mode="r")
    assert stored_median["ndvi_median"].chunks == (64, 64)


@pytest.mark.parametrize("kwargs, field", [
    ({"size": "huge"}, "size"),
    ({"slowdown": "sleep"}, "slowdown"),
    ({"slowdown_stage": "publish"}, "slowdown_stage"),
    ({"slowdown_factor": 1}, "slowdown_factor"),
    ({"slowdown_factor": 2.5}, "slowdown_factor"),
    ({"slowdown": "slower-tasks", "slowdown_stage": "reduce"}, "slowdown_stage"),
])
def test_bad_plan_names_the_parameter(kwargs, field):
    with pytest.raises(ValueError, match=field):
        raster.plan_run(**kwargs)


def test_local_data_url_rejects_storage_options(tmp_path):
    with pytest.raises(ValueError, match="storage_options"):
        raster.zarr_store(str(tmp_path), {"key": "x"})


def test_scenes_round_trip_through_s3_and_gdal(monkeypatch):
    spec = CubeSpec(dates=2, size=64, tile=32)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_server() as endpoint:
        boto_client(endpoint).create_bucket(Bucket="scenes")
        options = s3_options(endpoint)
        assert not scenes.scenes_exist("s3://scenes/ndvi", spec, options)
        catalog = scenes.write_scenes(spec, "s3://scenes/ndvi", options)
        assert scenes.scenes_exist("s3://scenes/ndvi", spec, options)
        found = scenes.search(catalog, 2, options)
        assert found[0].hrefs["red"].startswith("/vsis3/scenes/ndvi/")
        for name, value in scenes.gdal_options(options).items():
            monkeypatch.setenv(name, value)
        back = scenes.open_scenes(found, 32).compute(scheduler="sync")
    truth = cube_values(spec)
    np.testing.assert_allclose(back.nir.values, truth.nir.values, atol=1e-4, equal_nan=True)
