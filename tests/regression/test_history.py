"""Baselines, trend pages and the history CLI against a real local store (RunStore.write_run)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from helpers.bokeh_pages import page_document
from helpers.s3_servers import closed_endpoint, s3_options
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.regression.baseline import (
    HISTORY_COLUMNS,
    HistoryUnavailable,
    load_baseline,
)
from prefect_dask_profiling.regression.trend import trend_html
from prefect_dask_profiling.regression.verdict import detect_regressions, regressed
from prefect_dask_profiling.store.runs import RunStore, new_run_id

PIPELINE = "ndvi"
T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
runner = CliRunner()


class CountingStore(RunStore):
    """A real local RunStore that records which tables and listings it was asked for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.table_reads: list[str] = []
        self.listings = 0

    def read_table(self, pipeline: str, run_id: str, name: str = "tasks") -> pd.DataFrame:
        self.table_reads.append(run_id)
        return super().read_table(pipeline, run_id, name)

    def read_tables(self, pipeline: str, run_ids: list[str], name: str = "tasks") -> dict:
        self.table_reads.extend(run_ids)
        return super().read_tables(pipeline, run_ids, name)

    def list_runs(self, pipeline: str, version: str | None = None, **window) -> list[dict]:
        self.listings += 1
        return super().list_runs(pipeline, version, **window)


def tasks_frame(scale: float = 1.0, read_tasks: int = 40) -> pd.DataFrame:
    """A three-prefix summary; ``scale`` multiplies the time of ``read/open_dataset``."""
    total = [20.0 * scale, 10.0, 5.0]
    return pd.DataFrame({
        "stage": ["read", "reduce", "write"], "prefix": ["open_dataset", "nanmedian", "to_zarr"],
        "tasks": [read_tasks, 8, 4], "total_s": total, "p50_s": [0.5, 1.2, 1.2],
        "p95_s": [0.9, 1.5, 1.4], "gb_out": [1.5, 0.01, 0.0], "max_s": [1.0, 1.6, 1.5],
        "errors": [0, 0, 0], "reruns": [0, 0, 0], "transfer_s": [0.1, 0.2, 0.0],
        "disk_read_s": [0.0] * 3, "disk_write_s": [0.0] * 3,
        "share": [t / sum(total) for t in total]})


def put(store: RunStore, night: int, version: str = "v1", status: str = "healthy",
        scale: float = 1.0, pipeline: str = PIPELINE, read_tasks: int = 40) -> str:
    """Write one complete run (tables, manifest, index marker) for ``night``."""
    run_id = new_run_id(T0 + timedelta(days=night))
    manifest = {"version": version, "status": status, "state": "COMPLETED",
                "regressed": status == "regressed", "started": T0.isoformat(), "wall_s": 40.0,
                "utilisation": {"run": 0.8, "stages": {}}, "stages": [{"name": "read"}]}
    result = store.write_run(pipeline, run_id,
                             {"tasks": tasks_frame(scale, read_tasks)}, manifest)
    assert not result.spooled, result.warnings
    return run_id


def jitter(night: int) -> float:
    return 1.0 + 0.1 * ((night * 7) % 5 - 2) / 2  # 0.9 .. 1.1, deterministic


@pytest.fixture
def store(tmp_path) -> CountingStore:
    return CountingStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")


# ---------------------------------------------------------------------- load_baseline
def test_newest_healthy_runs_of_same_pipeline_and_version(store):
    ids = {}
    for night in range(14):
        status = {9: "regressed", 11: "failed", 12: "incomplete"}.get(night, "healthy")
        ids[night] = put(store, night, status=status, scale=jitter(night))
    put(store, 20, version="v2")
    put(store, 21, pipeline="other")
    base = load_baseline(store, PIPELINE, "v1", n=8)
    healthy = [ids[k] for k in range(14) if k not in (9, 11, 12)]
    assert base.runs == healthy[-8:]  # oldest -> newest
    assert base.version == "v1" and base.skipped == []
    assert list(base.history.columns[:len(HISTORY_COLUMNS)]) == HISTORY_COLUMNS
    assert base.history["run_id"].unique().tolist() == base.runs
    assert len(base.history) == 8 * 3
    assert "left out 1 regressed run(s)" in base.note  # failed, incomplete: never judged
    assert store.listings == 1 and sorted(store.table_reads) == sorted(base.runs)


def test_exclude_and_before(store):
    ids = [put(store, night) for night in range(6)]
    base = load_baseline(store, PIPELINE, "v1", n=8, exclude_run_id=ids[-1])
    assert base.runs == ids[:-1]
    assert "5 of 8 baseline runs available" in base.note
    older = load_baseline(store, PIPELINE, "v1", n=2, before=ids[3])
    assert older.runs == ids[1:3]


def test_accepted_run_restarts_the_baseline_and_counts_when_regressed(store):
    ids = [put(store, night) for night in range(5)]
    accepted = put(store, 5, status="regressed", scale=3.0)
    newer = [put(store, 6, scale=3.0), put(store, 7, status="regressed", scale=6.0),
             put(store, 8, scale=3.1)]
    store.accept(PIPELINE, "v1", ids[2])
    store.accept(PIPELINE, "v1", accepted)
    base = load_baseline(store, PIPELINE, "v1", n=8)
    assert base.runs == [accepted, newer[0], newer[2]]
    assert f"baseline restarts at accepted run {accepted}" in base.note
    assert "left out 1 regressed run(s)" in base.note
    assert not set(ids) & set(store.table_reads)
    # judging an older run uses the acceptance in force at its time
    assert load_baseline(store, PIPELINE, "v1", before=ids[4]).runs == ids[2:4]
    assert load_baseline(store, PIPELINE, "v1", before=newer[0]).runs == [accepted]
    assert load_baseline(store, PIPELINE, "v1", exclude_run_id=accepted,
                         before=accepted).runs == []


def test_runs_without_manifest_are_invisible(store, tmp_path):
    ids = [put(store, night) for night in range(3)]
    partial = new_run_id(T0 + timedelta(days=10))
    folder = tmp_path / "store" / "runs" / PIPELINE / partial
    folder.mkdir(parents=True)
    tasks_frame(scale=50).to_csv(folder / "tasks.csv", index=False)  # no manifest, no marker
    base = load_baseline(store, PIPELINE, "v1")
    assert base.runs == ids and base.skipped == [] and partial not in store.table_reads


@pytest.mark.parametrize("damage", ["changed table", "marker without manifest",
                                    "manifest not json"])
def test_an_unreadable_night_costs_the_baseline_at_most_itself(store, tmp_path, damage):
    """A damaged night inside the window is left out and named, and the next older night
    takes its place (issue 56: it used to stop the judgement of every later night)."""
    ids = [put(store, night) for night in range(6)]
    runs_dir = tmp_path / "store" / "runs" / PIPELINE
    if damage == "changed table":
        (runs_dir / ids[5] / "tasks.csv").write_text("stage,prefix\nread,x\n")
        bad, why = ids[5], "truncated or changed"
    elif damage == "marker without manifest":
        (runs_dir / ids[4] / "manifest.json").unlink()
        bad, why = ids[4], "not found"
    else:
        (runs_dir / ids[3] / "manifest.json").write_text("{not json")
        bad, why = ids[3], "not valid JSON"
    base = load_baseline(store, PIPELINE, "v1", n=4)
    assert base.runs == [r for r in ids if r != bad][-4:]
    assert [r for r, _ in base.skipped] == [bad] and why in base.skipped[0][1]
    assert bad in base.note or damage != "changed table"


def test_only_about_n_tables_are_read(store, tmp_path):
    ids = [put(store, night, scale=jitter(night)) for night in range(40)]
    base = load_baseline(store, PIPELINE, "v1", n=5)
    assert store.table_reads == ids[-5:][::-1] and store.listings == 1
    # the 35 older runs were not touched: even with their tables gone nothing is skipped
    for run_id in ids[:35]:
        os.remove(tmp_path / "store" / "runs" / PIPELINE / run_id / "tasks.csv")
    again = load_baseline(store, PIPELINE, "v1", n=5)
    assert again.runs == base.runs and again.skipped == []


def test_new_version_starts_a_new_baseline(store):
    for night in range(12):
        put(store, night)
    base = load_baseline(store, PIPELINE, "v2")
    assert base.runs == [] and base.history.empty
    assert list(base.history.columns) == HISTORY_COLUMNS
    assert base.note == ("version v2 has no history yet: a new baseline starts (previous "
                         "version v1 had 12 runs)")
    empty = load_baseline(store, "fresh", "v1")
    assert empty.note == "no earlier runs of pipeline fresh: a new baseline starts"
    verdicts = detect_regressions(base.history, tasks_frame())
    assert set(verdicts["verdict"]) == {"insufficient-history"}


def test_unreachable_store_has_no_baseline_rather_than_an_empty_one(tmp_path):
    """An empty baseline would judge every prefix insufficient-history: the run "healthy"."""
    store = RunStore("s3://bucket/pfx", s3_options(closed_endpoint()),
                     spool_dir=tmp_path / "spool", timeout=1)
    with pytest.raises(HistoryUnavailable, match="could not be listed"):
        load_baseline(store, PIPELINE, "v1")


def test_n_is_validated(store):
    with pytest.raises(ValueError, match="n must be"):
        load_baseline(store, PIPELINE, "v1", n=0)


def test_baseline_feeds_detection_and_regressed_runs_stay_out(store):
    for night in range(8):
        put(store, night, scale=jitter(night))
    slow = put(store, 8, status="regressed", scale=2.6)
    base = load_baseline(store, PIPELINE, "v1", exclude_run_id=slow)
    verdicts = detect_regressions(base.history, store.read_table(PIPELINE, slow))
    assert regressed(verdicts)["prefix"].tolist() == ["open_dataset"]
    assert regressed(verdicts)["cause"].tolist() == ["slower tasks"]
    # the next night is slow again: the regressed run is not in its baseline, so it alarms
    again = put(store, 9, scale=2.5)
    base = load_baseline(store, PIPELINE, "v1", exclude_run_id=again)
    assert slow not in base.runs
    assert not regressed(detect_regressions(base.history,
                                            store.read_table(PIPELINE, again))).empty


# ---------------------------------------------------------------------- trend page
def test_trend_page_renders_prefixes_and_marks_regressions(store):
    for night in range(4):
        put(store, night, scale=jitter(night))
    base = load_baseline(store, PIPELINE, "v1")
    latest = tasks_frame(scale=3.0)
    verdicts = detect_regressions(base.history, latest)
    page = trend_html(base.history, latest, verdicts, title="ndvi v1 <trend>")
    assert page.lstrip().lower().startswith("<!doctype html>")
    assert "<title>ndvi v1 &lt;trend&gt;</title>" in page and "cdn.bokeh.org" in page
    for label in ("read/open_dataset", "reduce/nanmedian", "write/to_zarr"):
        assert label in page
    assert "red marker = regression: read/open_dataset" in page
    assert "left out" not in page


def test_trend_page_caps_the_number_of_lines():
    rows = [{"run_id": f"r{r}", "stage": "s", "prefix": f"p{p:02d}", "total_s": 1.0 + p}
            for r in range(3) for p in range(15)]
    history = pd.DataFrame(rows)
    latest = history[history["run_id"] == "r0"].drop(columns="run_id")
    page = trend_html(history, latest, pd.DataFrame(), title="t")
    assert "3 smaller prefix(es) left out (only the 12 largest" in page
    assert "largest by share of the latest run are drawn): s/p02, s/p01, s/p00" in page


def test_trend_page_with_no_data():
    empty = pd.DataFrame(columns=["run_id", "stage", "prefix", "total_s"])
    page = trend_html(empty, empty.drop(columns="run_id"), pd.DataFrame(), title="nothing")
    assert "<title>nothing</title>" in page and "0 prefix(es) drawn" in page


def test_a_refilled_trend_page_is_what_bokeh_itself_would_write(store):
    """Pages after the first re-encode only what changed (the figure is built once per
    process): each must still equal Bokeh's own serialization of the same models, with
    markers, without them, and with nothing to draw."""
    from bokeh.embed import file_html
    from bokeh.resources import CDN

    from prefect_dask_profiling.regression import trend

    for night in range(4):
        put(store, night, scale=jitter(night))
    base = load_baseline(store, PIPELINE, "v1")
    slow, calm = tasks_frame(scale=3.0), tasks_frame(scale=1.0)
    empty = pd.DataFrame(columns=["run_id", "stage", "prefix", "total_s"])
    pages = [("regressed", base.history, slow, detect_regressions(base.history, slow)),
             ("healthy, fewer runs", base.history.iloc[:4], calm, pd.DataFrame()),
             ("nothing", empty, empty.drop(columns="run_id"), pd.DataFrame()),
             ("regressed again", base.history, slow, detect_regressions(base.history, slow))]
    for title, history, latest, verdicts in pages:
        page = trend_html(history, latest, verdicts, title=title)
        layout = trend.LAYOUTS.idle[-1]
        reference = file_html(layout.root, resources=CDN, title=title)
        assert page_document(page) == page_document(reference), title
        assert f"<title>{title}</title>" in page
        assert layout.marks_item.visible == title.startswith("regressed")
        assert ("red marker = regression" in page) == title.startswith("regressed")
    assert len(trend.LAYOUTS.idle) == 1  # one thread drew them all, with one layout


# ---------------------------------------------------------------------- CLI
def cli(*args: str):
    return runner.invoke(app, list(args))


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.output
    for needle in needles:
        assert needle in result.stderr


@pytest.fixture
def populated(store):
    ids = [put(store, night, scale=jitter(night)) for night in range(5)]
    slow = put(store, 5, status="regressed", scale=3.0, read_tasks=40)
    put(store, 6, version="v2", pipeline="other")
    return store, ids, slow


def test_cli_runs(populated):
    store, ids, slow = populated
    out = cli("runs", "--store", store.url, "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["pipelines"] == ["ndvi", "other"]
    out = cli("runs", "--store", store.url, "--pipeline", PIPELINE, "--json")
    runs = json.loads(out.stdout)["runs"]
    assert [r["run_id"] for r in runs] == [slow, *ids[::-1]]
    assert runs[0] == {"run_id": slow, "version": "v1", "status": "regressed"}
    out = cli("runs", "--store", store.url, "--pipeline", PIPELINE)
    assert out.exit_code == 0 and slow in out.stdout and "regressed" in out.stdout
    assert_one_line_error(cli("runs", "--store", store.url, "--pipeline", PIPELINE,
                              "--version", "v9"), "no runs", "v9")


def test_cli_show_and_compare(populated):
    store, ids, slow = populated
    out = cli("show", slow, "--store", store.url, "--pipeline", PIPELINE, "--json")
    assert out.exit_code == 0, out.output
    shown = json.loads(out.stdout)
    assert shown["manifest"]["status"] == "regressed" and shown["manifest"]["version"] == "v1"
    assert [t["prefix"] for t in shown["tasks"]] == ["open_dataset", "nanmedian", "to_zarr"]
    out = cli("show", slow, "--store", store.url, "--pipeline", PIPELINE)
    assert out.exit_code == 0 and "open_dataset" in out.stdout and "regressed" in out.stdout
    out = cli("compare", ids[0], slow, "--store", store.url, "--pipeline", PIPELINE, "--json")
    assert out.exit_code == 0, out.output
    rows = {r["prefix"]: r for r in json.loads(out.stdout)["prefixes"]}
    assert rows["open_dataset"]["ratio"] == pytest.approx(3.0 / jitter(0))
    assert rows["nanmedian"]["ratio"] == 1.0 and rows["nanmedian"]["tasks_b"] == 8
    out = cli("compare", ids[0], slow, "--store", store.url, "--pipeline", PIPELINE)
    assert out.exit_code == 0 and "3.333" in out.stdout
    assert "open_dat" in out.stdout  # long names fold on the test runner's 80 columns


def test_cli_check_exit_codes_and_accept(populated):
    store, ids, slow = populated
    out = cli("check", "--store", store.url, "--pipeline", PIPELINE, "--json")
    assert out.exit_code == 1, out.output
    result = json.loads(out.stdout)
    assert result["run_id"] == slow and result["regressed"] is True
    assert result["baseline"]["runs"] == ids
    flagged = [v for v in result["verdicts"] if v["verdict"] == "regression"]
    assert [(v["prefix"], v["cause"]) for v in flagged] == [("open_dataset", "slower tasks")]
    out = cli("check", "--store", store.url, "--pipeline", PIPELINE)
    assert out.exit_code == 1 and "regression in 1 prefix: read/open_dataset" in out.stdout
    # an older run judged against its own past is fine
    out = cli("check", "--store", store.url, "--pipeline", PIPELINE, "--run", ids[4], "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["baseline"]["runs"] == ids[:4]
    # a higher threshold lets it pass
    assert cli("check", "--store", store.url, "--pipeline", PIPELINE,
               "--threshold", "4").exit_code == 0
    # accepting the slow run restarts the baseline there: the check passes
    out = cli("accept", slow, "--store", store.url, "--pipeline", PIPELINE, "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["version"] == "v1"
    assert store.accepted(PIPELINE, "v1") == [slow]
    out = cli("check", "--store", store.url, "--pipeline", PIPELINE, "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["regressed"] is False
    nxt = put(store, 7, scale=3.05)
    out = cli("check", "--store", store.url, "--pipeline", PIPELINE, "--run", nxt, "--json")
    assert json.loads(out.stdout)["baseline"]["runs"] == [slow]


def test_cli_bad_input_is_one_line_and_exit_2(populated, tmp_path):
    store, ids, slow = populated
    url = store.url
    assert_one_line_error(cli("runs", "--store", str(tmp_path / "nowhere")), "no store at")
    assert_one_line_error(cli("check", "--store", "nosuchfs://x"), "nosuchfs")
    assert_one_line_error(cli("check", "--store", url, "--pipeline", "nope"),
                          "unknown pipeline 'nope'", "ndvi, other")
    assert_one_line_error(cli("check", "--store", url), "--pipeline is required")
    assert_one_line_error(cli("show", "20260101T000000Z-000000", "--store", url,
                              "--pipeline", PIPELINE), "not found")
    assert_one_line_error(cli("compare", ids[0], "bad/run", "--store", url,
                              "--pipeline", PIPELINE), "run_id")
    assert_one_line_error(cli("accept", "20260101T000000Z-000000", "--store", url,
                              "--pipeline", PIPELINE), "not found")
    assert_one_line_error(cli("check", "--store", url, "--pipeline", PIPELINE,
                              "--threshold", "1"), "threshold")
    assert_one_line_error(cli("check", "--store", url, "--pipeline", PIPELINE,
                              "--version", "v2"), "no runs", "v2")
    assert cli("check", "--store", url, "--pipeline", PIPELINE,
               "--history", "0").exit_code == 2
    assert_one_line_error(cli("check", "--store", url, "--pipeline", PIPELINE,
                              "--run", slow, "--version", "v2"), "version 'v1', not 'v2'")


def test_cli_store_from_environment(populated, monkeypatch):
    store, ids, slow = populated
    monkeypatch.setenv("DASK_PROFILING_STORE", store.url)
    out = cli("runs", "--pipeline", "other", "--json")
    assert out.exit_code == 0 and len(json.loads(out.stdout)["runs"]) == 1
