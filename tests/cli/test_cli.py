"""The command line as a new user meets it: finding runs, readable output, honest exit codes.

A real local store written by ``RunStore.write_run``; the commands run through Typer's runner.
"""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.cli import application as app_module
from prefect_dask_profiling.regression import history
from prefect_dask_profiling.store.runs import RunStore, new_run_id

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
runner = CliRunner()


def tasks(scale: float = 1.0) -> pd.DataFrame:
    total = [20.0 * scale, 10.0, 5.0]
    return pd.DataFrame({
        "stage": ["read", "reduce", "write"], "prefix": ["open_dataset", "nanmedian", "to_zarr"],
        "tasks": [40, 8, 4], "total_s": total, "p50_s": [0.5, 1.2, 1.2],
        "p95_s": [0.9, 1.5, 1.4], "gb_out": [1.5, 0.01, 0.0],
        "share": [t / sum(total) for t in total]})


def put(store: RunStore, night: int, *, pipeline: str = "ndvi", status: str = "healthy",
        state: str = "COMPLETED", scale: float = 1.0, run_id: str | None = None,
        **manifest: object) -> str:
    run_id = run_id or new_run_id(T0 + timedelta(days=night))
    doc = {"version": "v1", "status": status, "state": state, "wall_s": 11.763684,
           "regressed": status == "regressed", "utilisation": {"run": 0.29870188334604647},
           "baseline": {"runs": ["20261101T020000Z-aaaaaa", "20261102T020000Z-bbbbbb"],
                        "version": "v1", "note": "2 of 8 baseline runs available"},
           **manifest}
    result = store.write_run(pipeline, run_id, {"tasks": tasks(scale)}, doc)
    assert not result.spooled, result.warnings
    return run_id


@pytest.fixture
def store(tmp_path) -> RunStore:
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    for night in range(4):
        put(store, night, scale=1.0 + 0.02 * night)
    put(store, 0, pipeline="other")
    return store


def cli(*args: str):
    return runner.invoke(app, list(args))


def one_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_every_command_module_is_registered_from_the_app():
    names = {c.name for c in app.registered_commands}
    assert names >= {"runs", "show", "compare", "check", "accept", "sweep", "upload-pending",
                     "report", "bench"}
    assert len(names) == len(app.registered_commands)  # no command registered twice
    folder = Path(app_module.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")
               if not p.stem.startswith("_") and p.stem != "application"}
    assert modules == set(app_module.COMMAND_MODULES), "add new command modules to the list"
    for module in app_module.COMMAND_MODULES:
        assert callable(importlib.import_module(f"prefect_dask_profiling.cli.{module}").register)


def test_register_commands_adds_a_module_to_any_app():
    other = typer.Typer()
    app_module.register_commands(other, ("history",))
    assert {c.name for c in other.registered_commands} == {
        "runs", "show", "compare", "check", "accept"}


def test_show_finds_the_run_without_pipeline_and_formats_like_the_tables(store):
    slow = put(store, 9, status="regressed", scale=3.0)
    out = cli("show", slow, "--store", store.url)
    assert out.exit_code == 0, out.output
    assert "utilisation: 0.30" in out.stdout and "wall_s: 11.76" in out.stdout
    assert "0.2987" not in out.stdout and "11.763684" not in out.stdout
    assert "baseline: 2 run(s) of version v1 (20261101T020000Z-aaaaaa … " in out.stdout
    assert "baseline note: 2 of 8 baseline runs available" in out.stdout
    assert "{" not in out.stdout  # no Python dict
    shown = json.loads(cli("show", slow, "--store", store.url, "--json").stdout)
    assert shown["manifest"]["utilisation"] == 0.29870188334604647  # JSON keeps full precision


def test_show_names_a_missing_or_ambiguous_run(store):
    line = one_line(cli("show", "20990101T000000Z-000000", "--store", store.url), 2)
    assert line == f"error: run 20990101T000000Z-000000 not found in store {store.url}"
    twice = put(store, 20)
    put(store, 20, pipeline="other", run_id=twice)
    line = one_line(cli("show", twice, "--store", store.url), 2)
    assert "ndvi, other" in line and "--pipeline" in line
    assert cli("show", twice, "--store", store.url, "--pipeline", "other").exit_code == 0


def test_compare_and_accept_find_the_pipeline(store):
    a, b = (r["run_id"] for r in store.list_runs("ndvi")[:2])
    out = cli("compare", b, a, "--store", store.url, "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["pipeline"] == "ndvi"
    out = cli("accept", a, "--store", store.url, "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["pipeline"] == "ndvi"


def test_an_unjudged_run_fails_the_check_with_its_reason(store):
    """Exit 5, not a regression's 1: the gate did not look (issue 56, target 3)."""
    run_id = put(store, 10, status="unjudged", unjudged_reason="verdict step failed: boom")
    out = cli("check", "--store", store.url, "--run", run_id)
    assert out.exit_code == 5, out.output
    assert "stored unjudged: verdict step failed: boom" in out.stdout
    data = json.loads(cli("check", "--store", store.url, "--run", run_id, "--json").stdout)
    assert data["status"] == "unjudged" and data["regressed"] is False


def test_a_failed_run_never_counts_as_regressed(store):
    failed = put(store, 11, status="failed", state="FAILED", scale=3.0)
    out = cli("check", "--store", store.url, "--run", failed, "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["regressed"] is False and "failed" in data["outcome"]["reason"]
    assert any(v["verdict"] == "regression" for v in data["verdicts"])
    slow = put(store, 12, scale=3.0)
    assert cli("check", "--store", store.url, "--run", slow).exit_code == 1


@pytest.mark.parametrize("args, needle", [
    (["--threshold", "1"], "threshold must be a finite number > 1"),
    (["--threshold", "nan"], "threshold"),
    (["--run", "../x"], "run_id"),
])
def test_bad_check_options_are_exit_2(store, args, needle):
    assert needle in one_line(cli("check", "--store", store.url, "--pipeline", "ndvi", *args), 2)


def test_an_unexpected_error_is_exit_3_with_a_hint_not_bad_input(store, monkeypatch):
    def bug(*args, **kwargs):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(history, "show_run", bug)
    run_id = store.list_runs("ndvi")[0]["run_id"]
    line = one_line(cli("show", run_id, "--store", store.url), 3)
    assert line.startswith("internal error: ValueError: an internal invariant broke")
    assert "--debug" in line and "report" in line
    debug = runner.invoke(app, ["--debug", "show", run_id, "--store", store.url])
    assert isinstance(debug.exception, ValueError)  # the traceback is there to report
    monkeypatch.setenv("DASK_PROFILING_DEBUG", "1")
    assert isinstance(cli("show", run_id, "--store", store.url).exception, ValueError)


def test_a_key_error_inside_is_not_bad_input(store, monkeypatch):
    def bug(*args, **kwargs):
        return {}["missing"]

    monkeypatch.setattr(history, "list_runs", bug)
    line = one_line(cli("runs", "--store", store.url, "--pipeline", "ndvi"), 3)
    assert "KeyError" in line


def test_the_errors_column_is_shown_only_when_a_task_erred(store):
    quiet = store.list_runs("ndvi")[0]["run_id"]
    erred = new_run_id(T0 + timedelta(days=30))
    store.write_run("ndvi", erred, {"tasks": tasks().assign(errors=[0, 2, 0])},
                    {"version": "v1", "status": "healthy", "state": "COMPLETED"})
    assert "errors" in cli("show", erred, "--store", store.url).stdout
    shown = cli("show", quiet, "--store", store.url)
    assert shown.exit_code == 0 and "errors" not in shown.stdout


@pytest.mark.parametrize("args", [["--version", "nope"],
                                  ["--version", "nope", "--pipeline", "ndvi"],
                                  ["--version", "nope", "--stats"]])
def test_alerts_of_an_unknown_version_is_exit_2_naming_the_known_ones(store, args):
    line = one_line(cli("alerts", "--store", store.url, *args), 2)
    assert "unknown version 'nope'" in line and "v1" in line, line


def test_alerts_of_an_unknown_pipeline_is_exit_2(store):
    line = one_line(cli("alerts", "--store", store.url, "--pipeline", "nope"), 2)
    assert "unknown pipeline 'nope'" in line, line


def test_alerts_of_a_known_version_without_episodes_is_exit_0(store):
    result = cli("alerts", "--store", store.url, "--version", "v1")
    assert result.exit_code == 0 and "no open alert episodes" in result.stdout, result.output
