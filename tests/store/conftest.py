"""Fixtures of the store tests reading histories: one moto server per module, and an empty
store on a local folder or in a fresh bucket of it (the module's ``BUCKET``)."""

from __future__ import annotations

import pytest
from helpers.s3_servers import boto_client, moto_server, reset_moto, s3_options

from prefect_dask_profiling.store.runs import RunStore


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, moto) -> RunStore:
    if request.param == "local":
        return RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    reset_moto(moto)
    bucket = request.module.BUCKET
    boto_client(moto).create_bucket(Bucket=bucket)
    return RunStore(f"s3://{bucket}/root", s3_options(moto), spool_dir=tmp_path / "spool")
