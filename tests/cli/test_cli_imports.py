"""The command line answers at once: importing it, or ``--help``, loads no heavy library.

Structural checks in fresh interpreters (``sys.modules`` after the import), no timing:
the figures are measured by ``benchmarks/cli_latency.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_dask_profiling.cli import alerts as alerts_cli
from prefect_dask_profiling.regression import alert_history

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("prefect", "distributed", "dask", "pandas", "numpy")
REPORT = "import json, sys; print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))"


def imported_after(code: str) -> list[str]:
    """The heavy libraries in ``sys.modules`` after running ``code`` in a new interpreter."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run([sys.executable, "-c", code + "\n" + REPORT.format(heavy=HEAVY)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import prefect_dask_profiling.cli",
    "import prefect_dask_profiling",
])
def test_importing_the_cli_imports_no_heavy_library(code):
    assert imported_after(code) == []


@pytest.mark.parametrize("args", [["--help"], ["alerts", "--help"], ["check", "--help"],
                                  ["export", "--help"], ["eta", "--help"]])
def test_help_imports_no_heavy_library(args):
    code = ("import contextlib, io\n"
            "from prefect_dask_profiling.cli import app\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n"
            f"        app({args!r})\n"
            "    except SystemExit as done:\n"
            "        assert done.code == 0, done.code\n"
            "assert 'Usage' in out.getvalue(), out.getvalue()")
    assert imported_after(code) == []


def test_what_runs_show_check_and_alerts_import_loads_no_prefect_dask_or_distributed():
    """The modules behind ``runs``, ``show``, ``check`` and ``alerts`` need pandas, not the
    cluster side: reading a stored summary must not import distributed (via timing)."""
    code = "\n".join(f"import prefect_dask_profiling.{module}" for module in (
        "cli.history", "cli.alerts", "regression.history", "regression.judge",
        "regression.alert_history", "summary.io", "summary.memory", "diagnosis.stages",
        "store.runs"))
    assert imported_after(code) == ["numpy", "pandas"]


def test_the_check_above_can_fail():
    """A command module importing pandas at module level would be caught."""
    assert "pandas" in imported_after("import prefect_dask_profiling.regression.history")


def test_stage_is_the_function_however_its_module_was_imported_first():
    """The package serves ``stage`` lazily: importing its home module first (as the task
    runner does) must not turn ``prefect_dask_profiling.stage`` into a module."""
    code = ("import prefect_dask_profiling.stages\n"
            "import prefect_dask_profiling.prefect.runner\n"
            "from prefect_dask_profiling import stage, install\n"
            "import prefect_dask_profiling as p\n"
            "assert callable(stage) and stage is p.stage, stage\n"
            "assert stage.__module__ == 'prefect_dask_profiling.stages', stage\n"
            "assert install.__module__ == 'prefect_dask_profiling.timing.client', install\n"
            "with stage('read') as name:\n"
            "    assert name == 'read', name")
    assert "dask" in imported_after(code)


def test_the_alerts_runs_default_is_the_replays():
    assert alerts_cli.LOOKBACK_RUNS == alert_history.LOOKBACK_RUNS
