"""One exception tree, its old homes, and the one map from errors to CLI exit codes."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from prefect_dask_profiling import errors
from prefect_dask_profiling.cli import _output as output
from prefect_dask_profiling.cli import app
from prefect_dask_profiling.regression.verdict import RegressionDetected

runner = CliRunner()


def test_the_old_homes_are_the_tree():
    from prefect_dask_profiling import _util
    from prefect_dask_profiling.bench import config
    from prefect_dask_profiling.store import errors as store_errors
    from prefect_dask_profiling.store import runs, spool

    assert _util.InvalidInput is errors.InvalidInput
    assert store_errors.StoreError is runs.StoreError is errors.StoreError
    assert config.BenchInputError is errors.BenchInputError
    assert spool.Clash is errors.StoreConflict
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.ProfilingError), name
    assert issubclass(errors.InvalidInput, ValueError)  # `except ValueError` keeps working
    assert issubclass(RegressionDetected, errors.VerdictFailed)


@pytest.mark.parametrize("exc, code", [
    (errors.InvalidInput("x"), 2),
    (errors.BenchInputError("x"), 2),
    (output.BadInput("x"), 2),
    (errors.StoreError("x"), 2),
    (errors.StoreNotFound("x"), 2),
    (errors.DamagedRecord("x"), 2),
    (errors.StoreConflict("x"), 2),
    (errors.StoreUnreachable("x"), 4),
    (errors.StoreAccessDenied("x"), 4),
    (RegressionDetected(pd.DataFrame({"verdict": []}), "regressed"), 1),
    (RuntimeError("x"), 3),
    (ValueError("x"), 3),  # a plain ValueError is a bug, not bad input
])
def test_every_error_has_one_exit_code(exc, code):
    assert output.exit_code(exc) == code


def test_every_command_is_guarded():
    """Every command maps errors the same way: its callback is the ``guarded`` wrapper."""
    groups = [app, *(g.typer_instance for g in app.registered_groups)]
    commands = [c for g in groups for c in g.registered_commands]
    assert len(commands) >= 10
    for command in commands:
        assert hasattr(command.callback, "__wrapped__"), command.name


def test_a_store_that_does_not_answer_is_exit_4_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_PROFILING_STORAGE_OPTIONS", json.dumps({
        "endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}))
    monkeypatch.setenv("DASK_PROFILING_SPOOL", str(tmp_path / "spool"))
    result = runner.invoke(app, ["runs", "--store", "s3://nowhere-bucket"])
    assert result.exit_code == 4, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: could not reach"), result.output


def test_a_missing_store_is_exit_2(tmp_path):
    result = runner.invoke(app, ["runs", "--store", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no store at" in result.stderr, result.output


def test_guarded_maps_a_verdict_failure_to_exit_1():
    def body() -> None:
        raise RegressionDetected(pd.DataFrame({"verdict": []}), "regressed on purpose")

    with pytest.raises(typer.Exit) as done:
        output.guarded(body)()
    assert done.value.exit_code == 1


# -------------------------------------------------- bad input raises the tree (issue 57)
def _options(**kwargs):
    from prefect_dask_profiling.options import ProfilingOptions

    return ProfilingOptions(**kwargs)


def _renderer(name):
    from prefect_dask_profiling.options import check_renderer

    return check_renderer(name)


def _rule(**kwargs):
    from prefect_dask_profiling.regression.rule import RegressionRule

    return RegressionRule(**kwargs)


def _store_url(url):
    from prefect_dask_profiling.store.url import check_store_url

    return check_store_url(url)


def _older_than(text):
    from prefect_dask_profiling.cli.store import parse_age

    return parse_age(text)


def _classes(classes):
    from prefect_dask_profiling.diagnosis.classify import check_classes

    return check_classes(classes)


def _stage(name):
    from prefect_dask_profiling.stages import stage

    with stage(name):
        pass


def _series(**kwargs):
    from prefect_dask_profiling.regression.drift import read_series

    return read_series(None, "p", "v", **kwargs)  # refused before the store is used


def _flagged(nights):
    from prefect_dask_profiling.regression.drift import flagged_series

    return flagged_series(pd.DataFrame(), None, nights=nights)


def _regressions(history):
    from prefect_dask_profiling.regression.verdict import detect_regressions

    return detect_regressions(history, pd.DataFrame())


def _explain(manifest):
    from prefect_dask_profiling.regression.explain import explain_stage

    return explain_stage("reduce", manifest, [])


def _manifest(manifest):
    from prefect_dask_profiling.store.manifest import complete_manifest

    return complete_manifest("p", "r1", manifest, {})


def _partition(partition):
    from prefect_dask_profiling.store.layout import index_partition_dir

    return index_partition_dir("p", "v", partition)


def _tables(tables):
    from prefect_dask_profiling.store.tables import encode_files

    return encode_files(tables, None)


@pytest.mark.parametrize("bad, match", [
    (lambda: _rule(threshold=0.5), "threshold"),
    (lambda: _rule(history=0), "history"),
    (lambda: _store_url(""), "store URL must be a non-empty string"),
    (lambda: _store_url("s3://"), "names no bucket"),
    (lambda: _store_url("nosuchprotocol://bucket/x"), "unknown protocol 'nosuchprotocol'"),
    (lambda: _options(cost="cheap"), "cost must be a mapping"),
    (lambda: _options(cost={"cpu-fortnight": 1.0}), "unknown key or unit 'cpu-fortnight'"),
    (lambda: _options(eta_interval=-1), "eta_interval"),
    (lambda: _options(deadline="soon"), "deadline"),
    (lambda: _options(on_regression="explode"), "on_regression must be one of"),
    (lambda: _options(cost_regression="maybe"), "cost_regression must be one of"),
    (lambda: _options(retry_on_regression="yes"), "retry_on_regression must be True"),
    (lambda: _options(stage_reports="some"), "stage_reports must be one of"),
    (lambda: _renderer("ascii"), "report_renderer must be one of"),
    (lambda: _options(storage_options="key=k"), "storage_options must be a dict"),
    (lambda: _older_than("soon"), "--older-than must look like 30d"),
    (lambda: _classes(["slow"]), "unknown bottleneck class"),
    (lambda: _classes([]), "no bottleneck class selected"),
    (lambda: _stage("run"), "stage must not be 'run'"),
    (lambda: _series(max_runs=0), "max_runs must be a whole number >= 1"),
    (lambda: _series(max_runs=3, keep_first=3), r"keep_first \(3\) must be below"),
    (lambda: _flagged(0), "nights must be >= 1"),
    (lambda: _regressions("history.csv"), "history must be a pandas DataFrame"),
    (lambda: _explain(["not", "a", "dict"]), "manifest must be a dict"),
    (lambda: _manifest({"pipeline": "other"}), "manifest pipeline 'other' differs"),
    (lambda: _partition("last-week"), "not an index partition"),
    (lambda: _tables({"tasks": [1, 2]}), "table 'tasks' must be a pandas DataFrame"),
])
def test_bad_input_raises_invalid_input_naming_the_problem(bad, match):
    """One representative of each kind of bad argument: ``InvalidInput`` (exit code 2 at the
    command line), never a bare ``ValueError`` (a bug, exit code 3)."""
    with pytest.raises(errors.InvalidInput, match=match) as raised:
        bad()
    assert output.exit_code(raised.value) == 2


def test_a_stored_run_missing_fields_is_a_damaged_record():
    """The fleet view of a run whose stored manifest or tasks table lacks a field: the
    rebuild skips such a run (a ``StoreError``) rather than failing on it."""
    from prefect_dask_profiling.export.fleet import fleet_rows

    tasks = pd.DataFrame({"stage": ["s"], "prefix": ["p"], "tasks": [1], "total_s": [1.0]})
    with pytest.raises(errors.DamagedRecord, match="manifest lacks status"):
        fleet_rows({"run_id": "r", "pipeline": "p", "version": "v"}, tasks)
    with pytest.raises(errors.DamagedRecord, match="tasks table of run r lacks total_s"):
        fleet_rows({"run_id": "r", "pipeline": "p", "version": "v", "status": "ok"},
                   tasks.drop(columns="total_s"))
