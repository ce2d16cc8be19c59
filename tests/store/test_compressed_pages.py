"""Pages (stage reports, the trend page) are stored gzip-compressed on S3, plain locally.

On S3 a page goes with ``Content-Encoding: gzip`` and ``Content-Type: text/html;
charset=utf-8``, in one PUT: a browser (or httpx, which asks for gzip and decodes it)
opening its link gets the HTML. Every reader tells gzip by its magic bytes, so reports
stored before, uncompressed, are still read; a damaged gzip page is a ``DamagedRecord``.
A local store keeps the page plain (a browser does not decode a ``file://`` gzip file).
"""

from __future__ import annotations

import gzip

import httpx
import pandas as pd
import pytest
from helpers.report_records import stage_data_of
from helpers.s3_servers import boto_client, record_calls, reset_moto, s3_options

from prefect_dask_profiling.errors import DamagedRecord, StoreConflict
from prefect_dask_profiling.store import compression, layout
from prefect_dask_profiling.store.access import same_content
from prefect_dask_profiling.store.runs import RunStore, new_run_id

BUCKET = "gzip-pages"
PIPE = "ndvi"


@pytest.fixture(scope="module")
def page() -> str:
    """A real stage report: 2,000 tasks drawn as the flow process draws them."""
    from prefect_dask_profiling.reports.html import render_html

    return render_html(stage_data_of(2_000, jitter=0.5), "read")


@pytest.fixture
def s3_store(moto, tmp_path) -> RunStore:
    reset_moto(moto)
    boto_client(moto).create_bucket(Bucket=BUCKET)
    return RunStore(f"s3://{BUCKET}/pfx", s3_options(moto), spool_dir=tmp_path / "spool",
                    timeout=30)


def key_of(store: RunStore, location: str) -> str:
    """The S3 key of a location in ``store``."""
    return location.removeprefix(f"s3://{BUCKET}/")


def test_a_report_on_s3_is_gzip_with_its_encoding_and_opens_as_the_same_html(
        s3_store, moto, page):
    puts = record_calls(s3_store, "PutObject")
    run_id = new_run_id()
    location = s3_store.write_report(PIPE, run_id, "read", page).location
    assert location.endswith(f"/reports/{PIPE}/{run_id}/read.html")  # the key keeps .html
    assert len(puts) == 1  # compressed in the same single PUT

    client = boto_client(moto)
    key = key_of(s3_store, location)
    head = client.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentEncoding"] == "gzip"
    assert head["ContentType"] == "text/html; charset=utf-8"
    got = client.get_object(Bucket=BUCKET, Key=key)
    body = got["Body"].read()
    assert got["ContentEncoding"] == "gzip" and body[:2] == b"\x1f\x8b"
    assert gzip.decompress(body) == page.encode()
    assert len(body) < len(page.encode()) / 4  # base64 arrays and Bokeh's JSON compress well

    response = httpx.get(s3_store.presign(location, 600), timeout=10,
                         headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200 and response.headers["Content-Encoding"] == "gzip"
    assert response.text == page  # decoded transparently, as a browser does
    assert s3_store.read_page(location) == page


def test_the_trend_page_on_s3_is_gzip_too(s3_store, moto):
    run_id = new_run_id()
    location = s3_store.write_view(PIPE, run_id, "trend.html", "<p>trend</p>").location
    head = boto_client(moto).head_object(Bucket=BUCKET, Key=key_of(s3_store, location))
    assert head["ContentEncoding"] == "gzip"
    assert s3_store.read_page(location) == "<p>trend</p>"


def test_a_plain_report_stored_before_is_still_read(s3_store, moto, page):
    """An uncompressed report (as stored before pages were compressed) reads as it is."""
    run_id = new_run_id()
    location = s3_store.location(layout.report_file(PIPE, run_id, "read"))
    boto_client(moto).put_object(Bucket=BUCKET, Key=key_of(s3_store, location),
                                 Body=page.encode(), ContentType="text/html")
    assert s3_store.read_page(location) == page
    assert httpx.get(s3_store.presign(location, 600), timeout=10).text == page


def test_a_damaged_gzip_report_is_a_damaged_record_naming_it(s3_store, moto, page):
    run_id = new_run_id()
    location = s3_store.location(layout.report_file(PIPE, run_id, "read"))
    cut = compression.gzip_page(page.encode())[:500]
    boto_client(moto).put_object(Bucket=BUCKET, Key=key_of(s3_store, location), Body=cut,
                                 ContentEncoding="gzip")
    with pytest.raises(DamagedRecord, match=f"{location} is a damaged gzip stream"):
        s3_store.read_page(location)


def test_a_run_written_again_with_its_trend_page_is_accepted_on_s3(s3_store):
    """A retried run (an answer lost) meets its gzip page stored: the same page, accepted;
    another page in its place is a conflict."""
    run_id = new_run_id()
    tables = {"tasks": pd.DataFrame({"stage": ["read"], "tasks": [3]})}
    doc = {"version": "v1", "status": "healthy", "stages": []}
    first = s3_store.write_run(PIPE, run_id, tables, doc, extra_files={"trend.html": b"<p/>"})
    again = s3_store.write_run(PIPE, run_id, tables, doc, extra_files={"trend.html": b"<p/>"})
    assert not first.spooled and not again.spooled and again.warnings == []
    with pytest.raises(StoreConflict):
        s3_store.write_run(PIPE, run_id, tables, doc, extra_files={"trend.html": b"<b/>"})


def test_a_local_report_stays_plain_html(tmp_path, page):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    location = store.write_report(PIPE, new_run_id(), "read", page).location
    assert location.endswith(".html")
    with open(location, "rb") as f:  # what a browser opening the file:// link reads
        assert f.read() == page.encode()
    assert store.read_page(location) == page


def test_page_bytes_and_same_content():
    plain = b"<!DOCTYPE html><p>x</p>"
    packed = compression.gzip_page(plain)
    assert packed == compression.gzip_page(plain)  # no time stamp: a retry compares equal
    assert compression.page_bytes(packed) == plain == compression.page_bytes(plain)
    with pytest.raises(DamagedRecord, match="the page is a damaged gzip stream"):
        compression.page_bytes(packed[:-6])
    assert same_content("r/x.html", packed, plain) and same_content("r/x.html", plain, plain)
    assert not same_content("r/x.html", packed[:-6], plain)
    assert not same_content("r/x.csv", packed, plain)  # only pages are stored compressed
