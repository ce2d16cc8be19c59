"""Prometheus export: a textfile parsed by prometheus_client's own parser, and real pushes.

The Pushgateway stand-in is a real HTTP server on 127.0.0.1 that records every request.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.export.prometheus import build_registry, exposition, latest_runs
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary.io import io_frame, stage_io_summary

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
runner = CliRunner()


def tasks(scale: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame({"stage": ["read", "reduce"], "prefix": ["open_dataset", "nanmedian"],
                         "tasks": [40, 8], "total_s": [20.0 * scale, 10.0],
                         "p50_s": [0.5, 1.2], "p95_s": [0.9, 1.5], "gb_out": [1.5, 0.01]})


def put(store: RunStore, pipeline: str, night: int, scale: float = 1.0,
        status: str = "healthy", verdicts: pd.DataFrame | None = None,
        stages: list[dict] | None = None) -> str:
    run_id = new_run_id(T0 + timedelta(days=night))
    doc = {"version": "v7", "status": status, "state": "COMPLETED", "wall_s": 42.0,
           "started": (T0 + timedelta(days=night)).isoformat(),
           "utilisation": {"run": 0.61, "stages": {"read": 0.8, "reduce": 0.25}},
           **({"stages": stages} if stages is not None else {})}
    tables = {"tasks": tasks(scale)}
    if verdicts is not None:
        tables["regression"] = verdicts
    assert not store.write_run(pipeline, run_id, tables, doc).spooled
    return run_id


@pytest.fixture
def store(tmp_path) -> RunStore:
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    put(store, "ndvi", 0)
    regressed = pd.DataFrame({"stage": ["read", "reduce"], "prefix": ["open_dataset",
                                                                      "nanmedian"],
                              "verdict": ["regression", "ok"], "ratio": [2.5, 1.0]})
    put(store, "ndvi", 1, scale=2.5, status="regressed", verdicts=regressed)
    put(store, "sar", 1)
    put(store, "sar", 2, status="incomplete")  # never exported: it says nothing yet
    return store


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_textfile_holds_the_latest_run_of_each_pipeline(store, tmp_path):
    out = tmp_path / "textfile" / "dask_profiling.prom"
    out.parent.mkdir()
    result = runner.invoke(app, ["export", "prometheus", "--store", store.url,
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    got = samples(out.read_text())
    ndvi = {"pipeline": "ndvi", "version": "v7", "stage": "read", "prefix": "open_dataset"}
    assert got[("dask_profiling_prefix_seconds", tuple(sorted(ndvi.items())))] == 50.0
    assert got[("dask_profiling_prefix_tasks", tuple(sorted(ndvi.items())))] == 40
    assert got[("dask_profiling_stage_utilisation_ratio",
                (("pipeline", "sar"), ("stage", "reduce")))] == 0.25
    assert got[("dask_profiling_run_utilisation_ratio", (("pipeline", "ndvi"),))] == 0.61
    assert got[("dask_profiling_run_timestamp_seconds", (("pipeline", "ndvi"),))] == \
        (T0 + timedelta(days=1)).timestamp()
    assert got[("dask_profiling_run_timestamp_seconds", (("pipeline", "sar"),))] == \
        (T0 + timedelta(days=1)).timestamp()  # the incomplete night 2 is skipped
    flagged = (("pipeline", "ndvi"), ("prefix", "open_dataset"), ("stage", "read"),
               ("verdict", "regression"))
    assert got[("dask_profiling_regression", flagged)] == 1.0
    assert got[("dask_profiling_regression_ratio", flagged)] == 2.5
    assert not [k for k in got if k[0] == "dask_profiling_regression"
                and ("verdict", "ok") in k[1]]
    assert got[("dask_profiling_run_healthy", (("pipeline", "ndvi"), ("status", "regressed")))] \
        == 0.0
    # the regressed night opened an alert episode (stored before confirmation: it failed
    # on its first night), still open
    (alert,) = [dict(k[1]) for k in got if k[0] == "dask_profiling_alert"]
    assert alert["episode"].startswith("ep-") and got[("dask_profiling_alert",
                                                       tuple(sorted(alert.items())))] == 1.0
    assert {k: alert[k] for k in ("pipeline", "version", "stage", "prefix", "metric",
                                  "state")} == {
        "pipeline": "ndvi", "version": "v7", "stage": "read", "prefix": "open_dataset",
        "metric": "total_s", "state": "confirmed"}
    assert not list(out.parent.glob("*.tmp*"))  # written aside and renamed

    only = runner.invoke(app, ["export", "prometheus", "--store", store.url,
                               "--pipeline", "sar", "--out", str(out)])
    assert only.exit_code == 0, only.output
    assert {dict(k[1]).get("pipeline") for k in samples(out.read_text())} == {"sar"}


def test_registry_leaves_out_missing_values(store):
    runs = latest_runs(store, "ndvi")
    runs[0].manifest["utilisation"] = {"run": None, "stages": {}}
    text = exposition(build_registry(runs))
    assert "dask_profiling_run_utilisation_ratio{" not in text
    assert "dask_profiling_prefix_seconds{" in text


# the storage gauges by ``io`` key, spelled out: a renamed metric breaks dashboards, and this
STORAGE = {"requests": "dask_profiling_stage_storage_requests",
           "requests_per_chunk": "dask_profiling_stage_storage_requests_per_chunk",
           "bytes": "dask_profiling_stage_storage_bytes",
           "bytes_per_chunk": "dask_profiling_stage_storage_bytes_per_chunk",
           "read_amplification": "dask_profiling_stage_read_amplification_ratio",
           "s3fs_requests": "dask_profiling_stage_s3fs_requests",
           "s3fs_bytes": "dask_profiling_stage_s3fs_bytes"}


def storage_io(rows: list[dict]) -> dict[str, dict]:
    """Each stage's manifest ``io`` entry as a run stores it, from its io table rows."""
    table = io_frame(rows)
    return {stage: stage_io_summary(table, stage) for stage in table["stage"].unique()}


def storage_samples(got: dict, pipeline: str, stage: str) -> dict[str, float]:
    """The storage samples of one stage, by ``io`` key."""
    labels = (("pipeline", pipeline), ("stage", stage))
    return {key: got[(name, labels)] for key, name in STORAGE.items() if (name, labels) in got}


def test_stage_storage_gauges_equal_the_manifest_and_are_absent_without_a_source(store):
    gdal = storage_io([{"stage": "read", "worker": "w1", "chunks": 48, "decoded_bytes": 8e6,
                        "gdal_get": 50, "gdal_head": 3, "gdal_list": 1, "gdal_bytes": 4e6,
                        "s3fs_get": 2, "s3fs_head": 1, "s3fs_list": 1, "s3fs_bytes": 900}])
    no_gdal = storage_io([{"stage": "reduce", "worker": "w1", "chunks": 0,
                           "decoded_bytes": 0, "s3fs_get": 4, "s3fs_head": 0, "s3fs_list": 2,
                           "s3fs_bytes": 1_500}])
    put(store, "cog", 0, stages=[{"name": "read", "io": gdal["read"]},
                                 {"name": "reduce", "io": no_gdal["reduce"]},
                                 {"name": "write", "io": None}])
    got = samples(exposition(build_registry(latest_runs(store))))

    read = storage_samples(got, "cog", "read")
    assert read == pytest.approx({key: gdal["read"][key] for key in STORAGE})
    assert read["requests"] == 54 and read["read_amplification"] == 0.5
    # GDAL not loaded: no GDAL series (not 0), the s3fs ones still there
    assert storage_samples(got, "cog", "reduce") == {"s3fs_requests": 6, "s3fs_bytes": 1_500}
    assert storage_samples(got, "cog", "write") == {}  # no source at all: no series
    # runs stored before storage requests were counted (no stages[].io) still export
    for pipeline in ("ndvi", "sar"):
        assert not [k for k in got if k[0] in STORAGE.values()
                    and ("pipeline", pipeline) in k[1]]
        assert ("dask_profiling_run_wall_seconds", (("pipeline", pipeline),)) in got


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers like a Pushgateway (200) and keeps (method, path, body)."""

    received: list[tuple[str, str, str]] = []

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        self.received.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    do_PUT = do_POST = _record

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list]]:
    Recorder.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", Recorder.received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_push_sends_each_pipeline_in_its_own_group(store, gateway):
    url, received = gateway
    result = runner.invoke(app, ["export", "prometheus", "--store", store.url, "--push", url])
    assert result.exit_code == 0, result.output
    paths = sorted(path for _, path, _ in received)
    assert paths == ["/metrics/job/dask_profiling/pipeline/ndvi",
                     "/metrics/job/dask_profiling/pipeline/sar"]
    assert {method for method, _, _ in received} == {"PUT"}
    body = dict((path, text) for _, path, text in received)
    ndvi = samples(body["/metrics/job/dask_profiling/pipeline/ndvi"])
    assert {dict(k[1]).get("pipeline") for k in ndvi} == {"ndvi"}
    assert ("dask_profiling_regression", (("pipeline", "ndvi"), ("prefix", "open_dataset"),
                                          ("stage", "read"), ("verdict", "regression"))) in ndvi


def test_bad_invocations_are_one_line_and_exit_2(store, tmp_path):
    from helpers.s3_servers import closed_endpoint

    cases = [
        (["--store", store.url], "exactly one of --out"),
        (["--store", store.url, "--out", str(tmp_path / "x.prom"), "--push", "http://x"],
         "exactly one of --out"),
        (["--store", store.url, "--pipeline", "nope", "--out", str(tmp_path / "x.prom")],
         "nope"),
        (["--store", str(tmp_path / "absent"), "--out", str(tmp_path / "x.prom")],
         "no store"),
        (["--store", store.url, "--push", closed_endpoint()], "could not push"),
    ]
    for args, needle in cases:
        result = runner.invoke(app, ["export", "prometheus", *args])
        assert result.exit_code == 2, (args, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0], (args, result.stderr)
