"""``dask-profiling check`` on S3 costs the same requests whatever the history's length.

Finding the run's pipeline (``check --run RUN``) and the newest run (``check``) read the
run's month of the index, not every marker and every run folder: with 1,100 stored runs (an
S3 listing pages at 1,000 keys) ``check`` sends exactly the requests it sends with 300. The
runs are put into the moto server's backend directly (the keys and bytes ``write_run``
writes, without 3,300 HTTP round trips of setup).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from helpers.s3_servers import boto_client, moto_server, reset_moto, s3_options
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.regression import history
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.manifest import complete_manifest, dump, marker_doc
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.store.tables import encode_files

pytestmark = pytest.mark.slow  # 1,400 runs put on moto and 6 judgements: > 10 s

PIPE = "nightly"
NEWEST = datetime(2026, 2, 16, 2, tzinfo=UTC)  # every history ends here: the same windows
# The newest version's runs go back past the months of the drift series' newest 57 nights
# (its oldest 3 are read from a month of their own) in both; MANY pages on S3.
FEW, MANY = 300, 1100
OPEN_STORE = history.open_store  # the command's, wrapped by each test to count requests
FILES = encode_files({"tasks": pd.DataFrame({
    "stage": ["read", "reduce"], "prefix": ["open", "median"], "tasks": [40, 8],
    "total_s": [20.0, 10.0], "p50_s": [0.5, 1.2], "p95_s": [0.9, 1.5],
    "gb_out": [1.5, 0.0]})}, None)
# every run's manifest but its pipeline, run id and version (completing 1,250 takes seconds)
MANIFEST = complete_manifest(PIPE, "20260101T000000Z-000000", {
    "status": "healthy", "state": "COMPLETED"}, FILES)


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def stores(moto) -> dict[int, tuple[str, list[str]]]:
    """``{runs: (store URL, run ids oldest first)}``: a bucket each for :data:`FEW` and
    :data:`MANY` runs."""
    reset_moto(moto)
    return {runs: stored(moto, runs) for runs in (FEW, MANY)}


def stored(moto: str, runs: int) -> tuple[str, list[str]]:
    """A store in a new bucket holding ``runs`` runs of :data:`PIPE` (two versions, one
    every 8 hours up to :data:`NEWEST`) and one run of another pipeline: its URL and the run
    ids, oldest first."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    bucket = f"check-requests-{runs}"
    boto_client(moto).create_bucket(Bucket=bucket)
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    ids = []
    for i in range(runs):
        run_id = new_run_id(NEWEST - timedelta(hours=8 * (runs - 1 - i)))
        version = "1.2" if i < runs // 2 else "1.3"
        put_run(backend, bucket, PIPE, run_id, version)
        ids.append(run_id)
    put_run(backend, bucket, "other", new_run_id(NEWEST - timedelta(days=3)), "1.3")
    return f"s3://{bucket}/root", ids


def put_run(backend, bucket: str, pipeline: str, run_id: str, version: str) -> None:
    """The objects ``write_run`` writes for a healthy run, straight into moto's backend."""
    doc = {**MANIFEST, "pipeline": pipeline, "run_id": run_id, "version": version}
    files = {layout.run_file(pipeline, run_id, name): data for name, data in FILES.items()}
    files[layout.manifest_file(pipeline, run_id)] = dump(doc)
    files[layout.index_marker(pipeline, version, run_id, "healthy")] = dump(marker_doc(doc))
    for rel, data in files.items():
        backend.put_object(bucket, f"root/{rel}", data)


def check_requests(monkeypatch, moto: str, url: str, *args: str) -> tuple[Counter, dict]:
    """Run ``dask-profiling --store URL check --json ARGS``: the S3 requests its store sent
    (by operation) and its answer."""
    sent: Counter = Counter()
    opened, events = OPEN_STORE, []

    def count(model, params, **kwargs) -> None:
        query = params.get("query_string") or {}
        sent[(model.name, query.get("prefix", "").removeprefix("root/"),
              query.get("start-after", "")[:40] and "start-after")] += 1

    def counted(url: str | None) -> RunStore:
        store = opened(url)
        store.fs.connect()
        events.append(store.fs.s3.meta.events)  # s3fs reuses one client for equal options
        events[-1].register("before-call.s3", count)
        return store

    monkeypatch.setattr(history, "open_store", counted)
    monkeypatch.setenv("DASK_PROFILING_STORAGE_OPTIONS", json.dumps(s3_options(moto)))
    try:
        result = CliRunner().invoke(app, ["check", "--store", url, "--json", *args])
    finally:
        for registry in events:
            registry.unregister("before-call.s3", count)
    assert result.exit_code == 0, result.output
    return sent, json.loads(result.stdout)


@pytest.mark.parametrize("how", ["--run", "newest", "--version"])
def test_check_sends_the_same_requests_for_300_and_1100_runs(monkeypatch, moto, stores,
                                                             tmp_path, how):
    monkeypatch.setenv("DASK_PROFILING_SPOOL", str(tmp_path / "spool"))
    sent, answers = {}, {}
    for runs, (url, ids) in stores.items():
        args = {"--run": ["--run", ids[-1]], "newest": ["--pipeline", PIPE],
                "--version": ["--pipeline", PIPE, "--version", "1.3"]}[how]
        sent[runs], answer = check_requests(monkeypatch, moto, url, *args)
        assert answer["run_id"] == ids[-1]
        answers[runs] = answer
    operations = {runs: sum((Counter({op: n}) for (op, *_), n in found.items()), Counter())
                  for runs, found in sent.items()}
    assert operations[FEW] == operations[MANY], sent
    assert operations[MANY]["ListObjectsV2"] < 20 and operations[MANY]["GetObject"] < 80, sent
    assert len(answers[FEW]["baseline"]["runs"]) == len(answers[MANY]["baseline"]["runs"]) == 8
