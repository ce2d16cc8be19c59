"""The nightly NDVI flow end to end on a real Prefect server and a real LocalCluster."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers.ndvi_fixtures import HISTORY_RUNS, artifacts_by_key, flow_run_id
from prefect.client.orchestration import get_client

from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.runs import RunStore

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")]

PIPELINE = "nightly-ndvi"
STAGES = ["read", "ndvi", "reduce", "write"]
# the real Dask operations each stage runs (after Dask's fusion), not the Prefect wrappers
OPERATIONS = {"read": {"getitem"}, "ndvi": {"truediv"},
              "reduce": {"nanmedian"}, "write": {"store-map"}}
WRAPPERS = {"read_scenes", "compute_ndvi", "reduce_median", "write_outputs"}


def stored_runs(store_url: str) -> list[dict]:
    """Index entries, oldest first."""
    return list(reversed(RunStore(store_url).list_runs(PIPELINE)))


def test_normal_runs_complete_and_store_the_expected_layout(ndvi_history):
    assert [s.type.value for s in ndvi_history.normal] == ["COMPLETED"] * HISTORY_RUNS
    store = RunStore(ndvi_history.store)
    runs = stored_runs(ndvi_history.store)
    assert [r["status"] for r in runs] == ["healthy"] * HISTORY_RUNS + ["regressed"]
    first = runs[0]["run_id"]
    root = ndvi_history.store
    files = {p.relative_to(root).as_posix() for p in _tree(root)}
    for name in ("tasks.csv", "utilisation.csv", "regression.csv", "io.csv", "manifest.json"):
        assert f"runs/{PIPELINE}/{first}/{name}" in files
    # the defaults (stage_reports=True, drawn in the flow process): every stage's report
    for info in RunStore(root).read_manifest(PIPELINE, first)["stages"]:
        report_file = f"reports/{PIPELINE}/{first}/{info['name']}.html"
        if info["name"] in STAGES:
            assert info["report"]["renderer"] == "flow", info
            assert report_file in files, info
    assert layout.index_marker(PIPELINE, "1", first, "healthy") in files
    manifest = store.read_manifest(PIPELINE, first)
    assert manifest["flow_run_id"] == flow_run_id(ndvi_history.normal[0])
    assert [s["name"] for s in manifest["stages"]][-4:] == STAGES
    assert set(manifest["utilisation"]["stages"]) >= set(STAGES)


def _tree(root):
    return [p for p in Path(root).rglob("*") if p.is_file()]


def test_summary_names_each_stage_s_real_operations(ndvi_history):
    latest_normal = stored_runs(ndvi_history.store)[HISTORY_RUNS - 1]["run_id"]
    store = RunStore(ndvi_history.store)
    summary = store.read_table(PIPELINE, latest_normal, "tasks")
    assert "prepare" not in set(summary["stage"]), "scenes are generated once, then reused"
    for stage, operations in OPERATIONS.items():
        prefixes = set(summary.loc[summary["stage"] == stage, "prefix"])
        assert operations <= prefixes, (stage, prefixes)
    # The Prefect wrapper tasks' waits on their inner Dask work are reported apart; only their
    # own work (opening a client, building the graph) counts as task time, so the run's
    # utilisation stays within the cluster's threads.
    waits = store.read_table(PIPELINE, latest_normal, "orchestration")
    assert WRAPPERS <= set(waits["prefix"]), set(waits["prefix"])
    util = store.read_table(PIPELINE, latest_normal, "utilisation").set_index("scope")
    assert util.loc["run", "utilisation"] <= 1.05, util


def test_artifacts_of_a_normal_run(ndvi_history):
    arts = artifacts_by_key(ndvi_history.normal[-1])
    for key in (f"{PIPELINE}-summary", f"{PIPELINE}-run", f"{PIPELINE}-regression"):
        assert key in arts, sorted(arts)
    summary = pd.DataFrame(json.loads(arts[f"{PIPELINE}-summary"].data))
    assert {"getitem", "nanmedian", "store-map"} <= set(summary["prefix"])
    assert set(summary["stage"]) == set(STAGES)
    markdown = arts[f"{PIPELINE}-run"].data
    for stage in STAGES:
        assert f"| {stage} |" in markdown
    assert "## Storage requests per stage" in markdown and "per chunk" in markdown
    manifest = RunStore(ndvi_history.store).read_manifest(
        PIPELINE, stored_runs(ndvi_history.store)[HISTORY_RUNS - 1]["run_id"])
    for info in manifest["stages"]:
        key = f"{PIPELINE}-report-{info['name']}"
        assert (key in arts) == (info["report"] is not None), (key, sorted(arts))


def test_injected_slowdown_fails_the_run_and_fires_the_hook(ndvi_history):
    state = ndvi_history.slowed
    assert state.is_failed()
    assert "regression" in (state.message or "")
    with get_client(sync_client=True) as client:
        server_state = client.read_flow_run(flow_run_id(state)).state
    assert server_state.type.value == "FAILED"
    verdicts = pd.DataFrame(json.loads(artifacts_by_key(state)[f"{PIPELINE}-regression"].data))
    flagged = verdicts[(verdicts["verdict"] == "regression") & (verdicts["stage"] == "read")]
    assert set(flagged["prefix"]) & OPERATIONS["read"], verdicts
    assert set(flagged["cause"]) & {"more tasks", "both"}, verdicts
    notes = ndvi_history.notifications()
    assert len(notes) == 1, "only the failed run notifies"
    assert notes[0]["flow_run_id"] == flow_run_id(state)
    assert notes[0]["cause"] == "regression"
    assert any(r.startswith("read/") for r in notes[0]["regressions"])
    runs = stored_runs(ndvi_history.store)
    manifest = RunStore(ndvi_history.store).read_manifest(PIPELINE, runs[-1]["run_id"])
    assert manifest["regressed"] is True and manifest["state"] == "FAILED"
    assert len(manifest["baseline"]["runs"]) == HISTORY_RUNS


def test_the_regressed_stage_has_its_report_linked(ndvi_history):
    """Every stage has its report by default; the regressed stage's is linked from the run
    (bounded to the stage's own tasks although later stages ran since: test_stage_reports)."""
    run_id = stored_runs(ndvi_history.store)[-1]["run_id"]
    stages = {s["name"]: s for s in
              RunStore(ndvi_history.store).read_manifest(PIPELINE, run_id)["stages"]}
    report = stages["read"]["report"]
    assert report is not None and stages["read"]["note"] is None, stages["read"]
    html = Path(report["location"]).read_text()
    assert report["tasks"] > 0 and f"number of tasks: {report['tasks']}" in html
    assert "getitem" in html
    link = artifacts_by_key(ndvi_history.slowed)[f"{PIPELINE}-report-read"].data
    assert f"{run_id}/read.html" in link

