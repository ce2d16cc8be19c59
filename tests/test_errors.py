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
